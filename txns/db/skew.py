"""Clock skew: a client whose clock is far from the storage's own clock must not commit, compact or set a since.

Commit timestamps are hybrid wall-clock times (:mod:`txns.db.clock`), taken
from each client's clock: a client whose clock runs 30 days fast would stamp
its commit 30 days ahead, every later commit (``max(upper, now)``) would
follow it there, and its ``compact()`` would move the retention since to
23 days in the future, locking every reader out of the history up to now.
The one clock all clients share is the storage's (S3's ``Date`` header, the
file system's modification times: ``Blob.storage_now_ms``), so each client
measures its skew against it:

- ``skew = client clock - storage clock``, measured once per database object
  (at its first commit, compaction or hold) and again every
  ``REMEASURE_S``; in between, the storage's time is the measured one
  advanced by this process's monotonic clock, so a client clock that jumps
  is caught at once, without a request. The cost: one probe per
  ``REMEASURE_S`` (a file created and deleted; on S3 none while requests
  flow, as their ``Date`` headers are read, else one ``HeadBucket``).
- A commit, a compaction and a retention hold from a client whose
  ``|skew|`` exceeds ``max_clock_skew`` (``txns.connect``'s argument, 5
  minutes by default) raise :class:`ClockSkewError` (nothing was committed
  or changed) saying by how much and what to do.
- A retention hold never passes ``storage now - retention``: holds are
  computed from ``min(client now, storage now)`` (:meth:`StorageClock.now_ms`).
- Reads are not refused (they change nothing), and a read ``as_of`` a
  wall-clock time closes that time with an empty commit only when the time
  is not past the storage's now plus the bound.

``max_clock_skew=None`` trusts the client's clock entirely (no measurement):
for tests that move a fake clock standing for every client's and the
storage's time at once. A store without a clock of its own (``mem://``, in
one process) is never skewed.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable

from persist import InvalidUsage
from persist.location import Blob

DEFAULT_MAX_CLOCK_SKEW = dt.timedelta(minutes=5)
"""How far a client's clock may be from the storage's before it is refused (``txns.connect(max_clock_skew=...)``)."""
REMEASURE_S = 600.0
"""How often (at most) a database object measures the storage's clock again."""


class ClockSkewError(InvalidUsage):
    """This client's clock is too far from the storage's: fix the clock (NTP); nothing was committed or changed."""


def check_max_skew(bound: object) -> int | None:
    """``max_clock_skew`` (a positive ``timedelta``, or None) as milliseconds, or InvalidUsage."""
    if bound is None:
        return None
    if not isinstance(bound, dt.timedelta) or bound <= dt.timedelta(0):
        raise InvalidUsage(
            f"max_clock_skew must be a positive datetime.timedelta (e.g. timedelta(minutes=5)) or None, got {bound!r}"
        )
    return bound // dt.timedelta(milliseconds=1)


class StorageClock:
    """A client's view of the storage's clock and of its own skew against it (see the module doc).

    Invariant: ``_measured`` is the storage's time at the monotonic time
    recorded with it; it is replaced, never adjusted, by a new measurement.
    """

    def __init__(self, blob: Blob, local_ms: Callable[[], int], max_skew_ms: int | None, where: str) -> None:
        self._blob = blob
        self._local_ms = local_ms
        self.max_skew_ms = max_skew_ms
        self._where = where
        self._lock = threading.Lock()
        self._measured: tuple[int, float] | None = None  # (storage ms, time.monotonic() then)
        self._clockless = False  # the store has no clock of its own
        #: how many times the storage's clock was measured (diagnostics)
        self.measurements = 0

    def storage_ms(self) -> int | None:
        """The storage's time now (measured at most every ``REMEASURE_S``), or None if unchecked."""
        if self.max_skew_ms is None or self._clockless:
            return None
        with self._lock:
            m = self._measured
            if m is None or time.monotonic() - m[1] > REMEASURE_S:
                now = self._blob.storage_now_ms()
                self.measurements += 1
                if now is None:
                    self._clockless = True
                    return None
                m = self._measured = (now, time.monotonic())
        return m[0] + int((time.monotonic() - m[1]) * 1000)

    def skew_ms(self) -> int | None:
        """This client's clock minus the storage's (positive: fast), or None if unchecked."""
        storage = self.storage_ms()
        return None if storage is None else self._local_ms() - storage

    def check(self, what: str) -> None:
        """ClockSkewError if this client's clock is off by more than the bound; ``what``: the refused operation."""
        skew = self.skew_ms()
        if skew is None or self.max_skew_ms is None or abs(skew) <= self.max_skew_ms:
            return
        way = "ahead of" if skew > 0 else "behind"
        raise ClockSkewError(
            f"cannot {what}: this client's clock is {dt.timedelta(milliseconds=abs(skew))} {way} the storage's "
            f"clock at {self._where!r} (more than max_clock_skew={dt.timedelta(milliseconds=self.max_skew_ms)}); "
            f"its commit times and retention would be wrong for every client. Fix this machine's clock (NTP), "
            f"then try again; nothing was committed or changed"
        )

    def closable_ms(self) -> int:
        """The latest wall-clock time a read may close with an empty commit: now, but not past the storage's
        now plus the bound (measurements are coarse: a few milliseconds)."""
        local = self._local_ms()
        storage = self.storage_ms()
        if storage is None or self.max_skew_ms is None:
            return local
        return min(local, storage + self.max_skew_ms)

    def now_ms(self) -> int:
        """The wall-clock time for retention: the client's, but never past the storage's."""
        local = self._local_ms()
        storage = self.storage_ms()
        return local if storage is None else min(local, storage)


__all__ = ["DEFAULT_MAX_CLOCK_SKEW", "REMEASURE_S", "ClockSkewError", "StorageClock", "check_max_skew"]
