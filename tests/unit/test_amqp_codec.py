"""The pure-Python AMQP codec: type-exact round trips against proton, every legal encoding, strict errors."""

import math
import pickle
import random
import struct
import uuid
from datetime import datetime, timezone
from decimal import Decimal

import proton
import pytest
from proton import Data, Message

from backlog_syphon.restore.amqp import decoding
from backlog_syphon.restore.amqp.decoding import AmqpDecodeError, decode_value
from backlog_syphon.restore.amqp.encoding import encode_list_raw, encode_map_raw, encode_value
from backlog_syphon.restore.amqp.message_decoding import decode_envelope, decode_message
from backlog_syphon.restore.restored_message import LegacyPropertiesError, restore_message_bytes
from backlog_syphon.restore.amqp.sections import (
    SectionCode,
    encode_section,
    list_items,
    map_entries,
    sequence_number,
    split_sections,
)
from backlog_syphon.restore.amqp.values import (
    MAX_NESTING_DEPTH,
    AmqpType,
    Array,
    Byte,
    Char,
    Decimal32,
    Decimal64,
    Decimal128,
    Described,
    Float,
    Int,
    MapPairs,
    Short,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    ULong,
    UShort,
)
from tests.unit.amqp_values import proton_decode, proton_encode, tagged

P = proton
UNDESCRIBED = proton.UNDESCRIBED
NAN = float("nan")
INF = float("inf")


def parray(element_type, *elements, descriptor=UNDESCRIBED):
    return proton.Array(descriptor, element_type, *elements)


