"""Framing for every object persist writes: a format version and a CRC-32C.

Layout of a framed object::

    b"TXP1" | kind (1 byte) | format version (u16, big endian) | payload | crc32c (u32, big endian)

The checksum covers everything before it. :func:`unframe` raises
:class:`persist.errors.CorruptObject` naming the key on any mismatch, so
nothing corrupt is ever decoded.

A shard's state is written compressed (zstd, through pyarrow): its frame has
format version 2 (:data:`ZSTD_VERSION`), whose payload is the uncompressed
size (u64, big endian) and the zstd frame of the version-1 payload. States
repeat themselves (batch descriptors, inline rows as base64 of Arrow IPC with
its zero padding), so this cuts the bytes of every state write and read by
about 10x for a fraction of a millisecond. A
library that knows only version 1 refuses such a frame, saying to upgrade.
Version 3 is compressed the same way; its payload is a state diff against
the shard's previous version (:mod:`persist._internal.state_diff`), which a
library knowing only versions 1 and 2 likewise refuses.

Parquet data parts are the one exception to the framing (so that any Parquet
reader, e.g. Spark's, can read them as they are): their CRC-32C is recorded in
the part's descriptor inside the (framed) shard state and checked on every
read, and their format version is in the Parquet key-value metadata.
"""

from __future__ import annotations

import struct

import google_crc32c
import pyarrow as pa

from persist.errors import CorruptObject

MAGIC = b"TXP1"
FORMAT_VERSION = 1
"""The version of uncompressed frames (and of Parquet parts' metadata)."""
ZSTD_VERSION = 2
"""The version of a frame whose payload is zstd-compressed (shard states)."""
DIFF_VERSION = 3
"""A zstd-compressed frame whose payload is a state *diff* (:mod:`persist._internal.state_diff`)."""
NEWEST_VERSION = DIFF_VERSION
ZSTD_LEVEL = 1  # (a 200 KB state: 0.2 ms, about 10x smaller; higher levels gain little on it)

KIND_STATE = 1
KIND_BATCH = 2
# Kinds 3 and up belong to the layers above (txns: 3 for a serialized
# transaction, 101 for the database's root record); persist never reads them.

_HEADER = struct.Struct(">4sBH")
_CRC = struct.Struct(">I")
_SIZE = struct.Struct(">Q")  # a compressed payload starts with its uncompressed size


def crc32c(data: bytes, crc_before: int = 0) -> int:
    """The CRC-32C (Castagnoli) of ``data``; with ``crc_before``, of the bytes it covers followed by ``data``.

    google-crc32c uses the CPU's CRC instruction (about 9 GB/s here, against
    about 0.4 GB/s for crcmod's table-driven C, which also held the GIL while
    part reads decoded in parallel).
    """
    crc: int = google_crc32c.extend(crc_before, data)  # (untyped in google-crc32c)
    return crc


def _zstd() -> pa.Codec:
    global _CODEC
    if _CODEC is None:
        _CODEC = pa.Codec("zstd", compression_level=ZSTD_LEVEL)
    return _CODEC


_CODEC: pa.Codec | None = None


def frame(kind: int, payload: bytes, *, compress: bool = False, version: int = ZSTD_VERSION) -> bytes:
    """``payload`` framed with magic, kind, format version and checksum.

    ``compress``: zstd, with format ``version`` (2, or 3 for a state diff).
    """
    if compress:
        packed: bytes = _SIZE.pack(len(payload)) + _zstd().compress(payload, asbytes=True)
        body = _HEADER.pack(MAGIC, kind, version) + packed
    else:
        body = _HEADER.pack(MAGIC, kind, FORMAT_VERSION) + payload
    return body + _CRC.pack(crc32c(body))


def unframe(key: str, data: bytes, kind: int) -> bytes:
    """The payload of a framed object, after checking it. Raises CorruptObject."""
    return unframe_versioned(key, data, kind)[1]


def unframe_versioned(key: str, data: bytes, kind: int) -> tuple[int, bytes]:
    """The format version and payload of a framed object, after checking it. Raises CorruptObject."""
    if len(data) < _HEADER.size + _CRC.size:
        raise CorruptObject(key, f"object is {len(data)} bytes, too short to be framed")
    body, (crc,) = data[: -_CRC.size], _CRC.unpack(data[-_CRC.size :])
    if crc32c(body) != crc:
        raise CorruptObject(key, "CRC-32C mismatch")
    magic, got_kind, version = _HEADER.unpack(body[: _HEADER.size])
    if magic != MAGIC:
        raise CorruptObject(key, f"bad magic {magic!r}")
    if got_kind != kind:
        raise CorruptObject(key, f"expected object kind {kind}, found {got_kind}")
    if version > NEWEST_VERSION:
        raise CorruptObject(key, f"format version {version} is newer than this library's {NEWEST_VERSION}; upgrade")
    payload = body[_HEADER.size :]
    if version in (ZSTD_VERSION, DIFF_VERSION):
        try:
            (size,) = _SIZE.unpack(payload[: _SIZE.size])
            out = _zstd().decompress(payload[_SIZE.size :], decompressed_size=size, asbytes=True)
        except (pa.ArrowException, OSError, ValueError, struct.error) as e:
            raise CorruptObject(key, f"zstd payload does not decompress: {e}") from None
        if len(out) != size:
            raise CorruptObject(key, f"zstd payload decompressed to {len(out)} bytes, not the {size} recorded")
        return version, out
    return version, payload
