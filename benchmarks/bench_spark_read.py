"""Spark reads of a table by name vs ``spark.read.parquet`` of the same parts.

Builds a table of ``--rows`` rows (default 1M) on a local file store:
inserted in several parts, then some retracted and re-inserted over a few
transactions (uncompacted: rows and retractions in different runs), and
times ``spark.read.format("txns").load(name)`` (consolidated inside the
data source) against ``spark.read.parquet`` of the very same part files
plus the ``groupBy``/``sum(diff)`` that consolidation needs. Then compacts
the table (one ``distinct_kv`` run: the no-consolidation fast path) and
times both again (Parquet without the groupBy), and ``txns.spark.read_table``,
which reads a compacted table with Spark's own Parquet reader (pages'
CRC-32 checked). Each read is forced by an aggregate over every column.
Prints times and ratios, and for each txns read the driver's memory while
it ran (Python RSS at the start and its peak, sampled every 50 ms, and the
driver JVM's used heap peak): flat from 1M to 10M rows means only plans
and part descriptors reach the driver.

    .venv/bin/python benchmarks/bench_spark_read.py [--rows N]
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

import txns
import txns.spark
from persist import PersistConfig
from txns.spark.tables import enable_pushdown

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_spark import sampled
from common import human_bytes

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("balance", pa.int64())])


def rows(lo: int, hi: int) -> pa.Table:
    ids = pa.array(range(lo, hi), pa.int64())
    names = pa.array([f"name-{i % 1000}" for i in range(lo, hi)])
    return pa.table([ids, names, pa.array([i * 3 for i in range(lo, hi)], pa.int64())], schema=SCHEMA)


MEMORY: list[str] = []
"""One line per timed read: the driver's memory while it ran."""


def timed(fn: Callable[[], object], repeat: int = 3, spark: object = None, label: str = "") -> tuple[float, object]:
    best, out = float("inf"), None
    for i in range(repeat):
        t0 = time.perf_counter()
        if spark is not None and i == repeat - 1:
            with sampled(spark) as peaks:
                out = fn()
            MEMORY.append(
                f"  {label}: driver Python RSS {human_bytes(peaks['rss_start'])} -> peak "
                f"{human_bytes(peaks['rss_peak'])}; driver JVM used heap peak {human_bytes(peaks['heap_peak'])}"
            )
        else:
            out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    n = ap.parse_args().rows
    root = Path(tempfile.mkdtemp(prefix="bench_spark_read_"))
    url = f"file://{root}/db"
    try:
        cfg = PersistConfig(compaction_enabled=False, part_target_bytes=4 << 20)
        db = txns.connect(url, config=cfg)
        db.create_table("t", SCHEMA)
        step = max(1, n // 8)
        with db.transaction() as t:
            for lo in range(0, n, step):
                t.insert("t", rows(lo, min(n, lo + step)))
        tenth = max(1, n // 10)
        for k in range(3):  # retract a tenth and put part of it back, three times
            a = k * tenth
            with db.transaction() as t:
                t.retract("t", rows(a, a + tenth))
                t.insert("t", rows(a, a + tenth // 2))
        spark = txns.spark.session("local[2]", conf={"spark.sql.shuffle.partitions": "4", "spark.driver.memory": "2g"})
        spark.sparkContext.setLogLevel("ERROR")
        txns.spark.register(spark)
        enable_pushdown(spark)
        from pyspark.sql import functions as F

        def agg(df: object) -> object:
            return df.agg(F.count("*"), F.sum("balance"), F.max("name")).collect()  # type: ignore[attr-defined]

        def parts() -> list[str]:
            ts = db.latest()
            plan = db.plan(db.entry("t", ts), ts)
            assert all(r.inline is None for r in plan.runs)
            return [str(root / "db" / "blob" / p.key) for r in plan.runs for p in r.parts]

        def txns_read() -> object:
            return agg(spark.read.format("txns").option("url", url).load("t"))

        def parquet_grouped(paths: list[str]) -> object:
            df = spark.read.parquet(*paths).groupBy("id", "name", "balance").agg(F.sum("diff").alias("diff"))
            return agg(df.where(F.col("diff") > 0))  # (multiplicities are 1 here)

        def parquet_plain(paths: list[str]) -> object:
            return agg(spark.read.parquet(*paths))

        want = db.table("t").count()
        paths = parts()
        ts = db.latest()
        print(f"rows {want}, uncompacted: {len(paths)} parts in {len(db.plan(db.entry('t', ts), ts).runs)} runs")
        t_txns, out = timed(txns_read, spark=spark, label="uncompacted, by name")
        assert out[0][0] == want, out  # type: ignore[index]
        t_pq, out2 = timed(lambda: parquet_grouped(paths))
        assert out2 == out, (out, out2)
        print(f"  txns read {t_txns:.2f}s; parquet + groupBy {t_pq:.2f}s; ratio {t_txns / t_pq:.2f}")

        db.set_table_retention("t", dt.timedelta(milliseconds=1))
        time.sleep(0.05)
        db.compact(["t"])
        paths = parts()
        print(f"compacted: {len(paths)} parts")
        t_txns, out3 = timed(txns_read, spark=spark, label="compacted, by name")
        assert out3 == out
        t_pq, out4 = timed(lambda: parquet_plain(paths))
        assert out4 == out
        t_native, out5 = timed(
            lambda: agg(txns.spark.read_table(spark, url, "t")), spark=spark, label="compacted, read_table"
        )  # Spark's own reader
        assert out5 == out
        print(
            f"  txns read {t_txns:.2f}s; parquet {t_pq:.2f}s; ratio {t_txns / t_pq:.2f}; "
            f"read_table (native) {t_native:.2f}s, ratio {t_native / t_pq:.2f}"
        )
        print("\n".join(MEMORY))
        db.close()
        spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
