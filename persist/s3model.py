"""A model of S3 over the file backend that costs no CPU: latency by sleeping, and a cap on conditional writes.

For benchmarks on a small machine: moto and the fault proxy spend
milliseconds of CPU per request, so they measure the machine, not the
protocol. This wrapper keeps the two properties of S3 that shape the
protocol's throughput and latency, and nothing else:

- **Latency.** Every request sleeps ``latency_s`` before it runs (S3's
  first-byte latency, 60 ms by default). Operations that are two requests
  on the S3 backend (a consensus ``head`` or ``scan``: a LIST, then GETs;
  a ``truncate``: a LIST, then DELETEs) sleep twice.
- **A cap on conditional writes per key.** At most ``cas_per_key_s``
  compare-and-sets per consensus key per second, across every process that
  opens the same directory: a token bucket per key (burst: one second's
  worth) kept in a file under ``{root}/s3model/`` and updated under an
  exclusive ``flock``. The S3 backend writes all versions of a key under
  one prefix, which S3 throttles as one hot spot. A write over the cap is
  answered like S3's ``503 SlowDown``: retried ``throttle_retries`` times
  after a short backoff (as boto's standard mode does), then
  ``Determinate`` (nothing was written).

Use it by URL: ``s3model+file:///ABSOLUTE/PATH?latency_ms=60&cas_per_key_s=15``
(both optional; ``cas_per_key_s=0``: no cap). The data is the file
backend's, so ``file:///ABSOLUTE/PATH`` opens the same database without the
model. Requests are counted per operation (``counters``, as
:class:`persist.unreliable.CountingBlob`), throttled writes in
``model.throttled``.

Invariants: a request sleeps before it runs, never while holding a lock;
a token bucket is read and written only under its file's exclusive lock,
so processes sharing the directory share the cap exactly.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from persist.errors import Determinate, InvalidUsage
from persist.file import open_file
from persist.location import Blob, CaSResult, Consensus
from persist.unreliable import Counters, CountingBlob, CountingConsensus, Op

T = TypeVar("T")

DEFAULT_LATENCY_MS = 60.0
"""S3's typical first-byte latency for small objects, per request."""
DEFAULT_CAS_PER_KEY_S = 15.0
"""Conditional writes per second per key S3 sustains before answering ``SlowDown``."""
THROTTLE_RETRIES = 2
"""A throttled conditional write is tried this many more times (boto's standard mode: 3 attempts in all)."""
_TWO_REQUESTS = frozenset({Op.HEAD, Op.SCAN, Op.TRUNCATE})


