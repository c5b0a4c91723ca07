"""What the syphon relies on inside the SDK: the pinned version's private attributes (``check_sdk``), and the
AMQP decoder taught char and decimal32/64, proven on the SDK's own receive-path decoder."""

import logging
from decimal import Decimal

import azure.servicebus
import pytest
from azure.servicebus import ServiceBusReceivedMessage
from azure.servicebus._pyamqp import _decode
from azure.servicebus._pyamqp._decode import decode_payload

from backlog_syphon.servicebus import sdk_internals
from backlog_syphon.restore.amqp.message import DecodedMessage, MessageProperties
from backlog_syphon.restore.amqp.values import Array, Char, Decimal32, Decimal64, Decimal128, Described, Symbol

D32 = Decimal32.from_decimal(Decimal("1.5"))
D64 = Decimal64.from_decimal(Decimal("-2.25"))
D128 = Decimal128.from_decimal(Decimal("3.75"))
# 3.75 as the legacy WindowsAzure.ServiceBus client wrote it: sign | exponent >> 9, (exponent & 0x7F) << 1,
# two zero bytes, then the 96-bit coefficient (exponent 6176 - 2 = 0x181E).
LEGACY_D128 = Decimal128(bytes([0x181E >> 9, (0x181E & 0x7F) << 1, 0, 0]) + (375).to_bytes(12, "big"))

MESSAGES = {
    "application-properties": DecodedMessage(
        properties=MessageProperties(message_id="m-1"),
        application_properties={"char": Char("z"), "d32": D32, "d64": D64, "d128": D128, "astral": Char("\U0001F600")},
        body=(b"payload",)),
    "value-body-char": DecodedMessage(body_kind="value", body=Char("c")),
    "value-body-map": DecodedMessage(body_kind="value", body={
        "list": [Char("a"), D32, D64], "decimal": D128, "span": Described(Symbol("x"), Char("b"))}),
    "arrays": DecodedMessage(body_kind="value", body=[
        Array("char", ["x", "y"]), Array("decimal32", [D32]), Array("decimal64", [D64, D64]),
        Array("decimal128", [D128])]),
    "sequence-body": DecodedMessage(body_kind="sequence", body=([Char("s"), D64],)),
    "standard-decimal128": DecodedMessage(body_kind="value", body=[D128, LEGACY_D128]),
}
EXPECTED = {
    "application-properties": ("application_properties", {
        b"char": "z", b"d32": Decimal("1.5"), b"d64": Decimal("-2.25"), b"d128": Decimal("3.75"),
        b"astral": "\U0001F600"}),
    "value-body-char": ("value", "c"),
    "value-body-map": ("value", {b"list": ["a", Decimal("1.5"), Decimal("-2.25")], b"decimal": Decimal("3.75"),
                                 b"span": "b"}),
    "arrays": ("value", [["x", "y"], [Decimal("1.5")], [Decimal("-2.25"), Decimal("-2.25")], [Decimal("3.75")]]),
    "sequence-body": ("sequence", [["s", Decimal("-2.25")]]),
    "standard-decimal128": ("value", [Decimal("3.75"), Decimal("3.75")]),
}
UNPATCHED_ERRORS = {"standard-decimal128": (ValueError, "Invalid AMQP decimal128 encoding")}


@pytest.fixture
def sdk_table():
    """The SDK's decoder table as the SDK ships it (servicebus.clients patches it on import), restored after the test."""
    table = _decode._DECODE_BY_CONSTRUCTOR
    saved = list(table)
    for code in sdk_internals._PATCHED:
        table[code] = sdk_internals._EXPECTED_BEFORE[code]
    yield table
    table[:] = saved


@pytest.mark.parametrize("name", MESSAGES)
def test_without_the_patch_the_sdk_cannot_decode_these_messages(sdk_table, name):
    assert not sdk_internals.decoder_patch_installed()
    error, message = UNPATCHED_ERRORS.get(name, (TypeError, "'NoneType' object is not callable"))
    with pytest.raises(error, match=message):
        decode_payload(memoryview(MESSAGES[name].encode()))


def test_the_sdk_reads_the_legacy_decimal128_layout_itself(sdk_table):
    raw = DecodedMessage(body_kind="value", body=LEGACY_D128).encode()
    assert decode_payload(memoryview(raw)).value == Decimal("3.75")
    sdk_internals.install_decoder_patch()
    assert decode_payload(memoryview(raw)).value == Decimal("3.75")


@pytest.mark.parametrize("name", MESSAGES)
def test_with_the_patch_the_sdk_decodes_char_and_decimals(sdk_table, name):
    assert sdk_internals.install_decoder_patch() is True
    decoded = decode_payload(memoryview(MESSAGES[name].encode()))
    field, expected = EXPECTED[name]
    value = getattr(decoded, field)
    assert value == expected
    assert _types(value) == _types(expected)


def _types(value):
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value)


def test_the_sdk_message_wrapper_reads_the_patched_values(sdk_table):
    sdk_internals.install_decoder_patch()
    message = ServiceBusReceivedMessage.from_bytes(MESSAGES["application-properties"].encode())
    assert message.application_properties[b"char"] == "z"
    assert message.application_properties[b"d32"] == Decimal("1.5")
    assert message.message_id == "m-1"
    assert "application_properties=" in repr(message)
    assert b"".join(message.body) == b"payload"


def test_install_is_idempotent_and_leaves_the_sdks_own_decoders_alone(sdk_table):
    before = list(sdk_table)
    assert sdk_internals.install_decoder_patch() and sdk_internals.install_decoder_patch()
    changed = [index for index, (old, new) in enumerate(zip(before, sdk_table)) if old is not new]
    assert changed == [0x73, 0x74, 0x84, 0x94]
    assert sdk_internals.decoder_patch_installed()


