"""The database API against pyiceberg (SQL catalog on sqlite) and deltalake, on a local directory.

Two measurements, both printed as Markdown tables (results: benchmarks/README.md):

1. **The everyday flow**, the same steps for each library in the same run:
   create two tables; append 10k rows to each (one atomic commit here, one
   commit per table there: neither can commit two tables atomically without a
   server); read both back; time travel to the first version; history; and
   two more tables in the database (catalog) that is there by then. Each
   step is timed as the median of ``--repeat`` fresh runs (a new directory
   each time).
2. **A big read from a fresh process**: ``to_arrow`` of a table of
   ``--big-rows`` rows (default 10M), time and peak RSS, against pyarrow
   reading the same Parquet part files directly (``pq.read_table`` of the
   list of files); and ``scan()`` streamed batch by batch (peak RSS). The
   readers take turns over ``--rounds`` rounds (so load changes hit all
   alike); each one's best time counts, its median is shown too.

Run: ``.venv/bin/pip install -e '.[bench]' && .venv/bin/python benchmarks/bench_db.py``
(``--big-rows 1000000`` for a quicker run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ROWS = 10_000
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64())])


def data(n: int, offset: int = 0) -> pa.Table:
    import numpy as np

    ids = np.arange(offset, offset + n, dtype=np.int64)
    rng = np.random.default_rng(offset)
    return pa.table(
        {
            "id": pa.array(ids),
            "name": pa.array([f"name-{i}" for i in rng.integers(0, 100_000, n)]),
            "amount": pa.array(rng.random(n) * 1000),
        }
    )


# ---- the everyday flow ---------------------------------------------------------------------


def flow_txns(root: Path) -> dict[str, float]:
    import txns

    t: dict[str, float] = {}
    a, b = data(ROWS), data(ROWS, ROWS)
    s = time.perf_counter()
    db = txns.connect(f"file://{root}/txns")
    with db.transaction() as tx:
        tx.create_table("a", SCHEMA)
        tx.create_table("b", SCHEMA)
    t["create two tables"] = time.perf_counter() - s
    s = time.perf_counter()
    with db.transaction() as tx:  # one atomic commit over both tables
        tx.insert("a", a)
        tx.insert("b", b)
    first = tx.commit_info.ts  # type: ignore[union-attr]
    t["append 10k rows to each"] = time.perf_counter() - s
    with db.transaction() as tx:
        tx.insert("a", data(10))
    s = time.perf_counter()
    ra, rb = db.table("a").to_arrow(), db.table("b").to_arrow()
    t["read both back"] = time.perf_counter() - s
    assert ra.num_rows == ROWS + 10 and rb.num_rows == ROWS
    s = time.perf_counter()
    old = db.table("a").to_arrow(as_of=first)
    t["time travel"] = time.perf_counter() - s
    assert old.num_rows == ROWS
    s = time.perf_counter()
    h = db.history()
    t["history"] = time.perf_counter() - s
    assert h.num_rows >= 3
    s = time.perf_counter()
    with db.transaction() as tx:  # the database is there now: DDL alone
        tx.create_table("c", SCHEMA)
        tx.create_table("d", SCHEMA)
    t["create two more tables"] = time.perf_counter() - s
    db.close()
    return t


def flow_iceberg(root: Path) -> dict[str, float]:
    from pyiceberg.catalog.sql import SqlCatalog

    t: dict[str, float] = {}
    a, b = data(ROWS), data(ROWS, ROWS)
    s = time.perf_counter()
    (root / "iceberg").mkdir()
    cat = SqlCatalog("bench", uri=f"sqlite:///{root}/iceberg/catalog.db", warehouse=f"file://{root}/iceberg")
    cat.create_namespace("ns")
    ta = cat.create_table("ns.a", schema=SCHEMA)
    tb = cat.create_table("ns.b", schema=SCHEMA)
    t["create two tables"] = time.perf_counter() - s
    s = time.perf_counter()
    ta.append(a)  # two commits: not atomic across the tables
    tb.append(b)
    t["append 10k rows to each"] = time.perf_counter() - s
    first = ta.current_snapshot().snapshot_id  # type: ignore[union-attr]
    ta.append(data(10))
    s = time.perf_counter()
    ra = cat.load_table("ns.a").scan().to_arrow()
    rb = cat.load_table("ns.b").scan().to_arrow()
    t["read both back"] = time.perf_counter() - s
    assert ra.num_rows == ROWS + 10 and rb.num_rows == ROWS
    s = time.perf_counter()
    old = cat.load_table("ns.a").scan(snapshot_id=first).to_arrow()
    t["time travel"] = time.perf_counter() - s
    assert old.num_rows == ROWS
    s = time.perf_counter()
    h = cat.load_table("ns.a").history()
    t["history"] = time.perf_counter() - s
    assert len(h) >= 2
    s = time.perf_counter()
    cat.create_table("ns.c", schema=SCHEMA)
    cat.create_table("ns.d", schema=SCHEMA)
    t["create two more tables"] = time.perf_counter() - s
    return t


def flow_delta(root: Path) -> dict[str, float]:
    from deltalake import DeltaTable, write_deltalake

    t: dict[str, float] = {}
    a, b = data(ROWS), data(ROWS, ROWS)
    pa_, pb = str(root / "delta" / "a"), str(root / "delta" / "b")
    s = time.perf_counter()
    DeltaTable.create(pa_, schema=SCHEMA)
    DeltaTable.create(pb, schema=SCHEMA)
    t["create two tables"] = time.perf_counter() - s
    s = time.perf_counter()
    write_deltalake(pa_, a, mode="append")  # two commits: not atomic across the tables
    write_deltalake(pb, b, mode="append")
    t["append 10k rows to each"] = time.perf_counter() - s
    first = DeltaTable(pa_).version()
    write_deltalake(pa_, data(10), mode="append")
    s = time.perf_counter()
    ra = DeltaTable(pa_).to_pyarrow_table()
    rb = DeltaTable(pb).to_pyarrow_table()
    t["read both back"] = time.perf_counter() - s
    assert ra.num_rows == ROWS + 10 and rb.num_rows == ROWS
    s = time.perf_counter()
    old = DeltaTable(pa_, version=first).to_pyarrow_table()
    t["time travel"] = time.perf_counter() - s
    assert old.num_rows == ROWS
    s = time.perf_counter()
    h = DeltaTable(pa_).history()
    t["history"] = time.perf_counter() - s
    assert len(h) >= 2
    s = time.perf_counter()
    DeltaTable.create(str(root / "delta" / "c"), schema=SCHEMA)
    DeltaTable.create(str(root / "delta" / "d"), schema=SCHEMA)
    t["create two more tables"] = time.perf_counter() - s
    return t


def run_flows(repeat: int) -> None:
    flows: dict[str, Callable[[Path], dict[str, float]]] = {
        "txns (file://)": flow_txns,
        "pyiceberg (sqlite catalog)": flow_iceberg,
        "deltalake": flow_delta,
    }
    results: dict[str, dict[str, list[float]]] = {}
    for _ in range(repeat):
        for name, fn in flows.items():
            with tempfile.TemporaryDirectory() as d:
                for step, secs in fn(Path(d)).items():
                    results.setdefault(name, {}).setdefault(step, []).append(secs)
    steps = list(next(iter(results.values())))
    print(f"\n### The everyday flow (median of {repeat} runs, ms; {ROWS:,} rows per table)\n")
    print("| step | " + " | ".join(results) + " |")
    print("|---|" + "---:|" * len(results))
    for step in steps:
        cells = [f"{statistics.median(results[n][step]) * 1000:.1f}" for n in results]
        print(f"| {step} | " + " | ".join(cells) + " |")
    print("| two-table write atomic? | yes (one conditional write) | no (two commits) | no (two commits) |")


# ---- the big read --------------------------------------------------------------------------

_CHILD = r"""
import json, sys, time
import pyarrow.parquet as pq
import txns
mode, url, files = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
t0 = time.perf_counter()  # imports excluded; connecting included
if mode == "pyarrow":
    n = pq.read_table(files).num_rows
