"""One decode pass per peeked message (``restore.backlog_rows.peeked_message``): its place in the queue and its
row from the same envelope, the row equal to what decoding for the row alone gives; a message the codec cannot
read keeps its place (read from its annotations alone) and becomes its row's decode problem. And a Python
worker freezes what it imported once (``worker_process``)."""

from __future__ import annotations

import gc


from backlog_syphon.model import ReasonCode
from backlog_syphon.restore.amqp.message import DecodedMessage, MessageProperties
from backlog_syphon.restore.amqp.values import Described, Symbol, Timestamp
from backlog_syphon.restore.backlog_rows import backlog_row_values, peeked_message
from backlog_syphon.rows import BACKLOG_ROW_COLUMNS
from backlog_syphon.worker_process import freeze_imports

QUEUE = "contoso/x-servicebus-transfer/2"
ENQUEUED_MS = 1714560000000


def message(annotations: dict | None = None, **properties) -> bytes:
    return DecodedMessage(
        message_annotations={Symbol("x-opt-sequence-number"): 41,
                             Symbol("x-opt-enqueued-time"): Timestamp(ENQUEUED_MS)} if annotations is None else annotations,
        properties=MessageProperties(message_id="m-41"),
        application_properties={"x-ms-path": "orders", "x-ms-sessionid": "s-1",
                                "x-ms-timetolive": Described(Symbol("com.microsoft:timespan"), 10_000_000),
                                **properties},
        body=(b"12345",),
    ).encode()


def test_a_message_is_placed_and_its_row_made_from_one_decode():
    raw = message()
    peeked = peeked_message(QUEUE, raw)
    assert (peeked.sequence_number, peeked.enqueued_ms) == (41, ENQUEUED_MS)
    assert peeked.row == backlog_row_values(QUEUE, raw)
    assert list(peeked.row) == list(BACKLOG_ROW_COLUMNS)
    assert (peeked.row["destination"], peeked.row["session_id"], peeked.row["time_to_live_ms"]) == ("orders", "s-1", 1000)


def test_a_message_whose_legacy_properties_are_wrong_is_placed_and_dead_lettered_by_its_row():
    peeked = peeked_message(QUEUE, message(**{"x-ms-sessionid": 42}))
    assert peeked.sequence_number == 41
    assert peeked.row["decode_problem_code"] == ReasonCode.INVALID_LEGACY_PROPERTY


def test_a_message_the_codec_cannot_read_keeps_its_place_and_says_why():
    raw = message(note="zq")
    broken = raw.replace(b"zq", b"\xff\xfe")  # a property's text no longer UTF-8: its framing, and the place, still read
    peeked = peeked_message(QUEUE, broken)
    assert (peeked.sequence_number, peeked.enqueued_ms) == (41, ENQUEUED_MS)
    assert peeked.row["decode_problem_code"] == ReasonCode.UNDECODABLE_MESSAGE
    assert peeked.row["sequence_number"] == 41 and peeked.row["raw_message"] == broken
    assert peeked.row["enqueued_time"].timestamp() * 1000 == ENQUEUED_MS
    assert peeked.row == backlog_row_values(QUEUE, broken, sequence_number=41,
                                            enqueued_time=peeked.row["enqueued_time"])


def test_a_worker_freezes_what_it_imported_once():
    freeze_imports()
    frozen = gc.get_freeze_count()
    assert frozen > 0
    gc.collect()
    freeze_imports()  # later calls do nothing
    assert gc.get_freeze_count() == frozen
    gc.unfreeze()
