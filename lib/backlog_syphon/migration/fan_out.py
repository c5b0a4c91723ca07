"""Whether the subscriptions a ``topic`` route drains through one lead hold the same messages: pure.

Every subscription of a topic gets its copy of a message under the topic's sequence number ("the broker stamps
messages with a gap-free, increasing sequence number relative to the queue or topic": the message-sequencing
page), so two subscriptions hold the same messages when they hold the same sequence numbers. Where they do, the
lead's send of each message to the target topic gives every subscription its copy again, and the others' copies
are covered (``Action.COVER``); where they do not, the topic would give a subscription a copy it no longer
had (one its consumers had already taken), or a covered copy would be settled that no send replaces. The check
runs under the lease, before anything is sent, on what each subscription holds now (``live``, peeked) and what
earlier runs recorded of it (``recorded``: final outcomes in the audit), so a run that stopped half-way through a
group passes it again:
- every number a covered subscription holds, its lead holds or has recorded (its send is, or was, made);
- every number the lead holds, each covered subscription holds or has recorded (the send gives nobody a copy
  it had not).
"""

from __future__ import annotations

from typing import Mapping

from backlog_syphon.migration.routes import RouteError
from backlog_syphon.partitions import sequence_label

SHOWN = 5  # sequence numbers a refusal names, of each difference


class FanOutError(RouteError):
    """The subscriptions of a ``topic`` route with a lead do not hold the same messages."""


def fan_out_differences(lead: str, covered: str, live: Mapping[str, frozenset[int]],
                        recorded: Mapping[str, frozenset[int]]) -> list[str]:
    """What keeps ``covered``'s messages from being the lead's: one line per kind of difference ([] if none).
    ``live`` and ``recorded`` are by lower-case path."""
    empty: frozenset[int] = frozenset()
    lead_live, lead_recorded = live.get(lead.lower(), empty), recorded.get(lead.lower(), empty)
    own_live, own_recorded = live.get(covered.lower(), empty), recorded.get(covered.lower(), empty)
    lines = []
    only_here = own_live - lead_live - lead_recorded
    if only_here:
        lines.append(f"{covered} holds {len(only_here)} message(s) {lead} does not ({_some(only_here)})")
    only_in_lead = lead_live - own_live - own_recorded
    if only_in_lead:
        lines.append(f"{lead} holds {len(only_in_lead)} message(s) {covered} does not ({_some(only_in_lead)}): the "
                     f"topic would give it a copy its consumers had already taken")
    return lines


def check_same_messages(groups: Mapping[str, tuple[str, ...]], live: Mapping[str, frozenset[int]],
                        recorded: Mapping[str, frozenset[int]]) -> None:
    """``FanOutError`` naming every difference of every group (``MigrationPlan.fan_out_groups``: lead -> the
    subscriptions it covers); None when each group holds the same messages. Paths compare case-insensitively."""
    live = {path.lower(): numbers for path, numbers in live.items()}
    recorded = {path.lower(): numbers for path, numbers in recorded.items()}
    problems = [line for lead, members in groups.items() for member in members
                for line in fan_out_differences(lead, member, live, recorded)]
    if problems:
        raise FanOutError("migration.subscriptions sends every subscription of a topic to it through one of them, "
                          "but they do not hold the same messages: " + "; ".join(problems) + ". Choose queue or "
                          "property for these subscriptions instead")


def _some(numbers: frozenset[int]) -> str:
    shown = sorted(numbers)[:SHOWN]
    return "sequence numbers " + ", ".join(sequence_label(n) for n in shown) + (", ..." if len(numbers) > SHOWN else "")
