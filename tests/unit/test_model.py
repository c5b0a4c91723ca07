"""The vocabulary: typed records match the table schemas they describe."""

import typing

import pytest

from backlog_syphon.model import (
    DEAD_LETTER_REASON_CODES,
    FINAL_OUTCOMES,
    REPORTED_OUTCOMES,
    STAYING_OUTCOMES,
    Action,
    HeldSpan,
    BatchStats,
    CheckpointRow,
    Lease,
    Outcome,
    OutcomeRecord,
    ReasonCode,
    RecordedSpan,
    RunSource,
    TtlPolicy,
)
from backlog_syphon.rows import OUTCOME_ROW_SCHEMA


def test_outcome_record_is_the_audit_row():
    assert list(typing.get_type_hints(OutcomeRecord)) == OUTCOME_ROW_SCHEMA.fieldNames()
    # appended at the end (the re-drive's, then the rename's, then the migration's), nullable: an older audit
    # table gets them with ALTER TABLE ADD COLUMNS
    assert OUTCOME_ROW_SCHEMA.fieldNames()[-4:] == ["dead_letter_reason", "dead_letter_error_description",
                                                    "original_destination", "message_state"]
    assert all(OUTCOME_ROW_SCHEMA[name].nullable for name in OUTCOME_ROW_SCHEMA.fieldNames()[-4:])


def test_checkpoint_and_lease_rows_match_their_tables():
    from backlog_syphon.storage.checkpoint_table import CHECKPOINT_SCHEMA
    from backlog_syphon.storage.lease_table import LEASE_SCHEMA

    assert list(CheckpointRow.__dataclass_fields__) == CHECKPOINT_SCHEMA.fieldNames()
    assert list(Lease.__dataclass_fields__) == LEASE_SCHEMA.fieldNames()


def test_enum_values_are_the_tables_contract():
    assert [o.value for o in Outcome] == ["delivered", "dead_lettered", "skipped_ping", "unsent", "held",
                                          "not_selected", "expired", "covered"]
    assert [a.value for a in Action] == ["deliver", "dead_letter", "skip", "hold", "leave", "expire", "cover"]
    assert f"{ReasonCode.BACKLOG_COPY_EXPIRED}" == "backlog_copy_expired"
    assert [s.value for s in RunSource] == ["backlog", "dead_letters", "migration"]
    assert f"{ReasonCode.DESTINATION_SKIPPED}" == "destination_skipped"
    assert f"{ReasonCode.FILTERED_OUT}" == "filtered_out" and f"{ReasonCode.REDRIVEN_BEFORE}" == "redriven_before"
    assert f"{ReasonCode.MISSING_PATH}" == "missing_path" and ReasonCode("ping") is ReasonCode.PING
    assert TtlPolicy.parse("restart") is TtlPolicy.RESTART
    assert ReasonCode("quota_exceeded") is ReasonCode.QUOTA_EXCEEDED
    assert ReasonCode("destination_unavailable") is ReasonCode.DESTINATION_UNAVAILABLE
    assert f"{ReasonCode.ROUND_DEADLINE}" == "round_deadline"


def test_unsent_and_the_outcomes_of_messages_that_stay_are_the_ones_that_are_not_final():
    assert FINAL_OUTCOMES == (Outcome.DELIVERED, Outcome.DEAD_LETTERED, Outcome.SKIPPED_PING, Outcome.EXPIRED,
                              Outcome.COVERED)
    assert [o.is_final for o in Outcome] == [True, True, True, False, False, False, True, True]
    assert STAYING_OUTCOMES == (Outcome.HELD, Outcome.NOT_SELECTED)
    assert [o for o in Outcome if o.stays] == list(STAYING_OUTCOMES)
    assert [a for a in Action if a.stays] == [Action.HOLD, Action.LEAVE]
    assert REPORTED_OUTCOMES == FINAL_OUTCOMES + STAYING_OUTCOMES


HELD = HeldSpan("q0", first=5, last=9, enqueued_from_ms=500, enqueued_to_ms=900, count=3)


