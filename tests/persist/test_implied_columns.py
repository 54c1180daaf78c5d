"""Parts written by another engine may leave out ``ts`` and ``diff`` (``persist.manifest.IMPLIED_COLUMNS``).

Every read of such a part sees ``ts`` = 0 and ``diff`` = +1 on every row,
before any filter, exactly as if the file held the two constant columns.
"""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import persist.manifest as manifest
from persist import PersistClient, Schema, ShardId
from persist._internal.codec import crc32c
from persist._internal.parts import first_column_bounds
from persist.manifest import Run, describe_file, read_part_table, read_run

SCHEMA = Schema(key=pa.schema([pa.field("k", pa.int64())]), val=pa.schema([pa.field("v", pa.string())]))


def parquet(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


KV = pa.table({"k": pa.array([3, 1, 2], pa.int64()), "v": ["c", "a", "b"]})
FULL = KV.append_column("ts", pa.array([0, 0, 0], pa.uint64())).append_column("diff", pa.array([1, 1, 1], pa.int64()))


@pytest.mark.parametrize(
    ("columns", "filter"),
    [
        (None, None),
        (["k", "ts", "diff"], None),
        (["v"], None),
        (["k", "diff"], pc.field("ts") <= pa.scalar(0, pa.uint64())),
        (["k", "diff"], pc.field("diff") < 0),
        (["k"], pc.field("v") != "b"),  # a filter on a column outside the projection
        (["v", "ts"], (pc.field("k") >= 2) & (pc.field("diff") > 0)),
    ],
)
def test_a_part_without_ts_and_diff_reads_as_the_full_part(columns: list[str] | None, filter: object) -> None:
    want = read_part_table(parquet(FULL), columns, filter)
    got = read_part_table(parquet(KV), columns, filter)
    assert got.column_names == want.column_names
    assert got.cast(want.schema).equals(want)


def test_a_part_with_diff_but_no_ts() -> None:
    with_diff = KV.append_column("diff", pa.array([2, -1, 1], pa.int64()))
    got = read_part_table(parquet(with_diff), ["k", "ts", "diff"], pc.field("diff") < 0)
    assert got.to_pylist() == [{"k": 1, "ts": 0, "diff": -1}]


def test_persist_reads_a_described_foreign_part(tmp_path: Path) -> None:
    """A file described with ``describe_file`` and put at its key reads through ``read_run``, time rewritten."""
    client = PersistClient.open(f"file://{tmp_path}")
    shard = str(ShardId.new())
    data = parquet(KV)
    src = tmp_path / "staged.parquet"
    src.write_bytes(data)
    ref = describe_file(f"{shard}/parts/0000000000000-x", src)
    assert (ref.rows, ref.size, ref.lo, ref.hi) == (3, len(data), 1, 3)
    client.blob.set(ref.key, data)
    (table,) = read_run(client.blob, Run(parts=(ref,), rows=3, ts_rewrite=7), SCHEMA.arrow)
    assert table.schema == SCHEMA.arrow.remove_metadata()
    assert sorted(table.to_pylist(), key=lambda r: r["k"]) == [
        {"k": 1, "v": "a", "ts": 7, "diff": 1},
        {"k": 2, "v": "b", "ts": 7, "diff": 1},
        {"k": 3, "v": "c", "ts": 7, "diff": 1},
    ]


@pytest.mark.parametrize(
    "column",
    [
        pa.array([(i * 7919) % 1000 - 500 for i in range(1000)], pa.int64()),
        pa.array([(i * 104729) % 2001 - 1000 for i in range(1000)], pa.int32()),
        pa.array([(i * 31) % 200 - 100 for i in range(1000)], pa.int8()),
        pa.array([f"k{(i * 31) % 997:04d}" + "é" * (i % 3) for i in range(1000)]),
        pa.array(["z" * 80, *(f"a{i}" for i in range(999))]),  # a maximum past the stored length: none
        pa.array([i % 400 for i in range(1000)], pa.int32()).cast(pa.date32()),
        pa.array([float(i) for i in range(1000)]),  # no bounds for floats
        pa.array([None if i == 600 else i for i in range(1000)], pa.int64()),  # a null: no bounds
    ],
)
def test_describe_file_bounds_equal_those_of_the_whole_column(
    tmp_path: Path, column: pa.Array, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bounds folded over small batches (and row groups) are those of the whole column."""
    monkeypatch.setattr(manifest, "FILE_BATCH_ROWS", 64)
    monkeypatch.setattr(manifest, "FILE_CHUNK_BYTES", 1000)
    table = pa.table({"k": column, "v": pa.array(range(len(column)))})
    want = first_column_bounds(table.select(["k"]))
    for statistics in (True, False):  # (integers: from the footer's statistics when written, else decoded)
        path = tmp_path / f"part-{statistics}.parquet"
        pq.write_table(table, path, row_group_size=300, write_statistics=statistics)
        ref = describe_file("s/parts/0-x", path)
        data = path.read_bytes()
        assert (ref.lo, ref.hi) == want
        assert (ref.rows, ref.size) == (len(column), len(data))
        assert ref.crc == crc32c(data)


def test_integer_bounds_come_from_the_footer_without_decoding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_decoding(*_: object) -> None:
        raise AssertionError("the column was decoded")

    monkeypatch.setattr(manifest, "_decoded_bounds", no_decoding)
    path = tmp_path / "part.parquet"
    pq.write_table(pa.table({"k": pa.array([5, -3, 9, 0], pa.int64())}), path, row_group_size=2)
    assert (describe_file("s/parts/0-x", path).lo, describe_file("s/parts/0-x", path).hi) == (-3, 9)
    pq.write_table(pa.table({"k": pa.array([], pa.int64())}), path)
    assert (describe_file("s/parts/0-x", path).lo, describe_file("s/parts/0-x", path).hi) == (None, None)


@pytest.mark.parametrize("key_type", [pa.string(), pa.int64()])
def test_describe_file_of_a_file_without_row_groups(tmp_path: Path, key_type: pa.DataType) -> None:
    """Spark writes an empty task's output as a Parquet file with no row group at all: no rows, no bounds.

    (pyarrow before 19 raised on iterating such a file, which failed a native write on the oldest
    pyarrow the dependency range allows.)
    """
    path = tmp_path / "empty.parquet"
    pq.ParquetWriter(path, pa.schema([("k", key_type), ("v", pa.int64())])).close()
    assert pq.ParquetFile(path).metadata.num_row_groups == 0
    ref = describe_file("s/parts/0-x", path)
    data = path.read_bytes()
    assert (ref.rows, ref.size, ref.crc, ref.lo, ref.hi) == (0, len(data), crc32c(data), None, None)
