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

from persist import PersistClient, Schema, ShardId
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
    ref = describe_file(f"{shard}/parts/0000000000000-x", src, KV.num_rows, KV.select(["k"]))
    assert (ref.size, ref.lo, ref.hi) == (len(data), 1, 3)
    client.blob.set(ref.key, data)
    (table,) = read_run(client.blob, Run(parts=(ref,), rows=3, ts_rewrite=7), SCHEMA.arrow)
    assert table.schema == SCHEMA.arrow.remove_metadata()
    assert sorted(table.to_pylist(), key=lambda r: r["k"]) == [
        {"k": 1, "v": "a", "ts": 7, "diff": 1},
        {"k": 2, "v": "b", "ts": 7, "diff": 1},
        {"k": 3, "v": "c", "ts": 7, "diff": 1},
    ]