def test_held_spans_hold_by_identity_and_merge_into_one_covering_range():
    assert HELD.holds(5, 500) and HELD.holds(9, 900) and not HELD.holds(10, 900) and not HELD.holds(7, 1_000)
    assert not HELD.holds(7, None)
    later = HeldSpan("q0", first=20, last=22, enqueued_from_ms=2_000, enqueued_to_ms=2_200, count=2)
    assert HELD.merged(later) == HeldSpan("q0", 5, 22, 500, 2_200, 5)
    assert HELD.merged(None) is HELD


def test_the_reason_codes_a_redrive_filters_on_are_those_the_syphon_dead_letters_with():
    assert ReasonCode.DESTINATION_NOT_FOUND in DEAD_LETTER_REASON_CODES
    # transient and unsent reasons never reach a dead-letter queue
    assert not {ReasonCode.TRANSIENT, ReasonCode.ROUND_DEADLINE, ReasonCode.PING, ReasonCode.FILTERED_OUT} & set(
        DEAD_LETTER_REASON_CODES)


def test_ttl_policy_names_the_valid_values_when_it_refuses_one():
    with pytest.raises(ValueError, match="ttl_policy must be one of 'remaining', 'restart'; got 'forever'"):
        TtlPolicy.parse("forever")


SPAN = RecordedSpan("q0", first=10, last=20, enqueued_from_ms=1_000, enqueued_to_ms=2_000, count=11)


@pytest.mark.parametrize("sequence_number, enqueued_ms, held", [
    (10, 1_000, True), (20, 2_000, True), (15, 1_500, True),  # inside both, bounds included
    (9, 1_500, False), (21, 1_500, False),  # sequence number outside
    (15, 999, False), (15, 2_001, False),  # the same number in another incarnation of the queue
    (15, None, False),  # no enqueue time: never held
])
def test_a_span_holds_a_message_by_sequence_number_and_enqueue_time(sequence_number, enqueued_ms, held):
    assert SPAN.holds(sequence_number, enqueued_ms) is held


def test_a_batchs_stats_are_what_its_progress_line_and_json_fields_report():
    import datetime as dt

    from backlog_syphon.model import PacingStats
    from backlog_syphon.run.progress import ProgressPoint, progress_fields, progress_line

    now = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)
    stats = BatchStats(delivered=40, dead_lettered=2, skipped=1, replayed=3, send_seconds=4.0,
                       oldest_enqueued=now - dt.timedelta(seconds=90))
    assert (stats.held, stats.pacing) == (0, None)  # a batch that held nothing, over Spark Connect
    fields = progress_fields(ProgressPoint(7, now, stats, {"q/0": 5}))
    assert {key: fields[key] for key in ("batch_id", "delivered", "dead_lettered", "skipped", "held", "replayed",
                                         "oldest_message_age_seconds", "send_rate", "remaining_total")} == {
        "batch_id": 7, "delivered": 40, "dead_lettered": 2, "skipped": 1, "held": 0, "replayed": 3,
        "oldest_message_age_seconds": 90.0, "send_rate": 10.0, "remaining_total": 5}  # 40 delivered in 4 s
    assert "send_rate_cap" not in fields  # no pacing reported
    # The send tasks' own pacing, where it reaches the driver, is the rate reported.
    paced = BatchStats(40, 0, 0, 0, 4.0, None, held=6,
                       pacing=PacingStats(sent=40, first_send_at=100.0, last_send_at=102.0, cap=25.0, tasks=2))
    fields = progress_fields(ProgressPoint(8, now, paced, {}))
    assert (fields["held"], fields["send_rate"], fields["send_rate_cap"]) == (6, 20.0, 25.0)
    assert progress_line(ProgressPoint(8, now, paced, {})) == (
        "batch 8: delivered 40, dead-lettered 0, skipped 0, held 6, replayed 0; oldest message age -; "
        "send rate 20 msg/s (cap 25); remaining 0")
