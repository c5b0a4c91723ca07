"""A namespace's credits with plain numbers for time: the shares of a budget, a process's pacer (its bucket,
AIMD on busy answers, the outage bound), ``throttling.paced`` against fake operations, what a run spent
and how it is shown, the dry run's estimate, and the sends' cap from the primary's budget."""

from __future__ import annotations

import pytest
from azure.core.exceptions import HttpResponseError
from azure.servicebus.exceptions import ServiceBusServerBusyError

from backlog_syphon.config import NamespaceConfig, PrimaryConfig, SinkConfig, SyphonConfig
from backlog_syphon.credits import FLOOR_CREDITS_PER_SECOND, SHARES, CreditPacer, CreditTerms
from backlog_syphon.errors import describe
from backlog_syphon.model import CreditKind, CreditUsage, NamespaceRole, RunRow
from backlog_syphon.run.dry_run_plan import drain_cost
from backlog_syphon.run.status_report import credits_text
from backlog_syphon.servicebus import throttling
from backlog_syphon.sink.pacing import send_cap


def test_the_shares_of_a_budget_sum_to_the_budget_and_none_means_no_budget():
    assert SHARES.driver + SHARES.planner + SHARES.reads == pytest.approx(1.0)
    assert SHARES.of(0, SHARES.driver) is None
    assert SHARES.of(1000, SHARES.driver) == pytest.approx(630)
    assert SHARES.of(900, SHARES.reads, parts=3) == pytest.approx(96)  # a window's read of a batch of three
    assert SHARES.of(900, SHARES.reads, parts=0) == pytest.approx(288)
    # the drain moves at most min(driver / 2, reads) of the budget a second: 95 % of what 3 a message allow
    assert min(SHARES.driver / 2, SHARES.reads) * 3 >= 0.94


def test_the_reads_share_is_divided_among_the_windows_read_at_once_at_most_the_task_slots():
    from backlog_syphon.source.options import SourceOptions

    options = SourceOptions("primary", NamespaceConfig(fully_qualified_namespace="backlog.example:1",
                                                       max_credits_per_second=1000), read_slots=2)
    assert options.windows_at_once(10) == 2 and options.windows_at_once(1) == 1
    assert SourceOptions.from_spark(options.to_spark()).read_slots == 2  # it reaches the executors
    assert options.credit_terms(SHARES.reads, options.windows_at_once(10)).credits_per_second == pytest.approx(160)
    unknown = SourceOptions("primary", options.secondary)  # Spark Connect: every window counts
    assert unknown.windows_at_once(10) == 10 and "readSlots" not in unknown.to_spark()


def test_a_share_paces_operations_whose_cost_is_known_after_them():
    pacer = CreditPacer(CreditTerms(100.0), now=0.0)
    assert pacer.wait(0.0) == 0.0  # the first goes at once
    pacer.spend(CreditKind.PEEK, 250, 0.0)  # a page of 250: the bucket is in debt for it
    assert pacer.wait(0.0) == pytest.approx((250 - 25 + 1) / 100)  # until it holds a credit again
    assert pacer.wait(2.26) == 0.0
    pacer.count(CreditKind.SETTLE, 3)
    assert pacer.spent == {CreditKind.PEEK: 250, CreditKind.SETTLE: 3} and pacer.total == 253


def test_an_operation_reserves_its_page_so_that_threads_going_at_once_wait_for_each_other():
    pacer = CreditPacer(CreditTerms(100.0), now=0.0)
    pacer.reserve(250, 0.0)  # one thread's receive of up to 250 goes
    assert pacer.wait(0.0) > 2.0  # another that looks now waits for it
    pacer.spend(CreditKind.RECEIVE, 10, 0.5, reserved=250)  # it got 10: the rest is given back
    assert pacer.wait(0.5) == 0.0 and pacer.spent == {CreditKind.RECEIVE: 10}
    pacer.reserve(250, 0.5)
    pacer.unreserve(250, 0.5)  # refused: nothing spent, nothing kept
    assert pacer.wait(0.5) == 0.0 and pacer.total == 10