# Every primitive type at its boundaries, and the containers, as proton builds them.
PROTON_VALUES = {
    "null": None,
    "true": True,
    "false": False,
    "ubyte-min": P.ubyte(0), "ubyte-max": P.ubyte(255),
    "ushort-min": P.ushort(0), "ushort-max": P.ushort(2**16 - 1),
    "uint-0": P.uint(0), "uint-small": P.uint(255), "uint-256": P.uint(256), "uint-max": P.uint(2**32 - 1),
    "ulong-0": P.ulong(0), "ulong-small": P.ulong(255), "ulong-256": P.ulong(256), "ulong-max": P.ulong(2**64 - 1),
    "byte-min": P.byte(-128), "byte-max": P.byte(127),
    "short-min": P.short(-(2**15)), "short-max": P.short(2**15 - 1),
    "int-min": P.int32(-(2**31)), "int-max": P.int32(2**31 - 1), "int-small": P.int32(-128), "int-128": P.int32(128),
    "long-0": 0, "long-small": -128, "long-128": 128,
    "long-fits-int": 2**31 - 1, "long-fits-int-negative": -(2**31),
    "long-min": -(2**63), "long-max": 2**63 - 1,
    "float": P.float32(0.5), "float-negative-zero": P.float32(-0.0), "float-inf": P.float32(INF),
    "float-nan": P.float32(NAN), "float-max": P.float32(3.4028234663852886e38), "float-tiny": P.float32(1e-45),
    "double": 1.5, "double-negative-zero": -0.0, "double-nan": NAN, "double-inf": -INF,
    "double-max": 1.7976931348623157e308, "double-tiny": 5e-324,
    "decimal32": P.decimal32(0x32800001), "decimal32-max": P.decimal32(2**32 - 1),
    "decimal64": P.decimal64(0x31C0000000000001), "decimal64-max": P.decimal64(2**64 - 1),
    "decimal128": P.decimal128(bytes.fromhex("30400000000000000000000000000001")),
    "decimal128-ones": P.decimal128(b"\xff" * 16),
    "char": P.char("z"), "char-nul": P.char("\x00"), "char-latin": P.char("\u00e9"),
    "char-astral": P.char("\U0001F600"), "char-max": P.char("\U0010FFFF"),
    "timestamp-epoch": P.timestamp(0), "timestamp-before-1970": P.timestamp(-1),
    "timestamp-year-1": P.timestamp(-62135596800000), "timestamp-year-9999": P.timestamp(253402300799999),
    "timestamp-min": P.timestamp(-(2**63)), "timestamp-max": P.timestamp(2**63 - 1),
    "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"), "uuid-zero": uuid.UUID(int=0),
    "binary-empty": b"", "binary": b"\x00\xff", "binary-255": b"b" * 255, "binary-256": b"b" * 256,
    "binary-large": bytes(range(256)) * 300,
    "string-empty": "", "string": "text", "string-latin": "caf\u00e9", "string-astral": "\U0001F600 outside BMP",
    "string-255": "s" * 255, "string-256": "s" * 256, "string-multibyte-long": "\u00e9" * 200,
    "symbol-empty": P.symbol(""), "symbol": P.symbol("x-opt-sequence-number"), "symbol-long": P.symbol("y" * 300),
    "list-empty": [], "list-of-null": [None], "list-nested": [[[1, [P.int32(2)]]], [], "three"],
    "list-long": list(range(300)),
    "list-mixed": [None, True, P.ubyte(1), P.uint(2), P.ulong(3), P.int32(4), 5, P.float32(6.5), 7.5,
                   P.char("8"), P.timestamp(9), uuid.UUID(int=10), b"11", "12", P.symbol("13"),
                   P.decimal32(14), P.decimal64(15), P.decimal128(bytes(16)), P.byte(-1), P.short(-2), P.ushort(3)],
    "map-empty": {}, "map-symbol-keys": {P.symbol("a"): 1, P.symbol("b"): [P.int32(2)]},
    "map-nested": {"outer": {"inner": {P.ulong(1): [{}]}}},
    # (proton cannot decode binary map keys: it hashes a view of C memory; see the message tests for those)
    "map-mixed-keys": {1: "long", P.int32(1): "int", P.ulong(2): "ulong", "s": None, 2.5: "double"},
    "map-large": {f"key-{i}": i for i in range(200)},
    "array-empty-int": parray(Data.INT),
    "array-empty-symbol": parray(Data.SYMBOL),
    "array-symbols": parray(Data.SYMBOL, P.symbol("a"), P.symbol("bb")),
    "array-long-symbols": parray(Data.SYMBOL, P.symbol("a" * 300)),
    "array-ints": parray(Data.INT, P.int32(1), P.int32(-1)),
    "array-ints-wide": parray(Data.INT, P.int32(1), P.int32(2**31 - 1)),
    "array-longs": parray(Data.LONG, 1, 2**40),
    "array-uints": parray(Data.UINT, P.uint(0), P.uint(255)),
    "array-uints-wide": parray(Data.UINT, P.uint(0), P.uint(2**32 - 1)),
    "array-ulongs": parray(Data.ULONG, P.ulong(5), P.ulong(2**64 - 1)),
    "array-bools": parray(Data.BOOL, True, False, True),
    "array-nulls": parray(Data.NULL, None, None),
    "array-ubytes": parray(Data.UBYTE, P.ubyte(1)), "array-bytes": parray(Data.BYTE, P.byte(-1)),
    "array-shorts": parray(Data.SHORT, P.short(-2)), "array-ushorts": parray(Data.USHORT, P.ushort(2)),
    "array-floats": parray(Data.FLOAT, P.float32(0.25)), "array-doubles": parray(Data.DOUBLE, 0.25, NAN),
    "array-chars": parray(Data.CHAR, P.char("a"), P.char("\U0001F600")),
    "array-timestamps": parray(Data.TIMESTAMP, P.timestamp(-5), P.timestamp(5)),
    "array-uuids": parray(Data.UUID, uuid.UUID(int=1), uuid.UUID(int=2)),
    "array-binaries": parray(Data.BINARY, b"", b"x" * 256),
    "array-strings": parray(Data.STRING, "a", "\u00e9"),
    "array-decimals": parray(Data.DECIMAL32, P.decimal32(1)),
    "array-decimal64s": parray(Data.DECIMAL64, P.decimal64(1)),
    "array-decimal128s": parray(Data.DECIMAL128, P.decimal128(bytes(16)), P.decimal128(b"\x01" * 16)),
    "array-described-symbol": parray(Data.LONG, 1, 2, descriptor=P.symbol("com.microsoft:timespan")),
    "array-described-ulong": parray(Data.STRING, "x", descriptor=P.ulong(0x137_00000001)),
    "array-of-arrays": parray(Data.ARRAY, parray(Data.INT, P.int32(1)), parray(Data.SYMBOL)),
    "array-of-lists": parray(Data.LIST, [1, "a"], []),
    "array-of-maps": parray(Data.MAP, {P.symbol("k"): 1}, {}),
    "described-ulong": P.Described(P.ulong(0x70), [True]),
    "described-symbol": P.Described(P.symbol("com.microsoft:timespan"), 600_000_000),
    "described-uri": P.Described(P.symbol("com.microsoft:uri"), "https://example.com/a?b=c"),
    "described-datetime-offset": P.Described(P.symbol("com.microsoft:datetime-offset"), 638500000000000000),
    "described-described": P.Described(P.symbol("outer"), P.Described(P.ulong(1), {"k": P.timestamp(1)})),
    "described-in-list": [P.Described(P.symbol("d"), None)],
}


