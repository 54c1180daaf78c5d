"""A worker process for the isolation chaos test: list-append or bank transfers, recorded so a SIGKILL loses nothing.

Run as::

    python -m tests.isolation.proc_worker --url URL --out PATH --seed N --threads T \\
        --txns N --keys K --isolation LEVEL [--bank] [--seconds S] [--stop-file PATH] \\
        [--process NAME] [--retry-deadline S]

Each of ``--threads`` threads opens its own database (``txns.connect(url,
create=False)``, retried while storage fails) and runs up to ``--txns``
transactions through ``db.run``, starting none after ``--seconds`` or once
``--stop-file`` exists:

- list-append (default): :func:`tests.isolation.workload.random_txn` plans
  over ``--keys`` keys of table ``lists``, run by
  :func:`tests.isolation.workload.txn_body`. Appended values are unique
  across processes as long as every process gets its own ``--seed`` (values
  start at ``seed * VALUES_PER_SEED``).
- ``--bank``: transfers between the ``--keys`` accounts of keyed table
  ``accounts`` (``acct-0``, ...; created by the driver): a random amount
  from one to another, ``txns.Abort`` when the source balance is short. Each
  carries ``metadata={"transfer": ID}`` with a unique ID. On
  ``Indeterminate`` the transfer is NOT run again: the worker looks for its
  ID in ``db.history()`` (the commit record says whether it landed) and
  records what it found (:func:`run_transfer`, :func:`lookup_transfer`).

The record file (``--out``, JSON lines, appended and fsynced one record at a
time, shared by the threads):

- ``{"t": "invoke", "id", "process", "start", ...}`` is written BEFORE the
  transaction runs: the plan (list-append) or the transfer
  (``transfer``, ``src``, ``dst``, ``amount``);
- ``{"t": "complete", "id", "end", "status", ...}`` after it: ``status`` is
  ``ok`` (committed), ``fail`` (certainly not committed: a conflict, an
  abort, a ``Determinate`` storage failure) or ``info`` (unknown:
  ``Indeterminate``, or another storage error that does not say). List-append
  completions carry the micro-ops (``mops``) of the attempt that committed,
  and ``read_ts``/``commit_ts``; transfers carry ``outcome`` (``committed``,
  ``aborted``, ``conflict``, ``failed``, ``landed``, ``not-landed``,
  ``unknown``) and ``commit_ts``. An exception the rules do not allow for (not
  a persist error, or ``InvalidUsage``) is recorded in ``unexpected``;
- ``{"t": "done", "process", "stats"}`` when the worker ends normally.

:func:`load_ops` turns list-append records into checker ops: an invoke
without a completion (the worker was killed) becomes an ``info`` op whose
micro-ops are the planned appends; a ``fail`` op keeps only its planned
appends (a read of any of them is an aborted read); an ``info`` op keeps the
micro-ops of its last attempt only if they hold exactly the planned appends
(that attempt is the only one that can have committed), else just the
planned appends. :func:`load_transfers` does the same for transfers, and
:func:`verify_bank` checks a bank database against them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import threading
import time
import traceback
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

import txns
from persist import (
    Determinate,
    Indeterminate,
    InvalidUsage,
    PersistConfig,
    PersistError,
)
from tests.isolation import workload
from tests.isolation.checker import Op

ACCOUNTS_TABLE = "accounts"
ACCOUNTS_SCHEMA = pa.schema([("account", pa.string()), ("balance", pa.int64())])
INITIAL_BALANCE = 100
MAX_AMOUNT = 60
VALUES_PER_SEED = 10_000_000
CONNECT_LIMIT_S = 60.0
LOOKUP_LIMIT_S = 30.0
MAX_UNEXPECTED = 20

EXIT_OK = 0
EXIT_NO_STORE = 5


def account_names(n: int) -> list[str]:
    """The bank's account names."""
    return [f"acct-{i}" for i in range(n)]


def create_bank(db: txns.Database, accounts: int) -> int:
    """Create the ``accounts`` table with ``accounts`` accounts of :data:`INITIAL_BALANCE`; the time they hold from."""
    db.create_table(ACCOUNTS_TABLE, ACCOUNTS_SCHEMA, primary_key=["account"])
    with db.transaction() as t:
        t.insert(ACCOUNTS_TABLE, [{"account": a, "balance": INITIAL_BALANCE} for a in account_names(accounts)])
    assert t.commit_info.ts is not None
    return t.commit_info.ts


