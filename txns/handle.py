"""TxnsHandle: register, commit, apply, tidy, forget, compact and read.

Protocol (docs/txns-protocol.md has the full story):

- commit at ``ts``: one compare-and-append on the txns shard over
  ``[upper, ts + 1)`` adding one entry per batch (and retracting tidied
  entries). Its success makes the transaction durable and advances the
  logical upper of every registered data shard to ``ts + 1``.
- apply up to ``ts``: for each data shard, one compare-and-append of the
  batches of every present entry at or past its data upper, in time order,
  over ``[data upper, last commit ts + 1)`` (a run; each batch keeps its own
  time). A data upper already past a commit time means someone applied it:
  that commit is left out. Appends of batches are metadata only.
- read ``d`` at ``as_of``: find the latest write to ``d`` at or before
  ``as_of``; apply it if nobody has; fill the empty time up to ``as_of + 1``
  with an empty append; read the data shard.

Invariants:

- Commits are linearized by the txns shard's upper; a data shard's upper
  only passes a commit time by applying that commit (or by filling time
  the txns shard proves empty for it).
- Every write below the txns shard's since is applied (``compact_to`` never
  advances the since past an unapplied write).
- A tidy retraction is only committed for an entry present in the cache as
  of the expected upper of the same compare-and-append, so each entry is
  retracted at most once even when handles race.
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar, cast

import pyarrow as pa
import pyarrow.compute as pc

from persist import (
    InvalidUsage,
    PersistClient,
    ReadHandle,
    Schema,
    ShardId,
    SinceHandle,
    SnapshotPlan,
    ThreadPool,
    UpperMismatch,
    WriteHandle,
    check_ts,
    replan,
)
from persist.errors import operation
from persist.manifest import consolidate
from txns.cache import TxnsCache
from txns.commits import COMMIT_RECORD_MAX_BYTES, COMMITS_SCHEMA, CommitRecord, commits_shard_id, encode_info
from txns.entries import TXNS_SCHEMA, Entry
from txns.errors import NotRegistered, TimestampUnavailable
from txns.request import CommitMember, CommitRequest
from txns.txn import Tidy, Txn, TxnApply

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])


def _operation(what: str) -> Callable[[F], F]:
    """Run a handle method under the outcome rule (:func:`persist.errors.operation`)."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with operation(what):
                return fn(*args, **kwargs)

        return cast(F, run)

    return wrap


DATA_MAINTAIN_BATCHES = 4
"""``apply_le`` runs a data shard's maintenance (compaction, GC) once it holds this many batches
(or retired parts are past their grace period)."""
TXNS_MAINTAIN_BATCHES = 8
"""``maintain`` compacts the txns shard once it holds this many batches (or collects garbage that is due): every
commit adds a small batch, and the size-tiered policy merged after most of them, a conditional write on the key
every commit contends for (0.35-0.46 per commit); merged 8 at a time, the tail is one write per several commits."""
APPLY_PARALLELISM = 64
"""Data shards applied (and then maintained) at once by ``apply_le``: each is one small
conditional write, so they overlap their round trips (a commit that touched K tables
becomes readable in about K / 64 round trips, not K)."""
APPLY_RUN_MAX = 256
"""``apply_le`` appends at most this many commits of one data shard in one conditional write."""
_APPLY_POOL = "txns-apply"


def _each(fn: Callable[[str], None], items: list[str]) -> None:
    """``fn`` on every item, up to ``APPLY_PARALLELISM`` at once, each in a copy of this context
    (so its writes count for the caller's operation); the first failure (in order) is raised
    once all ran.

    The threads are kept between calls (starting 64 threads for every apply cost more than the
    applies on a busy machine). A call from one of them runs inline, so nothing waits on itself.
    """
    if len(items) <= 1 or threading.current_thread().name.startswith(_APPLY_POOL):
        for x in items:
            fn(x)
        return
    pool = ThreadPool.of_process(_APPLY_POOL, APPLY_PARALLELISM)
    futures = [pool.submit(contextvars.copy_context().run, fn, x) for x in items]
    errors = [e for e in (f.exception() for f in futures) if e is not None]
    if errors:
        raise errors[0]


def _maintain_lazily(w: WriteHandle, batches: int) -> None:
    """Run ``w``'s maintenance once its shard holds ``batches`` batches or garbage is due.

    Every commit or apply adds one small batch, and the size-tiered policy
    merged after most of them (a conditional write each); merging several at
    a time makes the tail one write per several, and a few more batches cost
    reads little.
    """
    if len(w.shard.state().batches) >= batches or w.garbage_due():
        w.maintain()


