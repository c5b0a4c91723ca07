"""Decoding the legacy x-ms-* properties: every accepted encoding, every rejection and its code."""

import uuid
from datetime import datetime, timedelta, timezone

import pytest

from backlog_syphon.restore.amqp.values import (
    Array,
    Char,
    Decimal32,
    Decimal128,
    Described,
    Float,
    Int,
    MapPairs,
    Symbol,
    Timestamp,
    ULong,
)

from backlog_syphon.restore.amqp.values import datetime_to_ms, ms_to_datetime
from backlog_syphon.restore.legacy_properties import (
    DOTNET_TIMESPAN_MAX_TICKS,
    INVALID_DESTINATION,
    INVALID_LEGACY_PROPERTY,
    LEGACY_PROPERTIES,
    MISSING_PATH,
    LegacyFields,
    Problem,
    decode_legacy_properties,
    is_legacy_key,
    strip_legacy_properties,
    ticks_to_timedelta,
    timedelta_to_ms,
    timedelta_to_ticks,
)

UTC = timezone.utc
TIMESPAN = Symbol("com.microsoft:timespan")
FIFTEEN_MINUTES_TICKS = 15 * 60 * 10_000_000
SCHEDULED = datetime(2024, 5, 1, 12, 30, 15, 250000, tzinfo=UTC)
SCHEDULED_MS = 1714566615250


def decode_one(key, value, path="orders"):
    """Decode one legacy property next to a valid path."""
    return decode_legacy_properties({"x-ms-path": path, key: value})


def codes(fields):
    return [problem.code for problem in fields.problems]


# --- the full legacy message --------------------------------------------------------------------

def test_legacy_message_as_the_codec_decodes_it():
    fields = decode_legacy_properties({
        Symbol("x-ms-path"): "a/b/topic",
        "x-ms-sessionid": "session-1",
        "x-ms-timetolive": Described(TIMESPAN, FIFTEEN_MINUTES_TICKS),
        "x-ms-scheduledenqueuetimeutc": Timestamp(SCHEDULED_MS),
        "customer": Int(7),
    })
    assert fields == LegacyFields("a/b/topic", "session-1", timedelta(minutes=15), SCHEDULED, ())


def test_legacy_message_as_the_sdk_hands_it_over():
    fields = decode_legacy_properties({
        b"x-ms-path": b"orders",
        b"x-ms-sessionid": b"session-1",
        b"x-ms-timetolive": FIFTEEN_MINUTES_TICKS,
        b"x-ms-scheduledenqueuetimeutc": SCHEDULED_MS,
    })
    assert fields == LegacyFields("orders", "session-1", timedelta(minutes=15), SCHEDULED, ())


def test_only_path_gives_no_session_ttl_or_schedule():
    assert decode_legacy_properties({"x-ms-path": "orders"}) == LegacyFields("orders")


def test_missing_path_is_a_problem_and_other_fields_still_decode():
    fields = decode_legacy_properties({"x-ms-sessionid": "s", "other": 1})
    assert fields.destination is None
    assert fields.session_id == "s"
    assert codes(fields) == [MISSING_PATH]
    assert "x-ms-path is missing" in fields.problems[0].reason


def test_empty_properties_report_missing_path():
    assert codes(decode_legacy_properties({})) == [MISSING_PATH]


def test_several_problems_are_all_collected_in_property_order():
    fields = decode_legacy_properties({
        "x-ms-sessionid": 5,
        "x-ms-timetolive": True,
        "x-ms-scheduledenqueuetimeutc": 1.5,
    })
    assert codes(fields) == [MISSING_PATH] + [INVALID_LEGACY_PROPERTY] * 3
    assert fields == LegacyFields(problems=fields.problems)


def test_same_property_under_two_key_types_is_ambiguous():
    fields = decode_legacy_properties({"x-ms-path": "a", b"x-ms-path": "b"})
    assert fields.destination is None
    assert fields.problems == (
        Problem(INVALID_LEGACY_PROPERTY, "x-ms-path appears more than once (under different key types)"),
    )


def test_key_names_are_case_sensitive():
    assert codes(decode_legacy_properties({"X-MS-PATH": "orders"})) == [MISSING_PATH]


# --- x-ms-path ----------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["orders", Symbol("orders"), b"orders", bytearray(b"orders")])
def test_path_string_types(value):
    assert decode_legacy_properties({"x-ms-path": value}) == LegacyFields("orders")


@pytest.mark.parametrize("path", [
    "orders", "a/b/topic", "Orders.v2", "my-queue_1", "a" * 260, "/".join(["abc"] * 50)[:260].rstrip("/"),
])
def test_valid_paths(path):
    assert decode_legacy_properties({"x-ms-path": path}).destination == path