# ---- recording -------------------------------------------------------------------------------


class Recorder:
    """Appends JSON records to one file, each fsynced before :meth:`write` returns (thread-safe)."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        data = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        with self._lock:
            os.write(self._fd, data)  # one write per record: a kill leaves at most a torn last line
            os.fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            os.close(self._fd)


@dataclass
class WorkerStats:
    """What one worker process met: outcomes, exceptions by phase and type, unexpected ones."""

    outcomes: Tally[str] = field(default_factory=Tally)
    exceptions: Tally[str] = field(default_factory=Tally)
    unexpected: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def outcome(self, name: str) -> None:
        with self.lock:
            self.outcomes[name] += 1

    def exception(self, phase: str, e: BaseException) -> None:
        with self.lock:
            self.exceptions[f"{phase}:{type(e).__name__}"] += 1

    def surprise(self, what: str) -> None:
        with self.lock:
            if len(self.unexpected) < MAX_UNEXPECTED:
                self.unexpected.append(what[:3000])
        print(f"UNEXPECTED {what}", file=sys.stderr, flush=True)

    def to_json(self) -> dict[str, Any]:
        with self.lock:
            return {
                "outcomes": dict(self.outcomes),
                "exceptions": dict(self.exceptions),
                "unexpected": list(self.unexpected),
            }


def classify(e: BaseException) -> tuple[str, bool]:
    """``(status, expected)`` for an exception out of ``db.run``.

    ``fail`` when nothing committed for sure (``TransactionConflict``,
    ``Abort``, ``Determinate``); ``info`` when the outcome is unknown
    (``Indeterminate``, and, conservatively, any other storage error).
    ``expected`` is False for what the library's rules do not allow here:
    ``InvalidUsage`` (the workload's calls are valid) and non-persist errors.
    """
    if isinstance(e, (txns.TransactionConflict, txns.Abort, Determinate)):
        return "fail", True
    if isinstance(e, Indeterminate):
        return "info", True
    if isinstance(e, InvalidUsage):
        return "info", False
    if isinstance(e, PersistError):
        return "info", True
    return "info", False


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


# ---- the worker ------------------------------------------------------------------------------


@dataclass
class WorkerArgs:
    """The command line of a worker (see :func:`parse_args` and the module doc)."""

    url: str
    out: Path
    seed: int
    threads: int
    txns: int
    keys: int
    isolation: str
    bank: bool = False
    seconds: float = 3600.0
    process: str = ""
    retry_deadline_s: float = 3.0
    stop_file: Path | None = None


class Worker:
    """One worker process: ``threads`` threads running transactions and recording them (see the module doc)."""

    def __init__(self, args: WorkerArgs) -> None:
        self.args = args
        self.process = args.process or f"s{args.seed}"
        self.rec = Recorder(args.out)
        self.stats = WorkerStats()
        self.counter = workload.Counter(args.seed * VALUES_PER_SEED)
        self.deadline = time.monotonic() + args.seconds
        self.parent = os.getppid()
        self.config = PersistConfig(retry_deadline_s=args.retry_deadline_s, read_wait_s=5.0)

    def should_stop(self) -> bool:
        """Past ``--seconds``, told to stop (``--stop-file`` exists), or orphaned."""
        if time.monotonic() >= self.deadline or os.getppid() != self.parent:
            return True
        return self.args.stop_file is not None and self.args.stop_file.exists()

    def connect(self, rng: random.Random) -> txns.Database | None:
        """A database object of its own, retrying storage failures (None: gave up)."""
        limit = time.monotonic() + CONNECT_LIMIT_S
        while not self.should_stop():
            try:
                return txns.connect(self.args.url, create=False, config=self.config)
            except PersistError as e:
                self.stats.exception("connect", e)
                if time.monotonic() > limit:
                    self.stats.surprise(f"connect: gave up after {CONNECT_LIMIT_S:.0f}s: {_describe(e)}")
                    return None
                time.sleep(0.05 + 0.1 * rng.random())
        return None

    def run(self) -> int:
        threads = [
            threading.Thread(target=self._thread, args=(n,), name=f"worker-{n}") for n in range(self.args.threads)
        ]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        self.rec.write({"t": "done", "process": self.process, "stats": self.stats.to_json()})
        self.rec.close()
        return EXIT_OK

    def _thread(self, n: int) -> None:
        rng = random.Random(f"{self.args.seed}-{n}")
        db = self.connect(rng)
        if db is None:
            return
        try:
            for i in range(self.args.txns):
                if self.should_stop():
                    break
                op_id = f"{self.process}-{n}-{i}"
                if self.args.bank:
                    self._transfer(db, rng, op_id)
                else:
                    self._list_append(db, rng, op_id)
        except BaseException as e:  # noqa: BLE001 - recorded: the test fails on it
            self.stats.surprise(f"thread {n} died: {''.join(traceback.format_exception(e))}")
        finally:
            try:
                db.close()
            except Exception as e:  # noqa: BLE001 - closing under faults may fail; nothing depends on it
                self.stats.exception("close", e)

    # ---- list-append ----

    def _list_append(self, db: txns.Database, rng: random.Random, op_id: str) -> None:
        plan = workload.random_txn(rng, self.args.keys, self.counter)
        self.rec.write(
            {
                "t": "invoke",
                "id": op_id,
                "process": self.process,
                "start": time.monotonic(),
                "plan": [list(p) for p in plan],
            }
        )
        mops: list[tuple] = []
        body = workload.txn_body(plan, mops)
        done: dict[str, Any] = {"t": "complete", "id": op_id}
        try:
            info = db.run(body, isolation=self.args.isolation)
            done.update(status="ok", read_ts=info.read_ts, commit_ts=info.ts, attempts=info.attempts)
        except BaseException as e:
            status, expected = classify(e)
            self.stats.exception("run", e)
            done.update(status=status, error=_describe(e)[:500])
            if not expected:
                done["unexpected"] = "".join(traceback.format_exception(e))[-3000:]
                self.stats.surprise(f"{op_id}: {done['unexpected']}")
            if not isinstance(e, Exception):
                raise
        done["end"] = time.monotonic()
        done["mops"] = [[m[0], m[1], list(m[2]) if m[0] == "r" else m[2]] for m in mops]
        self.stats.outcome(done["status"])
        self.rec.write(done)

    # ---- bank ----

    def _transfer(self, db: txns.Database, rng: random.Random, op_id: str) -> None:
        src, dst = rng.sample(account_names(self.args.keys), 2)
        amount = rng.randint(1, MAX_AMOUNT)
        tid = f"t-{op_id}"
        self.rec.write(
            {
                "t": "invoke", "id": op_id, "process": self.process, "start": time.monotonic(),
                "transfer": tid, "src": src, "dst": dst, "amount": amount,
            }
        )  # fmt: skip
        done = run_transfer(db, tid, src, dst, amount, self.args.isolation, self.stats, stop=self.orphaned)
        done.update(t="complete", id=op_id)
        self.stats.outcome(done["outcome"])
        self.rec.write(done)

    def orphaned(self) -> bool:
        return os.getppid() != self.parent


def run_transfer(
    db: txns.Database,
    tid: str,
    src: str,
    dst: str,
    amount: int,
    isolation: str,
    stats: WorkerStats,
    stop: Callable[[], bool] = lambda: False,
    before_commit: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Transfer ``amount`` from ``src`` to ``dst`` as transfer ``tid``; the completion record (see the module doc).

    On ``Indeterminate`` it is not run again: :func:`lookup_transfer` tells
    whether it landed. ``before_commit`` (for tests) runs at the end of
    every attempt of the transaction function, just before the commit.
    """

    def move(t: txns.Transaction) -> None:
        a, b = t.get(ACCOUNTS_TABLE, src), t.get(ACCOUNTS_TABLE, dst)
        if a is None or b is None:
            raise RuntimeError(f"account missing: {src}={a}, {dst}={b}")  # a bug: every account always exists
        if a["balance"] < amount:
            raise txns.Abort(f"insufficient funds: {src} has {a['balance']} < {amount}")
        t.upsert(
            ACCOUNTS_TABLE,
            [{"account": src, "balance": a["balance"] - amount}, {"account": dst, "balance": b["balance"] + amount}],
        )
        if before_commit is not None:
            before_commit()

    done: dict[str, Any] = {"transfer": tid}
    try:
        info = db.run(move, isolation=isolation, metadata={"transfer": tid})
        done.update(status="ok", outcome="committed", commit_ts=info.ts, attempts=info.attempts)
    except BaseException as e:
        status, expected = classify(e)
        stats.exception("run", e)
        done.update(status=status, error=_describe(e)[:500])
        if isinstance(e, txns.Abort):
            done["outcome"] = "aborted"
        elif isinstance(e, txns.TransactionConflict):
            done["outcome"] = "conflict"
        elif status == "fail":
            done["outcome"] = "failed"
        else:
            # it may have committed: never run it again blindly; its commit record tells
            found = lookup_transfer(db, tid, stats, stop)
            if found is None:
                done["outcome"] = "unknown"
            elif found:
                done.update(outcome="landed", commit_ts=found[0])
            else:
                done["outcome"] = "not-landed"
        if not expected:
            done["unexpected"] = "".join(traceback.format_exception(e))[-3000:]
            stats.surprise(f"{tid}: {done['unexpected']}")
        if not isinstance(e, Exception):
            raise
    done["end"] = time.monotonic()
    return done


def lookup_transfer(
    db: txns.Database, tid: str, stats: WorkerStats, stop: Callable[[], bool] = lambda: False
) -> list[int] | None:
    """The commit times of transfer ``tid`` in ``db.history()``, retried under faults (None: could not tell in time)."""
    limit = time.monotonic() + LOOKUP_LIMIT_S
    while not stop():
        try:
            return transfer_commits(db.history()).get(tid, [])
        except PersistError as e:
            stats.exception("lookup", e)
            if time.monotonic() > limit:
                return None
            time.sleep(0.05 + 0.1 * random.random())
    return None


def transfer_commits(history: pa.Table) -> dict[str, list[int]]:
    """Transfer id -> the commit times whose metadata carries it, from a ``db.history()`` table."""
    return commits_by(history, "transfer")


def commits_by(history: pa.Table, field: str) -> dict[str, list[int]]:
    """The value of metadata ``field`` -> the commit times whose metadata carries it, from ``db.history()``."""
    out: dict[str, list[int]] = {}
    for ts, meta in zip(history.column("ts").to_pylist(), history.column("metadata").to_pylist(), strict=True):
        value = json.loads(meta or "{}").get(field)
        if value is not None:
            out.setdefault(value, []).append(ts)
    return out


# ---- loading ---------------------------------------------------------------------------------


def acknowledged(outs: Iterable[Path]) -> int:
    """How many transactions the worker files record as acknowledged (``ok``) so far."""
    n = 0
    for p in outs:
        with contextlib.suppress(OSError):
            n += p.read_bytes().count(b'"status":"ok"')
    return n


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The records of one worker file (a torn last line, from a kill mid-write, is skipped)."""
    lines = Path(path).read_text(encoding="utf-8").split("\n")
    out = []
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if n < len(lines) - 1 and any(rest.strip() for rest in lines[n + 1 :]):
                raise ValueError(f"{path}: line {n + 1} is not JSON (and is not the last)") from None
    return out


def _pair(paths: Iterable[str | Path]) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """Invoke records with their completions (None: the worker was killed first), in file order."""
    pairs: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    for path in paths:
        invokes: dict[str, dict[str, Any]] = {}
        completes: dict[str, dict[str, Any]] = {}
        for r in read_records(path):
            kind = r.get("t")
            if kind == "invoke":
                if r["id"] in invokes:
                    raise ValueError(f"{path}: op {r['id']!r} invoked twice")
                invokes[r["id"]] = r
            elif kind == "complete":
                if r["id"] not in invokes or r["id"] in completes:
                    raise ValueError(f"{path}: completion of {r['id']!r} without one invoke before it")
                completes[r["id"]] = r
        pairs.extend((inv, completes.get(op_id)) for op_id, inv in invokes.items())
    return pairs


def load_ops(paths: Iterable[str | Path]) -> list[Op]:
    """The list-append ops of worker files, as :class:`~tests.isolation.checker.Op` (see the module doc)."""
    ops = []
    for inv, done in _pair(paths):
        plan = [tuple(p) for p in inv["plan"]]
        planned = workload.planned_appends(plan)  # type: ignore[arg-type]
        if done is None:
            ops.append(Op(inv["id"], inv["process"], inv["start"], inv["start"], "info", planned))
            continue
        status = done["status"]
        mops: tuple[tuple, ...] = tuple(tuple(m) for m in done.get("mops", []))
        if status == "fail" or (status == "info" and tuple(m for m in mops if m[0] == "append") != planned):
            mops = planned
        end = max(done["end"], inv["start"])
        ops.append(
            Op(inv["id"], inv["process"], inv["start"], end, status, mops, done.get("read_ts"), done.get("commit_ts"))
        )
    return ops


@dataclass(frozen=True)
class Transfer:
    """One transfer as its worker recorded it (``outcome`` ``in-flight``: the worker was killed during it)."""

    id: str
    transfer: str
    process: str
    src: str
    dst: str
    amount: int
    status: str
    outcome: str
    commit_ts: int | None
    start: float
    end: float | None


def load_transfers(paths: Iterable[str | Path]) -> list[Transfer]:
    """The transfers recorded in worker files."""
    out = []
    for inv, done in _pair(paths):
        out.append(
            Transfer(
                id=inv["id"],
                transfer=inv["transfer"],
                process=inv["process"],
                src=inv["src"],
                dst=inv["dst"],
                amount=int(inv["amount"]),
                status="info" if done is None else done["status"],
                outcome="in-flight" if done is None else done["outcome"],
                commit_ts=None if done is None else done.get("commit_ts"),
                start=inv["start"],
                end=None if done is None else done["end"],
            )
        )
    return out


def load_summaries(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """The ``done`` records (per-process stats) of worker files; a killed worker has none."""
    return [r for path in paths for r in read_records(path) if r.get("t") == "done"]


def unexpected_errors(paths: Iterable[str | Path]) -> list[str]:
    """Every exception the library's rules do not allow for, from completions and worker stats."""
    found: list[str] = []
    for path in paths:
        for r in read_records(path):
            if r.get("t") == "complete" and r.get("unexpected"):
                found.append(f"{r['id']}: {r['unexpected']}")
            elif r.get("t") == "done":
                found.extend(f"{r['process']}: {u}" for u in r["stats"].get("unexpected", []) if " died: " in u)
    return found


# ---- the bank verifier -----------------------------------------------------------------------


@dataclass
class BankReport:
    """What :func:`verify_bank` checked and found (``violations``: kind -> examples)."""

    commits_checked: int = 0
    transfers_in_history: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    violations: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def violation(self, kind: str, text: str) -> None:
        self.violations.setdefault(kind, []).append(text)

    def summary(self, limit: int = 5) -> str:
        lines = [
            (
                f"bank {'OK' if self.ok else 'VIOLATIONS'}: {self.commits_checked} commits checked, "
                f"{self.transfers_in_history} transfers in history; worker outcomes {self.outcomes}"
            )
        ]
        for kind, found in sorted(self.violations.items()):
            lines.append(f"{kind}: {len(found)}")
            lines.extend(f"  - {t}" for t in found[:limit])
        return "\n".join(lines)


def verify_bank(
    db: txns.Database,
    transfers: Sequence[Transfer],
    accounts: int,
    since_ts: int,
    read_threads: int = 4,
) -> BankReport:
    """Check a bank database (faults off) against its workers' records.

    The accounts table's states at every commit time in ``db.history()``
    from ``since_ts`` (the initial deposit) on are built twice: by replaying
    its change feed (``table.changes(since_ts)``) and by a snapshot read at
    each time (``to_arrow(as_of=ts)``, ``read_threads`` at once); they must
    agree, and the feed must change nothing at a time history does not list.
    Each state must have one row per account (all of them), no balance
    negative and the constant total; the change from the previous commit
    must be exactly the commit's transfer (its source down, its destination
    up by its amount, nothing else). Each transfer id is in history at most
    once; an ``ok`` transfer is there at its commit time, one that failed or
    did not land is not, one that landed is; nothing else touches the
    accounts.
    """
    rep = BankReport(outcomes=dict(Tally(t.outcome for t in transfers)))
    by_tid = {t.transfer: t for t in transfers}
    history = db.history()
    commits = transfer_commits(history)
    rep.transfers_in_history = len(commits)
    for tid, times in commits.items():
        if len(times) > 1:
            rep.violation("transfer-applied-twice", f"{tid} committed at {sorted(times)}")
        if tid not in by_tid:
            rep.violation("unknown-transfer", f"{tid} at {times}: no worker recorded it")
    for t in transfers:
        times = commits.get(t.transfer, [])
        if t.status == "ok" and times != [t.commit_ts]:
            rep.violation("lost-transfer", f"{t.transfer} acknowledged at {t.commit_ts}, history has {times}")
        elif t.status == "fail" and times:
            rep.violation("failed-transfer-landed", f"{t.transfer} ({t.outcome}) is in history at {times}")
        elif t.outcome == "not-landed" and times:
            rep.violation("lookup-missed", f"{t.transfer}: not found after Indeterminate, in history at {times}")
        elif t.outcome == "landed" and times != [t.commit_ts]:
            rep.violation("lookup-wrong", f"{t.transfer}: found at {t.commit_ts}, history has {times}")

    stamps = sorted({ts for ts in history.column("ts").to_pylist() if ts >= since_ts})
    table = db.table(ACCOUNTS_TABLE)
    replayed = _replay(table.changes(since_ts), stamps, rep)
    with ThreadPoolExecutor(max_workers=read_threads) as pool:
        snapshots = dict(zip(stamps, pool.map(lambda ts: table.to_arrow(as_of=ts).to_pylist(), stamps), strict=True))

    tid_at = {ts: tid for tid, times in commits.items() for ts in times}
    names = account_names(accounts)
    expected_total = INITIAL_BALANCE * accounts
    previous: dict[str, int] | None = None
    for ts in stamps:
        rows = snapshots[ts]
        rep.commits_checked += 1
        if sorted((r["account"], r["balance"]) for r in rows) != replayed[ts]:
            rep.violation("snapshot-vs-changes", f"at {ts}: snapshot {rows}, change feed {replayed[ts]}")
        balances = {r["account"]: r["balance"] for r in rows}
        if len(rows) != len(balances) or sorted(balances) != names:
            rep.violation("rows", f"at {ts}: {len(rows)} rows for accounts {sorted(balances)}")
        if any(b < 0 for b in balances.values()):
            rep.violation("negative-balance", f"at {ts}: {balances}")
        if sum(balances.values()) != expected_total:
            rep.violation("total", f"at {ts}: total {sum(balances.values())} != {expected_total}: {balances}")
        if previous is not None:
            changed = {a: balances.get(a, 0) - previous.get(a, 0) for a in set(balances) | set(previous)}
            changed = {a: d for a, d in changed.items() if d}
            tid = tid_at.get(ts)
            t = by_tid.get(tid) if tid is not None else None
            want = {} if t is None else {t.src: -t.amount, t.dst: t.amount}
            if changed != want:
                rep.violation(
                    "wrong-effect", f"at {ts} (transfer {tid}): balances changed by {changed}, expected {want}"
                )
        previous = balances
    return rep


def _replay(changes: pa.Table, stamps: Sequence[int], rep: BankReport) -> dict[int, list[tuple[str, int]]]:
    """The rows ``(account, balance)`` (sorted, with multiplicity) at each of ``stamps``, from a change feed."""
    state: Tally[tuple[str, int]] = Tally()
    listed = set(stamps)
    out: dict[int, list[tuple[str, int]]] = {}
    rows = sorted(changes.to_pylist(), key=lambda r: r["ts"])
    i = 0
    for ts in stamps:
        while i < len(rows) and rows[i]["ts"] <= ts:
            r = rows[i]
            if r["ts"] not in listed:
                rep.violation("unlisted-change", f"the change feed has {r} at a time history does not list")
            state[(r["account"], r["balance"])] += r["diff"]
            i += 1
        if any(n < 0 for n in state.values()):
            rep.violation("negative-multiplicity", f"at {ts}: {dict(state)}")
        out[ts] = sorted(row for row, n in state.items() for _ in range(max(n, 0)))
    for r in rows[i:]:
        rep.violation("unlisted-change", f"the change feed has {r} past the latest commit in history")
    return out


# ---- entry point -----------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> WorkerArgs:
    p = argparse.ArgumentParser(prog="tests.isolation.proc_worker", description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--seed", required=True, type=int)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--txns", type=int, default=1000, help="transactions per thread (at most)")
    p.add_argument("--keys", type=int, default=8, help="list keys, or accounts with --bank")
    p.add_argument("--isolation", default="strict_serializable", choices=["strict_serializable", "serializable"])
    p.add_argument("--bank", action="store_true")
    p.add_argument("--seconds", type=float, default=3600.0, help="start no transaction after this long")
    p.add_argument("--process", default="", help="the name in op ids (default: s<seed>)")
    p.add_argument("--retry-deadline", type=float, default=3.0, help="persist's retry_deadline_s")
    p.add_argument("--stop-file", type=Path, default=None, help="start no transaction once this file exists")
    a = p.parse_args(argv)
    return WorkerArgs(
        url=a.url, out=a.out, seed=a.seed, threads=a.threads, txns=a.txns, keys=a.keys, isolation=a.isolation,
        bank=a.bank, seconds=a.seconds, process=a.process, retry_deadline_s=a.retry_deadline, stop_file=a.stop_file,
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    return Worker(parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
