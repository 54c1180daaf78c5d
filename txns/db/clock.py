"""Hybrid wall-clock timestamps: milliseconds since the epoch above, a counter below.

A database timestamp is a txns timestamp (a u64) laid out as::

    ts = (wall_ms << COUNTER_BITS) | counter

so every commit has a wall-clock time (``wall_ms(ts)``) and a datetime maps to
a timestamp (``ts_of_datetime``). The database commits at
``max(txns upper, now_ts())``: commits never wait for the clock, and when
several land in one millisecond (or a process's clock lags the txns upper)
the counter absorbs them. If a counter ever overflowed it would carry into the
milliseconds: timestamps stay strictly increasing, the wall time runs slightly
ahead for a moment.

Invariants:

- ``ts_of_ms(ms) <= ts <= ts_end_of_ms(ms)`` for every ``ts`` with
  ``wall_ms(ts) == ms``; a read ``as_of`` a datetime reads at the end of its
  millisecond, so it includes every commit stamped within it.
- The values fit a signed 64-bit int for the next 69 years (``2**43`` ms since
  the epoch is the year 2248), so they travel as ``int64`` in Arrow.
"""

from __future__ import annotations

import datetime as dt
import time

COUNTER_BITS = 20
"""Commits per millisecond before the counter carries into the milliseconds: 1,048,576."""
COUNTER_MASK = (1 << COUNTER_BITS) - 1


def system_ms() -> int:
    """Milliseconds since the epoch, from the system clock."""
    return time.time_ns() // 1_000_000


def ts_of_ms(ms: int) -> int:
    """The first timestamp of the millisecond ``ms``."""
    return ms << COUNTER_BITS


def ts_end_of_ms(ms: int) -> int:
    """The last timestamp of the millisecond ``ms``."""
    return (ms << COUNTER_BITS) | COUNTER_MASK


def wall_ms(ts: int) -> int:
    """The wall-clock milliseconds of timestamp ``ts``."""
    return ts >> COUNTER_BITS


def to_datetime(ts: int) -> dt.datetime:
    """The wall-clock time (UTC, millisecond precision) of timestamp ``ts``."""
    return dt.datetime.fromtimestamp(wall_ms(ts) / 1000, tz=dt.UTC)


def ms_of_datetime(when: dt.datetime) -> int:
    """Milliseconds since the epoch of ``when``; a naive datetime is taken as UTC.

    UTC, as everywhere a naive time meets the database: a naive value
    inserted into a timestamp column with a time zone, Spark's ``asOf``
    option, the CLI's ``--as-of``. (``datetime.now()`` is local time: pass
    ``datetime.now(timezone.utc)``, or any aware datetime.)
    """
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    delta = when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (delta.days * 86_400_000) + (delta.seconds * 1000) + (delta.microseconds // 1000)


def ts_of_datetime(when: dt.datetime) -> int:
    """The last timestamp at or before ``when`` (the end of its millisecond)."""
    return ts_end_of_ms(ms_of_datetime(when))


def describe(ts: int) -> str:
    """``ts`` for messages: the number and its wall-clock time."""
    return f"{ts} ({to_datetime(ts).isoformat(timespec='milliseconds')})"


__all__ = [
    "COUNTER_BITS",
    "describe",
    "ms_of_datetime",
    "system_ms",
    "to_datetime",
    "ts_end_of_ms",
    "ts_of_datetime",
    "ts_of_ms",
    "wall_ms",
]