def test_busy_answers_lower_the_rate_wait_longer_each_time_and_give_up_past_the_outage_bound():
    pacer = CreditPacer(CreditTerms(400.0, outage_seconds=30.0, recovery_seconds=10.0), now=0.0)
    # each asked again once its pause has ended
    assert [pacer.throttled(t) for t in (0.0, 1.0, 3.0, 7.0, 15.0)] == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert pacer.controller.rate == pytest.approx(400 * 0.75 ** 5)  # lowered once a hold period, five times
    assert pacer.throttled(16.0) == pytest.approx(7.0)  # another thread refused within the pause: the same retry
    assert not pacer.given_up(30.0) and pacer.given_up(30.1) and pacer.busy_for(20.0) == 20.0
    pacer.spend(CreditKind.RECEIVE, 10, 31.0)  # an answer went through: not busy any more
    assert not pacer.given_up(100.0) and pacer.retry_after(100.0) == 1.0
    for second in range(32, 60):  # it climbs back to its share over the recovery time
        pacer.spend(CreditKind.RECEIVE, 1, float(second))
    assert pacer.controller.rate == pytest.approx(400.0)


def test_the_pauses_the_pacing_makes_count_towards_the_climb_back():
    pacer = CreditPacer(CreditTerms(100.0, recovery_seconds=9.0), now=0.0)
    pacer.throttled(0.0)
    assert pacer.controller.rate == 75.0
    pacer.spend(CreditKind.PEEK, 250, 1.0)  # the hold ends: a page of 250, the next waits for its credits
    pacer.spend(CreditKind.PEEK, 250, 3.5)  # 2.5 s later: 2.5 s of climb (10 a second), not one
    assert pacer.controller.rate == pytest.approx(100.0)


def test_without_a_budget_a_busy_answer_limits_a_process_that_then_climbs_back_and_stops_limiting_itself():
    pacer = CreditPacer(CreditTerms(None, recovery_seconds=5.0), now=0.0)
    for at in range(20):  # spending about 1,000 a second
        pacer.spend(CreditKind.PEEK, 100, at / 10)
    pacer.throttled(2.0)
    assert pacer.controller.rate == pytest.approx(750.0)  # a quarter less than it was spending
    for second in range(4, 30):
        pacer.spend(CreditKind.PEEK, 1, float(second))
    assert pacer.controller.rate is None  # back where it was: no limit any more
    floor = CreditPacer(CreditTerms(None), now=0.0)
    floor.throttled(0.0)
    assert floor.controller.rate == FLOOR_CREDITS_PER_SECOND  # never below: a page of a peek has to go some time


def test_without_a_budget_a_busy_answer_to_a_process_that_spent_little_does_not_hold_it_at_the_floor_for_good():
    # Throttled while it spent next to nothing (the namespace's credits went to others), the process drops to
    # the floor, which is also where it would climb back to: the next operation after the hold ends the limit.
    # (It stayed at the floor for good, and a purge of 3,000 messages took 10 s a page of 100.)
    pacer = CreditPacer(CreditTerms(None), now=0.0)
    pacer.spend(CreditKind.RECEIVE, 5, 0.5)
    pacer.throttled(1.0)
    assert pacer.controller.rate == FLOOR_CREDITS_PER_SECOND
    pacer.spend(CreditKind.RECEIVE, 100, 1.5)  # within the hold: still limited
    assert pacer.controller.rate == FLOOR_CREDITS_PER_SECOND
    pacer.spend(CreditKind.RECEIVE, 100, 3.0)
    assert pacer.controller.rate is None
    assert pacer.wait(3.0) == 0.0


def test_new_terms_keep_what_throttling_taught():
    pacer = CreditPacer(CreditTerms(300.0), now=0.0)
    pacer.throttled(0.0)
    pacer.retune(CreditTerms(100.0), now=1.0)  # a smaller share: the lowered rate never exceeds it
    assert pacer.controller.cap == 100.0 and pacer.controller.rate == 100.0
    pacer.retune(CreditTerms(600.0), now=2.0)
    assert pacer.controller.rate == 100.0  # a larger share is climbed to, not jumped to, after a busy answer
    fresh = CreditPacer(CreditTerms(300.0), now=0.0)
    fresh.retune(CreditTerms(None), now=1.0)
    assert fresh.controller.rate is None and fresh.bucket.rate is None


