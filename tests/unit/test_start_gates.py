"""The start of a run (``run.run_start.StartGates``): what must hold before its query starts, over a fake of
its ports (``FakeStart``: the tables, the lease, the pre-flights, the source, the administration API's reads).
The threads are real: the steps run at once, as in a run."""

import dataclasses
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from backlog_syphon.errors import LeaseHeldError, SettingsError
from backlog_syphon.model import QueueSettings
from backlog_syphon.run.lease import new_lease
from backlog_syphon.run.run_start import CreatedTables, StartGates
from backlog_syphon.sink.micro_batch import NOTHING_RECORDED, Recovery
from backlog_syphon.timeline import Milestone, Timeline

from .test_fence import T0

Q0 = "contoso/x-servicebus-transfer/0"


class FakeStart:
    """The start's ports as events. The lease table holds ``holder`` (a run that holds it now, or None: free)
    and the epoch the last holder wrote; a free lease is taken at the next epoch, telling ``on_free`` first."""

    def __init__(self, *, created=CreatedTables(state_tables=True, lease_table=True), holder=None, epoch=0):
        self.created, self.holder, self.epoch = created, holder, epoch
        self.events: list[str] = []
        self.timeline = Timeline(origin=0.0)
        self.recovery = (Recovery({Q0: None}, (), ()), (Q0,))
        self.failures: dict[str, BaseException] = {}  # port name -> what it raises
        self.source_released = threading.Event()
        self.source_released.set()
        self.read_started = threading.Event()

    def _step(self, name):
        self.events.append(name)
        if name in self.failures:
            raise self.failures[name]

    def check_driver(self):
        self._step("driver checked")

    def check_executors(self):
        self._step("executors checked")

    def prepare_source(self):
        self.source_released.wait(5)
        self._step("source prepared")

    def destination_shapes(self):
        self._step("shapes read")
        return {"orders": "shape"}

    def queue_settings(self):
        self._step("queue settings read")
        return QueueSettings(frozenset({Q0}), {Q0: 60.0})

    def create_tables(self):
        self._step("tables created")
        return self.created

    def acquire_lease(self, *, table_created, on_free):
        self._step("lease asked for")
        if self.holder is not None:
            raise LeaseHeldError(f"run {self.holder} on elsewhere holds the backlog")
        if on_free is not None:
            on_free()
            self.read_started.wait(2)  # a lease commit takes a while: the state's read begins meanwhile
        self.epoch += 1
        self.events.append(f"lease taken at epoch {self.epoch}")
        self.holder = "run-a"
        return dataclasses.replace(new_lease("sb-host/contoso", "run-a", "here", 1, T0, 120), epoch=self.epoch)

    def set_upkeep_properties(self):
        self.events.append(f"upkeep properties set under {self.holder}")

    def start_heartbeat(self):
        self.events.append("heartbeat started")

    def read_recovery(self):
        self.read_started.set()
        self._step(f"state read (epoch {self.epoch})")
        return self.recovery

    def release_lease(self):
        self.events.append("lease released")
        if self.holder == "run-a":
            self.holder = None

    def mark(self, milestone):
        self.timeline.mark(milestone)


def started(ports, *, check_access=True):
    pool = ThreadPoolExecutor(max_workers=8)
    gates = StartGates(ports, pool.submit, check_access=check_access, nothing_recorded=NOTHING_RECORDED)
    try:
        gates.wait()
    finally:
        pool.shutdown(wait=True)
    return gates


def test_a_lease_held_by_another_run_is_refused_before_the_query_starts():
    ports = FakeStart(holder="run-b")
    with pytest.raises(LeaseHeldError, match="run run-b on elsewhere"):
        started(ports)
    assert not [event for event in ports.events if event.startswith(("lease taken", "upkeep", "state read"))]
    assert Milestone.LEASE_TAKEN not in ports.timeline.marks


def test_a_free_lease_is_taken_and_a_run_that_created_the_tables_knows_its_state_is_new():
    ports = FakeStart()
    gates = started(ports)
    assert "lease taken at epoch 1" in ports.events and Milestone.LEASE_TAKEN in ports.timeline.marks
    assert gates.state_is_new  # it created the tables and is the lease's first holder
    assert (gates.destination_shapes, gates.queue_settings) == ({"orders": "shape"}, QueueSettings(frozenset({Q0}),
                                                                                                   {Q0: 60.0}))
    assert {Milestone.TABLES_READY, Milestone.PREFLIGHT_DONE, Milestone.SOURCE_READY} <= set(ports.timeline.marks)


