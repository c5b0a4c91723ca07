"""The soak benchmark's arithmetic (``bench/soak_report.py``): tenths, medians, p95, ratios, targets."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "soak_report", Path(__file__).resolve().parents[2] / "bench" / "soak_report.py")
soak_report = importlib.util.module_from_spec(_SPEC)
sys.modules["soak_report"] = soak_report  # its dataclasses look their module up there
_SPEC.loader.exec_module(soak_report)

Arrival, BatchFigure, Sample = soak_report.Arrival, soak_report.BatchFigure, soak_report.Sample


def test_median_and_p95_by_nearest_rank():
    assert soak_report.median([3.0, 1.0, 2.0]) == 2.0
    assert soak_report.median([1.0, 2.0, 3.0, 10.0]) == 2.5
    assert soak_report.p95([float(v) for v in range(1, 101)]) == 95.0
    assert soak_report.p95([float(v) for v in range(1, 21)]) == 19.0  # ceil(0.95 * 20) = 19th
    assert soak_report.p95([4.0]) == 4.0
    assert soak_report.median([]) is None and soak_report.p95([]) is None


def test_ratio_without_a_first_value_is_none():
    assert soak_report.ratio(1.5, 1.0) == 1.5
    assert soak_report.ratio(1.5, None) is None and soak_report.ratio(None, 1.0) is None
    assert soak_report.ratio(1.0, 0.0) is None


def test_tenth_groups_cut_batches_into_contiguous_tenths():
    groups = soak_report.tenth_groups(25)
    assert [len(g) for g in groups] == [2, 3, 2, 3, 2, 3, 2, 3, 2, 3]
    assert [i for g in groups for i in g] == list(range(25))
    assert [list(g) for g in soak_report.tenth_groups(3)] == [[0], [1], [2]]  # fewer batches: fewer groups
    assert soak_report.tenth_groups(0) == []


def batches(count: int, *, seconds=lambda i: 1.0) -> list:
    """A batch ending every 2 s from t=100, each with its step split."""
    return [BatchFigure(i, 100.0 + 2 * i, seconds(i), {"plan": 0.1, "read+send": 0.3, "aggregate": 0.1,
                                                       "record": seconds(i) - 0.5}) for i in range(count)]


def test_tenths_place_samples_and_arrivals_by_time():
    run = batches(20, seconds=lambda i: 1.0 if i < 10 else 2.0)  # tenth k: batches 2k, 2k+1
    samples = [Sample(98.0, 900.0, None, 0, 1),  # before the first batch started (99.0): the start, left out
               Sample(101.0, 1000.0, 300.0, 1, 3), Sample(101.5, 1100.0, None, 2, 5),  # tenth 1
               Sample(137.5, 1200.0, 310.0, 19, 40),  # tenth 10 (batches 18, 19: after 134, until 138)
               Sample(150.0, 5000.0, None, 30, 60)]  # after the last batch: the drain, left out
    arrivals = [Arrival(100.5, 1.5), Arrival(101.9, 2.5), Arrival(102.0, 1.0),  # tenth 1 (until 102)
                Arrival(137.0, 1.8), Arrival(139.0, 9.0)]  # tenth 10, and after the end
    rows = soak_report.tenths(run, samples, arrivals)
    assert len(rows) == 10
    first, last = rows[0], rows[-1]
    assert (first.first_batch, first.last_batch, first.batches) == (0, 1, 2)
    assert (last.first_batch, last.last_batch) == (18, 19)
    assert first.seconds_median == 1.0 and last.seconds_median == 2.0 and last.seconds_p95 == 2.0
    assert first.steps_median == {"plan": 0.1, "read+send": 0.3, "aggregate": 0.1, "record": 0.5}
    assert first.latency_median == 1.5 and first.latency_p95 == 2.5
    assert last.latency_median == 1.8
    assert first.rss_mb == 1050.0 and first.heap_mb == 300.0 and first.audit_files == 2
    assert first.audit_log_entries == 5
    assert last.rss_mb == 1200.0 and last.audit_files == 19
    assert rows[4].rss_mb is None and rows[4].audit_files is None  # no sample in that tenth


def test_targets_from_first_and_last_tenth():
    run = batches(20, seconds=lambda i: 1.0 if i < 10 else 1.05)
    rows = soak_report.tenths(run, [Sample(101.0, 1000.0), Sample(137.0, 1200.0)],
                              [Arrival(101.0, 1.6), Arrival(137.0, 1.7)])
    targets = soak_report.targets(rows, audit_files_end=80, status_early=2.0, status_end=2.2, batches=20,
                                  status_early_batches=20)
    values = [(t.value, t.limit, t.met) for t in targets]
    assert values[0] == (pytest.approx(1.05), 1.1, True)
    assert values[1] == (pytest.approx(1.7 / 1.6), 1.1, True)
    assert values[2] == (pytest.approx(1.2), 1.1, False)
    assert values[3] == (80, 50, False)
    assert values[4] == (pytest.approx(1.1), 1.2, True)
    assert soak_report.target_cells(targets[2])[1:4] == ["1.20", "<= 1.1", "NO"]
    assert targets[0].detail == "1.00 s -> 1.05 s"


def test_targets_of_a_run_without_batches_are_unknown():
    targets = soak_report.targets([], audit_files_end=None, status_early=None, status_end=3.0, batches=0,
                                  status_early_batches=0)
    assert [t.met for t in targets] == [None] * 5


def test_past_the_start_compares_the_last_tenth_with_the_first_tenths_second_half():
    # 40 batches: the first two of the first tenth's four are the start (3 s), the rest 1 s, the last tenth 1.2 s.
    run = batches(40, seconds=lambda i: 3.0 if i < 2 else (1.2 if i >= 36 else 1.0))
    rows = soak_report.tenths(run, [], [])
    assert rows[0].seconds_median == 2.0 and rows[-1].seconds_median == pytest.approx(1.2)
    settled = soak_report.past_start(run, rows)
    assert settled.value == pytest.approx(1.2) and settled.met is False  # against the first tenth: 0.6, met
    assert settled.measure == "median foreachBatch seconds, last tenth / batches 2-3 (past the start)"
    assert settled.detail == "1.00 s -> 1.20 s"
    short = batches(9)  # nine tenths of one batch each: no second half
    assert soak_report.past_start(short, soak_report.tenths(short, [], [])) is None
    assert soak_report.past_start([], []) is None
