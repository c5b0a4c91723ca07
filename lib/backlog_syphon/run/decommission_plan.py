"""Which backlog queues may be removed once a migration is over, and what holds the others; the text and the
exit code of ``--decommission``. Pure: plain values in, plain values out (``run.decommission`` reads and removes).

A backlog queue is drained and safe to remove when
- the broker holds no message in it (none left to deliver, none held on purpose),
- nothing is recorded in the audit table above its purge mark (an outcome recorded whose message is not known
  settled: the next run settles it, or finds it gone and moves the mark), and
- its dead-letter sub-queue is empty, or holds exactly as many messages as an operator exported and acknowledged
  in ``backlog.exported_dead_letters`` (``{backlog queue: messages exported}``): a count that differs means
  messages were dead-lettered, re-driven or removed since the export, so the export no longer describes what the
  queue would take with it.
A queue the broker no longer has is already removed. The legacy client created the queues and never deletes
them (their AutoDeleteOnIdle is "never"): removing them is the namespace owner's last step.

Exit codes, in the status command's family (``errors``): 0 every existing queue drained (or removed), 4 a queue
holds messages or unsettled records, 5 only dead-letters hold queues, 3 a run holds the backlog's lease.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Iterable

from backlog_syphon.errors import EXIT_DEAD_LETTERS, EXIT_LEASE_HELD, EXIT_NOT_DRAINED, EXIT_OK
from backlog_syphon.model import DrainHold

EXPORT_SETTING = "backlog.exported_dead_letters"
QUEUES_NAMED = 3  # a summary line names this many held queues, then counts the rest


@dataclass(frozen=True)
class QueueState:
    """What is known of one backlog queue: the broker's counts and the audit's unsettled records."""

    queue: str
    messages: int  # an upper bound when not ``exact``
    exact: bool
    exists: bool
    unsettled: int  # recorded outcomes above the purge mark (``sink.queue_marks.awaiting_settlement``)
    dead_letters: int
    dead_letters_exact: bool
    exported: int | None = None  # dead-letters acknowledged as exported (backlog.exported_dead_letters)


@dataclass(frozen=True)
class Hold:
    """One reason a queue is not drained, with its count."""

    kind: DrainHold
    count: int
    exact: bool = True
    exported: int | None = None

    def text(self) -> str:
        count = f"{'' if self.exact else 'at most '}{self.count}"
        if self.kind is DrainHold.MESSAGES:
            return f"{count} message(s) in the queue"
        if self.kind is DrainHold.UNSETTLED:
            return f"{count} recorded message(s) not yet settled (the next run settles them)"
        if self.exported is None:
            return f"{count} dead-letter(s) not exported (export them, then name the count in {EXPORT_SETTING})"
        return (f"{count} dead-letter(s) where {self.exported} were acknowledged as exported in {EXPORT_SETTING} "
                f"(something changed since the export: export again)")


@dataclass(frozen=True)
class QueueRemoval:
    """One backlog queue's verdict: removable (no holds), held (why), or already gone."""

    queue: str
    holds: tuple[Hold, ...]
    exists: bool = True
    exported: int | None = None  # dead-letters exported and acknowledged, which go with the queue

    @property
    def removable(self) -> bool:
        return self.exists and not self.holds

    def reason(self) -> str:
        if not self.exists:
            return "already removed"
        if self.holds:
            return "held by " + "; ".join(hold.text() for hold in self.holds)
        gone_with_it = (f"its {self.exported} dead-letter(s) exported and acknowledged" if self.exported
                        else "no dead-letters")
        return f"drained: no message, nothing recorded unsettled, {gone_with_it}"


def removal_plan(states: Iterable[QueueState]) -> tuple[QueueRemoval, ...]:
    """Each queue's verdict, in the order given."""
    plan = []
    for state in states:
        if not state.exists:
            plan.append(QueueRemoval(state.queue, (), exists=False))
            continue
        holds = []
        if state.messages:
            holds.append(Hold(DrainHold.MESSAGES, state.messages, state.exact))
        if state.unsettled:
            holds.append(Hold(DrainHold.UNSETTLED, state.unsettled))
        acknowledged = state.exported is not None and state.dead_letters_exact and state.exported == state.dead_letters
        if state.dead_letters and not acknowledged:
            holds.append(Hold(DrainHold.DEAD_LETTERS, state.dead_letters, state.dead_letters_exact, state.exported))
        plan.append(QueueRemoval(state.queue, tuple(holds),
                                 exported=state.dead_letters if state.dead_letters and acknowledged else None))
    return tuple(plan)


