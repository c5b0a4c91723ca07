"""The plain SDK loops the syphon is measured against, as competent engineers write them, each in a child
process of its own (``loop_child``), and their measurement (``measure_loop``):

- ``threads``: a thread per backlog queue, each with its own PeekLock receiver (prefetch 100); pages of
  100; each page's messages sent batched per destination and session (consecutive runs, in order), then
  each message completed, one round trip after the other;
- ``asyncio`` (``async_loop``): a task per backlog queue (prefetch 300, pages of 100), the same sends, then
  the page's completions gathered;
- ``single``: one thread, queue after queue, one send per message.

Every loop restores what the syphon restores (``restored``: the four ``x-ms-*`` properties into the
destination, SessionId, TimeToLive and ScheduledEnqueueTimeUtc) and knows how many messages each queue
holds, never asking for more. A loop is bounded by time (``--loop-seconds``): it stops after the page in
flight, and its rate is what it moved in the time it ran.
"""
from __future__ import annotations

import datetime as dt
import os
import tempfile
import threading
import time
from pathlib import Path

from process_cpu import CpuSampler, OwnCpu
from syphon_bench import BenchFailure
from syphon_bench.broker import arrivals, backlog_emulator, backlog_left, credits_since, credits_spent
from syphon_bench.children import child_process, child_result
from syphon_bench.rows import CONNECTION_ENV, PRIMARY, SECONDARY, DestinationShape, Loop, Scenario

RECEIVE_PAGE = 100
_TICKS_PER_MICROSECOND = 10  # x-ms-timetolive: a com.microsoft:timespan of .NET ticks (100 ns)


