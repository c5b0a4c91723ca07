"""The fence kept by ``run.fence.LeaseKeeper``, over a fake lease table and a fake clock; and the proof
that a holder's process is gone (``process_identity``, ``process_gone``) on this machine's /proc."""

import datetime as dt
import os

import pytest

from backlog_syphon.errors import LeaseHeldError, LeaseLostError
from backlog_syphon.model import Lease
from backlog_syphon.run import fence
from backlog_syphon.run.fence import LeaseKeeper, process_gone, process_identity
from backlog_syphon.run.lease import new_lease, send_deadline
from backlog_syphon.storage import checkpoint_table, lease_table

T0 = dt.datetime(2026, 11, 26, 8, 0, tzinfo=dt.timezone.utc)
LEASE_SECONDS = 120  # renewal due after 40 s; no sending in the last 30 s


class LeaseTable:
    """The lease table: one row, written as a compare-and-set on its epoch."""

    def __init__(self, row: Lease | None = None):
        self.row = row
        self.writes: list[Lease] = []
        self.failures: list[BaseException] = []  # raised by the next writes, in turn

    def read(self, spark, lease_table):
        return self.row

    def write(self, spark, lease_table, lease, *, confirm=True):
        if self.failures:
            raise self.failures.pop(0)
        if (self.row.epoch if self.row else 0) != lease.epoch - 1:
            return False
        self.row = lease
        self.writes.append(lease)
        return True


class Clock:
    def __init__(self):
        self.now = T0

    def __call__(self):
        return self.now

    def at(self, seconds):
        self.now = T0 + dt.timedelta(seconds=seconds)


@pytest.fixture
def table(monkeypatch):
    table = LeaseTable()
    monkeypatch.setattr(lease_table, "read_lease", table.read)
    monkeypatch.setattr(lease_table, "write_lease", table.write)
    return table


def keeper(clock, run_id="run-a"):
    return LeaseKeeper(lease_table="/state/lease", lease_key="sb-host/contoso", run_id=run_id,
                       lease_seconds=LEASE_SECONDS, clock=clock)


def test_a_fresh_lease_gives_its_expiry_less_the_margin_without_writing(table):
    clock = Clock()
    holder = keeper(clock)
    lease = holder.acquire(None, wait=False)
    assert (lease.epoch, lease.expires_at) == (1, T0 + dt.timedelta(seconds=120))
    clock.at(39)
    assert holder.send_deadline(None) == (T0 + dt.timedelta(seconds=90)).timestamp()
    assert len(table.writes) == 1  # only the acquisition
    assert send_deadline(lease, LEASE_SECONDS) == T0 + dt.timedelta(seconds=90)


def test_a_lease_due_for_renewal_is_the_heartbeats_and_a_round_extends_it_only_once_the_heartbeat_is_late(table):
    # Due at 40 s: the heartbeat (every 20 s) extends it by 60 s; meanwhile a round starts at once, under the
    # deadline the lease gives, and waits for no commit.
    clock = Clock()
    holder = keeper(clock)
    holder.acquire(None, wait=False)
    clock.at(59)
    assert holder.send_deadline(None) == (T0 + dt.timedelta(seconds=90)).timestamp()
    assert len(table.writes) == 1
    clock.at(60)
    assert holder.send_deadline(None) == (T0 + dt.timedelta(seconds=150)).timestamp()
    assert [(w.epoch, w.acquired_at, w.renewed_at) for w in table.writes] == [
        (1, T0, T0), (2, T0, T0 + dt.timedelta(seconds=60))]


def test_a_lease_taken_over_by_another_run_stops_the_sending(table):
    clock = Clock()
    holder = keeper(clock)
    holder.acquire(None, wait=False)
    clock.at(200)  # expired: another run took it
    table.row = Lease("sb-host/contoso", 2, "run-b", "other-host", 7, clock.now, clock.now,
                      clock.now + dt.timedelta(seconds=120))
    with pytest.raises(LeaseLostError, match="taken over by run run-b on other-host \\(pid 7\\)"):
        holder.send_deadline(None)
    assert holder.lease is None
    with pytest.raises(LeaseLostError):
        holder.send_deadline(None)  # and stays stopped


def test_a_lease_whose_row_is_gone_stops_the_sending(table):
    clock = Clock()
    holder = keeper(clock)
    holder.acquire(None, wait=False)
    clock.at(95)
    table.row = None  # the lease table was emptied: nobody holds it, this run included
    with pytest.raises(LeaseLostError, match="taken over by nobody; this run stops sending"):
        holder.send_deadline(None)


