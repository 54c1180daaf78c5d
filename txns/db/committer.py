"""The committer: a transaction's one conditional write on the txns shard, grouped with others.

A transaction commits through :meth:`Committer.commit` with a
:class:`CommitRequest` (what it writes, what it read, its DDL check). A
transaction with DDL commits alone (:meth:`Committer._commit_ddl`); the
others go through an in-process **group commit**: each joins a queue, and
the next thread to lead (one at a time, under the handle lock) commits
every queued transaction that fits in one conditional write; a write-only
group that lost a race to another process goes through the cross-process
queue (:mod:`txns.group_commit`) for a while, and so do write-only groups while
other processes' transactions wait there (``txns.group_commit.QueueSwitch``). A
commit returns as soon as it is durable; applying it is the background
worker's (:mod:`txns.db.applier`).

Invariants:

- A commit that contains DDL validates it against the catalog just below
  the txns upper ``u`` it read, and commits (at ``max(u, now)``) only if
  the upper is still exactly ``u`` (``commit_at(expect_upper=u)``), so no
  concurrent DDL can slip in between the check and the write: at most one
  live table per name, ever. The catalog it validated, with its DDL
  replayed, is the catalog at its commit time: it is cached as such.
- A group never holds a member that read what an earlier member writes; a
  member that read is validated against every commit since its read time,
  and the group expects the upper it validated at, so the group order is a
  serial order at the one commit time.
- Every queued request gets exactly one outcome (a commit time or an
  error), set by the thread that committed its group.
- The txns handle is used only under ``handle_lock``; the queue only under
  the committer's own ``_queue_lock``. One thread at a time commits a group
  (``txns.group_commit.LeadTurn``); a member whose outcome is set returns
  without the handle lock.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, Protocol

from persist import Indeterminate, PersistClient, Schema, backoff
from txns.db import clock
from txns.db.catalog import TableEntry
from txns.db.errors import TransactionConflict
from txns.db.oracle import TimestampOracle
from txns.db.pool import each_or_raise, in_pool, pool
from txns.db.validation import ConflictReads, ReadSet, conflict
from txns.errors import TimestampUnavailable
from txns.group_commit import GroupCommitter, LeadTurn, QueueSwitch
from txns.handle import TxnsHandle
from txns.txn import Tidy, Txn

QUEUE_AFTER_LOST_S = 1.0
"""After a write-only group loses a race to another process, write-only groups queue for this long."""
QUEUE_PROBE_S = 0.5
"""A committer committing directly looks (one listing) whether others' transactions wait in the queue this often."""
QUEUED_SLOW_S = 0.25
"""A queued commit that waited longer than this, while other processes use the queue, keeps write-only groups
queued for ``QUEUE_AFTER_LOST_S`` more (contention goes on: no look at the queue before the next commit)."""
UNCERTAIN_RETRIES = 3
"""A data-only commit that failed Indeterminate is committed again (at most once in effect) this many times."""
SHARED_COMMITS_KEPT = 256
"""How many recent times at which a group of 2+ transactions committed the committer remembers."""


@dataclasses.dataclass(frozen=True)
class CommitRequest:
    """One transaction to commit: its core transaction and what the commit must check and report.

    ``validate``: for a transaction with DDL, checks the DDL against the
    catalog at a time and returns the tables after it (None: no DDL).
    ``written``: data shard -> its table's creation time (wall-clock ms), for
    the retention holds moved after the apply. ``reads``: what it read (data
    shard -> primary keys, or None for the whole table) at ``read_ts``, of
    the tables ``names`` (by the names it read them under). ``writes``: what
    it wrote, in the same form. ``isolation``: its level (None: the database's).
    """

    txn: Txn
    validate: Callable[[int], dict[str, TableEntry]] | None = None
    written: Mapping[str, int] = dataclasses.field(default_factory=dict)
    reads: ReadSet = dataclasses.field(default_factory=dict)
    names: Mapping[str, TableEntry] = dataclasses.field(default_factory=dict)
    read_ts: int | None = None
    isolation: str | None = None
    writes: ReadSet = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(eq=False)
class _Pending:
    """A request waiting in the group-commit queue, and its outcome once set."""

    req: CommitRequest
    read_ts: int | None
    done: bool = False
    result: tuple[int, int | None] | None = None
    error: BaseException | None = None

    @property
    def txn(self) -> Txn:
        return self.req.txn