@pytest.mark.parametrize("value", PROTON_VALUES.values(), ids=PROTON_VALUES.keys())
def test_round_trip_against_proton_keeps_types_and_values(value):
    raw = proton_encode(value)
    expected = tagged(proton_decode(raw))
    assert expected == tagged(value)  # the table itself says what it means

    ours, end = decode_value(raw)
    assert end == len(raw)
    assert tagged(ours) == expected

    reencoded = encode_value(ours)
    assert tagged(proton_decode(reencoded)) == expected
    assert tagged(decode_value(reencoded)[0]) == expected
    assert encode_value(decode_value(reencoded)[0]) == reencoded  # our encoding is stable


# --- every legal encoding, compact and wide --------------------------------------------------------

LEGAL_ENCODINGS = [
    ("40", None), ("41", True), ("42", False), ("5601", True), ("5600", False),
    ("50ff", UByte(255)), ("60ffff", UShort(65535)),
    ("43", UInt(0)), ("5207", UInt(7)), ("7000000007", UInt(7)),
    ("44", ULong(0)), ("5307", ULong(7)), ("800000000000000007", ULong(7)),
    ("51ff", Byte(-1)), ("61ffff", Short(-1)),
    ("54ff", Int(-1)), ("71ffffffff", Int(-1)),
    ("55ff", -1), ("81ffffffffffffffff", -1), ("5505", 5), ("8100000000000000ff", 255),
    ("723f000000", Float(0.5)), ("823fe0000000000000", 0.5),
    ("7432800001", Decimal32(0x32800001)), ("8431c0000000000001", Decimal64(0x31C0000000000001)),
    ("94" + "30400000000000000000000000000001", Decimal128(bytes.fromhex("30400000000000000000000000000001"))),
    ("7300000061", Char("a")), ("730001f600", Char("\U0001F600")),
    ("83ffffffffffffffff", Timestamp(-1)),
    ("98" + "12345678123456781234567812345678", uuid.UUID("12345678-1234-5678-1234-567812345678")),
    ("a00161", b"a"), ("b00000000161", b"a"), ("a000", b""), ("b000000000", b""),
    ("a10161", "a"), ("b10000000161", "a"), ("a100", ""),
    ("a30161", Symbol("a")), ("b30000000161", Symbol("a")),
    ("45", []), ("c00100", []), ("d00000000400000000", []),
    ("c0030155" "01", [1]), ("d000000006000000015501", [1]),
    ("c10100", {}), ("d10000000400000000", {}),
    ("c104025501" "41", {1: True}),
    ("e0020071", Array("int", [])), ("f0000000050000000071", Array("int", [])),
    ("e00202" "41", Array("boolean", [True, True])),
    ("e0040256" "0100", Array("boolean", [True, False])),
    ("e00202" "43", Array("uint", [UInt(0), UInt(0)])),
    ("e0040252" "0102", Array("uint", [UInt(1), UInt(2)])),
    ("e00202" "45", Array("list", [[], []])),
    ("e00202" "40", Array("null", [None, None])),
    ("e0070100a3017855" "05", Array("long", [5], descriptor=Symbol("x"))),
    ("005305" "41", Described(ULong(5), True)),
    ("00800000000000000005" "41", Described(ULong(5), True)),
    ("00a30178" "41", Described(Symbol("x"), True)),
    ("00b3000000017841", Described(Symbol("x"), True)),
]


def test_the_legal_encodings_cover_every_constructor():
    known = {code for code in range(256) if decoding.DECODERS[code] is not decoding.unknown_constructor}
    assert len(known) == 40  # the 39 primitive constructors of AMQP 1.0, and 0x00 for described values
    assert {bytes.fromhex(hex_bytes)[0] for hex_bytes, _ in LEGAL_ENCODINGS} == known


@pytest.mark.parametrize("hex_bytes, expected", LEGAL_ENCODINGS, ids=[h for h, _ in LEGAL_ENCODINGS])
def test_every_legal_encoding_decodes(hex_bytes, expected):
    raw = bytes.fromhex(hex_bytes)
    value, end = decode_value(raw)
    assert end == len(raw)
    assert tagged(value) == tagged(expected)
    assert tagged(proton_decode(raw)) == tagged(expected)  # proton reads these bytes the same way
    assert tagged(decode_value(encode_value(value))[0]) == tagged(expected)