@pytest.mark.parametrize("path, why", [
    ("", "is empty"),
    ("sb://contoso.servicebus.windows.net/orders", "no scheme or host"),
    ("contoso.servicebus.windows.net:5671/orders", "no scheme or host"),
    ("//host/orders", "no scheme or host"),
    ("/orders", "must not start with '/'"),
    ("a" * 261, "longer than 260"),
    ("a//b", "empty segment"),
    ("orders/", "empty segment"),
    ("orders/$DeadLetterQueue", "sub-queue"),
    ("orders/$deadletterqueue", "sub-queue"),
    ("contoso/x-servicebus-transfer/0", "backlog queue"),
    ("contoso/X-ServiceBus-Transfer/3", "backlog queue"),
    ("a/../b", "'..' segment"),
    ("orders queue", "characters other than"),
    ("orders?x=1", "characters other than"),
    ("caf\u00e9", "characters other than"),
])
def test_invalid_paths(path, why):
    fields = decode_legacy_properties({"x-ms-path": path})
    assert fields.destination is None
    assert codes(fields) == [INVALID_DESTINATION]
    assert why in fields.problems[0].reason


def test_invalid_path_reason_never_quotes_secret_looking_text():
    secret = "Endpoint=sb://x/;SharedAccessKeyName=root;SharedAccessKey=abc123"
    reason = decode_legacy_properties({"x-ms-path": secret}).problems[0].reason
    assert "SharedAccessKey" not in reason
    assert f"a {len(secret)}-character value" in reason


def test_short_harmless_invalid_path_is_quoted():
    reason = decode_legacy_properties({"x-ms-path": "/orders"}).problems[0].reason
    assert reason == "x-ms-path '/orders' must not start with '/'"


@pytest.mark.parametrize("value, type_name", [
    (5, "long"), (Int(5), "int"), (ULong(5), "ulong"), (True, "bool"), (1.5, "double"),
    (uuid.UUID(int=1), "uuid"), (Char("a"), "char"), (None, "null"), (["orders"], "list"),
    (Decimal128(bytes(16)), "decimal128"), (Array("string", ["orders"]), "array"), ({"a": 1}, "map"),
    (MapPairs([([1], 2)]), "map"),
    (Described(Symbol("com.microsoft:uri"), "orders"), "described value ('com.microsoft:uri')"),
    (Described(ULong(0x137_00000003), "orders"), "described value (0x13700000003)"),
    (Described(b"d", "orders"), "described value (a binary descriptor)"),
])
def test_path_of_wrong_type_is_an_invalid_legacy_property(value, type_name):
    fields = decode_legacy_properties({"x-ms-path": value})
    assert codes(fields) == [INVALID_LEGACY_PROPERTY]
    assert fields.problems[0].reason == f"x-ms-path must be a string, got {type_name}"


def test_path_of_invalid_utf8_bytes():
    fields = decode_legacy_properties({"x-ms-path": b"\xff\xfe"})
    assert fields.problems == (Problem(INVALID_LEGACY_PROPERTY, "x-ms-path is binary that is not valid UTF-8"),)


# --- x-ms-sessionid -----------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["s-1", Symbol("s-1"), b"s-1"])
def test_session_id_string_types(value):
    fields = decode_one("x-ms-sessionid", value)
    assert (fields.session_id, fields.problems) == ("s-1", ())
    assert type(fields.session_id) is str


def test_session_id_of_128_characters_is_accepted_and_129_rejected():
    assert decode_one("x-ms-sessionid", "s" * 128).session_id == "s" * 128
    fields = decode_one("x-ms-sessionid", "s" * 129)
    assert (fields.session_id, codes(fields)) == (None, [INVALID_LEGACY_PROPERTY])
    assert "longer than 128" in fields.problems[0].reason


def test_empty_session_id_is_kept_as_empty():
    assert decode_one("x-ms-sessionid", "").session_id == ""


@pytest.mark.parametrize("value, type_name", [
    (42, "long"), (uuid.UUID(int=3), "uuid"), (Timestamp(1), "timestamp"), (False, "bool"),
])
def test_session_id_of_wrong_type(value, type_name):
    fields = decode_one("x-ms-sessionid", value)
    assert fields.session_id is None
    assert fields.problems == (Problem(INVALID_LEGACY_PROPERTY, f"x-ms-sessionid must be a string, got {type_name}"),)
    assert fields.destination == "orders"  # one bad property does not hide the others


