"""The run's timeline: marks from the process's start, first time only unless asked, printed in time order."""

import time

from backlog_syphon.timeline import Milestone, Timeline, process_start


def test_marks_are_seconds_from_the_origin_and_keep_their_first_time_unless_marked_again():
    timeline = Timeline(origin=1000.0)
    timeline.mark(Milestone.SPARK_READY, 1004.0)
    timeline.mark(Milestone.SPARK_READY, 1009.0)  # not again: the first time counts
    timeline.mark(Milestone.LAST_RECORD, 1020.0)
    timeline.mark(Milestone.LAST_RECORD, 1030.5, again=True)  # the last batch's record counts
    assert timeline.seconds(Milestone.SPARK_READY) == 4.0
    assert timeline.seconds(Milestone.LAST_RECORD) == 30.5
    assert timeline.seconds(Milestone.FIRST_SEND) is None


def test_lines_follow_time_order_with_the_step_from_the_mark_before():
    timeline = Timeline(origin=1000.0)
    timeline.mark(Milestone.LEASE_TAKEN, 1012.0)
    timeline.mark(Milestone.QUERY_STARTED, 1010.0)  # the query may start before the lease is written
    timeline.mark(Milestone.SPARK_READY, 1005.5)
    lines = timeline.lines()
    assert lines[0].strip().startswith("timeline")
    assert [line.split(" s  ")[1].split("(")[0].strip() for line in lines[1:]] == [
        "Spark session ready", "streaming query started", "lease taken"]
    assert lines[1].split()[0] == "5.5" and lines[1].endswith("(+5.5 s)")
    assert lines[3].split()[0] == "12.0" and lines[3].endswith("(+2.0 s)")


def test_the_process_started_before_now():
    assert 0 <= time.time() - process_start() < 3600