def test_the_gates_wait_for_the_source_and_its_planners():
    ports = FakeStart()
    ports.source_released.clear()
    pool = ThreadPoolExecutor(max_workers=8)
    gates = StartGates(ports, pool.submit, check_access=True, nothing_recorded=NOTHING_RECORDED)
    waiting = threading.Thread(target=gates.wait)
    waiting.start()
    waiting.join(0.3)
    assert waiting.is_alive() and Milestone.SOURCE_READY not in ports.timeline.marks  # the query may not start yet
    ports.source_released.set()
    waiting.join(5)
    pool.shutdown(wait=True)
    assert not waiting.is_alive() and "source prepared" in ports.events
    assert Milestone.SOURCE_READY in ports.timeline.marks


def test_state_is_not_new_when_the_tables_existed_or_the_lease_had_a_holder_before():
    assert not started(FakeStart(created=CreatedTables(state_tables=False, lease_table=False))).state_is_new
    gates = started(FakeStart(epoch=1))  # the tables are new, but a run held the lease before (and crashed)
    assert not gates.state_is_new and gates.look_back == (Q0,)


def test_older_tables_get_their_upkeep_properties_only_under_the_runs_lease():
    """A property change fails every append it races (Delta's MetadataChangedException): a start makes it
    once it holds the lease, never while another run does, and a run that created the tables needs none."""
    existing = CreatedTables(state_tables=False, lease_table=False)
    held = FakeStart(created=existing, holder="run-b")
    with pytest.raises(LeaseHeldError):
        started(held)
    assert not [event for event in held.events if event.startswith("upkeep")]  # run-b still appends
    free = FakeStart(created=existing, epoch=3)
    started(free)
    assert [event for event in free.events if event.startswith("upkeep")] == ["upkeep properties set under run-a"]
    new = FakeStart()
    started(new)
    assert not [event for event in new.events if event.startswith("upkeep")]


def test_an_executor_check_that_fails_starts_nothing_and_gives_the_lease_back():
    ports = FakeStart()
    ports.failures["executors checked"] = SettingsError("executors cannot reach the primary namespace")
    with pytest.raises(SettingsError, match="executors cannot reach"):
        started(ports)
    assert ports.events[-1] == "lease released" and ports.holder is None


def test_a_driver_check_that_fails_starts_nothing_and_is_skipped_when_the_caller_checked_already():
    ports = FakeStart()
    ports.failures["driver checked"] = SettingsError("the secondary namespace refused the credentials")
    with pytest.raises(SettingsError, match="refused the credentials"):
        started(ports)
    assert ports.holder is None
    assert started(ports, check_access=False) and "driver checked" not in ports.events[-10:]


def test_a_run_on_existing_state_reads_it_once_the_lease_is_free_and_keeps_what_it_read():
    """What the first batch recovers from and the queues with held messages are read while the lease's
    commit is written, after the lease was found free (so as the last holder left them), and only once."""
    ports = FakeStart(created=CreatedTables(state_tables=False, lease_table=False), epoch=4)
    gates = started(ports)
    assert not gates.state_is_new
    assert (gates.recovery, gates.look_back) == ports.recovery
    assert [event for event in ports.events if event.startswith("state read")] == ["state read (epoch 4)"]
    # read before this run's lease write, from the moment the lease was found free
    assert ports.events.index("state read (epoch 4)") < ports.events.index("lease taken at epoch 5")


def test_state_this_run_created_is_not_read():
    ports = FakeStart()
    gates = started(ports)
    assert gates.state_is_new and gates.look_back == () and gates.recovery == NOTHING_RECORDED
    assert not [event for event in ports.events if event.startswith("state read")]


def test_a_failed_state_read_starts_nothing_and_gives_the_lease_back():
    ports = FakeStart(created=CreatedTables(state_tables=False, lease_table=False))
    ports.failures["state read (epoch 0)"] = OSError("the checkpoint table cannot be read")
    with pytest.raises(OSError, match="cannot be read"):
        started(ports)
    assert ports.events[-1] == "lease released" and ports.holder is None


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
