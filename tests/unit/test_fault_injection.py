"""Acting on a test's fault plan (``sink.fault_injection``): a paused process goes on when told, and an
empty plan does nothing."""

import datetime as dt
import os
import threading

from backlog_syphon.sink import fault_injection
from backlog_syphon.sink.fault_injection import PlannedFaults, lose_first_attempt, pause_at
from backlog_syphon.sink.fault_plan import NO_FAULTS, FaultPlan
from backlog_syphon.sink.micro_batch import CrashPoint


def test_a_paused_fault_point_goes_on_once_its_marker_is_removed_and_never_pauses_again(tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    plan = FaultPlan(pause_at=CrashPoint.MID_SEND, marker=str(marker), pause_seconds=60.0)
    monkeypatch.setattr(fault_injection, "_paused_at", set())
    pause_at(plan, CrashPoint.AFTER_SEND)  # not the point asked for: goes on
    assert not marker.exists()

    paused = threading.Thread(target=pause_at, args=(plan, CrashPoint.MID_SEND), daemon=True)
    paused.start()
    deadline = dt.datetime.now() + dt.timedelta(seconds=10)
    while not (marker.exists() and marker.read_text()) and dt.datetime.now() < deadline:
        paused.join(0.05)
    assert marker.read_text() == f"mid_send {os.getpid()}\n" and paused.is_alive()
    marker.unlink()  # the test's "go on"
    paused.join(5)
    assert not paused.is_alive()

    # Another Python worker reaching the point later: no pause, and the marker stays removed.
    monkeypatch.setattr(fault_injection, "_paused_at", set())
    pause_at(plan, CrashPoint.MID_SEND)
    assert not marker.exists()


def test_the_empty_plan_of_every_real_run_does_nothing_at_any_point(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(fault_injection, "_paused_at", set())
    for point in CrashPoint:
        PlannedFaults(NO_FAULTS).reached(point)  # would never return if it paused
        lose_first_attempt(NO_FAULTS, point)  # would end this process if it acted
    assert list(tmp_path.iterdir()) == [] and fault_injection._paused_at == set()
