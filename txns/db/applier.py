"""Applying commits off the committing thread: one background worker per database.

A database commit is durable, and acknowledged, at its one conditional write
on the txns shard. Applying it (one conditional write per touched data shard,
plus the maintenance those writes ask for, plus the txns shard's own
compaction and GC, plus moving retention holds) is left to an
:class:`Applier`: the committing call only hands it the commit time and
returns.

Invariants:

- The txns shard's maintenance runs after each apply, without any lock:
  a commit that races it loses its compare-and-append at worst and retries
  (holding the database's lock for it instead made every commit wait for
  whole compactions: +55 ms per read-then-write at 20 ms per request).
- The worker uses its **own** ``TxnsHandle`` (opened on first use, holding
  nothing on the txns shard: ``hold=False``); a handle serves one thread at
  a time, so it never touches the database's handle, and it never takes
  the database's lock (so nothing that waits for it under that lock can
  deadlock).
- At most one apply runs and at most one is queued: submissions coalesce
  into the latest commit time, and ``apply_le(latest)`` applies every commit
  at or before it. Memory and threads are bounded whatever the commit rate.
  A queued apply starts ``APPLY_DELAY_S`` after it was first asked for (or
  once ``APPLY_BATCH`` commits are queued, or at once when someone waits for
  it), so a burst of commits costs one apply, which never competes with them.
- The entries an apply returns are tidied by the database's next commit
  (``take_tidy``; ``Entry`` values are valid on any handle, and the core
  retracts only entries still present, so entries tidied meanwhile by
  someone else are skipped).
- A failed apply is only logged: the commit is durable, and readers do not
  need it (they read unapplied batches from the txns shard's log, or apply
  what they need themselves), so nothing waits on the worker for
  correctness; the next apply covers what this one missed.
- The committing call never waits for the worker thread to start: a new
  thread is started on the shared pool (:mod:`txns.db.pool`; ``Thread.start``
  waits until the thread runs), and ``close()`` waits for that start first.
- **Applied once across processes.** Alone (no other process's commit
  seen in an apply for ``CONTENDED_S``: the txns cache's write times of the
  commit records' shard, which every commit writes, and the entries applied), a worker applies its own commits,
  as above, and takes no lease. Once contended, applying is done by one
  process per txns shard: the holder of the **applier lease**, the consensus
  key ``{txns_id}-applier`` (a :class:`txns.group_commit.SequencerLease`
  whose versions also carry ``applied``: the time the holder has applied
  through). A contended worker with an apply queued takes the lease when it
  is free or lapsed; the holder then applies everything below the txns
  upper (the others' commits too) every ``DUTY_POLL_S`` while its own
  process committed within ``ON_DUTY_S``, publishing ``applied`` with each
  renewal, then releases it. A contended worker that finds another holder
  drops its queued apply once that holder's ``applied`` covers it, and
  otherwise looks again every half lease; so a holder that dies (SIGKILL)
  is replaced within one lease by any process with an apply outstanding.
  The lease is only for liveness and cost: applying is idempotent (each
  data shard's apply is a compare-and-append at the commit time, which a
  second applier loses), so two workers that both believe they hold it,
  or a worker applying without it, are safe. The txns shard's maintenance
  runs after applies, so only applying workers (the holder, when contended)
  run it; the holder also moves the retention holds of every data shard
  it applied.
- Waiting for the applies (``wait``, ``close``) never depends on another
  process: a waited-for (or closing) worker applies its queued commits
  itself, lease or not.
- ``close()`` runs what was submitted, then stops the thread. A worker that
  stays idle for ``IDLE_EXIT_S`` ends its thread too (the next submission
  starts another), so a database dropped without ``close()`` leaves no
  thread behind; at interpreter exit, open appliers are drained (bounded by
  ``EXIT_WAIT_S``).
"""

from __future__ import annotations

import atexit
import bisect
import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

from persist import PersistClient
from txns.db.pool import in_pool, pool
from txns.group_commit import SequencerLease
from txns.handle import TXNS_MAINTAIN_BATCHES, TxnsHandle
from txns.txn import Tidy

log = logging.getLogger(__name__)

APPLY_DELAY_S = 0.1
"""A commit's apply waits up to this long for more commits to coalesce with (none waits on it: reads use the log)."""
APPLY_BATCH = 32
"""... or until this many commits are queued."""
IDLE_EXIT_S = 2.0
"""An idle worker thread ends after this long (the next submission starts a new one)."""
EXIT_WAIT_S = 10.0
"""At interpreter exit, how long to wait for each open applier's submitted work."""

