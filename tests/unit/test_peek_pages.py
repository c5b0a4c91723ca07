"""Reading a range with peeks that come back short or empty (``peek_pages``): a short page is read
on, an empty one looked at twice, against fake queues that answer short and empty pages, fixed and seeded."""

import bisect
import random

import pytest

from backlog_syphon.peek_pages import LANE_LOOKS, PagedRead


class FlakyQueue:
    """Stored sequence numbers that a peek answers with at most ``cap`` messages (fewer at will: ``short``),
    or with nothing (``empty``) for the asks numbered in ``empties`` (0 = the first ask)."""

    def __init__(self, sequence_numbers, *, cap=250, short=None, empties=(), rng=None, empty_rate=0.0):
        self.present = sorted(sequence_numbers)
        self.cap, self.short, self.empties, self.rng, self.empty_rate = cap, short, set(empties), rng, empty_rate
        self.asks: list[tuple[int, int]] = []
        self._last_empty = False

    def peek(self, first, count):
        number = len(self.asks)
        self.asks.append((first, count))
        # Seeded: an empty answer comes alone (a transient fault: the next request is answered truly).
        empty = number in self.empties or (self.rng is not None and not self._last_empty
                                           and self.rng.random() < self.empty_rate)
        self._last_empty = empty
        if empty:
            return []
        at = bisect.bisect_left(self.present, first)
        size = min(count, self.cap)
        if self.short is not None:
            size = min(size, self.short(size))
        return self.present[at:at + size]


def read_all(queue: FlakyQueue, first: int, last: int, page_size: int = 250) -> list[int]:
    read, taken = PagedRead(first, last, page_size), []
    while (ask := read.next_ask()) is not None:
        page = queue.peek(*ask)
        taken += page[:read.on_page(page)]
    return taken


def test_a_full_read_to_a_known_end_costs_no_look_more():
    queue = FlakyQueue(range(1, 1001))
    assert read_all(queue, 1, 500) == list(range(1, 501))
    assert queue.asks == [(1, 250), (251, 250)]  # the end is the range's: no empty page, no second look


def test_a_short_page_is_read_on_from_after_its_last_message():
    queue = FlakyQueue(range(1, 1001), short=lambda size: 1)  # one message an answer, however many asked
    assert read_all(queue, 1, 10) == list(range(1, 11))
    assert [first for first, _ in queue.asks] == list(range(1, 11))


def test_an_empty_page_before_the_end_is_looked_at_again_and_what_the_second_look_finds_is_read():
    queue = FlakyQueue(range(1, 601), empties={1})
    assert read_all(queue, 1, 600) == list(range(1, 601))
    assert queue.asks[:4] == [(1, 250), (251, 250), (251, 1), (252, 250)]  # second look, then on from it


def test_two_empty_answers_in_a_row_are_the_end_and_the_end_of_a_queue_costs_one_look_more():
    queue = FlakyQueue(range(1, 11))
    assert read_all(queue, 1, 1 << 62) == list(range(1, 11))
    assert queue.asks == [(1, 250), (11, 250), (11, 1)]
    assert read_all(FlakyQueue([]), 1, 1 << 62) == []


def test_nothing_past_the_range_is_taken_and_a_page_past_it_ends_the_read():
    queue = FlakyQueue([1, 2, 3, 50, 51])
    assert read_all(queue, 1, 49) == [1, 2, 3]
    assert queue.asks == [(1, 49)]  # 50 came in that page: past the range, read over


@pytest.mark.parametrize("seed", range(40))
def test_seeded_short_and_empty_pages_never_skip_nor_repeat_a_message(seed):
    rng = random.Random(seed)
    present = sorted(rng.sample(range(1, 5_000), rng.randrange(0, 1_500)))
    first, last = rng.randrange(0, 2_000), rng.choice([rng.randrange(2_000, 5_000), 1 << 62])
    queue = FlakyQueue(present, cap=rng.choice([250, 37, 5]), rng=rng, empty_rate=0.3,
                       short=lambda size: rng.randint(1, size))
    assert read_all(queue, first, last) == [seq for seq in present if first <= seq <= last]
    # every answer that took nothing was an empty first look, its second look, or the read's end
    assert len(queue.asks) <= 2 * (len(present) + 2)


class PartitionedLane:
    """One partition's numbers, and a peek that answers from a later partition at the asks numbered in
    ``elsewhere`` (0 = the first ask), as a partitioned entity may: "the oldest message in one of the partitions"."""

    def __init__(self, partition: int, count: int, elsewhere=(), later=(9 << 48 | 1,)):
        self.present = [partition << 48 | n for n in range(1, count + 1)]
        self.elsewhere, self.later = set(elsewhere), list(later)
        self.asks: list[tuple[int, int]] = []

    def peek(self, first, count):
        number = len(self.asks)
        self.asks.append((first, count))
        if number in self.elsewhere:
            return self.later[:count]
        at = bisect.bisect_left(self.present, first)
        return self.present[at:at + count] or self.later[:count]  # nothing left here: the next one answers


def read_lane(lane: PartitionedLane, first: int, last: int, page_size: int = 250) -> list[int]:
    read, taken = PagedRead(first, last, page_size, lane=True), []
    while (ask := read.next_ask()) is not None:
        page = lane.peek(*ask)
        taken += page[:read.on_page(page)]
    return taken


def test_in_a_lane_an_answer_from_another_partition_is_a_miss_looked_at_again_not_the_end():
    lane = PartitionedLane(3, 600, elsewhere={1, 2})  # the second and third answers come from partition 9
    last = 3 << 48 | (1 << 40)
    assert read_lane(lane, 3 << 48 | 1, last) == lane.present
    assert lane.asks[1:4] == [(3 << 48 | 251, 250), (3 << 48 | 251, 1), (3 << 48 | 251, 1)]
    # LANE_LOOKS answers from elsewhere in a row: nothing more in this lane (the next non-empty partition answers)
    assert lane.asks[-LANE_LOOKS:] == [(3 << 48 | 601, 250)] + [(3 << 48 | 601, 1)] * (LANE_LOOKS - 1)
    assert lane.asks[-LANE_LOOKS - 1][0] < 3 << 48 | 601  # the looks before them took the lane's last page


def test_outside_a_lane_an_answer_past_the_range_still_ends_the_read():
    lane = PartitionedLane(3, 10, elsewhere={0})
    read, taken = PagedRead(3 << 48 | 1, 3 << 48 | 100), []
    while (ask := read.next_ask()) is not None:
        page = lane.peek(*ask)
        taken += page[:read.on_page(page)]
    assert taken == [] and len(lane.asks) == 1  # a plain read takes a page past its range as the end
