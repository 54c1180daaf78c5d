"""Group commit in one process: threads sharing one database object, on moto S3 with added latency.

Each of N threads commits small write-only transactions (one row) through
the same ``txns.Database``; concurrent commits share conditional writes
(``Committer._commit_group``). Printed per thread count: commits/s, p50/p99
commit latency, transactions per conditional write on the txns shard, and
the conditional PUTs counted on the wire (``PUT consensus``), against the
same workload with group commit switched off (each transaction its own
write, as before group commit) measured in the same run. Also a
read-then-write mix (increments of 16 keyed counters through ``db.run``).

S3 is moto (in a child process, so it does not compete for this process's GIL)
behind :class:`persist.fault_proxy.FaultProxy` adding
``--latency-ms`` before each request (default 20 ms: a same-region S3 round
trip is 10-30 ms), so waiting on storage, not Python, dominates, as it does
on real S3. ``--store s3model`` runs on :mod:`persist.s3model` instead (a
temporary directory with ``--latency-ms`` slept per request and
``--cas-per-key-s`` conditional writes per key per second; no CPU spent on
storage).

Run: ``.venv/bin/python benchmarks/bench_group_commit.py`` (about 2 minutes).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

import boto3
import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import moto_server  # moto in a child process: it does not share our GIL

import txns
from persist.fault_proxy import FaultPlan, FaultProxy
from txns.db import committer as committer_module

BUCKET = "bench-group-commit"


@contextmanager
def ungrouped() -> Iterator[None]:
    """Group commit off: every commit leads a group of one (the baseline)."""
    original = committer_module.Committer._form_group

    def one(self: committer_module.Committer, members: list, upper: int) -> list:
        return original(self, members[:1], upper)

    committer_module.Committer._form_group = one  # type: ignore[method-assign]
    try:
        yield
    finally:
        committer_module.Committer._form_group = original  # type: ignore[method-assign]


def run_case(url: str, threads: int, per_thread: int, work: Callable[[txns.Database, int, int], None]) -> dict:
    db = txns.connect(url)
    db.create_table("e", pa.schema([("w", pa.int64()), ("i", pa.int64())]))
    db.create_table("c", pa.schema([("k", pa.string()), ("n", pa.int64())]), primary_key=["k"])
    with db.transaction() as t:
        t.insert("c", [{"k": f"c{i}", "n": 0} for i in range(16)])
    latencies: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(threads)
    g0, t0 = db.group_commits, db.grouped_transactions

    def worker(w: int) -> None:
        barrier.wait()
        for i in range(per_thread):
            s = time.perf_counter()
            work(db, w, i)
            with lock:
                latencies.append(time.perf_counter() - s)

    ths = [threading.Thread(target=worker, args=(w,)) for w in range(threads)]
    start = time.perf_counter()
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    elapsed = time.perf_counter() - start
    groups, grouped = db.group_commits - g0, db.grouped_transactions - t0
    db.close()
    latencies.sort()
    return {
        "commits/s": len(latencies) / elapsed,
        "p50 ms": 1000 * statistics.median(latencies),
        "p99 ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "txns per write": grouped / groups if groups else 0.0,
    }


def insert_one(db: txns.Database, w: int, i: int) -> None:
    with db.transaction() as t:
        t.insert("e", [{"w": w, "i": i}])


def increment(db: txns.Database, w: int, i: int) -> None:
    key = f"c{(w * 7 + i) % 16}"

    def bump(t: txns.Transaction) -> None:
        row = t.get("c", key)
        t.upsert("c", [{"k": key, "n": row["n"] + 1}])

    db.run(bump, max_attempts=1000)


WORKLOADS = (
    ("insert", "write-only (one-row insert)", insert_one),
    ("increment", "read-then-write (db.run increment)", increment),
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--commits", type=int, default=64, help="commits per case (split over the threads)")
    p.add_argument("--threads", default="1,4,16")
    p.add_argument("--store", choices=("moto", "s3model"), default="moto")
    p.add_argument("--cas-per-key-s", type=int, default=0,
                   help="s3model: conditional writes per key per second (0: no cap)")
    p.add_argument("--workloads", default="insert,increment", help="of: insert, increment")
    args = p.parse_args()
    counts = [int(x) for x in args.threads.split(",")]
    with ExitStack() as stack:
        if args.store == "moto":
            endpoint = stack.enter_context(moto_server())
            boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=BUCKET)
            plan = FaultPlan(latency_s=args.latency_ms / 1000)
            proxy = stack.enter_context(FaultProxy(endpoint, seed=1, faults=plan))

            def url() -> str:
                return f"s3://{BUCKET}/{uuid.uuid4().hex}?endpoint_url={proxy.url}&region=us-east-1"
        else:
            tmp = stack.enter_context(tempfile.TemporaryDirectory())

            def url() -> str:
                return (f"s3model+file://{tmp}/{uuid.uuid4().hex}?latency_ms={args.latency_ms:g}"
                        f"&cas_per_key_s={args.cas_per_key_s}")

        chosen = args.workloads.split(",")
        for name, title, work in WORKLOADS:
            if name not in chosen:
                continue
            print(f"\n### {title}, {args.store}, {args.latency_ms:g} ms per request\n")
            print(
                "| threads | grouped: commits/s | p50 ms | p99 ms | txns per write "
                "| alone: commits/s | p50 ms | p99 ms | gain |"
            )
            print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            for n in counts:
                per = max(2, args.commits // n)
                g = run_case(url(), n, per, work)
                with ungrouped():
                    a = run_case(url(), n, per, work)
                print(
                    f"| {n} | {g['commits/s']:.1f} | {g['p50 ms']:.0f} | {g['p99 ms']:.0f} "
                    f"| {g['txns per write']:.1f} "
                    f"| {a['commits/s']:.1f} | {a['p50 ms']:.0f} | {a['p99 ms']:.0f} "
                    f"| {g['commits/s'] / a['commits/s']:.2f}x |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
