"""Probing a partitioned queue lane by lane: pure, the probes injected.

A peek from a sequence number answers from one partition: the one that holds the number, or the first
non-empty one after it. So a probe's answer from a higher partition says nothing about the rest of the
queue, only that the asked lane holds nothing at or after the number. The planner therefore plans a
partitioned queue as 16 *lanes* (``partitions.lane_key``), each searched like a queue of its own in its
local numbers (gallop-and-halve within the lane), and ``lane_probes`` translates:
- a lane's probe at local ``n`` asks its queue at ``partition << 48 | n`` (the I/O side peeks the queue
  the key names: ``servicebus.peek.probe_at_once``);
- an answer from that lane comes back in local numbers; one from another lane is asked once more at once
  (a peek "returns the oldest message in one of the partitions whose message broker responded first", and
  nothing says it answers from the lane asked while that lane holds messages there: a second answer from
  elsewhere is the lane holding nothing at or after it; where that closes something, the search looks again
  like at any empty answer). An exhausted lane so costs two probes instead of one (``extra``);
- a queue not known to be partitioned is lane 0: an answer carrying partition bits is "nothing" for it
  too, and teaches that the queue is partitioned (``learned``), so the planner plans it again by lanes
  before anything is read: no window of a non-partitioned plan ever reaches past lane 0.

Invariant: no answer outside the asked lane ever reaches a search, so a window, a tail or a target never
spans two partitions, and a higher partition's messages never end a lower one's reading.
"""

from __future__ import annotations

from typing import Mapping

from backlog_syphon.partitions import absolute, local_of, partition_of, split_lane_key
from backlog_syphon.probing import ProbeAtOnce, ProbeCount


class LaneProbes:
    """A ``ProbeAtOnce`` over planner keys (queues and lanes) on top of one over whole sequence numbers;
    ``learned`` collects the queues whose answers showed partition bits."""

    def __init__(self, probe_at_once: ProbeAtOnce):
        self.probe_at_once = probe_at_once
        self.learned: set[str] = set()
        self.extra = ProbeCount()  # the second looks at answers from another lane (the planner adds them up)

    def __call__(self, asks: Mapping[str, int]) -> dict[str, object]:
        whole = {}
        for key, local in asks.items():
            _, partition = split_lane_key(key)
            whole[key] = absolute(partition, local) if partition is not None else local
        answers = dict(self.probe_at_once(whole))
        elsewhere = {key: whole[key] for key, answer in answers.items() if self._elsewhere(key, answer)}
        if elsewhere:
            answers.update(self.probe_at_once(elsewhere))
            self.extra.add(ProbeCount(len(elsewhere), 1))
        return {key: self._in_lane(key, answer) for key, answer in answers.items()}

    @staticmethod
    def _elsewhere(key: str, answer) -> bool:
        """Whether a lane's answer came from another partition."""
        partition = split_lane_key(key)[1]
        return partition is not None and isinstance(answer, tuple) and partition_of(answer[0]) != partition

    def _in_lane(self, key: str, answer):
        if not isinstance(answer, tuple):
            return answer  # None, or the queue's BacklogQueueMissingError
        queue, partition = split_lane_key(key)
        found = partition_of(answer[0])
        if partition is None:
            if found == 0:
                return answer
            self.learned.add(queue)  # partition bits: a partitioned queue read as one
            return None
        return (local_of(answer[0]),) + tuple(answer[1:]) if found == partition else None