def test_one_failed_extension_while_the_lease_is_still_good_does_not_stop_the_sending(table):
    # At 65 s the renewal is overdue, but the lease is good until 90 s: a storage hiccup is survived (the
    # heartbeat or the next round extends it), as the fence's design promises.
    clock = Clock()
    holder = keeper(clock)
    holder.acquire(None, wait=False)
    clock.at(65)
    table.failures.append(OSError("storage briefly unavailable"))
    assert holder.send_deadline(None) == (T0 + dt.timedelta(seconds=90)).timestamp()
    assert not table.failures  # the extension was tried


def test_the_identity_of_this_process_proves_it_alive():
    mine = process_identity(os.getpid())
    boot, namespace, pid, started = mine.rsplit("/", 3)
    assert pid == str(os.getpid()) and started.isdigit() and boot and namespace
    assert process_gone(mine) is False


def test_a_process_is_gone_only_when_proven():
    boot, namespace, pid, started = process_identity(os.getpid()).rsplit("/", 3)
    assert process_gone(f"{boot}/{namespace}/{pid}/{int(started) + 1}") is True  # the pid was reused since
    assert process_gone(f"{boot}/{namespace}/{2 ** 22 + 1}/1") is True  # no such process
    assert process_gone(f"other-boot/{namespace}/{2 ** 22 + 1}/1") is False  # another machine or boot: no proof
    assert process_gone(f"{boot}/pid:[1]/{2 ** 22 + 1}/1") is False  # another pid namespace: no proof
    assert process_gone(None) is False and process_gone("") is False


def test_a_lease_of_a_crashed_holder_on_this_machine_is_taken_over_at_once(table):
    clock = Clock()
    boot, namespace, _, _ = process_identity(os.getpid()).rsplit("/", 3)
    table.row = Lease("sb-host/contoso", 4, "run-old", "host", 1, T0, T0, T0 + dt.timedelta(seconds=120),
                      f"{boot}/{namespace}/{2 ** 22 + 1}/1")
    lease = keeper(clock, run_id="run-new").acquire(None, wait=False)
    assert (lease.run_id, lease.epoch, lease.acquired_at) == ("run-new", 5, T0)
    assert fence.process_gone(table.row.process_identity) is False  # now this process's: alive


def test_a_lease_table_this_run_created_is_not_read_before_the_first_attempt(table, monkeypatch):
    reads = []
    monkeypatch.setattr(lease_table, "read_lease", lambda spark, lease_table: reads.append(lease_table) or table.row)
    lease = keeper(Clock()).acquire(None, wait=False, table_created=True)
    assert (lease.run_id, lease.epoch) == ("run-a", 1) and table.writes == [lease]
    assert reads == []


def test_a_run_that_took_a_just_created_lease_table_first_is_found_by_the_next_attempt(table):
    # Another run created the table at the same time, won that race and took the lease.
    table.row = new_lease("sb-host/contoso", "run-first", "other-host", 7, T0, LEASE_SECONDS)
    with pytest.raises(LeaseHeldError, match="run run-first on other-host"):
        keeper(Clock(), run_id="run-second").acquire(None, wait=False, table_created=True)
    assert table.writes == [] and table.row.run_id == "run-first"  # its epoch-1 write failed the compare-and-set


def test_a_lease_still_this_runs_may_record_inside_its_safety_margin(table):
    clock = Clock()
    holder = keeper(clock)
    holder.acquire(None, wait=False)
    clock.at(100)  # past the sending margin (no sending after 90 s), not expired (120 s)
    holder.confirm_held(None)  # recording needs no extension: nobody else can hold it yet
    assert [w.epoch for w in table.writes] == [1] and holder.lease.expires_at == T0 + dt.timedelta(seconds=120)
    clock.at(130)  # expired, its row still this run's: extended (a compare-and-set), then it records
    holder.confirm_held(None)
    assert [w.epoch for w in table.writes] == [1, 2] and holder.lease.expires_at == clock.now + dt.timedelta(
        seconds=LEASE_SECONDS)
    clock.at(300)  # expired again, and another run took it meanwhile: nothing may be recorded
    table.row = Lease("sb-host/contoso", 3, "run-b", "other-host", 7, clock.now, clock.now,
                      clock.now + dt.timedelta(seconds=LEASE_SECONDS))
    with pytest.raises(LeaseLostError, match="run-b"):
        holder.confirm_held(None)


