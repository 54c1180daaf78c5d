"""``run_batch``: many transactions given as functions, run in parallel, repaired, committed as one.

``run_batch(db, [fn, ...])`` commits the same as running the functions one by
one, in list order (``db.run(fn)`` after ``db.run(fn)``), except that all of
them commit in ONE database transaction, and ``txns.Abort`` is the only
reason a function does not commit (it is dropped, the others commit). Each
``fn(ctx)`` reads and writes keyed tables through a
:class:`txns.resolve.repair.BatchContext`: ``ctx.get(table, key)``,
``ctx.put(table, row)``, ``ctx.delete(table, key)``, ``ctx.add(table, key,
column, delta)``. A function must be deterministic in what it reads through
``ctx`` and act only through it (it may run more than once); no DDL, no scans.

1. **Parallel phase**: every function runs against one snapshot
   (``db.read()``, at ``r.ts``) on a thread pool (``executor="threads"``,
   the default) or a process pool (``"processes"``: the functions must be
   picklable, e.g. module-level functions, ``functools.partial`` of them or
   instances of module-level classes; the workers, started with ``spawn``,
   open the database by its URL, so not a ``mem://`` one), or as a Spark
   job (``"spark"``: see :mod:`txns.spark.batch`; functions cloudpickled,
   so closures work too; a URL the executors can open). Each run records
   its reads and writes (:func:`txns.resolve.repair.execute`). A failing run
   (any exception but an abort) is only noted: the function runs again in
   phase 2, where its error counts.
2. **Repair and commit**, in the calling thread: a transaction ``t``
   (``db.transaction(metadata, isolation)``) reads the base state with
   ``t.get`` at its own read time, and :func:`txns.resolve.repair.repair`
   walks the functions in order, keeping a run whose reads still match
   (base + the writes of the earlier functions) and running the others again
   (the repairs). Every external read went through ``t.get``, so ``t``'s
   read set holds them; the net writes go in with one ``t.upsert`` and one
   ``t.delete`` per table, then ``t.commit()`` validates the reads (nothing
   they saw changed since ``t``'s read time) and commits.
3. On ``TransactionConflict`` the repair runs again in a new transaction,
   with the latest runs as the speculation (only functions whose reads
   changed run again), until the deadline (``deadline_s``, default 60 s;
   or ``max_attempts``, if given: :func:`persist.retry_until`); then
   ``TransactionConflict`` says how long it tried and how many attempts ran. A storage failure of uncertain outcome
   (``persist.Indeterminate``) propagates, as in ``Database.run``.

Executions: ``n`` in phase 1 plus the repairs of every attempt
(``BatchResult.executions == n + BatchResult.repairs``).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import pickle
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from persist import Attempts, InvalidUsage, PersistClient
from txns.db.args import check_positive_int
from txns.db.arrow_io import NOT_ARROW, conform
from txns.db.catalog import TableEntry
from txns.db.errors import Abort, DatabaseNotFound, InvalidPrimaryKey, TransactionConflict
from txns.db.fairness import check_deadline, retry_conflicts
from txns.db.keyed import keys_from_values, require_keyed
from txns.db.root import read_root
from txns.engines import engine_named
from txns.resolve.repair import DELETE, BatchContext, Execution, Key, RepairResult, Row, Write, execute, repair

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from txns.db.database import Database
    from txns.db.transaction import CommitInfo, Transaction

BATCH_MAX_ATTEMPTS = 16
"""Kept for compatibility: a batch retries conflicts until its deadline (``RUN_DEADLINE_S``) unless given a count."""
RUN_DEADLINE_S = 60.0
"""How long a batch retries conflicts by default (as ``db.run``)."""
BATCH_BACKOFF_CAP_S = 0.2
EXECUTORS = ("threads", "processes", "spark", None)

BatchFn = Callable[[BatchContext], Any]


@dataclasses.dataclass(frozen=True)
class BatchResult:
    """What ``run_batch`` did.

    ``commit``: the one transaction's ``CommitInfo`` (None when nothing was
    written); ``outcomes[i]``: ``"committed"`` or ``"aborted"``; ``aborted``:
    index -> the ``Abort``'s message; ``results[i]``: what function i
    returned (None if it aborted); ``executions``: runs of functions in all
    (``n`` speculative plus ``repairs``); ``executions_per_fn`` /
    ``repairs_per_fn``: the same per function; ``executions_per_txn``:
    ``executions / n``; ``attempts``: database transactions tried.
    """

    commit: CommitInfo | None
    outcomes: list[str]
    aborted: dict[int, str]
    results: list[Any]
    executions: int
    repairs: int
    executions_per_txn: float
    attempts: int
    executions_per_fn: list[int]
    repairs_per_fn: list[int]


# ---- tables: keys and rows as the database holds them ------------------------------------------------


class _Tables:
    """The keyed tables as of ``ts``: their key columns, and rows / keys conformed to their schemas."""

    def __init__(self, db: Database, ts: int) -> None:
        self._db = db
        self._ts = ts
        self._entries: dict[str, TableEntry] = {}
        self._lock = threading.Lock()
        self.keys: dict[str, tuple[str, ...]] = {
            name: tuple(e.primary_key) for name, e in db.catalog(ts).tables.items() if e.primary_key is not None
        }

    def entry(self, table: str) -> TableEntry:
        e = self._entries.get(table)
        if e is None:
            if not isinstance(table, str):
                raise InvalidUsage(f"a batch function gave a table name of type {type(table).__name__}: {table!r}")
            e = self._db.entry(table, self._ts)  # TableNotFound names the tables there are
            with self._lock:
                self._entries[table] = e
        return e

    def key(self, table: str, key: object) -> Key:
        e = self.entry(table)
        require_keyed(e, "a batch function's get/delete")
        return keys_from_values(e, [key])[0]

    def row(self, table: str, row: Mapping[str, Any]) -> Row:
        e = self.entry(table)
        pk = require_keyed(e, "a batch function's put")
        if not isinstance(row, Mapping):
            raise InvalidUsage(
                f"table {e.name!r}: ctx.put takes one row as a dict of column -> value, got {type(row).__name__}"
            )
        missing = [c for c in pk if row.get(c) is None]
        if missing:
            raise InvalidPrimaryKey(
                f"table {e.name!r}: a batch function put a row without (or with null) primary key column(s) "
                f"{missing}: {row!r}; give every key column {list(pk)} a value"
            )
        try:
            given = pa.Table.from_pylist([dict(row)])
        except NOT_ARROW as x:
            raise InvalidUsage(
                f"table {e.name!r}: a batch function put a row Arrow cannot convert: {row!r}: {x}"
            ) from None
        out: Row = conform(given, e.schema, e.name).to_pylist()[0]
        return out


class _SnapshotReader:
    """Point reads of keyed tables at one timestamp, cached (the snapshot never changes); thread-safe."""

    def __init__(self, db: Database, ts: int) -> None:
        self._r = db.read(as_of=ts)
        self._cache: dict[tuple[str, Key], Row | None] = {}
        self._lock = threading.Lock()

    def __call__(self, table: str, key: Key) -> Row | None:
        k = (table, key)
        with self._lock:
            if k in self._cache:
                return self._cache[k]
        row = self._r.get(table, key)
        with self._lock:
            self._cache[k] = row
        return row


def _run_snapshot(fn: BatchFn, read: _SnapshotReader, tables: _Tables) -> Execution:
    return execute(
        fn, read, tables.keys, aborts=(Abort,), capture=True, normalize_row=tables.row, normalize_key=tables.key
    )


# ---- workers: processes and Spark executors ----------------------------------------------------------


class SnapshotWorker:
    """The snapshot at ``ts`` of the database at ``url``, opened in a worker (a pool process, a Spark executor).

    Opens its own client by URL (``cls``: the database class), reads the
    catalog and point-reads at ``ts`` only; :meth:`run` runs one function
    against the snapshot (a capturing :func:`txns.resolve.repair.execute`).
    Used by ``executor="processes"`` (one per pool process) and by
    :mod:`txns.spark.batch` (one per Spark partition).
    """

    def __init__(self, cls: type[Database], url: str, ts: int) -> None:
        client = PersistClient.open(url)
        root = read_root(client)
        if root is None:
            raise DatabaseNotFound(f"a batch worker found no database at the URL it was given ({client.url!r})")
        self.db = cls(client, root, url)
        self._read = _SnapshotReader(self.db, ts)
        self._tables = _Tables(self.db, ts)

    def run(self, fn: BatchFn) -> Execution:
        """One run of ``fn`` against the snapshot, recorded (an exception other than an abort too)."""
        return _run_snapshot(fn, self._read, self._tables)

    def close(self) -> None:
        self.db.close()


_WORKER: dict[str, SnapshotWorker] = {}


def _worker_init(cls: type[Database], url: str, ts: int) -> None:
    """A pool worker opens the database (its own client) and fixes the snapshot."""
    _WORKER["w"] = SnapshotWorker(cls, url, ts)


def _worker_run(pickled: bytes) -> Execution:
    fn = pickle.loads(pickled)
    return _WORKER["w"].run(fn)


def _pickled(fns: Sequence[BatchFn]) -> list[bytes]:
    out = []
    for i, fn in enumerate(fns):
        try:
            out.append(pickle.dumps(fn))
        except Exception as e:  # noqa: BLE001 - whatever pickling raises, the advice is the same
            raise InvalidUsage(
                f"run_batch(executor='processes'): function {i} ({fn!r}) cannot be pickled ({e}); use "
                f"module-level functions, functools.partial of them, or instances of module-level classes "
                f"(or executor='threads')"
            ) from None
    return out


# ---- the batch ---------------------------------------------------------------------------------------


def _check(
    db: Database, fns: object, executor: object, workers: object, max_attempts: object, spark: object = None
) -> list[BatchFn]:
    if isinstance(fns, (str, bytes, Mapping)) or not isinstance(fns, Sequence):
        raise InvalidUsage(f"run_batch takes a list of functions fn(ctx), got {type(fns).__name__}")
    bad = [i for i, f in enumerate(fns) if not callable(f)]
    if bad:
        raise InvalidUsage(
            f"run_batch takes a list of functions fn(ctx); item(s) {bad[:10]} are not callable "
            f"(the first is {type(fns[bad[0]]).__name__} {fns[bad[0]]!r})"
        )
    if executor not in EXECUTORS:
        raise InvalidUsage(f"executor must be 'threads', 'processes', 'spark' or None, got {executor!r}")
    if spark is not None and executor != "spark":
        raise InvalidUsage(f"spark= is for executor='spark' only (executor is {executor!r})")
    check_positive_int(workers, "workers")
    check_positive_int(max_attempts, "max_attempts")
    if executor in ("processes", "spark") and db._url.lower().startswith("mem://"):
        where = "other processes" if executor == "processes" else "Spark executors (other processes)"
        raise InvalidUsage(
            f"run_batch(executor={executor!r}) needs a database {where} can open; {db.url!r} is in "
            f"this process's memory: use executor='threads', or a file:// or s3:// database"
        )
    return list(fns)


def _speculate(
    db: Database,
    fns: list[BatchFn],
    executor: str,
    workers: int | None,
    isolation: str | None,
    spark: SparkSession | None = None,
) -> list[Execution]:
    """Phase 1: every function once, in parallel, against one snapshot."""
    with db.read(isolation=isolation) as r:
        ts = r.ts
    if executor == "spark":
        # (found by registration: the database layer does not import txns.spark or pyspark)
        engine = engine_named("spark")
        if engine is None:
            raise InvalidUsage("run_batch(executor='spark'): no Spark engine is registered (import txns.spark)")
        return engine.speculate(db, ts, fns, workers=workers, session=spark)
    if executor == "threads":
        read = _SnapshotReader(db, ts)
        tables = _Tables(db, ts)
        n = workers or min(32, (os.cpu_count() or 1) + 4)
        with ThreadPoolExecutor(max_workers=n, thread_name_prefix="txns-batch") as ex:
            return list(ex.map(lambda f: _run_snapshot(f, read, tables), fns))
    pickled = _pickled(fns)
    n = workers or (os.cpu_count() or 1)
    chunk = max(1, len(fns) // (n * 4))
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        max_workers=n, mp_context=ctx, initializer=_worker_init, initargs=(type(db), db._url, ts)
    ) as pool:
        return list(pool.map(_worker_run, pickled, chunksize=chunk))


def _apply(t: Transaction, writes: Mapping[tuple[str, Key], Write]) -> None:
    """The batch's net writes into ``t``: one upsert and one delete per table."""
    upserts: dict[str, list[Row]] = {}
    deletes: dict[str, list[Key]] = {}
    for (table, key), w in writes.items():
        if w is DELETE:
            deletes.setdefault(table, []).append(key)
        else:
            upserts.setdefault(table, []).append(w)
    for table, rows in upserts.items():
        t.upsert(table, rows)
    for table, keys in deletes.items():
        t.delete(table, keys)