@pytest.mark.parametrize("value, hex_bytes", [
    (None, "40"), (True, "41"), (False, "42"), (UInt(0), "43"), (UInt(7), "5207"), (UInt(256), "7000000100"),
    (ULong(0), "44"), (ULong(7), "5307"), (Int(-1), "54ff"), (Int(128), "7100000080"), (5, "5505"),
    (128, "810000000000000080"), ("a", "a10161"), ("a" * 256, "b1" + "00000100" + "61" * 256),
    ([], "45"), ([None], "c0020140"), ({}, "c10100"), (Array("uint", [1]), "e0030152" "01"),
    (Array("uint", [256]), "e006017000000100"), (Array("boolean", [True]), "e003015601"),
])
def test_encoding_chooses_the_compact_form(value, hex_bytes):
    assert encode_value(value).hex() == hex_bytes


# --- the value model ---------------------------------------------------------------------------------

@pytest.mark.parametrize("cls, low, high", [
    (UByte, 0, 255), (UShort, 0, 2**16 - 1), (UInt, 0, 2**32 - 1), (ULong, 0, 2**64 - 1),
    (Byte, -128, 127), (Short, -(2**15), 2**15 - 1), (Int, -(2**31), 2**31 - 1),
    (Timestamp, -(2**63), 2**63 - 1), (Decimal32, 0, 2**32 - 1), (Decimal64, 0, 2**64 - 1),
])
def test_integer_types_check_their_range(cls, low, high):
    assert (cls(low), cls(high)) == (low, high)
    assert type(cls(low)) is cls
    for outside in (low - 1, high + 1):
        with pytest.raises(ValueError, match=f"{cls.__name__} must be between {low} and {high}"):
            cls(outside)
    with pytest.raises(TypeError):
        cls(1.5)
    assert repr(cls(low)) == f"{cls.__name__}({low})"
    assert str(cls(high)) == f"{cls(high):d}" == str(high)  # text is the number, not the repr


def test_other_types_check_their_values():
    with pytest.raises(ValueError, match="exactly one Unicode code point"):
        Char("ab")
    with pytest.raises(ValueError, match="not a surrogate"):
        Char("\ud800")
    with pytest.raises(TypeError):
        Char(5)
    with pytest.raises(ValueError, match="ASCII"):
        Symbol("caf\u00e9")
    with pytest.raises(ValueError, match="16 bytes"):
        Decimal128(b"short")
    with pytest.raises(ValueError, match="out of range"):
        Float(1e300)
    with pytest.raises(TypeError):
        Float("1")
    assert Float(0.1) == struct.unpack(">f", struct.pack(">f", 0.1))[0]  # rounded to float32 at once
    assert (repr(Float(0.5)), repr(Char("a")), repr(Symbol("s")), repr(Decimal128(bytes(16)))) == (
        "Float(0.5)", "Char('a')", "Symbol('s')", f"Decimal128({bytes(16)!r})")


def test_described_and_array_are_immutable_and_hashable_when_their_parts_are():
    described = Described(Symbol("d"), 5)
    assert described == Described(Symbol("d"), 5) and hash(described) == hash(Described(Symbol("d"), 5))
    assert {described: 1}[Described(Symbol("d"), 5)] == 1
    with pytest.raises(AttributeError):
        described.value = 6
    with pytest.raises(TypeError):
        hash(Described(Symbol("d"), [1]))
    array = Array("symbol", ["a"])
    assert array == Array(AmqpType.SYMBOL, [Symbol("a")]) and hash(array) == hash(Array("symbol", ["a"]))
    assert type(array.elements[0]) is Symbol  # plain str converted to the element type
    with pytest.raises(AttributeError):
        array.elements = ()
    assert repr(array) == "Array('symbol', (Symbol('a'),))"
    assert repr(Array("long", [1], descriptor=Symbol("d"))) == "Array('long', (1,), descriptor=Symbol('d'))"
    assert repr(described) == "Described(Symbol('d'), 5)"


@pytest.mark.parametrize("element_type, elements, error", [
    ("uint", [-1], ValueError), ("int", [True], TypeError), ("long", [Int(1)], TypeError),
    ("symbol", [5], TypeError), ("string", [Symbol("s")], TypeError), ("map", [[]], TypeError),
    ("no-such-type", [], ValueError),
])
def test_array_elements_must_be_of_its_type(element_type, elements, error):
    with pytest.raises(error):
        Array(element_type, elements)


def test_values_pickle_with_their_types():
    values = [UInt(5), Float(0.5), Char("x"), Symbol("s"), Timestamp(-5), Decimal128(bytes(16)),
              Described(Symbol("d"), [Int(1)]), Array("int", [1, 2], descriptor=ULong(9)),
              MapPairs([([1], "list key")])]
    for value in values:
        assert tagged(pickle.loads(pickle.dumps(value))) == tagged(value)


