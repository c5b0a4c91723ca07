"""A syphon run's figures from what its child reported: the steady batch cycle, the send step, what a batch
costs in probes, round trips and commits, and where the run's time went. Arithmetic only."""
from __future__ import annotations

import collections
import datetime as dt
import statistics

# Broker operations that are one request and its answer each (a receive is counted per message delivered,
# a settlement inside a bulk update_disposition per message: neither is a round trip of its own).
ROUND_TRIP_OPS = ("peek", "update_disposition", "renew_lock", "renew_session_lock", "receive_by_sequence_number",
                  "get_session_state", "set_session_state", "schedule_message", "cancel_scheduled_message",
                  "send", "attach")


def _epoch_ms(timestamp: str) -> float:
    return dt.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() * 1000


def cycle_figures(result: dict) -> dict:
    """The batch cycle's steady figures (see bench_syphon's docstring) from Spark's progress and the sink's sends."""
    busy = [b for b in sorted(result["batches"], key=lambda b: b["batch_id"]) if b["rows"]]
    later = busy[1:]
    figures: dict = {"busy_batches": len(busy), "cycle_rate": None, "send_rate": None, "between_seconds": None,
                     "between_max_seconds": None}
    if later:
        began = _epoch_ms(later[0]["timestamp"])
        ended = _epoch_ms(later[-1]["timestamp"]) + later[-1]["ms"]
        figures["cycle_rate"] = sum(b["rows"] for b in later) / max(1e-3, (ended - began) / 1000)
        starts = [_epoch_ms(b["timestamp"]) for b in busy]
        gaps = [(next_start - start) / 1000 - batch["duration_ms"].get("addBatch", 0) / 1000
                for batch, start, next_start in zip(busy, starts, starts[1:])]
        if gaps:
            figures["between_seconds"] = statistics.mean(gaps)
            figures["between_max_seconds"] = max(gaps)
    later_ids = {b["batch_id"] for b in later}
    sends = [s for s in result.get("sends", ()) if s["batch_id"] in later_ids and s["send_seconds"] > 0]
    if sends:
        figures["send_rate"] = sum(s["sent"] for s in sends) / sum(s["send_seconds"] for s in sends)
    marks = result.get("timeline") or {}
    if "LEASE_TAKEN" in marks and "FIRST_BATCH" in marks:
        figures["lease_to_first_batch_seconds"] = marks["FIRST_BATCH"] - marks["LEASE_TAKEN"]
    return figures


def steady_span(result: dict) -> tuple[float, float, int] | None:
    """``(start, end, rows)`` of the steady cycle (epoch seconds): the non-empty batches after the first, from
    the second's start to the last's end; None with fewer than two."""
    busy = [b for b in sorted(result["batches"], key=lambda b: b["batch_id"]) if b["rows"]]
    if len(busy) < 2:
        return None
    return (_epoch_ms(busy[1]["timestamp"]) / 1000, (_epoch_ms(busy[-1]["timestamp"]) + busy[-1]["ms"]) / 1000,
            sum(b["rows"] for b in busy[1:]))


def per_batch(result: dict) -> dict:
    """Probes, round trips and commits per non-empty batch. Probes: the most any plan after the first took,
    as the source reports them; else every single-message peek of the run (the start's too) per batch."""
    batches = max(1, result["busy_batches"])
    ops = result["ops"]
    plans = [b["plan"]["probes"] for b in sorted(result["batches"], key=lambda b: b["batch_id"])[1:]
             if b.get("plan")]
    return {"probes": max(plans) if plans else ops.get("peek_one", 0) / batches,
            "round_trips": sum(ops.get(kind, 0) for kind in ROUND_TRIP_OPS) / batches,
            "commits": (result["commits"]["audit"] + result["commits"]["checkpoint"]) / batches}


def time_split(result: dict) -> str:
    """Where a syphon run's time went: Spark start, set-up, the batches (by step), between and after them."""
    batches_s = sum(b["ms"] for b in result["batches"]) / 1000
    steps: collections.Counter = collections.Counter()
    for batch in result["batches"]:
        steps.update({step: ms for step, ms in batch["duration_ms"].items() if step != "triggerExecution"})
    by_step = ", ".join(f"{step} {ms / 1000:.1f}" for step, ms in steps.most_common() if ms >= 100)
    return (f"spark start {result['spark_start_seconds']:.1f} s, set-up before the query "
            f"{result['until_query_seconds'] - result['spark_start_seconds']:.1f} s, {result['busy_batches']} non-empty "
            f"of {len(result['batches'])} batches {batches_s:.1f} s ({by_step}), between and after the batches "
            f"{result['seconds'] - result['until_query_seconds'] - batches_s:.1f} s; {fixed_costs(result)}")


def fixed_costs(result: dict) -> str:
    """From the run's timeline: process start to the first message sent, and the last batch's record to the
    process's exit (as the bench saw it end, less the child's bench-only work), with the steps between."""
    marks = result.get("timeline") or {}
    first_send, last_record = marks.get("FIRST_SEND"), marks.get("LAST_RECORD")
    steps = ", ".join(f"{name.lower()} {seconds:.1f}" for name, seconds in sorted(marks.items(), key=lambda m: m[1]))
    out = "process start -> first send " + ("-" if first_send is None else f"{first_send:.1f} s")
    if last_record is not None and "exited_at" in result:
        exit_at = result["exited_at"] - result["process_origin"] - result.get("bench_only_seconds", 0.0)
        out += f", last record -> exit {exit_at - last_record:.1f} s"
    return f"{out} (timeline, s from process start: {steps})"
