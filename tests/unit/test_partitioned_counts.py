"""The status's count of a partitioned queue: an upper bound summed per partition, never the span from the
first partition's first number to the last partition's last."""

import datetime as dt

from backlog_syphon.partitions import absolute, local_of
from backlog_syphon.restore.amqp.message import DecodedMessage
from backlog_syphon.restore.amqp.sections import broker_identity
from backlog_syphon.servicebus.counts import EXACT_COUNT_LIMIT, survey
from tests.unit.test_counts import ENQUEUED, Queue


class PartitionedQueue(Queue):
    """Answers one partition per peek (the one holding the number, else the next non-empty one)."""

    def peek(self, first, count):
        page = super().peek(first, count)
        return [raw for raw in page if self._partition(raw) == self._partition(page[0])] if page else []

    @staticmethod
    def _partition(raw):
        return broker_identity(raw)[0] >> 48

    def stored(self, index):
        seq = self.sequence_numbers[index]
        return DecodedMessage(message_annotations={"x-opt-sequence-number": seq,
                                                   "x-opt-enqueued-time": ENQUEUED + dt.timedelta(seconds=local_of(seq))},
                              body=(b"x",)).encode()


def test_a_partitioned_queues_bound_is_the_sum_of_its_partitions():
    per_lane = 3 * EXACT_COUNT_LIMIT
    queue = PartitionedQueue([absolute(p, n) for p in (0, 4, 15) for n in range(1, per_lane + 1)])
    found = survey(queue.peek, known=None, reasons=False)
    assert (found.messages, found.exact) == (3 * per_lane, False)


def test_a_small_partitioned_queue_is_counted_exactly():
    queue = PartitionedQueue([absolute(p, n) for p in (2, 9) for n in range(1, 11)])
    found = survey(queue.peek, known=None, reasons=False)
    assert (found.messages, found.exact) == (20, True)


def test_the_dry_runs_plan_is_per_partition_for_a_partitioned_queue_only():
    from backlog_syphon.run.dry_run_plan import by_partition

    rows = [{"backlog_queue": "p", "partition": 0, "count": 4}, {"backlog_queue": "p", "partition": 7, "count": 2},
            {"backlog_queue": "plain", "partition": 0, "count": 9}]
    assert by_partition(rows) == ({"p": 6, "plain": 9}, {"p": {0: 4, 7: 2}})