def test_on_free_is_told_each_time_the_lease_is_found_free_before_the_write_and_never_while_held(table, monkeypatch):
    """What a run reads in ``on_free`` is what the last holder left: it is called once the lease is free
    (here: after waiting for the holder to give it back) and before this run's compare-and-set."""
    from types import SimpleNamespace

    clock = Clock()
    table.row = new_lease("sb-host/contoso", "run-b", "elsewhere", 7, T0, LEASE_SECONDS)
    events = []

    def holder_gives_back(seconds):
        events.append("waited")
        table.row = fence.released(table.row, clock())

    monkeypatch.setattr(fence, "time", SimpleNamespace(sleep=holder_gives_back))
    lease = keeper(clock).acquire(None, wait=True, on_free=lambda: events.append(("free", len(table.writes))))
    assert events == ["waited", ("free", 0)]  # not while run-b held it; before this run's write
    assert table.writes == [lease] and lease.run_id == "run-a"


def test_on_free_is_told_again_after_a_lost_race(table):
    """Another run wrote the epoch first: what was read for the first attempt is stale, and the next
    free lease is announced again (here it is that run's, so this one is refused)."""
    rival = new_lease("sb-host/contoso", "run-b", "elsewhere", 7, T0, LEASE_SECONDS)
    calls = []

    def race():
        calls.append(1)
        if len(calls) == 1:
            table.row = rival

    with pytest.raises(LeaseHeldError):
        keeper(Clock()).acquire(None, wait=False, on_free=race)
    assert calls == [1] and table.row is rival and table.writes == []

    table.row = fence.released(rival, T0)
    keeper(Clock()).acquire(None, wait=False, on_free=race)
    assert len(calls) == 2 and table.row.run_id == "run-a"


def test_a_lease_whose_run_ended_cleanly_is_taken_at_once_and_another_runs_is_not(table, monkeypatch):
    """A run that ends cleanly writes no lease row: its final checkpoint rows name it as ended. A run
    that finds the lease still running reads the checkpoint table: the holder it names is free at once;
    any other holder (or none named) still fences."""
    clock = Clock()
    first = LeaseKeeper(lease_table="/state/lease", lease_key="sb-host/contoso", run_id="run-a",
                        lease_seconds=LEASE_SECONDS, checkpoint_table="/state/checkpoint", clock=clock)
    first.acquire(None, wait=False)
    first.forget()  # its last commit was the checkpoint table's, naming it as ended
    assert len(table.writes) == 1 and first.lease is None
    ended = {"run": None}
    reads = []
    monkeypatch.setattr(checkpoint_table, "ended_run", lambda spark, checkpoint_table: reads.append(checkpoint_table)
                        or ended["run"])
    clock.at(10)
    second = LeaseKeeper(lease_table="/state/lease", lease_key="sb-host/contoso", run_id="run-b",
                         lease_seconds=LEASE_SECONDS, checkpoint_table="/state/checkpoint", clock=clock)
    with pytest.raises(LeaseHeldError, match="run run-a"):
        second.acquire(None, wait=False)  # nothing names run-a as ended (it may still be writing)
    ended["run"] = "run-a"
    taken = second.acquire(None, wait=False)
    assert (taken.epoch, taken.run_id) == (2, "run-b") and reads == ["/state/checkpoint"] * 2
    ended["run"] = "run-z"  # a stale final write of some older run frees nobody else's lease
    third = LeaseKeeper(lease_table="/state/lease", lease_key="sb-host/contoso", run_id="run-c",
                        lease_seconds=LEASE_SECONDS, checkpoint_table="/state/checkpoint", clock=clock)
    with pytest.raises(LeaseHeldError, match="run run-b"):
        third.acquire(None, wait=False)
    assert fence.current_holder(None, "/state/lease", "/state/checkpoint", clock.now).run_id == "run-b"
    ended["run"] = "run-b"
    assert fence.current_holder(None, "/state/lease", "/state/checkpoint", clock.now) is None


def test_a_run_checks_it_still_holds_the_lease_before_its_last_commit(table):
    clock = Clock()
    holder = keeper(clock)
    holder.acquire(None, wait=False)
    assert holder.holds(None) and len(table.writes) == 1  # its own copy is good: nothing read or written
    clock.at(130)  # expired meanwhile (a hung commit, say)
    assert holder.holds(None)  # still the row's holder: nobody took it
    table.row = new_lease("sb-host/contoso", "run-b", "h", 1, clock.now, LEASE_SECONDS, table.row)
    assert not holder.holds(None)