def removal_exit_code(plan: Iterable[QueueRemoval]) -> int:
    """0 nothing holds a queue, 4 messages or unsettled records do, 5 only dead-letters do."""
    kinds = {hold.kind for removal in plan for hold in removal.holds}
    if kinds - {DrainHold.DEAD_LETTERS}:
        return EXIT_NOT_DRAINED
    return EXIT_DEAD_LETTERS if kinds else EXIT_OK


def removal_line(plan: tuple[QueueRemoval, ...], lease_holder: str | None = None) -> str:
    """The status's one line on whether the backlog is safe to remove."""
    existing = [removal for removal in plan if removal.exists]
    if lease_holder is not None:
        return f"not safe to remove: {lease_holder} holds the lease"
    if not existing:
        return "nothing to remove: no backlog queue exists"
    held = [removal for removal in existing if removal.holds]
    if not held:
        return (f"safe to remove: all {len(existing)} backlog queue(s) drained "
                f"(backlog-syphon --decommission shows what it would remove)")
    named = "; ".join(f"{removal.queue} ({', '.join(hold.text() for hold in removal.holds)})"
                      for removal in held[:QUEUES_NAMED])
    more = f"; and {len(held) - QUEUES_NAMED} more" if len(held) > QUEUES_NAMED else ""
    return f"not safe to remove yet: {len(held)} of {len(existing)} backlog queue(s) held: {named}{more}"


@dataclass(frozen=True)
class DecommissionReport:
    """What ``--decommission`` did (``confirmed``) or would do (a dry run), queue by queue."""

    at: dt.datetime
    plan: tuple[QueueRemoval, ...]
    confirmed: bool
    removed: tuple[str, ...] = ()
    lease_holder: str | None = None  # a dry run that found the lease held: removal would wait for that run

    @property
    def refused(self) -> tuple[QueueRemoval, ...]:
        return tuple(removal for removal in self.plan if removal.exists and removal.holds)

    @property
    def remaining(self) -> dict[str, int]:
        """The messages the refused queues hold (the runs table's ``remaining`` of a decommission)."""
        return {removal.queue: sum(hold.count for hold in removal.holds if hold.kind is DrainHold.MESSAGES)
                for removal in self.refused}

    @property
    def exit_code(self) -> int:
        return EXIT_LEASE_HELD if self.lease_holder is not None else removal_exit_code(self.plan)

    @property
    def closing_line(self) -> str:
        if not self.plan:
            return "nothing to remove: the secondary namespace has no backlog queue of this primary namespace"
        refused = self.refused
        refused_text = f"refused {len(refused)} not drained (" + ", ".join(r.queue for r in refused) + ")"
        if not self.confirmed:
            removable = [removal.queue for removal in self.plan if removal.removable]
            line = (f"dry run: would remove {len(removable)} backlog queue(s)"
                    + (f", {refused_text}" if refused else "") + "; --confirm removes them")
            if self.lease_holder is not None:
                line += f"; {self.lease_holder} holds the lease now: --confirm waits for nothing and exits 3"
            return line
        line = f"removed {len(self.removed)} backlog queue(s)"
        return line + (f", {refused_text}" if refused else "")

    def lines(self) -> list[str]:
        title = "decommission" if self.confirmed else "decommission dry run (nothing was removed)"
        out = [f"{title} at {self.at:%Y-%m-%d %H:%M:%S} UTC"]
        for removal in self.plan:
            if removal.queue in self.removed:
                verb = "removed"
            elif not removal.exists:
                verb = "gone"
            elif removal.removable:
                verb = "would remove" if not self.confirmed else "not removed"
            else:
                verb = "refused"
            out.append(f"  {verb:<12} {removal.queue}: {removal.reason()}")
        out.append(self.closing_line)
        return out
