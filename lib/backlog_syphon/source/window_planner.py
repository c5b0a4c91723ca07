"""The stream reader's driver-side planning between triggers: pure, the probes injected.

``WindowPlanner`` holds what the stream reader remembers between triggers (its start, the available-now
target, each queue's tail and head as last seen, the hints), plans each batch with
``planning.plan_windows``, and reports the backlog as last probed, so the reader itself only translates
between Spark and this module. Offsets come and go as ``offsets.BatchOffsets``, typed: the reader parses
Spark's JSON once and writes it back once.

An available-now run fixes its target with the run's first plan, every queue at once, each searched from
its offset. A queue that search finds empty from its offset rests on one answer "nothing at or after", so
the head probe the plan makes anyway is its second look (``WindowPlanner._confirm_targets``): a target
found wrong is searched again from the message found, and the batch planned again.

A partitioned queue (known from the administration API, or from the partition bits of any number a probe
saw: ``partition_lanes.LaneProbes``) is planned as 16 lanes, each a key of its own in the planner (its
offset, target, hints, back-off), and its offsets are folded back into one ``PartitionedOffset`` per queue
for Spark. A queue found partitioned while planning is planned again, by lanes, before the plan is used.
"""

from __future__ import annotations

import logging
from typing import Collection, Mapping, Sequence

from backlog_syphon.errors import BacklogQueueMissingError
from backlog_syphon.probing import ProbeAtOnce, ProbeCount, probe_once, run_searches, search_tail, search_tail_from
from backlog_syphon.partitions import LANES, lane_key, split_lane_key
from backlog_syphon.source.offsets import BatchOffsets, PartitionedOffset, QueueOffset, expand_lanes, fold_lanes
from backlog_syphon.source.partition_lanes import LaneProbes
from backlog_syphon.source.planning import IdleBackoff, QueueHints, WindowPlan, plan_windows

# The planner's log lines keep the logger they were always written under (log filters may name it).
logger = logging.getLogger(__name__)


ALL_AVAILABLE_BUDGET = 1 << 40  # "no limit": more sequence numbers than any queue holds
PLAN_KEY = "(last plan)"  # in the reported latest offset: the probes and rounds of the plan behind it


