"""Everything the syphon relies on inside azure-servicebus 7.15.0 that is not its public API, in one place.

The SDK's public API cannot peek the stored bytes of a message, add already-encoded messages to a batch,
take back receive credit, release (rather than abandon) a message, or settle many messages with one
request (completing them, or dead-lettering them with one reason); and its decoder cannot read every
AMQP type legacy clients write. Each of those is one function here, and nothing else in the syphon
touches a private attribute of the SDK. The pinned version is checked: ``check_sdk()`` says exactly what
is missing on another version, and ``tests/unit/test_sdk_internals.py`` fails loudly when the installed
SDK is not the pinned one or lacks one of these attributes.

The decoder patch
-----------------
Teach the azure-servicebus SDK's AMQP decoder the values it cannot read: char, decimal32/64, standard decimal128.

The SDK decodes every received message with ``azure.servicebus._pyamqp._decode``, which looks a
decoder up by constructor byte in the list ``_DECODE_BY_CONSTRUCTOR``. In 7.15.0:

- the entries for char (0x73), decimal32 (0x74) and decimal64 (0x84) are empty, so a message with
  one of them anywhere (an application property, the body, an array) fails with ``'NoneType'
  object is not callable``. Legacy .NET clients send ``char`` values as a matter of course;
- the decimal128 (0x94) decoder reads the exponent the way the legacy WindowsAzure.ServiceBus
  client wrote it (shifted two bits off the IEEE 754 layout), so it reads those right, but a
  standard decimal128 (IEEE 754-2008, binary integer decimal, as current AMQP libraries write it)
  overflows and fails the whole message with ``Invalid AMQP decimal128 encoding``.

A message the SDK cannot decode cannot be received, so the syphon could never settle it (its
PeekLock purge of delivered backlog messages). :func:`install` fills the three empty entries and
wraps the decimal128 decoder, following the SDK's convention ``(buffer: memoryview, depth=0) ->
(remaining memoryview, value)``: char becomes a one-character ``str`` (the SDK hands strings over
as ``bytes``, but a char is not a string; a value beyond U+10FFFF reads as U+FFFD); decimal32 and
decimal64 become ``decimal.Decimal`` (binary integer decimal), as decimal128 already does; a
decimal128 the SDK's own decoder refuses is read as a standard one. The syphon never forwards what
the SDK decodes (it sends spliced raw bytes), so these values only need to be read without failing.

Invariants:
- Only the pinned SDK version is patched, and only when its table looks exactly as expected (the
  three entries empty, decimal128 and the neighbours the SDK's own decoders). Otherwise
  :func:`install` logs a warning and changes nothing: a different SDK may have fixed this itself
  or changed its tables, and guessing would be worse than the original error.
- :func:`install` is idempotent. Every value the SDK decoded before still decodes to the same thing.
"""

from __future__ import annotations

import logging
import queue as queue_module
import struct
import time
from decimal import Decimal

import azure.servicebus
from azure.servicebus import ServiceBusClient, ServiceBusMessageBatch, ServiceBusReceiver, ServiceBusSender
from azure.servicebus._common import constants as sdk_constants
from azure.servicebus.exceptions import ServiceBusError, ServiceBusServerBusyError
from azure.servicebus._pyamqp import _decode as sdk_decode
from azure.servicebus._pyamqp.client import AMQPClient
from azure.servicebus._pyamqp.types import TYPE, VALUE, AMQPTypes

from backlog_syphon.restore.amqp.annotations import ENQUEUED_TIME_ANNOTATION
from backlog_syphon.restore.amqp.values import Decimal32, Decimal64, Decimal128

logger = logging.getLogger(__name__)

PINNED_SDK_VERSION = "7.15.0"

