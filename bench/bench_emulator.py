"""Throughput ceiling of the local emulator with the real SDK (in-process emulator, ephemeral port).

    .venv/bin/python bench/bench_emulator.py [--messages 5000] [--size 1024] [--latency-ms 0]

Prints batch-send, peek and receive+complete rates in messages per second. ``--latency-ms`` delays
every frame the emulator sends (see emulator/README.md), e.g. 5 for an in-region namespace.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "emulator", "src"))

from azure.servicebus import ServiceBusClient, ServiceBusMessage  # noqa: E402

from servicebus_emulator import Emulator, EmulatorConfig  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=5000)
    p.add_argument("--size", type=int, default=1024, help="body bytes per message")
    p.add_argument("--peek-page", type=int, default=250)
    p.add_argument("--receive-batch", type=int, default=100)
    p.add_argument("--latency-ms", type=float, default=0.0, help="delay on every frame the emulator sends")
    args = p.parse_args()
    n, body = args.messages, b"x" * args.size
    cfg = EmulatorConfig.from_dict({"namespaces": [{"name": "bench", "port": 0,
                                                    "queues": [{"name": "q", "lock_duration_seconds": 60}]}]})
    with Emulator(cfg, latency_ms=args.latency_ms) as emu, \
            ServiceBusClient.from_connection_string(emu.connection_string("bench")) as client:
        with client.get_queue_sender("q") as sender:
            sender.send_messages(ServiceBusMessage(body))          # warm the link up
            start = time.perf_counter()
            sent, batch = 1, sender.create_message_batch()
            while sent < n + 1:
                msg = ServiceBusMessage(body)
                try:
                    batch.add_message(msg)
                    sent += 1
                except ValueError:                                 # batch full
                    sender.send_messages(batch)
                    batch = sender.create_message_batch()
            sender.send_messages(batch)
            send_s = time.perf_counter() - start

        with client.get_queue_receiver("q", prefetch_count=args.receive_batch) as receiver:
            receiver.peek_messages(max_message_count=1)             # opens the management link
            start, seen, seq = time.perf_counter(), 0, 1
            while True:
                page = receiver.peek_messages(max_message_count=args.peek_page, sequence_number=seq)
                if not page:
                    break
                seen += len(page)
                seq = page[-1].sequence_number + 1
            peek_s = time.perf_counter() - start

            start, done = time.perf_counter(), 0
            while done < n + 1:
                msgs = receiver.receive_messages(max_message_count=args.receive_batch, max_wait_time=5)
                if not msgs:
                    break
                for m in msgs:
                    receiver.complete_message(m)
                done += len(msgs)
            recv_s = time.perf_counter() - start
        stats = emu.stats("bench")["q"]

    print(f"emulator benchmark: {n} messages of {args.size} bytes, azure-servicebus sync client, "
          f"latency {args.latency_ms:g} ms")
    print(f"batch send        : {n / send_s:10.0f} msgs/s  ({send_s:.2f} s)")
    print(f"peek              : {seen / peek_s:10.0f} msgs/s  ({peek_s:.2f} s, pages of {args.peek_page})")
    print(f"receive + complete: {done / recv_s:10.0f} msgs/s  ({recv_s:.2f} s, batches of {args.receive_batch})")
    print(f"broker counters   : in={stats['in']} out={stats['out']} completed={stats['completed']} "
          f"left={stats['total']}")


if __name__ == "__main__":
    main()