class Apply(Protocol):
    """What the committer needs from the background worker (:class:`txns.db.applier.Applier`)."""

    def take_tidy(self) -> Tidy: ...

    def submit(self, ts: int, written: Mapping[str, Any] | None = None) -> bool: ...


class CatalogCache(Protocol):
    """Where a DDL commit leaves the catalog it validated (:class:`txns.db.catalog.Catalog`)."""

    def committed(self, ts: int, live: dict[str, TableEntry]) -> None: ...


class Oracles(Protocol):
    """The database's timestamp oracles (:class:`txns.db.oracle.Oracles`)."""

    def oracle(self, isolation: str | None = None) -> TimestampOracle: ...

    def observe(self, ts: int) -> None: ...


def _overlaps(reads: ReadSet, wrote: Mapping[str, set[tuple[Any, ...]] | None]) -> bool:
    """Whether anything read is among what was written (per data shard: a key in both, or a whole table)."""
    for d, keys in reads.items():
        if d not in wrote:
            continue
        w = wrote[d]
        if keys is None or w is None or not keys.isdisjoint(w):
            return True
    return False


class Committer:
    """Commits transactions for one database object: DDL alone, the rest in groups (see the module doc).

    Owns the group-commit queue (under ``_queue_lock``), the cross-process
    queue's committer (made on first need) and the diagnostics counters.
    """

    def __init__(
        self,
        client: PersistClient,
        handle: TxnsHandle,
        handle_lock: threading.RLock,
        oracles: Oracles,
        applier: Apply,
        reads: ConflictReads,
        catalog: CatalogCache,
    ) -> None:
        self.client = client
        self.handle = handle
        self._lock = handle_lock
        self._oracles = oracles
        self._applier = applier
        self._reads = reads
        self._catalog = catalog
        self._queue_lock = threading.Lock()
        self._queue: list[_Pending] = []  # requests waiting for a group (see commit)
        self._turn = LeadTurn(self._queue_lock)  # one thread at a time commits a group
        #: group commits made (each one conditional write) and transactions they carried (diagnostics)
        self.group_commits = 0
        self.grouped_transactions = 0
        self._shared: deque[int] = deque(maxlen=SHARED_COMMITS_KEPT)  # times at which a group of 2+ committed
        #: write-only groups that lost a race go through the cross-process queue (made on first need)
        self._queue_committer: GroupCommitter | None = None
        #: the txns handle the queue's sequencer maintains the txns shard with (its own: the sequencer
        #: thread uses the queue committer's)
        self._maintenance_handle: TxnsHandle | None = None
        #: whether write-only groups go straight to the queue (a lost race lately, or others waiting there)
        self._switch = QueueSwitch(client.blob, handle.txns_id, QUEUE_AFTER_LOST_S, QUEUE_PROBE_S, QUEUED_SLOW_S)

    def shared_commits(self) -> list[int]:
        """The recent times at which a group of two or more transactions committed (oldest first)."""
        with self._queue_lock:
            return list(self._shared)

    def close(self) -> None:
        """Stop the cross-process queue's committer, if one was made (under the handle lock)."""
        if self._queue_committer is not None:
            self._queue_committer.close()
            self._queue_committer.handle.close()
            self._queue_committer = None
        if self._maintenance_handle is not None:
            self._maintenance_handle.close()
            self._maintenance_handle = None

    def sequencer_maintains(self) -> bool:
        """Whether the cross-process queue has a sequencer, this process's or another's (as last read; no
        request): then it maintains the txns shard after its rounds, and this process's background worker
        leaves that alone."""
        qc = self._queue_committer
        return qc is not None and (qc.sequencing or qc.another_sequences())

    def begin(self, metadata: dict[str, Any]) -> Txn:
        """A core transaction whose commit record carries ``metadata`` (what history shows)."""
        return self.handle.begin(metadata=metadata)

    def record_schema_soon(self, data_id: str, schema: Schema) -> Future[None] | None:
        """Start recording a fresh data shard's schema on the pool (None: not started; see :meth:`record_schemas`)."""
        return None if in_pool() else pool().submit(self.client.register_schema, data_id, schema)

    def record_schemas(self, shards: Mapping[str, Schema], started: Mapping[str, Future[None]] | None = None) -> None:
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
        each_or_raise(lambda item: self.client.register_schema(*item), todo)

    def commit(self, req: CommitRequest) -> tuple[int, int | None]:
        """Commit ``req.txn`` once durable; return its commit time and the time its reads hold at.

        A transaction with DDL (``req.validate``) commits alone (:meth:`_commit_ddl`).
        The others go through a **group commit**: each joins a queue, and
        the next thread to lead (one at a time) takes the handle lock and
        commits every queued transaction that fits in one conditional write
        (:meth:`_commit_group`); a transaction another thread's group
        committed returns as soon as its outcome is set, without the lock.
        ``req.writes`` keeps a group from holding a transaction that read
        what an earlier member writes.
        """
        if req.validate is not None:
            return self._commit_ddl(req, req.validate)
        p = _Pending(req, req.read_ts)
        with self._queue_lock:
            self._queue.append(p)
        # One thread at a time leads a group (LeadTurn); a member its group committed returns at
        # once, not after the handle lock (held by the next group through its write, or its whole
        # wait in the cross-process queue).
        while self._turn.take(lambda: p.done):
            try:
                with self._lock:
                    with self._queue_lock:
                        members = [q for q in self._queue if not q.done]
                    self._commit_group(members)
            finally:
                self._turn.end(self._drop_done)
        if p.error is not None:
            raise p.error
        assert p.result is not None
        return p.result

    def _drop_done(self) -> None:
        """Drop the settled requests from the queue (under ``_queue_lock``)."""
        self._queue = [q for q in self._queue if not q.done]

    def _commit_group(self, members: list[_Pending]) -> None:
        """Commit as many of ``members`` (in order) as fit in one conditional write; set each one's outcome.

        Under the handle lock. A member joins the group unless it read
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
        if all(not q.req.reads for q in members if not q.done) and self._switch.contended(self._queued_ids):
            # Contended (a write-only group of this process lost a race lately, or other processes'
            # transactions wait in the queue): straight to the cross-process queue, where one
            # sequencer commits everyone's in order, instead of losing again, or of winning again
            # and again while the others' wait.
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
                expect = cache.frontier if any(q.req.reads for q in group) else None
            assert base is not None
            oracle = self._oracles.oracle(group[0].req.isolation)
            ts = max(cache.frontier if expect is None else expect, oracle.write_ts())
            lost = self.handle.lost_races
            try:
                applied = base.commit_at(self.handle, ts, expect_upper=expect)
                if expect is None and self.handle.lost_races > lost:
                    # It won only after losing to another commit (the cross-process queue's, say):
                    # the next write-only groups queue too, so that the queue is not starved by
                    # this process's direct writes landing first.
                    self._switch.lost()
            except TimestampUnavailable as e:
                self._oracles.observe(e.upper - 1)
                if expect is not None:
                    group = None  # re-validate, re-form
                    continue
                # A write-only group lost a race with another process: queue it
                # (txns.group_commit), so contending processes share writes; and the
                # next ones too, for QUEUE_AFTER_LOST_S.
                self._switch.lost()
                self._commit_queued(group)
                return
            except Indeterminate as e:
                uncertain_tries += 1
                if uncertain_tries > UNCERTAIN_RETRIES:
                    self._mark_failed(group, e)
                    return
                backoff(uncertain_tries)
                continue
            except BaseException as e:  # noqa: BLE001 - each member's outcome; raised in its thread
                if len(group) > 1 and base.failed_on_usage(e):
                    # (each member commits alone, so that only its own error reaches a caller)
                    base.join([])
                    base.drop_tidy()  # (later applies find those entries again)
                    for q in group:
                        self._commit_group([q])
                    return
                self._mark_failed(group, e)
                return
            break
        assert group is not None and base is not None
        self._mark_committed(group, [applied.commit_ts] * len(group))

    def _queued_ids(self) -> frozenset[str]:
        """This process's own transactions waiting in the cross-process queue (not others')."""
        qc = self._queue_committer
        return qc.waiting_ids() if qc is not None else frozenset()

    def _mark_committed(self, group: list[_Pending], commit_ts: list[int]) -> None:
        """Each member committed at its ``commit_ts``: set its outcome, tell the oracles, apply in the background."""
        self._oracles.observe(max(commit_ts))
        self.group_commits += 1
        self.grouped_transactions += len(group)
        if len(group) > 1:  # (recorded before any member returns: its caller may ask at once)
            with self._queue_lock:
                self._shared.extend(sorted(set(commit_ts)))
        written: dict[str, int] = {}
        for q, ts in zip(group, commit_ts, strict=True):
            written.update(q.req.written)
            q.result = (ts, q.read_ts)
            q.done = True
        self._applier.submit(max(commit_ts), written)

    def _commit_queued(self, group: list[_Pending]) -> None:
        """Commit a write-only group through the cross-process queue; set each member's outcome.

        Under the handle lock. The committer has a txns handle of its
        own: its background sequencer thread uses it while other threads use
        ``self.handle`` (a handle serves one thread at a time). Each member
        goes into the queue on its own (its tidy is dropped: later applies
        find those entries again), so members may commit at different times;
        each gets its own.
        """
        if self._queue_committer is None:
            oracle = self._oracles.oracle()
            handle = TxnsHandle.open(self.client, self.handle.txns_id, hold=False)
            handle.maintain_on_commit = False  # (maintained after rounds, below, or by the background worker)
            self._maintenance_handle = TxnsHandle.open(self.client, self.handle.txns_id, hold=False)
            self._queue_committer = GroupCommitter(
                handle,
                ts_fn=lambda upper: max(upper, oracle.write_ts()),
                lead_fn=lambda s: clock.ts_of_ms(int(s * 1000)) + 1,  # (hybrid timestamps: ms above a counter)
                direct=False,
                maintain=self._maintenance_handle.maintain,
            )
        if group[0].txn.uncertain:
            # SUBTLE: an earlier attempt of this group (all its members, joined)
            # may have landed: each member must be looked up, not just the base.
            for q in group:
                q.txn.uncertain = True
        started = time.monotonic()
        try:
            applied = self._queue_committer.commit_all([q.txn for q in group])
        except BaseException as e:  # noqa: BLE001 - each member's outcome; raised in its thread
            self._mark_failed(group, e)
            return
        # (still contended: the next write-only groups queue without a look at the queue first)
        self._switch.queued(time.monotonic() - started, self._queue_committer.others_queued)
        self._mark_committed(group, [a.commit_ts for a in applied])

    def _form_group(self, members: list[_Pending], upper: int) -> list[_Pending]:
        """The members that commit together at ``upper``: validated, and none reading what an earlier one writes."""
        group: list[_Pending] = []
        wrote: dict[str, set[tuple[Any, ...]] | None] = {}
        for q in members:
            if q.done:
                continue
            if q.req.reads:
                assert q.read_ts is not None
                why = conflict(self._reads, q.req.reads, q.req.names, q.read_ts + 1, upper - 1)
                if why is not None:
                    q.error = TransactionConflict(f"{why}; nothing was committed")
                    q.done = True
                    continue
                if group and _overlaps(q.req.reads, wrote):
                    continue  # it reads what an earlier member writes: the next group
                q.read_ts = upper - 1  # what it read holds up to the upper
            group.append(q)
            for d, keys in q.req.writes.items():
                if d in wrote and wrote[d] is None:
                    continue
                wrote[d] = None if keys is None else (wrote.get(d) or set()) | keys
        return group

    def _mark_failed(self, group: list[_Pending], e: BaseException) -> None:
        for q in group:
            q.error = e
            q.done = True

    def _commit_ddl(
        self, req: CommitRequest, validate: Callable[[int], dict[str, TableEntry]]
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
        retention holds of ``req.written``: the data shards written, with their
        tables' creation times); its applied entries are tidied by this
        committer's next commit.
        """
        txn, reads, read_ts = req.txn, req.reads, req.read_ts
        with self._lock:
            txn.tidy(self._applier.take_tidy())
            oracle = self._oracles.oracle(req.isolation)
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
                        why = conflict(self._reads, reads, req.names, at + 1, e.upper - 1)
                        if why is not None:
                            raise TransactionConflict(f"{why}; nothing was committed") from None
                    at = e.upper - 1  # what it read (if anything) holds there too
                    oracle.observe(at)
            oracle.observe(applied.commit_ts)
            if applied.commit_ts == ts:
                self._catalog.committed(ts, live)
            self._applier.submit(applied.commit_ts, req.written)
            return applied.commit_ts, (at if reads else read_ts)


__all__ = [
    "Apply",
    "CatalogCache",
    "CommitRequest",
    "Committer",
    "Oracles",
    "QUEUE_AFTER_LOST_S",
    "QUEUE_PROBE_S",
    "UNCERTAIN_RETRIES",
]
