"""The names Service Bus gives its message annotations, and the application properties it adds to a
message it dead-letters. Each is defined here only."""

from __future__ import annotations

# The broker's identity of a stored message within one queue (see ``sections.broker_identity``).
SEQUENCE_NUMBER_ANNOTATION = "x-opt-sequence-number"
ENQUEUED_TIME_ANNOTATION = "x-opt-enqueued-time"
PARTITION_KEY_ANNOTATION = "x-opt-partition-key"
SCHEDULED_ENQUEUE_TIME_ANNOTATION = "x-opt-scheduled-enqueue-time"

# A stored message's state on a peek: 0 active, 1 deferred, 2 scheduled (``model.MessageState``).
MESSAGE_STATE_ANNOTATION = "x-opt-message-state"

# The partition of a partitioned entity that stored a message (on every message received or peeked from one).
PARTITION_ID_ANNOTATION = "x-opt-partition-id"

# Set by the broker on delivery; stale on a re-sent copy, so they are dropped. The partition id names a
# partition of the backlog queue, not of the destination, which chooses its own from the message's keys
# (the partition key, ``x-opt-partition-key``, is the sender's and is kept). The offset is the Event Hubs
# style position some brokers add.
BROKER_OWNED_ANNOTATIONS = frozenset({
    SEQUENCE_NUMBER_ANNOTATION,
    ENQUEUED_TIME_ANNOTATION,
    PARTITION_ID_ANNOTATION,
    "x-opt-locked-until",
    "x-opt-enqueue-sequence-number",
    "x-opt-lock-token",
    "x-opt-deadletter-source",
    MESSAGE_STATE_ANNOTATION,
    "x-opt-offset",
})

# The application properties Service Bus adds to a message it dead-letters: a re-drive removes them, so
# the destination gets the message as its sender wrote it (the audit row keeps them).
DEAD_LETTER_REASON_PROPERTY = "DeadLetterReason"
DEAD_LETTER_DESCRIPTION_PROPERTY = "DeadLetterErrorDescription"
DEAD_LETTER_PROPERTIES = frozenset({DEAD_LETTER_REASON_PROPERTY, DEAD_LETTER_DESCRIPTION_PROPERTY})
