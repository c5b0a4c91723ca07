"""The probe searches (``probing``) against fake logs of plain values: dense ones, ones with gaps, empty ones,
ones that answer "nothing" while messages exist, and ones that grow during a search."""

import bisect

import pytest

from backlog_syphon.errors import BacklogQueueMissingError
from backlog_syphon.probing import (
    GALLOP_FIRST_STEP,
    ProbeCount,
    probe_once,
    probe_one_at_a_time,
    run_search,
    run_searches,
    search_end_between,
    search_tail,
    search_tail_from,
    tail_end,
)


class Log:
    """A queue's sequence numbers (a ``range`` for a dense one) and its probe: the first message at or after
    x, as (sequence number, enqueue time). ``empties``: the probes (numbered from 0) answered "nothing"
    although a message is there; ``arrivals``: after probe n, messages up to this sequence number are
    appended ({n: last}). ``calls`` lists what was asked."""

    def __init__(self, present, *, empties=(), arrivals=None):
        self.present = present if isinstance(present, range) else sorted(present)
        self.empties, self.arrivals = set(empties), dict(arrivals or {})
        self.calls = []

    @property
    def end(self) -> int:
        return self.present[-1] + 1 if len(self.present) else 0

    def probe(self, x):
        number = len(self.calls)
        self.calls.append(x)
        index = bisect.bisect_left(self.present, x)
        found = None if index == len(self.present) or number in self.empties else self.present[index]
        if number in self.arrivals:
            self.present = range(self.present[0], self.arrivals[number] + 1)
        return None if found is None else (found, 1_000 + found)


def probes_bound(span: int) -> int:
    """Gallop and halve: about log8(span) + log2(span) probes, and a few at the ends; a span within the first
    gallop step costs the halving of that step."""
    bits = max(span, GALLOP_FIRST_STEP).bit_length()
    return bits // 3 + bits + 4


@pytest.mark.parametrize("size", [1, 2, 63, 64, 65, 1_000, 123_457, 1_000_000, 1 << 40])
def test_a_dense_log_ends_after_its_last_message_in_about_log8_plus_log2_probes(size):
    log = Log(range(1, size + 1))
    assert run_search(search_tail((1, 1_001)), log.probe) == size + 1
    assert len(log.calls) <= probes_bound(size), len(log.calls)


@pytest.mark.parametrize("known", [3, 4, 10, 59, 901, 7_000])
def test_a_log_with_gaps_ends_after_its_last_message_from_any_message_in_it(known):
    log = Log({3, 4, 900, 901, 7_000, 123_456} | set(range(10, 60)))
    assert run_search(search_tail((known, None), confirm=True), log.probe) == 123_457
    assert len(log.calls) <= probes_bound(123_456) + 1


def test_gaps_wider_than_every_gallop_step_end_where_the_last_message_is():
    log = Log([1, 65, 65 + 512, 1 << 30])  # each at exactly the gallop's next step, then a far one
    assert run_search(search_tail((1, None)), log.probe) == (1 << 30) + 1
    assert log.calls[:3] == [65, 65 + 512, 65 + 512 + 4_096]


def test_an_empty_log_ends_where_the_search_starts_in_one_probe():
    for start in (0, 1, 5_000):
        log = Log([])
        assert run_search(search_tail_from(start, confirm=True), log.probe) == start
        assert log.calls == [start]  # the head probe that follows confirms it (window planner), not this search
    assert tail_end(7, Log(range(1, 7)).probe) == 7  # nothing new since the last end


@pytest.mark.parametrize("messages", [[1], list(range(1, 5_000)), [7, 70, 700, 7_000, 70_000]])
def test_tail_end_covers_everything(messages):
    assert tail_end(0, Log(messages).probe) == max(messages) + 1


def test_a_tail_near_its_last_end_costs_few_probes():
    log = Log(range(1, 1_006))
    assert tail_end(1_000, log.probe) == 1_006 and len(log.calls) <= 1 + 1 + 6  # from 1000: gallop 64, halve 64
    log = Log(range(1, 1_001))
    assert tail_end(1_001, log.probe) == 1_001 and len(log.calls) == 1  # nothing new


