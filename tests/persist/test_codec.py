"""Framing (persist._internal.codec): compressed shard states, and what a reader refuses."""

from __future__ import annotations

import json
import os
import struct

import pytest

from persist import CorruptObject
from persist._internal.codec import DIFF_VERSION, FORMAT_VERSION, KIND_STATE, ZSTD_VERSION, frame, unframe
from persist._internal.state import ShardState


def _version(data: bytes) -> int:
    return int(struct.unpack(">H", data[5:7])[0])


def test_a_compressed_frame_round_trips_and_is_version_2() -> None:
    payload = json.dumps({"batches": [{"inline": "AAAA" * 200, "rows": i} for i in range(50)]}).encode()
    data = frame(KIND_STATE, payload, compress=True)
    assert _version(data) == ZSTD_VERSION
    assert len(data) < len(payload) / 5  # (repetitive JSON: much smaller)
    assert unframe("k", data, KIND_STATE) == payload
    random = os.urandom(3000)  # incompressible: still round-trips
    assert unframe("k", frame(KIND_STATE, random, compress=True), KIND_STATE) == random


def test_uncompressed_frames_of_version_1_are_still_read() -> None:
    payload = b'{"a": 1}'
    data = frame(KIND_STATE, payload)
    assert _version(data) == FORMAT_VERSION == 1
    assert unframe("k", data, KIND_STATE) == payload


def test_states_are_written_compressed_and_decode() -> None:
    s = ShardState(shard_id="s" + "0" * 32)
    data = s.encode()
    assert _version(data) == ZSTD_VERSION
    assert ShardState.decode("k", data, 1).shard_id == s.shard_id


def _reframe(body: bytes) -> bytes:
    from persist._internal.codec import crc32c

    return body + struct.pack(">I", crc32c(body))


def test_a_compressed_payload_that_does_not_decompress_is_corrupt() -> None:
    data = frame(KIND_STATE, b"x" * 1000, compress=True)
    body = data[:-4]
    # a valid checksum over a damaged zstd frame (as a bug elsewhere could write): refused, not decoded
    damaged = _reframe(body[:15] + bytes(b ^ 0xFF for b in body[15:25]) + body[25:])
    with pytest.raises(CorruptObject, match="zstd"):
        unframe("k", damaged, KIND_STATE)
    wrong_size = _reframe(body[:7] + struct.pack(">Q", 999) + body[15:])
    with pytest.raises(CorruptObject, match="zstd"):
        unframe("k", wrong_size, KIND_STATE)


def test_a_newer_format_version_says_to_upgrade() -> None:
    body = b"TXP1" + bytes([KIND_STATE]) + struct.pack(">H", DIFF_VERSION + 1) + b"{}"
    with pytest.raises(CorruptObject, match="newer than this library's 3; upgrade"):
        unframe("k", _reframe(body), KIND_STATE)
