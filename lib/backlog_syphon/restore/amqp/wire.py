"""The fixed-width big-endian formats of AMQP's encoding, shared by the decoder, the encoder and the
section reader (part 1.6 of the specification)."""

from __future__ import annotations

import struct


_U8 = struct.Struct(">B")
_I8 = struct.Struct(">b")
_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")
_COUNTS8 = struct.Struct(">BB")
_COUNTS32 = struct.Struct(">II")