def test_halving_between_a_message_and_nothing_costs_log2_of_the_gap():
    log = Log(range(1, 301))
    assert run_search(search_end_between(1, 1_025), log.probe) == 301
    assert len(log.calls) == 10  # 1024 halved down to 1


def test_a_confirming_tail_search_finds_the_true_end_whichever_one_probe_answered_empty():
    log = Log(range(1, 3_001))
    true_end = run_search(search_tail((1, 1_001), confirm=True), log.probe)
    assert true_end == 3_001
    for wrong in range(len(log.calls)):
        flaky = Log(range(1, 3_001), empties={wrong})
        assert run_search(search_tail((1, 1_001), confirm=True), flaky.probe) == true_end, wrong


def test_a_tail_search_that_confirms_finds_the_end_a_false_empty_answer_hid_for_one_probe_more():
    def run(confirm, empties=()):
        log = Log(range(1, 3_001), empties=empties)
        return run_search(search_tail((1, 1_001), confirm=confirm), log.probe), len(log.calls)

    assert run(False, {1})[0] < 3_001  # unconfirmed, a "nothing" that hid messages ends it too early
    true_end, true_probes = run(True)
    assert true_end == 3_001
    end, probes = run(True, {1})
    assert end == 3_001 and probes > true_probes  # the second look found a message, the search went on
    assert run(False)[1] == true_probes - 2  # two looks at the end: the halving's last answer found a message


def test_a_confirming_tail_search_looks_once_where_the_halving_ended_on_nothing_at_the_end():
    confirmed, plain = Log(range(1, 1_066)), Log(range(1, 1_066))
    assert run_search(search_tail((1, 1_001), confirm=True), confirmed.probe) == 1_066
    assert run_search(search_tail((1, 1_001)), plain.probe) == 1_066
    assert len(confirmed.calls) == len(plain.calls) + 1 and confirmed.calls[-2:] == [1_066, 1_066]


def test_a_confirming_tail_search_keeps_its_gallop_when_wrong_empty_answers_are_frequent():
    log = Log(range(1, 1_000_001), empties=set(range(1, 200, 7)))  # every seventh answer wrongly empty
    assert run_search(search_tail((1, 1_001), confirm=True), log.probe) == 1_000_001
    assert len(log.calls) < 100, len(log.calls)  # 82; galloping from the first step again took 176


def test_a_confirming_tail_search_finds_the_true_end_when_every_fifth_answer_is_wrongly_empty():
    for offset in range(5):  # whichever answers the wrong ones are
        log = Log(range(1, 1_000_001), empties=set(range(offset, 400, 5)))
        assert run_search(search_tail((1, 1_001), confirm=True), log.probe) == 1_000_001, offset
        assert log.calls[-1] == log.calls[-2] == 1_000_001  # two answers in a row at the end


def test_a_log_that_grows_during_the_search_ends_between_its_end_before_and_after():
    log = Log(range(1, 501), arrivals={0: 800, 3: 5_000})
    end = run_search(search_tail((1, None), confirm=True), log.probe)
    assert 501 <= end <= log.end == 5_001
    assert log.calls[-1] == end  # the end is the one a probe found nothing at or after


def test_searches_of_several_queues_run_in_rounds_together_and_a_missing_queue_answers_its_error():
    logs = {"dense": Log(range(1, 10_001)), "empty": Log([]), "near": Log(range(1, 70))}

    def missing(_):
        raise BacklogQueueMissingError("no such queue")

    probes = {**{queue: log.probe for queue, log in logs.items()}, "gone": missing}
    count, seen = ProbeCount(), {}
    found = run_searches({"dense": search_tail_from(1), "empty": search_tail_from(0), "near": search_tail((1, None)),
                          "gone": probe_once(1)}, probe_one_at_a_time(probes.__getitem__), count, seen)
    assert {queue: found[queue] for queue in logs} == {"dense": 10_001, "empty": 0, "near": 70}
    assert isinstance(found["gone"], BacklogQueueMissingError)
    assert count.probes == sum(len(log.calls) for log in logs.values()) + 1
    assert count.rounds == max(len(log.calls) for log in logs.values())  # a round costs one round trip
    assert seen["dense"][0] == (1, 1_001) and "empty" not in seen and "gone" not in seen
    with pytest.raises(BacklogQueueMissingError):
        run_search(search_tail_from(0), missing)  # one search alone raises it
