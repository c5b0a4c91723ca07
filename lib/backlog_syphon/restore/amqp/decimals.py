"""IEEE 754-2008 decimals in the binary integer decimal (BID) encoding: AMQP's decimal32, 64 and 128.

The codec forwards the raw bits untouched; these conversions only serve ``to_decimal`` and
``from_decimal`` of the value classes, for tests and for reading a value as a number.
"""

from __future__ import annotations

from decimal import Decimal
from typing import NamedTuple


class _BidFormat(NamedTuple):
    bits: int
    exponent_bits: int
    bias: int
    digits: int


BID32 = _BidFormat(32, 8, 101, 7)
BID64 = _BidFormat(64, 10, 398, 16)
BID128 = _BidFormat(128, 14, 6176, 34)


def bid_to_decimal(bits: int, fmt: _BidFormat) -> Decimal:
    sign = bits >> (fmt.bits - 1)
    top = (bits >> (fmt.bits - 6)) & 0x1F  # the five bits after the sign
    if top == 0x1F:
        return Decimal("-NaN" if sign else "NaN")
    if top == 0x1E:
        return Decimal("-Infinity" if sign else "Infinity")
    if top >> 3 == 0b11:  # large-coefficient form: 11, exponent, then the coefficient's low bits
        coefficient_bits = fmt.bits - 3 - fmt.exponent_bits
        exponent = (bits >> coefficient_bits) & ((1 << fmt.exponent_bits) - 1)
        coefficient = (0b100 << coefficient_bits) | (bits & ((1 << coefficient_bits) - 1))
    else:
        coefficient_bits = fmt.bits - 1 - fmt.exponent_bits
        exponent = (bits >> coefficient_bits) & ((1 << fmt.exponent_bits) - 1)
        coefficient = bits & ((1 << coefficient_bits) - 1)
    if coefficient >= 10**fmt.digits:
        coefficient = 0  # non-canonical: IEEE 754 reads it as zero
    return Decimal((sign, tuple(int(d) for d in str(coefficient)), exponent - fmt.bias))


def decimal_to_bid(value: Decimal, fmt: _BidFormat) -> int:
    sign, digits, exponent = Decimal(value).as_tuple()
    top = sign << (fmt.bits - 1)
    if exponent == "n" or exponent == "N":
        return top | (0x1F << (fmt.bits - 6))
    if exponent == "F":
        return top | (0x1E << (fmt.bits - 6))
    coefficient = int("".join(map(str, digits)) or "0")
    biased = exponent + fmt.bias
    if coefficient >= 10**fmt.digits or not 0 <= biased < (3 << (fmt.exponent_bits - 2)):
        raise ValueError(f"{value} does not fit a decimal{fmt.bits} exactly")
    coefficient_bits = fmt.bits - 1 - fmt.exponent_bits
    if coefficient < 1 << coefficient_bits:
        return top | (biased << coefficient_bits) | coefficient
    coefficient_bits -= 2
    return (top | (0b11 << (fmt.bits - 3)) | (biased << coefficient_bits)
            | (coefficient & ((1 << coefficient_bits) - 1)))
