"""The start of a run, as a small orchestrator over its ports: what must hold before the query starts. Pure:
every read, write and check is a port (``StartPorts``; ``run.start_ports`` is Spark's, Delta's and Service
Bus's), and the threads come in as ``submit`` (an executor's), so a test runs it with a fake in milliseconds.

What must hold: the tables exist, this run holds the lease (kept by a heartbeat from then on), the driver and
an executor reach both namespaces, and the source is registered with Spark's Python processes for planning it
started. The steps run at once (the pre-flights' round trips and the Python starts overlap the lease's Delta
commits); ``wait`` joins them.

Invariants:
- The query does not start before the lease is taken: its streaming checkpoint is shared by every run of the
  backlog, and two runs that both found the lease free would both write to it.
- The state tables are read (``recovery`` and ``look_back``) while the lease's commit is written, from the
  moment the lease is found free (nobody else writes them then), and only the last such read counts (a lost
  compare-and-set reads them again). State this run created at the lease's first epoch is never read.
- The tables' upkeep properties are set only under this run's lease: a property change fails every append it
  races, and before the lease another run may still be appending.
- A failure anywhere starts nothing and gives the lease back if it was taken; the failure raised is a
  pre-flight's first (it says what to fix), else the lease's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from backlog_syphon.model import DestinationShape, Lease, QueueSettings
from backlog_syphon.timeline import Milestone


@dataclass(frozen=True)
class CreatedTables:
    """What ``create_tables`` found: whether it created the audit and checkpoint tables (nothing was ever
    recorded), and the lease table."""

    state_tables: bool
    lease_table: bool


class StartPorts(Protocol):
    """Everything the start reads, writes and checks."""

    def check_driver(self) -> None: ...  # the driver reaches both namespaces (SettingsError: what to fix)
    def check_executors(self) -> None: ...  # an executor does too
    def prepare_source(self) -> None: ...  # the source registered, Spark's Python planners started
    def destination_shapes(self) -> dict[str, DestinationShape]: ...
    def queue_settings(self) -> QueueSettings: ...
    def create_tables(self) -> CreatedTables: ...
    # The lease taken (``LeaseHeldError``: another run holds it); ``on_free`` is called each time it is found free.
    def acquire_lease(self, *, table_created: bool, on_free: Callable[[], None] | None) -> Lease: ...
    def set_upkeep_properties(self) -> None: ...
    def start_heartbeat(self) -> None: ...
    def read_recovery(self): ...  # -> (sink.micro_batch.Recovery, look_back queues)
    def release_lease(self) -> None: ...
    def mark(self, milestone: Milestone) -> None: ...


class Pending(Protocol):
    """What ``submit`` returns (a ``concurrent.futures.Future``)."""

    def result(self): ...
    def exception(self): ...


Submit = Callable[[Callable[[], object]], Pending]


class StartGates:
    """The start's steps, submitted at construction; ``wait`` joins them. What they found is read from the
    attributes once ``wait`` returned."""

    def __init__(self, ports: StartPorts, submit: Submit, *, check_access: bool, nothing_recorded):
        self.ports = ports
        self.state_is_new = False  # nothing was ever recorded in the state tables
        # What the first batch recovers from, and the queues where earlier runs held messages for skipped
        # destinations (the source reads them again from their first message).
        self.recovery = nothing_recorded
        self.look_back: tuple[str, ...] = ()
        self.destination_shapes: dict[str, DestinationShape] = {}
        self.queue_settings = QueueSettings()

        def check_driver() -> None:
            if check_access:
                ports.check_driver()

        def check_executors() -> None:
            ports.check_executors()
            ports.mark(Milestone.PREFLIGHT_DONE)

        def prepare_source() -> None:
            ports.prepare_source()
            ports.mark(Milestone.SOURCE_READY)

        def read_shapes() -> None:
            self.destination_shapes = ports.destination_shapes()

        def read_queue_settings() -> None:
            self.queue_settings = ports.queue_settings()

        self._checks = tuple(submit(step) for step in (check_driver, check_executors, prepare_source, read_shapes,
                                                        read_queue_settings))
        self._leased = submit(lambda: self._take_lease(submit))

    def _take_lease(self, submit: Submit) -> None:
        ports = self.ports
        created = ports.create_tables()
        ports.mark(Milestone.TABLES_READY)
        reads: list[Pending] = []  # one per time the lease was found free: the last one counts
        lease = ports.acquire_lease(
            table_created=created.lease_table,
            on_free=None if created.state_tables else lambda: reads.append(submit(ports.read_recovery)))
        ports.mark(Milestone.LEASE_TAKEN)
        if not created.state_tables:  # under the lease: its property commit fails no other run's append
            ports.set_upkeep_properties()
        self.state_is_new = created.state_tables and lease.epoch == 1
        ports.start_heartbeat()
        if reads:
            self.recovery, self.look_back = reads[-1].result()
        elif not self.state_is_new:  # this run created the tables, but the lease had a holder before
            self.recovery, self.look_back = ports.read_recovery()

    def wait(self) -> None:
        """Return once all passed; else give the lease back (if it was taken) and raise the failure: a
        pre-flight's first (it says what to fix), else the lease's."""
        failures = [pending.exception() for pending in (*self._checks, self._leased)]  # waits for each
        failure = next((failure for failure in failures if failure is not None), None)
        if failure is not None:
            self.ports.release_lease()
            raise failure