# --- x-ms-timetolive ----------------------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [
    (Described(TIMESPAN, FIFTEEN_MINUTES_TICKS), timedelta(minutes=15)),
    (Described(TIMESPAN, ULong(10_000_000)), timedelta(seconds=1)),
    (FIFTEEN_MINUTES_TICKS, timedelta(minutes=15)),
    (ULong(FIFTEEN_MINUTES_TICKS), timedelta(minutes=15)),
    (Int(10_000_000), timedelta(seconds=1)),
    (5, timedelta(microseconds=1)),  # 500 ns rounds up: a positive TTL stays positive
    (timedelta(hours=2), timedelta(hours=2)),
    (90.5, timedelta(seconds=90.5)),
    (Float(0.5), timedelta(milliseconds=500)),
    ("PT15M", timedelta(minutes=15)),
    ("P1DT2H", timedelta(days=1, hours=2)),
    ("PT0.5S", timedelta(milliseconds=500)),
    ("P2W", timedelta(weeks=2)),
    ("P1D", timedelta(days=1)),
    (Symbol("PT1H30M"), timedelta(hours=1, minutes=30)),
    ("00:15:00", timedelta(minutes=15)),
    ("1.02:03:04", timedelta(days=1, hours=2, minutes=3, seconds=4)),
    ("00:00:01.5", timedelta(seconds=1.5)),
    ("00:00:00.0000010", timedelta(microseconds=1)),
    ("14.00:00:00", timedelta(days=14)),
])
def test_time_to_live_accepted_encodings(value, expected):
    fields = decode_one("x-ms-timetolive", value)
    assert fields.problems == ()
    assert fields.time_to_live == expected


@pytest.mark.parametrize("value", [
    DOTNET_TIMESPAN_MAX_TICKS,
    Described(TIMESPAN, DOTNET_TIMESPAN_MAX_TICKS),
    "10675199.02:48:05.4775807",  # TimeSpan.MaxValue.ToString()
])
def test_time_to_live_max_value_means_no_ttl(value):
    assert decode_one("x-ms-timetolive", value) == LegacyFields("orders")


@pytest.mark.parametrize("value, reason_part", [
    (0, "must be positive, got 0 ticks"),
    (-10_000_000, "must be positive"),
    (Described(TIMESPAN, 0), "must be positive"),
    (2**63, "out of range"),
    (True, "must be a timespan, got bool"),
    (False, "must be a timespan, got bool"),
    (b"PT15M", "must be a timespan, got binary"),
    (uuid.UUID(int=1), "must be a timespan, got uuid"),
    (Timestamp(1000), "must be a timespan, got timestamp"),
    (Decimal32(5), "must be a timespan, got decimal32"),
    (Char("5"), "must be a timespan, got char"),
    (None, "must be a timespan, got null"),
    (Described(Symbol("com.microsoft:datetime-offset"), 5), "must be a com.microsoft:timespan value"),
    (Described(ULong(0x137_00000003), 5), "must be a com.microsoft:timespan value"),
    (Described(TIMESPAN, "PT1M"), "must describe a long of ticks, got string"),
    (Described(TIMESPAN, True), "must describe a long of ticks, got bool"),
    (0.0, "must be positive"),
    (-1.5, "must be positive"),
    (float("nan"), "finite"),
    (float("inf"), "finite"),
    (1e300, "out of range"),
    (timedelta(0), "must be positive"),
    (timedelta(seconds=-1), "must be positive"),
    ("P1M", "neither an ISO-8601 duration"),  # months have no fixed length
    ("P1Y", "neither an ISO-8601 duration"),
    ("PT", "neither an ISO-8601 duration"),
    ("P1DT", "neither an ISO-8601 duration"),
    ("PT0S", "must be positive"),
    ("-00:15:00", "must be positive"),
    ("00:60:00", "out of range"),
    ("24:00:00", "out of range"),
    ("15 minutes", "neither an ISO-8601 duration"),
    ("", "neither an ISO-8601 duration"),
])
def test_time_to_live_rejections(value, reason_part):
    fields = decode_one("x-ms-timetolive", value)
    assert fields.time_to_live is None
    assert codes(fields) == [INVALID_LEGACY_PROPERTY]
    assert fields.problems[0].reason.startswith("x-ms-timetolive")
    assert reason_part in fields.problems[0].reason


# --- x-ms-scheduledenqueuetimeutc ---------------------------------------------------------------

@pytest.mark.parametrize("value", [
    Timestamp(SCHEDULED_MS),
    SCHEDULED_MS,
    ULong(SCHEDULED_MS),
    SCHEDULED,
    SCHEDULED.replace(tzinfo=None),  # naive: the property is UTC by definition
    SCHEDULED.astimezone(timezone(timedelta(hours=2))),
    "2024-05-01T12:30:15.25Z",
    "2024-05-01T14:30:15.25+02:00",
    "2024-05-01T12:30:15.2500000Z",  # .NET round-trip format, 7 fraction digits
    "2024-05-01T12:30:15.25",
    Symbol("2024-05-01T12:30:15.25Z"),
])
def test_scheduled_enqueue_time_accepted_encodings(value):
    fields = decode_one("x-ms-scheduledenqueuetimeutc", value)
    assert fields.problems == ()
    assert fields.scheduled_enqueue_time == SCHEDULED
    assert fields.scheduled_enqueue_time.utcoffset() == timedelta(0)


