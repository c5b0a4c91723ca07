"""Counting a queue for the status command in a few peeks (``servicebus.counts``), against a queue of
stored messages in memory."""

import bisect
import datetime as dt

import pytest

from backlog_syphon.model import BrokerCount
from backlog_syphon.restore.amqp.message import DecodedMessage
from backlog_syphon.servicebus.counts import EXACT_COUNT_LIMIT, UNREADABLE, dead_letter_reason, survey

ENQUEUED = dt.datetime(2026, 11, 27, 12, 0, tzinfo=dt.timezone.utc)


class Queue:
    """Stored messages by sequence number (built when peeked); counts the peeks a survey makes."""

    def __init__(self, sequence_numbers, reason=None):
        self.sequence_numbers = sorted(sequence_numbers)
        self.reason = reason  # a DeadLetterReason, or one per message
        self.peeks = 0

    def peek(self, first, count):
        self.peeks += 1
        at = bisect.bisect_left(self.sequence_numbers, first)
        return [self.stored(index) for index in range(at, min(at + count, len(self.sequence_numbers)))]

    def stored(self, index):
        seq = self.sequence_numbers[index]
        reason = self.reason[index] if isinstance(self.reason, list) else self.reason
        return DecodedMessage(message_annotations={"x-opt-sequence-number": seq,
                                                   "x-opt-enqueued-time": ENQUEUED + dt.timedelta(seconds=seq)},
                              application_properties={} if reason is None else {"DeadLetterReason": reason},
                              body=(b"x",)).encode()


def test_an_empty_queue_counts_zero_in_two_peeks():
    queue = Queue([])
    assert survey(queue.peek, known=None, reasons=False) == BrokerCount(0, True, None, {})
    assert queue.peeks == 2  # the page, and a second look: a peek may come back empty while messages exist


def test_a_small_queue_is_counted_exactly_with_its_oldest_message():
    queue = Queue([5, 6, 9, 40])
    assert survey(queue.peek, known=None, reasons=False) == BrokerCount(
        4, True, ENQUEUED + dt.timedelta(seconds=5), {})
    assert queue.peeks == 3  # the page, and one peek past it (a page may be cut short), looked at twice


@pytest.mark.parametrize("size", [EXACT_COUNT_LIMIT + 1, 5_000, 1_000_000])
def test_a_large_queue_gets_an_upper_bound_from_its_first_and_last_sequence_numbers(size):
    queue = Queue(range(1_000, 1_000 + size))
    found = survey(queue.peek, known=None, reasons=False)
    assert (found.messages, found.exact) == (size, False)
    # the shared tail search from past the page (gallop, then halving): about log8 + log2 of size single peeks
    assert queue.peeks <= 3 + (size // EXACT_COUNT_LIMIT).bit_length() + (2 * size).bit_length(), queue.peeks


def test_the_administration_apis_count_is_taken_and_one_peek_gives_the_age():
    queue = Queue(range(1, 500))
    assert survey(queue.peek, known=499, reasons=False) == BrokerCount(
        499, True, ENQUEUED + dt.timedelta(seconds=1), {})
    assert queue.peeks == 1


def test_a_dead_letter_queues_reasons_are_tallied_from_its_first_page():
    queue = Queue([1, 2, 3], reason=["missing_path", "MaxDeliveryCountExceeded", "missing_path"])
    assert survey(queue.peek, known=None, reasons=True).reasons == {"missing_path": 2, "MaxDeliveryCountExceeded": 1}
    big = Queue(range(1, 300), reason="TTLExpiredException")
    found = survey(big.peek, known=None, reasons=True)
    assert found.reasons == {"TTLExpiredException": EXACT_COUNT_LIMIT} and not found.reasons_complete
    assert dead_letter_reason(b"\x00not amqp") == UNREADABLE


class ShortQueue(Queue):
    """A ``Queue`` whose peeks answer at most ``page`` messages, and "nothing" at every third peek although
    messages are there, but never twice at one position (the one second look the design assumes)."""

    def __init__(self, sequence_numbers, page):
        super().__init__(sequence_numbers)
        self.page, self.missed = page, set()

    def peek(self, first, count):
        found = super().peek(first, min(count, self.page))
        if found and self.peeks % 3 == 2 and first not in self.missed:
            self.missed.add(first)
            return []
        return found


@pytest.mark.parametrize("size, exact", [(40, True), (EXACT_COUNT_LIMIT, True), (5_000, False)])
def test_short_and_empty_peeks_are_read_on_and_never_count_as_the_end(size, exact):
    queue = ShortQueue(range(10, 10 + size), page=7)
    found = survey(queue.peek, known=None, reasons=False)
    assert (found.messages, found.exact, found.oldest_enqueued) == (size, exact, ENQUEUED + dt.timedelta(seconds=10))