CRITICAL_READER = "txns-critical-since"
COMPACT_TO_EVERY_S = 1.0
"""``TxnsHandle.maintain`` moves the txns shard's since (a conditional write there) at most this often."""
TXNS_INLINE_MAX = 256 << 10
"""Commits of up to this many bytes of entries live inline in the txns shard state (no part)."""
TXNS_COMPACTED_INLINE_MAX = 64 << 10
"""Compacted txns-shard batches up to this size stay inline; bigger ones become parts."""


class TxnsHandle:
    """A handle on one txns shard. Any number may be open, in any number of processes.

    A handle serves one thread at a time: give each thread its own (they may
    share one ``PersistClient``). Its idempotency tokens are per handle.

    >>> import pyarrow as pa
    >>> from persist import PersistClient, Schema, ShardId
    >>> client = PersistClient.open("mem://doc-txns")
    >>> schema = Schema(key=pa.schema([("k", pa.string())]), val=pa.schema([]))
    >>> txns = TxnsHandle.open(client, ShardId.new())
    >>> d0, d1 = str(ShardId.new()), str(ShardId.new())
    >>> txns.register(1, {d0: schema})
    >>> txns.register(2, {d1: schema})
    >>> txn = txns.begin()
    >>> txn.write(d0, ("a",), (), 1)
    >>> txn.write(d1, ("b",), (), 1)
    >>> tidy = txn.commit_at(txns, 3).apply(txns)
    >>> txns.snapshot(d1, 3)
    [((('b',), ()), 3, 1)]
    """

    def __init__(
        self, client: PersistClient, txns_id: str, hold: bool = True, reader: ReadHandle | None = None
    ) -> None:
        self.client = client
        self.txns_id = txns_id
        self.writer: WriteHandle = client.open_writer(txns_id, TXNS_SCHEMA, inline_max_bytes=TXNS_INLINE_MAX)
        # Compacted history (registrations, mostly) goes to parts past this size, so
        # each commit's state stays small however many shards are registered.
        self.writer.compaction_inline_max_bytes = TXNS_COMPACTED_INLINE_MAX
        # Maintenance runs after the cache has absorbed the commit (see _append),
        # so this handle never reads back the parts its own compaction writes.
        self.writer.auto_maintain = False
        self.cache = TxnsCache(client, txns_id, self, hold=hold, reader=reader)
        self._since: SinceHandle | None = None
        self._data_writers: dict[str, WriteHandle] = {}
        self._schemas: dict[str, Schema] = {}
        self._commits = 0
        #: conditional writes of commits that lost to another commit (its upper moved first): a caller
        #: that compares it around a commit learns whether it contended
        self.lost_races = 0
        self._compacted_at = float("-inf")  # (monotonic) when maintain() last ran compact_to
        #: Whether commits and registrations run the txns shard's maintenance
        #: (compaction, GC, and every 16 commits ``compact_to``) before they
        #: return. A caller that runs :meth:`maintain` elsewhere (the database's
        #: background worker) turns it off: the commit path is then its one
        #: conditional write.
        self.maintain_on_commit = True
        #: the system data shard holding a commit record per transaction (see txns.commits)
        self.commits_id = commits_shard_id(txns_id)
        self._commits_schema_registered = False

    @staticmethod
    def open(client: PersistClient, txns_id: ShardId | str, init_ts: int = 0, hold: bool = True) -> TxnsHandle:
        """Open the txns shard ``txns_id``, initializing it (upper at ``init_ts``) if new.

        ``hold=False``: the handle holds nothing on the txns shard (for
        one-off work such as a CLI command, so a killed process holds back
        no compaction); its cache restarts from a snapshot if compaction
        passes it, which long-lived handles avoid by holding (the default).
        """
        check_ts(init_ts, "init_ts")
        txns_id = str(txns_id) if isinstance(txns_id, ShardId) else str(ShardId.parse(str(txns_id)))
        if hold:
            # One conditional write, new shard or not: the cache's leased reader,
            # with the schema, the critical since and the initial upper when new.
            reader = client.open_leased_reader(
                txns_id, TXNS_SCHEMA, critical_reader=CRITICAL_READER, init_upper=init_ts
            )
            return TxnsHandle(client, txns_id, hold=hold, reader=reader)
        client.open_critical_since(txns_id, CRITICAL_READER, 0, schema=TXNS_SCHEMA)  # one write when new
        if init_ts > 0:
            w = client.open_writer(txns_id, TXNS_SCHEMA)
            if w.fetch_recent_upper() == 0:
                try:
                    w.compare_and_append([], 0, init_ts)
                except UpperMismatch:
                    pass
        return TxnsHandle(client, txns_id, hold=hold)

    def close(self) -> None:
        """Release this handle's hold on the txns shard (its cache's leased reader).

        Open handles hold the txns shard's since at what they have read; a
        handle that is dropped without closing (or whose process is killed)
        holds it until its lease lapses: ``reader_lease_s`` (120 s by
        default) after its last use.
        """
        self.cache.release()

    def __enter__(self) -> TxnsHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- views ----------------------------------------------------------------------

    @property
    def upper(self) -> int:
        """The txns shard's upper as this process last saw it (no request; changes nothing)."""
        return max(self.cache.frontier, self.cache.shard.state().upper)

    def read_cache(self) -> TxnsCache:
        return self.cache

    def data_schema(self, data_id: str) -> Schema:
        """The registered schema of a data shard (InvalidUsage if it has none)."""
        data_id = str(data_id)
        schema = self._schemas.get(data_id)
        if schema is None:
            schema = self.client.shard_schema(data_id)
            if schema is None:
                raise NotRegistered(f"data shard {data_id} has no schema: register it with TxnsHandle.register first")
            self._schemas[data_id] = schema
        return schema

    def expect_schema(self, data_id: str, schema: Schema) -> None:
        """Know ``schema`` as fresh data shard ``data_id``'s while it is being recorded (see ``Txn.register``)."""
        self._schemas.setdefault(str(data_id), schema)

    def data_writer(self, data_id: str) -> WriteHandle:
        data_id = str(data_id)
        w = self._data_writers.get(data_id)
        if w is None:
            # commit records always ride inline in the commit (metadata is bounded: txns.commits)
            inline = COMMIT_RECORD_MAX_BYTES * 2 if data_id == self.commits_id else None
            w = self.client.open_writer(data_id, self.data_schema(data_id), inline_max_bytes=inline)
            w.auto_maintain = False  # apply_le runs it after the (metadata-only) applies
            self._data_writers[data_id] = w
        return w

    # ---- registration -----------------------------------------------------------------

    @_operation("register")
    def register(self, register_ts: int, datas: Mapping[str | ShardId, Schema]) -> None:
        """Register data shards (with their schemas) at ``register_ts``. Idempotent.

        Raises TimestampUnavailable if a shard is not yet registered and
        ``register_ts`` is below the txns upper.
        """
        check_ts(register_ts, "register_ts")
        schemas = {str(ShardId.parse(str(d))): s for d, s in datas.items()}
        for d, schema in schemas.items():
            if not isinstance(schema, Schema):
                raise InvalidUsage(f"register takes {{data_id: persist.Schema}}; got {type(schema).__name__} for {d}")
            self.client.register_schema(d, schema)
            self._schemas[d] = schema
        while True:
            self.cache.sync_cached()
            new = sorted(d for d in schemas if d not in self.cache.registered_now())
            if not new:
                # SUBTLE: "already registered" must be judged on a current view: a
                # stale cache may predate another handle's forget of it.
                self.cache.sync()
                new = sorted(d for d in schemas if d not in self.cache.registered_now())
            if not new:
                return
            upper = self.cache.frontier
            if register_ts < upper:
                self.cache.sync()
                if self.cache.frontier != upper:
                    continue
                raise TimestampUnavailable("register", register_ts, upper)
            stale = False
            for d in new:
                du = self.data_writer(d).upper  # just read by register_schema above
                if du > register_ts + 1:
                    # SUBTLE: judge on a current view. A stale cache (another handle
                    # registered and forgot it, which fills its upper) made a
                    # register at a closed time fail with this misleading error
                    # instead of TimestampUnavailable.
                    self.cache.sync()
                    if self.cache.frontier != upper:
                        stale = True
                        break
                    raise InvalidUsage(
                        f"data shard {d} has upper {du}, past register_ts + 1 = {register_ts + 1}: it was "
                        f"written outside the txns shard; register it at a time >= {du - 1}"
                    )
            if stale:
                continue
            updates = [Entry(register_ts, d, b"").update(register_ts, 1) for d in new]
            if self._append(updates, upper, register_ts, token=None):
                return

    @_operation("forget")
    def forget(self, forget_ts: int, data_ids: Iterable[str | ShardId]) -> None:
        """Retire data shards from the txns set at ``forget_ts``, applying their pending writes first.

        Idempotent: shards not registered are skipped. Afterwards their
        physical upper is at ``forget_ts + 1`` and they may be used directly.
        """
        check_ts(forget_ts, "forget_ts")
        ids = sorted({str(ShardId.parse(str(d))) for d in data_ids})
        while True:
            self.cache.sync_cached()
            regs = self.cache.registered_now()
            todo = [d for d in ids if d in regs]
            if not todo:
                # SUBTLE: "not registered" must be judged on a current view: this
                # handle's cached state may predate the registration (another
                # handle registered it), and forget returned here doing nothing.
                self.cache.sync()
                regs = self.cache.registered_now()
                todo = [d for d in ids if d in regs]
            if not todo:
                # SUBTLE: a forget whose retraction committed but which failed
                # (Indeterminate) or crashed before its fill below is retried
                # here; finish the fill, or the forgotten shard's physical upper
                # stays behind its forget time for good.
                self._fill_forgotten(ids)
                return
            upper = self.cache.frontier
            if forget_ts < upper:
                self.cache.sync()
                if self.cache.frontier != upper:
                    continue
                raise TimestampUnavailable("forget", forget_ts, upper)
            tidy = self.apply_le(upper - 1, only=set(todo)) if upper > 0 else Tidy()
            updates = [Entry(regs[d].register_ts, d, b"").update(forget_ts, -1) for d in todo]
            updates += [e.update(forget_ts, -1) for e in tidy.entries if self.cache.present(e)]
            if self._append(updates, upper, forget_ts, token=None):
                self._fill_forgotten(ids)
                return

    def _fill_forgotten(self, ids: Iterable[str]) -> None:
        """Advance each forgotten shard's physical upper past the time it was forgotten at.

        Safe: forget applied every write to it below its forget time, and no
        commit may write to it after.
        """
        for d in ids:
            regs = self.cache.registrations.get(d)
            if regs and regs[-1].forget_ts is not None:
                self._fill(d, regs[-1].forget_ts)

    def forget_all(self, forget_ts: int) -> None:
        """Forget every registered data shard (not the system commits shard) at ``forget_ts``."""
        self.cache.sync()
        self.forget(forget_ts, [d for d in self.cache.registered_now() if d != self.commits_id])

    # ---- commits ---------------------------------------------------------------------

    def begin(self, txn_id: str | None = None, metadata: Mapping[str, Any] | None = None) -> Txn:
        """A new, empty transaction.

        ``txn_id``: its identity (default: random). Committing a transaction
        whose id already committed returns that commit instead, so a job
        that may run twice (a retried task, a replayed stream batch) can name
        its output. ``metadata``: JSON-serializable, recorded with the commit.
        """
        return Txn(self, txn_id=txn_id, metadata=metadata)

    def commit(self, txn: Txn, at: int | None = None, max_attempts: int = 1000) -> TxnApply:
        """Commit ``txn`` at the first free time at or after ``at`` (default: the current upper).

        A taken time is retried at the upper the refusal names, without
        rewriting any data, up to ``max_attempts`` times (then the last
        ``TimestampUnavailable`` is raised). Storage errors follow the rules
        of ``Txn.commit_at``: after ``Indeterminate`` call this again with
        the same ``txn``; it commits at most once.
        """
        if max_attempts < 1:
            raise InvalidUsage(f"max_attempts must be at least 1, got {max_attempts}")
        ts = self.upper if at is None else check_ts(at, "at")
        for attempt in range(max_attempts):
            try:
                return txn.commit_at(self, ts)
            except TimestampUnavailable as e:
                if attempt == max_attempts - 1:
                    raise
                ts = max(ts, e.upper)
        raise AssertionError("unreachable")

    def prepare_commit(self) -> None:
        """Make sure the commits shard has its schema (once per handle; no-op write after the first)."""
        if not self._commits_schema_registered:
            self.client.register_schema(self.commits_id, COMMITS_SCHEMA)
            self._schemas[self.commits_id] = COMMITS_SCHEMA
            self._commits_schema_registered = True

    def commit_entries(self, request: CommitRequest, tidy: Tidy) -> int:
        """Commit ``request`` (and retract ``tidy``) in one conditional write; return the commit time.

        The one commit loop (``Txn.commit_at`` builds the request; see
        :mod:`txns.request` for its fields: the time, what the caller
        validated, the members of a group commit, the durable identity).
        ``request.register``: fresh data shards (schemas recorded, or being
        recorded by ``request.ready``) registered at ``ts`` in the same write,
        unless registered already.

        With ``txn_id`` (and data in ``adds``) the members' commit records go
        in the same conditional write. With ``uncertain`` (an earlier attempt
        may have landed), every try first looks the transaction up at the very
        upper it then commits against, and returns the earlier commit's time
        if there is one: no commit can slip in between the look-up and the
        compare-and-append, so the transaction commits at most once even when
        copies of it are retried concurrently.
        """
        ts, adds, data_ids, token, txn_id = request.ts, request.adds, request.data_ids, request.token, request.txn_id
        uncertain, register, expect_upper = request.uncertain, request.register, request.expect_upper
        record = txn_id is not None and bool(adds)
        batch_ids = {e.decode_batch().id for e in adds} if uncertain else set()
        fresh = False  # whether the txns state was read from storage in this call

        def moved_on_fresh_view() -> bool:
            """Read the txns shard now; whether its upper moved past the one this try judged by."""
            nonlocal fresh
            self.cache.sync()
            fresh = True
            return self.cache.frontier != upper

        while True:
            self.cache.sync_cached()
            upper = self.cache.frontier
            if uncertain and txn_id is not None and adds:
                earlier = self._find_commit(txn_id, batch_ids, upper)
                if earlier is not None:
                    tidy.entries.clear()  # they were retracted by that commit, or are still for later
                    return earlier
                if self.cache.frontier != upper:
                    continue  # the look-up caught up with newer commits: look again there
            if request.check is not None:
                request.check(upper)  # (raises to give up: nothing committed)
            if expect_upper is not None and upper < expect_upper and not fresh:
                moved_on_fresh_view()  # (this handle's view is behind the caller's: judge on a fresh one)
                continue
            if expect_upper is not None and upper != expect_upper and not (ts < upper and self._last_append_was(token)):
                # (an upper past it: unless an earlier attempt of this very commit landed, see below)
                raise TimestampUnavailable("commit", max(ts, expect_upper), upper)
            if ts < upper:
                if not fresh and moved_on_fresh_view():
                    continue
                if self._last_append_was(token):
                    # SUBTLE: an earlier attempt of this very commit (same txn, same
                    # ts, this handle) reported Indeterminate but did commit, and
                    # the state was re-read since (any read does), so the upper is
                    # past ts. Raising TimestampUnavailable here told the caller
                    # to commit again higher: the same batches twice.
                    tidy.entries.clear()
                    return ts
                raise TimestampUnavailable("commit", ts, upper)
            if not self._registrable(register, ts):
                if moved_on_fresh_view():
                    continue
                self._check_registrable(register, ts)
            for d in data_ids:
                if d in register:
                    continue
                if not self.cache.registered_at(d, ts):
                    # (if the upper moved, check the time again first: a stale view
                    # made a commit at a closed time fail as NotRegistered)
                    if not moved_on_fresh_view() and not self.cache.registered_at(d, ts):
                        raise NotRegistered(
                            f"data shard {d} is not registered at {ts} (never registered, or forgotten); "
                            f"register it first. Nothing was committed"
                        )
                    break
            else:
                updates = [e.update(ts, 1) for e in adds]
                updates += [
                    Entry(ts, d, b"").update(ts, 1) for d in register if not self.cache.registered_at(d, ts)
                ]
                if record:
                    updates += self._record_updates(request.members, ts)
                # SUBTLE: retract only entries present as of `upper`; the CaA below
                # fails if anything (another tidy included) landed since.
                updates += [e.update(ts, -1) for e in tidy.entries if self.cache.present(e)]
                if self._append(updates, upper, ts, token, request.ready):
                    tidy.entries.clear()
                    self._commits += 1
                    if self.maintain_on_commit and self._commits % 16 == 0:
                        self._maybe_compact()
                    return ts
                fresh = True  # the lost compare-and-append read the state afresh

    def _registrable(self, register: tuple[str, ...], ts: int) -> bool:
        """Whether every shard of ``register`` may be registered at ``ts`` (per the cached views)."""
        return all(self.cache.registered_at(d, ts) or self.data_writer(d).upper <= ts + 1 for d in register)

    def _check_registrable(self, register: tuple[str, ...], ts: int) -> None:
        """InvalidUsage naming a shard of ``register`` written outside the txns shard past ``ts + 1``."""
        for d in register:
            if self.cache.registered_at(d, ts):
                continue
            du = self.data_writer(d).fetch_recent_upper()
            if du > ts + 1:
                raise InvalidUsage(
                    f"data shard {d} has upper {du}, past commit_ts + 1 = {ts + 1}: it was written outside "
                    f"the txns shard; register it at a time >= {du - 1}. Nothing was committed"
                )

    def _record_updates(self, members: Sequence[CommitMember], ts: int) -> list[Any]:
        """The txns-shard updates adding the members' commit records at ``ts``.

        The records go in as few batches as stay inline (no blob write): up
        to ``COMMIT_RECORD_MAX_BYTES`` of records each, a record alone if it
        is bigger (metadata is bounded). One batch per member, built and
        encoded one by one, was a third of a group commit's CPU on the
        committing thread at 64 threads. Registers the commits shard too if
        it is new.
        """
        w = self.data_writer(self.commits_id)
        now_ms = int(time.time() * 1000)
        chunks: list[list[Any]] = []
        size = 0
        for m in members:
            info = encode_info(dict(m.tables), dict(m.metadata))
            update = (((m.txn_id,), (ts, now_ms, info)), ts, 1)
            n = len(m.txn_id) + len(info.encode()) + 32
            if chunks and size + n <= COMMIT_RECORD_MAX_BYTES:
                chunks[-1].append(update)
                size += n
            else:
                chunks.append([update])
                size = n
        updates = [Entry(ts, self.commits_id, w.batch(c, ts, ts + 1).to_bytes()).update(ts, 1) for c in chunks]
        if not self.cache.registered_at(self.commits_id, ts):
            # Registered in the same write as its first record. Its upper is
            # still 0 (nothing writes it outside commits), so registering at ts is valid.
            updates.append(Entry(ts, self.commits_id, b"").update(ts, 1))
        return updates

    def find_commit(self, txn_id: str, batch_ids: set[str]) -> int | None:
        """The commit time of transaction ``txn_id`` (whose batches are ``batch_ids``) if it committed
        below the cache's frontier, else None. Reads the commits shard when the log does not tell."""
        return self._find_commit(txn_id, batch_ids, self.cache.frontier)

    def _find_commit(self, txn_id: str, batch_ids: set[str], upper: int) -> int | None:
        """The commit time of ``txn_id`` if it committed below ``upper``, else None.

        Unapplied and untidied commits are found in the log by their batch
        ids; tidied ones by their commit record.
        """
        for e in self.cache.entries:
            if (
                e.ts < upper
                and not e.is_registration
                and e.data_id != self.commits_id
                and e.decode_batch().id in batch_ids
            ):
                return e.ts
        rec = self._lookup_record(txn_id, upper)
        return rec.ts if rec is not None else None

    def _lookup_record(self, txn_id: str, upper: int) -> CommitRecord | None:
        """``txn_id``'s commit record among the commits below ``upper``, or None."""
        if upper == 0 or not self.cache.registered_at(self.commits_id, upper - 1):
            return None
        table = self._records_table(upper - 1, pc.field("txn_id") == txn_id)
        rows = table.to_pylist()
        if not rows:
            return None
        r = rows[0]
        return CommitRecord.from_row(r["txn_id"], r["commit_ts"], r["wall_ms"], r["info"])

    def _records_table(self, as_of: int, predicate: pc.Expression | None = None) -> pa.Table:
        """The commit records at ``as_of`` (consolidated; diff column dropped), optionally filtered."""
        snap = self.data_snapshot(self.commits_id, as_of)

        def read() -> list[pa.Table]:
            shard = self.data_writer(self.commits_id).shard
            tables = shard.read_plan(snap.plan())
            return [t.filter(predicate) if predicate is not None else t for t in tables]

        tables = replan(read)
        arrow = COMMITS_SCHEMA.arrow
        table = consolidate(pa.concat_tables(tables)) if tables else arrow.empty_table()
        return table.filter(pc.greater(table.column("diff"), 0)).select(["txn_id", "commit_ts", "wall_ms", "info"])

    def commit_record(self, txn_id: str) -> CommitRecord | None:
        """The commit record of transaction ``txn_id`` as of the current txns upper, or None."""
        if not isinstance(txn_id, str):
            raise InvalidUsage(f"a transaction id is a string, got {type(txn_id).__name__}")
        self.cache.sync()
        return self._lookup_record(txn_id, self.cache.frontier)

    def commit_records(self, as_of: int) -> pa.Table:
        """Every commit record at ``as_of``: an Arrow table (txn_id, commit_ts, wall_ms, info), ordered by commit_ts."""
        check_ts(as_of, "as_of")
        self.cache.update_gt(as_of)
        if not self.cache.registered_at(self.commits_id, as_of):
            names = ("txn_id", "commit_ts", "wall_ms", "info")
            return pa.table({n: pa.array([], COMMITS_SCHEMA.arrow.field(n).type) for n in names})
        return self._records_table(as_of).sort_by([("commit_ts", "ascending"), ("txn_id", "ascending")])

    def _last_append_was(self, token: str) -> bool:
        """Whether this handle's latest append to the txns shard (as last read) carried ``token``."""
        return self.writer.shard.state().last_token(self.writer.writer_id) == token

    def _append(
        self, updates: list[Any], upper: int, ts: int, token: str | None, ready: tuple[Callable[[], None], ...] = ()
    ) -> bool:
        """CaA ``updates`` at ``[upper, ts + 1)``; False (cache caught up) if the upper moved.

        ``ready``: prerequisites, called right before the conditional write.
        """

        def before_write() -> None:
            for fn in ready:
                fn()

        # (the cache's hold rides along: it moves with every commit, at no extra write)
        renewal = self.cache.hold_renewal()
        also = renewal[0] if renewal is not None else None
        try:
            self.writer.compare_and_append(updates, upper, ts + 1, token=token, before_write=before_write, also=also)
        except UpperMismatch as e:
            self.lost_races += 1
            self.cache.update_ge(e.current, wait_s=0)
            return False
        if self.writer.appended:
            if renewal is not None:
                self.cache.hold_renewed(renewal[1])
            self.cache.absorb_appended(updates, upper, ts + 1)
        else:
            self.cache.sync_cached()
        if self.maintain_on_commit:
            self.writer.maintain()
        return True

    def maintain(self) -> None:
        """The txns shard's maintenance: compaction and GC the policy asks for (once the shard holds
        ``TXNS_MAINTAIN_BATCHES`` batches, or garbage is due), then ``compact_to`` the upper.

        Best effort (failures are logged and left for later). Commits run it
        themselves unless ``maintain_on_commit`` is off. ``compact_to`` runs
        at most every ``COMPACT_TO_EVERY_S``: it is a conditional write on the
        txns shard, which every commit contends for, and a caller that
        maintains after every apply (the database's background worker, which
        applies several times a second while it applies for everyone) made
        it a large share of the writes there, each one a lost race for some
        commit.
        """
        _maintain_lazily(self.writer, TXNS_MAINTAIN_BATCHES)
        now = time.monotonic()
        if now - self._compacted_at >= COMPACT_TO_EVERY_S:
            self._compacted_at = now
            self._maybe_compact()

    def tidy_at(self, ts: int, tidy: Tidy) -> None:
        """Commit just the retractions of ``tidy`` at ``ts`` (also advancing every upper)."""
        txn = self.begin()
        txn.tidy(tidy)
        txn.commit_at(self, ts)

    # ---- apply -----------------------------------------------------------------------

    @_operation("apply")
    def apply_le(self, ts: int, only: set[str] | None = None) -> Tidy:
        """Apply every committed write at or before ``ts`` (or before the upper) to its data shard.

        Anyone may call it: a crashed committer never blocks readers.
        Returns the entries applied, to be tidied by a later commit.
        """
        check_ts(ts, "ts")
        if ts >= self.cache.frontier:
            self.cache.sync()
        tidy = Tidy()
        per_shard: dict[str, list[tuple[int, list[Entry]]]] = {}
        entries = self.cache.entries_le(min(ts, self.cache.frontier - 1))
        for (at, d), group in itertools.groupby(entries, key=lambda e: (e.ts, e.data_id)):
            if only is None or d in only:
                per_shard.setdefault(d, []).append((at, list(group)))

        def apply_shard(d: str) -> None:
            # one shard's commits in time order, a run of them per conditional write; shards are independent
            commits = per_shard[d]
            for i in range(0, len(commits), APPLY_RUN_MAX):
                self._apply_run(d, commits[i : i + APPLY_RUN_MAX])

        def maintain_shard(d: str) -> None:
            _maintain_lazily(self.data_writer(d), DATA_MAINTAIN_BATCHES)

        for d in per_shard:
            self.data_writer(d)  # open writers here, not racing in the pool
        # Every shard's apply first (in parallel): the commit is readable once they
        # have all landed. Then the maintenance (compaction) the applies asked for,
        # so that no shard's apply waits behind another shard's compaction.
        _each(apply_shard, sorted(per_shard))
        _each(maintain_shard, sorted(per_shard))
        for groups in per_shard.values():
            for _, applied in groups:
                tidy.entries.update(applied)
        return tidy

    def _apply_run(self, data_id: str, commits: list[tuple[int, list[Entry]]]) -> None:
        """Apply ``commits`` (time-ordered ``(ts, entries)`` of one data shard) in one compare-and-append.

        Appends the batches of every commit at or past the data upper over
        ``[upper, last ts + 1)``: each batch keeps its own time inside it. No
        other write to the shard lies in that range (every commit at or past
        the data upper is unapplied, so present in the cache, so in
        ``commits``): the upper passes each commit time by applying it. A
        lost race re-reads the upper and appends what is left (another
        applier may have applied a prefix of the run; an empty fill only
        moves the upper up to a commit, never past one).
        """
        w = self.data_writer(data_id)
        upper = w.upper
        while True:
            todo = [(at, group) for at, group in commits if at >= upper]
            if not todo:
                return
            batches = [e.decode_batch() for _, group in todo for e in group]
            try:
                w.compare_and_append_batch(batches, upper, todo[-1][0] + 1)
                return
            except UpperMismatch as e:
                upper = e.current  # applied (in part) by someone else, or an empty fill below a commit

    def _fill(self, data_id: str, as_of: int) -> None:
        """Advance the data shard's physical upper past ``as_of`` with an empty append."""
        w = self.data_writer(data_id)
        upper = w.upper
        while upper <= as_of:
            try:
                w.compare_and_append_batch([], upper, as_of + 1)
                return
            except UpperMismatch as e:
                upper = e.current

    # ---- compaction ------------------------------------------------------------------

    @_operation("compact_to")
    def compact_to(self, since: int) -> int:
        """Advance the txns shard's critical since toward ``since``; never past an unapplied write.

        Returns the since now held.
        """
        check_ts(since, "since")
        self.cache.sync()
        bound = min(since, max(0, self.cache.frontier - 1))
        for e in sorted(self.cache.entries):
            if e.ts >= bound:
                break
            if self.data_writer(e.data_id).upper <= e.ts:
                bound = e.ts
                break
        if self._since is None:
            self._since = self.client.open_critical_since(self.txns_id, CRITICAL_READER, 0)
        res = self._since.compare_and_downgrade_since(self._since.opaque, self._since.opaque, bound)
        if not res.ok:
            res = self._since.compare_and_downgrade_since(res.opaque, res.opaque, bound)
        # The shard's since is the minimum of every hold, this handle's cache's
        # leased reader included, and the cache moves that hold lazily (once
        # per reader_lease_s / 4). Move it now, or an explicit compact_to lets
        # nothing consolidate for minutes and the txns shard grows with
        # history meanwhile. Safe: the cache has read every time below its
        # frontier, so compaction up to frontier - 1 moves nothing it has not read.
        self.cache.advance_hold()
        return res.since

    def _maybe_compact(self) -> None:
        try:
            self.compact_to(self.cache.frontier - 1)
        except Exception as e:  # noqa: BLE001 - maintenance is best effort
            log.debug("compact_to deferred: %s", e)

    # ---- reads -----------------------------------------------------------------------

    def unblock_read(self, data_id: str, as_of: int) -> None:
        """Make ``data_id`` physically readable at ``as_of``: apply its latest write, fill empty time."""
        check_ts(as_of, "as_of")
        data_id = str(ShardId.parse(str(data_id)))
        self.cache.update_gt(as_of)
        if not self.cache.registered_at(data_id, as_of):
            raise NotRegistered(
                f"data shard {data_id} is not registered at {as_of} as far as the txns shard knows "
                f"(since {self.cache.since}); read it at a time it was registered"
            )
        latest = self.cache.latest_write_le(data_id, as_of) if as_of >= self.cache.since else None
        w = self.data_writer(data_id)
        if latest is not None and w.upper <= latest and w.fetch_recent_upper() <= latest:
            self.apply_le(latest)
        self._fill(data_id, as_of)

    def data_snapshot(self, data_id: str, as_of: int) -> DataSnapshot:
        """A readable snapshot of ``data_id`` at ``as_of`` (applying and filling as needed)."""
        self.unblock_read(data_id, as_of)
        return DataSnapshot(self, str(data_id), as_of)

    def snapshot(self, data_id: str | ShardId, as_of: int) -> list[Any]:
        """The contents of ``data_id`` at ``as_of``: consolidated ``((key, val), as_of, diff)``."""
        return self.data_snapshot(str(data_id), as_of).snapshot_and_fetch()


class DataSnapshot:
    """A data shard at ``as_of``, known readable. ``snapshot_and_fetch()`` reads it; ``plan()`` plans it."""

    def __init__(self, handle: TxnsHandle, data_id: str, as_of: int) -> None:
        self.handle, self.data_id, self.as_of = handle, data_id, as_of

    def plan(self) -> SnapshotPlan:
        w = self.handle.data_writer(self.data_id)
        return w.shard.plan(w.schema, self.as_of)

    def snapshot_and_fetch(self) -> list[Any]:
        """The snapshot, consolidated; planned again if compaction retires a part meanwhile."""
        shard = self.handle.data_writer(self.data_id).shard
        return replan(lambda: shard.fetch_plan(self.plan()))