class S3Model:
    """The model's parameters and shared state: latency, the per-key token buckets, and counts.

    ``clock`` (wall-clock seconds, shared by processes) and ``sleep`` are
    parameters for tests. Thread-safe.
    """

    def __init__(
        self,
        state_dir: Path | str,
        *,
        latency_s: float = DEFAULT_LATENCY_MS / 1000,
        cas_per_key_s: float = DEFAULT_CAS_PER_KEY_S,
        throttle_retries: int = THROTTLE_RETRIES,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if latency_s < 0 or cas_per_key_s < 0 or throttle_retries < 0:
            raise InvalidUsage(
                f"latency_s, cas_per_key_s and throttle_retries must be >= 0, got "
                f"{latency_s}, {cas_per_key_s}, {throttle_retries}"
            )
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.latency_s = latency_s
        self.cas_per_key_s = cas_per_key_s
        self.throttle_retries = throttle_retries
        self.clock = clock
        self.sleep = sleep
        self._lock = threading.Lock()
        #: requests made (two-request operations count two), seconds slept for latency, conditional
        #: writes throttled (each answered SlowDown) and granted (passed the cap)
        self.requests = 0
        self.slept_s = 0.0
        self.throttled = 0
        self.granted = 0

    def request(self, op: Op) -> None:
        """Pay the latency of ``op`` (one request, or two)."""
        n = 2 if op in _TWO_REQUESTS else 1
        with self._lock:
            self.requests += n
            self.slept_s += n * self.latency_s
        if self.latency_s > 0:
            self.sleep(n * self.latency_s)

    def take_token(self, key: str) -> bool:
        """Take a conditional-write token of ``key`` from its bucket (shared by processes); whether there was one."""
        if self.cas_per_key_s <= 0:
            return True
        path = self.state_dir / hashlib.sha256(key.encode()).hexdigest()[:32]
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = os.pread(fd, 64, 0).decode().split()
            now = self.clock()
            cap = self.cas_per_key_s
            tokens, last = (float(raw[0]), float(raw[1])) if len(raw) == 2 else (cap, now)
            tokens = min(cap, tokens + max(0.0, now - last) * cap)
            ok = tokens >= 1.0
            if ok:
                tokens -= 1.0
            data = f"{tokens!r} {now!r}".encode().ljust(64)
            os.pwrite(fd, data, 0)
        finally:
            os.close(fd)  # (closing releases the lock)
        with self._lock:
            if ok:
                self.granted += 1
            else:
                self.throttled += 1
        return ok

    def conditional_write(self, key: str, write: Callable[[], T]) -> T:
        """``write()`` (one conditional write of ``key``) once a token allows it; ``Determinate`` if throttled."""
        for attempt in range(self.throttle_retries + 1):
            self.request(Op.CAS)
            if self.take_token(key):
                return write()
            if attempt < self.throttle_retries:
                self.sleep(random.uniform(0, 0.05 * 2**attempt))  # (boto's jittered backoff)
        raise Determinate(
            f"s3model: conditional write of {key!r} throttled (SlowDown: over {self.cas_per_key_s:g}/s "
            f"for this key, {self.throttle_retries + 1} tries); nothing was written"
        )


class S3ModelBlob(CountingBlob):
    """A :class:`Blob` with the model's latency on every request; counts into ``counters``."""

    def __init__(self, inner: Blob, model: S3Model, counters: Counters | None = None) -> None:
        super().__init__(inner, counters)
        self.model = model

    def _run(self, op: Op, what: str, call: Callable[[], T], written: int = 0,
             read: Callable[[T], int] | None = None) -> T:
        self.model.request(op)
        return super()._run(op, what, call, written, read)


class S3ModelConsensus(CountingConsensus):
    """A :class:`Consensus` with the model's latency, and its cap on compare-and-sets per key."""

    def __init__(self, inner: Consensus, model: S3Model, counters: Counters | None = None) -> None:
        super().__init__(inner, counters)
        self.model = model

    def _run(self, op: Op, what: str, call: Callable[[], T], written: int = 0,
             read: Callable[[T], int] | None = None) -> T:
        if op is not Op.CAS:
            self.model.request(op)
        return super()._run(op, what, call, written, read)

    def compare_and_set(self, key: str, expected: int | None, data: bytes) -> CaSResult:
        return self.model.conditional_write(key, lambda: super(S3ModelConsensus, self).compare_and_set(
            key, expected, data))

    # (compare_and_set_after: the base class's, ``ready()`` then compare_and_set, as the S3 backend does)


def open_s3model(
    root: Path | str,
    *,
    latency_ms: float = DEFAULT_LATENCY_MS,
    cas_per_key_s: float = DEFAULT_CAS_PER_KEY_S,
) -> tuple[S3ModelBlob, S3ModelConsensus]:
    """The file backend at ``root`` wrapped in one :class:`S3Model` (state under ``root/s3model``)."""
    blob, consensus = open_file(root)
    model = S3Model(Path(root) / "s3model", latency_s=latency_ms / 1000, cas_per_key_s=cas_per_key_s)
    counters = Counters()
    return S3ModelBlob(blob, model, counters), S3ModelConsensus(consensus, model, counters)


PARAMS = {"latency_ms": DEFAULT_LATENCY_MS, "cas_per_key_s": DEFAULT_CAS_PER_KEY_S}
"""The URL's query parameters and their defaults."""


def parse_params(query: str) -> dict[str, float]:
    """The model's parameters from a URL query (``latency_ms=60&cas_per_key_s=15``); ``ValueError`` saying why."""
    out: dict[str, float] = {}
    for piece in query.split("&") if query else []:
        name, eq, value = piece.partition("=")
        if name not in PARAMS:
            raise ValueError(f"unknown query parameter {name!r}; known: {', '.join(sorted(PARAMS))}")
        if name in out:
            raise ValueError(f"query parameter {name!r} given twice")
        try:
            v = float(value) if eq else float("nan")
        except ValueError:
            v = float("nan")
        if not v >= 0 or v == float("inf"):
            raise ValueError(f"query parameter {name!r} must be a number >= 0, got {value!r}")
        out[name] = v
    return {**PARAMS, **out}


__all__ = ["PARAMS", "S3Model", "S3ModelBlob", "S3ModelConsensus", "open_s3model", "parse_params"]