def property_text(value) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def restored(message):
    """``(destination, session, message)``: a backlog message as its sender meant it, as a plain loop builds
    it with the SDK's message model: body, MessageId, CorrelationId, Subject, ContentType, the application
    properties without the legacy ``x-ms-*`` ones, and those restored (the SDK hands a timespan over as its
    ticks and a timestamp as milliseconds)."""
    from azure.servicebus import ServiceBusMessage

    properties = {property_text(k): v for k, v in (message.application_properties or {}).items()}
    destination = property_text(properties.get("x-ms-path"))
    session = property_text(properties.get("x-ms-sessionid"))
    ticks, scheduled_ms = properties.get("x-ms-timetolive"), properties.get("x-ms-scheduledenqueuetimeutc")
    kept = {k: v for k, v in properties.items() if not k.startswith("x-ms-")}
    return destination, session, ServiceBusMessage(
        b"".join(message.body), session_id=session, message_id=message.message_id,
        correlation_id=message.correlation_id, subject=message.subject, content_type=message.content_type,
        application_properties=kept,
        time_to_live=None if ticks is None else dt.timedelta(microseconds=ticks // _TICKS_PER_MICROSECOND),
        scheduled_enqueue_time_utc=None if scheduled_ms is None else dt.datetime.fromtimestamp(
            scheduled_ms / 1000, dt.timezone.utc))


def send_runs(page):
    """A page's restored messages as runs of one destination and session, in order: ``(destination, [messages])``."""
    runs, key = [], None
    for message in page:
        destination, session, outgoing = restored(message)
        if (destination, session) != key:
            runs.append((destination, []))
            key = (destination, session)
        runs[-1][1].append(outgoing)
    return runs


BUSY_PAUSE_SECONDS = 2.0  # what a throttled namespace asks a client to wait
EMPTY_RECEIVES = 6  # receives in a row that may come back empty (5 s each) before a loop is taken as stuck


def while_busy(operation):
    """``operation()``, asked again after the service's pause while the namespace answers it server-busy (the
    SDK's own retries gave up): what a competent loop does on a Standard namespace out of credits."""
    from azure.servicebus.exceptions import ServiceBusServerBusyError

    while True:
        try:
            return operation()
        except ServiceBusServerBusyError:
            time.sleep(BUSY_PAUSE_SECONDS)


def send_in_batches(sender, messages) -> None:
    """``messages`` in as few sends as the entity's largest message batch allows (large bodies need several),
    each send asked again while the namespace answers it busy."""
    from azure.servicebus.exceptions import MessageSizeExceededError

    batch = sender.create_message_batch()
    for message in messages:
        try:
            batch.add_message(message)
        except MessageSizeExceededError:
            while_busy(lambda: sender.send_messages(batch))  # noqa: B023
            batch = sender.create_message_batch()
            batch.add_message(message)
    while_busy(lambda: sender.send_messages(batch))


def move_queue(backlog, primary, queue: str, count: int, deadline: float, *, batched: bool) -> int:
    """One backlog queue, page by page (PeekLock, prefetch 100): send each page's messages (``batched``:
    consecutive messages for the same destination and session in one send; a deduplicating partitioned
    destination takes one MessageId per send, so there the loop sends one by one), then complete each one.
    A busy answer is waited out (``while_busy``); a receive throttled on a detached link gets a new receiver."""
    from azure.servicebus import ServiceBusReceiveMode
    from azure.servicebus.exceptions import ServiceBusServerBusyError

    moved, senders, empty = 0, {}, 0
    receiver = None
    try:
        left = count
        while left and time.perf_counter() < deadline:
            if receiver is None:
                receiver = backlog.get_queue_receiver(queue, receive_mode=ServiceBusReceiveMode.PEEK_LOCK,
                                                      prefetch_count=RECEIVE_PAGE)
            try:
                page = receiver.receive_messages(max_message_count=min(RECEIVE_PAGE, left), max_wait_time=5)
            except ServiceBusServerBusyError:  # the link is detached: the SDK's receiver keeps raising it
                receiver.close()
                receiver = None
                time.sleep(BUSY_PAUSE_SECONDS)
                continue
            if not page:  # a namespace out of credits holds a receive on a link with locks: asked again
                empty += 1
                if empty > EMPTY_RECEIVES:
                    raise BenchFailure(f"loop: {queue} gave nothing {empty} times in a row with {left} messages left")
                continue
            empty = 0
            for destination, messages in send_runs(page):
                if destination not in senders:
                    senders[destination] = primary.get_queue_sender(destination)
                if batched:
                    send_in_batches(senders[destination], messages)
                else:
                    for message in messages:
                        while_busy(lambda: senders[destination].send_messages(message))  # noqa: B023
            for message in page:
                while_busy(lambda: receiver.complete_message(message))  # noqa: B023
            moved += len(page)
            left -= len(page)
    finally:
        if receiver is not None:
            receiver.close()
        for sender in senders.values():
            sender.close()
    return moved


def loop_child(spec: dict) -> dict:
    """A plain SDK loop (child process): ``threads`` (a thread per queue, batched sends unless ``singles``),
    ``asyncio`` or ``single``."""
    if spec["kind"] == Loop.ASYNCIO:
        import asyncio

        from syphon_bench.async_loop import drain

        start = time.perf_counter()
        moved, unsure = asyncio.run(drain(os.environ[CONNECTION_ENV[SECONDARY]], os.environ[CONNECTION_ENV[PRIMARY]],
                                          spec["written"], start + spec["max_seconds"],
                                          singles=spec.get("singles", False)))
        return {"moved": moved, "unsure": unsure, "seconds": time.perf_counter() - start}
    from azure.servicebus import ServiceBusClient

    start = time.perf_counter()
    deadline = start + spec["max_seconds"]
    threaded = spec["kind"] == Loop.THREADS
    moved: dict[str, int] = {}
    errors: list[BaseException] = []
    with ServiceBusClient.from_connection_string(os.environ[CONNECTION_ENV[SECONDARY]]) as backlog, \
            ServiceBusClient.from_connection_string(os.environ[CONNECTION_ENV[PRIMARY]]) as primary:
        def run(queue: str, count: int) -> None:
            try:
                moved[queue] = move_queue(backlog, primary, queue, count, deadline,
                                          batched=threaded and not spec.get("singles"))
            except BaseException as exc:  # noqa: BLE001 - raised below, after the other threads
                errors.append(exc)

        if threaded:
            threads = [threading.Thread(target=run, args=item, name=f"loop-{item[0]}")
                       for item in spec["written"].items()]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        else:
            for queue, count in spec["written"].items():
                if time.perf_counter() < deadline:
                    run(queue, count)
    if errors:
        raise errors[0]
    return {"moved": sum(moved.values()), "seconds": time.perf_counter() - start}


def measure_loop(kind: Loop, scenario: Scenario, args) -> dict:
    """One loop over a fresh backlog of ``scenario``: its rate, its CPU per 1,000 messages, and a check that
    what it reports moved arrived, once and in order, and left the backlog (or, for what it sent but could not
    complete, at most twice: counted in ``sent_twice`` and ``out_of_order``)."""
    dedupe = scenario.destinations is DestinationShape.PARTITIONED_DEDUPE
    with backlog_emulator(scenario, scenario.geometry, args) as (emu, backlog), \
            tempfile.TemporaryDirectory(prefix="bench-loop-") as tmp:
        arrived_before, credits_before = arrivals(emu), credits_spent(emu)
        spec = {"kind": kind.value, "written": backlog.written, "max_seconds": args.loop_seconds, "singles": dedupe}
        with OwnCpu() as own, child_process("loop", spec, emu, Path(tmp)) as child, CpuSampler(child.pid) as cpu:
            result = child_result(child, "loop", Path(tmp), args.loop_seconds + 300)
            cpu.wait_for_exit()
        arrived, (left, dead) = arrivals(emu) - arrived_before, backlog_left(emu)
        credits = credits_since(emu, credits_before)
        disorder = backlog.arrival_problems(emu, keyless_unordered=dedupe)
    # A loop whose completions failed (``unsure``) sent those messages without knowing whether they left the
    # backlog: they may have arrived twice, out of order. What left the backlog is what it moved.
    unsure = result.get("unsure", 0)
    moved = scenario.messages - left
    twice = arrived - moved
    if (dead or not 0 <= twice <= unsure or abs(result["moved"] - moved) > unsure
            or (disorder and not unsure)):
        raise BenchFailure(f"loop ({kind.value}): reports {result['moved']} moved and {unsure} unsure, destinations "
                           f"received {arrived}, backlog holds {left} and {dead} dead-lettered (of {scenario.messages})"
                           + "".join(f"; {problem}" for problem in disorder))
    return {"rate": moved / result["seconds"], "moved": moved, "seconds": result["seconds"], "sent_twice": twice,
            "out_of_order": len(disorder),
            "time_bound": moved < scenario.messages, "credits": credits, "cpu_per_1000": cpu.total() / max(1, moved) * 1000,
            # this process's CPU meanwhile, less its sampling: the emulator's, which runs in here
            "emulator_cpu_per_1000": (own.seconds - cpu.own_seconds) / max(1, moved) * 1000}
