"""``run.syphon.StartGates``: what must hold before a run's query starts. Fakes for the tables, the lease
table and the pre-flights; the threads are real."""

import datetime as dt
from types import SimpleNamespace

import pytest

from backlog_syphon.errors import LeaseHeldError, SettingsError
from backlog_syphon.run.lease import new_lease
from backlog_syphon.run import syphon
from backlog_syphon.run.syphon import StartGates
from backlog_syphon.servicebus import entities, probes
from backlog_syphon.sink.micro_batch import Recovery
from backlog_syphon.storage import tables
from backlog_syphon.timeline import Milestone, Timeline

from .test_fence import T0, Clock, LeaseTable, keeper

STORAGE = SimpleNamespace(audit_table="/state/audit", checkpoint_table="/state/checkpoint",
                          resolved_lease_table="/state/lease", table_retention_days=1)
CONFIG = SimpleNamespace(storage=STORAGE, run=SimpleNamespace(wait_for_lease=False), primary=None, secondary=None)
SPARK = SimpleNamespace(dataSource=SimpleNamespace(register=lambda source: None))  # all else is patched below


@pytest.fixture
def table(monkeypatch):
    table = LeaseTable()
    monkeypatch.setattr(tables, "read_lease", table.read)
    monkeypatch.setattr(tables, "write_lease", table.write)
    monkeypatch.setattr(tables, "create_tables", lambda spark, *names, **_: set(names))  # all three new
    monkeypatch.setattr(syphon, "read_recovery", lambda spark, storage: (Recovery({}, (), ()), ()))
    monkeypatch.setattr(probes, "preflight", lambda config: None)
    monkeypatch.setattr(probes, "executor_preflight", lambda spark, config: None)
    monkeypatch.setattr(entities, "destination_shapes", lambda namespace: {})
    monkeypatch.setattr(entities, "queue_settings", lambda namespace: entities.QueueSettings())
    monkeypatch.setattr(syphon, "start_planners", lambda spark: None)
    table.upkeep_set = []  # the runs' property commits, with the lease holder they found
    monkeypatch.setattr(tables, "set_upkeep_properties",
                        lambda spark, *names, **_: table.upkeep_set.append((names, table.row and table.row.run_id)))
    return table


def gates(clock=None) -> tuple[StartGates, Timeline]:
    timeline = Timeline(origin=0.0)
    holder = keeper(clock or Clock())
    holder.start_heartbeat = lambda spark: None
    return StartGates(SPARK, CONFIG, holder, timeline, check_access=True, on_wait=None), timeline


def test_a_lease_held_by_another_run_is_refused_before_the_query_starts(table):
    table.row = new_lease("sb-host/contoso", "run-b", "elsewhere", 7, T0, 300)
    started, _ = gates()
    with pytest.raises(LeaseHeldError, match="run run-b on elsewhere"):
        started.wait()
    assert table.writes == []


def test_a_free_lease_is_taken_and_a_run_that_created_the_tables_knows_its_state_is_new(table):
    started, timeline = gates()
    started.wait()
    assert [lease.epoch for lease in table.writes] == [1] and Milestone.LEASE_TAKEN in timeline.marks
    assert started.state_is_new  # it created the tables and is the lease's first holder


def test_the_gates_wait_for_the_source_and_its_planners(table, monkeypatch):
    import threading

    release = threading.Event()
    planned = []
    monkeypatch.setattr(syphon, "start_planners", lambda spark: (release.wait(5), planned.append(spark)))
    started, timeline = gates()
    waiting = threading.Thread(target=started.wait)
    waiting.start()
    waiting.join(0.3)
    assert waiting.is_alive() and Milestone.SOURCE_READY not in timeline.marks  # the query may not start yet
    release.set()
    waiting.join(5)
    assert not waiting.is_alive() and planned == [SPARK] and Milestone.SOURCE_READY in timeline.marks


def test_state_is_not_new_when_the_tables_existed_or_the_lease_had_a_holder_before(table, monkeypatch):
    monkeypatch.setattr(tables, "create_tables", lambda spark, audit, checkpoint, lease, **_: {lease})
    started, _ = gates()
    started.wait()
    assert not started.state_is_new  # the audit and checkpoint tables were there already

    monkeypatch.setattr(tables, "create_tables", lambda spark, *names, **_: set(names))
    clock = Clock()
    clock.at(600)  # the first holder's lease has expired
    started, _ = gates(clock)
    started.wait()
    assert table.row.epoch == 2 and not started.state_is_new


def test_older_tables_get_their_upkeep_properties_only_under_the_runs_lease(table, monkeypatch):
    """A property change fails every append it races (Delta's MetadataChangedException): a start makes it
    once it holds the lease, never while another run does, and a run that created the tables needs none."""
    monkeypatch.setattr(tables, "create_tables", lambda spark, audit, checkpoint, lease, **_: set())  # all there
    table.row = new_lease("sb-host/contoso", "run-b", "elsewhere", 7, T0, 300)
    with pytest.raises(LeaseHeldError):
        gates()[0].wait()
    assert table.upkeep_set == []  # run-b still appends

    table.row = new_lease("sb-host/contoso", "run-b", "elsewhere", 7, T0 - dt.timedelta(seconds=600), 300)  # expired
    gates()[0].wait()
    assert table.upkeep_set == [(("/state/audit", "/state/checkpoint", "/state/lease"), "run-a")]

    table.upkeep_set.clear()
    monkeypatch.setattr(tables, "create_tables", lambda spark, *names, **_: set(names))
    table.row = None
    gates()[0].wait()
    assert table.upkeep_set == []


