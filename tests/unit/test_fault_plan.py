"""A test's fault plan (``tools.fault_plan``, pure): read once from the ``SYPHON_FAULT_*`` variables the
integration tests set, empty without them."""

import pickle

import pytest

from backlog_syphon.sink.micro_batch import CrashPoint
from tools.fault_plan import NO_FAULTS, FaultPlan


def test_without_the_variables_the_plan_is_empty():
    assert FaultPlan.from_environment({"PATH": "/bin"}) == NO_FAULTS == FaultPlan()
    assert FaultPlan.from_environment({"SYPHON_FAULT_PAUSE_AT": "", "SYPHON_FAULT_MARKER": ""}) == NO_FAULTS


def test_the_variables_make_the_plan_and_it_survives_pickling():
    plan = FaultPlan.from_environment({"SYPHON_FAULT_PAUSE_AT": "mid_send", "SYPHON_FAULT_PAUSE_SECONDS": "60",
                                       "SYPHON_FAULT_MARKER": "/tmp/marker", "SYPHON_FAULT_LOSE_TASK_AT": "mid_send"})
    assert plan == FaultPlan(pause_at=CrashPoint.MID_SEND, marker="/tmp/marker", pause_seconds=60.0,
                             lose_task_at=CrashPoint.MID_SEND)
    assert pickle.loads(pickle.dumps(plan)) == plan  # it travels in the send tasks' closure
    stop = FaultPlan.from_environment({"SYPHON_FAULT_PAUSE_AT": "after_record", "SYPHON_FAULT_MARKER": "/m"})
    assert (stop.pause_at, stop.pause_seconds, stop.lose_task_at) == (CrashPoint.AFTER_RECORD, None, None)


def test_a_purge_stops_mid_settlement_only_from_the_batch_asked_for():
    settling = FaultPlan.from_environment({"SYPHON_FAULT_PAUSE_AT": "mid_settle",
                                           "SYPHON_FAULT_PAUSE_PURGE_FROM_BATCH": "9"})
    assert settling.pause_purge_from_batch == 9
    assert not settling.pauses_purge_of([0, 8]) and settling.pauses_purge_of([7, 9])
    assert FaultPlan(pause_at=CrashPoint.MID_SETTLE).pauses_purge_of([0])  # the first round to get there
    assert not FaultPlan(pause_at=CrashPoint.AFTER_RECORD).pauses_purge_of([0])


def test_a_point_that_is_no_crash_point_is_refused_naming_the_points():
    with pytest.raises(ValueError, match="SYPHON_FAULT_PAUSE_AT='mid-send' names no crash point: one of "
                                         "before_send, mid_send, after_send, after_record, mid_settle, "
                                         "after_final_checkpoint"):
        FaultPlan.from_environment({"SYPHON_FAULT_PAUSE_AT": "mid-send"})
