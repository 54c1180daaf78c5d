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
- ``close()`` runs what was submitted, then stops the thread. A worker that
  stays idle for ``IDLE_EXIT_S`` ends its thread too (the next submission
  starts another), so a database dropped without ``close()`` leaves no
  thread behind; at interpreter exit, open appliers are drained (bounded by
  ``EXIT_WAIT_S``).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

from persist import PersistClient
from txns.db.pool import in_pool, pool
from txns.handle import TxnsHandle
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
        #: applies run / failed (for tests and diagnostics)
        self.applies = 0
        self.failures = 0
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
        if handle is not None:
            handle.close()
        _open.discard(self)

    # ---- the worker -----------------------------------------------------------------------------

    def _run(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cv:
                if self._queued is None and not self._closed:
                    self._cv.wait_for(lambda: self._queued is not None or self._closed, IDLE_EXIT_S)
                if self._queued is None:  # closed, or idle for IDLE_EXIT_S: end this thread
                    if self._thread is me:
                        self._thread = None
                    return
                # Coalesce: let back-to-back commits land first (one apply then covers them all,
                # and they do not share the machine with it), unless someone waits for it.
                due = self._queued_since + APPLY_DELAY_S
                self._cv.wait_for(
                    lambda: self._closed or self._flush > 0 or self._queued_count >= APPLY_BATCH,
                    max(0.0, due - time.monotonic()),
                )
                ts, ids = self._queued, self._queued_ids
                self._queued, self._queued_ids = None, {}
            try:
                self._apply(ts, ids)
            finally:
                with self._cv:
                    self._done = max(self._done, ts)
                    self._cv.notify_all()

    def _apply(self, ts: int, ids: dict[str, Any]) -> None:
        try:
            if self._handle is None:
                self._handle = TxnsHandle.open(self._client, self._txns_id, hold=False)
            tidy = self._handle.apply_le(ts)
        except Exception as e:  # noqa: BLE001 - committed and durable: readers apply what they need
            self.failures += 1
            log.info("background apply up to %s failed (readers apply what they need): %s", ts, e)
            return
        self.applies += 1
        with self._cv:
            self._tidy.merge(tidy)
        # the txns shard's own compaction and GC, kept off the committing path (best effort)
        self._handle.maintain()
        if self._after_apply is not None:
            try:
                self._after_apply(self._handle, ts, ids)
            except Exception as e:  # noqa: BLE001 - maintenance is best effort
                log.info("maintenance after applying up to %s deferred: %s", ts, e)


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


__all__ = ["APPLY_BATCH", "APPLY_DELAY_S", "EXIT_WAIT_S", "IDLE_EXIT_S", "Applier"]
