"""The database: named tables over one txns shard, at a location found by its root record.

``txns.connect(url)`` reads (or creates) the root record (:mod:`txns.db.root`)
and opens the txns shard it names (one conditional write: the handle's
lease; for a new database also the shard's schema, critical since and an
upper at the clock). Creating a database overlaps the root record's write
with opening the proposed txns shard and recording the system shards'
schemas: a creator whose root loses the race leaves those unused. The
catalog shard is registered by the first commit that writes it (the first
DDL), in that commit's own write. Everything a user does goes through the
txns protocol:

- a transaction's data and DDL are one commit, one conditional write on the
  txns shard; the commit's record (the txns layer's commits shard) carries
  what history shows;
- commit timestamps are hybrid wall-clock timestamps (:mod:`txns.db.clock`)
  chosen by the database: ``max(txns upper, now)``; a taken one is retried at
  the new upper, never by the user;
- a commit returns as soon as it is durable. Applying it into the data
  shards (metadata only), the maintenance that asks for, and moving the
  written tables' retention holds happen right after, on a background worker
  with a handle of its own (:mod:`txns.db.applier`); the entries it applied
  are tidied by the next commit;
- reads need no apply: a table (the catalog and history too) is read as its
  data shard's batches plus the committed batches not applied to it yet,
  taken from the txns shard's log (:meth:`Database._log_plan`), so a read
  never waits for the worker, repeats its work or writes anything (where
  the txns cache cannot vouch for that, the txns read protocol applies and
  fills as before). A crash or a failed apply blocks nobody.

Invariants:

- A commit that contains DDL validates it against the catalog just below
  the txns upper ``u`` it read, and commits (at ``max(u, now)``) only if
  the upper is still exactly ``u`` (``commit_at(expect_upper=u)``), so no
  concurrent DDL can slip in between the check and the write: at most one
  live table per name, ever. The catalog it validated, with its DDL
  replayed, is the catalog at its commit time: it is cached as such, so
  the next reads of the catalog cost nothing.
- Creating a table registers its (fresh) data shard in the txns shard in
  the very commit that adds its catalog row (``Txn.register``), as the
  first catalog row registers the catalog: a shard is
  registered exactly when a name points to it, and an abandoned (or
  crashed) transaction leaves only an unregistered shard with a schema.
  Shards no readable catalog names any more are released by ``compact()``.
- The latest time is the txns upper minus one, read fresh: a latest read
  never waits for a commit. A read at a past wall-clock time beyond the
  upper first closes that time with an empty commit (so the answer can
  never change); a read at a future time waits up to ``read_wait_s`` for
  commits to reach it, then raises ``ReadTimeout``.
- ``close()`` waits for the background apply of every commit made through
  this object, then stops its thread.
- Retention holds never pass an unapplied write: a hold is moved only after
  the shard was made readable (applied and filled) at the time it may reach,
  by the handle that moves it (the worker's, or this object's in ``compact``).

A ``Database`` is safe to share between threads (one lock serializes its
use of the txns handle; part reads run outside it; the background worker
never takes that lock).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import inspect
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import unquote

import pyarrow as pa

from persist import (
    Attempts,
    CorruptObject,
    Indeterminate,
    InvalidUsage,
    PartRetired,
    PersistClient,
    PersistConfig,
    PersistError,
    ReadBelowSince,
    ReadTimeout,
    Schema,
    SnapshotPlan,
    backoff,
    replan,
)
from persist.url import redact
from txns.commits import COMMITS_SCHEMA, commits_shard_id
from txns.db import clock
from txns.db.applier import Applier
from txns.db.batch import BatchFn, BatchResult, run_batch
from txns.db.catalog import CATALOG_SCHEMA, CatalogView, TableEntry, check_name
from txns.db.errors import DatabaseNotFound, TableNotFound, TransactionConflict
from txns.db.fairness import PRIORITY_AFTER, RunTurns, check_deadline, retry_conflicts
from txns.db.intents import IntentFuture, IntentState, resolve_intents, submit_many
from txns.db.oracle import ISOLATION_LEVELS, LocalOracle, SharedOracle, TimestampOracle, check_isolation
from txns.db.pool import each, in_pool, pool
from txns.db.recover import find_databases
from txns.db.retention import RetentionHolds, check_retention, retention_of_ms
from txns.db.root import (
    LEFTOVERS_SHOWN,
    ROOT_KEY,
    RootRecord,
    create_root,
    new_proposal,
    read_root,
    root_or_leftovers,
    update_root,
)
from txns.db.scan import PlanReader, read_changes, read_table
from txns.db.skew import DEFAULT_MAX_CLOCK_SKEW, StorageClock, check_max_skew
from txns.db.validation import ReadSet, conflict, writes_in
from txns.errors import NotRegistered, TimestampUnavailable
from txns.group_commit import GroupCommitter, SequencerLease
from txns.handle import TxnsHandle
from txns.txn import Txn

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from txns.db.read_txn import ReadTransaction
    from txns.db.table import Table
    from txns.db.transaction import CommitInfo, Transaction

log = logging.getLogger(__name__)

AsOf = int | dt.datetime | None
RETENTION_EVERY_MS = 60_000
"""How often (at most) a database moves a written table's retention hold along."""
T = TypeVar("T")

DROPPED_REPORT = "(dropped tables)"
"""The key of ``compact()``'s report on dropped tables retired ({"tombstoned": n, "forgotten": n})."""
RUN_MAX_ATTEMPTS = 16
"""Kept for compatibility: ``db.run`` no longer stops after a count by default (see ``RUN_DEADLINE_S``)."""
RUN_DEADLINE_S = 60.0
"""How long ``db.run`` (and ``run_batch``, intent resolution) retry a transaction that keeps conflicting."""
RUN_BACKOFF_CAP_S = 0.2
"""The longest pause ``db.run`` takes between two attempts (jittered, growing from about 1 ms)."""
QUEUE_AFTER_LOST_S = 1.0
"""After a write-only group loses a race to another process, write-only groups queue for this long."""
UNCERTAIN_RETRIES = 3
"""A data-only commit that failed Indeterminate is committed again (at most once in effect) this many times."""
AUTO_COMPACT_BYTES = 8 << 20
"""Tables up to this size are compacted whole when their hold moves (bigger ones by ``compact()``)."""
APPLY_WAIT_S = 5.0
"""How long ``compact()`` waits for the background worker's apply and maintenance before its own."""


