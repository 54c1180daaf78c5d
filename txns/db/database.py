"""The database: named tables over one txns shard, at a location found by its root record.

``Database`` is the user-facing API, a facade over collaborators that each
own one concern's state (docs/database.md has the map):

- :mod:`txns.db.opening` (``connect``): the root record, the txns shard;
- :mod:`txns.db.timeline`: the latest time, ``as_of`` as a timestamp;
- :mod:`txns.db.catalog` (``Catalog``): names -> shards, views cached by time;
- :mod:`txns.db.planner`: reads planned from the txns log, without writing;
- :mod:`txns.db.committer`: commits (group commit, DDL alone);
- :mod:`txns.db.retention` (``Maintenance``): holds, compaction, dropped tables;
- :mod:`txns.db.history`: committed transactions;
- :mod:`txns.db.applier`: the background apply worker.

Everything a user does goes through the txns protocol: a transaction's data
and DDL are one commit, one conditional write on the txns shard, at a hybrid
wall-clock timestamp the database chooses (:mod:`txns.db.clock`); it returns
once durable, and applying it happens on the background worker. Reads need
no apply (:mod:`txns.db.planner`).

Invariants (each kept by the collaborator named):

- At most one live table per name, ever (:mod:`txns.db.committer`).
- A table's shard is registered exactly when a name points to it: in the
  very commit that adds its catalog row (``Txn.register``); shards no
  readable catalog names any more are released by ``compact()``
  (:mod:`txns.db.retention`).
- A latest read never waits for a commit; a read at a past time beyond the
  upper closes that time first (:mod:`txns.db.timeline`).
- ``close()`` waits for the background apply of every commit made through
  this object, then stops its thread.
- Retention holds never pass an unapplied write (:mod:`txns.db.retention`).

A ``Database`` is safe to share between threads: one lock (``_lock``, the
handle lock, given to every collaborator) serializes this process's use of
the txns handle; part reads run outside it; the background worker never
takes it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from persist import Attempts, InvalidUsage, PersistClient, PersistConfig, ReadBelowSince, SnapshotPlan
from persist.url import redact
from txns.db import clock
from txns.db.applier import Applier
from txns.db.args import check_not_async, check_not_awaitable, check_positive_int
from txns.db.batch import BatchFn, BatchResult, run_batch
from txns.db.catalog import Catalog, CatalogView, TableEntry, check_name
from txns.db.committer import QUEUE_AFTER_LOST_S, UNCERTAIN_RETRIES, Committer
from txns.db.fairness import PRIORITY_AFTER, RunTurns, check_deadline, retry_conflicts
from txns.db.history import HISTORY_SCHEMA, History
from txns.db.intents import IntentFuture, IntentState, resolve_intents, submit_many
from txns.db.opening import open_location
from txns.db.oracle import ISOLATION_LEVELS, Oracles, TimestampOracle, check_isolation
from txns.db.planner import ReadPlanner
from txns.db.retention import (
    APPLY_WAIT_S,
    AUTO_COMPACT_BYTES,
    DROPPED_REPORT,
    RETENTION_EVERY_MS,
    Maintenance,
    check_retention,
    retention_of_ms,
)
from txns.db.root import RootRecord, read_root, update_root
from txns.db.skew import DEFAULT_MAX_CLOCK_SKEW, StorageClock
from txns.db.timeline import AsOf, Timeline
from txns.group_commit import SequencerLease
from txns.handle import TxnsHandle

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from txns.db.read_txn import ReadTransaction
    from txns.db.table import Table
    from txns.db.transaction import CommitInfo, Transaction


RUN_MAX_ATTEMPTS = 16
"""Kept for compatibility: ``db.run`` no longer stops after a count by default (see ``RUN_DEADLINE_S``)."""
RUN_DEADLINE_S = 60.0
"""How long ``db.run`` (and ``run_batch``, intent resolution) retry a transaction that keeps conflicting."""
RUN_BACKOFF_CAP_S = 0.2
"""The longest pause ``db.run`` takes between two attempts (jittered, growing from about 1 ms)."""


def connect(
    url: str,
    *,
    create: bool = True,
    retention: dt.timedelta | None = None,
    config: PersistConfig | None = None,
    isolation: str = "strict_serializable",
    max_clock_skew: dt.timedelta | None = DEFAULT_MAX_CLOCK_SKEW,
) -> Database:
    """Open the database at ``url``, creating it if absent (unless ``create=False``).

    ``url`` is ``file:///absolute/path``, ``s3://bucket/prefix?endpoint_url=...&region=...``
    or ``mem://name``. ``retention`` sets the history retention of a database
    created by this call (default 7 days); change it later with
    :meth:`Database.set_retention`. ``config`` tunes persist (tests shrink it).
    ``isolation``: the default isolation level of this object's transactions,
    ``"strict_serializable"`` or ``"serializable"`` (see :mod:`txns.db.oracle`).

    Raises ``DatabaseNotFound`` with ``create=False`` when there is no
    database at ``url`` (nothing is created then, not even a directory),
    and always where shards lie without a root record (a deleted root
    record: :func:`txns.db.recover_root`).

    ``max_clock_skew``: how far this client's clock may be from the
    storage's before it may not create the database, commit, compact or
    move a since (``ClockSkewError``; see :mod:`txns.db.skew`). None trusts
    the clock (tests whose fake clock stands for everyone's time).
    """
    isolation = check_isolation(isolation)
    o = open_location(url, create=create, retention=retention, config=config, max_clock_skew=max_clock_skew)
    return Database(o.client, o.root, url, isolation=isolation, handle=o.handle, storage_clock=o.storage_clock)


class Database:
    """A database of named tables at one location. Get one with :func:`txns.connect`.

    >>> import pyarrow as pa, txns
    >>> db = txns.connect("mem://doc-database")
    >>> accounts = db.create_table("accounts", pa.schema([("account", pa.string()), ("balance", pa.int64())]))
    >>> with db.transaction() as t:
    ...     _ = t.insert("accounts", [{"account": "alice", "balance": 10}])
    >>> db.table("accounts").to_arrow().to_pylist()
    [{'account': 'alice', 'balance': 10}]
    >>> db.tables()
    ['accounts']
    """

    def __init__(
        self,
        client: PersistClient,
        root: RootRecord,
        url: str,
        isolation: str = ISOLATION_LEVELS[0],
        handle: TxnsHandle | None = None,
        storage_clock: StorageClock | None = None,
    ) -> None:
        self.client = client
        self.root = root
        self._url = url
        #: the storage's clock and this client's skew against it (:mod:`txns.db.skew`)
        self.storage_clock = storage_clock or StorageClock(
            client.blob, client.config.clock_ms, DEFAULT_MAX_CLOCK_SKEW // dt.timedelta(milliseconds=1), redact(url)
        )
        self._lock = threading.RLock()  # the handle lock: this process's use of self.handle
        self._closed = False
        # (init_ts: the upper of a txns shard still empty, a creator's that crashed, moves past the clock)
        self.handle = handle or TxnsHandle.open(
            client, root.txns_id, init_ts=clock.ts_of_ms(client.config.clock_ms()) + 1
        )
        # the txns shard's maintenance runs on the background worker, after its applies
        self.handle.maintain_on_commit = False
        h, lock, shown = self.handle, self._lock, redact(url)
        self.timeline = Timeline(client, h, lock, self.storage_clock, self._check_open)
        #: the timestamp oracles, one per isolation level (see :mod:`txns.db.oracle`)
        self.oracles = Oracles(self.timeline, isolation)
        self.planner = ReadPlanner(
            client, h, lock, root.catalog_id, lambda ts: self.catalogs.at(ts), lambda: self.root.retention_ms
        )
        self.catalogs = Catalog(client, h, lock, root.catalog_id, root.created_ms, shown, self.planner)
        self.maintenance = Maintenance(
            client, h, lock, self.storage_clock, lambda: self.root, self.catalogs, self.planner, shown
        )
        self._applier = Applier(client, root.txns_id, self.maintenance.after_apply)
        self.committer = Committer(client, h, lock, self.oracles, self._applier, self.planner, self.catalogs)
        self._applier.sequencer_maintains = self.committer.sequencer_maintains
        self.history_reader = History(h, lock, self.planner, self.latest, self.entry)
        #: intents submitted and resolved through this object (txns.db.intents)
        self.intent_state = IntentState()
        self._run_turns = RunTurns(self.handle)  # (db.run's fairness: only the handle's client and txns id)

    # ---- identity and settings ------------------------------------------------------------

    @property
    def url(self) -> str:
        """The location, as given (secrets redacted)."""
        return redact(self._url)

    @property
    def isolation(self) -> str:
        """The default isolation level of this object's transactions (see :mod:`txns.db.oracle`)."""
        return self.oracles.default

    @isolation.setter
    def isolation(self, level: str) -> None:
        self.oracles.default = check_isolation(level)

    @property
    def retention(self) -> dt.timedelta:
        """The default history retention of this database's tables."""
        return retention_of_ms(self.root.retention_ms)

    def set_retention(self, retention: dt.timedelta) -> None:
        """Change the database's default history retention (tables without their own use it)."""
        ms = check_retention(retention)
        with self._lock:
            self.root = update_root(self.client, {"retention_ms": ms})

    def _refresh_root(self) -> RootRecord:
        root = read_root(self.client)
        if root is not None:
            self.root = root
        return self.root

    @property
    def group_commits(self) -> int:
        """Group commits made through this object (each one conditional write; diagnostics)."""
        return self.committer.group_commits

    @property
    def grouped_transactions(self) -> int:
        """Transactions those group commits carried (diagnostics)."""
        return self.committer.grouped_transactions

    def __repr__(self) -> str:
        return f"Database({self.url!r})"

    def close(self) -> None:
        """Wait for the background apply of this object's commits, stop its worker thread, and release
        this process's hold on the txns shard. The object cannot be used after."""
        self._applier.close()
        with self._lock:
            if not self._closed:
                self._closed = True
                self.committer.close()
                self.handle.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidUsage("this database handle was closed; connect again")

    # ---- time -------------------------------------------------------------------------------

    def oracle(self, isolation: str | None = None) -> TimestampOracle:
        """The timestamp oracle of ``isolation`` (default: the database's level)."""
        return self.oracles.oracle(isolation)

    def latest(self) -> int:
        """The latest timestamp: every commit so far is at or below it (read fresh, never waits)."""
        return self.timeline.latest()

    def timestamp(self, as_of: AsOf = None) -> int:
        """``as_of`` (None: latest; a timestamp; a datetime) as a timestamp readable now.

        A past time beyond the latest commit is closed first (an empty
        commit); a future one is waited for (:mod:`txns.db.timeline`).
        """
        return self.timeline.timestamp(as_of)

    def resolve(self, as_of: AsOf) -> int:
        """Deprecated: :meth:`timestamp` (``resolve`` also names intent resolution and the resolver package)."""
        warnings.warn("Database.resolve(as_of) is now Database.timestamp(as_of)", DeprecationWarning, stacklevel=2)
        return self.timestamp(as_of)

    # ---- catalog ------------------------------------------------------------------------------

    def catalog(self, ts: int) -> CatalogView:
        """The catalog at timestamp ``ts`` (already resolved)."""
        return self.catalogs.at(ts)

    def entry(self, name: str, ts: int) -> TableEntry:
        """The catalog entry of table ``name`` at ``ts``, or TableNotFound saying what exists."""
        return self.catalogs.entry(name, ts)

    def tables(self, as_of: AsOf = None) -> list[str]:
        """The names of the tables at ``as_of`` (default: latest), sorted."""
        return sorted(self.catalog(self.timestamp(as_of)).tables)

    def table(self, name: str) -> Table:
        """The table ``name`` (TableNotFound if there is none now)."""
        from txns.db.table import Table

        check_name(name)
        self.entry(name, self.latest())
        return Table(self, name)

    # ---- DDL shortcuts (each one transaction) -------------------------------------------------

    def create_table(
        self,
        name: str,
        schema: pa.Schema,
        *,
        retention: dt.timedelta | None = None,
        primary_key: Sequence[str] | None = None,
    ) -> Table:
        """Create table ``name`` with ``schema`` (a flat ``pyarrow.Schema``) in its own transaction.

        ``primary_key`` (a list of column names) makes it a keyed table (see ``Transaction.create_table``).
        """
        from txns.db.table import Table

        with self.transaction() as t:
            t.create_table(name, schema, retention=retention, primary_key=primary_key)
        return Table(self, name)

    def drop_table(self, name: str) -> None:
        """Drop table ``name`` in its own transaction. Reads as of earlier times still see it."""
        with self.transaction() as t:
            t.drop_table(name)

    def rename_table(self, old: str, new: str) -> None:
        """Rename table ``old`` to ``new`` in its own transaction (its data and history stay)."""
        with self.transaction() as t:
            t.rename_table(old, new)

    def set_table_retention(self, name: str, retention: dt.timedelta | None) -> None:
        """Give table ``name`` its own history retention (None: the database's default)."""
        with self.transaction() as t:
            t.set_retention(name, retention)

    # ---- transactions -------------------------------------------------------------------------

    def transaction(self, metadata: Mapping[str, Any] | None = None, isolation: str | None = None) -> Transaction:
        """A new transaction; use it as a context manager (commits on a clean exit).

        Its reads happen at one read timestamp chosen by the isolation level's
        oracle (default: the database's, see :mod:`txns.db.oracle`). If it
        read anything, it commits only if what it read is unchanged at its
        commit time; else the commit raises ``TransactionConflict`` (having
        committed nothing): :meth:`run` retries such a conflict for you.
        """
        from txns.db.transaction import Transaction

        self._check_open()
        return Transaction(self, metadata, isolation=check_isolation(isolation or self.isolation))

    def run(
        self,
        fn: Callable[[Transaction], Any],
        *,
        isolation: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        max_attempts: int | None = None,
        deadline_s: float | None = None,
    ) -> CommitInfo:
        """Run ``fn(t)`` in a transaction and commit it; on a conflict, run it again. Returns the commit info.

        ``fn`` may run more than once: it must act only through ``t`` (no
        side effects elsewhere). ``run`` commits ``t`` itself: ``t.commit()``
        or ``with t:`` inside ``fn`` raises ``InvalidUsage`` (nothing
        commits), and so does an ``async def`` function (or one returning an
        awaitable), which ``run`` cannot await. Raising ``txns.Abort`` (or any exception)
        inside it commits nothing and propagates. Conflicting attempts are
        retried (jittered backoff between them, :func:`persist.retry_until`)
        until ``deadline_s`` (default ``RUN_DEADLINE_S``, 60 s) has passed,
        or ``max_attempts`` ran if given; a call that keeps losing takes the
        run turn and goes through (:mod:`txns.db.fairness`). Only then
        ``TransactionConflict`` says how long it tried and how many attempts
        ran. A storage failure of uncertain outcome
        (``persist.Indeterminate``) propagates: the transaction may have
        committed, and running it again could apply it twice; its id
        (``db.history()``) tells.

        >>> import pyarrow as pa, txns
        >>> db = txns.connect("mem://doc-run")
        >>> _ = db.create_table("kv", pa.schema([("k", pa.string()), ("v", pa.int64())]), primary_key=["k"])
        >>> def bump(t):
        ...     row = t.get("kv", "a")
        ...     t.upsert("kv", [{"k": "a", "v": (row["v"] if row else 0) + 1}])
        >>> _ = db.run(bump); _ = db.run(bump)
        >>> db.table("kv").to_arrow().to_pylist()
        [{'k': 'a', 'v': 2}]
        """
        check_positive_int(max_attempts, "max_attempts")
        deadline = check_deadline(deadline_s, RUN_DEADLINE_S)
        if not callable(fn):
            raise InvalidUsage(f"run takes a function of a transaction, got {type(fn).__name__}")
        check_not_async(fn)
        level = check_isolation(isolation or self.isolation)
        turns = self._run_turns
        mine: list[SequencerLease] = []  # the run turn, once this call starves

        def attempt(state: Attempts) -> CommitInfo:
            turns.before_attempt(state, mine[0] if mine else None)
            t = self.transaction(metadata, isolation=level)
            t._in_run = True  # (t.commit() and `with t:` inside fn are refused: run commits it)
            try:
                check_not_awaitable(fn, fn(t))
                info = t._commit()
            except BaseException:
                t.abort()
                raise
            return dataclasses.replace(info, attempts=state.number)

        def on_retry(_e: BaseException, state: Attempts) -> None:
            turns.conflicted()
            if state.number >= PRIORITY_AFTER and not mine:
                mine.append(turns.turn())

        try:
            return retry_conflicts(
                attempt,
                what="run",
                deadline_s=deadline,
                max_attempts=max_attempts,
                cap_s=RUN_BACKOFF_CAP_S,
                on_retry=on_retry,
            )
        finally:
            if mine:
                mine[0].release()

    def run_batch(
        self,
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
        """Run functions of a ``BatchContext`` in parallel, repaired to equal running them one by one in
        list order, and commit their writes as one transaction (:func:`txns.db.batch.run_batch`).

        Each ``fn(ctx)`` reads and writes keyed tables through ``ctx.get`` /
        ``ctx.put`` / ``ctx.delete`` / ``ctx.add`` and may run more than once;
        ``txns.Abort`` drops just that function. The result says each one's
        outcome, and how many executions and repairs it took.
        ``executor``: ``"threads"``, ``"processes"``, ``"spark"`` (the
        parallel phase as a Spark job on ``spark``, default the active
        session) or None (no parallel phase).

        >>> import pyarrow as pa, txns
        >>> db = txns.connect("mem://doc-db-run-batch")
        >>> _ = db.create_table("kv", pa.schema([("k", pa.string()), ("v", pa.int64())]), primary_key=["k"])
        >>> def bump(ctx):
        ...     row = ctx.get("kv", "a")
        ...     ctx.put("kv", {"k": "a", "v": (row["v"] if row else 0) + 1})
        >>> res = db.run_batch([bump, bump, bump])
        >>> res.outcomes, res.repairs, db.table("kv").to_arrow().to_pylist()
        (['committed', 'committed', 'committed'], 2, [{'k': 'a', 'v': 3}])
        """
        kw: dict[str, Any] = {"max_attempts": max_attempts, "deadline_s": deadline_s}
        if spark is not None:
            kw["spark"] = spark
        return run_batch(self, fns, executor=executor, workers=workers, isolation=isolation, metadata=metadata, **kw)

    def submit(
        self,
        reads: Mapping[tuple[str, Any], Mapping[str, Any] | None] | None = None,
        writes: Mapping[tuple[str, Any], Mapping[str, Any] | None] | None = None,
        adds: Mapping[tuple[str, Any], Mapping[str, int | float]] | None = None,
        *,
        metadata: Mapping[str, Any] | None = None,
    ) -> IntentFuture:
        """Submit a transaction as data, to be resolved in the data plane; returns a future of its outcome.

        ``reads``: ``{(table, key): row as read, or None for absent}``;
        ``writes``: ``{(table, key): new row, or None to delete}``; ``adds``:
        ``{(table, key): {column: delta}}``, on keyed tables. The intent is
        durable when this returns (its commit time is ``future.epoch``); it
        commits iff every read still matches when its epoch is resolved, in
        id order after the earlier intents (:mod:`txns.db.intents`).
        ``future.result()`` gives the :class:`txns.db.intents.Outcome`.
        ``SubmitUncertain`` (its write may have landed): wait on its
        ``futures``, never submit again blindly.

        >>> import pyarrow as pa, txns
        >>> db = txns.connect("mem://doc-submit")
        >>> _ = db.create_table("seats", pa.schema([("seat", pa.string()), ("who", pa.string())]), primary_key=["seat"])
        >>> a = db.submit(reads={("seats", "1A"): None}, writes={("seats", "1A"): {"seat": "1A", "who": "ann"}})
        >>> b = db.submit(reads={("seats", "1A"): None}, writes={("seats", "1A"): {"seat": "1A", "who": "bob"}})
        >>> a.result().committed, b.result().committed
        (True, False)
        >>> db.table("seats").to_arrow().to_pylist()
        [{'seat': '1A', 'who': 'ann'}]
        """
        self._check_open()
        return submit_many(self, [{"reads": reads, "writes": writes, "adds": adds}], metadata)[0]

    def submit_many(
        self, intents: Sequence[Mapping[str, Any]], *, metadata: Mapping[str, Any] | None = None
    ) -> list[IntentFuture]:
        """Submit several intents (dicts with ``reads`` / ``writes`` / ``adds``) in one commit; a future each."""
        self._check_open()
        if isinstance(intents, Mapping) or not isinstance(intents, Sequence):
            raise InvalidUsage(f"submit_many takes a list of intents (dicts), got {type(intents).__name__}")
        return submit_many(self, list(intents), metadata)

    def resolve_intents(self) -> int:
        """Resolve every submitted intent whose epoch has closed; how many this call resolved.

        Any process may run it, any number of times, concurrently: every
        intent gets exactly one outcome (:mod:`txns.db.intents`).
        """
        self._check_open()
        return resolve_intents(self)

    def read(self, as_of: AsOf = None, isolation: str | None = None) -> ReadTransaction:
        """A read-only transaction: every read through it at one timestamp (``as_of``; None: the oracle's read time).

        ``with db.read() as r: r.table("a").to_arrow(); r.table("b").to_arrow()``
        reads both tables as of ``r.ts``, whatever commits meanwhile. Without
        ``as_of``, ``r.ts`` comes from the isolation level's oracle: the
        latest commit in any process (``strict_serializable``, one head read),
        or the latest this process saw (``serializable``, no request).
        """
        from txns.db.read_txn import ReadTransaction

        self._check_open()
        ts = self.oracle(isolation).read_ts() if as_of is None else self.timestamp(as_of)
        return ReadTransaction(self, ts)

    def sql(self, query: str, as_of: AsOf = None) -> Any:
        """``query`` run by DuckDB over this database's tables, all as of one time (None: the latest commit).

        Returns the DuckDB relation (``.arrow()``, ``.df()``, ``.pl()``). Needs
        ``pip install 'txns[duckdb]'``; see :mod:`txns.duckdb`.
        """
        from txns.duckdb import sql

        self._check_open()
        return sql(self, query, as_of)

    # ---- reads (forwards for txns.spark until it uses the engine interface) -------------------

    def plan(self, entry: TableEntry, ts: int) -> SnapshotPlan:
        """A snapshot plan of ``entry``'s data shard at ``ts`` (:meth:`txns.db.planner.ReadPlanner.plan`)."""
        return self.planner.plan(entry, ts)

    def _below(self, entry: TableEntry, ts: int, since: int) -> ReadBelowSince:
        return self.planner.below(entry, ts, since)

    # ---- history, retention and compaction ------------------------------------------------------

    def history(self, table: str | None = None, limit: int | None = None) -> pa.Table:
        """Committed transactions, newest first, as an Arrow table.

        Columns: ``ts`` (int64), ``time`` (timestamp[ms, UTC]), ``txn_id``,
        ``tables`` (names written or changed), ``rows_added``,
        ``rows_retracted``, ``operations`` (DDL, e.g. ``create orders``),
        ``metadata`` (the JSON given to ``db.transaction(metadata=...)``).
        ``table`` keeps the transactions that touched that table (by its
        data shard: renames included); ``limit`` keeps the newest ones.
        """
        return self.history_reader.history(table, limit)

    def _settle(self, timeout: float | None = None) -> bool:
        """Wait for the background apply (and maintenance) of every commit made so far; whether it ran."""
        return self._applier.wait(None, timeout)

    def compact(
        self, tables: Sequence[str] | None = None, *, merge: Callable[[str], dict[str, Any]] | None = None
    ) -> dict[str, dict[str, Any]]:
        """Apply retention to every table (and the catalog), then compact each one. Returns a report per table.

        Also retires dropped tables whose drop is older than the retained
        history, reported under ``DROPPED_REPORT``. ``tables``: only these
        (by name; TableNotFound for an unknown one), and neither the catalog
        nor dropped tables. ``merge``: merges one data shard (by id) in place
        of the in-process ``compact_all`` and returns the same report
        (``txns.spark.compact_tables`` passes a Spark job). See
        :meth:`txns.db.retention.Maintenance.compact`.
        """
        self._check_open()
        self.storage_clock.check("compact")
        self._settle(APPLY_WAIT_S)  # (the worker's maintenance first, so the two do not race)
        with self._lock:
            self._refresh_root()
            return self.maintenance.compact(self.latest(), tables, merge)


__all__ = [
    "APPLY_WAIT_S",
    "AUTO_COMPACT_BYTES",
    "AsOf",
    "DROPPED_REPORT",
    "HISTORY_SCHEMA",
    "RUN_BACKOFF_CAP_S",
    "RUN_DEADLINE_S",
    "RUN_MAX_ATTEMPTS",
    "QUEUE_AFTER_LOST_S",
    "RETENTION_EVERY_MS",
    "UNCERTAIN_RETRIES",
    "Database",
    "check_retention",
    "connect",
]
