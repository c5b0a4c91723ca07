"""The limits a real Service Bus namespace enforces, as numbers, and the ranges its configuration accepts.

Every figure here is the service's (docs/emulator.md cites each source); a namespace setting may change
the ones a test needs to change (``service_settings``), never by default. No I/O, no imports of the
emulator's other modules, so both configuration readers (YAML and ``Config.json``) use the same ranges.

Invariants:
- a range check returns None for an allowed value, else what the value must be; the caller adds the
  key's path and the value as given (each in its own file's vocabulary).
"""
from __future__ import annotations

from typing import Optional

# messages in one batch (a 0x80013700 envelope): Standard refuses more than 4,500; Premium takes about
# 15,000 (the service team's figure, never documented: a conservative round number)
STANDARD_MAX_MESSAGES_PER_BATCH = 4500
PREMIUM_MAX_MESSAGES_PER_BATCH = 15000
# a batch is at most 1 MB on every tier, even where single messages may be larger (Premium large
# messages); the SDK's own fallback (MAX_BATCH_SIZE_PREMIUM) counts a megabyte as 1024 * 1024 bytes
MAX_BATCH_BYTES = 1024 * 1024
# "Maximum number of messages returned in PeekMessagesAsync call: 250"
MAX_PEEK_MESSAGES = 250
# the old (SBMP) partitioning doc: a peek returns at most about 256 KB of messages
DEFAULT_PEEK_PAGE_BYTES = 256 * 1024

# partitions: always 16 for a partitioned Standard entity; 1, 2 or 4 in a partitioned Premium namespace
STANDARD_PARTITIONS = 16
PREMIUM_PARTITION_COUNTS = (1, 2, 4)

# lock duration: at most 5 minutes; at least 5 seconds (the portal's, ARM's and the official emulator's
# minimum). A namespace with allow_short_locks takes anything above zero (tests only).
MIN_LOCK_DURATION_SECONDS = 5.0
MAX_LOCK_DURATION_SECONDS = 300.0
# duplicate detection history window, when detection is on: 20 seconds to 7 days
MIN_DUPLICATE_DETECTION_WINDOW_SECONDS = 20.0
MAX_DUPLICATE_DETECTION_WINDOW_SECONDS = 7 * 24 * 3600.0

# a queue's or subscription's max delivery count: at least 1, at most Int32.MaxValue (the .NET type)
MAX_DELIVERY_COUNT = 2147483647

# throttling (Standard and Basic): 1,000 credits a second per namespace; a send, receive or peek costs one per
# message, a management operation on an entity (create, read, update, delete) ten; Premium has no credits
STANDARD_CREDITS_PER_SECOND = 1000.0
MANAGEMENT_OPERATION_CREDITS = 10

# sizes: each property at most 32 KB, all properties together (system properties included) at most 64 KB,
# MessageId and SessionId at most 128 characters
MAX_PROPERTY_BYTES = 32 * 1024
MAX_HEADER_BYTES = 64 * 1024
MAX_ID_CHARACTERS = 128

# AMQP connections per namespace, on every tier
MAX_CONNECTIONS = 5000

# expired messages stay (peekable) until a receive meets them or the service's garbage collection runs; how
# often it runs is not documented: the emulator sweeps once a minute
EXPIRY_SWEEP_SECONDS = 60.0

# idle timers: a link without a transfer for 10 minutes is detached; a connection whose links have
# all been gone for 5 minutes, or that opened none within 1 minute, is closed
LINK_IDLE_TIMEOUT_SECONDS = 600.0
CONNECTION_IDLE_TIMEOUT_SECONDS = 300.0
NEW_CONNECTION_IDLE_TIMEOUT_SECONDS = 60.0


def lock_duration_error(seconds: float, *, allow_short_locks: bool = False) -> Optional[str]:
    """What a lock duration of ``seconds`` must be instead, or None when the service accepts it."""
    if allow_short_locks:
        if 0 < seconds <= MAX_LOCK_DURATION_SECONDS:
            return None
        return f"must be above 0 and at most {MAX_LOCK_DURATION_SECONDS:g} seconds (allow_short_locks is on)"
    if MIN_LOCK_DURATION_SECONDS <= seconds <= MAX_LOCK_DURATION_SECONDS:
        return None
    return (f"must be {MIN_LOCK_DURATION_SECONDS:g} to {MAX_LOCK_DURATION_SECONDS:g} seconds (5 seconds to "
            f"5 minutes, as Service Bus allows)")


def duplicate_detection_window_error(seconds: float) -> Optional[str]:
    """What the window of an entity with duplicate detection on must be instead of ``seconds``, or None."""
    if MIN_DUPLICATE_DETECTION_WINDOW_SECONDS <= seconds <= MAX_DUPLICATE_DETECTION_WINDOW_SECONDS:
        return None
    return (f"must be {MIN_DUPLICATE_DETECTION_WINDOW_SECONDS:g} to {MAX_DUPLICATE_DETECTION_WINDOW_SECONDS:g} "
            f"seconds (20 seconds to 7 days) while duplicate detection is on")