def _quietly(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - an optimization only; the caller's later steps do it again
        log.debug("%s%r deferred: %s", getattr(fn, "__name__", fn), args, e)


@dataclasses.dataclass(eq=False)
class _Pending:
    """A commit waiting in the group-commit queue, and its outcome once settled."""

    txn: Txn
    written: dict[str, int]
    reads: ReadSet
    names: Mapping[str, TableEntry]
    read_ts: int | None
    isolation: str | None
    writes: ReadSet
    done: bool = False
    result: tuple[int, int | None] | None = None
    error: BaseException | None = None


def _overlaps(reads: ReadSet, wrote: Mapping[str, set[tuple[Any, ...]] | None]) -> bool:
    """Whether anything read is among what was written (per data shard: a key in both, or a whole table)."""
    for d, keys in reads.items():
        if d not in wrote:
            continue
        w = wrote[d]
        if keys is None or w is None or not keys.isdisjoint(w):
            return True
    return False


def _check_not_async(fn: Callable[..., Any]) -> None:
    """InvalidUsage for an ``async def`` function (or callable object, or partial of one): ``run`` cannot await it."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    call = type(target).__call__ if not inspect.isroutine(target) else None  # (a callable object's method)
    if inspect.iscoroutinefunction(target) or (call is not None and inspect.iscoroutinefunction(call)):
        raise InvalidUsage(
            f"db.run takes a plain function of a transaction, got the async function {fn!r}, which it cannot "
            f"await; make it a plain `def` (nothing was committed)"
        )


def _check_not_awaitable(fn: Callable[..., Any], result: object) -> None:
    """InvalidUsage if ``fn(t)`` returned an awaitable (closed unawaited, so it never runs)."""
    if inspect.isawaitable(result):
        close = getattr(result, "close", None)
        if callable(close):
            close()
        raise InvalidUsage(
            f"db.run's function {fn!r} returned an awaitable ({type(result).__name__}), which run cannot "
            f"await: its work never ran; make it a plain `def` (nothing was committed)"
        )


def _missing_file_dir(url: str) -> str | None:
    """For a ``file://`` URL whose directory does not exist, that directory (opening would create it)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() != "file" or "?" in rest or "#" in rest:
        return None
    path = unquote(rest)
    if path.startswith("localhost/"):
        path = path[len("localhost") :]
    if path.startswith("/") and not (Path(path) / "consensus").is_dir():
        return path  # (a file store keeps every consensus key under PATH/consensus: no database here)
    return None


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
    if not isinstance(url, str):
        raise InvalidUsage(f"connect takes a URL string, got {type(url).__name__}")
    retention_ms = None if retention is None else check_retention(retention)
    isolation = check_isolation(isolation)
    max_skew_ms = check_max_skew(max_clock_skew)
    how = f"create one with txns.connect({redact(url)!r}) or `txns init {redact(url)}`"
    if not create and _missing_file_dir(url) is not None:
        raise DatabaseNotFound(f"no database at {redact(url)!r}; {how}")
    client = PersistClient.open(url, config)
    skew = StorageClock(client.blob, client.config.clock_ms, max_skew_ms, redact(url))
    root = read_root(client)
    handle = None
    if root is None and create:
        found = root_or_leftovers(client)  # (one LIST on an empty location)
        if isinstance(found, RootRecord):
            root = found  # a racing creator's
        elif found and find_databases(client):  # (else only crashed creators' proposals: unused, as before)
            shards = ", ".join(found) + (", ..." if len(found) >= LEFTOVERS_SHOWN else "")
            raise DatabaseNotFound(
                f"the location {redact(url)!r} holds shards ({shards}) "
                f"but no database root record ({ROOT_KEY!r}): a database whose root record was deleted? A new "
                f"database is never created over it. Recover it with txns.db.recover_root({redact(url)!r}) "
                f"(README: \"Clocks, and a deleted root record\"), or use an empty location"
            )
    if root is None:
        if not create:
            raise DatabaseNotFound(f"no database at {redact(url)!r}; {how}")
        skew.check("create a database")  # (its first upper is at this client's clock)
        proposal = new_proposal(client.config.clock_ms())
        if retention_ms is not None:
            proposal = RootRecord(proposal.txns_id, proposal.catalog_id, proposal.created_ms, retention_ms)
        for d in (proposal.txns_id, proposal.catalog_id, commits_shard_id(proposal.txns_id)):
            client.assume_new(d)  # (fresh ids nothing names yet: their first writes read nothing first)
        opened = _open_proposed(client, proposal)
        root = create_root(client, proposal)
        handle = opened(root)
    return Database(client, root, url, isolation=isolation, handle=handle, storage_clock=skew)


def _open_proposed(client: PersistClient, proposal: RootRecord) -> Callable[[RootRecord], TxnsHandle | None]:
    """Start opening a proposed database's txns shard and recording its system shards' schemas.

    Runs while the root record is written, so a new database costs one
    conditional write in sequence, not three. Returns a function of the
    root that won: the opened handle if it is ours, else None (a racing
    creator's root won, or the speculative open failed: the database then
    opens the txns shard itself). The losers' shards stay unused and empty.
    """
    if in_pool():
        return lambda root: None
    # (upper just past now: the latest time, upper - 1, is then not before the root's creation)
    init_ts = clock.ts_of_ms(client.config.clock_ms()) + 1
    opening = pool().submit(TxnsHandle.open, client, proposal.txns_id, init_ts)
    system = ((proposal.catalog_id, CATALOG_SCHEMA), (commits_shard_id(proposal.txns_id), COMMITS_SCHEMA))
    schemas = [pool().submit(_quietly, client.register_schema, d, schema) for d, schema in system]

    def opened(root: RootRecord) -> TxnsHandle | None:
        for f in schemas:
            f.result()
        if root.txns_id != proposal.txns_id:
            opening.exception()  # (waited for: nothing of this call writes after connect returns)
            return None
        try:
            return opening.result()
        except Exception as e:  # noqa: BLE001 - the database opens it again and meets any failure itself
            log.debug("opening the new txns shard %s deferred: %s", proposal.txns_id, e)
            return None

    return opened


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
        #: the storage's clock and this client's skew against it (:mod:`txns.db.skew`)
        self.storage_clock = storage_clock or StorageClock(
            client.blob, client.config.clock_ms, DEFAULT_MAX_CLOCK_SKEW // dt.timedelta(milliseconds=1), redact(url)
        )
        #: the default isolation level of this object's transactions (see :mod:`txns.db.oracle`)
        self.isolation = check_isolation(isolation)
        self._oracles: dict[str, TimestampOracle] = {
            "strict_serializable": SharedOracle(self),
            "serializable": LocalOracle(self),
        }
        self._url = url
        self._lock = threading.RLock()
        self._queue_lock = threading.Lock()
        self._queue: list[_Pending] = []  # commits waiting for a group (see _commit)
        #: group commits made (each one conditional write) and transactions they carried (diagnostics)
        self.group_commits = 0
        self.grouped_transactions = 0
        self.shared_commits: deque[int] = deque(maxlen=256)  # recent times at which a group of 2+ committed
        #: write-only groups that lost a race go through the cross-process queue (made on first need)
        self._queue_committer: GroupCommitter | None = None
        self._queue_until = 0.0  # write-only groups go straight to the queue until then (contended)
        #: intents submitted and resolved through this object (txns.db.intents)
        self.intent_state = IntentState()
        # (init_ts: the upper of a txns shard still empty, a creator's that crashed, moves past the clock)
        self.handle = handle or TxnsHandle.open(client, root.txns_id, init_ts=self._now_ts() + 1)
        self._run_turns = RunTurns(self.handle)  # (db.run's fairness: only the handle's client and txns id)
        # the txns shard's maintenance runs on the background worker, after its applies
        self.handle.maintain_on_commit = False
        self._catalogs: dict[tuple[str, int], CatalogView] = {}
        self._min_table_retention_ms: int | None = None  # the shortest table retention seen in a catalog
        self._holds = RetentionHolds(client)
        self._held_at: dict[str, int] = {}
        self._hold_lock = threading.Lock()  # _holds and _held_at: used by the worker and by compact()
        self._closed = False
        self._applier = Applier(client, root.txns_id, self._after_apply)

    # ---- identity and settings ------------------------------------------------------------

    @property
    def url(self) -> str:
        """The location, as given (secrets redacted)."""
        return redact(self._url)

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

    def __repr__(self) -> str:
        return f"Database({self.url!r})"

    def close(self) -> None:
        """Wait for the background apply of this object's commits, stop its worker thread, and release
        this process's hold on the txns shard. The object cannot be used after."""
        self._applier.close()
        with self._lock:
            if not self._closed:
                self._closed = True
                if self._queue_committer is not None:
                    self._queue_committer.close()
                    self._queue_committer.handle.close()
                self.handle.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidUsage("this database handle was closed; connect again")

    # ---- time -------------------------------------------------------------------------------

    def _now_ts(self) -> int:
        return clock.ts_of_ms(self.client.config.clock_ms())

    def may_have_written(self, name: str, lo: int, hi: int, but: Collection[int] = ()) -> bool:
        """Whether a commit in ``[lo, hi]`` (other than at the times ``but``) may have written table ``name``.

        From the txns cache's write times (no request); True where it cannot
        tell (times below its since or past its frontier, a name it does not know).
        """
        e = self.catalog(hi).tables.get(name)
        if e is None:
            return True
        with self._lock:
            cache = self.handle.cache
            if lo < cache.since or hi >= cache.frontier:
                return True
            return bool(writes_in(cache, e.data_id, lo, hi).difference(but))

    def cached_latest(self) -> int | None:
        """The latest timestamp as this process last saw it (no request); None before it saw any."""
        with self._lock:
            cache = self.handle.cache
            return cache.frontier - 1 if cache.frontier > 0 else None

    def oracle(self, isolation: str | None = None) -> TimestampOracle:
        """The timestamp oracle of ``isolation`` (default: the database's level)."""
        return self._oracles[check_isolation(isolation or self.isolation)]

    def latest(self) -> int:
        """The latest timestamp: every commit so far is at or below it (read fresh, never waits)."""
        self._check_open()
        cache = self.handle.cache
        # The head read (the network round trip) outside the lock, so concurrent
        # transactions (and a group commit's leader) do not wait on it; the
        # machine keeps the newest state read, which the cache then absorbs.
        cache.shard.fetch()
        with self._lock:
            cache.sync_cached()
            return cache.frontier - 1

    def resolve(self, as_of: AsOf) -> int:
        """``as_of`` (None: latest; a timestamp; a datetime) as a timestamp readable now.

        See the module doc for times past the latest commit.
        """
        self._check_open()
        if as_of is None:
            return self.latest()
        if isinstance(as_of, dt.datetime):
            ts = clock.ts_of_datetime(as_of)
        elif isinstance(as_of, int) and not isinstance(as_of, bool):
            if as_of < 0:
                raise InvalidUsage(f"as_of must be a timestamp >= 0 or a datetime, got {as_of}")
            ts = as_of
        elif isinstance(as_of, dt.date):
            raise InvalidUsage(f"as_of takes a datetime, not a date ({as_of!r}); e.g. datetime(2024, 5, 1, 15, 0)")
        else:
            raise InvalidUsage(f"as_of must be a timestamp (int) or a datetime, got {type(as_of).__name__} {as_of!r}")
        if ts < 0 or ts >= 2**63:
            raise InvalidUsage(f"as_of {as_of!r} is out of range")
        with self._lock:
            cache = self.handle.cache
            if ts < cache.frontier:
                return ts
            cache.sync()
            if ts < cache.frontier:
                return ts
            if ts <= clock.ts_end_of_ms(self.storage_clock.closable_ms()):  # the past (or this millisecond)
                self._close_time(ts)
                return ts
        wait = self.client.config.read_wait_s
        try:
            with self._lock:
                cache.update_gt(ts, wait_s=wait)
        except ReadTimeout:
            raise ReadTimeout(
                f"as_of {clock.describe(ts)} is in the future: no commit reached it within {wait}s; "
                f"read at an earlier time (as_of=None reads the latest)",
                cache.frontier,
            ) from None
        return ts

    def _close_time(self, ts: int) -> None:
        """Advance the txns upper past ``ts`` (a past time nobody committed at) with an empty commit."""
        while self.handle.cache.frontier <= ts:
            try:
                self.handle.begin().commit_at(self.handle, ts)
            except TimestampUnavailable:
                self.handle.cache.sync()

    # ---- catalog ------------------------------------------------------------------------------

    def register_catalog(self, txn: Txn) -> None:
        """Have ``txn``, which writes the catalog, register it in the same write unless it is registered.

        The catalog is registered by the first commit that writes it (a new
        database's first DDL). A stale view costs nothing: registering an
        already registered shard is a no-op at commit time.
        """
        d = self.root.catalog_id
        if d in self.handle.cache.registered_now():
            return
        try:
            txn.register(d)
        except NotRegistered:  # its creator crashed before recording the catalog's schema
            self.client.register_schema(d, CATALOG_SCHEMA)
            txn.register(d)

    def _catalog_registered_ts(self) -> int | None:
        regs = self.handle.cache.registrations.get(self.root.catalog_id)
        return regs[0].register_ts if regs else None

    def catalog(self, ts: int) -> CatalogView:
        """The catalog at timestamp ``ts`` (already resolved)."""
        with self._lock:
            cache = self.handle.cache
            born = clock.ts_of_ms(self.root.created_ms)
            if ts < born:
                raise ReadBelowSince(
                    f"as_of {clock.describe(ts)} is before the database at {self.url!r} was created "
                    f"(at {clock.describe(born)})",
                    born,
                )
            created = self._catalog_registered_ts()
            if created is None and ts >= cache.frontier:
                cache.sync()
                created = self._catalog_registered_ts()
            if created is None or ts < created:
                return CatalogView(ts, {})  # no DDL yet at ts: the first one registers the catalog
            since = self.handle.data_writer(self.root.catalog_id).shard.state().since
            if ts < since:
                raise self._catalog_below(ts, since)
            # The catalog is the same at every time from its latest write up to
            # its next one: cache by that write (or, with none since the txns
            # cache's since, by that since).
            key: tuple[str, int] | None = None
            if cache.since <= ts < cache.frontier:
                w = cache.latest_write_le(self.root.catalog_id, ts)
                key = ("w", w) if w is not None else ("since", cache.since)
                hit = self._catalogs.get(key)
                if hit is not None:
                    return CatalogView(ts, hit.tables)
                if w is None and created is not None and created >= cache.since:
                    # Registered within what the cache knows and never written up to ts:
                    # empty, without a read (a new database's first transaction).
                    return CatalogView(ts, {})
            try:
                view = self._read_catalog(ts)
            except NotRegistered:
                raise ReadBelowSince(
                    f"as_of {clock.describe(ts)} is before the database at {self.url!r} was created", created or 0
                ) from None
            except ReadBelowSince as e:
                raise self._catalog_below(ts, e.since) from None
            if key is not None:
                self._remember_catalog(key, view)
            return view

    def _read_catalog(self, ts: int) -> CatalogView:
        """Read the catalog shard at ``ts`` (without writing anything when the txns cache allows)."""
        d = self.root.catalog_id
        cols = list(CATALOG_SCHEMA.key_names)

        def read() -> CatalogView:
            plan = self._log_plan(d, ts)
            if plan is None:
                return CatalogView.from_updates(ts, self.handle.snapshot(d, ts))
            rows = self._read_checked(d, lambda: read_table(self._plan_reader(plan, cols)))
            entries = [TableEntry.from_key(tuple(r[c] for c in cols)) for r in rows.to_pylist()]
            return CatalogView(ts, {e.name: e for e in entries})

        return replan(read)

    def _plan_reader(self, plan: SnapshotPlan, cols: list[str], filter: Any = None) -> PlanReader:
        return PlanReader(self.client.blob, plan, cols, filter, self.client.config.retry_deadline_s)

    def _read_checked(self, data_id: str, read: Callable[[], T]) -> T:
        """``read()`` of a plan of ``data_id``; a part found missing is classified (:meth:`missing_part`)."""
        try:
            return read()
        except PartRetired as e:
            raise self.missing_part(data_id, e.key) from None

    def missing_part(self, data_id: str, key: str) -> PersistError:
        """The error for part ``key`` of ``data_id`` found missing by a read: lost data, or retired by compaction.

        ``CorruptObject`` when what a plan made now would read still names
        the part: the data shard's state read afresh (``ShardView.missing_part``),
        or a committed batch the shard has not applied yet (a txns entry at or
        above that state's upper, which no compaction can have retired). Else
        ``PartRetired``: compaction replaced the part after the read was
        planned, and planning again (from the state just read) finds its
        successor. The one classification every read of the database uses.
        """
        verdict = self.client.shard(data_id).missing_part(key)  # (reads the head: plans use it from now on)
        if not isinstance(verdict, PartRetired):
            return verdict
        upper = self.client.shard(data_id).state().upper
        with self._lock:
            pending = [e for e in self.handle.cache.entries if e.data_id == data_id and e.batch and e.ts >= upper]
        for entry in pending:
            if any(p.key == key for r in entry.decode_batch().runs for p in r.parts):
                return CorruptObject(key, "a part of a committed batch (not applied to its table yet) is missing")
        return verdict

    def _remember_catalog(self, key: tuple[str, int], view: CatalogView) -> None:
        if len(self._catalogs) > 64:
            self._catalogs.clear()
        self._catalogs[key] = view
        rets = [e.retention_ms for e in view.tables.values() if e.retention_ms is not None]
        if rets:
            low = min(rets)
            cur = self._min_table_retention_ms
            self._min_table_retention_ms = low if cur is None else min(cur, low)

    def _catalog_below(self, ts: int, since: int) -> ReadBelowSince:
        return ReadBelowSince(
            f"as_of {clock.describe(ts)} is before the retained history of the database at {self.url!r}; "
            f"the earliest readable time is {clock.describe(since)}",
            since,
        )

    def tables(self, as_of: AsOf = None) -> list[str]:
        """The names of the tables at ``as_of`` (default: latest), sorted."""
        return sorted(self.catalog(self.resolve(as_of)).tables)

    def table(self, name: str) -> Table:
        """The table ``name`` (TableNotFound if there is none now)."""
        from txns.db.table import Table

        check_name(name)
        self.entry(name, self.latest())
        return Table(self, name)

    def entry(self, name: str, ts: int) -> TableEntry:
        """The catalog entry of table ``name`` at ``ts``, or TableNotFound saying what exists."""
        view = self.catalog(ts)
        e = view.tables.get(name)
        if e is None:
            known = sorted(view.tables)
            raise TableNotFound(
                f"no table {name!r} in the database at {self.url!r} as of {clock.describe(ts)}; "
                f"tables then: {known if known else 'none'}"
                + ("" if known else "; create one with db.create_table(name, schema)")
            )
        return e

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
        if max_attempts is not None and (
            isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1
        ):
            raise InvalidUsage(f"max_attempts must be a positive int or None, got {max_attempts!r}")
        deadline = check_deadline(deadline_s, RUN_DEADLINE_S)
        if not callable(fn):
            raise InvalidUsage(f"run takes a function of a transaction, got {type(fn).__name__}")
        _check_not_async(fn)
        level = check_isolation(isolation or self.isolation)
        turns = self._run_turns
        mine: list[SequencerLease] = []  # the run turn, once this call starves

        def attempt(state: Attempts) -> CommitInfo:
            turns.before_attempt(state, mine[0] if mine else None)
            t = self.transaction(metadata, isolation=level)
            t._in_run = True  # (t.commit() and `with t:` inside fn are refused: run commits it)
            try:
                _check_not_awaitable(fn, fn(t))
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
                attempt, what="run", deadline_s=deadline, max_attempts=max_attempts, cap_s=RUN_BACKOFF_CAP_S,
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
        ts = self.oracle(isolation).read_ts() if as_of is None else self.resolve(as_of)
        return ReadTransaction(self, ts)

    def _begin(self, metadata: dict[str, Any]) -> Txn:
        """A core transaction whose commit record carries ``metadata`` (what history shows)."""
        return self.handle.begin(metadata=metadata)

    def record_schema_soon(self, data_id: str, schema: Schema) -> Future[None] | None:
        """Start recording a fresh data shard's schema on the pool (None: not started; see :meth:`_record_schemas`)."""
        return None if in_pool() else pool().submit(self.client.register_schema, data_id, schema)

    def _record_schemas(self, shards: Mapping[str, Schema], started: Mapping[str, Future[None]] | None = None) -> None:
        """Record fresh data shards' schemas (a conditional write each, all at once).

        ``started``: writes already under way (:meth:`record_schema_soon`),
        waited for; one that failed is written again here (raising if it
        fails again). Recording a schema twice is a no-op.
        """
        todo = []
        for d, schema in shards.items():
            f = (started or {}).get(d)
            if f is not None:
                try:
                    f.result()
                    continue
                except Exception:  # noqa: BLE001 - written again just below, which raises if it fails again
                    pass
            todo.append((d, schema))
        for res in each(lambda item: self.client.register_schema(*item), todo):
            if isinstance(res, BaseException):
                raise res

    def _forget(self, data_ids: list[str]) -> None:
        with self._lock:
            ts = max(self.handle.cache.frontier, self._now_ts())
            while True:
                try:
                    self.handle.forget(ts, data_ids)
                    return
                except TimestampUnavailable as e:
                    ts = max(e.upper, self._now_ts())

    def _commit(
        self,
        txn: Txn,
        validate: Callable[[int], dict[str, TableEntry]] | None,
        written: Mapping[str, int] | None = None,
        *,
        reads: ReadSet | None = None,
        names: Mapping[str, TableEntry] | None = None,
        read_ts: int | None = None,
        isolation: str | None = None,
        writes: ReadSet | None = None,
    ) -> tuple[int, int | None]:
        """Commit ``txn`` once durable; return its commit time and the time its reads hold at.

        A transaction with DDL (``validate``) commits alone (:meth:`_commit_ddl`).
        The others go through a **group commit**: each joins a queue, and
        whoever holds the database's lock next commits every queued
        transaction that fits in one conditional write (:meth:`_commit_group`);
        a transaction already committed by another thread's group just
        returns. ``writes``: what it wrote (data shard -> primary keys, or None
        for the whole table), so a group never holds a transaction that read
        what an earlier member writes.
        """
        if validate is not None:
            return self._commit_ddl(
                txn, validate, written, reads=reads, names=names, read_ts=read_ts, isolation=isolation
            )
        p = _Pending(txn, dict(written or {}), reads or {}, names or {}, read_ts, isolation, writes or {})
        with self._queue_lock:
            self._queue.append(p)
        while not p.done:
            with self._lock:
                if not p.done:
                    with self._queue_lock:
                        members = [q for q in self._queue if not q.done]
                    try:
                        self._commit_group(members)
                    finally:
                        with self._queue_lock:
                            self._queue = [q for q in self._queue if not q.done]
        if p.error is not None:
            raise p.error
        assert p.result is not None
        return p.result

    def _commit_group(self, members: list[_Pending]) -> None:
        """Commit as many of ``members`` (in order) as fit in one conditional write; settle each one's outcome.

        Under the database's lock. A member joins the group unless it read
        something an earlier member of the group writes (it waits for the
        next group then; the first member always joins). A member that read
        (``reads``) is validated against every commit since its read time
        (:func:`txns.db.validation.conflict`): changed, it fails with
        ``TransactionConflict``. The group commits with the first member's
        core transaction, the others joined to it (``Txn.join``: one
        conditional write, one commit record each), and expects the txns
        upper it validated at when any member read. Serializable: in the
        write, members read nothing earlier members wrote, so the group order
        is a serial order at the one commit time. A taken time re-validates
        and re-forms the group (the failed write can no longer land: it
        expected an upper that has passed).
        """
        cache = self.handle.cache
        if all(not q.reads for q in members if not q.done) and time.monotonic() < self._queue_until:
            # Contended (a write-only group of this process lost a race lately): straight to the
            # cross-process queue, where one sequencer commits everyone's, instead of losing again.
            self._commit_queued([q for q in members if not q.done])
            return
        tidy = self._applier.take_tidy()
        group: list[_Pending] | None = None
        base: Txn | None = None
        expect: int | None = None
        uncertain_tries = 0
        while True:
            if group is None:
                group = self._form_group(members, cache.frontier)
                if not group:
                    return
                # (the first member is never held back: a base that leaves the
                # group failed validation and is never committed)
                base = group[0].txn
                base.join([q.txn for q in group[1:]])
                base.tidy(tidy)
                expect = cache.frontier if any(q.reads for q in group) else None
            assert base is not None
            oracle = self.oracle(group[0].isolation)
            ts = max(cache.frontier if expect is None else expect, oracle.write_ts())
            try:
                applied = base.commit_at(self.handle, ts, expect_upper=expect)
            except TimestampUnavailable as e:
                for o in self._oracles.values():
                    o.observe(e.upper - 1)
                if expect is not None:
                    group = None  # re-validate, re-form
                    continue
                # A write-only group lost a race with another process: queue it
                # (txns.group_commit), so contending processes share writes; and the
                # next ones too, for QUEUE_AFTER_LOST_S.
                self._queue_until = time.monotonic() + QUEUE_AFTER_LOST_S
                self._commit_queued(group)
                return
            except Indeterminate as e:
                uncertain_tries += 1
                if uncertain_tries > UNCERTAIN_RETRIES:
                    self._settle_failed(group, e)
                    return
                backoff(uncertain_tries)
                continue
            except BaseException as e:  # noqa: BLE001 - each member's outcome; raised in its thread
                self._settle_failed(group, e)
                return
            break
        assert group is not None and base is not None
        self._settle_committed(group, [applied.commit_ts] * len(group))

    def _settle_committed(self, group: list[_Pending], commit_ts: list[int]) -> None:
        """Each member committed at its ``commit_ts``: settle it, tell the oracles, and apply in the background."""
        for o in self._oracles.values():
            o.observe(max(commit_ts))
        written: dict[str, int] = {}
        for q, ts in zip(group, commit_ts, strict=True):
            written.update(q.written)
            q.result = (ts, q.read_ts)
            q.done = True
        self.group_commits += 1
        self.grouped_transactions += len(group)
        if len(group) > 1:
            self.shared_commits.extend(sorted(set(commit_ts)))
        self._applier.submit(max(commit_ts), written)

    def _commit_queued(self, group: list[_Pending]) -> None:
        """Commit a write-only group through the cross-process queue; settle each member's outcome.

        Under the database's lock. The committer has a txns handle of its
        own: its background sequencer thread uses it while other threads use
        ``self.handle`` (a handle serves one thread at a time). Each member
        goes into the queue on its own (its tidy is dropped: later applies
        find those entries again), so members may commit at different times;
        each is settled with its own.
        """
        if self._queue_committer is None:
            oracle = self.oracle()
            handle = TxnsHandle.open(self.client, self.root.txns_id, hold=False)
            handle.maintain_on_commit = False  # (the background worker maintains the txns shard)
            self._queue_committer = GroupCommitter(
                handle, ts_fn=lambda upper: max(upper, oracle.write_ts()), direct=False
            )
        if group[0].txn.uncertain:
            # SUBTLE: an earlier attempt of this group (all its members, joined)
            # may have landed: each member must be looked up, not just the base.
            for q in group:
                q.txn.uncertain = True
        try:
            applied = self._queue_committer.commit_all([q.txn for q in group])
        except BaseException as e:  # noqa: BLE001 - each member's outcome; raised in its thread
            self._settle_failed(group, e)
            return
        self._settle_committed(group, [a.commit_ts for a in applied])

    def _form_group(self, members: list[_Pending], upper: int) -> list[_Pending]:
        """The members that commit together at ``upper``: validated, and none reading what an earlier one writes."""
        group: list[_Pending] = []
        wrote: dict[str, set[tuple[Any, ...]] | None] = {}
        for q in members:
            if q.done:
                continue
            if q.reads:
                assert q.read_ts is not None
                why = conflict(self, q.reads, q.names, q.read_ts + 1, upper - 1)
                if why is not None:
                    q.error = TransactionConflict(f"{why}; nothing was committed")
                    q.done = True
                    continue
                if group and _overlaps(q.reads, wrote):
                    continue  # it reads what an earlier member writes: the next group
                q.read_ts = upper - 1  # what it read holds up to the upper
            group.append(q)
            for d, keys in q.writes.items():
                if d in wrote and wrote[d] is None:
                    continue
                wrote[d] = None if keys is None else (wrote.get(d) or set()) | keys
        return group

    def _settle_failed(self, group: list[_Pending], e: BaseException) -> None:
        for q in group:
            q.error = e
            q.done = True

    def _commit_ddl(
        self,
        txn: Txn,
        validate: Callable[[int], dict[str, TableEntry]],
        written: Mapping[str, int] | None = None,
        *,
        reads: ReadSet | None = None,
        names: Mapping[str, TableEntry] | None = None,
        read_ts: int | None = None,
        isolation: str | None = None,
    ) -> tuple[int, int | None]:
        """Commit ``txn``, which has DDL, alone once durable; return its commit time and the time its reads hold at.

        ``validate(ts)`` checks the DDL against the catalog at ``ts`` and
        returns the tables after it. The commit goes at ``max(ts + 1, now)``
        only while the txns upper is still ``ts + 1`` (``expect_upper``), so
        no other DDL slips in between; ``ts`` is the transaction's read time
        if it read anything, else the latest time read fresh. When another
        commit took the time, its reads (if any) are checked against the
        commits in between (:func:`txns.db.validation.conflict`: changed,
        ``TransactionConflict``), and the DDL is validated again at the new
        upper - 1. The catalog it validated is cached as the catalog at the
        commit time. ``Indeterminate`` is raised to the caller (whose
        transaction then stays uncertain: ``db.history()`` tells).

        The commit is applied by the background worker (which also moves the
        retention holds of ``written``: the data shards written, with their
        tables' creation times); its applied entries are tidied by this
        database's next commit.
        """
        with self._lock:
            txn.tidy(self._applier.take_tidy())
            oracle = self.oracle(isolation)
            at = read_ts
            if not reads or at is None:
                self.handle.cache.sync()
                at = self.handle.cache.frontier - 1
            while True:
                live = validate(at)
                ts = max(at + 1, oracle.write_ts())
                try:
                    applied = txn.commit_at(self.handle, ts, expect_upper=at + 1)
                    break
                except TimestampUnavailable as e:
                    if reads:
                        why = conflict(self, reads, names or {}, at + 1, e.upper - 1)
                        if why is not None:
                            raise TransactionConflict(f"{why}; nothing was committed") from None
                    at = e.upper - 1  # what it read (if anything) holds there too
                    oracle.observe(at)
            oracle.observe(applied.commit_ts)
            if applied.commit_ts == ts:
                self._catalog_committed(ts, live)
            self._applier.submit(applied.commit_ts, written)
            return applied.commit_ts, (at if reads else read_ts)

    def _catalog_committed(self, ts: int, live: dict[str, TableEntry]) -> None:
        """Cache ``live`` as the catalog at ``ts``: the one a DDL commit validated, with its changes.

        Exact: a DDL commit expects exactly the upper it validated at, so no
        commit lies between; and only when the commit wrote the catalog (a
        transaction may create and drop a table again, writing nothing).
        """
        cache = self.handle.cache
        if cache.since <= ts < cache.frontier and cache.latest_write_le(self.root.catalog_id, ts) == ts:
            self._remember_catalog(("w", ts), CatalogView(ts, dict(live)))

    # ---- reads --------------------------------------------------------------------------------

    def plan(self, entry: TableEntry, ts: int) -> SnapshotPlan:
        """A snapshot plan of ``entry``'s data shard at ``ts`` (see :meth:`_log_plan`)."""
        with self._lock:
            try:
                plan = self._log_plan(entry.data_id, ts)
                if plan is not None:
                    return plan
                return self.handle.data_snapshot(entry.data_id, ts).plan()
            except ReadBelowSince as e:
                raise self._below(entry, ts, e.since) from None

    def _log_plan(self, data_id: str, ts: int) -> SnapshotPlan | None:
        """The snapshot of ``data_id`` at ``ts`` as a plan, read without writing anything.

        The data shard's batches, plus the batches committed to it at or
        below ``ts`` and not applied yet, taken from the txns shard's entries
        (a commit entry is the very batch an apply appends). So a read never
        waits for, nor repeats, the background apply, and never fills time.
        Exact (the rows of the table at ``ts``, nothing else) because:

        - any state of the data shard, however old, holds exactly the
          commits below its upper (txns invariant 2: a data upper past a
          commit time means that commit is applied), so a state whose upper
          is past ``ts`` is the snapshot, and otherwise the state plus the
          log's entries in ``[upper, ts]`` is, provided those entries are
          *every* write in that range;
        - the txns cache knows every write time at or above its since (and
          below its frontier, past ``ts``), so that proviso is checked
          against the cache's write times when the state's upper is at or
          above the cache's since; an entry tidied meanwhile was applied,
          so the state is read afresh (after the txns cache, which
          ``latest()`` and ``resolve()`` sync) and holds it;
        - SUBTLE: the cache does not know the writes below its since (they
          are all applied: txns invariant 3), and its since moves on while
          a cached data state may not: an idle handle's lease lapses and its
          cache restarts from a snapshot at the current since, and a live
          hold moves up with every commit. A cached state whose upper is
          below the cache's since may lack writes the cache cannot name, so
          it is never completed from the log: the state is read afresh
          first. A state read after the cache's since was observed holds
          every write below that since (they were applied before the since
          passed them), so no write lies in ``[upper, since)`` and the
          cache's times from the since on are all of them.

        None (the caller uses the txns read protocol, which applies and fills)
        when the cache cannot vouch for this.
        """
        cache = self.handle.cache
        if ts >= cache.frontier or not cache.registered_at(data_id, ts):
            return None
        w = self.handle.data_writer(data_id)
        state = w.shard.state()
        fresh = False
        if state.upper <= ts and state.upper < cache.since:
            state, fresh = w.shard.fetch(), True  # (the cache cannot name the writes in [upper, since))
        while True:
            if ts < state.since:
                raise ReadBelowSince(f"as_of {ts} is below shard {data_id}'s since {state.since}", state.since)
            runs = [r for b in state.batches if b.lower <= ts for r in b.runs if r.rows]
            if state.upper > ts or ts < cache.since:  # (the latter: a fresh state, holding every write <= ts)
                return SnapshotPlan(data_id, ts, tuple(runs), w.schema)
            due = writes_in(cache, data_id, state.upper, ts)
            pending = sorted(e for e in cache.entries if e.data_id == data_id and e.batch and state.upper <= e.ts <= ts)
            if {e.ts for e in pending} == due:
                # The state plus the log's entries from its upper on: entries at or
                # above its upper are not in it, and they are every write up to ts.
                runs += [r for e in pending for r in e.decode_batch().runs if r.rows]
                return SnapshotPlan(data_id, ts, tuple(runs), w.schema)
            if fresh:
                return None
            # Some writes in [upper, ts] were tidied from the log since this
            # state was cached: they are applied. Read the shard afresh (after
            # the cache, so whatever it applied since is in it).
            state, fresh = w.shard.fetch(), True

    def _below(self, entry: TableEntry, ts: int, since: int) -> ReadBelowSince:
        try:  # the retention in force now (the entry may be from the catalog of long ago)
            entry = self.catalog(self.handle.cache.frontier - 1).by_data_id().get(entry.data_id, entry)
        except ReadBelowSince:
            pass
        ret = entry.retention_ms if entry.retention_ms is not None else self.root.retention_ms
        return ReadBelowSince(
            f"table {entry.name!r}: as_of {clock.describe(ts)} is before its retained history "
            f"(retention {retention_of_ms(ret)}); the earliest readable time is {clock.describe(since)}",
            since,
        )

    def with_replan(self, entry: TableEntry, ts: int, read: Callable[[SnapshotPlan], T]) -> T:
        """``read(plan)``, planned again if compaction retired a part in between (:func:`persist.replan`)."""
        return replan(lambda: self._read_checked(entry.data_id, lambda: read(self.plan(entry, ts))))

    # ---- history -------------------------------------------------------------------------------

    def history(self, table: str | None = None, limit: int | None = None) -> pa.Table:
        """Committed transactions, newest first, as an Arrow table.

        Columns: ``ts`` (int64), ``time`` (timestamp[ms, UTC]), ``txn_id``,
        ``tables`` (names written or changed), ``rows_added``,
        ``rows_retracted``, ``operations`` (DDL, e.g. ``create orders``),
        ``metadata`` (the JSON given to ``db.transaction(metadata=...)``).
        ``table`` keeps the transactions that touched that table (by its
        data shard: renames included); ``limit`` keeps the newest ones.
        """
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise InvalidUsage(f"limit must be a non-negative int or None, got {limit!r}")
        ts = self.latest()
        data_id = None
        if table is not None:
            check_name(table)
            data_id = self.entry(table, ts).data_id
        with self._lock:
            records = self._commit_records(ts)
        rows = []
        for r in records.to_pylist():
            info = json.loads(r["info"])
            meta = info.get("metadata", {})
            db = meta.get("db")
            if not isinstance(db, dict):
                continue  # a commit made below the database layer
            touched = db.get("tables", {})  # data_id -> {name, added, retracted}
            if data_id is not None and data_id not in touched:
                continue
            rows.append(
                {
                    "ts": int(r["commit_ts"]),
                    "time": clock.wall_ms(int(r["commit_ts"])),
                    "txn_id": r["txn_id"],
                    "tables": sorted({t["name"] for t in touched.values()}),
                    "rows_added": sum(int(t.get("added", 0)) for t in touched.values()),
                    "rows_retracted": sum(int(t.get("retracted", 0)) for t in touched.values()),
                    "operations": list(db.get("ops", [])),
                    "metadata": json.dumps(meta.get("user", {}), sort_keys=True),
                }
            )
        rows.sort(key=lambda r: r["ts"], reverse=True)
        if limit is not None:
            rows = rows[:limit]
        return pa.Table.from_pylist(rows, schema=HISTORY_SCHEMA)

    def _commit_records(self, ts: int) -> pa.Table:
        """The commit records at ``ts`` (txn_id, commit_ts, wall_ms, info), read without writing anything
        when the txns cache allows (see :meth:`_log_plan`); else as ``TxnsHandle.commit_records``."""
        d = self.handle.commits_id
        cols = ["txn_id", "commit_ts", "wall_ms", "info"]

        def read() -> pa.Table:
            plan = self._log_plan(d, ts) if self.handle.cache.registered_at(d, ts) else None
            if plan is None:
                return self.handle.commit_records(ts)
            return self._read_checked(d, lambda: read_table(self._plan_reader(plan, cols)))

        return replan(read)

    # ---- retention and compaction -----------------------------------------------------------------

    def _retention_ms(self, entry: TableEntry) -> int:
        return entry.retention_ms if entry.retention_ms is not None else self.root.retention_ms

    def _hold(self, handle: TxnsHandle, data_id: str, retention_ms: int, latest: int) -> int:
        """Move ``data_id``'s retention hold to ``min(now - retention, latest)`` (readable there first).

        ``handle`` is the caller's own: the database's, or the background worker's.
        """
        self.storage_clock.check("move a retention since")
        # (never past the storage's now - retention, whatever this client's clock says)
        target = min(clock.ts_of_ms(max(0, self.storage_clock.now_ms() - retention_ms)), latest)
        handle.unblock_read(data_id, latest)
        with self._hold_lock:
            held = self._holds.hold(data_id, target)
            self._held_at[data_id] = self.client.config.clock_ms()
        return held

    def _has_expired_history(
        self, handle: TxnsHandle, data_id: str, now_ms: int, created_ms: int | None = None
    ) -> bool:
        """Whether the shard (as cached: no request) stores updates older than any retention could keep.

        Judged against the shortest retention in use, so a table with nothing
        older than that costs no hold at all, nor do new tables: a table
        created (``created_ms``) within that retention has no older update,
        and an update's time is at least its batch's lower bound and its
        run's time rewrite (a committed batch is rewritten to its commit time).
        """
        shortest = self.root.retention_ms
        if self._min_table_retention_ms is not None:
            shortest = min(shortest, self._min_table_retention_ms)
        if created_ms is not None and created_ms > now_ms - shortest:
            return False
        target = clock.ts_of_ms(max(0, now_ms - shortest))
        state = handle.data_writer(data_id).shard.state()
        if target <= state.since:
            with self._hold_lock:
                self._held_at[data_id] = now_ms
            return False
        for b in state.batches:
            for r in b.runs:
                if r.rows and max(b.lower, r.ts_rewrite if r.ts_rewrite is not None else 0) < target:
                    return True
        return False

    def _after_apply(self, handle: TxnsHandle, ts: int, written: dict[str, int]) -> None:
        """On the background worker, after applying up to ``ts``: move the holds of the tables written.

        ``written``: data shard -> its table's creation time (wall-clock ms).

        Each table at most once a minute, and only when it stores updates
        older than the shortest retention in use. Never takes the database's
        lock (see :mod:`txns.db.applier`).
        """
        now = self.client.config.clock_ms()
        with self._hold_lock:
            due = [d for d in sorted(written) if now - self._held_at.get(d, 0) >= RETENTION_EVERY_MS]
        due = [d for d in due if self._has_expired_history(handle, d, now, written[d])]
        if not due:
            return
        # the retentions in force at ts, read with the worker's handle
        by_id = CatalogView.from_updates(ts, handle.snapshot(self.root.catalog_id, ts)).by_data_id()
        for d in due:
            e = by_id.get(d)
            if e is None:
                continue
            before = handle.data_writer(d).shard.state().since
            if self._hold(handle, d, self._retention_ms(e), ts) > before:
                self._compact_small(handle, d)

    def _compact_small(self, handle: TxnsHandle, data_id: str) -> None:
        """After a hold moved: merge a small shard's batches at the new since (a big one waits for compact())."""
        w = handle.data_writer(data_id)
        state = w.shard.state()
        if len(state.batches) >= 2 and sum(b.size for b in state.batches) <= AUTO_COMPACT_BYTES:
            w.compact_all()

    def _settle(self, timeout: float | None = None) -> bool:
        """Wait for the background apply (and maintenance) of every commit made so far; whether it ran."""
        return self._applier.wait(None, timeout)

    def compact(
        self, tables: Sequence[str] | None = None, *, merge: Callable[[str], dict[str, Any]] | None = None
    ) -> dict[str, dict[str, Any]]:
        """Apply retention to every table (and the catalog), then compact each one. Returns a report per table.

        Also retires dropped tables whose drop is older than the retained
        history (see :meth:`_release_dropped`), reported under ``DROPPED_REPORT``.
        ``tables``: only these (by name; TableNotFound for an unknown one),
        and neither the catalog nor dropped tables. ``merge``: merges one
        data shard (by id) in place of the in-process ``compact_all`` and
        returns the same report (``txns.spark.compact_tables`` passes a
        Spark job).
        """
        self._check_open()
        self.storage_clock.check("compact")
        self._settle(APPLY_WAIT_S)  # (the worker's maintenance first, so the two do not race)
        report: dict[str, dict[str, Any]] = {}
        with self._lock:
            self._refresh_root()
            latest = self.latest()
            view = self.catalog(latest)
            longest = max([self.root.retention_ms, *(self._retention_ms(e) for e in view.tables.values())])
            if tables is not None:
                unknown = [n for n in tables if n not in view.tables]
                if unknown:
                    raise TableNotFound(
                        f"no table(s) {unknown} in the database at {self.url!r}; tables: {sorted(view.tables)}"
                    )
            chosen = sorted(view.tables.items()) if tables is None else [(n, view.tables[n]) for n in tables]
            targets = [(name, e.data_id, self._retention_ms(e)) for name, e in chosen]
            if tables is None and self.root.catalog_id in self.handle.cache.registered_now():
                targets.append(("(catalog)", self.root.catalog_id, longest))
            for name, d, ret in targets:
                since = self._hold(self.handle, d, ret, latest)
                r = self.handle.data_writer(d).compact_all() if merge is None else merge(d)
                r["hold"] = since
                report[name] = r
            self._catalogs.clear()
            if tables is None:
                report[DROPPED_REPORT] = self._release_dropped()
        return report

    def _release_dropped(self) -> dict[str, int]:
        """Retire the data shards no readable catalog names any more: dropped tables past their history.

        A data shard registered in the txns shard (user tables only) that no
        catalog row at or above the catalog's since mentions cannot be read
        by name at any time still readable: its table was dropped before the
        retained history (or it was never named: a crashed creator). Such a
        shard is tombstoned (its parts become garbage); once its garbage is
        deleted (after the part grace period, by a later ``compact``), it is
        forgotten by the txns shard, which then stops carrying it. Returns
        how many shards were tombstoned and forgotten by this call.
        """
        cache = self.handle.cache
        cache.sync()
        latest = cache.frontier - 1
        system = {self.root.catalog_id, self.handle.commits_id}
        candidates = sorted(set(cache.registered_now()) - system)
        out = {"tombstoned": 0, "forgotten": 0}
        if not candidates or latest < 0:
            return out
        named = self._catalog_data_ids(latest)
        gone = [d for d in candidates if d not in named]
        if not gone:
            return out
        self.handle.apply_le(latest, only=set(gone))  # (nothing is pending for a dropped table, normally)
        released = []
        for d in gone:
            if self.client.tombstone(d):
                out["tombstoned"] += 1
            w = self.handle.data_writer(d)
            w.shard.fetch()
            w.collect_garbage()
            if not w.shard.state().garbage:
                released.append(d)
        if released:
            self._forget(released)
            out["forgotten"] = len(released)
        return out

    def _catalog_data_ids(self, ts: int) -> set[str]:
        """Every data shard a catalog row at or above the catalog's since names (as of ``ts``)."""
        entry = TableEntry("(catalog)", self.root.catalog_id, CATALOG_SCHEMA.arrow, 0)

        def read(plan: Any) -> set[str]:
            t = read_changes(self.client.blob, plan, 0, ["data_id"], self.client.config.retry_deadline_s)
            return set(t.column("data_id").to_pylist())

        return self.with_replan(entry, ts, read)


HISTORY_SCHEMA = pa.schema(
    [
        pa.field("ts", pa.int64(), nullable=False),
        pa.field("time", pa.timestamp("ms", tz="UTC"), nullable=False),
        pa.field("txn_id", pa.string(), nullable=False),
        pa.field("tables", pa.list_(pa.string()), nullable=False),
        pa.field("rows_added", pa.int64(), nullable=False),
        pa.field("rows_retracted", pa.int64(), nullable=False),
        pa.field("operations", pa.list_(pa.string()), nullable=False),
        pa.field("metadata", pa.string(), nullable=False),
    ]
)


__all__ = ["Database", "HISTORY_SCHEMA", "check_retention", "connect"]
