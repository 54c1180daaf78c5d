"""txns.spark: DataFrames written in transactions, snapshots, the streaming source, compaction.

One ``local[2]`` SparkSession for the run (the ``spark`` fixture, tests/spark/conftest.py).
Executors are separate Python processes: they reach the store by URL only
(``file://`` with an absolute path, or moto's S3 over HTTP). Every read is
checked against the Python read path (``TxnsHandle.snapshot``) or against
contents computed by hand.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

import txns.spark
from persist import InvalidUsage, PersistClient, PersistConfig, Schema, SchemaMismatch, ShardId
from persist.url import open_location
from txns import TxnsHandle

pytestmark = pytest.mark.spark

SA = Schema(key=pa.schema([pa.field("id", pa.int64())]), val=pa.schema([pa.field("name", pa.string())]))
SB = Schema(
    key=pa.schema([pa.field("sku", pa.string())]),
    val=pa.schema([pa.field("qty", pa.uint32()), pa.field("price", pa.float64())]),
)
A_DDL = "id long, name string"


def contents(df, schema: Schema) -> dict:  # type: ignore[no-untyped-def]
    """A consolidated snapshot DataFrame as ``{(key, val): diff}`` (and no (key, val) twice)."""
    out: dict = {}
    for r in df.collect():
        kv = (tuple(r[n] for n in schema.key_names), tuple(r[n] for n in schema.val_names))
        assert kv not in out, f"{kv} appears twice in a consolidated snapshot"
        out[kv] = r["diff"]
    return out


def py_contents(handle: TxnsHandle, data_id: str, as_of: int) -> dict:
    """The Python read path's snapshot as ``{(key, val): diff}``."""
    return {kv: d for kv, _, d in handle.snapshot(data_id, as_of)}


def part_keys(url: str, shard_id: str) -> list[str]:
    return list(open_location(url).blob.list_keys(f"{shard_id}/parts/"))


def open_handle(url: str, schemas: dict[str, Schema], config: PersistConfig | None = None) -> TxnsHandle:
    handle = TxnsHandle.open(PersistClient.open(url, config), ShardId.new())
    handle.register(1, schemas)
    return handle


def new_ids(n: int) -> list[str]:
    return [str(ShardId.new()) for _ in range(n)]


# ---- writing and reading ----------------------------------------------------------------------


