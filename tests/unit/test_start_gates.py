"""``run.syphon.StartGates``: what a classic run's query may start before, and what its first batch waits
for. Fakes for the tables, the lease table and the pre-flights; the threads are real."""

import threading
from types import SimpleNamespace

import pytest

from backlog_syphon.errors import LeaseHeldError, SettingsError
from backlog_syphon.run.lease import new_lease
from backlog_syphon.run.syphon import StartGates
from backlog_syphon.servicebus import probes
from backlog_syphon.storage import tables
from backlog_syphon.timeline import Milestone, Timeline

from .test_fence import T0, Clock, LeaseTable, keeper

STORAGE = SimpleNamespace(audit_table="/state/audit", checkpoint_table="/state/checkpoint",
                          resolved_lease_table="/state/lease")
CONFIG = SimpleNamespace(storage=STORAGE, run=SimpleNamespace(wait_for_lease=False))


@pytest.fixture
def table(monkeypatch):
    table = LeaseTable()
    monkeypatch.setattr(tables, "read_lease", table.read)
    monkeypatch.setattr(tables, "write_lease", table.write)
    monkeypatch.setattr(tables, "create_tables", lambda spark, *names: set(names))  # all three new
    monkeypatch.setattr(probes, "preflight", lambda config: None)
    monkeypatch.setattr(probes, "executor_preflight", lambda spark, config: None)
    return table


def gates(clock=None) -> tuple[StartGates, Timeline]:
    timeline = Timeline(origin=0.0)
    holder = keeper(clock or Clock())
    holder.start_heartbeat = lambda spark: None
    return StartGates(None, CONFIG, holder, timeline, check_access=True, on_wait=None), timeline


def test_a_lease_held_by_another_run_is_refused_before_the_query_starts(table):
    table.row = new_lease("sb-host/contoso", "run-b", "elsewhere", 7, T0, 300)
    started, _ = gates()
    with pytest.raises(LeaseHeldError, match="run run-b on elsewhere"):
        started.wait_until_startable()
    assert table.writes == []


def test_the_query_may_start_while_the_lease_is_written_and_the_first_batch_waits_for_it(table, monkeypatch):
    writing, written = threading.Event(), threading.Event()
    write = table.write

    def slow_write(spark, lease_table, lease, *, confirm=True):
        writing.set()
        written.wait(10)
        return write(spark, lease_table, lease, confirm=confirm)

    monkeypatch.setattr(tables, "write_lease", slow_write)
    started, timeline = gates()
    started.wait_until_startable()  # returns with the lease seen free, its write still in flight
    assert writing.wait(10) and table.writes == [] and Milestone.LEASE_TAKEN not in timeline.marks
    written.set()
    started.wait()  # what the first batch waits for
    assert [lease.epoch for lease in table.writes] == [1] and Milestone.LEASE_TAKEN in timeline.marks
    assert started.state_is_new  # it created the tables and is the lease's first holder


def test_state_is_not_new_when_the_tables_existed_or_the_lease_had_a_holder_before(table, monkeypatch):
    monkeypatch.setattr(tables, "create_tables", lambda spark, audit, checkpoint, lease: {lease})
    started, _ = gates()
    started.wait()
    assert not started.state_is_new  # the audit and checkpoint tables were there already

    monkeypatch.setattr(tables, "create_tables", lambda spark, *names: set(names))
    clock = Clock()
    clock.at(600)  # the first holder's lease has expired
    started, _ = gates(clock)
    started.wait()
    assert table.row.epoch == 2 and not started.state_is_new


def test_an_executor_check_that_fails_stops_the_first_batch_and_gives_the_lease_back(table, monkeypatch):
    def unreachable(spark, config):
        raise SettingsError("executors cannot reach the primary namespace")

    monkeypatch.setattr(probes, "executor_preflight", unreachable)
    started, _ = gates()
    started.wait_until_startable()  # the driver's check and the lease do not wait for the executors'
    with pytest.raises(SettingsError, match="executors cannot reach"):
        started.wait()
    assert table.row.run_id == "run-a" and table.row.expires_at <= T0  # released


def test_a_driver_check_that_fails_starts_nothing(table, monkeypatch):
    def refused(config):
        raise SettingsError("the secondary namespace refused the credentials")

    monkeypatch.setattr(probes, "preflight", refused)
    started, _ = gates()
    with pytest.raises(SettingsError, match="refused the credentials"):
        started.wait_until_startable()
