"""Benchmark of txns.spark.merge: MERGE of 1% changed keys into a big keyed table.

A keyed table ``accounts(id long primary key, balance long, name string)``
of ``--rows`` rows (default 1M; ``--rows 10000000`` for 10M) is written by
Spark executors (``txns.spark.write.write_batch`` + ``EngineTxn.add_batch``,
one commit; ``--partitions`` tasks, each a contiguous id range, so each part
holds a key range). Then, per scenario, a merge of 1% of ``--rows`` changed
keys: half updates of existing keys (balance + 1), a quarter deletes of
existing keys, a quarter new keys (above the greatest id):

- ``window``: the existing keys changed lie in the last 10% of the id range
  (recent rows change: the usual CDC shape); part pruning by key bounds
  reads only the parts of that range.
- ``uniform``: the existing keys changed are spread over the whole id range
  (none of them changed by ``window`` before); every part overlaps the
  updates' key range, so all are read.

Printed per scenario: the merge time (wall clock, including its checks and
the commit), the rows added / retracted, the bytes the merge wrote (the
sizes of the parts of its batch) against the table's total part bytes, the
parts read against the parts in the snapshot plan, and the driver's Python
RSS (start, peak while merging, sampled every 50 ms) and JVM used-heap peak.
The goal: bytes written proportional to the changed rows, not the table;
driver memory flat in the table's and the updates' size.

Usage::

    .venv/bin/python benchmarks/bench_spark_merge.py                    # 1M rows, ~2 minutes on 2 cores
    .venv/bin/python benchmarks/bench_spark_merge.py --rows 10000000    # the 10M of the issue
    .venv/bin/python benchmarks/bench_spark_merge.py --rows 100000 --only window
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_spark import sampled
from common import human_bytes, print_table

import txns
import txns.spark
from persist import PersistConfig
from txns.db.catalog import data_schema
from txns.db.engine import EngineTxn
from txns.spark.merge import _merge
from txns.spark.write import write_batch

SCHEMA = pa.schema([("id", pa.int64()), ("balance", pa.int64()), ("name", pa.string())])
ROW_EXPR = ["id", "id * 10 as balance", "concat('name-', cast(id % 100000 as string)) as name"]


def build(spark, db: txns.Database, n: int, partitions: int) -> float:  # type: ignore[no-untyped-def]
    """Create the table and write ``n`` rows by executors in one commit; return the seconds it took."""
    t0 = time.perf_counter()
    db.create_table("accounts", SCHEMA, primary_key=["id"])
    e = db.entry("accounts", db.latest())
    df = spark.range(0, n, numPartitions=partitions).selectExpr(*ROW_EXPR)
    with db.transaction() as t:
        batch = write_batch(df, db.url, e.data_id, data_schema(e.schema, e.primary_key))
        EngineTxn(t).add_batch("accounts", batch, added=batch.rows, retracted=0, read_table=False)
    return time.perf_counter() - t0


def updates(spark, n: int, top: int, scenario: str):  # type: ignore[no-untyped-def]
    """1% of ``n`` changed keys: half updates, a quarter deletes (existing ids), a quarter new ids above ``top``."""
    changed = max(4, n // 100)
    n_upd, n_del = changed // 2, changed // 4
    n_new = changed - n_upd - n_del
    start = n - n // 10 if scenario == "window" else 0
    off = 0 if scenario == "window" else 2  # (the uniform keys miss the window's: each change is a change)
    stride = max(2, (n - start) // n_upd)
    upd = (
        spark.range(0, n_upd)
        .selectExpr(f"{start} + id * {stride} + {off} as id")
        .selectExpr(
            "id", "id * 10 + 1 as balance", "concat('name-', cast(id % 100000 as string)) as name", "false as gone"
        )
    )
    dele = spark.range(0, n_del).selectExpr(
        f"{start} + id * {stride} + {off + 1} as id",
        "cast(null as long) as balance",
        "cast(null as string) as name",
        "true as gone",
    )
    new = spark.range(top, top + n_new).selectExpr(
        "id", "id * 10 as balance", "concat('new-', cast(id as string)) as name", "false as gone"
    )
    return upd.unionByName(dele).unionByName(new), (n_upd, n_del, n_new)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of the keyed table")
    ap.add_argument("--partitions", type=int, default=0, help="tasks writing the table (default: 4 per core)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--only", nargs="*", choices=["window", "uniform"], default=["window", "uniform"])
    args = ap.parse_args()
    spark = txns.spark.session(args.master, app_name="bench-spark-merge", conf={"spark.sql.shuffle.partitions": "4"})
    spark.sparkContext.setLogLevel("ERROR")
    partitions = args.partitions or 4 * spark.sparkContext.defaultParallelism
    print(f"Spark {spark.version}, master {args.master}, {os.cpu_count()} CPUs, {partitions} write partitions\n")
    tmp = tempfile.mkdtemp(prefix="bench-spark-merge-")
    try:
        # (in-process compaction off: it would merge the merges' small batches while we measure)
        db = txns.connect(f"file://{tmp}/db", config=PersistConfig(compaction_enabled=False))
        n = args.rows
        built = build(spark, db, n, partitions)
        print(f"built {n:,} rows in {built:.1f} s\n")
        rows = []
        top = n
        for scenario in args.only:
            df, (n_upd, n_del, n_new) = updates(spark, n, top, scenario)
            top += n_new
            spark.sparkContext._jvm.java.lang.System.gc()  # type: ignore[union-attr]
            t0 = time.perf_counter()
            with sampled(spark) as peaks:
                info, stats = _merge(db, "accounts", df, delete_column="gone")
            elapsed = time.perf_counter() - t0
            assert (stats.added, stats.retracted) == (n_upd + n_new, n_upd + n_del), stats
            rows.append(
                [
                    scenario,
                    f"{n:,}",
                    f"{n_upd:,} / {n_del:,} / {n_new:,}",
                    f"{elapsed:.1f}",
                    f"{stats.added:,} / {stats.retracted:,}",
                    f"{human_bytes(stats.bytes_written)} ({stats.parts_written})",
                    human_bytes(stats.bytes_total),
                    f"{stats.bytes_written / max(1, stats.bytes_total):.2%}",
                    f"{stats.parts_read} / {stats.parts_total}",
                    human_bytes(peaks["rss_start"]),
                    human_bytes(peaks["rss_peak"]),
                    human_bytes(peaks["heap_peak"]),
                    info.attempts,
                ]
            )
        print_table(
            [
                "keys changed",
                "table rows",
                "upd / del / new",
                "merge s",
                "added / retracted",
                "bytes written (parts)",
                "table bytes",
                "written / table",
                "parts read / total",
                "RSS start",
                "RSS peak",
                "JVM heap peak",
                "attempts",
            ],
            rows,
            title="MERGE of 1% changed keys into a keyed table (txns.spark.merge)",
        )
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