def test_timestamp_datetime_helpers():
    before_1970 = datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=timezone.utc)
    assert Timestamp.from_datetime(before_1970) == -1
    assert Timestamp(-1).to_datetime() == before_1970
    assert Timestamp.from_datetime(datetime(2024, 5, 1, 12, 0, 0, 999999)) == 1714564800999  # naive is UTC; floored
    assert Timestamp(0).to_datetime() == datetime(1970, 1, 1, tzinfo=timezone.utc)
    with pytest.raises(OverflowError):
        Timestamp(2**62).to_datetime()


@pytest.mark.parametrize("cls, value, bits", [
    (Decimal32, Decimal(1), 0x32800001),
    (Decimal64, Decimal(1), 0x31C0000000000001),
    (Decimal128, Decimal(1), 0x30400000000000000000000000000001),
    (Decimal32, Decimal("-7.5"), 0xB200004B),
    (Decimal32, Decimal("9999999"), 0x6CB8967F),  # coefficient above 2**23: the large-coefficient form
    (Decimal64, Decimal("9999999999999999"), 0x6C7386F26FC0FFFF),
])
def test_decimals_use_the_binary_integer_decimal_encoding(cls, value, bits):
    encoded = cls.from_decimal(value)
    raw = encoded if cls is not Decimal128 else int.from_bytes(encoded, "big")
    assert raw == bits
    assert encoded.to_decimal() == value


@pytest.mark.parametrize("value", [
    "0", "-0", "1.5", "-79228162514264337593543950335", "79228162514264337593543950335",
    "0.0000000000000000000000000001", "12345678901234567890123456789012.34", "NaN", "Infinity", "-Infinity",
])
def test_decimal128_round_trips_dotnet_decimals_and_specials(value):
    decimal = Decimal(value)
    decoded = Decimal128.from_decimal(decimal).to_decimal()
    assert str(decoded) == str(decimal)


def test_decimal_that_does_not_fit_is_refused():
    with pytest.raises(ValueError, match="does not fit a decimal32"):
        Decimal32.from_decimal(Decimal("12345678"))
    with pytest.raises(ValueError, match="does not fit a decimal64"):
        Decimal64.from_decimal(Decimal("1E+400"))


# --- maps a dict cannot hold -------------------------------------------------------------------------

@pytest.mark.parametrize("pairs", [
    [(Symbol("a"), 1), ("a", 2)],          # symbol and string keys with the same text
    [(True, "bool"), (1, "long")],         # equal in Python, different AMQP types
    [(UInt(1), "uint"), (ULong(1), "ulong")],
    [(0.0, "zero"), (-0.0, "negative zero")],
    [([1, 2], "list key")],                # unhashable
    [({"k": 1}, "map key"), ("x", [])],
    [(Described(Symbol("d"), [1]), "described list key")],
    [("same", 1), ("same", 2)],            # a repeated key is kept as it is, too
])
def test_maps_a_dict_cannot_hold_decode_to_map_pairs_and_keep_their_bytes(pairs):
    raw = encode_value(MapPairs(pairs))
    value, end = decode_value(raw)
    assert type(value) is MapPairs and end == len(raw)
    assert tagged(value) == tagged(MapPairs(pairs))
    assert encode_value(value) == raw


def test_nested_map_pairs_inside_lists_and_arrays():
    raw = encode_value([Array("map", [MapPairs([([1], 2)]), {"a": 1}])])
    value = decode_value(raw)[0]
    assert type(value[0].elements[0]) is MapPairs and type(value[0].elements[1]) is dict
    assert encode_value(value) == raw


# --- encoding errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("value, error, message", [
    ((1, 2), TypeError, "cannot encode a tuple"),
    (datetime(2024, 1, 1), TypeError, "cannot encode a datetime"),
    ({1, 2}, TypeError, "cannot encode a set"),
    (bytearray(b"x"), TypeError, "cannot encode a bytearray"),
    (2**63, ValueError, "must fit in 64 bits"),
    ("\ud800", ValueError, "lone surrogate"),
])
def test_values_outside_the_model_are_refused(value, error, message):
    with pytest.raises(error, match=message):
        encode_value(value)


def test_a_container_that_holds_itself_is_refused():
    looping: list = []
    looping.append(looping)
    with pytest.raises(ValueError, match="nested more than"):
        encode_value(looping)


# --- strict decoding ---------------------------------------------------------------------------------

SECRET = "SharedAccessKey=abc123"
UNASSIGNED = [code for code in range(256) if decoding.DECODERS[code] is decoding.unknown_constructor and code != 0x00]


def test_unknown_constructors_are_refused_with_their_offset():
    assert len(UNASSIGNED) == 256 - 40  # AMQP 1.0 assigns 39 primitive constructors, plus 0x00
    for code in UNASSIGNED:
        with pytest.raises(AmqpDecodeError, match=f"unknown constructor 0x{code:02x} at byte 3"):
            decode_value(bytes([0xC0, 0x02, 0x01, code]), 0)