# What each function below uses: (object, attribute). ``check_sdk`` looks every one of them up.
REQUIRED_ATTRIBUTES = (
    (ServiceBusReceiver, "_mgmt_request_response_with_retry"),
    (ServiceBusReceiver, "_check_live"),
    (ServiceBusReceiver, "_settle_message_via_mgmt_link"),
    (ServiceBusReceiver, "_open_with_retry"),
    (ServiceBusReceiver, "_open"),
    (ServiceBusSender, "_open"),
    (ServiceBusSender, "_open_with_retry"),
    (ServiceBusSender, "_create_handler"),
    (ServiceBusReceiver, "_create_handler"),
    (ServiceBusClient, "_create_session_browser"),
    (ServiceBusReceiver, "_backoff"),
    (AMQPClient, "client_ready"),
    (sdk_constants, "_BATCH_MESSAGE_OVERHEAD_COST"),
    (sdk_constants, "REQUEST_RESPONSE_PEEK_OPERATION"),
    (sdk_constants, "MGMT_REQUEST_FROM_SEQUENCE_NUMBER"),
    (sdk_constants, "MGMT_REQUEST_MAX_MESSAGE_COUNT"),
    (sdk_constants, "MGMT_REQUEST_SESSION_ID"),
    (sdk_constants, "ERROR_CODE_MESSAGE_NOT_FOUND"),
    (sdk_constants, "SETTLEMENT_COMPLETE"),
    (sdk_constants, "SETTLEMENT_DEADLETTER"),
    (sdk_constants, "MGMT_REQUEST_DEAD_LETTER_REASON"),
    (sdk_constants, "MGMT_REQUEST_DEAD_LETTER_ERROR_DESCRIPTION"),
    (sdk_decode, "_DECODE_BY_CONSTRUCTOR"),
    (sdk_decode, "_decode_decimal128"),
)


def check_sdk() -> list[str]:
    """What is wrong with the installed SDK for this module: [] for the pinned version with every attribute."""
    problems = []
    if azure.servicebus.__version__ != PINNED_SDK_VERSION:
        problems.append(f"azure-servicebus {azure.servicebus.__version__} is installed; the syphon is pinned to "
                        f"{PINNED_SDK_VERSION}")
    for owner, name in REQUIRED_ATTRIBUTES:
        if not hasattr(owner, name):
            problems.append(f"{getattr(owner, '__name__', owner)}.{name} is missing")
    if error_condition(ServiceBusError("probe", condition=b"amqp:not-allowed")) != "amqp:not-allowed":
        problems.append("ServiceBusError no longer keeps its condition in _condition")
    return problems


# --- peeking stored bytes ----------------------------------------------------------------------

def peek_stored_bytes(receiver, from_sequence_number: int, max_count: int, timeout: float | None = None) -> list[bytes]:
    """The stored bytes of up to ``max_count`` messages with sequence number >= the given one.

    The same management request as ``receiver.peek_messages`` (a session receiver's: that session's messages),
    but each message's raw encoding is kept, so AMQP types (long vs int, described timespans, symbols) survive
    untouched. "No messages" is
    an empty list, however the service says it: status 204 (or 202), or the condition
    ``com.microsoft:message-not-found``, which the SDK would raise as ``MessageNotFoundError``.
    ``timeout`` bounds the request and the SDK's own retries together.
    """
    request = {
        sdk_constants.MGMT_REQUEST_FROM_SEQUENCE_NUMBER: {TYPE: AMQPTypes.long, VALUE: int(from_sequence_number)},
        sdk_constants.MGMT_REQUEST_MAX_MESSAGE_COUNT: int(max_count),
    }
    if getattr(receiver, "_session", None) is not None:  # a session's receiver peeks that session, as the SDK's does
        request[sdk_constants.MGMT_REQUEST_SESSION_ID] = receiver._session_id

    def keep_raw(status_code, message, description, **_):
        if status_code == 200:
            return [bytes(m[b"message"]) for m in (message.value or {}).get(b"messages", [])]
        if status_code in (202, 204):
            return []
        condition = message.application_properties.get(b"errorCondition")
        if condition == sdk_constants.ERROR_CODE_MESSAGE_NOT_FOUND:
            return []
        receiver._amqp_transport.handle_amqp_mgmt_error(  # raises the SDK's mapped exception
            logger, "Message peek failed.", condition, description, status_code)
        return []

    receiver._check_live()
    return on_management_link(lambda: receiver._mgmt_request_response_with_retry(
        sdk_constants.REQUEST_RESPONSE_PEEK_OPERATION, request, keep_raw, timeout=timeout))


def management_handle(client, entity_path: str):
    """A handler that opens a connection and the entity's ``$management`` link only, no receive link: the SDK's
    own session browser (``_SessionBrowser``), made for ``get-message-sessions``. Peeks go through it
    (``peek_stored_bytes``) where a receive link would be refused: a session-enabled entity takes none without a
    session (while the service answers a peek there without a session lock), and a topic takes none at all (while
    its ``$management`` peeks its scheduled messages). ``entity_path`` is the whole path (a subscription's too)."""
    return client._create_session_browser(entity_path)


def management_link_lost(exc: BaseException) -> bool:
    """Whether a management request failed because the entity's ``$management`` link was gone: Service Bus
    detaches a link idle for 10 minutes, and the SDK then raises a generic ``ServiceBusError`` it does not
    retry ("Management Operation error occurred.") and opens the link again with the next request."""
    inner = getattr(exc, "inner_exception", None)
    return isinstance(exc, ServiceBusError) and _MANAGEMENT_LINK_LOST in f"{inner} {exc}"


