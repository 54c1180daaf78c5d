"""A DuckDB query's result inserted into a table, against DuckDB writing it to Parquet itself.

``t.insert(table, duckdb.sql(QUERY))`` reads the relation through the Arrow
PyCapsule interface (``__arrow_c_stream__``) batch by batch and writes it
into Parquet parts of a ``file://`` database, committed in one transaction.
The reference is DuckDB's own ``COPY (QUERY) TO 'x.parquet'`` of the same
query (its default, Snappy, and with ZSTD, which is what our parts use).

Every writer runs in a fresh process (imports excluded from its time, the
commit included), so its peak RSS (``VmHWM``) and CPU time (every thread
of the process, DuckDB's included) are its own; the writers take
turns over ``--rounds`` rounds, so a change in the machine's load hits all
alike, and each one's best time counts (the median is shown too). Bytes are
what the writer left on disk: the Parquet file, or every file the insert
added to the database (parts and the commit's state).

Run: ``.venv/bin/python benchmarks/bench_insert_stream.py`` (10M rows, 3
rounds); ``--quick``: 1M rows, 1 round. Results: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from common import emit_json, load

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

QUERY = "SELECT range AS id, range % 1000 AS k, random() AS x FROM range({rows})"

_CHILD = r"""
import json, os, sys, time
import duckdb
import pyarrow as pa
mode, root, query = sys.argv[1], sys.argv[2], sys.argv[3]
duckdb.sql("SET enable_progress_bar = false")  # (it prints to stdout)

def du(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)

def rss_kb(field):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(field + ":"))

if mode.startswith("copy"):
    codec = mode.split("-", 1)[1]
    out = os.path.join(root, "x.parquet")
    start_rss = rss_kb("VmRSS")
    t0, c0 = time.perf_counter(), time.process_time()
    duckdb.sql(f"COPY ({query}) TO '{out}' (FORMAT parquet, COMPRESSION {codec})")
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    rows = duckdb.sql(f"SELECT count(*) FROM read_parquet('{out}')").fetchall()[0][0]
    nbytes = os.path.getsize(out)
else:
    import txns
    url = "file://" + os.path.join(root, "db")
    db = txns.connect(url)
    db.create_table("t", pa.schema([("id", pa.int64()), ("k", pa.int64()), ("x", pa.float64())]))
    db._settle()
    before = du(os.path.join(root, "db"))
    start_rss = rss_kb("VmRSS")
    t0, c0 = time.perf_counter(), time.process_time()
    with db.transaction() as t:
        t.insert("t", duckdb.sql(query))
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    db._settle()  # (the background apply: its state counts in the bytes, not in the time)
    rows = db.table("t").count()
    nbytes = du(os.path.join(root, "db")) - before
    db.close()
print(json.dumps({"rows": rows, "secs": secs, "cpu": cpu, "bytes": nbytes,
                  "peak_rss_mb": rss_kb("VmHWM") / 1024, "start_rss_mb": start_rss / 1024}))
"""

MODES = (
    ("copy-snappy", "DuckDB `COPY ... TO` Parquet (Snappy, its default)"),
    ("copy-zstd", "DuckDB `COPY ... TO` Parquet (ZSTD)"),
    ("txns", "`t.insert(name, duckdb.sql(...))`, committed"),
)


def run(rows: int, rounds: int) -> dict[str, list[dict]]:
    query = QUERY.format(rows=rows)
    runs: dict[str, list[dict]] = {m: [] for m, _ in MODES}
    for _ in range(rounds):
        for mode, _label in MODES:
            with tempfile.TemporaryDirectory() as d:
                out = subprocess.run(
                    [sys.executable, "-c", _CHILD, mode, d, query],
                    capture_output=True,
                    text=True,
                    env={**os.environ, "PYTHONPATH": ROOT},
                )
            if out.returncode:
                raise SystemExit(f"{mode} failed:\n{out.stderr}")
            r = json.loads(out.stdout.splitlines()[-1])
            assert r["rows"] == rows, r
            runs[mode].append(r)
    return runs


def report(rows: int, runs: dict[str, list[dict]]) -> None:
    print(f"\n### Writing the {rows:,}-row result of `{QUERY.format(rows=rows)}` ({load()})\n")
    print(
        "| writer | best time (median) (s) | CPU (s) | bytes (MiB) | peak RSS (MiB) | time vs COPY | CPU vs COPY "
        "| bytes vs COPY |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    best = {m: min(rs, key=lambda x: x["secs"]) for m, rs in runs.items()}
    cpu = {m: min(x["cpu"] for x in rs) for m, rs in runs.items()}
    base = best["copy-snappy"]
    for mode, label in MODES:
        r = best[mode]
        secs = sorted(x["secs"] for x in runs[mode])
        rss = max(x["peak_rss_mb"] for x in runs[mode])
        print(
            f"| {label} | {r['secs']:.2f} ({secs[len(secs) // 2]:.2f}) | {cpu[mode]:.2f} | "
            f"{r['bytes'] / (1 << 20):.1f} | {rss:.0f} | {r['secs'] / base['secs']:.2f}x | "
            f"{cpu[mode] / cpu['copy-snappy']:.2f}x | {r['bytes'] / base['bytes']:.2f}x |"
        )
    print()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--rounds", type=int, default=3, help="rounds (each writer once per round, in turns)")
    p.add_argument("--quick", action="store_true", help="1M rows, 1 round")
    p.add_argument("--json", help="also write the runs to this file")
    args = p.parse_args()
    rows, rounds = (1_000_000, 1) if args.quick else (args.rows, args.rounds)
    runs = run(rows, rounds)
    report(rows, runs)
    emit_json(args.json, {"rows": rows, "runs": runs})


if __name__ == "__main__":
    main()