def test_scheduled_enqueue_time_before_the_epoch():
    fields = decode_one("x-ms-scheduledenqueuetimeutc", Timestamp(-1000))
    assert fields.scheduled_enqueue_time == datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC)


@pytest.mark.parametrize("value", [
    Timestamp(-62135596800000),
    -62135596800001,
    datetime.min,
    "0001-01-01T00:00:00Z",
])
def test_scheduled_enqueue_time_min_value_means_not_scheduled(value):
    assert decode_one("x-ms-scheduledenqueuetimeutc", value) == LegacyFields("orders")


@pytest.mark.parametrize("value, reason_part", [
    (253402300800000, "out of range"),
    (True, "got bool"),
    (1714566615.25, "got double"),
    (Float(1.0), "got float"),
    (b"2024-05-01T12:30:15Z", "got binary"),
    (uuid.UUID(int=1), "got uuid"),
    (timedelta(minutes=1), "got timedelta"),
    (Described(Symbol("com.microsoft:datetime-offset"), 5), "got described value"),
    ("tomorrow", "is not an ISO-8601 date and time"),
    ("2024-13-01T00:00:00Z", "is not an ISO-8601 date and time"),
    (datetime(1, 1, 1, 0, 30, tzinfo=timezone(timedelta(hours=1))), "out of range"),
])
def test_scheduled_enqueue_time_rejections(value, reason_part):
    fields = decode_one("x-ms-scheduledenqueuetimeutc", value)
    assert fields.scheduled_enqueue_time is None
    assert codes(fields) == [INVALID_LEGACY_PROPERTY]
    assert fields.problems[0].reason.startswith("x-ms-scheduledenqueuetimeutc")
    assert reason_part in fields.problems[0].reason


# --- strip --------------------------------------------------------------------------------------

def test_strip_removes_legacy_keys_of_every_key_type_and_keeps_the_rest_identical():
    big = ULong(2**40)
    described = Described(Symbol("x"), 1)
    payload = b"\x00\x01"
    properties = {
        Symbol("x-ms-path"): "orders",
        b"x-ms-sessionid": b"s",
        "x-ms-timetolive": 5,
        "x-ms-scheduledenqueuetimeutc": 5,
        "big": big,
        Symbol("described"): described,
        b"payload": payload,
        "x-ms-other": "kept",
    }
    stripped = strip_legacy_properties(properties)
    assert list(stripped) == ["big", "described", b"payload", "x-ms-other"]
    assert stripped["big"] is big
    assert stripped["described"] is described
    assert stripped[b"payload"] is payload
    assert type(list(stripped)[1]) is Symbol  # keys are untouched too
    assert len(properties) == 8  # the input is not modified


def test_strip_of_nothing_legacy_is_an_equal_copy():
    properties = {"a": Int(1)}
    stripped = strip_legacy_properties(properties)
    assert stripped == properties and stripped is not properties


@pytest.mark.parametrize("key, legacy", [
    ("x-ms-path", True), (Symbol("x-ms-sessionid"), True), (b"x-ms-timetolive", True),
    ("x-ms-scheduledenqueuetimeutc", True), ("X-MS-PATH", False), (b"\xff", False), (ULong(1), False),
    ("x-ms-other", False),
])
def test_is_legacy_key(key, legacy):
    assert is_legacy_key(key) is legacy


def test_legacy_properties_constant():
    assert LEGACY_PROPERTIES == {"x-ms-path", "x-ms-sessionid", "x-ms-timetolive", "x-ms-scheduledenqueuetimeutc"}


# --- conversions ----------------------------------------------------------------------

def test_tick_conversions():
    assert ticks_to_timedelta(10_000_000) == timedelta(seconds=1)
    assert ticks_to_timedelta(11) == timedelta(microseconds=2)  # rounded up
    assert timedelta_to_ticks(timedelta(seconds=1, microseconds=3)) == 10_000_030
    assert timedelta_to_ticks(ticks_to_timedelta(FIFTEEN_MINUTES_TICKS)) == FIFTEEN_MINUTES_TICKS


def test_time_conversions():
    assert ms_to_datetime(SCHEDULED_MS) == SCHEDULED
    assert datetime_to_ms(SCHEDULED) == SCHEDULED_MS
    assert datetime_to_ms(SCHEDULED.replace(tzinfo=None)) == SCHEDULED_MS
    assert datetime_to_ms(datetime(1969, 12, 31, 23, 59, 59, 999500, tzinfo=UTC)) == -1  # floored
    assert timedelta_to_ms(timedelta(microseconds=1)) == 1
    assert timedelta_to_ms(timedelta(seconds=2)) == 2000