_MANAGEMENT_LINK_LOST = "Management Operation error occurred"


def on_management_link(request):
    """``request()`` (one management request), made once more, on a link opened again, when the link it went
    out on was gone: the request never reached the entity, so asking again changes nothing."""
    try:
        return request()
    except ServiceBusError as exc:
        if not management_link_lost(exc):
            raise
        logger.info("a management link was closed by the broker (idle): the request goes again on a new one")
        return request()


def link_max_message_size(sender) -> int | None:
    """The largest message the destination's link takes (its attach's max-message-size), once the sender is
    open; None before (or for an object that is not the SDK's sender). The SDK keeps it privately and derives
    its batch limit from it when the link advertises none, which can be above what the entity takes."""
    return getattr(sender, "_max_message_size_on_link", None) or None


def entity_name(handler) -> str:
    """The entity a sender or receiver was made for."""
    return handler._entity_name


# --- clients and their errors ----------------------------------------------------------------------

def emulator_client_options(plain_amqp: bool) -> dict:
    """``ServiceBusClient`` keywords for a token credential against a local emulator: ``use_tls=False`` (what
    a ``UseDevelopmentEmulator=true`` connection string sets) makes the client speak plain AMQP to the
    port given in the fully qualified namespace, instead of TLS on 5671. An undocumented keyword of the
    client (``_common/_configuration.py``)."""
    return {"use_tls": False} if plain_amqp else {}


def token_refusal(exc: BaseException) -> str:
    """What the service answered a refused put-token (its ``status-description``, e.g. "LocalAuthDisabled:
    ..."), which ``ServiceBusAuthenticationError`` does not say itself: it is kept by the SDK's inner
    ``TokenAuthFailure``. '' when there is none."""
    description = getattr(getattr(exc, "inner_exception", None), "status_description", None)
    if isinstance(description, bytes):
        description = description.decode("utf-8", "replace")
    return description or ""


def error_condition(exc: BaseException) -> str | None:
    """The AMQP condition a Service Bus error carries (``"amqp:not-allowed"``), which the SDK keeps only in a
    private attribute (its generic ``ServiceBusError`` is raised for many conditions)."""
    condition = getattr(exc, "_condition", None)
    if isinstance(condition, bytes):
        condition = condition.decode("utf-8", "replace")
    return None if condition is None else str(getattr(condition, "value", condition))


def service_text(exc: BaseException) -> str:
    """What the service said (its error description), without the condition and status code the SDK
    appends to its exceptions' messages."""
    text = str(getattr(exc, "message", None) or exc)
    for marker in (" Error condition: ", " Status Code: "):
        text = text.split(marker, 1)[0]
    return text.strip()


# --- opening links -------------------------------------------------------------------------------

def attach(handler) -> None:
    """Attach a sender's or receiver's link now, without sending or receiving (a probe of access)."""
    handler._open()


def open_with_retry(handler) -> None:
    """Open a handler the way its first operation would (with the SDK's retries)."""
    handler._open_with_retry()


# The SDK reads one frame of a link's handshake per call of its client's ``client_ready`` and naps this
# long between calls (sender and receiver ``_open``, ``SendClient._send_message_impl``).
SDK_HANDSHAKE_NAP_SECONDS = 0.05
_FRAMES_PER_NAP = 16  # what one nap's worth of reading may take at most (a handshake is about ten)


def prompt(handler):
    """``handler`` (a sender or receiver, not opened yet), made to open and close without the SDK's idle
    waits; returns it. Nothing else about it changes: the frames, the retries, the errors are the SDK's.

    - Opening: a link's handshake is about ten frames (SASL, open, begin, the two CBS links, the token,
      the attach), and the SDK naps 50 ms after reading each, so a link took half a second to open on
      any network. Here each ``client_ready`` call goes on reading frames as they arrive for those
      50 ms (a read blocks until a frame comes, at most the transport's read timeout), so a link opens
      in its round trips.
    - Closing (also the close of a failed open): the client sends the detach, end and close frames at
      once, then joins its keep-alive thread, which sleeps in whole seconds: half a second on average,
      per link. Here the join is left out: the thread sees the client closed when it wakes, and ends
      (a daemon thread).
    """
    if not isinstance(handler, (ServiceBusSender, ServiceBusReceiver)):
        return handler  # not the SDK's (a test's stand-in)
    create_handler = handler._create_handler

    def create_prompt_handler(*args, **kwargs):
        create_handler(*args, **kwargs)
        client = handler._handler
        client_ready, close = client.client_ready, client.close

        def ready_within_a_nap() -> bool:
            until = time.monotonic() + SDK_HANDSHAKE_NAP_SECONDS
            for _ in range(_FRAMES_PER_NAP):  # bounded: a closed connection answers at once, without a read
                if client_ready():
                    return True
                if time.monotonic() >= until:
                    break
            return False

        def close_without_joining() -> None:
            client._keep_alive_thread = None
            close()

        client.client_ready, client.close = ready_within_a_nap, close_without_joining

    handler._create_handler = create_prompt_handler
    return handler


