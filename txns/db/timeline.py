"""Time for one database object: the latest timestamp, and a user's ``as_of`` as a readable timestamp.

Invariants:

- The latest time is the txns upper minus one, read fresh: a latest read
  never waits for a commit.
- A read at a past wall-clock time beyond the upper first closes that time
  with an empty commit (so the answer can never change); a read at a
  future time waits up to ``read_wait_s`` for commits to reach it, then
  raises ``ReadTimeout``.
- The txns handle is used only under ``handle_lock``; the head read of
  :meth:`Timeline.latest` runs outside it, and :meth:`Timeline.cached_latest`
  reads only the cache's ``frontier_reached`` (which only ever rises).
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable

from persist import InvalidUsage, PersistClient, ReadTimeout
from txns.db import clock
from txns.db.skew import StorageClock
from txns.errors import TimestampUnavailable
from txns.handle import TxnsHandle

AsOf = int | dt.datetime | None


class Timeline:
    """The txns shard's upper as time: fresh (:meth:`latest`), as last seen, and the timestamp of an ``as_of``."""

    def __init__(
        self,
        client: PersistClient,
        handle: TxnsHandle,
        handle_lock: threading.RLock,
        storage_clock: StorageClock,
        check_open: Callable[[], None],
    ) -> None:
        self.client = client
        self.handle = handle
        self._lock = handle_lock
        self._storage_clock = storage_clock
        self._check_open = check_open

    def clock_ms(self) -> int:
        """This client's wall clock (milliseconds)."""
        return self.client.config.clock_ms()

    def now_ts(self) -> int:
        """This client's wall clock as a timestamp."""
        return clock.ts_of_ms(self.client.config.clock_ms())

    def cached_latest(self) -> int | None:
        """The latest timestamp as this process last saw it (no request); None before it saw any.

        Without the handle lock: a group commit's leader holds it through its
        conditional write, and every transaction begins here (at 64 threads in
        the S3 model, threads waited a quarter of their time on it, unable to
        queue for the next write). ``frontier_reached`` only ever rises, so a
        thread that saw a commit (its own) never reads a time before it.
        """
        reached = self.handle.cache.frontier_reached
        return reached - 1 if reached > 0 else None

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

    def timestamp(self, as_of: AsOf) -> int:
        """``as_of`` (None: latest; a timestamp; a datetime) as a timestamp readable now (see the module doc)."""
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
            if ts <= clock.ts_end_of_ms(self._storage_clock.closable_ms()):  # the past (or this millisecond)
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


__all__ = ["AsOf", "Timeline"]
