"""Many processes, one database: total commits/s, latency, lost races, requests and CPU per commit.

Two workloads, N spawned worker processes each (the window starts when all
are connected and warmed up by one commit or read, and every process runs
inside the same window):

- ``events`` (no collapse): each process loops
  ``with db.transaction() as t: t.insert("events", [{"id": ...}])``.
- ``transfer`` (no starvation): each process loops ``db.run(transfer)`` on
  a keyed table of 6 accounts (read two balances, refuse an overdraft with
  ``txns.Abort``, upsert both): the workload of
  ``tests/db/test_starvation.py``; reported: calls/s, p99 and max latency,
  most attempts, how often a call took the run turn, and calls that gave up.
- ``floor`` (what the machine and the store allow): each process loops
  bare conditional PUTs (a consensus ``compare_and_set`` of the next
  version, 1 request, no read) on a key of its own, so nothing contends
  but the machine: the requests/s N processes get out of the store, and
  the client CPU per request. A commit rate is bounded by this rate over
  the requests per commit.

Stores: ``moto`` (moto's S3 server in a child process, over HTTP),
``seaweedfs`` (a real S3 server: SeaweedFS's ``weed server`` on loopback,
as in the tests; not in the default list),
``file`` (a local directory) and ``s3model`` (the file store behind
:mod:`persist.s3model`: 60 ms per request, 15 conditional writes/s per
key, no CPU). Latencies are of every commit started in the window, also
one that ends after it (a commit that waited through the window is the
starvation to see); the rate counts commits that ended inside it, and
"fewest" is the commits of the process that made the fewest (0: one
starved). Every store is opened through a counting wrapper
(``counted+s3://``, ``counted+file://``, registered here; the model counts
itself), so per committed transaction the table gives: lost races
(compare-and-sets answered MISMATCH), storage requests (calls of the
backend API; on S3 a consensus ``head`` is 2 HTTP requests) and the CPU
milliseconds of the worker processes (``time.process_time``, their
background threads included; moto's server process is not included); on
S3 also the HTTP requests the workers' clients sent (every attempt).

Run: ``.venv/bin/python benchmarks/bench_contention.py`` (file, s3model, moto; 1, 2,
4, 8, 16 processes, 20 s windows: about 20 minutes; shorter windows at 8-16
processes mostly measure the start of contention);
``--stores file --procs 1,4,8 --seconds 5`` for a quick look;
``--workload transfer --procs 3,8,16`` for the starvation numbers;
``--breakdown`` adds storage calls per commit by operation and key (with
``BENCH_BY_THREAD=1`` also by thread, ``BENCH_BY_STACK=consensus.scan`` by
the txns call chain) and each process's queue counters; ``BENCH_LOG=/tmp/x``
logs the queue's and the applier's decisions, and every storage call with
its duration, to ``/tmp/x-N.log``.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import random
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from typing import Any

import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import MOTO_SERVERS, moto_server, new_bucket_url, print_table, quantile_ms

import txns
from persist.location import CaSResult
from persist.unreliable import Counters, CountingBlob, CountingConsensus, Op
from persist.url import Location, LocationURL, open_location, register_scheme, schemes
from tests.db.test_starvation import ACCOUNTS, TABLE, make_bank


class _KeyCounts:
    """Calls per (operation, key, outcome), for ``--breakdown`` (key: a consensus key, or a blob key's first part)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: collections.Counter[tuple[str, str, str]] = collections.Counter()

    def add(self, op: Op, what: str, result: Any) -> None:
        key = what.split(" ")[0].strip("'")
        if op.value.startswith("blob"):
            parts = key.split("/")
            key = "/".join(parts[:3]) if len(parts) > 2 and parts[1] == "queue" else parts[0].split("-")[0] + "/..."
        outcome = "lost" if result is CaSResult.MISMATCH else ""
        if BY_THREAD:
            outcome += " @" + threading.current_thread().name.split("_")[0].rstrip("0123456789-")
            if BY_STACK and op.value in BY_STACK:
                import traceback
                fs = [f for f in traceback.extract_stack()[:-3] if "/txns/" in f.filename]
                outcome += " <" + " < ".join(f.name for f in reversed(fs[-5:]))
        with self.lock:
            self.counts[(op.value, key, outcome)] += 1


KEY_COUNTS = _KeyCounts()


class _KeyCounting:
    """Mixed into the counting wrappers: every call also goes into ``KEY_COUNTS``."""

    def _run(self, op: Op, what: str, call: Any, written: int = 0, read: Any = None) -> Any:
        started = time.perf_counter()
        r = super()._run(op, what, call, written, read)  # type: ignore[misc]
        KEY_COUNTS.add(op, what, r)
        if CALL_LOG:
            n = len(r) if isinstance(r, list) else "lost" if r is CaSResult.MISMATCH else ""
            CALL_LOG.debug("%s %s %s %.0f ms", op.value, what.split(" ")[0][-24:], n,
                           1000 * (time.perf_counter() - started))
        return r


class _KeyCountedBlob(_KeyCounting, CountingBlob):
    pass


class _KeyCountedConsensus(_KeyCounting, CountingConsensus):
    pass


def _open_counted(u: LocationURL) -> Location:
    inner = open_location(u.url[len("counted+") :])
    counters = Counters()
    return Location(u.url, _KeyCountedBlob(inner.blob, counters), _KeyCountedConsensus(inner.consensus, counters))


for _inner in ("s3", "file"):
    if f"counted+{_inner}" not in schemes():
        register_scheme(f"counted+{_inner}", _open_counted, forms=f"counted+{_inner}://...")


def _counts(db: txns.Database) -> tuple[int, int]:
    """(storage calls, CAS mismatches) so far through ``db``'s counting wrapper."""
    consensus = db.client.consensus
    if not isinstance(consensus, CountingConsensus):
        return 0, 0
    snap = consensus.counters.snapshot()
    return sum(s.calls for s in snap.values()), snap[Op.CAS].mismatches if Op.CAS in snap else 0


def _model_requests(db: txns.Database) -> int:
    model = getattr(db.client.consensus, "model", None)
    return int(model.requests) if model is not None else 0


HTTP = [0]  # HTTP requests this process sent to S3 (every attempt; ``_count_http``)


def _count_http() -> None:
    """Count every HTTP request of the S3 clients this process makes from now on, into ``HTTP``."""
    import persist.s3

    make = persist.s3.make_client

    def counted(*args: Any, **kwargs: Any) -> Any:
        client = make(*args, **kwargs)
        client.meta.events.register("before-send.s3", lambda **_: HTTP.__setitem__(0, HTTP[0] + 1))
        return client

    persist.s3.make_client = counted


def _worker(url: str, workload: str, wid: int, ready: Any, go: Any, stop: Any, out: Any, settle_s: float) -> None:
    rng = random.Random(wid)
    _count_http()
    if os.environ.get("BENCH_LOG"):  # (debugging: the queue's and the applier's decisions, one file per process)
        import logging
        logging.basicConfig(filename=f"{os.environ['BENCH_LOG']}-{wid}.log", level=logging.WARNING,
                            format="%(relativeCreated)d %(threadName)s %(name)s %(message)s")
        for name in ("txns.group_commit", "txns.db.applier", "txns.db.committer", "bench.calls"):
            logging.getLogger(name).setLevel(logging.DEBUG)
        global CALL_LOG
        CALL_LOG = logging.getLogger("bench.calls")
    if workload == "floor":
        _floor_worker(url, wid, ready, go, stop, out)
        return
    db = txns.connect(url)
    # warm the process's caches and handles outside the window (the first commit opens writers)
    if workload == "transfer":
        db.table(TABLE).to_arrow()
    else:
        with db.transaction() as t:
            t.insert("events", [{"id": f"{wid}-warm"}])
    ready.put(wid)
    go.wait()
    calls0, lost0 = _counts(db)
    with KEY_COUNTS.lock:
        keys0 = collections.Counter(KEY_COUNTS.counts)
    req0 = _model_requests(db)
    http0 = HTTP[0]
    cpu0 = time.process_time()
    opened = time.perf_counter()
    lat: list[float] = []
    settled: list[float] = []  # (the latencies of commits started settle_s or more into the window)
    attempts: list[int] = []
    aborted = gave_up = errors = 0
    n = done = 0  # commits started in the window, and ended inside it
    while not stop.is_set():
        s = time.perf_counter()
        try:
            if workload == "events":
                with db.transaction() as t:
                    t.insert("events", [{"id": f"{wid}-{n}"}])
            else:
                src, dst = rng.sample(ACCOUNTS, 2)
                amount = rng.randint(1, 40)

                def transfer(t: txns.Transaction, src: str = src, dst: str = dst, amount: int = amount) -> None:
                    a, b = t.get(TABLE, src), t.get(TABLE, dst)
                    if a["balance"] < amount:
                        raise txns.Abort("overdraft")
                    t.upsert(TABLE, [{"account": src, "balance": a["balance"] - amount},
                                     {"account": dst, "balance": b["balance"] + amount}])

                try:
                    attempts.append(db.run(transfer).attempts)
                except txns.Abort:
                    aborted += 1
        except txns.TransactionConflict:
            gave_up += 1
            continue
        except Exception:  # noqa: BLE001 - counted and reported
            errors += 1
            continue
        n += 1
        # (every commit started inside the window counts for latency, also one that ends after it:
        # a commit that waited through the window is the starvation to see)
        lat.append(time.perf_counter() - s)
        if s - opened >= settle_s:
            settled.append(lat[-1])
        if not stop.is_set():
            done += 1
    cpu = time.process_time() - cpu0
    calls1, lost1 = _counts(db)
    turns = db._run_turns.taken
    qc = db.committer._queue_committer
    queue_stats = {"queued": qc.queued, "rounds": qc.rounds, "grouped": qc.grouped,
                   "leases": qc.lease.acquired} if qc is not None else {}
    queue_stats["groups"] = db.committer.group_commits
    with KEY_COUNTS.lock:
        keys = KEY_COUNTS.counts - keys0
    txns_id = db.root.txns_id
    named: collections.Counter[str] = collections.Counter()
    for (op, key, outcome), c in keys.items():
        key = key.replace(txns_id, "TXNS")
        named[f"{op} {key if key.startswith('TXNS') else 'shard ' + key[:10]} {outcome}".strip()] += c
    out.put({"queue": queue_stats, "keys": named, "lat": lat, "settled": settled, "cpu": cpu, "calls": calls1 - calls0,
             "lost": lost1 - lost0, "done": done, "requests": _model_requests(db) - req0, "http": HTTP[0] - http0,
             "attempts": attempts,
             "aborted": aborted, "gave_up": gave_up, "errors": errors, "turns": turns})
    db.close()


def _floor_worker(url: str, wid: int, ready: Any, go: Any, stop: Any, out: Any) -> None:
    """The ``floor`` workload: bare conditional PUTs of the next version of a key of this process's own."""
    consensus = open_location(url.removeprefix("counted+")).consensus
    key, body = f"floor-{wid}", b"x" * 200
    seqno = 0
    for _ in range(3):  # (warm: the connection pool, the key's first versions)
        if consensus.compare_and_set(key, seqno or None, body) is not CaSResult.COMMITTED:
            raise RuntimeError(f"the floor's key {key} was written by someone else")
        seqno += 1
    ready.put(wid)
    go.wait()
    cpu0, http0 = time.process_time(), HTTP[0]
    lat: list[float] = []
    done = 0
    while not stop.is_set():
        s = time.perf_counter()
        if consensus.compare_and_set(key, seqno, body) is not CaSResult.COMMITTED:
            raise RuntimeError(f"the floor's key {key} was written by someone else")
        seqno += 1
        lat.append(time.perf_counter() - s)
        if not stop.is_set():
            done += 1
    out.put({"queue": {}, "keys": collections.Counter(), "lat": lat, "settled": lat, "cpu": time.process_time() - cpu0,
             "calls": len(lat), "lost": 0, "done": done, "requests": 0, "http": HTTP[0] - http0,
             "attempts": [], "aborted": 0,
             "gave_up": 0, "errors": 0, "turns": 0})


def run_case(url: str, workload: str, procs: int, seconds: float, settle_s: float = 3.0) -> dict[str, Any]:
    if workload != "floor":
        db = txns.connect(url)
        if workload == "events":
            db.create_table("events", pa.schema([("id", pa.string())]))
        db.close()
    if workload == "transfer":
        make_bank(url)
    ctx = multiprocessing.get_context("spawn")
    ready, go, stop, out = ctx.Queue(), ctx.Event(), ctx.Event(), ctx.Queue()
    ps = [ctx.Process(target=_worker, args=(url, workload, i, ready, go, stop, out, settle_s)) for i in range(procs)]
    for p in ps:
        p.start()
    for _ in ps:
        ready.get(timeout=600)
    time.sleep(0.5)
    go.set()
    time.sleep(seconds)
    stop.set()
    rs = [out.get(timeout=900) for _ in ps]
    for p in ps:
        p.join(120)
        if p.is_alive():
            p.kill()
    lat = sorted(x for r in rs for x in r["lat"])
    if BREAKDOWN:
        print("      per process:", [r["queue"] for r in rs])
        print("      per process (commits, CPU s):", [(r["done"], round(r["cpu"], 2)) for r in rs])
        keys: collections.Counter[str] = sum((r["keys"] for r in rs), collections.Counter())
        per = max(1, len(lat))
        for k, c in sorted(keys.items(), key=lambda kv: -kv[1])[:25]:
            print(f"      {c / per:7.2f} / commit  {k}")
    n = len(lat)
    steady = sorted(x for r in rs for x in r["settled"])
    in_window = sum(r["done"] for r in rs)
    done = max(1, n)
    calls = sum(r["calls"] for r in rs) or sum(r["requests"] for r in rs)
    return {
        "per_s": in_window / seconds,
        "fewest": min(r["done"] for r in rs),
        "p50": quantile_ms(lat, 0.5),
        "p99": quantile_ms(lat, 0.99),
        "max": quantile_ms(lat, 1.0),
        "p99 settled": quantile_ms(steady, 0.99),
        "lost": sum(r["lost"] for r in rs) / done,
        "calls": calls / done,
        "cpu_ms": 1000 * sum(r["cpu"] for r in rs) / done,
        "http": sum(r["http"] for r in rs) / done,
        "attempts": max((a for r in rs for a in r["attempts"]), default=0),
        "aborted": sum(r["aborted"] for r in rs),
        "gave_up": sum(r["gave_up"] for r in rs),
        "errors": sum(r["errors"] for r in rs),
        "turns": sum(r["turns"] for r in rs),
    }


BREAKDOWN = False
CALL_LOG: Any = None  # (BENCH_LOG=...: every storage call, its duration, in the process's log)
BY_STACK = os.environ.get("BENCH_BY_STACK", "")  # (operations whose txns call chain to show, e.g. consensus.scan)
BY_THREAD = os.environ.get("BENCH_BY_THREAD") == "1"  # (--breakdown: also by the calling thread's name)


def main() -> None:
    global BREAKDOWN
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--stores", default="file,s3model,moto")
    p.add_argument("--procs", default="1,2,4,8,16")
    # (20 s: at 8-16 processes an 8 s window mostly measured the start of contention, 1.5-4x lower)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--workload", choices=("events", "transfer", "floor"), default="events")
    p.add_argument("--latency-ms", type=float, default=60.0, help="the S3 model's latency per request")
    p.add_argument("--cas-per-key-s", type=float, default=15.0, help="the S3 model's cap per key")
    p.add_argument("--settle-s", type=float, default=3.0,
                   help="the 'settled' p99 counts the commits started this long or more into the window")
    p.add_argument("--breakdown", action="store_true", help="print storage calls per commit by operation and key")
    p.add_argument("--moto-server", choices=MOTO_SERVERS, default="cheroot",
                   help="what serves moto's app (werkzeug: moto's own, which closes every connection)")
    a = p.parse_args()
    BREAKDOWN = a.breakdown
    rows = []
    with ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-contention-"))
        endpoint = stack.enter_context(moto_server(server=a.moto_server)) if "moto" in a.stores else ""
        weed = ""
        if "seaweedfs" in a.stores:
            from persist.testing import fake_aws_env
            from tests.seaweedfs import seaweedfs_server

            stack.enter_context(fake_aws_env())
            weed = stack.enter_context(seaweedfs_server())
        for store in a.stores.split(","):
            base = None
            for n in [int(x) for x in a.procs.split(",")]:
                case = f"{tmp}/{store}-{a.workload}-{n}"
                url = {
                    "file": f"counted+file://{case}",
                    "s3model": f"s3model+file://{case}?latency_ms={a.latency_ms:g}&cas_per_key_s={a.cas_per_key_s:g}",
                    "moto": "counted+" + new_bucket_url(endpoint, f"{a.workload}-{n}") if endpoint else "",
                    "seaweedfs": "counted+" + new_bucket_url(weed, f"{a.workload}-{n}") if weed else "",
                }[store]
                r = run_case(url, a.workload, n, a.seconds, a.settle_s)
                base = base or r["per_s"]
                print(f"  {store} {n}: {r}", flush=True)
                rows.append([store, n, f"{r['per_s']:.1f}", f"{r['per_s'] / base:.2f}", r["fewest"], f"{r['p50']:.0f}",
                             f"{r['p99']:.0f}", f"{r['p99 settled']:.0f}", f"{r['max']:.0f}", f"{r['lost']:.2f}",
                             f"{r['calls']:.1f}",
                             f"{r['http']:.1f}" if r["http"] else "-", f"{r['cpu_ms']:.1f}", r["attempts"], r["turns"],
                             r["gave_up"], r["errors"]])
    print_table(
        ["store", "procs", "commits/s", "x 1 proc", "fewest", "p50 ms", "p99 ms", f"p99 ms after {a.settle_s:g} s",
         "max ms", "lost races/commit", "requests/commit", "HTTP/commit", "CPU ms/commit", "most attempts",
         "turns taken", "gave up", "errors"],
        rows,
        title=f"{a.workload}: {a.seconds:g} s windows, load {os.getloadavg()[0]:.1f}",
    )


if __name__ == "__main__":
    main()
