"""Time to durable and to readable by tables touched (issue #13, "apply in parallel and bounded").

A ``TxnsHandle`` on moto S3, behind :class:`persist.fault_proxy.FaultProxy`
adding ``--latency-ms`` before every request (default 20 ms, a same-region
S3 round trip; ``--latency-ms 0`` is bare moto). For each K (1, 10, 100,
1,000 by default) it registers K data shards, then runs ``--rounds``
rounds of: commit one row to each of the K shards (tidying the previous
round's entries), timed until ``commit`` returns (**durable**: the one
conditional write landed), then ``apply`` (every shard's apply, one state
write per shard, in parallel), timed until the last shard's apply has
landed (**readable**: every table can be read at the commit time without
applying anything) and until ``apply`` returns (with the data shards'
maintenance, which runs after every apply). As in a database, the txns
shard's own maintenance runs off the commit path (after the round,
untimed). The floor is one bare
conditional PUT through the same proxy. Printed: medians over the rounds,
readable / durable, and the requests of a round.

Run: ``.venv/bin/python benchmarks/bench_readable.py`` (about 2 minutes;
``--tables 1 10 100``, ``--rounds``, ``--latency-ms``).
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

import boto3
import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import load, moto_server, open_counted, print_table, total

from persist import Schema, ShardId
from persist.fault_proxy import FaultPlan, FaultProxy
from persist.url import open_location
from txns import Tidy, TxnsHandle

SCHEMA = Schema(key=pa.schema([("k", pa.int64())]), val=pa.schema([("v", pa.string())]))
BUCKET = "readable"


def _floor_ms(endpoint: str, n: int = 20) -> float:
    """Median ms of a bare conditional PUT of a small object (a new key each time)."""
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        s3.put_object(Bucket=BUCKET, Key=f"floor/{uuid.uuid4().hex}", Body=b"x" * 1024, IfNoneMatch="*")
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


class _LastApply:
    """Records when the last data-shard apply of a round landed (wraps ``TxnsHandle._apply_one``)."""

    def __init__(self, h: TxnsHandle) -> None:
        self.at = 0.0
        self._lock = threading.Lock()
        inner = h._apply_one

        def apply_one(data_id: str, ts: int, group: list) -> None:  # type: ignore[type-arg]
            inner(data_id, ts, group)
            with self._lock:
                self.at = max(self.at, time.perf_counter())

        h._apply_one = apply_one  # type: ignore[method-assign]


def run(url: str, k: int, rounds: int) -> dict[str, float]:
    c = open_counted(url)
    h = TxnsHandle.open(c.client, str(ShardId.new()))
    h.maintain_on_commit = False  # (as a database does: the txns shard's maintenance runs off the commit path)
    shards = [str(ShardId.new()) for _ in range(k)]
    for i in range(0, k, 1000):
        h.register(h.upper, dict.fromkeys(shards[i : i + 1000], SCHEMA))
    last = _LastApply(h)
    tidy = Tidy()
    durable, readable, returned, requests = [], [], [], []
    for r in range(rounds + 1):  # (round 0 warms up: opens the data writers)
        txn = h.begin()
        txn.tidy(tidy)
        for j, d in enumerate(shards):
            txn.write(d, (j,), (f"r{r}",), 1)
        before = total(c.snapshot()).requests
        t0 = time.perf_counter()
        res = h.commit(txn)
        t1 = time.perf_counter()
        tidy = res.apply(h)
        t2 = time.perf_counter()
        h.maintain()  # (untimed, as a database's background worker does it)
        if r == 0:
            continue
        durable.append((t1 - t0) * 1000)
        readable.append((last.at - t0) * 1000)
        returned.append((t2 - t0) * 1000)
        requests.append(total(c.snapshot()).requests - before)
    return {
        "durable": statistics.median(durable),
        "readable": statistics.median(readable),
        "returned": statistics.median(returned),
        "requests": statistics.mean(requests),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tables", type=int, nargs="+", default=[1, 10, 100, 1000])
    p.add_argument("--rounds", type=int, default=5, help="measured rounds per K (default 5)")
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--store", choices=("moto", "s3model"), default="moto",
                   help="s3model: persist.s3model over a temporary directory (--latency-ms per request, no cap)")
    a = p.parse_args()
    where = "persist.s3model" if a.store == "s3model" else "moto S3"
    print(f"bench_readable: K tables per commit, {where} + {a.latency_ms:g} ms per request; {load()}", flush=True)
    rows = []
    if a.store == "s3model":
        with tempfile.TemporaryDirectory(prefix="bench-readable-") as tmp:
            model = f"?latency_ms={a.latency_ms:g}&cas_per_key_s=0"
            consensus = open_location(f"s3model+file://{tmp}/floor{model}").consensus
            times = []
            for _ in range(10):
                t0 = time.perf_counter()
                consensus.compare_and_set(uuid.uuid4().hex, None, b"x" * 1024)
                times.append((time.perf_counter() - t0) * 1000)
            floor = statistics.median(times)
            for k in a.tables:
                r = run(f"s3model+file://{tmp}/{k}{model}", k, a.rounds if k < 1000 else max(2, a.rounds // 2))
                rows.append(_row(k, r, floor))
                print(f"  K={k}: {rows[-1]}", flush=True)
        _print(rows, floor)
        return
    with moto_server() as endpoint:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=BUCKET)
        with FaultProxy(endpoint, seed=1, faults=FaultPlan(latency_s=a.latency_ms / 1000)) as proxy:
            floor = _floor_ms(proxy.url)
            for k in a.tables:
                url = f"s3://{BUCKET}/{uuid.uuid4().hex}?endpoint_url={proxy.url}&region=us-east-1"
                r = run(url, k, a.rounds if k < 1000 else max(2, a.rounds // 2))
                rows.append(_row(k, r, floor))
                print(f"  K={k}: {rows[-1]}", flush=True)
    _print(rows, floor)


def _row(k: int, r: dict[str, float], floor: float) -> list[object]:
    return [k, f"{r['durable']:.0f}", f"{r['readable']:.0f}", f"{r['returned']:.0f}",
            f"{r['readable'] / r['durable']:.1f}x", f"{r['durable'] / floor:.1f}x", f"{r['requests']:.0f}"]


def _print(rows: list[list[object]], floor: float) -> None:
    print_table(
        ["tables (K)", "durable ms", "readable ms", "apply returned ms", "readable / durable", "durable / floor",
         "requests per round"],
        rows,
        title=f"commit one row to each of K tables, then apply; medians; floor (one conditional PUT) {floor:.0f} ms",
    )  # fmt: skip


if __name__ == "__main__":
    main()