def test_two_tables_written_from_dataframes_in_one_transaction(spark, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    a, b = new_ids(2)
    h = open_handle(url, {a: SA, b: SB})
    txn = h.begin()
    txns.spark.write_dataframe(txn, a, spark.createDataFrame([(i, f"n{i}") for i in range(20)], A_DDL).repartition(3))
    txns.spark.write_dataframe(
        txn, b, spark.createDataFrame([("s1", 3, 1.5), ("s2", 4, 2.5)], "sku string, qty int, price double")
    )
    txn.commit_at(h, 2).apply(h)
    assert PersistClient.open(url).inspect(a)["parts"] >= 2  # written by the executors, not inline
    txn = h.begin()
    changes = [(i, f"n{i}", -1) for i in range(5)] + [(i, f"m{i}", 1) for i in range(3)] + [(7, "n7", 1)]
    txns.spark.write_dataframe(txn, a, spark.createDataFrame(changes, A_DDL + ", diff int"))
    txn.write(b, ("s3",), (1, 9.0), 1)  # DataFrames and Python writes mix in one transaction
    txn.commit_at(h, 4)  # not applied: the reads apply it
    h.begin().commit_at(h, 6)

    a2 = {((i,), (f"n{i}",)): 1 for i in range(20)}
    a4 = {k: v for k, v in a2.items() if k[0][0] >= 5} | {((i,), (f"m{i}",)): 1 for i in range(3)}
    a4[((7,), ("n7",))] = 2
    b2 = {(("s1",), (3, 1.5)): 1, (("s2",), (4, 2.5)): 1}
    b4 = b2 | {(("s3",), (1, 9.0)): 1}
    for as_of, want_a in [(2, a2), (3, a2), (4, a4), (6, a4)]:
        got_a = contents(txns.spark.snapshot(spark, url, h.txns_id, a, as_of), SA)
        assert got_a == want_a == py_contents(h, a, as_of), as_of
    for as_of, want_b in [(2, b2), (4, b4)]:
        got_b = contents(txns.spark.snapshot(spark, url, h.txns_id, b, as_of), SB)
        assert got_b == want_b == py_contents(h, b, as_of), as_of


@pytest.mark.s3
def test_executors_write_and_read_parts_over_s3(spark, s3_url_factory: Callable[..., str]) -> None:
    url = s3_url_factory()
    (a,) = new_ids(1)
    h = open_handle(url, {a: SA})
    txn = h.begin()
    df = spark.range(0, 3000, numPartitions=4).selectExpr("id", "concat('n', cast(id % 7 as string)) as name")
    txns.spark.write_dataframe(txn, a, df)
    txn.commit_at(h, 2).apply(h)
    assert len(part_keys(url, a)) == 4  # one part per (small) partition, in the bucket
    got = contents(txns.spark.snapshot(spark, url, h.txns_id, a, 2), SA)
    assert got == {((i,), (f"n{i % 7}",)): 1 for i in range(3000)}


def test_crash_between_commit_and_apply_is_read_by_a_fresh_handle(spark, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    (a,) = new_ids(1)
    h = open_handle(url, {a: SA})
    txn = h.begin()
    txns.spark.write_dataframe(txn, a, spark.createDataFrame([(1, "x"), (2, "y")], A_DDL))
    txn.commit_at(h, 3)
    txns_id = h.txns_id
    del h, txn  # the committer "crashes" before applying
    assert PersistClient.open(url).shard(a).fetch().upper <= 3  # not applied
    got = contents(txns.spark.snapshot(spark, url, txns_id, a, 3), SA)  # a fresh client and handle inside
    assert got == {((1,), ("x",)): 1, ((2,), ("y",)): 1}


@pytest.mark.parametrize(
    ("rows", "ddl", "match"),
    [
        ([(1,)], "id long", r"missing \['name'\]"),
        ([(1, "x", 2.0)], "id long, name string, extra double", r"unexpected \['extra'\]"),
        ([(1, "x", 0)], "id long, name string, ts long", r"unexpected \['ts'\]"),
        ([("1", "x")], "id string, name string", "column 'id' has Spark type string"),
        ([(1, 5)], "id long, name long", "column 'name' has Spark type bigint"),
        ([(1, "x", "1")], "id long, name string, diff string", "'diff' must be an integer"),
    ],
)
def test_mismatched_dataframe_is_refused_before_anything_is_written(
    spark,
    tmp_path: Path,
    rows: list,
    ddl: str,
    match: str,
) -> None:
    url = f"file://{tmp_path}/store"
    (a,) = new_ids(1)
    h = open_handle(url, {a: SA})
    txn = h.begin()
    with pytest.raises(SchemaMismatch, match=match):
        txns.spark.write_dataframe(txn, a, spark.createDataFrame(rows, ddl))
    assert part_keys(url, a) == []
    assert txn.batches() == {}


def test_value_that_does_not_fit_fails_the_write_with_schema_mismatch(spark, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    (b,) = new_ids(1)
    h = open_handle(url, {b: SB})
    df = spark.createDataFrame([("s1", -1, 1.0)], "sku string, qty long, price double")  # qty is a uint32
    with pytest.raises(SchemaMismatch, match=r"qty|uint32"):
        txns.spark.write_dataframe(h.begin(), b, df)


def test_spark_urls_must_reach_executors(spark, tmp_path: Path) -> None:
    df = spark.createDataFrame([(1, "x")], A_DDL)
    for url in (f"mem://spark-{ShardId.new()}", "file://relative/store"):
        with pytest.raises(InvalidUsage, match=r"in-memory|absolute"):
            txns.spark.write_batch(df, url, str(ShardId.new()), SA)
        with pytest.raises(InvalidUsage, match=r"in-memory|absolute"):
            txns.spark.snapshot(spark, url, str(ShardId.new()), str(ShardId.new()), 0)
        with pytest.raises(InvalidUsage, match=r"in-memory|absolute"):
            txns.spark.compact(spark, url, str(ShardId.new()))


def test_expand_gives_one_row_per_unit_and_refuses_negative_multiplicities(spark, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    (a,) = new_ids(1)
    h = open_handle(url, {a: SA})
    txn = h.begin()
    txns.spark.write_dataframe(
        txn, a, spark.createDataFrame([(1, "x", 3), (2, "y", 1), (3, "z", 1), (3, "z", -1)], A_DDL + ", diff long")
    )
    txn.commit_at(h, 2).apply(h)
    rows = txns.spark.snapshot(spark, url, h.txns_id, a, 2, expand=True)
    assert rows.columns == ["id", "name"]
    assert Counter(tuple(r) for r in rows.collect()) == Counter({(1, "x"): 3, (2, "y"): 1})

    txn = h.begin()
    txn.write(a, (9,), ("q",), -2)
    txn.commit_at(h, 3).apply(h)
    with pytest.raises(Exception, match="negative multiplicity"):
        txns.spark.snapshot(spark, url, h.txns_id, a, 3, expand=True).collect()


def test_a_corrupt_part_is_never_read(spark, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    (a,) = new_ids(1)
    h = open_handle(url, {a: SA})
    txn = h.begin()
    txns.spark.write_dataframe(txn, a, spark.createDataFrame([(i, "x") for i in range(100)], A_DDL).coalesce(1))
    txn.commit_at(h, 2).apply(h)
    (key,) = part_keys(url, a)
    blob = open_location(url).blob
    data = bytearray(blob.get(key) or b"")
    data[len(data) // 2] ^= 0xFF
    blob.set(key, bytes(data))
    with pytest.raises(Exception, match="CRC-32C mismatch"):
        txns.spark.snapshot(spark, url, h.txns_id, a, 2).collect()


def test_importing_txns_does_not_import_pyspark() -> None:
    # (the child prints what it imported; the check is here, not an assert the child could run with -O)
    code = "import sys, txns, persist; print(sorted(m for m in sys.modules if m.split('.')[0] == 'pyspark'))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]", f"importing txns imported pyspark modules: {out.strip()[:500]}"


# ---- the streaming source -----------------------------------------------------------------------


def test_stream_resumes_from_its_checkpoint_without_duplicates_or_gaps(spark, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    (a,) = new_ids(1)
    h = open_handle(url, {a: SA})
    for ts, updates in [(2, [(i, 1) for i in range(5)]), (3, [(5, 1), (0, -1)])]:
        txn = h.begin()
        for i, d in updates:
            txn.write(a, (i,), (f"n{i}",), d)
        txn.commit_at(h, ts).apply(h)
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")

    def run() -> Counter:
        stream = (
            spark.readStream.format("txns")
            .option("url", url)
            .option("txns_id", h.txns_id)
            .option("data_id", a)
            .option("as_of", 2)
            .load()
        )
        q = stream.writeStream.format("parquet").option("path", out).option("checkpointLocation", ckpt)
        query = q.trigger(availableNow=True).start()
        query.awaitTermination(120)
        assert query.exception() is None
        return Counter(tuple(r) for r in spark.read.parquet(out).select("id", "name", "ts", "diff").collect())

    first = Counter({(i, f"n{i}", 2, 1): 1 for i in range(5)}) + Counter({(5, "n5", 3, 1): 1, (0, "n0", 3, -1): 1})
    assert run() == first

    txn = h.begin()
    txn.write(a, (6,), ("n6",), 1)
    txn.commit_at(h, 5).apply(h)
    h.begin().commit_at(h, 7)  # time passes, no write to a
    txn = h.begin()
    txn.write(a, (1,), ("n1",), -1)
    txn.commit_at(h, 8)  # committed, not applied: the source applies it
    second = first + Counter({(6, "n6", 5, 1): 1, (1, "n1", 8, -1): 1})
    assert run() == second
    assert run() == second  # nothing new: nothing more

    batch = spark.read.format("txns").option("url", url).option("txns_id", h.txns_id).option("data_id", a)
    rows = batch.option("as_of", 4).load().collect()
    assert {r["ts"] for r in rows} == {4}
    sums: Counter = Counter()
    for r in rows:
        sums[((r["id"],), (r["name"],))] += r["diff"]
    assert +sums == Counter(py_contents(h, a, 4))


# ---- compaction ---------------------------------------------------------------------------------------


def test_spark_compaction_preserves_reads_at_and_past_the_since(spark, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    (a,) = new_ids(1)
    h = open_handle(url, {a: SA}, PersistConfig(compaction_enabled=False))
    rng = random.Random(5)
    for ts in range(2, 9):
        txn = h.begin()
        for _ in range(30):
            txn.write(a, (rng.randint(0, 15),), (rng.choice("xy"),), rng.choice([1, 1, 2, -1]))
        txn.commit_at(h, ts).apply(h)
    txn = h.begin()
    txns.spark.write_dataframe(txn, a, spark.range(0, 400, numPartitions=2).selectExpr("id % 20 as id", "'x' as name"))
    txn.commit_at(h, 9).apply(h)
    client = PersistClient.open(url)
    assert len(client.shard(a).fetch().batches) >= 8
    reader = client.open_leased_reader(a, SA)
    reader.downgrade_since(5)
    before = {as_of: py_contents(h, a, as_of) for as_of in range(5, 10)}

    result = txns.spark.compact(spark, url, a)
    assert result is not None and result.applied and result.since == 5
    state = client.shard(a).fetch()
    assert len(state.batches) == 1 and state.garbage  # merged; the old parts retired
    fresh = TxnsHandle.open(PersistClient.open(url), h.txns_id)
    for as_of, want in before.items():
        assert py_contents(fresh, a, as_of) == want, as_of
    assert contents(txns.spark.snapshot(spark, url, h.txns_id, a, 5), SA) == before[5]

    # With the since at the last time, the merge leaves one time: no (key, val) twice,
    # and a snapshot reads the run as it is, without a shuffle.
    reader.downgrade_since(9)
    result = txns.spark.compact(spark, url, a)
    assert result is not None and result.applied and result.rows_out == len(before[9])
    (run,) = client.shard(a).fetch().batches[0].runs
    assert run.distinct_kv
    df = txns.spark.snapshot(spark, url, h.txns_id, a, 9)
    assert "Exchange" not in df._jdf.queryExecution().executedPlan().toString()
    assert contents(df, SA) == before[9]
    assert txns.spark.compact(spark, url, a) is None  # nothing left to merge


def test_merges_into_one_time_are_marked_distinct_kv() -> None:
    from persist._internal.merge import merge_batches
    from persist._internal.parts import Run

    client = PersistClient.open(f"mem://spark-{ShardId.new()}", PersistConfig(compaction_enabled=False))
    sid = ShardId.new()
    w = client.open_writer(sid, SA)
    w.compare_and_append([(((1,), ("a",)), 0, 1), (((2,), ("b",)), 0, 1)], 0, 1)
    w.compare_and_append([(((1,), ("a",)), 1, 1), (((2,), ("b",)), 1, -1)], 1, 2)
    state = client.shard(sid).fetch()
    merged = {
        since: merge_batches(client.blob, str(sid), SA.arrow, state.batches, since, client.config) for since in (0, 1)
    }
    assert [r.distinct_kv for r in merged[0].runs] == [False]  # (1, a) at 0 and at 1: two rows
    (run,) = merged[1].runs
    assert run.distinct_kv and run.rows == 1  # all at 1: (1, a) x2; (2, b) cancelled
    assert Run.from_json(run.to_json()) == run
    assert run.rewritten(5).distinct_kv


def test_a_planned_snapshot_outlives_compaction_and_garbage_collection(spark, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    (a,) = new_ids(1)
    clock = [int(time.time() * 1000) + 60_000]  # (the hold is written on the real clock: keep near it)
    cfg = PersistConfig(compaction_enabled=False, inline_max_bytes=0, part_grace_s=1, clock_ms=lambda: clock[0])
    h = open_handle(url, {a: SA}, cfg)
    for ts in range(2, 6):
        txn = h.begin()
        txn.write(a, (ts,), (f"v{ts}",), 1)
        txn.commit_at(h, ts).apply(h)
    want = py_contents(h, a, 5)
    df = txns.spark.snapshot(spark, url, h.txns_id, a, 5, valid_for_s=3600)  # planned: names today's parts
    old = set(part_keys(url, a))
    w = PersistClient.open(url, cfg).open_writer(a, SA)
    assert w.compact() >= 1
    clock[0] += 600_000  # far past part_grace_s
    w.collect_garbage()
    assert old <= set(part_keys(url, a)), "the hold keeps the retired parts the plan names"
    assert contents(df, SA) == want

    clock[0] += 3_600_000  # the hold expired: the retired parts go
    w.collect_garbage()
    assert not old & set(part_keys(url, a))
