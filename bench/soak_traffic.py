"""The soak benchmark's trickle (``bench/soak.py``): new backlog messages at a steady rate, and a receiver
on their destinations that times each one and counts how often it arrived.

``Traffic`` writes legacy backlog copies (``tools.backlog_writer.legacy_backlog_bytes``) at ``rate`` per
second, spread over the backlog queues in turn, for the plain destination queues in turn; each carries
its MessageId and the epoch milliseconds just before its send (``WRITTEN_PROPERTY``). ``Receiver``
takes everything out of the destination queues (receive-and-delete) and keeps, per MessageId, the
times it arrived: once each is the check, arrival less write the latency.
"""
from __future__ import annotations

import collections
import threading
import time

from soak_report import Arrival

WRITTEN_PROPERTY = "soak_written_ms"
DESTINATIONS = ("orders", "payments")  # conf/emulator.yaml's plain queues of the primary namespace
BODY_SIZE = 512
TICK_SECONDS = 0.1


class Traffic:
    """Writes new backlog messages at ``rate`` per second from a thread, from ``start()`` to ``stop()``."""

    def __init__(self, secondary, backlog_queues: list[str], rate: float):
        self.secondary, self.queues, self.rate = secondary, backlog_queues, rate
        self.written: dict[str, float] = {}  # MessageId -> epoch seconds before its send
        self.error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-traffic", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop writing; raise what stopped the thread, if anything did."""
        self.close()
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        from backlog_syphon.servicebus.clients import open_client
        from backlog_syphon.servicebus.sdk_internals import prompt
        from backlog_syphon.servicebus.send import send_encoded
        from backlog_syphon.sink.delivery import Outgoing
        from tools.backlog_writer import OriginalMessage, legacy_backlog_bytes

        began, index = time.monotonic(), 0
        try:
            with open_client(self.secondary, role="secondary") as client:
                senders = [prompt(client.get_queue_sender(queue)) for queue in self.queues]
                try:
                    while not self._done.wait(TICK_SECONDS):
                        due = int((time.monotonic() - began) * self.rate)
                        per_queue: dict[int, list] = collections.defaultdict(list)
                        for number in range(index, due):
                            message_id = f"soak-{number}"
                            written_at = time.time()
                            original = OriginalMessage(
                                DESTINATIONS[number % len(DESTINATIONS)], f"soak message {number} ".encode().ljust(
                                    BODY_SIZE, b"."), message_id=message_id,
                                application_properties={WRITTEN_PROPERTY: int(written_at * 1000), "index": number})
                            per_queue[number % len(self.queues)].append(
                                Outgoing(legacy_backlog_bytes(original), message_id, None, None))
                            self.written[message_id] = written_at
                        index = max(index, due)
                        for queue, outgoing in per_queue.items():
                            for _ in send_encoded(senders[queue], outgoing):
                                pass
                finally:
                    for sender in senders:
                        sender.close()
        except BaseException as exc:  # noqa: BLE001 - raised again by stop()
            self.error = exc


class Receiver:
    """Receives (and deletes) from the destination queues, a thread each, until ``stop()``."""

    def __init__(self, primary_connection_string: str, destinations=DESTINATIONS):
        self.connection_string = primary_connection_string
        self.received: dict[str, list[float]] = collections.defaultdict(list)  # MessageId -> arrival times
        self.arrivals: list[Arrival] = []
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(d,), name=f"soak-receive-{d}", daemon=True)
                         for d in destinations]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Stop receiving; raise the first error a receiving thread met, if any."""
        self.close()
        if self.errors:
            raise self.errors[0]

    def close(self) -> None:
        self._done.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join()

    def count(self) -> int:
        with self._lock:
            return len(self.received)

    def _run(self, queue: str) -> None:
        from azure.servicebus import ServiceBusClient, ServiceBusReceiveMode

        from backlog_syphon.servicebus.sdk_internals import prompt

        try:
            with ServiceBusClient.from_connection_string(self.connection_string) as client, \
                    prompt(client.get_queue_receiver(queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE,
                                                     prefetch_count=0)) as receiver:
                while not self._done.is_set():
                    for message in receiver.receive_messages(max_message_count=100, max_wait_time=0.5):
                        self._record(message, time.time())
        except BaseException as exc:  # noqa: BLE001 - raised again by stop()
            self.errors.append(exc)

    def _record(self, message, at: float) -> None:
        properties = {(k.decode() if isinstance(k, bytes) else k): v
                      for k, v in (message.application_properties or {}).items()}
        written_ms = properties.get(WRITTEN_PROPERTY)
        with self._lock:
            self.received[str(message.message_id)].append(at)
            if written_ms is not None and len(self.received[str(message.message_id)]) == 1:
                self.arrivals.append(Arrival(at, at - written_ms / 1000))