def busy_answers_raise(handler):
    """``handler`` (a receiver, not opened yet), made to raise a server-busy answer at once instead of waiting
    and asking again itself; returns it. The SDK retries ``ServiceBusServerBusyError`` like any retryable error
    (``retry_total`` times, 1, 2, 4 s apart): a process pacing a namespace's credits (``credits``) must see
    every busy answer when it comes, to slow down, and decides itself when to ask again. Every other error
    is retried by the SDK as before."""
    if not isinstance(handler, ServiceBusReceiver):
        return handler  # not the SDK's (a test's stand-in)
    backoff = handler._backoff

    def backoff_unless_busy(*args, **kwargs):
        last = kwargs.get("last_exception", args[1] if len(args) > 1 else None)
        if isinstance(last, ServiceBusServerBusyError):
            raise last
        return backoff(*args, **kwargs)

    handler._backoff = backoff_unless_busy
    return handler


# --- batches of already-encoded messages ---------------------------------------------------------

def add_encoded_to_batch(batch: ServiceBusMessageBatch, encoded: bytes, *, message_id, session_id, partition_key,
                         reserve_bytes: int) -> bool:
    """Add an encoded AMQP message to a batch exactly as it is; False when it does not fit (with
    ``reserve_bytes`` kept free). The same bookkeeping as ``ServiceBusMessageBatch.add_message``, without
    the SDK's re-encoding, which cannot express every AMQP body."""
    size = len(encoded)
    overhead = sdk_constants._BATCH_MESSAGE_OVERHEAD_COST[0 if size < 256 else 1]
    size_after = batch._size + size + overhead
    if size_after + reserve_bytes > batch.max_size_in_bytes:
        return False
    batch._message[5].append(encoded)  # the envelope's Data sections
    batch._size = size_after
    batch._count += 1
    if batch._count == 1:  # the envelope names its first message, as add_message does
        batch._amqp_transport.set_batch_envelope_properties(batch._message, message_id, session_id, partition_key)
    return True


# --- receiving for the purge ---------------------------------------------------------------------

def received_identity(message) -> tuple[int, int | None]:
    """``(sequence number, enqueue time in ms)`` of a received message, from the broker's annotations as
    they arrived (the public ``enqueued_time_utc`` goes through a float)."""
    annotations = message.raw_amqp_message.annotations or {}
    enqueued = annotations.get(ENQUEUED_TIME_ANNOTATION.encode())
    return message.sequence_number, None if enqueued is None else int(enqueued)


def revoke_credit(receiver) -> None:
    """Take back the receive credit the SDK leaves open, and release what it brought in.

    azure-servicebus 7.15.0 leaves the unused credit of a receive call that returns early open, and
    grants one credit more whenever a call uses up its credit before its batch is full; messages
    that arrive on such credit are locked. This sets the credit to 0 (a drain) and releases what is
    buffered (no delivery count). Transfers the broker sent before it saw the drain can still be on
    their way: a later call on the same connection reads them first (the next receive call counts
    them against its credit; the purge's closing peek is answered only after them, and the SDK
    releases what arrives outside a receive call).
    """
    handler = getattr(receiver, "_handler", None)
    link = getattr(handler, "_link", None)
    if link is None or getattr(link, "_is_closed", True):
        return
    if link.current_link_credit > 0:
        link.flow(link_credit=0, drain=True)
    release_buffered(receiver)


def release_buffered(receiver) -> None:
    """Release every message the SDK holds in its buffer (received outside, or beyond, a receive call)."""
    handler = receiver._handler
    while True:
        try:
            frame, _ = handler._received_messages.get_nowait()
        except queue_module.Empty:
            return
        handler.settle_messages(frame[1], frame[2], "released")
        handler._received_messages.task_done()


def release_message(receiver, message) -> None:
    """Give a received message back without settling it: unlike abandon, its delivery count stays."""
    receiver._handler.settle_messages(message._delivery_id, message._delivery_tag, "released")


