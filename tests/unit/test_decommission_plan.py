"""Which backlog queues ``--decommission`` may remove and what holds the others (``run.decommission_plan``),
and how ``--status`` says it (``run.status_report``): plain values, no broker, no tables."""

import datetime as dt

from backlog_syphon.model import BrokerCount, DrainHold
from backlog_syphon.run.decommission_plan import DecommissionReport, QueueState, removal_exit_code, removal_line, \
    removal_plan
from backlog_syphon.run.lease import new_lease
from backlog_syphon.run.status_report import QueueStatus, StatusReport

NOW = dt.datetime(2026, 12, 7, 12, 0, tzinfo=dt.timezone.utc)
Q0, Q1, Q2, Q3 = (f"contoso/x-servicebus-transfer/{index}" for index in range(4))


def state(queue, messages=0, *, unsettled=0, dead=0, exported=None, exact=True, exists=True):
    return QueueState(queue, messages, exact, exists, unsettled, dead, True, exported)


def test_a_queue_is_removable_only_empty_settled_and_without_unacknowledged_dead_letters():
    plan = removal_plan([state(Q0), state(Q1, 4, exact=False), state(Q2, unsettled=3), state(Q3, dead=2),
                         state("contoso/x-servicebus-transfer/4", dead=2, exported=2),
                         state("contoso/x-servicebus-transfer/5", dead=3, exported=2),
                         state("contoso/x-servicebus-transfer/6", exists=False)])
    assert [(r.removable, [h.kind for h in r.holds]) for r in plan] == [
        (True, []), (False, [DrainHold.MESSAGES]), (False, [DrainHold.UNSETTLED]), (False, [DrainHold.DEAD_LETTERS]),
        (True, []), (False, [DrainHold.DEAD_LETTERS]), (False, [])]
    assert plan[0].reason() == "drained: no message, nothing recorded unsettled, no dead-letters"
    assert plan[1].reason() == "held by at most 4 message(s) in the queue"
    assert plan[2].reason() == "held by 3 recorded message(s) not yet settled (the next run settles them)"
    assert plan[3].reason() == ("held by 2 dead-letter(s) not exported (export them, then name the count in "
                                "backlog.exported_dead_letters)")
    assert plan[4].reason() == ("drained: no message, nothing recorded unsettled, its 2 dead-letter(s) exported and "
                                "acknowledged")
    assert "where 2 were acknowledged as exported" in plan[5].reason()  # a third came since: export again
    assert plan[6].reason() == "already removed"


def test_the_exit_code_says_what_holds_the_backlog():
    assert removal_exit_code(removal_plan([state(Q0), state(Q1, exists=False)])) == 0
    assert removal_exit_code(removal_plan([state(Q0, dead=1)])) == 5
    assert removal_exit_code(removal_plan([state(Q0, dead=1), state(Q1, unsettled=1)])) == 4


def test_the_status_line_names_the_held_queues_or_says_it_is_safe():
    assert removal_line(removal_plan([state(Q0), state(Q1)])) == (
        "safe to remove: all 2 backlog queue(s) drained (backlog-syphon --decommission shows what it would remove)")
    held = removal_line(removal_plan([state(q, 1) for q in (Q0, Q1, Q2, Q3)]))
    assert held.startswith(f"not safe to remove yet: 4 of 4 backlog queue(s) held: {Q0} (1 message(s) in the queue)")
    assert held.endswith("; and 1 more")
    assert removal_line(removal_plan([state(Q0, exists=False)])) == "nothing to remove: no backlog queue exists"
    assert removal_line(removal_plan([state(Q0)]), "run r1 on host") == "not safe to remove: run r1 on host holds the lease"


def test_the_dry_run_and_the_confirmed_report_list_every_queue():
    plan = removal_plan([state(Q0), state(Q1, unsettled=2), state(Q2, exists=False)])
    dry = DecommissionReport(NOW, plan, confirmed=False)
    assert dry.lines() == [
        "decommission dry run (nothing was removed) at 2026-12-07 12:00:00 UTC",
        f"  would remove {Q0}: drained: no message, nothing recorded unsettled, no dead-letters",
        f"  refused      {Q1}: held by 2 recorded message(s) not yet settled (the next run settles them)",
        f"  gone         {Q2}: already removed",
        f"dry run: would remove 1 backlog queue(s), refused 1 not drained ({Q1}); --confirm removes them"]
    assert dry.exit_code == 4
    done = DecommissionReport(NOW, plan, confirmed=True, removed=(Q0,))
    assert done.lines()[1].startswith(f"  removed      {Q0}: drained")
    assert done.closing_line == f"removed 1 backlog queue(s), refused 1 not drained ({Q1})"
    assert done.remaining == {Q1: 0}
    assert DecommissionReport(NOW, plan, confirmed=False, lease_holder="run r1").exit_code == 3


def test_the_status_report_shows_unsettled_records_apart_from_messages_to_deliver_and_the_removal_verdict():
    def count(messages=0):
        return BrokerCount(messages, True, None, {"missing_path": messages} if messages else {})

    report = StatusReport(
        at=NOW, backlog=(QueueStatus(Q0, count()), QueueStatus(Q1, count(2))),
        dead_letters=(QueueStatus(f"{Q0}/$DeadLetterQueue", count(1)), QueueStatus(f"{Q1}/$DeadLetterQueue", count())),
        lease=None, runs=(), held={}, counted_by="peeks", runs_table="/data/runs", unsettled={Q0: 3},
        exported={Q0: 1})
    lines = report.lines()
    assert "  still to deliver: 2 message(s) in the backlog queues" in lines
    assert f"  recorded, not yet settled: 3 message(s) ({Q0} 3): the next run settles them" in lines
    assert lines[-2] == (f"  removal: not safe to remove yet: 2 of 2 backlog queue(s) held: {Q0} (3 recorded "
                         f"message(s) not yet settled (the next run settles them)); {Q1} (2 message(s) in the queue)")
    assert report.as_dict()["unsettled"] == {Q0: 3}
    assert [q["holds"] for q in report.as_dict()["removal"]["queues"]] == [{"recorded_unsettled": 3}, {"messages": 2}]
    lease = new_lease("key", "r9", "host", 1, NOW, 60)
    held = StatusReport(at=NOW, backlog=(QueueStatus(Q0, count()),), dead_letters=(), lease=lease, runs=(), held={},
                        counted_by="peeks", runs_table="/data/runs")
    assert held.lines()[-2] == f"  removal: not safe to remove: {lease.holder} holds the lease"
    assert "  recorded, not yet settled: 0 message(s)" in held.lines()