elif mode == "to_arrow":
    n = txns.connect(url, create=False).table("big").to_arrow().num_rows
else:
    n = sum(b.num_rows for b in txns.connect(url, create=False).table("big").scan())
secs = time.perf_counter() - t0
# VmHWM: this process's peak RSS (ru_maxrss would start from the parent's at fork)
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"rows": n, "secs": secs, "peak_rss_mb": hwm / 1024}))
"""


def run_big(rows: int, rounds: int = 5) -> None:
    import txns

    with tempfile.TemporaryDirectory() as d:
        url = f"file://{d}/db"
        db = txns.connect(url)
        db.create_table("big", SCHEMA)
        step = 1_000_000
        with db.transaction() as tx:
            for off in range(0, rows, step):
                tx.insert("big", data(min(step, rows - off), off))
        e = db.entry("big", db.latest())
        db.close()  # (waits for the background apply: the parts are then in the table's shard)
        state = db.client.shard(e.data_id).fetch()
        files = sorted(str(Path(d) / "db" / "blob" / k) for k in state.part_keys())
        size_mb = sum(os.path.getsize(f) for f in files) / (1 << 20)
        print(f"\n### Reading {rows:,} rows ({len(files)} Parquet parts, {size_mb:.0f} MiB) from a fresh process\n")
        print("| reader | best time (median) (s) | peak RSS (MiB) | best vs pyarrow's best |")
        print("|---|---:|---:|---:|")
        modes = (
            ("pyarrow", "pyarrow `pq.read_table(files)`"),
            ("to_arrow", "`table.to_arrow()`"),
            ("scan", "`table.scan()` (batches discarded)"),
        )
        # Rounds of one run of each reader, interleaved, so that a change in the
        # machine's load hits every reader alike; each reader's best run counts.
        runs: dict[str, list[dict]] = {mode: [] for mode, _ in modes}
        for _ in range(rounds):
            for mode, _label in modes:
                out = subprocess.run(
                    [sys.executable, "-c", _CHILD, mode, url, json.dumps(files)],
                    capture_output=True,
                    text=True,
                    check=True,
                    env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))},
                )
                runs[mode].append(json.loads(out.stdout))
        base = None
        for mode, label in modes:
            r = min(runs[mode], key=lambda x: x["secs"])
            assert r["rows"] == rows, r
            base = base or r["secs"]
            secs = sorted(x["secs"] for x in runs[mode])
            print(
                f"| {label} | {r['secs']:.2f} ({secs[len(secs) // 2]:.2f}) | "
                f"{max(x['peak_rss_mb'] for x in runs[mode]):.0f} | {r['secs'] / base:.2f}x |"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--big-rows", type=int, default=10_000_000)
    p.add_argument("--skip-big", action="store_true")
    p.add_argument("--rounds", type=int, default=5, help="rounds of the big read (each reader once per round)")
    args = p.parse_args()
    run_flows(args.repeat)
    if not args.skip_big:
        run_big(args.big_rows, args.rounds)


if __name__ == "__main__":
    main()
