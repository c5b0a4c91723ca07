"""What the soak benchmark reads from the job (``bench/soak_sampler.py``): the sink's batch line, jcmd's heap."""
from __future__ import annotations

import datetime as dt
import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses, and soak_sampler's import of soak_report, look it up there
    spec.loader.exec_module(module)
    return module


_load("soak_report")
soak_sampler = _load("soak_sampler")

LINE = ("2026-12-02 07:35:53,846 INFO backlog_syphon.sink.foreach_batch: batch_id=9 queues=4 delivered=98 "
        "dead_lettered=0 skipped=0 held=0 replayed=0 rounds=1 seconds=8.57 (exclude 0.01, plan 0.06, read+send "
        "1.14, aggregate 0.72, dead letters 0.20, record 6.64)")


def test_the_sinks_batch_line_gives_its_seconds_and_steps():
    figure = soak_sampler.parse_batch_line(LINE)
    assert figure.batch_id == 9 and figure.seconds == 8.57
    assert figure.steps == {"exclude": 0.01, "plan": 0.06, "read+send": 1.14, "aggregate": 0.72,
                            "dead letters": 0.20, "record": 6.64}
    assert figure.ended_at == dt.datetime(2026, 12, 2, 7, 35, 53, 846000).timestamp()


def test_other_lines_are_not_batches():
    assert soak_sampler.parse_batch_line("2026-12-02 07:35:53,846 INFO backlog_syphon.run.syphon: started "
                                         "run_id=r1 query=backlog-syphon trigger=2 seconds") is None
    assert soak_sampler.parse_batch_line("batch 9: delivered 98, dead-lettered 0") is None


def test_heap_in_use_sums_the_generations_not_the_metaspace():
    serial = ("12345:\n def new generation   total 78656K, used 2048K [0x1, 0x2, 0x3)\n"
              "  eden space 69952K,   2% used [0x1, 0x2, 0x3)\n"
              " tenured generation   total 174784K, used 100352K [0x1, 0x2, 0x3)\n"
              " Metaspace       used 81234K, committed 82000K, reserved 1114112K\n")
    assert soak_sampler.heap_used_mb(serial) == (2048 + 100352) / 1024
    g1 = " garbage-first heap   total 262144K, used 51200K [0x1, 0x2)\n  region size 1024K\n"
    assert soak_sampler.heap_used_mb(g1) == 50.0
    assert soak_sampler.heap_used_mb("12345:\nAttachNotSupportedException") is None


def test_live_files_replays_the_delta_log_so_compacted_away_files_no_longer_count(tmp_path):
    import json

    from soak_sampler import LiveFiles

    log = tmp_path / "audit" / "_delta_log"
    log.mkdir(parents=True)

    def commit(version, *actions):
        (log / f"{version:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")

    live = LiveFiles(tmp_path / "audit")
    assert live.count() == 0  # no table yet
    commit(0, {"metaData": {}}, {"add": {"path": "a.parquet"}})
    commit(1, {"add": {"path": "b.parquet"}})
    assert live.count() == 2
    commit(2, {"remove": {"path": "a.parquet"}}, {"remove": {"path": "b.parquet"}}, {"add": {"path": "c.parquet"}})
    assert live.count() == 1  # a compaction: two small files out, one in (on disk: three until VACUUM)
    assert live.next_version == 3  # each commit read once