SAMPLE_VALUES = [
    value for key, value in PROTON_VALUES.items()
    if not key.endswith(("-large", "-long", "-256", "-255")) and key not in ("list-long", "map-large")
]


@pytest.mark.parametrize("value", SAMPLE_VALUES)
def test_every_truncation_is_refused(value):
    raw = encode_value(decode_value(proton_encode(value))[0])
    for cut in range(len(raw)):
        with pytest.raises(AmqpDecodeError, match=r"at byte \d+$") as error:
            decode_value(raw[:cut])
        assert 0 <= error.value.offset <= cut


@pytest.mark.parametrize("hex_bytes, message", [
    ("", "truncated: a value is missing at byte 0"),
    ("d0ffffffff ffffffff", "truncated: the list is 4294967295 bytes long, 4 left at byte 0"),
    ("d000000008ffffffff00000000", "the list declares 4294967295 elements in 4 bytes at byte 0"),
    ("d10000000800010000 40404040", "the map declares 65536 elements in 4 bytes at byte 0"),
    ("f000000005ffffffff40", "the array declares 4294967295 elements, more than the bytes given at byte 0"),
    ("f000000008ffffffff70000000", "the array declares 4294967295 elements in 3 bytes at byte 0"),
    ("c00000", "the size of the list (0 bytes) cannot hold its count at byte 0"),
    ("c0030155", "truncated: the list is 3 bytes long, 2 left at byte 0"),
    ("c003025501", "truncated: a list element is missing at byte 5"),
    ("c00401550140", "the elements of the list at byte 0 end at byte 5, its size says 6"),
    ("c103034040", "the map has an odd number of elements (3) at byte 0"),
    ("e00100", "the array has no element constructor at byte 0"),
    ("e0030100a3", "truncated: the symbol needs 1 bytes after its constructor, 0 left at byte 4"),
    ("e0040100 40 40", "the array is described by null at byte 0"),
    ("e005010053 0500", "0x00 is not an array element constructor at byte 6"),
    ("e00201 ff", "0xff is not an array element constructor at byte 3"),
    ("a105 616263", "truncated: the string is 5 bytes long, 3 left at byte 0"),
    ("b0 0000", "truncated: the binary needs 4 bytes after its constructor, 2 left at byte 0"),
    ("a102c328", "a string is not valid UTF-8 at byte 0"),         # invalid continuation byte
    ("a102c0af", "a string is not valid UTF-8 at byte 0"),         # overlong encoding
    ("a103eda080", "a string is not valid UTF-8 at byte 0"),       # an encoded surrogate
    ("a101ff", "a string is not valid UTF-8 at byte 0"),
    ("a302c3a9", "a symbol is not ASCII at byte 0"),
    ("730000d800", "a char is not a Unicode code point (surrogate or above U+10FFFF) at byte 0"),
    ("7300110000", "a char is not a Unicode code point"),
    ("5602", "a boolean byte must be 0x00 or 0x01 at byte 1"),
    ("71 0000", "truncated: the int needs 4 bytes after its constructor, 2 left at byte 0"),
    ("98 00", "truncated: the uuid needs 16 bytes"),
    ("00 53 05", "truncated: a value is missing at byte 3"),
])
def test_malformed_input_is_refused_with_a_reason_and_offset(hex_bytes, message):
    with pytest.raises(AmqpDecodeError) as error:
        decode_value(bytes.fromhex(hex_bytes.replace(" ", "")))
    assert message in str(error.value)


def test_nesting_is_limited():
    decode_value(_nested_lists(MAX_NESTING_DEPTH))
    deepest_list = 9 * MAX_NESTING_DEPTH  # each list header is 9 bytes
    with pytest.raises(AmqpDecodeError, match=f"nested more than {MAX_NESTING_DEPTH} deep at byte {deepest_list}"):
        decode_value(_nested_lists(MAX_NESTING_DEPTH + 1))
    decode_value(b"\x00\x53\x01" * MAX_NESTING_DEPTH + b"\x40")
    too_deep = b"\x00\x53\x01" * (MAX_NESTING_DEPTH + 1) + b"\x40"
    deepest_described = 3 * MAX_NESTING_DEPTH
    with pytest.raises(AmqpDecodeError, match=f"nested more than {MAX_NESTING_DEPTH} deep at byte {deepest_described}"):
        decode_value(too_deep)
    with pytest.raises(AmqpDecodeError, match="nested more than"):
        split_sections(b"\x00\x53\x77" + too_deep)