APPLIER_LEASE_MS = 4000
"""The applier lease lapses this long after its holder's last renewal (renewed every half lease, before and
after each apply, so a slow apply on a busy machine does not hand it over mid-way)."""
CONTENDED_S = 10.0
"""After an apply met another process's commit (or the lease held by another), the worker uses the lease this long."""
DUTY_POLL_S = 0.25
"""The lease holder looks for new commits (one read of the txns shard's head) this often (each apply, and its
maintenance, is some requests and a conditional write or two on the txns shard; readers never wait for it)."""
ON_DUTY_S = 5.0
"""The lease holder keeps applying everyone's commits while its own process committed within this long."""
TXNS_OVERGROWN_BATCHES = 8 * TXNS_MAINTAIN_BATCHES
"""A worker maintains the txns shard after its applies even while another process does (the sequencer:
``Applier.sequencer_maintains``) once the shard holds this many batches: that process may not (an older
version, or one that stopped sequencing without this one reading the lease since). Not lower: on
``file://`` a sequencer's rounds add 40 or more batches between its maintenance runs (at most every
``SEQUENCER_MAINTAIN_EVERY_S``), and at 32 the other process maintained too, losing races to the rounds."""

AfterApply = Callable[[TxnsHandle, int, dict[str, Any]], None]

_open: weakref.WeakSet[Applier] = weakref.WeakSet()


