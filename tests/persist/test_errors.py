"""Bad input: each gets a clear exception (type and message) and leaves the shard as it was.

"As it was" is checked with ``client.inspect(shard)`` (which includes the
consensus seqno, so any write would show) and the shard's blob keys.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pytest

from persist import (
    CLOSED,
    Batch,
    CorruptObject,
    InvalidUsage,
    PersistClient,
    PersistConfig,
    PersistError,
    ReadBelowSince,
    ReadHandle,
    ReadTimeout,
    Schema,
    SchemaMismatch,
    ShardId,
    UpperMismatch,
    WriteHandle,
)
from tests.helpers import mem_url
from tests.persist.model import SCHEMA, shard_blob_keys, upd

OTHER_SCHEMA = Schema(key=pa.schema([("k", pa.string())]), val=pa.schema([("v", pa.string())]))


@dataclass
class Shard:
    client: PersistClient
    shard: ShardId
    writer: WriteHandle
    reader: ReadHandle

    def snapshot(self) -> tuple[dict, set[str]]:
        """Everything a failed call must leave as it was."""
        return self.client.inspect(self.shard), shard_blob_keys(self.client, self.shard)

    def untouched_by(self, call: Callable[[], object], error: type[Exception], match: str) -> Exception:
        """Run ``call``, expect ``error`` matching ``match``, and check nothing changed."""
        before = self.snapshot()
        with pytest.raises(error, match=match) as e:
            call()
        assert isinstance(e.value, PersistError), "every persist error is a PersistError"
        assert self.snapshot() == before, f"{error.__name__} left the shard changed"
        return e.value


@pytest.fixture
def s() -> Iterator[Shard]:
    """A shard with two updates, upper 3, a writer and a reader (inline off: appends write parts)."""
    config = PersistConfig(inline_max_bytes=0, read_wait_s=0.0)
    client = PersistClient.open(mem_url("errors"), config)
    shard = ShardId.new()
    w = client.open_writer(shard, SCHEMA)
    w.compare_and_append([upd(1, "a", 0), upd(2, "b", 2)], 0, 3)
    yield Shard(client, shard, w, client.open_leased_reader(shard, SCHEMA))


# ---- locations ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("ftp://host/path", r"unknown scheme 'ftp'.*accepted forms: mem://NAME, file://PATH, s3://BUCKET"),
        ("mem:/name", "missing '://'"),
        ("mem://", r"mem:// needs a NAME"),
        ("s3://UPPER_CASE/p", "not a valid bucket name"),
        ("s3://bucket/p?color=red", "unknown query parameter 'color'"),
    ],
)
def test_bad_location_urls(url: str, match: str) -> None:
    with pytest.raises(InvalidUsage, match=match):
        PersistClient.open(url)


@pytest.mark.s3
def test_missing_bucket(moto_endpoint: str) -> None:
    bucket = f"missing-{uuid.uuid4().hex[:16]}"
    with pytest.raises(InvalidUsage, match=rf"bucket '{bucket}' does not exist.*create it first") as e:
        PersistClient.open(f"s3://{bucket}/root?endpoint_url={moto_endpoint}&region=us-east-1")
    assert "aws s3 mb" in str(e.value)


# ---- schemas ------------------------------------------------------------------------------


def test_reopening_with_a_different_schema(s: Shard) -> None:
    fresh = PersistClient.open(s.client.url, s.client.config)
    for open_handle in (fresh.open_writer, fresh.open_leased_reader, s.client.open_writer, s.client.open_leased_reader):
        err = s.untouched_by(
            lambda open_handle=open_handle: open_handle(s.shard, OTHER_SCHEMA),  # type: ignore[misc]
            SchemaMismatch,
            r"has schema key\(k: int64\) val\(v: string\), but the handle was opened with "
            r"key\(k: string\) val\(v: string\); open it with the shard's schema",
        )
        assert isinstance(err, InvalidUsage)
    assert s.client.inspect(s.shard)["leased_readers"] == 1, "no reader was registered"


def test_batch_with_another_schema(s: Shard) -> None:
    other_shard = ShardId.new()
    foreign = s.client.open_writer(other_shard, OTHER_SCHEMA).batch([((("x",), ("y",)), 3, 1)], 3, 4)
    forged = Batch(str(s.shard), foreign.id, 3, 4, foreign.runs, foreign.schema_fingerprint)
    s.untouched_by(
        lambda: s.writer.compare_and_append_batch([forged], 3, 4), SchemaMismatch, "different schema"
    )


@pytest.mark.parametrize(
    ("key", "val", "match"),
    [
        (("ts",), ("v",), r"field names \['ts'\] are reserved"),
        (("k",), ("diff",), r"field names \['diff'\] are reserved"),
        (("k",), ("k",), "must be distinct"),
    ],
)
def test_schema_field_names(key: tuple[str], val: tuple[str], match: str) -> None:
    with pytest.raises(InvalidUsage, match=match):
        Schema(key=pa.schema([(n, pa.int64()) for n in key]), val=pa.schema([(n, pa.int64()) for n in val]))


def test_schema_must_be_arrow_schemas(s: Shard) -> None:
    with pytest.raises(InvalidUsage, match=r"two pyarrow.Schema objects"):
        Schema(key=[("k", pa.int64())], val=pa.schema([]))  # type: ignore[arg-type]
    s.untouched_by(lambda: s.client.open_writer(s.shard, "k:int64"), InvalidUsage, "expected a persist.Schema")  # type: ignore[arg-type]


# ---- appends ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("updates", "error", "match"),
    [
        ([upd(1, "a", 7)], InvalidUsage, r"update time 7 is outside the batch bounds \[3, 5\)"),
        ([upd(1, "a", 2)], InvalidUsage, r"update time 2 is outside the batch bounds \[3, 5\)"),
        ([upd(1, "a", 3), upd(1, "a", 5)], InvalidUsage, "lower <= ts < upper"),
        ([(((1, 2), ("a",)), 3, 1)], SchemaMismatch, r"key \(1, 2\) must be a tuple of 1 fields"),
        ([(((1,), "a"), 3, 1)], SchemaMismatch, "val 'a' must be a tuple of 1 fields"),
        ([((1, ("a",)), 3, 1)], SchemaMismatch, "key 1 must be a tuple"),
        ([((("x",), ("a",)), 3, 1)], SchemaMismatch, r"field 'k' expects int64, but update #0 has 'x'"),
        ([upd(1, "a", 3), (((2,), (5,)), 4, 1)], SchemaMismatch, r"field 'v' expects string, but update #1 has 5"),
        ([(((1,), ("a",)), 3)], SchemaMismatch, r"expected \(\(key_tuple, val_tuple\), ts, diff\)"),
        ([upd(1, "a", 3, 2**63)], InvalidUsage, "diff must be a signed 64-bit int"),
        ([(((1,), ("a",)), 3, 1.5)], InvalidUsage, "diff must be a signed 64-bit int"),
        ([(((1,), ("a",)), -1, 1)], InvalidUsage, r"update #0 time must be an int in \[0, 2\*\*64\)"),
        ([(((1,), ("a",)), "3", 1)], InvalidUsage, "time must be an int"),
    ],
)
def test_bad_updates(s: Shard, updates: list, error: type[Exception], match: str) -> None:
    s.untouched_by(lambda: s.writer.compare_and_append(updates, 3, 5), error, match)
    s.untouched_by(lambda: s.writer.batch(updates, 3, 5), error, match)


def test_bad_arrow_tables(s: Shard) -> None:
    builder = s.writer.builder(3, 5)
    with pytest.raises(SchemaMismatch, match=r"missing \['v'\], unexpected \['w'\]"):
        builder.add_table(pa.table({"k": [1], "w": ["a"], "ts": [3], "diff": [1]}))
    with pytest.raises(SchemaMismatch, match="cannot be converted"):
        builder.add_table(pa.table({"k": ["x"], "v": ["a"], "ts": [3], "diff": [1]}))
    with pytest.raises(InvalidUsage, match=r"update time 9 is outside the batch bounds \[3, 5\)"):
        builder.add_table(pa.table({"k": [1], "v": ["a"], "ts": [9], "diff": [1]}))
    batch = builder.finish()
    assert batch.rows == 0, "nothing bad was kept"
    assert builder.finish() is batch, "finish is idempotent: a retried finish returns the same batch"
    with pytest.raises(InvalidUsage, match="already finished"):
        builder.add((1,), ("a",), 3, 1)
    assert shard_blob_keys(s.client, s.shard) == {p.key for p in s.writer.shard.state().batches[0].runs[0].parts}


@pytest.mark.parametrize(
    ("expected", "new", "match"),
    [
        (3, 3, "new_upper 3 must be greater than expected_upper 3"),
        (3, 2, "new_upper 2 must be greater than expected_upper 3"),
        (-1, 4, r"expected_upper must be an int in \[0, 2\*\*64\)"),
        ("3", 4, "expected_upper must be an int"),
        (3, CLOSED + 1, r"new_upper must be an int in \[0, 2\*\*64\]"),
        (CLOSED, CLOSED, "expected_upper must be an int"),
    ],
)
def test_bad_append_bounds(s: Shard, expected: object, new: object, match: str) -> None:
    s.untouched_by(lambda: s.writer.compare_and_append([], expected, new), InvalidUsage, match)  # type: ignore[arg-type]
    s.untouched_by(lambda: s.writer.compare_and_append_batch([], expected, new), InvalidUsage, match)  # type: ignore[arg-type]


def test_batch_bounds_outside_the_append(s: Shard) -> None:
    batch = s.writer.batch([upd(1, "a", 3)], 3, 6)
    s.untouched_by(
        lambda: s.writer.compare_and_append_batch([batch], 3, 5),
        InvalidUsage,
        r"bounds \[3, 6\), outside the append bounds \[3, 5\); rewrite its times with Batch.rewrite_ts",
    )
    old = s.writer.batch([upd(1, "a", 1)], 1, 2)
    s.untouched_by(lambda: s.writer.compare_and_append_batch([old], 3, 5), InvalidUsage, "outside the append bounds")
    # and at the wrong upper it is a mismatch, not bad input
    later = s.writer.batch([upd(1, "a", 4)], 4, 6)
    e = s.untouched_by(lambda: s.writer.compare_and_append_batch([later], 4, 6), UpperMismatch, "expected upper 4")
    assert isinstance(e, UpperMismatch) and e.current == 3


def test_batch_for_another_shard(s: Shard) -> None:
    other = ShardId.new()
    batch = s.client.open_writer(other, SCHEMA).batch([upd(1, "a", 3)], 3, 4)
    s.untouched_by(
        lambda: s.writer.compare_and_append_batch([batch], 3, 4),
        InvalidUsage,
        rf"batch {batch.id} was written for shard {other}, not {s.shard}",
    )


def test_bad_batch_bounds(s: Shard) -> None:
    s.untouched_by(lambda: s.writer.builder(5, 5), InvalidUsage, "batch upper 5 must be greater than its lower 5")
    s.untouched_by(lambda: s.writer.builder(-1, 5), InvalidUsage, r"batch lower must be an int in \[0, 2\*\*64\)")
    batch = s.writer.batch([upd(1, "a", 4)], 4, 6)
    with pytest.raises(InvalidUsage, match="cannot rewrite batch times back to 3: its lower is 4"):
        batch.rewrite_ts(3)


def test_corrupt_batch_bytes(s: Shard) -> None:
    data = bytearray(s.writer.batch([upd(1, "a", 3)], 3, 4).to_bytes())
    data[len(data) // 2] ^= 1
    s.untouched_by(lambda: Batch.from_bytes(bytes(data)), CorruptObject, "corrupt object 'serialized batch'")


def test_corrupt_part_leaves_state_untouched(s: Shard) -> None:
    key = next(iter(shard_blob_keys(s.client, s.shard)))
    good = s.client.blob.get(key)
    assert good is not None
    s.client.blob.set(key, good[:-1] + bytes([good[-1] ^ 1]))
    e = s.untouched_by(lambda: s.reader.snapshot_and_fetch(2), CorruptObject, "CRC-32C mismatch")
    assert isinstance(e, CorruptObject) and e.key == key


# ---- reads --------------------------------------------------------------------------------


def test_read_below_since(s: Shard) -> None:
    s.reader.downgrade_since(2)
    e = s.untouched_by(
        lambda: s.reader.snapshot_and_fetch(1), ReadBelowSince, r"as_of 1 is below .* since 2 .* as_of >= 2"
    )
    assert isinstance(e, ReadBelowSince) and e.since == 2 and isinstance(e, InvalidUsage)
    s.untouched_by(lambda: s.reader.listen(0), ReadBelowSince, "as_of 0 is below")
    s.untouched_by(lambda: s.reader.snapshot_plan(1), ReadBelowSince, "as_of 1 is below")


def test_read_beyond_the_upper_times_out(s: Shard) -> None:
    e = s.untouched_by(
        lambda: s.reader.snapshot_and_fetch(1000),
        ReadTimeout,
        r"upper is 3, not past as_of 1000 after waiting 0.0s; read at an as_of below the upper",
    )
    assert isinstance(e, ReadTimeout) and e.upper == 3
    s.untouched_by(lambda: s.reader.snapshot_and_fetch(3), ReadTimeout, "upper is 3, not past as_of 3")
    s.untouched_by(lambda: s.reader.snapshot_and_fetch(-1), InvalidUsage, r"as_of must be an int in \[0, 2\*\*64\)")


def test_bad_since_arguments(s: Shard) -> None:
    s.untouched_by(lambda: s.reader.downgrade_since(-3), InvalidUsage, r"since must be an int in \[0, 2\*\*64\)")
    s.untouched_by(
        lambda: s.client.open_critical_since(s.shard, "", opaque=0),
        InvalidUsage,
        "critical reader id must be a non-empty string",
    )
    s.untouched_by(
        lambda: s.client.open_critical_since(s.shard, "c", opaque=True), InvalidUsage, "opaque must be an int"  # type: ignore[arg-type]
    )
    h = s.client.open_critical_since(s.shard, "c", opaque=0)
    s.untouched_by(lambda: h.compare_and_downgrade_since(0, 1, 2**64), InvalidUsage, "new_since must be an int")


# ---- shard ids ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["", "s123", "x" + "0" * 32, "s" + "A" * 32, "s" + "0" * 33, " s" + "0" * 32, "s" + "g" * 32, 7],
)
def test_invalid_shard_id(text: object, s: Shard) -> None:
    with pytest.raises(InvalidUsage, match=r"invalid shard id .*expected 's' followed by 32 lowercase hex digits"):
        ShardId.parse(text)  # type: ignore[arg-type]
    s.untouched_by(lambda: s.client.open_writer(text, SCHEMA), InvalidUsage, "invalid shard id")  # type: ignore[arg-type]
    s.untouched_by(lambda: s.client.inspect(text), InvalidUsage, "invalid shard id")  # type: ignore[arg-type]


def test_valid_shard_id_round_trips() -> None:
    sid = ShardId.new()
    assert ShardId.parse(str(sid)) == sid