def _nested_lists(depth: int) -> bytes:
    """``depth`` lists, each holding the next (the innermost, empty, is one more)."""
    raw = b"\x45"
    for _ in range(depth):
        raw = b"\xd0" + struct.pack(">II", len(raw) + 4, 1) + raw
    return raw


def test_errors_never_show_the_bytes():
    values = [SECRET, Symbol("SharedAccessKey"), SECRET.encode()]
    for value in values:
        raw = bytearray(encode_value([value, {"k": value}]))
        for position in range(len(raw)):
            for replacement in (0xFF, 0x00, 0xC3):
                broken = bytes(raw[:position]) + bytes([replacement]) + bytes(raw[position + 1:])
                try:
                    decode_value(broken)
                except AmqpDecodeError as error:
                    assert "SharedAccess" not in str(error) and "abc123" not in str(error)


# --- fuzzing: only AmqpDecodeError (or a legacy property problem) ever escapes -----------------------

def _sample_messages() -> list[bytes]:
    message = Message(body=b"payload", inferred=True, properties={"x-ms-path": "orders", "x-ms-sessionid": "s-1",
                                                   "x-ms-timetolive": P.Described(P.symbol("com.microsoft:timespan"),
                                                                                  600_000_000)})
    message.annotations = {P.symbol("x-opt-sequence-number"): 7}
    message.id = "id-1"
    message.ttl = 5
    value_message = Message(body={P.symbol("k"): [P.char("c"), P.decimal128(bytes(16))]}, inferred=False)
    return [bytes(message.encode()), bytes(value_message.encode())]


def _check_only_decode_errors(raw: bytes, outcomes: dict) -> None:
    for read in (decode_value, split_sections, decode_message, decode_envelope, sequence_number,
                 lambda b: restore_message_bytes(b, 1000)):
        try:
            read(raw)
            outcomes["read"] += 1
        except (AmqpDecodeError, LegacyPropertiesError):
            outcomes["refused"] += 1


def test_fuzzed_random_bytes_raise_only_amqp_decode_errors():
    rng = random.Random(20240501)
    outcomes = {"read": 0, "refused": 0}
    for _ in range(3000):
        raw = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 40)))
        _check_only_decode_errors(raw, outcomes)
        _check_only_decode_errors(b"\x00\x53" + bytes([rng.randrange(0x70, 0x79)]) + raw, outcomes)
    assert outcomes["read"] > 100 and outcomes["refused"] > 10_000


def test_fuzzed_mutations_of_real_messages_raise_only_amqp_decode_errors():
    rng = random.Random(7)
    outcomes = {"read": 0, "refused": 0}
    for sample in _sample_messages():
        for _ in range(1500):
            raw = bytearray(sample)
            for _ in range(rng.randrange(1, 4)):
                raw[rng.randrange(len(raw))] = rng.getrandbits(8)
            if rng.random() < 0.3:
                del raw[rng.randrange(len(raw)):]
            _check_only_decode_errors(bytes(raw), outcomes)
    assert outcomes["read"] > 2000 and outcomes["refused"] > 2000


# --- sections ----------------------------------------------------------------------------------------

def _proton_message() -> bytes:
    message = Message(body=b"hello", properties={"a": 1}, inferred=True)
    message.annotations = {P.symbol("x-opt-sequence-number"): 1234, P.symbol("x-custom"): "c"}
    message.id = "id"
    message.durable = True
    message.instructions = {P.symbol("x-opt-lock-token"): uuid.UUID(int=1)}
    return bytes(message.encode())


def test_split_sections_of_a_proton_message():
    raw = _proton_message()
    sections = split_sections(raw)
    assert [section.code for section in sections] == [
        SectionCode.HEADER, SectionCode.DELIVERY_ANNOTATIONS, SectionCode.MESSAGE_ANNOTATIONS,
        SectionCode.PROPERTIES, SectionCode.APPLICATION_PROPERTIES, SectionCode.DATA]
    assert sections[0].start == 0 and sections[-1].end == len(raw)
    assert all(a.end == b.start for a, b in zip(sections, sections[1:]))
    start, end = sections[-1].data_payload_range(raw)
    assert raw[start:end] == b"hello"
    with pytest.raises(ValueError, match="not a Data section"):
        sections[0].data_payload_range(raw)


def test_split_sections_accepts_symbolic_descriptors_and_any_order():
    properties = encode_value(Described(Symbol("amqp:properties:list"), ["id"]))
    value = encode_value(Described(Symbol("amqp:amqp-value:*"), "v"))
    application = encode_value(Described(ULong(0x74), {"k": 1}))
    sections = split_sections(value + application + properties)
    assert [s.code for s in sections] == [SectionCode.AMQP_VALUE, SectionCode.APPLICATION_PROPERTIES,
                                          SectionCode.PROPERTIES]
    assert decode_message(value + application + properties).properties.message_id == "id"


