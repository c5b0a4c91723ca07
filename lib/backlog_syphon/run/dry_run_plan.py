"""What a replay would do, from a snapshot of the backlog: pure Spark transforms, no I/O.

The dry run (``run.dry_run``) peeks every backlog queue, classifies the rows with the same
``restore.rules`` the sink uses, adds what only the primary namespace can tell (a destination
that does not exist or refuses us, a message larger than its link takes), and summarises here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from backlog_syphon.model import Action, MessageState, ReasonCode
from backlog_syphon.partitions import PARTITION_SHIFT
from backlog_syphon.restore.rules import expired_by

NO_DESTINATION = "(no destination)"
NO_REASON = "(no reason)"
DEAD_LETTER_COLUMNS = ("backlog_queue", "sequence_number", "message_id", "destination", "reason_code", "reason")


@dataclass(frozen=True)
class DestinationProblem:
    """Why nothing can be sent to a destination (from attaching a sender to it)."""

    reason_code: ReasonCode
    reason: str


# What a drain spends of the namespaces' credits per message (``credits``): on the secondary a window read peeks
# it, the purge receives it and settles it (one credit per lock token: an assumption, the service names no
# cost); on the primary it is sent (a topic's filters cost one more each, which the syphon does not see).
SECONDARY_CREDITS_PER_MESSAGE = 3
# Probes a queue's lane costs per batch (its head, where its window starts and ends), and in the run's first
# plan, which fixes the available-now target with a gallop and a halving.
PROBES_PER_LANE_AND_BATCH = 2
PROBES_PER_LANE_FIRST_PLAN = 20
STANDARD_CREDITS_PER_SECOND = 1000


@dataclass(frozen=True)
class DrainCost:
    """What draining a backlog will cost each namespace's credits, about (the dry run's estimate)."""

    messages: int  # read from the backlog (each peeked once)
    settled: int  # taken out of it (delivered, dead-lettered, skipped)
    delivered: int  # sent to the primary
    to_topics: int  # of them, to topics (whose filters cost one credit more each)
    probes: int
    secondary_budget: float  # secondary.max_credits_per_second (0: none)
    primary_budget: float

    @property
    def secondary(self) -> int:
        return self.messages + 2 * self.settled + self.probes

    @property
    def primary(self) -> int:
        return self.delivered

    def lines(self) -> list[str]:
        budget = self.secondary_budget or STANDARD_CREDITS_PER_SECOND
        seconds = max(self.secondary / budget, self.primary / (self.primary_budget or STANDARD_CREDITS_PER_SECOND))
        where = (f"at secondary.max_credits_per_second={self.secondary_budget:g}" if self.secondary_budget
                 else "with all of a Standard namespace's 1,000 a second")
        out = [f"  credits the drain will cost, about: secondary {self.secondary:,} (a peek, a receive and a "
               f"settlement per message, and {self.probes:,} probes), primary {self.primary:,} (a send per message"
               + (f"; {self.to_topics:,} of them to topics, one credit more per filter each" if self.to_topics else "")
               + ")",
               f"  {where}: at least {seconds:,.0f} s of the namespaces' credits; a Premium namespace has no credit "
               f"budget"]
        return out


def drain_cost(per_destination: list[dict], *, topics: set[str], lanes: int, max_messages_per_trigger: int,
               secondary_budget: float, primary_budget: float) -> DrainCost:
    """The dry run's estimate from its summary rows (``destination_summary``); ``topics``: the lower-case names
    of the destinations that are topics; ``lanes``: the backlog queues, a partitioned one counting 16."""
    messages = sum(row["messages"] for row in per_destination)
    settled = sum(row["to_deliver"] + row["to_dead_letter"] + row["to_skip"] for row in per_destination)
    delivered = sum(row["to_deliver"] for row in per_destination)
    to_topics = sum(row["to_deliver"] for row in per_destination if row["destination"].lower() in topics)
    batches = -(-messages // max(1, max_messages_per_trigger))
    probes = lanes * (PROBES_PER_LANE_FIRST_PLAN + PROBES_PER_LANE_AND_BATCH * batches)
    return DrainCost(messages, settled, delivered, to_topics, probes, secondary_budget, primary_budget)


def apply_destination_checks(classified: DataFrame, problems: dict[str, DestinationProblem],
                             max_sizes: dict[str, int]) -> DataFrame:
    """Turn deliverable rows into dead-letters where the primary namespace would refuse them.

    ``problems``: destinations that cannot be used; ``max_sizes``: the largest message each usable
    destination accepts. The stored size of the backlog copy stands in for the restored message's
    size; it is a few hundred bytes larger (the ``x-ms-*`` properties), so the check errs on the
    side of warning.
    """
    deliverable = F.col("action") == Action.DELIVER
    action, reason_code, reason = F.col("action"), F.col("reason_code"), F.col("reason")
    for destination, problem in sorted(problems.items()):
        refused = deliverable & (F.col("destination") == destination)
        action = F.when(refused, F.lit(Action.DEAD_LETTER)).otherwise(action)
        reason_code = F.when(refused, F.lit(problem.reason_code)).otherwise(reason_code)
        reason = F.when(refused, F.lit(problem.reason)).otherwise(reason)
    for destination, limit in sorted(max_sizes.items()):
        too_large = deliverable & (F.col("destination") == destination) & (F.length("raw_message") > limit)
        action = F.when(too_large, F.lit(Action.DEAD_LETTER)).otherwise(action)
        reason_code = F.when(too_large, F.lit(ReasonCode.MESSAGE_TOO_LARGE)).otherwise(reason_code)
        reason = F.when(too_large, F.format_string(
            f"stored message of %d bytes exceeds the {limit} bytes '{destination}' accepts",
            F.length("raw_message"))).otherwise(reason)
    return classified.withColumns({"action": action, "reason_code": reason_code, "reason": reason})


def destination_summary(planned: DataFrame, *, now: datetime) -> DataFrame:
    """One row per destination: what is waiting for it and what would happen to it."""
    def count_where(condition):
        return F.sum(F.when(condition, 1).otherwise(0)).cast("long")

    return (planned
            .withColumn("destination", F.coalesce("destination", F.lit(NO_DESTINATION)))
            .groupBy("destination")
            .agg(F.count(F.lit(1)).alias("messages"),
                 F.coalesce(F.sum("body_size"), F.lit(0)).cast("long").alias("body_bytes"),
                 F.countDistinct("session_id").alias("sessions"),
                 F.min("enqueued_time").alias("oldest_enqueued"),
                 F.max("enqueued_time").alias("newest_enqueued"),
                 count_where(F.col("scheduled_enqueue_time") > F.lit(now)).alias("scheduled"),
                 count_where(expired_by(now)).alias("expired"),
                 count_where(F.col("action") == Action.DELIVER).alias("to_deliver"),
                 count_where(F.col("action") == Action.DEAD_LETTER).alias("to_dead_letter"),
                 count_where(F.col("action").isin(Action.SKIP, Action.EXPIRE)).alias("to_skip"),
                 count_where(F.col("action") == Action.HOLD).alias("to_hold"),
                 # the x-ms-path names restore.destination_map renamed to this one, as text (plain columns only:
                 # the notebook shows these rows as a DataFrame)
                 F.concat_ws(", ", F.array_sort(F.collect_set("original_destination"))).alias("renamed_from"))
            .orderBy("destination"))


def renamed_destinations(planned: DataFrame) -> DataFrame:
    """One row per name ``restore.destination_map`` renamed: old name (as x-ms-path gave it), new name, messages."""
    return (planned.where(F.col("original_destination").isNotNull())
            .groupBy(F.col("original_destination").alias("old_name"), F.col("destination").alias("new_name"))
            .count().withColumnRenamed("count", "messages")
            .orderBy("old_name", "new_name"))


def dead_letter_plan(planned: DataFrame) -> DataFrame:
    """The messages that would be dead-lettered, with their reasons, in backlog order."""
    return (planned.where(F.col("action") == Action.DEAD_LETTER)
            .select(*DEAD_LETTER_COLUMNS)
            .orderBy("backlog_queue", "sequence_number"))


def redrive_summary(planned: DataFrame) -> DataFrame:
    """A re-drive's plan, one row per destination and dead-letter reason: how many messages the dead-letter
    sub-queues hold, how many would move (be delivered), how many would be tried and stay (still
    undeliverable: dead-lettered again, in place) and how many the re-drive would leave alone (not selected)."""
    def count_where(condition):
        return F.sum(F.when(condition, 1).otherwise(0)).cast("long")

    return (planned
            .withColumns({"destination": F.coalesce("destination", F.lit(NO_DESTINATION)),
                          "dead_letter_reason": F.coalesce("dead_letter_reason", F.lit(NO_REASON))})
            .groupBy("destination", "dead_letter_reason")
            .agg(F.count(F.lit(1)).alias("messages"),
                 count_where(F.col("action") == Action.DELIVER).alias("to_move"),
                 count_where(F.col("action").isin(Action.DEAD_LETTER, Action.SKIP)).alias("to_stay"),
                 count_where(F.col("action") == Action.LEAVE).alias("not_selected"),
                 F.min("enqueued_time").alias("oldest_enqueued"),
                 F.max("enqueued_time").alias("newest_enqueued"))
            .orderBy("destination", "dead_letter_reason"))


def source_summary(planned: DataFrame) -> DataFrame:
    """A migration's plan, one row per source entity: what it holds in each state, its sessions, and what would
    become of it (delivered, held, expired, dead-lettered, covered by its lead subscription's send)."""
    def count_where(condition):
        return F.sum(F.when(condition, 1).otherwise(0)).cast("long")

    return (planned.groupBy("backlog_queue")
            .agg(F.count(F.lit(1)).alias("messages"), F.countDistinct("session_id").alias("sessions"),
                 count_where(F.col("message_state") == MessageState.SCHEDULED).alias("scheduled"),
                 count_where(F.col("message_state") == MessageState.DEFERRED).alias("deferred"),
                 count_where(F.col("action") == Action.DELIVER).alias("to_deliver"),
                 count_where(F.col("action") == Action.HOLD).alias("to_hold"),
                 count_where(F.col("action") == Action.EXPIRE).alias("to_expire"),
                 count_where(F.col("action") == Action.DEAD_LETTER).alias("to_dead_letter"),
                 count_where(F.col("action") == Action.COVER).alias("to_cover"))
            .orderBy("backlog_queue"))


def partition_counts(classified: DataFrame) -> DataFrame:
    """Messages per backlog queue and partition (``partitions``: the top 16 bits of the sequence number; a
    non-partitioned queue's are all partition 0): what a replay reads, partition by partition."""
    return (classified.groupBy("backlog_queue", F.shiftright(F.col("sequence_number"), PARTITION_SHIFT)
                               .alias("partition")).count())


def by_partition(rows) -> tuple[dict[str, int], dict[str, dict[int, int]]]:
    """``partition_counts`` rows as (messages per queue, messages per partition of each partitioned queue)."""
    per_queue: dict[str, int] = {}
    lanes: dict[str, dict[int, int]] = {}
    for row in rows:
        per_queue[row["backlog_queue"]] = per_queue.get(row["backlog_queue"], 0) + row["count"]
        lanes.setdefault(row["backlog_queue"], {})[int(row["partition"])] = row["count"]
    return per_queue, {queue: dict(sorted(counts.items())) for queue, counts in lanes.items()
                       if any(partition for partition in counts)}
