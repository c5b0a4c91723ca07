"""The fence, kept: take this run's lease before the stream starts, extend it while the run lives,
check it before every send, release it at the end. The decisions are ``lease``'s; this is the I/O.

A run holds one ``LeaseKeeper``. The driver takes the lease (``acquire``), a heartbeat thread extends it
while the run lives, and the sink asks ``send_deadline`` before each send round and before recording:
it extends the lease when due and says until when the round's tasks may send (the lease's expiry
less a safety margin). If the lease could not be extended and is close to expiring, or another run
holds it, the batch fails (``LeaseLostError``) without sending, recording or purging more.

A run that ends cleanly gives its lease back with its last commit, the checkpoint table's final
rewrite, whose rows name it as ended (``CheckpointRow.ended_run_id``): it sends, settles and writes
nothing after that commit, so a run that finds the lease held by a run the checkpoint table names
as ended may take it at once, as from a holder proven gone. Only a run without checkpoint rows to
write (nothing read; Spark Connect) writes a released lease row instead.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
import time
from typing import Callable

from pyspark.sql import SparkSession

from backlog_syphon.storage import checkpoint_table, lease_table
from backlog_syphon.run.lease import (
    Lease,
    LeaseHeldError,
    LeaseLostError,
    LeaseTableMismatchError,
    HEARTBEAT_FRACTION,
    may_send,
    new_lease,
    released,
    renewal_due,
    renewal_overdue,
    send_deadline,
)

logger = logging.getLogger(__name__)

WAIT_POLL_SECONDS = 5.0  # how often a waiting run looks at the lease (a read, not a commit)


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class LeaseKeeper:
    """This run's lease on one backlog. Picklable (the lease and settings travel, the thread does not)."""

    def __init__(self, *, lease_table: str, lease_key: str, run_id: str, lease_seconds: float,
                 checkpoint_table: str | None = None, clock: Callable[[], dt.datetime] = utc_now):
        self.lease_table = lease_table
        self.checkpoint_table = checkpoint_table  # where a holder that ended cleanly says so
        self.lease_key = lease_key
        self.run_id = run_id
        self.lease_seconds = lease_seconds
        self.clock = clock
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.process_identity = process_identity(self.pid)
        self.lease: Lease | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state.update(_lock=None, _stop=None, _heartbeat=None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._stop = threading.Event()

    # --- taking and giving back --------------------------------------------------------------------

    def acquire(self, spark: SparkSession, *, wait: bool, on_wait: Callable[[str], None] | None = None,
                table_created: bool = False, on_free: Callable[[], None] | None = None) -> Lease:
        """Take the lease, or raise ``LeaseHeldError`` (``wait=False``), or wait until it is free.

        ``table_created``: this run created the lease table a moment ago, so its first attempt writes
        epoch 1 without reading the (empty) table first. A run that took the lease meanwhile makes that
        compare-and-set fail, and the next attempt reads who holds it.
        ``on_free``: called each time the lease is found free, just before this run writes it. The state
        tables are then as the last holder left them (it gives the lease back only once all its writes
        are done), and stay so if the write succeeds: nobody else held the lease in between."""
        announced = False
        lost_races = 0
        unread = table_created
        while True:
            now = self.clock()
            current = None if unread else self._read(spark)
            unread = False
            ended = current is not None and self._holder_ended(spark, current, now)
            gone = current is not None and not ended and self._holder_gone(current)
            if current is None or current.is_free_for(self.run_id, now, holder_gone=gone or ended):
                candidate = new_lease(self.lease_key, self.run_id, self.host, self.pid, now, self.lease_seconds,
                                      current, self.process_identity)
                if gone and current.expires_at > now:
                    logger.warning("%s crashed (its process is gone): taking its lease over", current.holder)
                elif ended:
                    logger.info("%s ended cleanly (the checkpoint table says so): its lease is free", current.holder)
                if on_free is not None:
                    on_free()
                if lease_table.write_lease(spark, self.lease_table, candidate):
                    with self._lock:
                        self.lease = candidate
                    logger.info("took the lease on %s until %s", self.lease_key, candidate.expires_at)
                    return candidate
                lost_races += 1  # another run won the race: read who, then decide
                if lost_races > 10:
                    raise RuntimeError(f"could not write the lease row in {self.lease_table}; check that this "
                                       f"run may write there")
                continue
            if not wait:
                raise LeaseHeldError(current, now, lease_table=self.lease_table)
            if not announced and on_wait is not None:
                on_wait(f"waiting for the lease: {LeaseHeldError(current, now, lease_table=self.lease_table)}")
                announced = True
            time.sleep(min(WAIT_POLL_SECONDS, max(0.5, (current.expires_at - now).total_seconds())))

    def _read(self, spark: SparkSession) -> Lease | None:
        current = lease_table.read_lease(spark, self.lease_table)
        if current is not None and current.lease_key != self.lease_key:
            raise LeaseTableMismatchError(
                f"the lease table {self.lease_table} belongs to the backlog {current.lease_key}, not to "
                f"{self.lease_key}: the state tables (storage.checkpoint_table, storage.audit_table) of another "
                f"backlog are configured; give each backlog its own")
        return current

    def _holder_ended(self, spark: SparkSession, lease: Lease, now: dt.datetime) -> bool:
        """Whether the holder of a lease that is still running ended cleanly: the checkpoint table's last
        rewrite names it (read only then: a released or expired lease needs no proof)."""
        if lease.run_id == self.run_id or lease.expires_at <= now or not self.checkpoint_table:
            return False
        return checkpoint_table.ended_run(spark, self.checkpoint_table) == lease.run_id

    def _holder_gone(self, lease: Lease) -> bool:
        """Proof that the holder crashed: it ran in this machine's boot and pid namespace, and no process
        with its pid and start time exists any more."""
        return lease.run_id != self.run_id and process_gone(lease.process_identity)

    def holds(self, spark: SparkSession) -> bool:
        """Whether this run still holds the lease (read only when its own copy has expired); nothing is
        written: for the run's last commit, which must not land after another run took over."""
        lease = self.lease
        if lease is None:
            return False
        if lease.expires_at > self.clock():
            return True
        current = self._read(spark)
        return current is not None and current.run_id == self.run_id and current.epoch == lease.epoch

    def forget(self) -> None:
        """The lease was given back by the run's last commit (the checkpoint table names it as ended):
        drop it without a write of its own."""
        self.stop_heartbeat()
        with self._lock:
            self.lease = None

    def release(self, spark: SparkSession) -> None:
        """Give the lease back so a waiting run can start at once (best effort: it expires anyway)."""
        self.stop_heartbeat()
        with self._lock:
            lease, self.lease = self.lease, None
        if lease is None:
            return
        try:
            # Over the lease as this run last wrote it; if another copy of this run extended it
            # since, the write is refused (a stale epoch) and the lease simply expires.
            lease_table.write_lease(spark, self.lease_table, released(lease, self.clock()), confirm=False)
        except Exception as exc:  # noqa: BLE001 - the lease expires by itself
            logger.warning("could not release the lease (%s); it expires at %s", type(exc).__name__,
                           lease.expires_at)

    # --- keeping --------------------------------------------------------------------------------

    def extend(self, spark: SparkSession, *, if_due: bool = False) -> None:
        """Extend the lease now (``if_due``: unless it no longer needs it, for example because the heartbeat
        extended it while this thread waited for the lock); ``LeaseLostError`` if another run holds it."""
        with self._lock:
            if self.lease is None:
                raise LeaseLostError("this run does not hold the lease (it was released)")
            now = self.clock()
            if if_due and not renewal_due(self.lease, now, self.lease_seconds) and may_send(self.lease, now,
                                                                                             self.lease_seconds):
                return
            # Over the row as it is now: another copy of this keeper (the sink's, under Spark
            # Connect) may have extended it since.
            current = self._read(spark)
            if current is None or current.run_id != self.run_id:
                self.lease = None
                holder = "nobody" if current is None else f"{current.holder} (until {current.expires_at:%Y-%m-%d %H:%M:%S} UTC)"
                raise LeaseLostError(f"the lease was taken over by {holder}; this run stops sending")
            candidate = new_lease(self.lease_key, self.run_id, self.host, self.pid, self.clock(), self.lease_seconds,
                                  current, self.process_identity)
            if lease_table.write_lease(spark, self.lease_table, candidate):
                self.lease = candidate
                return
            # Not written: another copy of this keeper (the sink's, under Spark Connect) wrote that epoch
            # first, or another run took the lease. The row as it is now says which.
            latest = self._read(spark)
            if latest is None or latest.run_id != self.run_id:
                self.lease = None
                raise LeaseLostError("the lease was taken over while this run extended it; this run stops sending")
            self.lease = latest

    def send_deadline(self, spark: SparkSession) -> float:
        """Until when (epoch seconds) this run may send; extends the lease when the heartbeat is late with it
        (``renewal_overdue``: the round would otherwise wait for that commit each time a renewal falls due),
        and raises ``LeaseLostError`` unless this run may send now."""
        lease = self.lease
        if lease is not None and (renewal_overdue(lease, self.clock(), self.lease_seconds)
                                  or not may_send(lease, self.clock(), self.lease_seconds)):
            try:
                self.extend(spark, if_due=True)
            except LeaseLostError:
                raise
            except Exception as exc:  # noqa: BLE001 - storage hiccup: fine while the lease is still good
                if not may_send(self.lease, self.clock(), self.lease_seconds):
                    raise
                logger.warning("could not extend the lease (%s); it is still good until %s", type(exc).__name__,
                               self.lease.expires_at)
        if not may_send(self.lease, self.clock(), self.lease_seconds):
            until = "released" if self.lease is None else f"until {self.lease.expires_at:%H:%M:%S.%f} UTC"
            raise LeaseLostError(f"this run's lease ({until}) is about to expire and could not be extended; it "
                                 f"stops sending so that no other run sends the same messages")
        return send_deadline(self.lease, self.lease_seconds).timestamp()

    def confirm_held(self, spark: SparkSession) -> None:
        """Raise ``LeaseLostError`` unless this run still holds the lease. Recording what was sent needs no
        safety margin: a lease that is still this run's (extended here if it ran out, a compare-and-set)
        is held by nobody else, however slow the last extension's commit was."""
        lease = self.lease
        if lease is not None and lease.expires_at > self.clock():
            return
        self.extend(spark)  # raises LeaseLostError when another run holds it

    def start_heartbeat(self, spark: SparkSession) -> None:
        """Extend the lease in the background while the run lives, also during long batches."""
        if self._heartbeat is not None:
            return
        self._stop.clear()
        self._heartbeat = threading.Thread(target=self._beat, args=(spark,), name="syphon-lease", daemon=True)
        self._heartbeat.start()

    def stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._stop.set()
            self._heartbeat.join(timeout=30)
            self._heartbeat = None

    def _beat(self, spark: SparkSession) -> None:
        interval = max(0.5, self.lease_seconds * HEARTBEAT_FRACTION)
        while not self._stop.wait(interval):
            lease = self.lease
            if lease is None:
                return
            if not renewal_due(lease, self.clock(), self.lease_seconds):
                continue
            try:
                self.extend(spark, if_due=True)
            except LeaseLostError as exc:
                logger.error("%s", exc)
                return
            except Exception as exc:  # noqa: BLE001 - storage hiccup: the next beat tries again
                logger.warning("could not extend the lease (%s); trying again in %.0f s", type(exc).__name__, interval)


def current_holder(spark: SparkSession, lease_table_name: str, checkpoint_table_name: str | None,
                   now: dt.datetime) -> Lease | None:
    """The lease if a run holds it at ``now`` (not released, not expired, and its run not named as ended by
    the checkpoint table); None when the backlog is free. Reads only: for the dry run and the status."""
    lease = lease_table.read_lease(spark, lease_table_name)
    if lease is None or lease.expires_at <= now:
        return None
    if checkpoint_table_name and checkpoint_table.ended_run(spark, checkpoint_table_name) == lease.run_id:
        return None
    return lease


def process_identity(pid: int) -> str | None:
    """``<boot id>/<pid namespace>/<pid>/<start time>`` of a process of this machine, or None if unknown
    (no /proc): with it, a later run can prove the process gone."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            boot = handle.read().strip()
        namespace = os.readlink("/proc/self/ns/pid")
        return f"{boot}/{namespace}/{pid}/{_start_time(pid)}"
    except OSError:
        return None


def process_gone(identity: str | None) -> bool:
    """Whether the process ``identity`` names is proven gone: same boot and pid namespace as this process,
    and no live process with that pid and start time. Anything else is no proof."""
    mine = process_identity(os.getpid())
    if not identity or not mine:
        return False
    boot, namespace, pid, started = identity.rsplit("/", 3)
    my_boot, my_namespace, _, _ = mine.rsplit("/", 3)
    if (boot, namespace) != (my_boot, my_namespace):
        return False
    try:
        return _start_time(int(pid)) != started
    except OSError:
        return True  # no such process


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22); a zombie counts as gone."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        raise OSError("zombie")
    return fields[19]