def test_an_executor_check_that_fails_starts_nothing_and_gives_the_lease_back(table, monkeypatch):
    def unreachable(spark, config):
        raise SettingsError("executors cannot reach the primary namespace")

    monkeypatch.setattr(probes, "executor_preflight", unreachable)
    started, _ = gates()
    with pytest.raises(SettingsError, match="executors cannot reach"):
        started.wait()
    assert table.row.run_id == "run-a" and table.row.expires_at <= T0  # released


def test_a_driver_check_that_fails_starts_nothing(table, monkeypatch):
    def refused(config):
        raise SettingsError("the secondary namespace refused the credentials")

    monkeypatch.setattr(probes, "preflight", refused)
    started, _ = gates()
    with pytest.raises(SettingsError, match="refused the credentials"):
        started.wait()


def test_a_run_on_existing_state_reads_it_once_the_lease_is_free_and_keeps_what_it_read(table, monkeypatch):
    """What the first batch recovers from and the queues with held messages are read while the lease's
    commit is written, after the lease was found free (so as the last holder left them), and only once."""
    recovery = Recovery({"contoso/x-servicebus-transfer/0": None}, (), ())
    reads = []

    def read_recovery(spark, storage):
        reads.append((storage.checkpoint_table, storage.audit_table, table.row.run_id, len(table.writes)))
        return recovery, ("contoso/x-servicebus-transfer/0",)

    monkeypatch.setattr(tables, "create_tables", lambda spark, audit, checkpoint, lease, **_: set())  # all there
    monkeypatch.setattr(syphon, "read_recovery", read_recovery)
    table.row = new_lease("sb-host/contoso", "run-b", "elsewhere", 7, T0 - dt.timedelta(seconds=600), 300)  # expired
    started, _ = gates()
    started.wait()
    assert table.row.run_id == "run-a" and not started.state_is_new
    assert (started.recovery, started.look_back) == (recovery, ("contoso/x-servicebus-transfer/0",))
    assert reads == [("/state/checkpoint", "/state/audit", "run-b", 0)]  # once, before this run's write


def test_state_this_run_created_is_not_read(table, monkeypatch):
    def no_reads(*args):
        raise AssertionError("a new state was read")

    monkeypatch.setattr(syphon, "read_recovery", no_reads)
    started, _ = gates()
    started.wait()
    assert started.state_is_new and started.look_back == ()
    assert started.recovery == Recovery({}, (), ())


def test_a_failed_state_read_starts_nothing_and_gives_the_lease_back(table, monkeypatch):
    def unreadable(spark, storage):
        raise OSError("the checkpoint table cannot be read")

    monkeypatch.setattr(tables, "create_tables", lambda spark, audit, checkpoint, lease, **_: set())
    monkeypatch.setattr(syphon, "read_recovery", unreadable)
    started, _ = gates()
    with pytest.raises(OSError, match="cannot be read"):
        started.wait()
    assert table.row.run_id == "run-a" and table.row.expires_at <= T0  # released


class _Recorder:
    """A run's end, as events: the query, the sink's purges and flush, the lease's release."""

    def __init__(self, flush: str = "rows", holds: bool = True):
        self.events = []
        self.flush_result = flush  # "rows": the final rows were written; "none": nothing to write; "fails"
        self.still_held = holds
        self.isActive = True
        self.streams = SimpleNamespace(removeListener=lambda listener: self.events.append("listener removed"))

    def stop(self):
        self.events.append("query stopped")

    def wait_for_purges(self):
        self.events.append("purges settled")

    def holds(self, spark):
        return self.still_held

    def flush(self, spark):
        import time

        time.sleep(0.05)  # a commit that takes a while: nothing of the run's may follow it
        if self.flush_result == "fails":
            raise OSError("the checkpoint table cannot be written")
        if self.flush_result == "none":
            return False
        self.events.append("final checkpoint rows written, naming the run as ended")
        return True

    def stop_heartbeat(self):
        self.events.append("heartbeat stopped")

    def forget(self):
        self.events.append("lease forgotten")

    def release(self, spark):
        self.events.append("lease row released")


@pytest.mark.parametrize("flush, holds, last", [
    ("rows", True, ["final checkpoint rows written, naming the run as ended", "lease forgotten"]),  # one commit
    ("none", True, ["lease row released"]),  # nothing to write (Spark Connect): the lease's own commit
    ("fails", True, ["lease row released"]),  # a failed write still gives the lease back
    ("rows", False, ["lease row released"]),  # the lease was taken over: no final write lands after it
])
def test_a_run_ends_with_one_commit_that_records_its_marks_and_gives_the_lease_back(flush, holds, last):
    """The next run reads the state tables once it finds the lease free: the run's final checkpoint rows,
    which name it as ended, are its last commit and free the lease; nothing of the run's lands after them.
    The heartbeat stops before that commit (one that hangs lets the lease expire)."""
    from backlog_syphon.run.syphon import SyphonRun

    end = _Recorder(flush, holds)
    run = SyphonRun(query=end, sink=end, listener=None, lease_keeper=end, stop_file="/nonexistent/stop",
                    records=None, timeline=Timeline(origin=0.0))
    if flush == "fails":
        with pytest.raises(OSError, match="cannot be written"):
            run.finish(end, meanwhile=lambda: end.events.append("summarised"))
    else:
        assert run.finish(end, meanwhile=lambda: "summary") == "summary"
    events = [event for event in end.events if event != "summarised"]
    assert events == ["query stopped", "purges settled", "listener removed", "heartbeat stopped"] + last
    assert Milestone.STATE_SAVED in run.timeline.marks or flush == "fails"
