"""The fence's decisions on plain values: who may take, keep and send under a lease."""

import datetime as dt

from backlog_syphon.run.lease import (
    Lease,
    LeaseHeldError,
    may_send,
    new_lease,
    released,
    renewal_due,
    renewal_overdue,
)

T0 = dt.datetime(2026, 11, 26, 8, 0, tzinfo=dt.timezone.utc)
LEASE_SECONDS = 120


def at(seconds):
    return T0 + dt.timedelta(seconds=seconds)


def test_a_lease_is_free_for_its_holder_and_for_anyone_once_expired():
    lease = new_lease("sb-host/contoso", "run-a", "h", 1, T0, LEASE_SECONDS)
    assert lease.expires_at == at(120) and lease.acquired_at == lease.renewed_at == T0 and lease.epoch == 1
    assert lease.is_free_for("run-a", at(10))
    assert not lease.is_free_for("run-b", at(119))
    assert lease.is_free_for("run-b", at(120))
    assert lease.is_free_for("run-b", at(10), holder_gone=True)  # its process is known to be dead
    assert released(lease, at(30)).is_free_for("run-b", at(30))


def test_extending_keeps_when_it_was_taken_and_a_takeover_starts_afresh():
    lease = new_lease("k", "run-a", "h", 1, T0, LEASE_SECONDS)
    extended = new_lease("k", "run-a", "h", 1, at(50), LEASE_SECONDS, previous=lease)
    assert (extended.acquired_at, extended.renewed_at, extended.expires_at) == (T0, at(50), at(170))
    taken = new_lease("k", "run-b", "h", 2, at(200), LEASE_SECONDS, previous=extended)
    assert (extended.epoch, taken.epoch, released(taken, at(210)).epoch) == (2, 3, 4)  # every write: one more
    assert taken.acquired_at == at(200)


def test_renewal_after_a_third_and_no_sending_in_the_last_quarter():
    lease = new_lease("k", "run-a", "h", 1, T0, LEASE_SECONDS)
    assert not renewal_due(lease, at(39), LEASE_SECONDS) and renewal_due(lease, at(40), LEASE_SECONDS)
    # a round extends it itself only once the heartbeat (every 20 s) is late with it
    assert not renewal_overdue(lease, at(59), LEASE_SECONDS) and renewal_overdue(lease, at(60), LEASE_SECONDS)
    assert may_send(lease, at(89), LEASE_SECONDS)
    assert not may_send(lease, at(90), LEASE_SECONDS)  # 30 s (a quarter) before expiry
    assert not may_send(None, T0, LEASE_SECONDS)


def test_the_held_message_names_the_holder_and_the_expiry_and_what_to_do():
    lease = Lease("k", 7, "run-a", "host-1", 42, T0, T0, at(75))
    text = str(LeaseHeldError(lease, at(15), lease_table="/state/checkpoint_lease"))
    assert "run run-a on host-1 (pid 42)" in text and "2026-11-26 08:01:15 UTC" in text
    assert "60 s from now" in text and "run.wait_for_lease=true" in text and "/state/checkpoint_lease" in text
