"""Transactions resolved in the data plane, end to end through the database (issue #11): db.submit on moto S3.

N submitting processes each loop: submit a batch of B intents
(``db.submit_many``; B = 1 is one ``db.submit``), then wait for their
outcomes (``txns.db.intents.wait_all(..., resolve=False)``). One more process
resolves in a loop (``db.resolve_intents()``). The intents are the reference
post's workload: 2 reads expecting absence and 2 writes, over 10,000 keys of
one keyed table, keys drawn at random. Printed per (N, B): intents durable
per second, intents resolved per second (outcomes recorded in the window),
the committed fraction, and p50/p99 latency from submit to outcome.

The baseline, measured in the same run with the same contention: the same
read-then-write transactions as interactive database transactions
(``db.run``: read both keys, write both if absent) from N processes.

Run: ``.venv/bin/python benchmarks/bench_submit.py`` (about 3 minutes;
``--quick`` for N = 1, 4 and 6 s windows).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import sys
import time
from collections import deque
from contextlib import ExitStack
from typing import Any

import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import moto_server, new_bucket_url, print_table

import txns
from persist.fault_proxy import FaultPlan, FaultProxy
from txns.db.intents import OUTCOMES, wait_all

KEYS = 10_000
SCHEMA = pa.schema([("k", pa.string()), ("v", pa.string())])


def _intent(rng: random.Random) -> dict[str, Any]:
    a, b = rng.sample(range(KEYS), 2)
    ka, kb = f"k{a}", f"k{b}"
    return {
        "reads": {("kv", ka): None, ("kv", kb): None},
        "writes": {("kv", ka): {"k": ka, "v": "x"}, ("kv", kb): {"k": kb, "v": "x"}},
    }


def _submitter(url: str, batch: int, window: int, seed: int, ready: Any, go: Any, stop: Any, out: Any) -> None:
    """Submit batches of ``batch`` intents, keeping up to ``window`` batches waiting for their outcomes."""
    db = txns.connect(url)
    db.table("kv").to_arrow()  # (warm: the catalog and the table's state)
    ready.put(seed)
    rng = random.Random(seed)
    lat: list[float] = []
    submitted = committed = 0
    waiting: deque[tuple[float, list[Any]]] = deque()
    go.wait()
    while not stop.is_set():
        while len(waiting) < window and not stop.is_set():
            s = time.perf_counter()
            fs = db.submit_many([_intent(rng) for _ in range(batch)])
            submitted += len(fs)
            waiting.append((s, fs))
        if not waiting:
            break
        s, fs = waiting.popleft()
        try:
            outs = wait_all(fs, timeout=60, resolve=False)
        except TimeoutError:
            break
        e = time.perf_counter() - s
        if not stop.is_set():
            lat += [e] * len(outs)
            committed += sum(o.committed for o in outs)
    db.close()
    out.put((lat, submitted, committed))


def _resolver(url: str, ready: Any, go: Any, stop: Any, out: Any) -> None:
    db = txns.connect(url)
    db.resolve_intents()
    ready.put(-1)
    steps = 0
    go.wait()
    while not stop.is_set():
        if db.resolve_intents():
            steps += 1
        else:
            time.sleep(0.002)
    db.close()
    out.put(steps)


def _runner(url: str, seed: int, ready: Any, go: Any, stop: Any, out: Any) -> None:
    """The baseline: the same read-then-write transactions through db.run."""
    db = txns.connect(url)
    db.table("kv").to_arrow()
    ready.put(seed)
    rng = random.Random(seed)
    lat: list[float] = []
    go.wait()

    def fn(t: txns.Transaction) -> None:
        it = _intent(rng)
        keys = [k for _, k in it["reads"]]
        if all(t.get("kv", k) is None for k in keys):
            t.upsert("kv", list(it["writes"].values()))

    while not stop.is_set():
        s = time.perf_counter()
        try:
            db.run(fn, max_attempts=100)
        except txns.TransactionConflict:
            continue
        if not stop.is_set():
            lat.append(time.perf_counter() - s)
    db.close()
    out.put(lat)


def _fresh(endpoint: str) -> str:
    url = new_bucket_url(endpoint)
    db = txns.connect(url)
    db.create_table("kv", SCHEMA, primary_key=["k"])
    db.submit(reads={("kv", "k0"): None}).result()  # (creates the intent tables)
    db.close()
    return url


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return 1000 * xs[min(len(xs) - 1, int(len(xs) * p))] if xs else float("nan")


def run_submit(endpoint: str, procs: int, batch: int, seconds: float, window: int = 1) -> dict[str, float]:
    url = _fresh(endpoint)
    ctx = multiprocessing.get_context("spawn")
    go, stop, out, rout, ready = ctx.Event(), ctx.Event(), ctx.Queue(), ctx.Queue(), ctx.Queue()
    ps = [ctx.Process(target=_submitter, args=(url, batch, window, i, ready, go, stop, out)) for i in range(procs)]
    ps.append(ctx.Process(target=_resolver, args=(url, ready, go, stop, rout)))
    for p in ps:
        p.start()
    for _ in ps:  # (start the clock once every process has imported and opened the database)
        ready.get(timeout=300)
    db = txns.connect(url)
    before = db.table(OUTCOMES).to_arrow().num_rows
    go.set()
    time.sleep(seconds)
    after = db.table(OUTCOMES).to_arrow().num_rows
    stop.set()
    results = [out.get(timeout=120) for _ in range(procs)]
    steps = rout.get(timeout=120)
    for p in ps:
        p.join(60)
    db.close()
    lat = [x for r in results for x in r[0]]
    submitted = sum(r[1] for r in results)
    committed = sum(r[2] for r in results)
    return {
        "durable/s": submitted / seconds,
        "resolved/s": (after - before) / seconds,
        "committed": committed / max(1, len(lat)),
        "p50 ms": _pct(lat, 0.5),
        "p99 ms": _pct(lat, 0.99),
        "steps": steps,
    }


def run_baseline(endpoint: str, procs: int, seconds: float) -> dict[str, float]:
    url = _fresh(endpoint)
    ctx = multiprocessing.get_context("spawn")
    go, stop, out, ready = ctx.Event(), ctx.Event(), ctx.Queue(), ctx.Queue()
    ps = [ctx.Process(target=_runner, args=(url, i, ready, go, stop, out)) for i in range(procs)]
    for p in ps:
        p.start()
    for _ in ps:
        ready.get(timeout=300)
    go.set()
    time.sleep(seconds)
    stop.set()
    lats = [out.get(timeout=120) for _ in ps]
    for p in ps:
        p.join(60)
    lat = [x for xs in lats for x in xs]
    return {"txns/s": len(lat) / seconds, "p50 ms": _pct(lat, 0.5), "p99 ms": _pct(lat, 0.99)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--procs", default="1,4,16")
    p.add_argument("--batches", default="1,100,1000")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--latency-ms", type=float, default=0.0)
    p.add_argument("--quick", action="store_true")
    p.add_argument(
        "--windows", default="1", help="batches each submitter keeps waiting for outcomes at once (1: submit, wait)"
    )
    p.add_argument("--no-baseline", action="store_true", help="skip the db.run rows")
    a = p.parse_args()
    windows = [int(x) for x in a.windows.split(",")]
    procs = [int(x) for x in ("1,4" if a.quick else a.procs).split(",")]
    batches = [int(x) for x in ("1,100" if a.quick else a.batches).split(",")]
    seconds = 6.0 if a.quick else a.seconds
    rows = []
    with ExitStack() as stack:
        endpoint = stack.enter_context(moto_server())
        if a.latency_ms:
            endpoint = stack.enter_context(FaultProxy(endpoint, faults=FaultPlan(latency_s=a.latency_ms / 1000))).url
        for n in procs:
            base = {"txns/s": float("nan"), "p50 ms": float("nan"), "p99 ms": float("nan")}
            if not a.no_baseline:
                base = run_baseline(endpoint, n, seconds)
                print(f"  db.run {n} procs: {base}", flush=True)
                rows.append([n, "db.run (read, then write)", "-", "-", f"{base['txns/s']:.1f}",
                             f"{base['txns/s']:.1f}", "-", f"{base['p50 ms']:.0f} / {base['p99 ms']:.0f}",
                             "1.0x"])  # fmt: skip
            for b in batches:
                for w in windows:
                    r = run_submit(endpoint, n, b, seconds, w)
                    print(f"  submit {n} procs, batch {b}, window {w}: {r}", flush=True)
                    ratio = r["resolved/s"] / base["txns/s"] if base["txns/s"] > 0 else float("nan")
                    rows.append([n, "db.submit + resolver", b, w, f"{r['durable/s']:.0f}", f"{r['resolved/s']:.0f}",
                                 f"{r['committed']:.2f}", f"{r['p50 ms']:.0f} / {r['p99 ms']:.0f}",
                                 f"{ratio:.0f}x"])  # fmt: skip
    print_table(
        ["procs", "path", "intents per submit", "window", "durable/s", "resolved/s", "committed", "p50 / p99 ms",
         "resolved vs db.run"],
        rows,
        title=f"the post's workload over {KEYS:,} keys, {seconds:g} s windows, moto S3"
        + (f" + {a.latency_ms:g} ms per request" if a.latency_ms else ""),
    )  # fmt: skip


if __name__ == "__main__":
    main()