class Clock:
    def __init__(self):
        self.now, self.slept = 0.0, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 3))
        self.now += seconds


def busy_then(answers: list):
    """An operation that raises each exception of ``answers`` in turn, then returns the first other value."""
    def operation():
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer
    return operation


NAMESPACE = NamespaceConfig(fully_qualified_namespace="backlog.example:1")


@pytest.fixture(autouse=True)
def fresh_pacers(monkeypatch):
    monkeypatch.setattr(throttling, "_PACERS", {})


def test_busy_answers_are_waited_out_and_the_operation_spends_its_credits():
    clock = Clock()
    throttling.pace(NAMESPACE, CreditTerms(None, outage_seconds=60.0), clock=clock)
    page = throttling.paced(NAMESPACE, CreditKind.PEEK, busy_then([ServiceBusServerBusyError(message="busy")] * 3
                                                                 + [["m1", "m2"]]),
                            cost=len, clock=clock, sleep=clock.sleep)
    assert page == ["m1", "m2"] and clock.slept == [1.0, 2.0, 4.0]
    assert throttling.spent(NAMESPACE) == {CreditKind.PEEK: 2}


def test_an_administration_reads_503_is_a_busy_answer_and_without_retry_it_is_raised():
    clock = Clock()
    refused = HttpResponseError(message="throttled")
    refused.status_code = 503
    with pytest.raises(HttpResponseError):
        throttling.paced(NAMESPACE, CreditKind.ADMINISTRATION, busy_then([refused]), retry=False, clock=clock,
                         sleep=clock.sleep)
    assert throttling.pacer_of(NAMESPACE).throttled_count == 1 and clock.slept == []
    other = ValueError("not a busy answer")
    with pytest.raises(ValueError):
        throttling.paced(NAMESPACE, CreditKind.PEEK, busy_then([other]), clock=clock, sleep=clock.sleep)


def test_a_namespace_busy_past_the_outage_bound_ends_with_one_line_naming_it_its_credits_and_what_to_change():
    clock = Clock()
    throttling.pace(NAMESPACE, CreditTerms(None, outage_seconds=10.0), clock=clock)
    throttling.paced(NAMESPACE, CreditKind.PEEK, busy_then([["m"] * 40]), cost=len, clock=clock, sleep=clock.sleep)
    with pytest.raises(throttling.NamespaceThrottledError) as error:
        throttling.paced(NAMESPACE, CreditKind.PEEK, busy_then([ServiceBusServerBusyError(message="busy")] * 99),
                         clock=clock, sleep=clock.sleep)
    line = str(error.value)
    assert line.startswith("the secondary namespace backlog.example:1 answered every request busy")
    assert "longer than sink.outage_wait_seconds (10 s); this process spent 40 credits there" in line
    assert "Set secondary.max_credits_per_second (not set)" in line and "move it to Premium" in line
    assert "\n" not in line
    # a Spark task's error arrives as text: its last line is the cause the run ends with
    crossed = RuntimeError(f"An exception was thrown from the Python worker:\nTraceback ...\n"
                           f"backlog_syphon.servicebus.throttling.NamespaceThrottledError: {line}")
    assert describe(crossed) == line
    primary = PrimaryConfig(fully_qualified_namespace="primary.example", max_credits_per_second=200, namespace="p")
    assert throttling.role_of(primary) is NamespaceRole.PRIMARY
    assert "Set primary.max_credits_per_second (now 200)" in throttling.throttled_line(
        primary, throttling.pacer_of(primary), 700.0)


def test_a_runs_credits_per_namespace_and_kind_and_per_moved_message():
    usage = CreditUsage({"peek": 3_050, "receive": 3_000, "settle": 3_000}, {"send": 3_000}, 3_000)
    assert usage.total(NamespaceRole.SECONDARY) == 9_050 and usage.per_moved(NamespaceRole.PRIMARY) == 1.0
    assert usage.line() == ("credits spent: secondary 9,050 (3.02 a moved message; peek 3,050, receive 3,000, "
                            "settle 3,000); primary 3,000 (1.00 a moved message; send 3,000)")
    assert usage.by_kind == {"secondary.peek": 3_050, "secondary.receive": 3_000, "secondary.settle": 3_000,
                             "primary.send": 3_000}
    assert CreditUsage({}, {}, 0).line() == "credits spent: secondary 0; primary 0"


