"""The fixed-width big-endian formats of AMQP's encoding, shared by the decoder, the encoder and the
section reader (part 1.6 of the specification)."""

from __future__ import annotations

import struct


U8 = struct.Struct(">B")
I8 = struct.Struct(">b")
U16 = struct.Struct(">H")
I16 = struct.Struct(">h")
U32 = struct.Struct(">I")
I32 = struct.Struct(">i")
U64 = struct.Struct(">Q")
I64 = struct.Struct(">q")
F32 = struct.Struct(">f")
F64 = struct.Struct(">d")
COUNTS8 = struct.Struct(">BB")
COUNTS32 = struct.Struct(">II")