class Applier:
    """Applies a database's commits in the background (see the module doc)."""

    def __init__(
        self,
        client: PersistClient,
        txns_id: str,
        after_apply: AfterApply | None = None,
    ) -> None:
        self._client = client
        self._txns_id = txns_id
        self._after_apply = after_apply
        self._cv = threading.Condition()
        self._queued: int | None = None  # apply up to this commit time next (submissions coalesce)
        self._queued_ids: dict[str, Any] = {}
        self._queued_since = 0.0  # (monotonic) when the queued apply was first asked for
        self._queued_count = 0  # commits coalesced into it
        self._flush = 0  # callers waiting for the applies: run the queued one without delay
        self._submitted = -1  # the latest commit time submitted
        self._done = -1  # every commit time submitted up to this one has had its apply run
        self._tidy = Tidy()
        self._thread: threading.Thread | None = None
        self._starting: Future[None] | None = None  # the worker thread's start, under way on the pool
        self._handle: TxnsHandle | None = None  # the worker's own; only its thread uses it
        self._closed = False
        # ---- applying once across processes (see the module doc); the worker's, but for _mine
        self._lease: SequencerLease | None = None  # made on first contention (needs the worker's handle)
        self._contended_until = 0.0  # (monotonic) use the lease until then
        self._retry_at = 0.0  # (monotonic) a queued apply left to another holder is looked at again then
        self._applied = -1  # this worker has applied every commit up to this time
        self._mine: set[int] = set()  # this database's commit times above _applied (under _cv)
        self._first_mine: int | None = None  # its first one: earlier commits are nobody's contention
        self._last_submit = 0.0  # (monotonic)
        #: applies run / failed; queued applies another holder covered (for tests and diagnostics)
        self.applies = 0
        self.failures = 0
        self.covered = 0
        #: whether a sequencer of the queue (this process's or another's) maintains the txns shard now
        #: (the database's); then this worker's applies leave the shard's maintenance to it
        self.sequencer_maintains: Callable[[], bool] | None = None
        _open.add(self)

    # ---- the committing side ------------------------------------------------------------------

    def submit(self, ts: int, written: Mapping[str, Any] | None = None) -> bool:
        """Apply every commit up to ``ts`` soon. False once closed.

        ``written``: what the commit wrote, by data shard (merged over
        coalesced submissions and handed to ``after_apply``).
        """
        with self._cv:
            if self._closed:
                return False
            if self._queued is None:
                self._queued_since = time.monotonic()
                self._queued_count = 0
            self._queued = ts if self._queued is None else max(self._queued, ts)
            self._queued_count += 1
            self._queued_ids.update(written or {})
            self._submitted = max(self._submitted, ts)
            self._mine.add(ts)
            if self._first_mine is None:
                self._first_mine = ts
            self._last_submit = time.monotonic()
            if self._thread is None or self._start_failed():
                self._thread = threading.Thread(target=self._run, name="txns-db-apply", daemon=True)
                self._starting = _start_soon(self._thread)
            self._cv.notify_all()
            return True

    def _start_failed(self) -> bool:
        """Whether the worker thread's start failed (a new one is started then)."""
        f = self._starting
        return f is not None and f.done() and f.exception() is not None

    def take_tidy(self) -> Tidy:
        """The entries applied so far, to retract with the next commit (handed over once)."""
        with self._cv:
            tidy, self._tidy = self._tidy, Tidy()
            return tidy

    def pending(self, ts: int | None = None) -> bool:
        """Whether an apply submitted at or below ``ts`` (None: any) has not run yet."""
        with self._cv:
            return self._done < self._target(ts)

    def wait(self, ts: int | None = None, timeout: float | None = None) -> bool:
        """Wait until the applies submitted at or below ``ts`` (None: all) have run; whether they have."""
        with self._cv:
            self._flush += 1
            self._cv.notify_all()
            try:
                return self._cv.wait_for(lambda: self._done >= self._target(ts), timeout)
            finally:
                self._flush -= 1

    def _target(self, ts: int | None) -> int:
        return self._submitted if ts is None else min(ts, self._submitted)

    @property
    def running(self) -> bool:
        """Whether the worker thread is alive."""
        t = self._thread
        return t is not None and t.is_alive()

    def close(self, timeout: float | None = None) -> None:
        """Run what was submitted, then stop the worker thread and close its handle. Idempotent."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
            t, starting = self._thread, self._starting
        if starting is not None:
            starting.exception()  # (waited for: a thread is joined once started)
        if t is not None and t is not threading.current_thread() and t.ident is not None:
            t.join(timeout)
        with self._cv:
            if self._thread is not None and self._thread.is_alive():
                return  # (timed out: the daemon thread finishes on its own)
            handle, self._handle = self._handle, None
            lease, self._lease = self._lease, None
        if lease is not None:
            lease.release()
        if handle is not None:
            handle.close()
        _open.discard(self)

    # ---- the worker -----------------------------------------------------------------------------

    def _run(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cv:
                duty = self._on_duty()
                if self._queued is None and not self._closed:
                    self._cv.wait_for(
                        lambda: self._queued is not None or self._closed, DUTY_POLL_S if duty else IDLE_EXIT_S
                    )
                if self._queued is None and (self._closed or not self._on_duty()):
                    # closed, or idle for IDLE_EXIT_S (and off duty): end this thread
                    if self._thread is me:
                        self._thread = None
                    lease = self._lease
                    break
                if self._queued is not None:
                    # Coalesce: let back-to-back commits land first (one apply then covers them all,
                    # and they do not share the machine with it), unless someone waits for it.
                    due = max(self._queued_since + APPLY_DELAY_S, self._retry_at)
                    self._cv.wait_for(
                        lambda: (
                            self._closed
                            or self._flush > 0
                            or (self._queued_count >= APPLY_BATCH and time.monotonic() >= self._retry_at)
                        ),
                        max(0.0, due - time.monotonic()),
                    )
                ts, ids = self._queued, self._queued_ids
                self._queued, self._queued_ids = None, {}
                force = self._closed or self._flush > 0
            through = ts
            try:
                through = self._step(ts, ids, force)
            finally:
                with self._cv:
                    if ts is not None and through is not None:
                        self._done = max(self._done, min(ts, through))
                    if ts is not None and through is not None and through < ts:
                        # left to another holder that has not applied all of it yet: look again later
                        if self._queued is None:
                            self._queued_since, self._queued_count = time.monotonic(), 0
                        self._queued = ts if self._queued is None else max(self._queued, ts)
                        self._queued_ids = {**ids, **self._queued_ids}
                    self._cv.notify_all()
        if lease is not None and lease.held:
            lease.release()  # (best effort: others take over once it lapses anyway)

    def _on_duty(self) -> bool:
        """Whether this worker holds the applier lease and applies everyone's commits (under ``_cv``)."""
        lease = self._lease
        return lease is not None and lease.held and time.monotonic() - self._last_submit < ON_DUTY_S

    def _step(self, ts: int | None, ids: dict[str, Any], force: bool) -> int | None:
        """Apply up to ``ts`` (None: the lease holder's poll), or leave it to the holder.

        Returns the time up to which the queued apply is done (``ts``: all of it).
        """
        if self._handle is None:
            try:
                self._handle = TxnsHandle.open(self._client, self._txns_id, hold=False)
            except Exception as e:  # noqa: BLE001 - committed and durable: readers apply what they need
                self.failures += 1
                log.info("opening the background apply's handle failed (readers apply what they need): %s", e)
                return ts
        lease = self._lease
        if ts is None or force or (lease is not None and lease.held):
            log.debug("apply %s (force %s, holding %s)", ts, force, lease is not None and lease.held)
            self._apply(ts, ids)
            return ts
        now = time.monotonic()
        if now >= self._contended_until:
            self._apply(ts, ids)  # alone: our own commits, no lease
            return ts
        if lease is None:
            lease = self._lease = SequencerLease(self._handle, APPLIER_LEASE_MS, key=applier_key(self._txns_id))
        lease.extra["applied"] = self._applied
        if lease.hold(fresh=True):
            log.debug("took the applier lease at %s", ts)
            self._apply(ts, ids)
            return ts
        other = lease.other
        if other is None:  # (the lease could not be read, or another took it just now: apply, safely)
            self._apply(ts, ids)
            return ts
        self._contended_until = now + CONTENDED_S
        through = int(other.get("applied", -1))
        log.debug("left %s to the holder (applied %s)", ts, through)
        if through > self._done:
            self.covered += 1  # the holder applied (some of) ours
        wait_s = min(APPLIER_LEASE_MS / 2000, max(0.0, other["expires_ms"] / 1000 - time.time()) + 0.01)
        self._retry_at = now + wait_s
        return through

    def _maintained_elsewhere(self, handle: TxnsHandle) -> bool:
        """Whether a sequencer maintains the txns shard now (``sequencer_maintains``), and the shard has
        not grown to ``TXNS_OVERGROWN_BATCHES`` batches (then this worker maintains it anyway: the
        sequencer may not). (In the sequencing process too: its worker and its sequencer both
        maintaining planned the same compactions twice, one of them thrown away.)"""
        elsewhere = self.sequencer_maintains
        if elsewhere is None or not elsewhere():
            return False
        return len(handle.writer.shard.state().batches) < TXNS_OVERGROWN_BATCHES

    def _apply(self, ts: int | None, ids: dict[str, Any]) -> None:
        """Apply up to ``ts``, or (``None``, or holding the lease) up to the txns upper; then the maintenance."""
        handle = self._handle
        assert handle is not None
        lease = self._lease
        holding = lease is not None and lease.held
        if holding:
            assert lease is not None
            lease.extra["applied"] = self._applied
            holding = lease.hold()  # (renewed before the apply too)
        try:
            target = ts if ts is not None else -1
            if ts is None or holding:
                handle.cache.sync()
                target = max(target, handle.cache.frontier - 1)
            if target <= self._applied and ts is None:
                tidy = None  # (the holder's poll: nothing new)
            else:
                tidy = handle.apply_le(target)
        except Exception as e:  # noqa: BLE001 - committed and durable: readers apply what they need
            self.failures += 1
            log.info("background apply up to %s failed (readers apply what they need): %s", ts, e)
            return
        if tidy is not None:
            self.applies += 1
            # every commit writes the commit records' shard: its write times in the txns cache are
            # every commit's (entries may be gone already: applied and tidied by their committers)
            times = handle.cache.writes.get(handle.commits_id, [])
            recent = times[bisect.bisect_right(times, self._applied) : bisect.bisect_right(times, target)]
            with self._cv:
                self._tidy.merge(tidy)
                first = self._first_mine
                foreign = first is not None and any(
                    t >= first and t not in self._mine
                    for t in [*recent, *(e.ts for e in tidy.entries)]
                    if t > self._applied
                )
                self._applied = max(self._applied, target)
                self._mine = {t for t in self._mine if t > self._applied}
            if foreign:  # another process commits: apply once, through the lease
                self._contended_until = time.monotonic() + CONTENDED_S
            # the txns shard's own compaction and GC, kept off the committing path (best effort); left
            # to the queue's sequencer while there is one (see sequencer_maintains)
            if not self._maintained_elsewhere(handle):
                handle.maintain()
            if self._after_apply is not None:
                # (the holder also moves the holds of the shards it applied for other processes)
                written = {**{e.data_id: None for e in tidy.entries}, **ids}
                try:
                    self._after_apply(handle, target, written)
                except Exception as e:  # noqa: BLE001 - maintenance is best effort
                    log.info("maintenance after applying up to %s deferred: %s", target, e)
        if lease is not None and lease.held:
            lease.extra["applied"] = self._applied
            if not lease.hold():  # (renewed every half lease, publishing what it applied)
                log.debug("the applier lease lapsed; another process applies")


def applier_key(txns_id: str) -> str:
    """The consensus key of the applier lease of the txns shard ``txns_id``."""
    return f"{txns_id}-applier"


def _start_soon(thread: threading.Thread) -> Future[None]:
    """Start ``thread`` on the shared pool: ``Thread.start`` waits until the new thread runs, which the
    committing call need not (its commit is durable already). Inline from a pool thread or once the pool
    is shut down."""
    if not in_pool():
        try:
            return pool().submit(thread.start)
        except RuntimeError:  # (the interpreter is exiting: no new pool tasks)
            pass
    done: Future[None] = Future()
    thread.start()
    done.set_result(None)
    return done


@atexit.register
def _drain_at_exit() -> None:
    for a in list(_open):
        try:
            a.close(timeout=EXIT_WAIT_S)
        except Exception as e:  # noqa: BLE001 - exiting anyway
            log.debug("draining the background apply at exit: %s", e)


__all__ = [
    "APPLIER_LEASE_MS",
    "APPLY_BATCH",
    "APPLY_DELAY_S",
    "CONTENDED_S",
    "DUTY_POLL_S",
    "EXIT_WAIT_S",
    "IDLE_EXIT_S",
    "ON_DUTY_S",
    "Applier",
    "applier_key",
]