def test_the_status_shows_each_runs_credits_per_message_and_nothing_for_older_runs():
    import datetime as dt

    at = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    run = RunRow("r", "backlog", "available_now", None, None, at, at, 0, "drained", 100, 0, 0, 0, 0, {}, 0, 1, None,
                 secondary_credits=320, primary_credits=100)
    assert credits_text(run, 100) == "  credits 320+100 (3.2+1.0 a message)"
    older = RunRow("r", "backlog", "available_now", None, None, at, at, 0, "drained", 100, 0, 0, 0, 0, {}, 0, 1, None)
    assert credits_text(older, 100) == ""


def test_the_dry_run_estimates_what_the_drain_costs_each_namespace():
    rows = [{"destination": "orders", "messages": 600, "to_deliver": 590, "to_dead_letter": 10, "to_skip": 0},
            {"destination": "Events", "messages": 400, "to_deliver": 400, "to_dead_letter": 0, "to_skip": 0}]
    cost = drain_cost(rows, topics={"events"}, lanes=10, max_messages_per_trigger=500, secondary_budget=0,
                      primary_budget=0)
    assert (cost.secondary, cost.primary, cost.to_topics, cost.probes) == (1_000 + 2_000 + 240, 990, 400, 240)
    lines = cost.lines()
    assert lines[0].startswith("  credits the drain will cost, about: secondary 3,240 (a peek, a receive and a "
                               "settlement per message, and 240 probes), primary 990 (a send per message; 400 of "
                               "them to topics, one credit more per filter each)")
    assert lines[1].startswith("  with all of a Standard namespace's 1,000 a second: at least 3 s")
    budgeted = drain_cost(rows, topics=set(), lanes=10, max_messages_per_trigger=500, secondary_budget=300,
                          primary_budget=0)
    assert budgeted.lines()[1].startswith("  at secondary.max_credits_per_second=300: at least 11 s")


def test_the_sends_cap_is_the_lower_of_the_message_cap_and_the_primarys_budget():
    def config(messages: float, credits: float) -> SyphonConfig:
        return SyphonConfig(primary=PrimaryConfig(max_credits_per_second=credits), secondary=NamespaceConfig(),
                            sink=SinkConfig(max_messages_per_second=messages))

    assert send_cap(config(0, 0)) == 0 and send_cap(config(200, 0)) == 200
    assert send_cap(config(0, 300)) == 300 and send_cap(config(500, 300)) == 300


def test_the_decommissions_listing_and_deletes_wait_out_busy_answers_and_spend_ten_credits_a_request(monkeypatch):
    import contextlib
    import functools
    from types import SimpleNamespace

    from backlog_syphon.servicebus import removal

    clock = Clock()
    throttling.pace(NAMESPACE, CreditTerms(None, outage_seconds=60.0), clock=clock)
    monkeypatch.setattr(removal, "paced", functools.partial(throttling.paced, clock=clock, sleep=clock.sleep))
    busy = HttpResponseError(message="throttled")
    busy.status_code = 503
    answers = [busy, [SimpleNamespace(name="p/x-servicebus-transfer/0"), SimpleNamespace(name="other")], busy, None]
    deleted = []

    @contextlib.contextmanager
    def admin(namespace):
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        yield SimpleNamespace(list_queues=lambda: answer, delete_queue=deleted.append)

    monkeypatch.setattr(removal, "administration_client", admin)
    assert removal.require_manage(NAMESPACE, "p") == ["p/x-servicebus-transfer/0"]
    assert removal.delete_queue(NAMESPACE, "p/x-servicebus-transfer/0") is True
    # each busy answer waited out (1 s), and the pacer's own wait between (its rate lowered, the listing's ten paid)
    assert deleted == ["p/x-servicebus-transfer/0"] and clock.slept.count(1.0) == 2
    assert throttling.spent(NAMESPACE) == {CreditKind.ADMINISTRATION: 20}
