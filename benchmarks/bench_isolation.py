"""Isolation levels and read-then-write transactions: throughput and requests per transaction.

Two measurements, printed as Markdown tables (results: benchmarks/README.md,
"Isolation"):

1. **Transfers per second** (``--only throughput``): a keyed ``accounts``
   table (``--accounts`` rows, 100 by default) and ``db.run(transfer)``
   between two random accounts (two ``get`` + one ``upsert`` of both rows),
   with 1/4/16 workers as threads in one process (each thread its own
   ``txns.connect(url)`` database object), as 4/16 threads sharing one
   database object (where the group commit can put several transactions in
   one conditional write), and as 1/4 processes (each its own interpreter;
   more do not fit 2 cores: ``--processes 1 4 8``), at both isolation
   levels, ``--seconds`` per row on a fresh database. Per row: commits/s,
   p50/p99 latency of a committed transfer (``db.run`` call to return,
   re-runs included), re-runs of the function per commit
   (``CommitInfo.attempts - 1``), and the validations run after a lost
   commit race (``txns.db.validation.conflict`` as ``txns.db.committer``
   calls it, wrapped in the measured process): how many found the inputs unchanged, and how many commits took
   that path (committed at a later time without re-running the function);
   "uncertain retries" counts commit attempts made on the exactly-once
   recovery path (a ``CommitRequest`` with ``uncertain=True``: an earlier attempt of
   the transaction "may have written", so it first looks itself up).
   Requests per commit are counted on the wire (S3/moto), the committing
   threads' and the background apply worker's apart.
2. **Requests per transaction** (``--only requests``): one database object
   in steady state (after a warm-up), transactions one after another: a
   read-only one (``db.read()`` + one ``get``), a write-only one (one insert
   into an unkeyed table), a read-then-write one (``get`` + ``upsert``), plus
   a transfer and a keyed insert, at both levels, against the physical floor
   (one conditional PUT to commit; one LIST+GET of the txns shard for a
   linearizable read time).

Attribution: the background apply worker runs on a thread named
``txns-db-apply``; the work it (or a committing thread) hands to thread pools
(``ThreadPoolExecutor.submit`` is wrapped in this process) is billed to
whoever submitted it. Areas: ``txns`` (the txns shard's state versions),
``data`` (data shards' state versions), ``commits`` (the commit-record
shard), ``catalog``, ``part`` (Parquet parts in blob), ``hint`` (S3 head
hints). ``lost`` = conditional PUTs answered 409/412.

Run: ``.venv/bin/python benchmarks/bench_isolation.py`` (about 5 minutes on
2 busy cores); ``--quick`` for a smoke run; ``--seconds 20`` for steadier rows;
``--backends s3 file`` to add file:// rows to the throughput table.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pyarrow as pa
from common import (
    Counter,
    Snapshot,
    Stat,
    diff,
    emit_json,
    load,
    moto_server,
    new_bucket_url,
    print_table,
)

LEVELS = ("strict_serializable", "serializable")
SHORT = {"strict_serializable": "strict", "serializable": "serializable"}
ACCOUNTS = pa.schema([("account", pa.string()), ("balance", pa.int64())])
LOG = pa.schema([("event", pa.string()), ("n", pa.int64())])
START_BALANCE = 1_000_000_000
WORKER_THREAD = "txns-db-apply"


def acct(i: int) -> str:
    return f"acct-{i:04d}"


# ---- whose request is it ------------------------------------------------------------------

_OWNER = threading.local()


def owner() -> str:
    """``worker`` for the background apply worker (and pool work it submitted), else ``txn``."""
    o = getattr(_OWNER, "name", None)
    if o:
        return o
    return "worker" if threading.current_thread().name == WORKER_THREAD else "txn"


def propagate_owner() -> None:
    """Make work submitted to any thread pool count as its submitter's (wraps ``ThreadPoolExecutor.submit``)."""
    orig = ThreadPoolExecutor.submit
    if getattr(orig, "_bench_owner", False):
        return

    def submit(self: ThreadPoolExecutor, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        o = owner()

        def run(*a: Any, **k: Any) -> Any:
            prev = getattr(_OWNER, "name", None)
            _OWNER.name = o
            try:
                return fn(*a, **k)
            finally:
                _OWNER.name = prev

        return orig(self, run, *args, **kwargs)

    submit._bench_owner = True  # type: ignore[attr-defined]
    ThreadPoolExecutor.submit = submit  # type: ignore[method-assign]


_VERB = {
    "PutObject": "PUT",
    "GetObject": "GET",
    "ListObjectsV2": "LIST",
    "DeleteObject": "DELETE",
    "DeleteObjects": "DELETE",
    "HeadObject": "HEAD",
    "HeadBucket": "HEAD",
}


class OwnedWire(Counter):
    """HTTP requests of botocore clients per ``<owner>|<VERB> <area>`` (see the module doc).

    Lost conditional PUTs (409/412) are also counted under ``<owner>|lost``.
    """

    def __init__(self, areas: dict[str, str]) -> None:
        super().__init__()
        self.areas = areas  # shard id -> area name
        self._local = threading.local()

    def attach(self, client: Any) -> None:
        uid = f"{id(self)}-{id(client)}"
        client.meta.events.register("before-send.s3", self._before_send, unique_id=f"iso-send-{uid}")
        client.meta.events.register("response-received.s3", self._received, unique_id=f"iso-recv-{uid}")

    def area(self, url: str) -> str:
        parts = urlsplit(url)
        where = unquote(parts.path) + " " + " ".join(unquote(p) for p in parse_qs(parts.query).get("prefix", []))
        if "/blob/" in where:
            return "part"
        if "/consensus/" in where:
            if "head-hint" in where:
                return "hint"
            shard = where.split("/consensus/", 1)[1].split("/", 1)[0]
            return self.areas.get(shard, "data")
        return "bucket"

    def _before_send(self, request: Any, event_name: str, **_kw: Any) -> None:
        op = event_name.rsplit(".", 1)[-1]
        cat = f"{owner()}|{_VERB.get(op, op)} {self.area(request.url)}"
        n = request.headers.get("Content-Length")
        self._local.cat = cat
        self.add(cat, requests=1, bytes_out=int(n or 0))

    def _received(self, response_dict: dict | None, exception: Exception | None, **_kw: Any) -> None:
        cat = getattr(self._local, "cat", "?|?")
        if response_dict is None:
            self.add(cat.split("|")[0] + "|error", requests=1)
            return
        self.add(cat, bytes_in=int(response_dict.get("headers", {}).get("content-length", 0) or 0))
        status = int(response_dict.get("status_code", 0))
        if status in (409, 412):
            self.add(cat.split("|")[0] + "|lost", requests=1)
        elif status >= 300 and status != 404:
            self.add(cat.split("|")[0] + f"|http {status}", requests=1)


def areas_of(db: Any) -> dict[str, str]:
    from txns.commits import commits_shard_id

    return {db.root.txns_id: "txns", db.root.catalog_id: "catalog", commits_shard_id(db.root.txns_id): "commits"}


def by_owner(s: Snapshot, who: str) -> dict[str, int]:
    """Requests of ``who`` per ``VERB area`` (lost/error markers left out)."""
    out: dict[str, int] = {}
    for k, v in s.items():
        o, cat = k.split("|", 1)
        if o == who and cat not in ("lost", "error") and not cat.startswith("http ") and v.requests:
            out[cat] = out.get(cat, 0) + v.requests
    return out


def marker(s: Snapshot, who: str, what: str) -> int:
    return s.get(f"{who}|{what}", Stat()).requests


_ORDER = [
    "LIST txns",
    "GET txns",
    "PUT txns",
    "LIST catalog",
    "GET catalog",
    "PUT catalog",
    "LIST data",
    "GET data",
    "PUT data",
    "GET part",
    "PUT part",
    "LIST commits",
    "GET commits",
    "PUT commits",
]


def fmt_per(counts: dict[str, int], n: int) -> str:
    """``LIST txns 1.00, GET txns 1.00, ...`` per transaction, in a fixed order."""
    if not counts:
        return "(none)"
    keys = sorted(counts, key=lambda k: (_ORDER.index(k) if k in _ORDER else len(_ORDER), k))
    return ", ".join(f"{k} {counts[k] / n:.2f}" for k in keys)


# ---- validations ("inputs unchanged") -------------------------------------------------------

_V = threading.local()
_BY_READS: dict[int, dict[str, Any]] = {}  # id(Transaction._read_set) -> the stats of the thread that made it


def _vstate() -> dict[str, Any]:
    s = getattr(_V, "s", None)
    if s is None:
        s = _V.s = {"calls": 0, "unchanged": 0, "last_unchanged": 0, "reasons": collections.Counter()}
    return s


def reset_validations() -> None:
    _V.s = None


def reason_kind(why: str) -> str:
    if "compacted away" in why:
        return "read time below txns since"
    if "a row of table" in why:
        return "a key read was written"
    if "dropped, renamed" in why:
        return "table renamed"
    if "was written by another" in why:
        return "table scanned was written"
    return why[:40]


def instrument_validation() -> None:
    """Count ``conflict()`` answers per transaction: None = inputs unchanged (commit later, no re-run).

    Only calls with a commit in between count (``lo <= hi``: another commit
    took the time the transaction expected); the group commit also calls it
    with an empty range, which returns None at once. With a group commit the
    thread that leads the group validates every member: a call is billed to
    the thread that made the transaction (found by its read set's identity).
    """
    import txns.db.committer as dbm
    import txns.db.transaction as tm
    import txns.db.validation as val

    orig = val.conflict
    if getattr(dbm.conflict, "_bench", False):
        return
    init = tm.Transaction.__init__

    def tracked_init(self: Any, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        _BY_READS[id(self._read_set)] = _vstate()

    tm.Transaction.__init__ = tracked_init  # type: ignore[method-assign]

    def counted(db: Any, reads: Any, names: Any, lo: int, hi: int) -> str | None:
        why = orig(db, reads, names, lo, hi)
        if hi < lo:
            return why  # nothing committed in between: not a lost race
        s = _BY_READS.get(id(reads)) or _vstate()
        s["calls"] += 1
        if why is None:
            s["unchanged"] += 1
            s["last_unchanged"] += 1
        else:
            s["last_unchanged"] = 0  # this attempt ends; db.run runs the function again
            s["reasons"][reason_kind(why)] += 1
        return why

    counted._bench = True  # type: ignore[attr-defined]
    # (committer.py imported the name: patching only txns.db.validation would not reach the commit)
    dbm.conflict = counted  # type: ignore[assignment]
    val.conflict = counted  # type: ignore[assignment]


# commit attempts that took the exactly-once recovery path (``commit_entries`` of a request with ``uncertain=True``)
UNCERTAIN = [0]


def instrument_uncertain() -> None:
    """Count commit attempts made as "uncertain" (an earlier attempt of the transaction may have landed)."""
    import txns.handle as hm

    orig = hm.TxnsHandle.commit_entries
    if getattr(orig, "_bench", False):
        return

    def counted(self: Any, *a: Any, **k: Any) -> Any:
        if a[0].uncertain:  # (the CommitRequest)
            UNCERTAIN[0] += 1
        return orig(self, *a, **k)

    counted._bench = True  # type: ignore[attr-defined]
    hm.TxnsHandle.commit_entries = counted  # type: ignore[method-assign]


# ---- the database -------------------------------------------------------------------------


def setup_db(url: str, accounts: int) -> None:
    import txns

    db = txns.connect(url)
    db.create_table("accounts", ACCOUNTS, primary_key=["account"])
    db.create_table("log", LOG)
    with db.transaction() as t:
        t.insert("accounts", [{"account": acct(i), "balance": START_BALANCE} for i in range(accounts)])
    db.close()


def transfer_fn(a: int, b: int, amount: int = 1) -> Any:
    def transfer(t: Any) -> None:
        ra = t.get("accounts", acct(a))
        rb = t.get("accounts", acct(b))
        t.upsert(
            "accounts",
            [
                {"account": acct(a), "balance": ra["balance"] - amount},
                {"account": acct(b), "balance": rb["balance"] + amount},
            ],
        )

    return transfer


@dataclass
class Record:
    """What one worker (thread or process) did."""

    latencies: list[float] = field(default_factory=list)
    reruns: int = 0
    validations: int = 0
    unchanged: int = 0
    unchanged_commits: int = 0
    gave_up: int = 0
    uncertain: int = 0  # commit attempts on the exactly-once recovery path (see instrument_uncertain)
    reasons: collections.Counter = field(default_factory=collections.Counter)
    end: float = 0.0

    def merge(self, o: Record) -> None:
        self.latencies += o.latencies
        self.reruns += o.reruns
        self.validations += o.validations
        self.unchanged += o.unchanged
        self.unchanged_commits += o.unchanged_commits
        self.gave_up += o.gave_up
        self.uncertain += o.uncertain
        self.reasons.update(o.reasons)
        self.end = max(self.end, o.end)

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d["reasons"] = dict(self.reasons)
        return d

    @staticmethod
    def from_json(d: dict) -> Record:
        r = Record(**{k: v for k, v in d.items() if k != "reasons"})
        r.reasons = collections.Counter(d["reasons"])
        return r


def transfers(db: Any, level: str, n_accounts: int, rng: random.Random, until: float, rec: Record) -> None:
    """``db.run(transfer)`` between random accounts until ``until`` (time.time())."""
    from txns import TransactionConflict

    while time.time() < until:
        a, b = rng.sample(range(n_accounts), 2)
        reset_validations()
        t0 = time.perf_counter()
        try:
            info = db.run(transfer_fn(a, b), isolation=level)
        except TransactionConflict:
            rec.gave_up += 1
            continue
        rec.latencies.append(time.perf_counter() - t0)
        s = _vstate()
        rec.reruns += info.attempts - 1
        rec.validations += s["calls"]
        rec.unchanged += s["unchanged"]
        rec.unchanged_commits += 1 if s["last_unchanged"] else 0
        rec.reasons.update(s["reasons"])
    rec.end = time.time()


def run_with_uncertain(rec: Record, fn: Any) -> None:
    """``fn()``, adding the process's uncertain commit attempts meanwhile to ``rec``."""
    u0 = UNCERTAIN[0]
    fn()
    rec.uncertain += UNCERTAIN[0] - u0


# ---- 1. throughput ------------------------------------------------------------------------


@dataclass
class Cell:
    backend: str
    mode: str
    workers: int
    level: str
    seconds: float
    rec: Record
    counts: Snapshot | None  # wire counts over the measured window (S3 only)
    start: float
    groups: tuple[int, int] | None = None  # (conditional writes, transactions in them) of group commits

    def row(self) -> list[Any]:
        r = self.rec
        n = len(r.latencies)
        elapsed = max(r.end - self.start, 1e-9)
        lat = sorted(r.latencies)
        p = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000) if lat else (lambda q: float("nan"))
        reasons = ", ".join(f"{k} {v}" for k, v in r.reasons.most_common()) or "-"
        if self.counts is not None and n:
            txn = sum(by_owner(self.counts, "txn").values())
            wrk = sum(by_owner(self.counts, "worker").values())
            lost = marker(self.counts, "txn", "lost")
            req = f"{txn / n:.1f} / {wrk / n:.1f}"
            lost_s = f"{lost / n:.2f}"
        else:
            req, lost_s = "-", "-"
        grouped = f"{self.groups[1] / self.groups[0]:.2f}" if self.groups and self.groups[0] else "-"
        return [
            self.backend,
            self.mode,
            self.workers,
            SHORT[self.level],
            n,
            f"{n / elapsed:.1f}",
            f"{p(0.5):.0f} / {p(0.99):.0f}",
            f"{r.reruns / n:.2f}" if n else "-",
            f"{r.unchanged_commits} ({100 * r.unchanged_commits / n:.0f}%)" if n else "-",
            f"{r.validations} / {r.unchanged}",
            reasons,
            r.gave_up,
            r.uncertain,
            grouped,
            req,
            lost_s,
        ]


HEADERS = [
    "backend",
    "workers as",
    "workers",
    "isolation",
    "commits",
    "commits/s",
    "latency ms p50 / p99",
    "re-runs per commit",
    "commits via 'inputs unchanged'",
    "validations / unchanged",
    "conflicts found",
    "gave up",
    "uncertain retries",
    "txns per commit write",
    "requests per commit: txn / worker",
    "lost CAS per commit",
]


def fresh_url(backend: str, endpoint: str | None, tmp: str) -> str:
    if backend == "s3":
        assert endpoint is not None
        return new_bucket_url(endpoint, "iso")
    return f"file://{tempfile.mkdtemp(dir=tmp)}/db"


def group_stats(dbs: list[Any]) -> tuple[int, int] | None:
    """(group commits, transactions in them) summed over ``dbs``; None if the library has no group commit."""
    if not hasattr(dbs[0], "group_commits"):
        return None
    return sum(d.group_commits for d in dbs), sum(d.grouped_transactions for d in dbs)


def run_threads(
    url: str, backend: str, level: str, workers: int, seconds: float, accounts: int, seed: int, shared: bool = False
) -> Cell:
    """``workers`` threads, each with its own database object (``shared``: all on one)."""
    import txns

    dbs = [txns.connect(url, isolation=level) for _ in range(1 if shared else workers)]
    wire = OwnedWire(areas_of(dbs[0])) if backend == "s3" else None
    for db in dbs:
        if wire is not None:
            wire.attach(db.client.blob._client)
        for i in range(2):  # warm-up: caches, connections, first catalog read
            db.run(transfer_fn(i, i + 1), isolation=level)
    for db in dbs:
        db._settle()
    g0 = group_stats(dbs)
    if shared:
        dbs = dbs * workers
    recs = [Record() for _ in range(workers)]
    start = time.time() + 0.2
    until = start + seconds

    def go(i: int) -> None:
        time.sleep(max(0.0, start - time.time()))
        transfers(dbs[i], level, accounts, random.Random(seed * 1000 + i), until, recs[i])

    threads = [threading.Thread(target=go, args=(i,), name=f"bench-worker-{i}") for i in range(workers)]
    u0 = UNCERTAIN[0]
    for t in threads:
        t.start()
    time.sleep(max(0.0, start - time.time()))
    before = wire.snapshot() if wire else None
    for t in threads:
        t.join()
    uncertain = UNCERTAIN[0] - u0
    counts = diff(wire.snapshot(), before) if wire and before is not None else None
    dbs = list({id(d): d for d in dbs}.values())
    g1 = group_stats(dbs)
    groups = (g1[0] - g0[0], g1[1] - g0[1]) if g0 is not None and g1 is not None else None
    for db in dbs:
        db.close()
    rec = Record(uncertain=uncertain)
    for r in recs:
        rec.merge(r)
    return Cell(
        backend, "threads, one db" if shared else "threads", workers, level, seconds, rec, counts, start, groups
    )


def child_main(args: argparse.Namespace) -> None:
    """One worker process: connect, warm up, say ready, wait for the start time, run, print JSON."""
    import txns

    propagate_owner()
    instrument_validation()
    instrument_uncertain()
    spec = json.loads(args.child)
    db = txns.connect(spec["url"], isolation=spec["level"])
    wire = None
    if spec["url"].startswith("s3://"):
        wire = OwnedWire(areas_of(db))
        wire.attach(db.client.blob._client)
    for i in range(2):
        db.run(transfer_fn(i, i + 1), isolation=spec["level"])
    db._settle()
    g0 = group_stats([db])
    print("ready", flush=True)
    start, until = (float(x) for x in sys.stdin.readline().split())
    time.sleep(max(0.0, start - time.time()))
    before = wire.snapshot() if wire else None
    rec = Record()
    run_with_uncertain(
        rec, lambda: transfers(db, spec["level"], spec["accounts"], random.Random(spec["seed"]), until, rec)
    )
    counts = diff(wire.snapshot(), before) if wire and before is not None else None
    g1 = group_stats([db])
    db.close()
    out = {
        "rec": rec.to_json(),
        "counts": {k: [v.requests, v.bytes_out, v.bytes_in] for k, v in (counts or {}).items()},
        "groups": [g1[0] - g0[0], g1[1] - g0[1]] if g0 is not None and g1 is not None else None,
    }
    print(json.dumps(out), flush=True)


def run_processes(url: str, backend: str, level: str, workers: int, seconds: float, accounts: int, seed: int) -> Cell:
    procs = []
    for i in range(workers):
        spec = {"url": url, "level": level, "accounts": accounts, "seed": seed * 1000 + i}
        procs.append(
            subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    try:
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"worker process did not start (said {line!r})")
        start = time.time() + 0.3
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(f"{start} {start + seconds}\n")
            p.stdin.flush()
        rec, counts = Record(), ({} if backend == "s3" else None)
        groups: list[int] | None = [0, 0]
        for p in procs:
            out, _ = p.communicate(timeout=seconds + 120)
            d = json.loads(out.strip().splitlines()[-1])
            rec.merge(Record.from_json(d["rec"]))
            if d["groups"] is None or groups is None:
                groups = None
            else:
                groups = [groups[0] + d["groups"][0], groups[1] + d["groups"][1]]
            if counts is not None:
                for k, (n, bo, bi) in d["counts"].items():
                    counts[k] = counts.get(k, Stat()) + Stat(n, bo, bi)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return Cell(
        backend,
        "processes",
        workers,
        level,
        seconds,
        rec,
        counts,
        start,
        (groups[0], groups[1]) if groups is not None else None,
    )


def run_throughput(args: argparse.Namespace, endpoint: str | None, tmp: str, results: dict) -> None:
    cells: list[Cell] = []
    plan = [("threads", w) for w in args.threads] + [("shared", w) for w in args.shared_threads]
    plan += [("processes", w) for w in args.processes]
    for backend in args.backends:
        for mode, workers in plan:
            for level in LEVELS:
                url = fresh_url(backend, endpoint, tmp)
                setup_db(url, args.accounts)
                if mode == "processes":
                    cell = run_processes(url, backend, level, workers, args.seconds, args.accounts, args.seed)
                else:
                    cell = run_threads(
                        url, backend, level, workers, args.seconds, args.accounts, args.seed, shared=mode == "shared"
                    )
                cells.append(cell)
                print(
                    f"  {backend} {mode} x{workers} {SHORT[level]}: {len(cell.rec.latencies)} commits ({load()})",
                    file=sys.stderr,
                    flush=True,
                )
    print_table(
        HEADERS,
        [c.row() for c in cells],
        title=f"Transfers per second ({args.accounts} accounts, {args.seconds:g} s per row; {load()})",
    )
    # where the requests of a commit go, per row (S3)
    rows = []
    for c in cells:
        if c.counts is None or not c.rec.latencies:
            continue
        n = len(c.rec.latencies)
        rows.append(
            [
                c.mode,
                c.workers,
                SHORT[c.level],
                fmt_per(by_owner(c.counts, "txn"), n),
                fmt_per(by_owner(c.counts, "worker"), n),
            ]
        )
    if rows:
        print_table(
            ["workers as", "workers", "isolation", "committing threads, per commit", "apply worker, per commit"],
            rows,
            title="Requests per committed transfer by kind (S3/moto, wire)",
        )
    results["throughput"] = [
        {
            "backend": c.backend,
            "mode": c.mode,
            "workers": c.workers,
            "level": c.level,
            "row": c.row(),
            "counts": {k: v.requests for k, v in (c.counts or {}).items()},
        }
        for c in cells
    ]


# ---- 2. requests per transaction ----------------------------------------------------------

FLOOR = {
    ("read-only", "strict_serializable"): ("LIST+GET txns", {"LIST txns": 1, "GET txns": 1}),
    ("read-only", "serializable"): ("none", {}),
    ("write-only", "strict_serializable"): ("PUT txns", {"PUT txns": 1}),
    ("write-only", "serializable"): ("PUT txns", {"PUT txns": 1}),
    ("read-then-write", "strict_serializable"): ("LIST+GET+PUT txns", {"LIST txns": 1, "GET txns": 1, "PUT txns": 1}),
    ("read-then-write", "serializable"): ("PUT txns", {"PUT txns": 1}),
}


def run_requests(args: argparse.Namespace, endpoint: str, results: dict) -> None:
    import txns

    url = new_bucket_url(endpoint, "iso-req")
    setup_db(url, args.accounts)
    db = txns.connect(url)
    wire = OwnedWire(areas_of(db))
    wire.attach(db.client.blob._client)
    rng = random.Random(args.seed)
    seq = iter(range(10**9))

    def read_only(level: str) -> None:
        with db.read(isolation=level) as r:
            r.get("accounts", acct(rng.randrange(args.accounts)))

    def write_only(level: str) -> None:
        with db.transaction(isolation=level) as t:
            t.insert("log", [{"event": "e", "n": next(seq)}])

    def read_then_write(level: str) -> None:
        k = acct(rng.randrange(args.accounts))

        def bump(t: Any) -> None:
            row = t.get("accounts", k)
            t.upsert("accounts", [{"account": k, "balance": row["balance"] + 1}])

        db.run(bump, isolation=level)

    def transfer(level: str) -> None:
        a, b = rng.sample(range(args.accounts), 2)
        db.run(transfer_fn(a, b), isolation=level)

    def keyed_insert(level: str) -> None:
        with db.transaction(isolation=level) as t:
            t.insert("accounts", [{"account": f"new-{next(seq)}", "balance": 0}])

    kinds = [
        ("read-only", "`db.read()` + 1 `get`", read_only),
        ("write-only", "1 insert (unkeyed table)", write_only),
        ("read-then-write", "`db.run`: 1 `get` + 1 `upsert`", read_then_write),
        ("transfer", "`db.run`: 2 `get` + `upsert` of 2 rows", transfer),
        ("keyed insert", "1 insert of a new key (keyed table: checks the key)", keyed_insert),
    ]
    rows, raw = [], []
    for level in LEVELS:
        for kind, what, fn in kinds:
            for _ in range(args.warmup):
                fn(level)
            db._settle()
            times = []
            before = wire.snapshot()
            for _ in range(args.txns):
                t0 = time.perf_counter()
                fn(level)
                times.append(time.perf_counter() - t0)
            mid = wire.snapshot()
            db._settle()  # the worker's applies of these commits (counted apart)
            after = wire.snapshot()
            txn_c = by_owner(diff(mid, before), "txn")
            wrk_c = by_owner(diff(after, before), "worker")
            n = args.txns
            # (a transfer and a keyed insert read, then write: the read-then-write floor)
            floor_s, floor = FLOOR.get((kind, level)) or FLOOR[("read-then-write", level)]
            extra = {
                k: v for k, v in ((k, txn_c.get(k, 0) - floor.get(k, 0) * n) for k in set(txn_c) | set(floor)) if v
            }
            rows.append(
                [
                    SHORT[level],
                    kind,
                    what,
                    f"{sum(txn_c.values()) / n:.2f}",
                    fmt_per(txn_c, n),
                    floor_s,
                    fmt_per(extra, n) if extra else "none",
                    f"{statistics.median(times) * 1000:.0f}",
                    f"{sum(wrk_c.values()) / n:.2f}" + (f" ({fmt_per(wrk_c, n)})" if wrk_c else ""),
                ]
            )
            raw.append({"level": level, "kind": kind, "txn": txn_c, "worker": wrk_c, "n": n, "ms": times})
            print(f"  requests: {SHORT[level]} {kind} done ({load()})", file=sys.stderr, flush=True)
    db.close()
    print_table(
        [
            "isolation",
            "transaction",
            "what it does",
            "requests",
            "requests by kind (per txn)",
            "floor",
            "beyond the floor",
            "ms (median)",
            "apply worker, per txn",
        ],
        rows,
        title=f"Requests per transaction, one database object, {args.txns} in a row after {args.warmup} warm-up "
        f"(S3/moto, wire; {load()})",
    )
    results["requests"] = raw


# ---- main ---------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", choices=["throughput", "requests"], default=["throughput", "requests"])
    p.add_argument("--seconds", type=float, default=5.0, help="seconds per throughput row")
    p.add_argument("--threads", type=int, nargs="*", default=[1, 4, 16], help="worker threads per row")
    p.add_argument(
        "--shared-threads",
        type=int,
        nargs="*",
        default=[4, 16],
        help="worker threads sharing one database object (group commit) per row",
    )
    p.add_argument("--processes", type=int, nargs="*", default=[1, 4], help="worker processes per row")
    p.add_argument("--backends", nargs="+", choices=["s3", "file"], default=["s3"])
    p.add_argument("--accounts", type=int, default=100)
    p.add_argument("--txns", type=int, default=20, help="measured transactions per requests row")
    p.add_argument("--warmup", type=int, default=5, help="warm-up transactions per requests row")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="1 s rows, 1/4 threads, 1 process, 5 transactions")
    p.add_argument("--json", help="also write the raw results to this file")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child_main(args)
        return
    if args.quick:
        args.seconds, args.threads, args.shared_threads, args.processes = 1.0, [1, 4], [4], [1]
        args.txns, args.warmup = 5, 2
    propagate_owner()
    instrument_validation()
    instrument_uncertain()
    results: dict[str, Any] = {"args": vars(args)}
    print(f"bench_isolation: {os.cpu_count()} cores, {load()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp, moto_server() as endpoint:
        if "throughput" in args.only:
            run_throughput(args, endpoint, tmp, results)
        if "requests" in args.only:
            run_requests(args, endpoint, results)
    emit_json(args.json, results)


if __name__ == "__main__":
    main()