class WindowPlanner:
    """The stream reader's driver-side planning: its start, the available-now target, each queue's
    window end per trigger, and each queue's tail and head as last seen (for progress reports).

    ``probe_at_once`` probes one sequence number in each of several queues, together.
    ``max_messages`` bounds a batch unless Spark passes its own read limit; ``available_now`` without
    a read limit from Spark (Spark 4.0/4.1) means one batch of everything, since those versions have
    no available-now target for Python sources.
    """

    def __init__(self, probe_at_once: ProbeAtOnce, *, max_messages: int, available_now: bool,
                 idle_probe_max_seconds: float, look_back: Collection[str] = (), partitioned: Collection[str] = ()):
        self.lane_probes = LaneProbes(probe_at_once)
        self.probe_at_once = self.lane_probes
        # Queues read lane by lane: partitioned as the administration API says, or as a probe's answer showed.
        self.partitioned = set(partitioned)
        self.max_messages = max_messages
        self.available_now = available_now
        self.backoff = IdleBackoff(max_seconds=idle_probe_max_seconds)
        self.target: dict[str, int] | None = None  # available-now: stop here (by planner key: queue or lane)
        self.target_wanted = False  # an available-now run: the target is fixed by the next plan
        self.last_end: BatchOffsets | None = None  # Spark 4.0/4.1 ask for the latest offset without a start
        self.tails: dict[str, int] = {}  # queue -> end of what was in it when last probed
        self.hints: dict[str, QueueHints] = {}
        self.missing: set[str] = set()  # configured queues that do not exist (warned about once)
        self.last_count = ProbeCount()  # the last plan's round trips (the target's included)
        # Queues where earlier runs held messages for skipped destinations: looked back at once, when this
        # run first plans them (``looked_back``). Only those: a look back elsewhere would only re-read
        # recorded messages the purge has not settled yet.
        self.look_back = frozenset(look_back)
        self.looked_back: set[str] = set()
        # Queues whose target rests on one answer "nothing at or after the offset": the plan's head probe is
        # their second look (``_confirm_targets``).
        self.unconfirmed: set[str] = set()

    @staticmethod
    def initial_offset(queues: Sequence[str]) -> BatchOffsets:
        return BatchOffsets.of({queue: QueueOffset() for queue in queues})

    def prepare_available_now(self) -> None:
        """An available-now run: the next plan fixes the target, every queue's tail then (its probes start
        at the batch's start offsets, so a drained backlog costs one probe per queue)."""
        self.target_wanted = True

    def fix_target(self, start: Mapping[str, QueueOffset], queues: Sequence[str], count: ProbeCount) -> dict[str, int]:
        """Every queue's tail now, all queues at once, each searched from its offset (a missing queue: 0). An
        end found past a message is looked at twice (``probing.search_tail``); a queue found empty from its
        offset is looked at again by the plan's head probe (``_confirm_targets``), which costs nothing more."""
        offsets = {queue: start.get(queue, QueueOffset()) for queue in queues}
        seen: dict[str, list] = {}
        tails = run_searches({queue: search_tail_from(offsets[queue].next, confirm=True) for queue in queues},
                             self.probe_at_once, count, seen)
        self.unconfirmed |= {queue for queue in queues if tails[queue] == offsets[queue].next}
        self.target = {} if self.target is None else self.target
        for queue in queues:
            tail = tails[queue]
            if isinstance(tail, BacklogQueueMissingError):
                if queue not in self.missing:
                    if split_lane_key(queue)[1] in (None, 0):  # a partitioned queue's lanes: said once
                        logger.warning("backlog=%s does not exist: skipped (the other backlog queues drain)",
                                       split_lane_key(queue)[0])
                    self.missing.add(queue)
                tail = 0
            else:
                hint = self.hints.get(queue)
                if hint is None or hint.incarnation != offsets[queue].incarnation:
                    hint = self.hints[queue] = QueueHints(offsets[queue].incarnation)
                hint.saw(seen.get(queue, ()))  # the target's messages: a window closed at it holds none newer
            self.target[queue] = tail
        logger.info("available-now target: %s (%d probes in %d rounds)", self.target, count.probes, count.rounds)
        return self.target

    def budget(self, *, max_rows: int | None = None, all_available: bool = False,
               limits_supported: bool = True) -> int:
        """Messages the next batch may read, from Spark's read limit (``max_rows`` or ``all_available``)."""
        if max_rows is not None:
            return max_rows
        if all_available or (not limits_supported and self.available_now):
            return ALL_AVAILABLE_BUDGET
        return self.max_messages

    def latest_offset(self, start: BatchOffsets | None, queues: Sequence[str], budget: int, *, now: float,
                      stopping: bool = False) -> BatchOffsets:
        """The end of the next batch from ``start`` (the last end, or the initial offset, when None).

        ``stopping``: a polite stop was requested, so no new batch is planned (the end is the start).
        """
        if start is None:
            start = self.last_end or self.initial_offset(queues)
        if stopping:
            return start
        # A queue whose offset is per partition is read so (a queue recreated non-partitioned numbers in lane 0,
        # where its recreation shows as always).
        self.partitioned |= {queue for queue, offset in start.items() if isinstance(offset, PartitionedOffset)}
        count = ProbeCount()
        while True:
            learned_before = set(self.lane_probes.learned)
            keys = self.keys(queues)
            keyed = expand_lanes(start, self.partitioned)
            if self.target_wanted and (self.target is None or any(key not in self.target for key in keys)):
                self.fix_target(keyed, [key for key in keys if self.target is None or key not in self.target], count)
            plan = self._plan(keyed, keys, budget, now)
            count.add(plan.count)
            if self.unconfirmed and self._confirm_targets(plan, count):
                plan = self._plan(keyed, keys, budget, now)  # the target was wrong: plan again with the right one
                count.add(plan.count)
            found = (self.lane_probes.learned - learned_before) - self.partitioned
            if not found:
                break
            # A queue read as one turned out partitioned: its plan stopped at lane 0's end. Plan it by lanes.
            logger.info("backlog=%s is partitioned (a peek answered with partition bits): read partition by "
                        "partition", ", ".join(sorted(found)))
            self.partitioned |= found
            for queue in found:  # what was learnt under the queue's own key belonged to lane 0 only
                self.tails.pop(queue, None)
                self.unconfirmed.discard(queue)
                if self.target is not None:
                    self.target.pop(queue, None)
        count.add(self.lane_probes.extra)  # the lanes' second looks at answers from another partition
        self.lane_probes.extra = ProbeCount()
        self.last_count = count
        self.looked_back.update(plan.looked)
        for key in plan.restarted:
            self.tails.pop(key, None)
            if self.target is not None:  # an available-now run drains what the new queue holds now
                self.target[key] = max(plan.tails.get(key, 0), plan.end[key].next)
        for key, tail in plan.tails.items():
            self.tails[key] = max(tail, self.tails.get(key, 0))
        self.last_end = fold_lanes(plan.end)
        return self.last_end

    def keys(self, queues: Sequence[str]) -> list[str]:
        """The planner's keys: each queue, or each lane of a partitioned one."""
        return [key for queue in queues
                for key in ([lane_key(queue, p) for p in range(LANES)] if queue in self.partitioned else [queue])]

    def _plan(self, start: Mapping[str, QueueOffset], queues: Sequence[str], budget: int, now: float) -> WindowPlan:
        return plan_windows(start, queues, budget, self.probe_at_once, backoff=self.backoff, now=now,
                            target=self.target, missing=self.missing,
                            look_back=set(self.keys(sorted(self.look_back))) - self.looked_back, hints=self.hints)

    def _confirm_targets(self, plan: WindowPlan, count: ProbeCount) -> bool:
        """The second look at the queues the target found empty from their offsets: the plan's head probe
        (nothing at all: confirmed; a message at or past the target: it was wrong), or, where the head lies
        below the offset, one probe at the target. A wrong target is searched again from the message found
        (``search_tail``, confirmed); True when one was."""
        unconfirmed, self.unconfirmed = self.unconfirmed - set(plan.restarted) - self.missing, set()
        found, ask = {}, {}
        for queue in sorted(unconfirmed):
            head = self.hints[queue].head
            if head is not None and head[0] >= self.target[queue]:
                found[queue] = head
            elif head is not None:
                ask[queue] = self.target[queue]
        answers = run_searches({queue: probe_once(at) for queue, at in ask.items()}, self.probe_at_once, count)
        found.update({queue: answer for queue, answer in answers.items() if isinstance(answer, tuple)})
        if not found:
            return False
        seen: dict[str, list] = {}
        tails = run_searches({queue: search_tail(head, confirm=True) for queue, head in found.items()},
                             self.probe_at_once, count, seen)
        for queue, tail in tails.items():
            if isinstance(tail, BacklogQueueMissingError):
                continue
            logger.warning("backlog=%s: a peek came back empty from %d although messages were there; the "
                           "available-now target moves from %d to %d", queue, self.target[queue],
                           self.target[queue], tail)
            self.target[queue] = tail
            self.hints[queue].saw(seen.get(queue, ()))
        return True

    def resume(self, end: BatchOffsets) -> None:
        """Spark runs a batch that ends at ``end``: the next one starts there. Spark before 4.2 asks for the
        latest offset without a start, and after a restart it first replays the last planned batch
        without asking this planner: without this, the next batch would be planned from each queue's
        head again, and a queue emptied meanwhile would look as if it were never read."""
        self.last_end = end

    def reached_target(self, end: BatchOffsets) -> bool:
        """Whether ``end`` covers the available-now target of every queue (a missing queue has none)."""
        if self.target is None:
            return False
        keyed = expand_lanes(end, self.partitioned)
        return all(key in self.missing or keyed.get(key, QueueOffset()).next >= through
                   for key, through in self.target.items())

    def reported_latest(self, now_ms: int) -> dict[str, dict] | None:
        """Each queue's backlog as last probed, or None before any probe: its tail (``next``, never behind the
        planned end), the sequence numbers left behind the planned end (``remaining``, an upper bound), and
        the age of its oldest message (``oldest_age_seconds``, the head's; messages delivered and not yet
        settled included); and under ``PLAN_KEY`` (no queue is named so) what the last plan cost. Nothing
        here costs a probe."""
        if not self.tails:
            return None
        ends = expand_lanes(self.last_end or BatchOffsets(), self.partitioned)
        reported: dict[str, dict] = {}
        # A partitioned queue's lanes add up: its ``next`` is the sum of its lanes' tails in local numbers,
        # which its offset's ``next`` matches (``PartitionedOffset.next``), so a tail less an offset is what is left.
        for key, tail in sorted(self.tails.items()):
            queue = split_lane_key(key)[0]
            planned = ends.get(key, QueueOffset()).next
            head = self.hints[key].head if key in self.hints else None
            oldest = None if head is None or head[1] is None else max(0.0, (now_ms - head[1]) / 1000)
            known = reported.setdefault(queue, {"next": 0, "remaining": 0, "oldest_age_seconds": None})
            known["next"] += max(tail, planned)
            known["remaining"] += max(0, tail - planned)
            if oldest is not None:
                known["oldest_age_seconds"] = max(round(oldest, 1), known["oldest_age_seconds"] or 0.0)
        reported[PLAN_KEY] = {"probes": self.last_count.probes, "rounds": self.last_count.rounds}
        return reported
