"""The fence between runs: who may deliver from a backlog, decided on plain values (no I/O).

At most one run at a time delivers from a backlog (the secondary namespace's backlog queues of one
primary namespace) with given state tables. The run that holds the *lease* is the only one allowed to
send; it holds it until ``expires_at`` and extends it while it runs. A lease is the row of the lease
table (``model.Lease``, written by ``storage.lease_table``) with an ``epoch`` that every write increases by
one: a write of epoch n + 1 is a compare-and-set on epoch n (one Delta transaction version per
epoch), so of two runs racing for it exactly one wins, and a run that read a stale row cannot
overwrite a newer one.

Invariants:
- A lease is taken only when it is free: no row, released, expired, or already this run's.
- A holder sends only while its lease is good for at least a safety margin more, so a lease that is
  about to expire is extended (or found lost) before anything else is sent. Nobody else can take a
  lease before it expires, so a holder that checks this never sends at the same time as another run.
- The lease of a crashed holder simply expires; nothing has to clean it up. A holder proven gone
  (it ran in this machine's boot and pid namespace, and no process with its pid and start time
  exists) is taken over at once, so a job restarted after a crash does not wait for its own old
  lease. A host name and a pid are no proof: containers share host names and pids are reused.
- Sends happen in rounds that end before the lease's expiry less the margin, and the lease is
  extended (or found lost) between rounds, so a run whose lease could not be extended stops
  sending before another run could take it over.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from backlog_syphon import errors
from backlog_syphon.model import Lease

# A holder extends its lease once a third of it is used, and stops sending when less than a quarter
# is left and it could not extend it: a few missed extensions are survived, a lost lease is noticed.
RENEW_AFTER_FRACTION = 1 / 3
SAFETY_MARGIN_FRACTION = 1 / 4


# The heartbeat looks every ``HEARTBEAT_FRACTION`` of a lease, so it extends a lease at most that long after
# it is due; a send round extends it itself only once the heartbeat is that late (``renewal_overdue``).
HEARTBEAT_FRACTION = RENEW_AFTER_FRACTION / 2


def renewal_due(lease: Lease, now: dt.datetime, lease_seconds: float) -> bool:
    """Time to extend a lease this run holds (the heartbeat's job)."""
    return now >= lease.renewed_at + dt.timedelta(seconds=lease_seconds * RENEW_AFTER_FRACTION)


def renewal_overdue(lease: Lease, now: dt.datetime, lease_seconds: float) -> bool:
    """The heartbeat should have extended the lease by now: a send round extends it before it starts. Until then
    a round starts at once, under the deadline the lease gives (``send_deadline``), and no commit of the lease
    waits in front of it (one commit is a second or more on cloud storage)."""
    return now >= lease.renewed_at + dt.timedelta(seconds=lease_seconds * (RENEW_AFTER_FRACTION + HEARTBEAT_FRACTION))


def may_send(lease: Lease | None, now: dt.datetime, lease_seconds: float) -> bool:
    """Whether a holder may still send under ``lease`` (good for more than the safety margin)."""
    if lease is None:
        return False
    return now < send_deadline(lease, lease_seconds)


def new_lease(lease_key: str, run_id: str, host: str, pid: int, now: dt.datetime, lease_seconds: float,
              previous: Lease | None = None, process_identity: str | None = None) -> Lease:
    """The row a run writes over ``previous`` (the row it read, if any) to take a lease or extend one it
    holds (keeping when it took it)."""
    acquired_at = previous.acquired_at if previous is not None and previous.run_id == run_id else now
    epoch = previous.epoch + 1 if previous is not None else 1
    return Lease(lease_key, epoch, run_id, host, pid, acquired_at, now, now + dt.timedelta(seconds=lease_seconds),
                 process_identity)


def send_deadline(lease: Lease, lease_seconds: float) -> dt.datetime:
    """Until when a holder may send under ``lease``: its expiry less the safety margin."""
    return lease.expires_at - dt.timedelta(seconds=lease_seconds * SAFETY_MARGIN_FRACTION)


def released(lease: Lease, now: dt.datetime) -> Lease:
    """The row a run writes over ``lease`` when it stops: expired at once, so the next run need not wait."""
    return dataclasses.replace(lease, epoch=lease.epoch + 1, renewed_at=now, expires_at=now)


class LeaseHeldError(errors.LeaseHeldError):
    """Another run holds the lease: this run must not send (it exits, or waits if so configured)."""

    def __init__(self, lease: Lease, now: dt.datetime, *, lease_table: str):
        self.lease = lease
        remaining = max(0, int((lease.expires_at - now).total_seconds()))
        super().__init__(
            f"another run is delivering from this backlog: {lease.holder} holds the lease in {lease_table} "
            f"until {lease.expires_at:%Y-%m-%d %H:%M:%S} UTC ({remaining} s from now, extended while it runs). "
            f"Wait for it to finish, or set run.wait_for_lease=true to wait for it; if that run crashed, its "
            f"lease expires by itself at that time")


class LeaseTableMismatchError(errors.SettingsError):
    """The state tables configured belong to another backlog: a setting to fix."""


LeaseLostError = errors.LeaseLostError
