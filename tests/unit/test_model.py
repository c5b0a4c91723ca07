"""The vocabulary: typed records match the table schemas they describe."""

import typing

from backlog_syphon.model import CheckpointRow, Lease, OutcomeRecord, Outcome, ReasonCode, TtlPolicy
from backlog_syphon.restore.rows import OUTCOME_ROW_SCHEMA


def test_outcome_record_is_the_audit_row():
    assert list(typing.get_type_hints(OutcomeRecord)) == OUTCOME_ROW_SCHEMA.fieldNames()


def test_checkpoint_and_lease_rows_match_their_tables():
    from backlog_syphon.storage.tables import CHECKPOINT_SCHEMA, LEASE_SCHEMA

    assert list(CheckpointRow.__dataclass_fields__) == CHECKPOINT_SCHEMA.fieldNames()
    assert list(Lease.__dataclass_fields__) == LEASE_SCHEMA.fieldNames()


def test_enum_values_are_the_tables_contract():
    assert [o.value for o in Outcome] == ["delivered", "dead_lettered", "skipped_ping"]
    assert f"{ReasonCode.MISSING_PATH}" == "missing_path" and ReasonCode("ping") is ReasonCode.PING
    assert TtlPolicy.parse("restart") is TtlPolicy.RESTART
