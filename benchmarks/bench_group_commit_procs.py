"""Group commit across processes (txns.group_commit) against each process committing for itself.

N processes (each with T threads) commit small transactions (one row of
~100 bytes to the process's own data shard) through ONE txns shard for a
fixed window, in two modes measured in the same run on the same endpoint:

- ``direct``: each thread commits with ``TxnsHandle.commit`` (one
  compare-and-append; a lost race retries at the upper it was told);
- ``group``: each process has one ``GroupCommitter`` shared by its threads:
  direct while uncontended, else the queue, whose sequencer (one process at a
  time) commits everything queued in one conditional write;
- ``queue``: the same with ``direct=False``: every transaction through the queue.

Printed per (mode, N, T): transactions/s, the fewest commits any thread made
in the window (0: a starved thread), p50/p99 commit latency (of every commit
started in the window, also one that ended after it), how many
transactions shared each version of the txns shard (versions written during
the window, from its consensus head: commits plus the cache's hold renewals),
and the floor: a bare conditional-PUT loop on one key from one process.

Storage is moto S3 in a child process, optionally behind
:class:`persist.fault_proxy.FaultProxy` with ``--latency-ms`` added to each
request and ``--cas-per-key-s`` conditional PUTs per key per second (the
real-S3 model of issue #13: ``--latency-ms 60 --cas-per-key-s 15``).

``--store s3model`` runs on :mod:`persist.s3model` instead (the file store
with ``--latency-ms`` slept per request and ``--cas-per-key-s`` conditional
writes per key per second, shared by the processes; no CPU spent on the
model): ``--store s3model --latency-ms 60 --cas-per-key-s 15``.

"p50 / p99 ms" is of every commit started in the window; "p99 ms after 3 s"
of those started ``--settle-s`` (3 s) or more into it (all processes start at once:
their first commits race on the txns shard, switch to the queue and elect a
sequencer). ``--stages`` splits the commits that went through the queue
object by object (wall clock, every process on one machine): the PUT of the
object; from that PUT to the start of the sequencer's listing that found
it; that listing and the read of the object; from there to its round's
write landing; from the landing to the writer returning (its look at the
txns shard). Found by wrapping the committer's ``_enqueue``, ``_read_queue``
and ``_delete`` in the benchmark's processes (the library has no tracing).

Run: ``.venv/bin/python benchmarks/bench_group_commit_procs.py`` (about 3
minutes; ``--quick`` for 1 and 4 processes, 5 s windows).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack
from typing import Any

import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import moto_server, new_bucket_url, print_table, quantile_ms

from persist import PersistClient, Schema, ShardId
from persist.fault_proxy import FaultPlan, FaultProxy
from persist.location import CaSResult
from txns import TimestampUnavailable, TxnsHandle
from txns.group_commit import GroupCommitter

SCHEMA = Schema(key=pa.schema([("k", pa.int64())]), val=pa.schema([("v", pa.string())]))
PAYLOAD = "x" * 100


def _worker(
    url: str,
    txns_id: str,
    data_id: str,
    mode: str,
    threads: int,
    ready: Any,
    go: Any,
    stop: Any,
    out: Any,
    worker: int,
    settle_s: float,
    stages: bool,
) -> None:
    client = PersistClient.open(url)
    handles = [TxnsHandle.open(client, txns_id) for _ in range(threads if mode == "direct" else 1)]
    for h in handles:
        h.maintain_on_commit = False  # (maintenance is the same in both modes: leave it out of the window)
        h.data_writer(data_id)
    group = GroupCommitter(handles[0], direct=mode == "group") if mode in ("group", "queue") else None
    events: list[tuple[str, str, float]] = []  # (--stages) (what, transaction id, wall-clock time)
    if stages and group is not None:
        _trace(group, events)
    latencies: list[list[float]] = [[] for _ in range(threads)]
    settled: list[list[float]] = [[] for _ in range(threads)]  # (commits started settle_s or more into the window)
    errors = [0] * threads
    done = [0] * threads  # commits that ended inside the window, per thread
    ready.put(worker)

    cpu: list[float] = []

    def run(t: int) -> None:
        h = handles[t] if mode == "direct" else handles[0]
        n = 0
        go.wait()
        opened = time.perf_counter()
        if t == 0:
            cpu.append(time.process_time())
        while not stop.is_set():
            s = time.perf_counter()
            try:
                if group is not None:
                    txn = h.begin()
                    txn.write(data_id, (worker * 10**9 + t * 10**7 + n,), (PAYLOAD,), 1)
                    began = time.time()
                    group.commit(txn)
                    if stages:
                        events.extend([("began", txn.id, began), ("returned", txn.id, time.time())])
                else:
                    txn = h.begin()
                    txn.write(data_id, (worker * 10**9 + t * 10**7 + n,), (PAYLOAD,), 1)
                    h.commit(txn)
            except (TimestampUnavailable, Exception):  # noqa: BLE001 - counted and reported
                errors[t] += 1
                continue
            n += 1
            # (a commit started in the window counts for latency also when it ends after it: one that
            # waited through the window is the starvation to see; the rate counts those inside it)
            latencies[t].append(time.perf_counter() - s)
            if s - opened >= settle_s:
                settled[t].append(latencies[t][-1])
            if not stop.is_set():
                done[t] += 1

    ths = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    cpu_s = time.process_time() - cpu[0] if cpu else 0.0
    stats = {
        "cpu_s": cpu_s,
        "queued": group.queued if group else 0,
        "grouped": group.grouped if group else 0,
        "rounds": group.rounds if group else 0,
        "done": sum(done),
        "fewest": min(done),
    }
    if group is not None:
        group.close()
    for h in handles:
        h.close()
    out.put(([x for xs in latencies for x in xs], sum(errors), stats, [x for xs in settled for x in xs], events))


def _trace(group: GroupCommitter, events: list[tuple[str, str, float]]) -> None:
    """(--stages) Record when each queued transaction's object was PUT, listed and read by a sequencer, and
    committed by its round (``_delete`` is called for each member once the round's write landed)."""
    enqueue, read_queue, delete = group._enqueue, group._read_queue, group._delete

    def traced_enqueue(q: Any) -> None:
        enqueue(q)
        events.append(("put", q.txn_id, time.time()))

    def traced_read_queue(at: float, known: frozenset[str]) -> Any:
        started = time.time()
        listing = read_queue(at, known)
        ended = time.time()
        for k in listing.bodies:
            txn_id = k.rsplit("/", 1)[-1]
            events.extend([("listed", txn_id, started), ("read", txn_id, ended)])
        return listing

    def traced_delete(key: str) -> None:
        events.append(("landed", key.rsplit("/", 1)[-1], time.time()))
        delete(key)

    group._enqueue, group._read_queue, group._delete = traced_enqueue, traced_read_queue, traced_delete


STAGES = [("PUT", "began", "put"), ("to the listing", "put", "listed"), ("listing and read", "listed", "read"),
          ("to the write landing", "read", "landed"), ("landing to return", "landed", "returned"),
          ("in all", "began", "returned")]


def print_stages(events: list[tuple[str, str, float]], opened: float, settle_s: float, closed: float) -> None:
    """(--stages) Percentiles of each stage, over the queued transactions started settle_s or more into the
    window and returned inside it (each stamp is the first of its kind for the transaction)."""
    at: dict[str, dict[str, float]] = {}
    for what, txn_id, t in events:
        at.setdefault(txn_id, {}).setdefault(what, t)
    stamps = ("began", "put", "listed", "read", "landed", "returned")
    whole = [a for a in at.values()
             if all(k in a for k in stamps) and a["began"] >= opened + settle_s and a["returned"] <= closed]
    print(f"    stages of {len(whole)} queued transactions (ms):")
    for name, start, end in STAGES:
        xs = sorted(a[end] - a[start] for a in whole)
        if xs:
            q = [quantile_ms(xs, f) for f in (0.5, 0.9, 0.99)]
            print(f"      {name:22s} p50 {q[0]:5.0f}  p90 {q[1]:5.0f}  p99 {q[2]:5.0f}  "
                  f"mean {1000 * sum(xs) / len(xs):5.0f}")


def run_case(url: str, mode: str, procs: int, threads: int, seconds: float, settle_s: float = 3.0,
             stages: bool = False) -> dict:
    client = PersistClient.open(url)
    txns_id = str(ShardId.new())
    admin = TxnsHandle.open(client, txns_id)
    ds = [str(ShardId.new()) for _ in range(procs)]
    admin.register(admin.upper, dict.fromkeys(ds, SCHEMA))
    ctx = multiprocessing.get_context("spawn")
    go, stop, out, ready = ctx.Event(), ctx.Event(), ctx.Queue(), ctx.Queue()
    ps = [
        ctx.Process(target=_worker,
                    args=(url, txns_id, ds[i], mode, threads, ready, go, stop, out, i, settle_s, stages))
        for i in range(procs)
    ]
    for p in ps:
        p.start()
    for _ in ps:  # (spawned interpreters import and open their handles: start the clock when all are ready)
        ready.get(timeout=300)
    time.sleep(0.5)
    v0 = client.consensus.head(txns_id)
    opened = time.time()
    go.set()
    time.sleep(seconds)
    closed = time.time()
    stop.set()
    v1 = client.consensus.head(txns_id)
    results = [out.get(timeout=120) for _ in ps]
    for p in ps:
        p.join(60)
    admin.close()
    lat = sorted(x for r in results for x in r[0])
    steady = sorted(x for r in results for x in r[3])
    if stages:
        print_stages([e for r in results for e in r[4]], opened, settle_s, closed)
    versions = (v1.seqno if v1 else 0) - (v0.seqno if v0 else 0)
    n = sum(r[2]["done"] for r in results)
    return {
        "txns/s": n / seconds,
        "fewest": min(r[2]["fewest"] for r in results),
        "p50 ms": quantile_ms(lat, 0.5),
        "p99 ms": quantile_ms(lat, 0.99),
        "p99 settled ms": quantile_ms(steady, 0.99),
        "txns per version": n / versions if versions else float("nan"),
        "errors": sum(r[1] for r in results),
        "queued": sum(r[2]["queued"] for r in results),
        "grouped": sum(r[2]["grouped"] for r in results),
        "cpu ms/txn": 1000 * sum(r[2]["cpu_s"] for r in results) / max(1, n),
    }


def cas_floor(url: str, seconds: float) -> float:
    """Conditional PUTs per second on one key from one process (each waits for the previous)."""
    client = PersistClient.open(url)
    key = f"floor-{uuid.uuid4().hex}"
    seq: int | None = None
    n = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        if client.consensus.compare_and_set(key, seq, b"x" * 64) is CaSResult.COMMITTED:
            seq = (seq or 0) + 1
            n += 1
    return n / seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--procs", default="1,2,4,8,16")
    p.add_argument("--threads", type=int, default=1, help="threads per process")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--latency-ms", type=float, default=0.0)
    p.add_argument("--cas-per-key-s", type=int, default=None)
    p.add_argument("--modes", default="direct,group,queue")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--settle-s", type=float, default=3.0, help="the second p99: commits started this late or later")
    p.add_argument("--stages", action="store_true", help="split the queued commits' latency by stage")
    p.add_argument("--store", choices=("moto", "s3model"), default="moto",
                   help="s3model: persist.s3model over a temporary directory (latency and cap by the two options)")
    a = p.parse_args()
    procs = [int(x) for x in ("1,4" if a.quick else a.procs).split(",")]
    seconds = 5.0 if a.quick else a.seconds
    with ExitStack() as stack:
        if a.store == "s3model":
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-gc-"))
            cases = iter(range(10**6))

            def new_url() -> str:
                return (f"s3model+file://{tmp}/{next(cases)}?latency_ms={a.latency_ms:g}"
                        f"&cas_per_key_s={a.cas_per_key_s or 0}")
        else:
            endpoint = stack.enter_context(moto_server())

            def new_url() -> str:
                return new_bucket_url(endpoint)
        if a.store == "moto" and (a.latency_ms or a.cas_per_key_s):
            plan = FaultPlan(latency_s=a.latency_ms / 1000, conditional_puts_per_key_s=a.cas_per_key_s)
            proxy = stack.enter_context(FaultProxy(endpoint, faults=plan))
            endpoint = proxy.url
        floor = cas_floor(new_url(), min(seconds, 5.0))
        print(f"floor: {floor:.1f} conditional PUTs/s on one key from one process", flush=True)
        rows = []
        base: dict[str, float] = {}
        for n in procs:
            for mode in a.modes.split(","):
                r = run_case(new_url(), mode, n, a.threads, seconds, a.settle_s, a.stages)
                base.setdefault(mode, r["txns/s"])
                print(f"  {mode} {n}x{a.threads}: {r}", flush=True)
                rows.append([
                    mode, f"{n} x {a.threads}", f"{r['txns/s']:.1f}", f"{r['txns/s'] / base[mode]:.2f}",
                    f"{r['txns/s'] / floor:.2f}", r["fewest"], f"{r['p50 ms']:.0f} / {r['p99 ms']:.0f}",
                    f"{r['p99 settled ms']:.0f}",
                    f"{r['txns per version']:.2f}", f"{r['cpu ms/txn']:.1f}", r["queued"], r["errors"],
                ])  # fmt: skip
        print_table(
            ["mode", "procs x threads", "txns/s", "vs 1 proc", "vs floor", "fewest", "p50 / p99 ms",
             f"p99 ms after {a.settle_s:g} s", "txns per version", "CPU ms/txn", "queued", "errors"],
            rows,
            title=f"one txns shard, {seconds:g} s windows, latency {a.latency_ms:g} ms, "
            f"CAS cap {a.cas_per_key_s or '-'}/key/s; floor {floor:.1f} CAS/s",
        )  # fmt: skip


if __name__ == "__main__":
    main()
