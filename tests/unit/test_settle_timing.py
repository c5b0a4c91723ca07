"""The purge's timing inside its locks (``purge.settle_timing``): margins, requests and pages that follow
the lock and the measured round trip, never fixed seconds."""

import pytest

from backlog_syphon.purge.settle_timing import SAFETY_SHARE_OF_LOCK, SettleTiming, page_size


def timing(lock=None, receive=None, *requests):
    measured = SettleTiming()
    if receive is not None:
        measured.observed_page(receive, lock)
    for seconds in requests:
        measured.observed_request(seconds)
    return measured


@pytest.mark.parametrize("lock, round_trip, margin", [
    (5.0, 0.3, 0.8),  # the service's shortest lock, the secondary 300 ms away: half a second kept free
    (60.0, 0.05, 6.05),  # the default lock a region away
    (300.0, 0.05, 30.05),  # the longest lock
])
def test_the_margin_is_a_round_trip_and_a_share_of_the_lock(lock, round_trip, margin):
    measured = timing(lock, 0.5, round_trip)
    assert measured.margin() == pytest.approx(margin)
    assert measured.deadline(1_000.0) == pytest.approx(1_000.0 - margin)
    assert SAFETY_SHARE_OF_LOCK == 0.1


def test_before_any_request_the_receive_stands_in_for_a_round_trip_and_the_slowest_recent_one_counts():
    assert SettleTiming().round_trip is None and SettleTiming().requests_per_page() is None
    measured = timing(5.0, 0.45)
    assert measured.round_trip == 0.45  # a receive holds a round trip
    for seconds in (0.3, 0.9, 0.3):
        measured.observed_request(seconds)
    assert measured.round_trip == 0.9  # the estimates err on the long side
    for _ in range(8):
        measured.observed_request(0.3)
    assert measured.round_trip == 0.3  # ... over the last few only
    measured.observed_page(0.5, 4.8)
    assert measured.lock_seconds == 4.8  # the shortest lock seen
    measured.forget()
    assert (measured.round_trip, measured.lock_seconds) == (None, 4.8)  # a fresh start keeps the lock


@pytest.mark.parametrize("lock, receive, round_trip, requests", [
    (4.7, 0.5, 0.3, 12),  # (4.7 - 0.77 - 0.5) / 0.3 = 11.4: the 1st leaves on arrival, 11 more after it
    (4.7, 0.9, 0.6, 5),  # 300 ms each way
    (59.9, 0.1, 0.05, 1076),
    (4.7, 2.5, 1.2, 1),  # room for the first request only
    (4.7, 3.0, 2.0, 0),  # a lock shorter than about two round trips and a receive: nothing fits
])
def test_requests_per_page_are_what_fits_between_a_pages_arrival_and_its_deadline(lock, receive, round_trip,
                                                                                   requests):
    assert timing(lock, receive, round_trip).requests_per_page() == requests


@pytest.mark.parametrize("requests, remaining, dead_letters, reasons, page", [
    (None, 450, 45, 45, 100),  # nothing measured yet: a full page (its deadline still holds)
    (12, 450, 0, 0, 100),  # nothing to dead-letter: one bulk completion
    (12, 450, 45, 1, 100),  # poison of one kind: one completion and one dead-lettering
    (12, 450, 45, 45, 100),  # a reason each, one in ten: about 10 in a page of 100, 11 requests
    (6, 450, 45, 45, 50),  # 300 ms each way: 5 dead-letterings at one in ten
    (6, 100, 50, 50, 10),  # every other one poison with a reason of its own
    (1, 100, 50, 50, 1),  # one request a page: one message
    (0, 100, 0, 0, 0),  # not even that: nothing is received
])
def test_a_page_holds_what_its_requests_can_settle(requests, remaining, dead_letters, reasons, page):
    assert page_size(requests, max_page=100, remaining=remaining, dead_letters=dead_letters, reasons=reasons) == page


def test_messages_passed_over_allow_another_page_only_while_it_and_their_releases_fit_in_their_locks():
    measured = timing(4.7, 0.5, 0.3)  # margin 0.77 s
    assert measured.receive_wait_while_passing(4.0, 2) == pytest.approx(4.0 - 0.77 - 0.6)
    assert measured.receive_wait_while_passing(1.5, 2) is None  # 1.5 - 0.77 - 0.6: no time for a receive
    assert measured.receive_wait_while_passing(-1.0, 1) is None  # their locks are gone already
    long_lock = timing(59.9, 0.1, 0.05)
    assert long_lock.receive_wait_while_passing(50.0, 3) == pytest.approx(50.0 - 6.04 - 0.15)


def test_the_rest_of_a_short_page_is_received_only_while_its_requests_still_leave_before_its_deadline():
    measured = timing(4.7, 0.5, 0.3)  # margin 0.77 s
    assert measured.requests_measured
    # the first request goes when the receive returns, the second a round trip later, before the deadline
    assert measured.receive_wait_for_rest(4.5, 2) == pytest.approx(4.5 - 0.77 - 0.3)
    assert measured.receive_wait_for_rest(4.5, 1) == pytest.approx(4.5 - 0.77)
    assert measured.receive_wait_for_rest(1.3, 2) is None  # 1.3 - 0.77 - 0.3 < a round trip: settle what came
    assert measured.receive_wait_for_rest(-1.0, 1) is None
    unmeasured = SettleTiming()
    assert not unmeasured.requests_measured
    unmeasured.observed_page(2.2, 6.7)  # a first receive that held the link's attach: no request measured yet
    assert not unmeasured.requests_measured and unmeasured.round_trip == 2.2