def run_batch(
    db: Database,
    fns: Sequence[BatchFn],
    *,
    executor: str | None = "threads",
    workers: int | None = None,
    isolation: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    max_attempts: int | None = None,
    spark: SparkSession | None = None,
    deadline_s: float | None = None,
) -> BatchResult:
    """Run ``fns`` as if one by one in list order, in parallel, and commit their writes in one transaction.

    See the module doc. ``executor``: ``"threads"`` (default),
    ``"processes"`` (picklable functions; not for ``mem://``), ``"spark"``
    (the parallel phase as a Spark job on ``spark``, default the active
    session: see :mod:`txns.spark.batch`; not for ``mem://``) or None (no
    parallel phase: each function runs in order inside the transaction).
    ``workers``: the pool's size (for Spark: the number of partitions,
    default the context's default parallelism). ``isolation`` / ``metadata``: those of the
    transaction (``db.transaction``). An ``Abort`` drops its function only;
    any other exception from a function propagates, and nothing is committed.

    >>> import pyarrow as pa, txns
    >>> from txns.db.batch import run_batch
    >>> db = txns.connect("mem://doc-run-batch")
    >>> _ = db.create_table("kv", pa.schema([("k", pa.string()), ("v", pa.int64())]), primary_key=["k"])
    >>> def bump(ctx):
    ...     row = ctx.get("kv", "a")
    ...     ctx.put("kv", {"k": "a", "v": (row["v"] if row else 0) + 1})
    >>> res = run_batch(db, [bump, bump, bump])
    >>> db.table("kv").to_arrow().to_pylist(), res.outcomes, res.executions, res.repairs
    ([{'k': 'a', 'v': 3}], ['committed', 'committed', 'committed'], 5, 2)
    """
    db._check_open()
    todo = _check(db, fns, executor, workers, max_attempts, spark)
    n = len(todo)
    if n == 0:
        return BatchResult(None, [], {}, [], 0, 0, 0.0, 0, [], [])
    spec: list[Execution] | None = None
    execs = [0] * n
    reps = [0] * n
    if executor is not None:
        spec = _speculate(db, todo, executor, workers, isolation, spark)
        execs = [1] * n
    carried: list[list[Execution] | None] = [spec]  # the speculation the next attempt repairs

    def attempt(state: Attempts) -> BatchResult:
        t = db.transaction(metadata, isolation=isolation)
        tables = _Tables(db, db.latest())
        res: RepairResult | None = None
        try:
            res = repair(
                todo,
                t.get,
                keys=tables.keys,
                aborts=(Abort,),
                speculative=carried[0],
                normalize_row=tables.row,
                normalize_key=tables.key,
            )
            _apply(t, res.writes)
            info = t.commit()
        except TransactionConflict:
            t.abort()
            if res is not None:
                _count(res, carried[0], execs, reps)
                carried[0] = res.final
            raise
        except BaseException:
            t.abort()
            raise
        _count(res, carried[0], execs, reps)
        total = sum(execs)
        return BatchResult(
            commit=None if info.ts is None else dataclasses.replace(info, attempts=state.number),
            outcomes=res.outcomes,
            aborted=res.aborted,
            results=res.results,
            executions=total,
            repairs=sum(reps),
            executions_per_txn=total / n,
            attempts=state.number,
            executions_per_fn=execs,
            repairs_per_fn=reps,
        )

    return retry_conflicts(
        attempt,
        what="run_batch, each attempt repairing what had changed,",
        deadline_s=check_deadline(deadline_s, RUN_DEADLINE_S),
        max_attempts=max_attempts,
        cap_s=BATCH_BACKOFF_CAP_S,
    )


def _count(res: RepairResult, spec: Sequence[Execution | None] | None, execs: list[int], reps: list[int]) -> None:
    """Add one attempt's runs (not the speculation it was given, counted already) to the totals."""
    for i, (e, r) in enumerate(zip(res.executions_per_fn, res.repairs_per_fn, strict=True)):
        given = 1 if spec is not None and spec[i] is not None else 0
        execs[i] += e - given
        reps[i] += r


__all__ = ["BATCH_MAX_ATTEMPTS", "BatchResult", "SnapshotWorker", "run_batch"]
