"""The native write path: Spark's Parquet writer makes persist parts (``txns.spark.native_write``).

Each native write is compared with the Python path (``native=False``) on
the same DataFrame: the same contents read back through the Python API.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import txns.spark
from persist import InvalidUsage, PersistClient, Schema, SchemaMismatch, ShardId
from persist._internal.parts import first_column_bounds
from persist.url import open_location
from txns import TxnsHandle

pytestmark = pytest.mark.spark

SCHEMA = Schema(
    key=pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())]),
    val=pa.schema([pa.field("score", pa.float64()), pa.field("ok", pa.bool_()), pa.field("day", pa.date32())]),
)
DDL = "id long, name string, score double, ok boolean, day date"


def rows(n: int) -> list[tuple]:
    return [
        (i % 97, None if i % 11 == 0 else f"n{i % 13}", i / 4, i % 2 == 0, dt.date(2026, 1, 1 + i % 28))
        for i in range(n)
    ]


def contents(handle: TxnsHandle, data_id: str, ts: int) -> Counter:
    return Counter({kv: d for kv, _, d in handle.snapshot(data_id, ts)})


def test_native_parts_read_back_as_the_python_path_writes_them(spark, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    native_id, python_id = str(ShardId.new()), str(ShardId.new())
    h = TxnsHandle.open(PersistClient.open(url), ShardId.new())
    h.register(1, {native_id: SCHEMA, python_id: SCHEMA})
    df = spark.createDataFrame(rows(3000), DDL).repartition(3)
    with_diff = spark.createDataFrame([(5, "n5", 1.25, False, dt.date(2026, 1, 6), 3)], DDL + ", diff int")
    txn = h.begin()
    for d, native in ((native_id, True), (python_id, False)):
        batch = txns.spark.write_batch(df, url, d, SCHEMA, native=native, part_target_bytes=20_000)
        txn.write_batch(d, batch)
        for ref in (p for r in batch.runs for p in r.parts):  # Spark's footer bounds are the decoded ones
            first = pq.read_table(tmp_path / "store" / "blob" / ref.key, columns=["id"])
            assert (ref.lo, ref.hi) == first_column_bounds(first) and ref.lo is not None
        txn.write_batch(d, txns.spark.write_batch(with_diff, url, d, SCHEMA, native=native))
    txn.commit_at(h, 2).apply(h)
    assert contents(h, native_id, 2) == contents(h, python_id, 2)
    assert sum(contents(h, native_id, 2).values()) == 3003
    blob = open_location(url).blob
    parts = list(blob.list_keys(f"{native_id}/parts/"))
    assert len(parts) >= 3  # one file per Spark partition at least, at persist part keys
    assert not list((tmp_path / "store" / "spark-staging").iterdir())  # staging cleaned up
    assert contents(h, native_id, 2) == Counter(
        {kv: d for kv, _, d in TxnsHandle.open(PersistClient.open(url), h.txns_id).snapshot(native_id, 2)}
    )
    got = txns.spark.snapshot(spark, url, h.txns_id, native_id, 2)
    assert got.count() == len(contents(h, native_id, 2))


def test_a_null_in_a_non_nullable_key_fails_the_native_write_and_leaves_nothing(spark, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    d = str(ShardId.new())
    PersistClient.open(url).register_schema(d, SCHEMA)
    bad = spark.createDataFrame([(1, "a", 1.0, True, dt.date(2026, 1, 1)), (None, "b", 2.0, False, None)], DDL)
    with pytest.raises(SchemaMismatch, match=r"'id'.*not nullable"):
        txns.spark.write_batch(bad, url, d, SCHEMA, native=True)
    assert not list(open_location(url).blob.list_keys(f"{d}/parts/"))
    assert not list((tmp_path / "store" / "spark-staging").iterdir())


def test_native_is_refused_where_it_cannot_run(spark, tmp_path: Path, s3_url_factory) -> None:
    url = f"file://{tmp_path}/store"
    d = str(ShardId.new())
    narrow = spark.createDataFrame([(1, "a", 1.0, True, dt.date(2026, 1, 1))], "id int, " + DDL.split(", ", 1)[1])
    with pytest.raises(InvalidUsage, match="native=True"):
        txns.spark.write_batch(narrow, url, d, SCHEMA, native=True)  # id is an int, the field a long
    batch = txns.spark.write_batch(narrow, url, d, SCHEMA)  # auto: the Python path converts it
    assert batch.rows == 1
    with pytest.raises(InvalidUsage, match="native=True"):
        txns.spark.write_batch(spark.createDataFrame(rows(2), DDL), s3_url_factory(), d, SCHEMA, native=True)


def test_a_native_write_makes_a_new_shards_directories_durable(spark, tmp_path: Path, monkeypatch) -> None:
    import persist.file as file_mod

    url = f"file://{tmp_path}/store"
    d = str(ShardId.new())
    PersistClient.open(url).register_schema(d, SCHEMA)
    synced: list[str] = []
    real = file_mod.fsync_dir

    def fsync_dir(path: Path) -> None:
        synced.append(str(path))
        real(path)

    monkeypatch.setattr(file_mod, "fsync_dir", fsync_dir)
    txns.spark.write_batch(spark.createDataFrame(rows(10), DDL), url, d, SCHEMA, native=True)
    blob = tmp_path / "store" / "blob"
    # the new entries (the shard's directory in blob/, parts/ in it) are durable, not only the parts' own
    assert str(blob) in synced and str(blob / d) in synced


def test_readers_fill_in_the_columns_a_native_part_leaves_out(spark, tmp_path: Path) -> None:
    """Native parts hold no ``ts`` (and no ``diff`` unless given): every reader sees time and +1 as if they did."""
    import pyarrow.compute as pc

    url = f"file://{tmp_path}/db"
    db = txns.connect(url)
    db.create_table("t", pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string())]))
    before = db.latest()
    data = [(i, f"n{i % 7}") for i in range(500)]
    with db.transaction() as t:
        t.insert("t", spark.createDataFrame(data, "id long, name string").repartition(2))
    assert t.commit_info is not None and t.commit_info.ts is not None
    ts = t.commit_info.ts
    parts = list((tmp_path / "db" / "blob" / db.entry("t", ts).data_id / "parts").iterdir())
    assert parts and all(pq.read_schema(p).names == ["id", "name"] for p in parts)  # neither ts nor diff
    codec = spark.conf.get("spark.sql.parquet.compression.codec")  # the session's, as df.write.parquet
    assert {pq.ParquetFile(p).metadata.row_group(0).column(0).compression.lower() for p in parts} == {codec}

    def rows(table: pa.Table) -> list[tuple]:
        return sorted(zip(table.column("id").to_pylist(), table.column("name").to_pylist(), strict=True))

    table = db.table("t")
    assert rows(table.to_arrow()) == sorted(data)
    assert rows(table.to_arrow(filter=pc.field("id") >= 490)) == sorted(data)[490:]  # a pushed filter
    assert table.to_arrow(as_of=before).num_rows == 0
    changes = table.changes(before + 1, ts + 1)
    assert set(changes.column("ts").to_pylist()) == {ts} and set(changes.column("diff").to_pylist()) == {1}
    assert changes.num_rows == 500
    with db.transaction() as t:
        t.retract("t", [{"id": i, "name": f"n{i % 7}"} for i in range(100)])  # reads the native parts
    assert rows(table.to_arrow()) == sorted(data)[100:]
    assert rows(table.to_arrow(as_of=ts)) == sorted(data)
    db.compact(["t"])  # persist's merge reads the native parts too
    assert rows(table.to_arrow()) == sorted(data)[100:]
    got = spark.read.format("txns").option("url", url).load("t")
    assert sorted((r["id"], r["name"]) for r in got.collect()) == sorted(data)[100:]
    db.close()
