"""Timestamp oracles: which timestamps a database's transactions read and write at.

Transaction management splits into *timestamp selection* and *atomic
durability*. The txns shard gives durability (one conditional write commits a
transaction at a timestamp); an oracle picks the timestamps, and the
isolation a transaction gets follows from them:

- ``read_ts()``: a time at which every read of the transaction happens. A
  read-then-write transaction then commits at a time with no commit between
  its reads and its writes (``Txn.commit_at(..., expect_upper=read_ts + 1)``),
  re-validating what it read when that time is taken.
- ``write_ts()``: a free-looking time for a commit: at least the txns upper
  last seen and the wall clock (hybrid timestamps, :mod:`txns.db.clock`), so
  a commit never waits for the clock and timestamps track real time.
- ``observe(ts)``: a commit (or a read) at ``ts`` happened; later timestamps
  from this oracle are past it.

Two oracles, one per isolation level:

- :class:`SharedOracle` (``strict_serializable``): ``read_ts`` reads the txns
  shard's upper from storage (one LIST + GET on S3: a linearizable read), so
  a transaction sees every transaction that completed before it started, in
  any process.
- :class:`LocalOracle` (``serializable``): ``read_ts`` is the upper this
  process last saw, with no request. Transactions stay serializable (the
  commit validates the reads against everything committed since), but a
  read may miss a commit another process completed a moment ago.

Invariants: ``read_ts()`` is below the txns upper as last seen (or read),
so a read at it never waits; ``write_ts()`` is at least that upper, so it
is past every ``read_ts()`` given before; neither ever goes back.
"""

from __future__ import annotations

import threading
from typing import Protocol

from txns.db import clock

ISOLATION_LEVELS = ("strict_serializable", "serializable")
"""The isolation levels a database offers (the first is the default)."""


class TimestampOracle(Protocol):
    """Picks read and write timestamps (see the module doc)."""

    def read_ts(self) -> int: ...

    def write_ts(self) -> int: ...

    def observe(self, ts: int) -> None: ...


class Timeline(Protocol):
    """What an oracle reads (:class:`txns.db.timeline.Timeline` has it): the txns upper, fresh or as last seen."""

    def latest(self) -> int: ...

    def cached_latest(self) -> int | None: ...

    def clock_ms(self) -> int: ...


class _Oracle:
    """What both oracles share: the highest upper seen, and write timestamps from it and the clock."""

    def __init__(self, db: Timeline) -> None:
        self._db = db
        self._lock = threading.Lock()
        self._upper = 0  # the highest txns upper seen through this oracle

    def observe(self, ts: int) -> None:
        with self._lock:
            self._upper = max(self._upper, ts + 1)

    def write_ts(self) -> int:
        with self._lock:
            upper = self._upper
        return max(upper, clock.ts_of_ms(self._db.clock_ms()))

    def _seen(self, upper: int) -> int:
        with self._lock:
            self._upper = max(self._upper, upper)
            return self._upper


class SharedOracle(_Oracle):
    """``strict_serializable``: read timestamps from the txns upper read from storage (linearizable).

    Concurrent callers in one process share head reads: a caller may use
    the result of any read of the upper that *started* after it called (that
    read sees every commit completed before the caller began), so it waits
    for the read in flight only if that one started later, else for the
    next one, which one of the waiters starts. At most one head read is in
    flight per database object.
    """

    def __init__(self, db: Timeline) -> None:
        super().__init__(db)
        self._cv = threading.Condition()
        self._started = 0  # head reads started (generations)
        self._completed = 0  # the newest generation whose result is in _latest
        self._inflight = False
        self._latest = -1
        self._error: BaseException | None = None
        #: head reads made, and read timestamps served (diagnostics)
        self.head_reads = 0
        self.served = 0

    def read_ts(self) -> int:
        with self._cv:
            need = self._started + 1  # a read that starts from now on
            while self._completed < need:
                if self._inflight:
                    self._cv.wait()
                    continue
                self._started += 1
                gen = self._started
                self._inflight = True
                self._cv.release()
                latest: int | None = None
                error: BaseException | None = None
                try:
                    latest = self._db.latest()
                except BaseException as e:  # noqa: BLE001 - handed to every waiter of this generation
                    error = e
                finally:
                    self._cv.acquire()
                    self._inflight = False
                    self.head_reads += 1
                    if error is None and latest is not None:
                        self._completed, self._latest = gen, max(self._latest, latest)
                    self._cv.notify_all()
                if error is not None:
                    raise error
            latest = self._latest
            self.served += 1
        return self._seen(latest + 1) - 1


class LocalOracle(_Oracle):
    """``serializable``: read timestamps from the upper this process last saw (no request)."""

    def read_ts(self) -> int:
        cached = self._db.cached_latest()
        if cached is None:  # nothing seen yet in this process: read it once
            return self._seen(self._db.latest() + 1) - 1
        return self._seen(cached + 1) - 1


class Oracles:
    """A database's oracles, one per isolation level, and its default level."""

    def __init__(self, timeline: Timeline, default: str = ISOLATION_LEVELS[0]) -> None:
        self.default = check_isolation(default)
        #: the oracle of each level
        self.by_level: dict[str, TimestampOracle] = {
            "strict_serializable": SharedOracle(timeline),
            "serializable": LocalOracle(timeline),
        }

    def oracle(self, isolation: str | None = None) -> TimestampOracle:
        """The timestamp oracle of ``isolation`` (default: the database's level)."""
        return self.by_level[check_isolation(isolation or self.default)]

    def observe(self, ts: int) -> None:
        """A commit (or read) at ``ts`` happened: every oracle's later timestamps are past it."""
        for o in self.by_level.values():
            o.observe(ts)


def check_isolation(level: object) -> str:
    """``level`` if it names an isolation level, else InvalidUsage listing them."""
    from persist import InvalidUsage

    if level not in ISOLATION_LEVELS:
        raise InvalidUsage(f"isolation must be one of {', '.join(map(repr, ISOLATION_LEVELS))}; got {level!r}")
    return str(level)


__all__ = [
    "ISOLATION_LEVELS",
    "LocalOracle",
    "Oracles",
    "SharedOracle",
    "Timeline",
    "TimestampOracle",
    "check_isolation",
]
