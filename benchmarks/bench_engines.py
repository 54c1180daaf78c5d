"""Query engines over txns tables vs the same engines over the same Parquet part files.

Builds, on a local file store, a table ``t(y, x)`` of ``--rows`` rows (10M;
``--quick``: 1M) inserted in ten parts, ``y`` ascending (so each part is a
range of ``y``), and a table ``u(y, z)`` of a tenth as many rows (every
tenth ``y``). Then, in one run, each case's median time over ``--repeat``
runs, txns against the baseline, and the ratio:

- DuckDB ``SELECT sum(x) FROM t [WHERE y >= cut]`` through ``t.to_dataset()``
  (made afresh for every run: its footer reads are counted) and through
  ``db.sql`` (a view over the same parts, DuckDB's own Parquet reader for
  direct local parts) against DuckDB
  ``read_parquet`` of the very part files the dataset names: a full scan,
  and a filter whose statistics prune 90% of the row groups; also the
  full scan through the Arrow PyCapsule (DuckDB on the table variable: no
  pushdown, every row consolidated and streamed);
- a join ``t JOIN u USING (y)`` through ``db.sql`` (one snapshot, both
  tables' datasets made per run) against the same join over
  ``read_parquet`` of both tables' files;
- Polars ``to_polars(lazy=True)`` with the filter, against ``pl.scan_parquet``
  of the same files.

Peak RSS growth (``VmHWM`` reset before each case) is reported per case.

    .venv/bin/python benchmarks/bench_engines.py [--quick] [--rows N] [--repeat R] [--json FILE]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa

import txns
from persist import PersistConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit_json, human_bytes, load, peak_rss_bytes, print_table, reset_peak_rss, rss_bytes

T = pa.schema([("y", pa.int64()), ("x", pa.int64())])
U = pa.schema([("y", pa.int64()), ("z", pa.int64())])
PARTS = 10


def build(root: Path, n: int) -> txns.Database:
    # (no background compaction: the parts stay as written, ten ranges of y)
    db = txns.connect(f"file://{root}/db", config=PersistConfig(compaction_enabled=False))
    db.create_table("t", T)
    db.create_table("u", U)
    step = n // PARTS
    for i in range(PARTS):
        ys = pa.array(range(i * step, (i + 1) * step), pa.int64())
        with db.transaction() as tx:
            tx.insert("t", pa.table([ys, pa.compute.multiply(ys, 3)], schema=T))
    ys = pa.array(range(0, n, 10), pa.int64())
    with db.transaction() as tx:
        tx.insert("u", pa.table([ys, pa.compute.multiply(ys, 7)], schema=U))
    return db


def compare(ours: Callable[[], Any], base: Callable[[], Any], repeat: int) -> dict[str, Any]:
    """Median seconds of each (runs interleaved, so load drifts hit both), results, and peak RSS growth of each."""
    got = {"ours": ours(), "base": base()}  # (warm-up: file cache, imports)
    times: dict[str, list[float]] = {"ours": [], "base": []}
    for _ in range(repeat):
        for k, fn in (("ours", ours), ("base", base)):
            t0 = time.perf_counter()
            got[k] = fn()
            times[k].append(time.perf_counter() - t0)
    rss = {}
    for k, fn in (("ours", ours), ("base", base)):
        before = rss_bytes()
        reset_peak_rss()
        fn()
        rss[k] = max(0, peak_rss_bytes() - before)
    return {"s": {k: statistics.median(v) for k, v in times.items()}, "got": got, "rss": rss}


def run(n: int, repeat: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bench-engines-"))
    try:
        t0 = time.perf_counter()
        db = build(root, n)
        built_s = time.perf_counter() - t0
        t, u = db.table("t"), db.table("u")
        t_files = sorted(t.to_dataset().files)
        u_files = sorted(u.to_dataset().files)
        cut = n - n // PARTS  # y >= cut: the last of ten parts (one row group each up to 1M rows)
        row_groups = sum(pa.parquet.read_metadata(f).num_row_groups for f in t_files)
        want_full = 3 * n * (n - 1) // 2
        want_cut = 3 * sum(range(cut, n))

        def duck_dataset(where: str) -> Callable[[], Any]:
            def go() -> Any:
                d = t.to_dataset()  # noqa: F841 - DuckDB finds it by name
                return duckdb.sql(f"SELECT sum(x) FROM d {where}").fetchall()[0][0]

            return go

        def duck_parquet(where: str) -> Callable[[], Any]:
            return lambda: duckdb.sql(f"SELECT sum(x) FROM read_parquet({t_files!r}) {where}").fetchall()[0][0]

        def duck_capsule() -> Any:
            tt = t  # noqa: F841 - DuckDB finds the variable by name (the Table: its PyCapsule stream)
            return duckdb.sql("SELECT sum(x) FROM tt").fetchall()[0][0]

        def sql_one(where: str) -> Callable[[], Any]:
            return lambda: db.sql(f"SELECT sum(x) FROM t {where}").fetchall()[0][0]

        join = "SELECT count(*), sum(t.x + u.z) FROM t JOIN u USING (y)"

        def join_txns() -> Any:
            return db.sql(join).fetchall()[0]

        def join_parquet() -> Any:
            q = join.replace("FROM t", f"FROM read_parquet({t_files!r}) t").replace(
                "JOIN u", f"JOIN read_parquet({u_files!r}) u"
            )
            return duckdb.sql(q).fetchall()[0]

        def polars_txns() -> Any:
            return t.to_polars(lazy=True).filter(pl.col("y") >= cut).select(pl.col("x").sum()).collect().item()

        def polars_parquet() -> Any:
            return pl.scan_parquet(t_files).filter(pl.col("y") >= cut).select(pl.col("x").sum()).collect().item()

        where = f"WHERE y >= {cut}"
        cases = [
            ("DuckDB sum(x), full scan", duck_dataset(""), duck_parquet(""), want_full, "to_dataset"),
            ("DuckDB sum(x), full scan", sql_one(""), duck_parquet(""), want_full, "db.sql"),
            ("DuckDB sum(x), full scan", duck_capsule, duck_parquet(""), want_full, "PyCapsule (no pushdown)"),
            (
                "DuckDB sum(x) WHERE y >= cut (90% of row groups pruned)",
                duck_dataset(where),
                duck_parquet(where),
                want_cut,
                "to_dataset",
            ),
            (
                "DuckDB sum(x) WHERE y >= cut (90% of row groups pruned)",
                sql_one(where),
                duck_parquet(where),
                want_cut,
                "db.sql",
            ),
            ("DuckDB join t, u (one snapshot)", join_txns, join_parquet, None, "db.sql"),
            ("Polars lazy sum(x) WHERE y >= cut", polars_txns, polars_parquet, want_cut, "to_polars(lazy=True)"),
        ]
        rows, results = [], []
        for name, ours, base, want, how in cases:
            m = compare(ours, base, repeat)
            got_ours, got_base = m["got"]["ours"], m["got"]["base"]
            if got_ours != got_base or (want is not None and got_ours != want):
                raise SystemExit(f"{name}: txns gave {got_ours}, Parquet {got_base}, expected {want}")
            s_ours, s_base = m["s"]["ours"], m["s"]["base"]
            ratio = s_ours / s_base
            rows.append(
                [
                    name,
                    how,
                    f"{s_ours * 1000:.0f} ms",
                    f"{s_base * 1000:.0f} ms",
                    f"{ratio:.2f}x",
                    human_bytes(m["rss"]["ours"]),
                    human_bytes(m["rss"]["base"]),
                ]
            )
            results.append(
                {
                    "case": name,
                    "via": how,
                    "txns_s": s_ours,
                    "parquet_s": s_base,
                    "ratio": ratio,
                    "txns_peak_rss_growth": m["rss"]["ours"],
                    "parquet_peak_rss_growth": m["rss"]["base"],
                }
            )
        print(
            f"\n{n:,} rows in {len(t_files)} parts ({row_groups} row groups), u {n // 10:,} rows; "
            f"built in {built_s:.1f} s; median of {repeat}; {load()}"
        )
        print_table(["case", "txns via", "txns", "Parquet", "ratio", "peak RSS +txns", "peak RSS +Parquet"], rows)
        db.close()
        return {"rows": n, "parts": len(t_files), "row_groups": row_groups, "repeat": repeat, "cases": results}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1M rows, 3 runs per case")
    ap.add_argument("--rows", type=int, default=None, help="rows of t (default 10M; --quick 1M)")
    ap.add_argument("--repeat", type=int, default=None, help="runs per case (default 5; --quick 3)")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON")
    a = ap.parse_args()
    n = a.rows or (1_000_000 if a.quick else 10_000_000)
    repeat = a.repeat or (3 if a.quick else 5)
    emit_json(a.json, run(n, repeat))


if __name__ == "__main__":
    main()
