"""Throughput ceiling of the local emulator: the broker work of moving a backlog message, without Spark.

    .venv/bin/python bench/bench_emulator.py [--messages 5000] [--size 1024] [--latency-ms 0 5 20]

For each ``--latency-ms`` (added to every frame the emulator sends, so to every client round trip;
5 stands in for a namespace in the same region, see emulator/docs/network.md), a fresh in-process
emulator with one queue (ephemeral port on 127.0.0.1) and one client process with the
``azure-servicebus`` sync SDK. The client runs in a child process so that it does not share an
interpreter lock with the emulator, as in the syphon benchmark. It times, in this order:

- send: the messages in ``ServiceBusMessageBatch`` batches (as full as the link allows);
- peek: the whole queue in management peeks of 250 from a sequence number (how the syphon reads);
- receive + complete: PeekLock receives of 100, each page completed with one bulk
  ``update-disposition`` request carrying every lock token (how the syphon purges);
- combined: ``1 / (1/send + 1/peek + 1/(receive+complete))``, the rate of one process that moves
  each message through all three, one after the other.

Each rate counts the messages that operation handled over its own wall time (the links are opened
before the clock starts). ``ceiling()`` is what ``bench_syphon.py`` calls.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "emulator" / "src"))  # the emulator is its own distribution (emulator/)

NAMESPACE, QUEUE = "bench", "q"
PEEK_PAGE, RECEIVE_PAGE = 250, 100
_CONNECTION_ENV = "BENCH_EMULATOR_CONNECTION_STRING"


@dataclass(frozen=True)
class Ceiling:
    """Messages per second of each broker operation the syphon needs, at one latency."""

    latency_ms: float  # added to every client round trip
    messages: int
    send: float
    peek: float
    receive_complete: float

    @property
    def combined(self) -> float:
        return 1 / (1 / self.send + 1 / self.peek + 1 / self.receive_complete)

    def line(self) -> str:
        return (f"send {self.send:.0f}, peek {self.peek:.0f}, receive+complete {self.receive_complete:.0f}, "
                f"combined {self.combined:.0f} msg/s")


def ceiling(latency_ms: float, messages: int, body_size: int, timeout: float = 900.0) -> Ceiling:
    """Start an emulator with ``latency_ms`` here and measure it from a child process."""
    from servicebus_emulator import Emulator, EmulatorConfig

    # The emulator's own ceiling: no credit budget, whole receives (a Standard namespace's 1,000 credits a
    # second, and receives that come back short, would measure those instead).
    config = EmulatorConfig.from_dict({"namespaces": [{"name": NAMESPACE, "port": 0, "credits_per_second": 0,
                                                       "short_receive_probability": 0, "queues": [
        {"name": QUEUE, "lock_duration_seconds": 300}]}]})
    with Emulator(config, latency_ms=latency_ms) as emu:
        env = {**os.environ, _CONNECTION_ENV: emu.connection_string(NAMESPACE)}
        done = subprocess.run([sys.executable, __file__, "--client", "--messages", str(messages),
                               "--size", str(body_size)], env=env, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"emulator ceiling client failed (exit {done.returncode}): {done.stderr[-2000:]}")
        left = emu.stats(NAMESPACE)[QUEUE]["total"]
    if left:
        raise RuntimeError(f"emulator ceiling: {left} messages left in the queue after receive + complete")
    return Ceiling(latency_ms=latency_ms, messages=messages, **json.loads(done.stdout.splitlines()[-1]))


def measure_client(connection_string: str, messages: int, body_size: int) -> dict[str, float]:
    """The client side (child process): send, peek, receive + complete ``messages`` messages; rates."""
    from azure.servicebus import ServiceBusClient, ServiceBusMessage

    body = b"x" * body_size
    with ServiceBusClient.from_connection_string(connection_string) as client:
        with client.get_queue_sender(QUEUE) as sender:
            sender.send_messages(ServiceBusMessage(body))  # opens the link; not timed, but moved below
            start = time.perf_counter()
            batch = sender.create_message_batch()
            for _ in range(messages):
                message = ServiceBusMessage(body)
                try:
                    batch.add_message(message)
                except ValueError:  # full
                    sender.send_messages(batch)
                    batch = sender.create_message_batch()
                    batch.add_message(message)
            sender.send_messages(batch)
            send_s = time.perf_counter() - start

        with client.get_queue_receiver(QUEUE, prefetch_count=RECEIVE_PAGE) as receiver:
            receiver.peek_messages(max_message_count=1)  # opens the management link
            start, peeked, position = time.perf_counter(), 0, 1
            while page := receiver.peek_messages(max_message_count=PEEK_PAGE, sequence_number=position):
                peeked += len(page)
                position = page[-1].sequence_number + 1
            peek_s = time.perf_counter() - start

            start, completed = time.perf_counter(), 0
            while completed < peeked:
                # asking for no more than is left: a short page would wait max_wait_time for the rest
                page = receiver.receive_messages(max_message_count=min(RECEIVE_PAGE, peeked - completed),
                                                 max_wait_time=5)
                if not page:
                    raise RuntimeError(f"receive returned nothing after {completed} of {peeked} messages")
                receiver._settle_message_via_mgmt_link("completed", [m.lock_token for m in page])  # noqa: SLF001
                completed += len(page)
            receive_s = time.perf_counter() - start
    return {"send": messages / send_s, "peek": peeked / peek_s, "receive_complete": completed / receive_s}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=5000)
    p.add_argument("--size", type=int, default=1024, help="body bytes per message")
    p.add_argument("--latency-ms", type=float, nargs="+", default=[0.0],
                   help="one or more delays on every frame the emulator sends (a client round trip takes it once)")
    p.add_argument("--json", type=Path, help="also write the figures to this file")
    p.add_argument("--client", action="store_true", help=argparse.SUPPRESS)  # the child process
    args = p.parse_args(argv)
    if args.client:
        print(json.dumps(measure_client(os.environ[_CONNECTION_ENV], args.messages, args.size)))
        return 0
    print(f"emulator ceiling: {args.messages} messages of {args.size} B, azure-servicebus sync client in its own "
          f"process; rates in messages per second", flush=True)
    results = []
    for latency in args.latency_ms:
        result = ceiling(latency, args.messages, args.size)
        print(f"round trip +{latency:g} ms: {result.line()}", flush=True)
        results.append(result)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) | {"combined": r.combined} for r in results], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
