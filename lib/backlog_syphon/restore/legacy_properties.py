"""Decode the four ``x-ms-*`` application properties the legacy paired-namespace client writes.

The legacy .NET client (``MessagingFactory.PairNamespaceAsync``) moves a message's SessionId,
TimeToLive and ScheduledEnqueueTimeUtc into application properties before sending it to a backlog
queue, and adds the destination path relative to the primary namespace. On the wire these are a
string, a string, a ``com.microsoft:timespan`` described long of .NET ticks and an AMQP timestamp.
This module turns those properties back into typed values, with no I/O.

Invariants:
- Values are those of :mod:`backlog_syphon.restore.amqp.values` (``Symbol``, ``Char``, ``Timestamp``,
  ``Described``...). The legacy encodings are accepted exactly: ``x-ms-path`` and
  ``x-ms-sessionid`` strings, the ``com.microsoft:timespan`` described long of .NET ticks, and an
  AMQP timestamp. The same values as the azure-servicebus SDK hands them over (bytes strings, bare
  int ticks, int milliseconds) are accepted too. Other encodings are accepted only where their
  meaning is unambiguous.
- Anything else is rejected with a :class:`Problem` whose reason names the property and what was
  wrong. Reasons quote a value only when it is short and made of harmless characters, so a stray
  connection string in a property never reaches a log or an audit row.
- Nothing here raises for bad input: every problem is collected so the caller can dead-letter the
  message with all reasons at once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from backlog_syphon.model import ReasonCode
from backlog_syphon.restore.amqp.describing import amqp_type_name, quote
from backlog_syphon.restore.amqp.values import (
    Char,
    Decimal32,
    Decimal64,
    Decimal128,
    Described,
    Symbol,
    Timestamp,
    ms_to_datetime,
)
from backlog_syphon.restore.queue_names import BACKLOG_QUEUE_SEGMENT

PATH_PROPERTY = "x-ms-path"
SESSION_ID_PROPERTY = "x-ms-sessionid"
TIME_TO_LIVE_PROPERTY = "x-ms-timetolive"
SCHEDULED_ENQUEUE_TIME_PROPERTY = "x-ms-scheduledenqueuetimeutc"
LEGACY_PROPERTIES = frozenset(
    {PATH_PROPERTY, SESSION_ID_PROPERTY, TIME_TO_LIVE_PROPERTY, SCHEDULED_ENQUEUE_TIME_PROPERTY}
)

PING_CONTENT_TYPE = "application/vnd.ms-servicebus-ping"

TICKS_PER_SECOND = 10_000_000
TICKS_PER_MICROSECOND = 10
# TimeSpan.MaxValue: the legacy client's "no time to live".
DOTNET_TIMESPAN_MAX_TICKS = 2**63 - 1
TIMESPAN_DESCRIPTOR = "com.microsoft:timespan"

# DateTime.MinValue (0001-01-01T00:00:00Z) in ms since the Unix epoch: the legacy "not scheduled".
DOTNET_DATETIME_MIN_MS = -62_135_596_800_000
# DateTime.MaxValue truncated to ms; Python's datetime ends at the same instant.
DOTNET_DATETIME_MAX_MS = 253_402_300_799_999

MAX_ENTITY_PATH_LENGTH = 260
MAX_SESSION_ID_LENGTH = 128

# Problem codes; the classification turns them into dead-letter reason codes unchanged.
MISSING_PATH = ReasonCode.MISSING_PATH
INVALID_DESTINATION = ReasonCode.INVALID_DESTINATION
INVALID_LEGACY_PROPERTY = ReasonCode.INVALID_LEGACY_PROPERTY

_ENTITY_SEGMENT = re.compile(r"[A-Za-z0-9._-]+")
# Only fixed-length units: years and months have no fixed duration, so they are ambiguous.
_ISO_DURATION = re.compile(
    r"P(?:(?P<weeks>\d+)W)?(?:(?P<days>\d+)D)?"
    r"(?:T(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?"
)
# .NET TimeSpan "c" format: [-][d.]hh:mm:ss[.fffffff]
_DOTNET_TIMESPAN = re.compile(
    r"(?P<sign>-)?(?:(?P<days>\d+)\.)?(?P<hours>\d{1,2}):(?P<minutes>\d{1,2}):(?P<seconds>\d{1,2})"
    r"(?:\.(?P<fraction>\d{1,7}))?"
)


@dataclass(frozen=True)
class Problem:
    """Why a backlog message cannot be restored: a stable ``code`` and a human ``reason``."""

    code: str
    reason: str


@dataclass(frozen=True)
class LegacyFields:
    """The restored values of the four legacy properties; ``None`` where a value is absent or invalid."""

    destination: str | None = None
    session_id: str | None = None
    time_to_live: timedelta | None = None
    scheduled_enqueue_time: datetime | None = None
    problems: tuple[Problem, ...] = ()


# --- conversions -------------------------------------------------------------------------------

def ticks_to_timedelta(ticks: int) -> timedelta:
    """.NET ticks (100 ns) to a timedelta, rounded up to whole microseconds so a positive TTL stays positive."""
    return timedelta(microseconds=-(-ticks // TICKS_PER_MICROSECOND))


def timedelta_to_ticks(value: timedelta) -> int:
    """A timedelta to .NET ticks (exact: a timedelta has microsecond resolution)."""
    return (value // timedelta(microseconds=1)) * TICKS_PER_MICROSECOND


def timedelta_to_ms(value: timedelta) -> int:
    """A timedelta in whole milliseconds, rounded up so a positive duration never becomes zero."""
    return -(-value // timedelta(milliseconds=1))


# --- decoding ----------------------------------------------------------------------------------

def decode_legacy_properties(application_properties: Mapping) -> LegacyFields:
    """Decode the legacy properties of one backlog message; problems are collected, never raised."""
    problems: list[Problem] = []
    values, ambiguous = _legacy_values(application_properties)
    for name in sorted(ambiguous):
        problems.append(Problem(INVALID_LEGACY_PROPERTY, f"{name} appears more than once (under different key types)"))

    destination = None
    if PATH_PROPERTY in ambiguous:
        pass  # already reported; "missing" would be misleading
    elif PATH_PROPERTY not in values:
        problems.append(Problem(MISSING_PATH, f"{PATH_PROPERTY} is missing, so the destination is unknown"))
    else:
        destination = _collect(_decode_destination, values[PATH_PROPERTY], problems)

    session_id = None
    if SESSION_ID_PROPERTY in values:
        session_id = _collect(_decode_session_id, values[SESSION_ID_PROPERTY], problems)

    time_to_live = None
    if TIME_TO_LIVE_PROPERTY in values:
        time_to_live = _collect(_decode_time_to_live, values[TIME_TO_LIVE_PROPERTY], problems)

    scheduled = None
    if SCHEDULED_ENQUEUE_TIME_PROPERTY in values:
        scheduled = _collect(_decode_scheduled_enqueue_time, values[SCHEDULED_ENQUEUE_TIME_PROPERTY], problems)

    return LegacyFields(destination, session_id, time_to_live, scheduled, tuple(problems))


def strip_legacy_properties(application_properties: Mapping) -> dict:
    """The same properties without the four legacy keys (in any key type); other entries are the same objects."""
    return {key: value for key, value in application_properties.items() if not is_legacy_key(key)}


def is_legacy_key(key) -> bool:
    """Whether an application-property key is one of the four legacy names (as string, symbol or UTF-8 binary)."""
    return _key_text(key) in LEGACY_PROPERTIES


class _Rejected(Exception):
    """Internal: one property value was rejected; carries the Problem."""

    def __init__(self, problem: Problem):
        super().__init__(problem.reason)
        self.problem = problem


def _collect(decode, value, problems: list[Problem]):
    try:
        return decode(value)
    except _Rejected as rejected:
        problems.append(rejected.problem)
        return None


def _legacy_values(application_properties: Mapping) -> tuple[dict, set[str]]:
    """The legacy entries keyed by their text name, and the names present under two key types (ambiguous)."""
    found: dict = {}
    ambiguous: set[str] = set()
    for key, value in application_properties.items():
        name = _key_text(key)
        if name not in LEGACY_PROPERTIES:
            continue
        if name in found:
            ambiguous.add(name)
        found[name] = value
    for name in ambiguous:
        del found[name]
    return found, ambiguous


def _key_text(key) -> str | None:
    if isinstance(key, str):  # also Symbol
        return str(key)
    if isinstance(key, (bytes, bytearray, memoryview)):
        try:
            return bytes(key).decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None


def _invalid(reason: str) -> _Rejected:
    return _Rejected(Problem(INVALID_LEGACY_PROPERTY, reason))


def _text(name: str, value) -> str:
    """A string property as str: str or symbol, and utf-8 bytes where the SDK hands strings over as bytes."""
    if isinstance(value, Char):  # a single AMQP char is not a string
        raise _invalid(f"{name} must be a string, got {amqp_type_name(value)}")
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (bytes, bytearray)) and not isinstance(value, Decimal128):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise _invalid(f"{name} is binary that is not valid UTF-8") from None
    raise _invalid(f"{name} must be a string, got {amqp_type_name(value)}")


def _decode_destination(value) -> str:
    path = _text(PATH_PROPERTY, value)
    why = entity_path_problem(path)
    if why is not None:
        raise _Rejected(Problem(INVALID_DESTINATION, f"{PATH_PROPERTY} {quote(path)} {why}"))
    return path


def entity_path_problem(path: str) -> str | None:
    """Why ``path`` is not a queue or topic path this syphon may send to, or None if it is one.

    The path is relative to the primary namespace; queue and topic names may contain '/'.
    """
    if path == "":
        return "is empty"
    if ":" in path or "\\" in path or path.startswith("//"):
        return "must be relative to the namespace (no scheme or host)"
    if path.startswith("/"):
        return "must not start with '/'"
    if len(path) > MAX_ENTITY_PATH_LENGTH:
        return f"is longer than {MAX_ENTITY_PATH_LENGTH} characters"
    for segment in path.split("/"):
        if segment == "":
            return "has an empty segment"
        if segment.startswith("$"):
            return "names a sub-queue (a '$' segment), which cannot be sent to"
        if segment.lower() == BACKLOG_QUEUE_SEGMENT:
            return "names a backlog queue; sending there would loop"
        if segment in (".", ".."):
            return "has a '.' or '..' segment"
        if not _ENTITY_SEGMENT.fullmatch(segment):
            return "contains characters other than letters, digits, '.', '-', '_' and '/'"
    return None


def _decode_session_id(value) -> str:
    session_id = _text(SESSION_ID_PROPERTY, value)
    if len(session_id) > MAX_SESSION_ID_LENGTH:
        raise _invalid(f"{SESSION_ID_PROPERTY} is longer than {MAX_SESSION_ID_LENGTH} characters")
    return session_id


def _decode_time_to_live(value) -> timedelta | None:
    """Ticks (described or bare), timedelta, float seconds, ISO-8601 or .NET TimeSpan string."""
    name = TIME_TO_LIVE_PROPERTY
    if isinstance(value, Described):
        if not (isinstance(value.descriptor, Symbol) and value.descriptor == TIMESPAN_DESCRIPTOR):
            raise _invalid(f"{name} must be a {TIMESPAN_DESCRIPTOR} value, got {amqp_type_name(value)}")
        if not _is_plain_integer(value.value):
            raise _invalid(f"{name} must describe a long of ticks, got {amqp_type_name(value.value)}")
        return _ticks_time_to_live(value.value)
    if _is_plain_integer(value):
        return _ticks_time_to_live(value)
    if isinstance(value, timedelta):
        return _positive_time_to_live(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _invalid(f"{name} must be a finite number of seconds, got {value}")
        try:
            return _positive_time_to_live(timedelta(seconds=value))
        except OverflowError:
            raise _invalid(f"{name} of {value} seconds is out of range") from None
    if isinstance(value, str) and not isinstance(value, Char):
        return _parse_time_to_live_text(str(value))
    raise _invalid(f"{name} must be a timespan, got {amqp_type_name(value)}")


def _is_plain_integer(value) -> bool:
    """An AMQP integer; bool and timestamp are int subclasses but mean something else."""
    return isinstance(value, int) and not isinstance(
        value, (bool, Timestamp, Decimal32, Decimal64)
    )


def _ticks_time_to_live(ticks: int) -> timedelta | None:
    if ticks == DOTNET_TIMESPAN_MAX_TICKS:
        return None  # TimeSpan.MaxValue: "no TTL"; the legacy client does not write it, but be lenient
    if ticks <= 0:
        raise _invalid(f"{TIME_TO_LIVE_PROPERTY} must be positive, got {ticks} ticks")
    if ticks > DOTNET_TIMESPAN_MAX_TICKS:
        raise _invalid(f"{TIME_TO_LIVE_PROPERTY} of {ticks} ticks is out of range")
    return ticks_to_timedelta(ticks)


def _positive_time_to_live(value: timedelta) -> timedelta | None:
    return _ticks_time_to_live(timedelta_to_ticks(value))


def _parse_time_to_live_text(text: str) -> timedelta | None:
    iso = _ISO_DURATION.fullmatch(text)
    if iso and any(iso.groupdict().values()) and not text.endswith("T"):
        parts = {unit: float(amount) if unit == "seconds" else int(amount)
                 for unit, amount in iso.groupdict().items() if amount is not None}
        try:
            return _positive_time_to_live(timedelta(**parts))
        except OverflowError:
            raise _invalid(f"{TIME_TO_LIVE_PROPERTY} {quote(text)} is out of range") from None
    dotnet = _DOTNET_TIMESPAN.fullmatch(text)
    if dotnet:
        hours, minutes, seconds = (int(dotnet[unit]) for unit in ("hours", "minutes", "seconds"))
        if hours > 23 or minutes > 59 or seconds > 59:
            raise _invalid(f"{TIME_TO_LIVE_PROPERTY} {quote(text)} has hours, minutes or seconds out of range")
        ticks = ((int(dotnet["days"] or 0) * 24 + hours) * 60 + minutes) * 60 + seconds
        ticks = ticks * TICKS_PER_SECOND + int((dotnet["fraction"] or "0").ljust(7, "0"))
        return _ticks_time_to_live(-ticks if dotnet["sign"] else ticks)
    raise _invalid(
        f"{TIME_TO_LIVE_PROPERTY} {quote(text)} is neither an ISO-8601 duration of days, hours, minutes and "
        "seconds (PT15M) nor a .NET TimeSpan ([-][d.]hh:mm:ss[.fffffff])"
    )


def _decode_scheduled_enqueue_time(value) -> datetime | None:
    """Timestamp or int ms since the epoch, datetime, or ISO-8601 string; naive values are UTC."""
    name = SCHEDULED_ENQUEUE_TIME_PROPERTY
    if isinstance(value, int) and not isinstance(value, (bool, Decimal32, Decimal64)):
        if value <= DOTNET_DATETIME_MIN_MS:
            return None  # DateTime.MinValue: not scheduled
        if value > DOTNET_DATETIME_MAX_MS:
            raise _invalid(f"{name} of {value} ms since the Unix epoch is out of range")
        return ms_to_datetime(value)
    if isinstance(value, datetime):
        return _utc_scheduled_time(value)
    if isinstance(value, str) and not isinstance(value, Char):
        try:
            parsed = datetime.fromisoformat(str(value))
        except ValueError:
            raise _invalid(f"{name} {quote(str(value))} is not an ISO-8601 date and time") from None
        return _utc_scheduled_time(parsed)
    raise _invalid(f"{name} must be a timestamp, got {amqp_type_name(value)}")


def _utc_scheduled_time(value: datetime) -> datetime | None:
    # The property is explicitly UTC, so a naive value means UTC rather than local time.
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    try:
        utc = value.astimezone(timezone.utc)
    except OverflowError:
        raise _invalid(f"{SCHEDULED_ENQUEUE_TIME_PROPERTY} is out of range") from None
    if utc == datetime.min.replace(tzinfo=timezone.utc):
        return None  # DateTime.MinValue: not scheduled
    return utc