def test_install_refuses_another_sdk_version(sdk_table, monkeypatch, caplog):
    monkeypatch.setattr(azure.servicebus, "__version__", "7.99.0")
    before = list(sdk_table)
    with caplog.at_level(logging.WARNING, logger="backlog_syphon.servicebus.sdk_internals"):
        assert sdk_internals.install_decoder_patch() is False
    assert list(sdk_table) == before
    assert "azure-servicebus 7.99.0 is not the pinned 7.15.0" in caplog.text


def test_install_refuses_a_table_of_another_shape(sdk_table, caplog):
    sdk_table[0x73] = lambda buffer, depth=0: (buffer[4:], "already decoded by a newer SDK")
    before = list(sdk_table)
    with caplog.at_level(logging.WARNING, logger="backlog_syphon.servicebus.sdk_internals"):
        assert sdk_internals.install_decoder_patch() is False
    assert list(sdk_table) == before
    assert "not laid out as expected" in caplog.text


def test_an_impossible_char_reads_as_the_replacement_character(sdk_table):
    sdk_internals.install_decoder_patch()
    raw = b"\x00\x53\x77\x73\x00\x11\x00\x00"  # amqp-value: char U+110000
    assert decode_payload(memoryview(raw)).value == "\ufffd"


# --- the pinned SDK and the private attributes the syphon uses ----------------------------------------

def test_check_sdk_finds_nothing_wrong_with_the_installed_pinned_sdk():
    assert azure.servicebus.__version__ == sdk_internals.PINNED_SDK_VERSION == "7.15.0"
    assert sdk_internals.check_sdk() == []


def test_check_sdk_names_a_private_attribute_that_is_gone(monkeypatch):
    from azure.servicebus import ServiceBusReceiver
    from azure.servicebus._common import constants

    before = set(sdk_internals.check_sdk())
    monkeypatch.delattr(ServiceBusReceiver, "_settle_message_via_mgmt_link")
    monkeypatch.delattr(constants, "_BATCH_MESSAGE_OVERHEAD_COST")
    assert set(sdk_internals.check_sdk()) - before == {
        "ServiceBusReceiver._settle_message_via_mgmt_link is missing",
        "azure.servicebus._common.constants._BATCH_MESSAGE_OVERHEAD_COST is missing",
    }


def test_check_sdk_names_another_version_first(monkeypatch):
    monkeypatch.setattr(azure.servicebus, "__version__", "7.99.0")
    assert sdk_internals.check_sdk()[0] == "azure-servicebus 7.99.0 is installed; the syphon is pinned to 7.15.0"


def test_prompt_leaves_anything_but_an_sdk_handler_as_it_is():
    from backlog_syphon.servicebus.sdk_internals import prompt

    class StandIn:
        pass

    stand_in = StandIn()
    assert prompt(stand_in) is stand_in and vars(stand_in) == {}


class _PeekAnswer:
    """What the SDK hands a management callback: the response's body and application properties."""

    def __init__(self, messages=(), condition=None):
        self.value = {b"messages": [{b"message": raw} for raw in messages]}
        self.application_properties = {} if condition is None else {b"errorCondition": condition}


class _PeekingReceiver:
    """A receiver whose management link answers one peek with ``status`` and ``answer``."""

    def __init__(self, status, answer):
        from azure.servicebus._transport._pyamqp_transport import PyamqpTransport

        self._amqp_transport = PyamqpTransport
        self.status, self.answer, self.asked = status, answer, []

    def _check_live(self):
        pass

    def _mgmt_request_response_with_retry(self, operation, request, callback, timeout=None):
        self.asked.append((operation, request, timeout))
        return callback(self.status, self.answer, "described")


@pytest.mark.parametrize("status, answer", [
    (204, _PeekAnswer()),  # "no more messages"
    (202, _PeekAnswer()),
    (404, _PeekAnswer(condition=b"com.microsoft:message-not-found")),  # how the service has also said it
])
def test_every_way_the_service_says_no_messages_is_an_empty_page(status, answer):
    receiver = _PeekingReceiver(status, answer)
    assert sdk_internals.peek_stored_bytes(receiver, 7, 250, timeout=10.0) == []
    [(_, request, timeout)] = receiver.asked
    assert timeout == 10.0 and request[sdk_internals.sdk_constants.MGMT_REQUEST_MAX_MESSAGE_COUNT] == 250


def test_a_session_receivers_peek_asks_for_its_session_only_and_a_plain_ones_for_every_message():
    """As the SDK's own peek: a purge's look through a session receiver must not see other sessions' messages."""
    session_id_key = sdk_internals.sdk_constants.MGMT_REQUEST_SESSION_ID
    plain, in_session = _PeekingReceiver(204, _PeekAnswer()), _PeekingReceiver(204, _PeekAnswer())
    in_session._session, in_session._session_id = object(), "s-b"
    for receiver in (plain, in_session):
        sdk_internals.peek_stored_bytes(receiver, 1, 10)
    assert session_id_key not in plain.asked[0][1] and in_session.asked[0][1][session_id_key] == "s-b"


def test_a_peek_page_keeps_the_stored_bytes_and_a_missing_queue_still_raises():
    from azure.servicebus.exceptions import MessagingEntityNotFoundError

    assert sdk_internals.peek_stored_bytes(_PeekingReceiver(200, _PeekAnswer([b"\x00a", b"\x00b"])), 1, 2) == [
        b"\x00a", b"\x00b"]
    with pytest.raises(MessagingEntityNotFoundError):
        sdk_internals.peek_stored_bytes(_PeekingReceiver(404, _PeekAnswer(condition=b"amqp:not-found")), 1, 2)
