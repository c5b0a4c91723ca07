"""The Python side of the syphon's data path, per message and step: microseconds of CPU per message of each
step a backlog message goes through in Python, without Spark, the broker or the network between them.

    PYTHONPATH=lib .venv/bin/python bench/bench_data_path.py [--messages 5000] [--body-size 1024]

The messages are ``backlog_writer.realistic_backlog``'s, with the broker's annotations a peek hands back. The
steps, in order (each measured on the previous step's output, over all messages, best of five rounds: the
machine may be shared, and the best round is the least disturbed one; ``time.process_time``, so the figures
are this process's CPU, not the wall clock):

- source: decode: ``backlog_rows.peeked_message``, the one decode pass of a peeked message (place and row);
- source: rows -> Arrow: ``rows.record_batch``, a peek page's rows as the record batch ``read()`` yields;
- send task: Arrow -> rows: the classified batch (the restore rules' columns added) as the send task's rows;
- send task: restore: ``send_task.build_outgoing``, the restored message's bytes (the codec's splice);
- send task: batch envelope: ``servicebus.send.add_encoded`` into the SDK's batch, then the SDK encoding the
  batch as its send would put it on the wire (``_pyamqp._encode.encode_payload``);
- send task: outcome rows -> Arrow: ``send_task.outcome_row`` per message, then ``rows.record_batch``.

What the JVM does between the source and the send task (Arrow to rows, the restore rules, rows to Arrow),
the peek's request and the purge are not in it: ``bench_syphon.py --py-spy``/``--jfr`` profile a whole run.
"""
from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "lib"), str(ROOT)]

PAGE = 250  # rows per record batch, as a peek page
ROUNDS = 5


def peeked_bytes(count: int, body_size: int) -> list[bytes]:
    """``count`` legacy backlog copies as a peek returns them: with the broker's identity annotations."""
    import dataclasses

    from backlog_syphon.restore.amqp.message_decoding import decode_message
    from backlog_syphon.restore.amqp.values import Symbol, Timestamp
    from tools.backlog_writer import legacy_backlog_bytes, realistic_backlog

    enqueued = Timestamp.from_datetime(dt.datetime.now(dt.timezone.utc))
    out = []
    for number, original in enumerate(realistic_backlog(count, body_size=body_size), 1):
        message = decode_message(legacy_backlog_bytes(original))
        annotations = {**message.message_annotations, Symbol("x-opt-sequence-number"): number,
                       Symbol("x-opt-enqueued-time"): enqueued, Symbol("x-opt-locked-until"): enqueued}
        out.append(dataclasses.replace(message, message_annotations=annotations).encode())
    return out


def best(step, values) -> tuple[float, object]:
    """The least CPU of ``ROUNDS`` runs of ``step(values)``, and its result."""
    seconds, result = [], None
    for _ in range(ROUNDS):
        began = time.process_time()
        result = step(values)
        seconds.append(time.process_time() - began)
    return min(seconds), result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=5000)
    p.add_argument("--body-size", type=int, default=1024)
    args = p.parse_args(argv)

    import pyarrow as pa
    from azure.servicebus import ServiceBusMessageBatch
    from azure.servicebus._pyamqp._encode import encode_payload

    from backlog_syphon.model import Action
    from backlog_syphon.restore.backlog_rows import peeked_message
    from backlog_syphon.rows import BACKLOG_ROW_ARROW_SCHEMA, OUTCOME_ROW_ARROW_SCHEMA, record_batch
    from backlog_syphon.servicebus.send import add_encoded
    from backlog_syphon.sink import delivery
    from backlog_syphon.sink.send_task import build_outgoing, outcome_row, row_chunks

    raw = peeked_bytes(args.messages, args.body_size)
    queue = "contoso/x-servicebus-transfer/0"
    steps = []

    def decode(messages):
        return [peeked_message(queue, message).row for message in messages]

    def to_arrow(rows):
        return [record_batch(rows[i:i + PAGE], BACKLOG_ROW_ARROW_SCHEMA) for i in range(0, len(rows), PAGE)]

    def classified(batches):  # what the restore rules add, as the JVM hands the send task its batches
        out = []
        for batch in batches:
            n = batch.num_rows
            extra = {"action": pa.array([Action.DELIVER.value] * n), "reason_code": pa.nulls(n, pa.string()),
                     "reason": pa.nulls(n, pa.string()), "restored_time_to_live_ms": pa.array([60_000] * n, pa.int64()),
                     "original_destination": pa.nulls(n, pa.string())}
            out.append(pa.RecordBatch.from_arrays([*batch.columns, *extra.values()],
                                                  names=[*batch.schema.names, *extra]))
        return out

    class NoLinks:  # the send task opens its destinations' links as new ones come: none here
        def open(self, destinations):
            pass

    def to_rows(batches):
        return [row for chunk in row_chunks(iter(batches), set(), NoLinks()) for row in chunk]

    def restore(rows):
        return [build_outgoing(row) for row in rows]

    def envelope(outgoing):
        sizes = 0
        for first in range(0, len(outgoing), 100):  # a send of 100, as a page's run of one destination
            batch = ServiceBusMessageBatch(max_size_in_bytes=1024 * 1024)
            for message in outgoing[first:first + 100]:
                add_encoded(batch, message)
            sizes += len(encode_payload(bytearray(), batch._message))  # noqa: SLF001
        return sizes

    def outcomes(rows):
        now = time.time()
        results = [delivery.Delivery(row, delivery.Outcome.DELIVERED, None, None, 1) for row in rows]
        return [record_batch([outcome_row(r, "run", 1, now) for r in results[i:i + 2000]], OUTCOME_ROW_ARROW_SCHEMA)
                for i in range(0, len(results), 2000)]

    seconds, rows = best(decode, raw)
    steps.append(("source: decode (peeked_message)", seconds))
    seconds, batches = best(to_arrow, rows)
    steps.append(("source: rows -> Arrow record batches", seconds))
    batches = classified(batches)
    seconds, sink_rows = best(to_rows, batches)
    steps.append(("send task: Arrow -> rows", seconds))
    seconds, outgoing = best(restore, sink_rows)
    steps.append(("send task: restore (build_outgoing)", seconds))
    seconds, _ = best(envelope, outgoing)
    steps.append(("send task: SDK batch envelope and its encoding", seconds))
    seconds, _ = best(outcomes, sink_rows)
    steps.append(("send task: outcome rows -> Arrow", seconds))

    print(f"bench_data_path: {args.messages:,} messages of {args.body_size} B body, CPU per message, best of {ROUNDS}")
    for name, seconds in steps:
        print(f"  {name:<48} {seconds / args.messages * 1e6:8.1f} us")
    total = sum(seconds for _, seconds in steps)
    print(f"  {'total':<48} {total / args.messages * 1e6:8.1f} us  ({total / args.messages * 1000:.3f} s per 1,000)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