def test_split_sections_rejects_the_old_emulator_spelling_of_the_value_section():
    with pytest.raises(AmqpDecodeError, match="unknown section descriptor at byte 1"):
        split_sections(encode_value(Described(Symbol("amqp:value:*"), "v")))


def test_map_entries_and_list_items_give_byte_ranges():
    raw = encode_value({Symbol("a"): 1, "b": [2], b"c": None})
    entries = map_entries(raw, 0)
    assert [tagged(entry.key) for entry in entries] == [tagged(Symbol("a")), tagged("b"), tagged(b"c")]
    assert [entry.value for entry in entries] == [decode_value(raw, e.value_start)[0] for e in entries]
    assert [entry.value for entry in entries] == [1, [2], None]
    assert encode_map_raw([raw[e.start:e.end] for e in entries]) == raw
    assert encode_map_raw([raw[e.start:e.end] for e in entries[1:]]) == encode_value({"b": [2], b"c": None})
    assert map_entries(b"\x40", 0) == []
    listed = encode_value([None, UInt(3), "x"])
    items = list_items(listed, 0)
    assert [listed[item.start:item.end] for item in items] == [b"\x40", b"\x52\x03", b"\xa1\x01x"]
    assert tagged([item.value for item in items]) == tagged([None, UInt(3), "x"])
    assert encode_list_raw([listed[item.start:item.end] for item in items]) == listed
    assert list_items(b"\x45", 0) == [] and encode_list_raw([]) == b"\x45"
    wide = [b"\xa1\x01x"] * 100
    assert decode_value(encode_list_raw(wide))[0] == ["x"] * 100  # over 255 bytes: the wide form
    assert encode_section(SectionCode.FOOTER, b"\x40") == b"\x00\x53\x78\x40"
    with pytest.raises(AmqpDecodeError, match="expected a map, found constructor 0x45 at byte 0"):
        map_entries(b"\x45", 0)


def test_sequence_number_reads_only_the_annotations():
    raw = _proton_message()
    assert sequence_number(raw) == 1234
    # A body that would not decode does not matter, as long as its framing holds.
    broken_body = b"\x00\x53\x77\xa1\x02\xc3\x28"
    annotations = encode_section(SectionCode.MESSAGE_ANNOTATIONS,
                                 encode_value({Symbol("x-opt-sequence-number"): 2**40}))
    assert sequence_number(annotations + broken_body) == 2**40
    with pytest.raises(AmqpDecodeError):
        decode_message(annotations + broken_body)
    assert sequence_number(encode_section(SectionCode.DATA, b"\xa0\x00")) is None
    assert sequence_number(b"") is None
    not_a_number = encode_section(SectionCode.MESSAGE_ANNOTATIONS, encode_value({Symbol("x-opt-sequence-number"): "7"}))
    with pytest.raises(AmqpDecodeError, match="x-opt-sequence-number is not an integer at byte"):
        sequence_number(not_a_number)


def test_nan_keeps_its_bits():
    signalling = struct.unpack(">d", bytes.fromhex("7ff4000000000001"))[0]
    raw = encode_value(signalling)
    assert raw == bytes.fromhex("827ff4000000000001")
    assert math.isnan(decode_value(raw)[0])
    assert encode_value(decode_value(raw)[0]) == raw


def test_decode_value_at_an_offset_and_of_other_buffers():
    raw = b"\x40\x40" + encode_value([UInt(1)])
    assert tagged(decode_value(raw, 2)[0]) == tagged([UInt(1)])
    assert decode_value(memoryview(raw), 2)[1] == len(raw)
    assert decode_value(bytearray(raw), 2)[1] == len(raw)
    assert decode_value(raw, 1) == (None, 2)
    with pytest.raises(ValueError):
        decode_value(raw, -1)



def test_the_package_re_exports_the_codec_from_the_modules_that_define_it():
    from backlog_syphon.restore import amqp

    homes = (amqp.values, amqp.decoding, amqp.encoding, amqp.sections, amqp.annotations)
    unhomed = [name for name in amqp.__all__ if not any(getattr(home, name, None) is getattr(amqp, name)
                                                        for home in homes)]
    assert unhomed == []
    assert {"decode_value", "encode_value", "Symbol", "split_sections", "broker_identity",
            "ENQUEUED_TIME_ANNOTATION"} <= set(amqp.__all__)
