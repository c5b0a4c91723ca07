"""The fault harness's hooks (``tools.fault_hooks``, outside the wheel): a paused process goes on when told, a
purge round pauses only from the batch asked for, an empty plan does nothing, and the hooks reach Spark's Python
workers by their module's name from the harness's ``PYTHONPATH``."""

import datetime as dt
import os
import subprocess
import sys
import threading
from pathlib import Path

from pyspark import cloudpickle

from backlog_syphon.sink.micro_batch import NO_HOOKS, CrashPoint
from tools import fault_hooks
from tools.fault_hooks import FaultHooks, lose_first_attempt, pause_at
from tools.fault_plan import NO_FAULTS, FaultPlan

ROOT = Path(__file__).resolve().parents[2]


def test_a_paused_fault_point_goes_on_once_its_marker_is_removed_and_never_pauses_again(tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    plan = FaultPlan(pause_at=CrashPoint.MID_SEND, marker=str(marker), pause_seconds=60.0)
    monkeypatch.setattr(fault_hooks, "_paused_at", set())
    pause_at(plan, CrashPoint.AFTER_SEND)  # not the point asked for: goes on
    assert not marker.exists()

    paused = threading.Thread(target=FaultHooks(plan).task_sent, daemon=True)
    paused.start()
    deadline = dt.datetime.now() + dt.timedelta(seconds=10)
    while not (marker.exists() and marker.read_text()) and dt.datetime.now() < deadline:
        paused.join(0.05)
    assert marker.read_text() == f"mid_send {os.getpid()}\n" and paused.is_alive()
    marker.unlink()  # the test's "go on"
    paused.join(5)
    assert not paused.is_alive()

    # Another Python worker reaching the point later: no pause, and the marker stays removed.
    monkeypatch.setattr(fault_hooks, "_paused_at", set())
    pause_at(plan, CrashPoint.MID_SEND)
    assert not marker.exists()


def test_a_purge_round_pauses_mid_settle_only_when_it_settles_the_batch_asked_for_or_a_later_one(tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    hooks = FaultHooks(FaultPlan(pause_at=CrashPoint.MID_SETTLE, marker=str(marker), pause_seconds=0.0,
                                 pause_purge_from_batch=5))
    monkeypatch.setattr(fault_hooks, "_paused_at", set())
    hooks.completions_sent(frozenset({3, 4}))  # an earlier batch's round goes on
    hooks.reached(CrashPoint.AFTER_RECORD)
    assert not marker.exists()
    hooks.completions_sent(frozenset({4, 5}))
    assert marker.read_text() == f"mid_settle {os.getpid()}\n"


def test_the_empty_plan_and_the_librarys_no_hooks_do_nothing_at_any_point(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(fault_hooks, "_paused_at", set())
    for hooks in (FaultHooks(NO_FAULTS), NO_HOOKS):
        for point in CrashPoint:
            hooks.reached(point)  # would never return if it paused
            lose_first_attempt(NO_FAULTS, point)  # would end this process if it acted
        hooks.task_sent()
        hooks.completions_sent(frozenset({0}))
    assert list(tmp_path.iterdir()) == [] and fault_hooks._paused_at == set()


def test_the_hooks_travel_by_their_modules_name_to_a_worker_with_the_harnesss_path(tmp_path):
    """A Python worker imports what the send tasks' closure names: the harness puts the repository's root on its
    ``PYTHONPATH`` (``tools/faulty_job.py``), and a worker started with it gets the same plan back."""
    plan = FaultPlan(pause_at=CrashPoint.MID_SEND, marker=str(tmp_path / "m"), lose_task_at=CrashPoint.MID_SEND)
    payload = cloudpickle.dumps(FaultHooks(plan))
    assert b"tools.fault_hooks" in payload  # by reference: the worker imports the module (its pauses are per process)
    check = ("import sys; from pyspark import cloudpickle\n"
             "hooks = cloudpickle.loads(sys.stdin.buffer.read())\n"
             "print(type(hooks).__module__, hooks.plan.pause_at, hooks.plan.lose_task_at)\n")
    worker = subprocess.run([sys.executable, "-c", check], input=payload, capture_output=True, cwd=tmp_path,
                            env={"PYTHONPATH": os.pathsep.join([str(ROOT / "lib"), str(ROOT)]), "PATH": ""})
    assert worker.returncode == 0, worker.stderr.decode()
    assert worker.stdout.decode().split() == ["tools.fault_hooks", "mid_send", "mid_send"]


def test_the_harness_starts_the_jobs_command_line_from_a_bare_environment(tmp_path):
    """``python tools/faulty_job.py`` finds the library, the tools and the job's arguments by itself."""
    job = subprocess.run([sys.executable, str(ROOT / "tools" / "faulty_job.py"), "--help"], capture_output=True,
                         text=True, cwd=tmp_path, env={"PATH": "", "SYPHON_FAULT_PAUSE_AT": "before_send"})
    assert job.returncode == 0, job.stderr
    assert "--config" in job.stdout and "--dry-run" in job.stdout