def complete_by_lock_tokens(receiver, lock_tokens: list) -> None:
    """Complete many received messages with one management ``update-disposition`` request (the SDK's
    own fallback form of settlement)."""
    on_management_link(lambda: receiver._settle_message_via_mgmt_link(sdk_constants.SETTLEMENT_COMPLETE, lock_tokens))


def dead_letter_by_lock_tokens(receiver, lock_tokens: list, reason: str, description: str) -> None:
    """Dead-letter many received messages with one reason in one ``update-disposition`` request: status
    ``suspended`` with ``deadletter-reason`` and ``deadletter-description``, what the SDK's
    ``dead_letter_message`` sends for one message when its receive link cannot settle it."""
    details = {sdk_constants.MGMT_REQUEST_DEAD_LETTER_REASON: reason,
               sdk_constants.MGMT_REQUEST_DEAD_LETTER_ERROR_DESCRIPTION: description}
    on_management_link(lambda: receiver._settle_message_via_mgmt_link(sdk_constants.SETTLEMENT_DEADLETTER,
                                                                       lock_tokens, dead_letter_details=details))


# --- the decoder patch ---------------------------------------------------------------------------

CHAR, DECIMAL32, DECIMAL64, DECIMAL128 = 0x73, 0x74, 0x84, 0x94

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


def _decode_char(buffer: memoryview, _depth: int = 0) -> tuple[memoryview, str]:
    code_point = _U32.unpack(buffer[:4])[0]
    return buffer[4:], chr(code_point) if code_point <= 0x10FFFF else "\ufffd"


def _decode_decimal32(buffer: memoryview, _depth: int = 0) -> tuple[memoryview, Decimal]:
    return buffer[4:], Decimal32(_U32.unpack(buffer[:4])[0]).to_decimal()


def _decode_decimal64(buffer: memoryview, _depth: int = 0) -> tuple[memoryview, Decimal]:
    return buffer[8:], Decimal64(_U64.unpack(buffer[:8])[0]).to_decimal()


def _decode_decimal128(buffer: memoryview, depth: int = 0) -> tuple[memoryview, Decimal]:
    try:
        return sdk_decode._decode_decimal128(buffer, depth)  # the legacy .NET layout, as the SDK reads it
    except ValueError:
        return buffer[16:], Decimal128(buffer[:16].tobytes()).to_decimal()


_PATCHED = {CHAR: _decode_char, DECIMAL32: _decode_decimal32, DECIMAL64: _decode_decimal64,
            DECIMAL128: _decode_decimal128}
# The SDK's own decoders that must sit in these slots before patching (a check of the table's layout).
_EXPECTED_BEFORE = {CHAR: None, DECIMAL32: None, DECIMAL64: None,
                    DECIMAL128: getattr(sdk_decode, "_decode_decimal128", object()),
                    0x72: getattr(sdk_decode, "_decode_float", object()),
                    0x83: getattr(sdk_decode, "_decode_timestamp", object()),
                    0x98: getattr(sdk_decode, "_decode_uuid", object())}


def install_decoder_patch() -> bool:
    """Patch the SDK's decoder table once per process; True if char and the decimals now decode."""
    if decoder_patch_installed():
        return True
    version = azure.servicebus.__version__
    table = getattr(sdk_decode, "_DECODE_BY_CONSTRUCTOR", None)
    if version != PINNED_SDK_VERSION:
        logger.warning("azure-servicebus %s is not the pinned %s: its AMQP decoder is left unpatched, so receiving "
                       "messages with char, decimal32/64 or standard decimal128 values may fail",
                       version, PINNED_SDK_VERSION)
        return False
    if not (_is_table(table) and all(table[code] is decoder for code, decoder in _EXPECTED_BEFORE.items())):
        logger.warning("azure-servicebus %s's AMQP decoder table is not laid out as expected: left unpatched, so "
                       "receiving messages with char, decimal32/64 or standard decimal128 values may fail", version)
        return False
    for code, decoder in _PATCHED.items():
        table[code] = decoder
    logger.info("azure-servicebus AMQP decoder taught char, decimal32, decimal64 and standard decimal128")
    return True


def decoder_patch_installed() -> bool:
    """Whether the SDK's decoder table holds this module's decoders."""
    table = getattr(sdk_decode, "_DECODE_BY_CONSTRUCTOR", None)
    return _is_table(table) and all(table[code] is decoder for code, decoder in _PATCHED.items())


def _is_table(table) -> bool:
    return isinstance(table, list) and len(table) == 256
