"""Wrappers around any backend that count calls and inject faults.

Two kinds of injected fault model what a real store does:

- fail *before* the operation: nothing happened. Reads raise ``Determinate``;
  writes raise ``Determinate`` (:data:`Fault.DETERMINATE`) or, modelling a
  request lost on the way, ``Indeterminate`` (:data:`Fault.INDETERMINATE`).
- fail *after* the operation (:data:`Fault.AFTER`, writes only): the inner
  write was done, then the caller is told ``Indeterminate``, as when the
  response to a successful request times out.

Usage::

    faults = Faults(seed=7)
    blob = UnreliableBlob(MemBlob(), faults)
    consensus = UnreliableConsensus(MemConsensus(), faults)
    faults.set_rates(determinate=0.05, after=0.05)         # random, seeded
    faults.fail_next(Op.CAS, Fault.AFTER)                  # forced, exact
    with faults.disabled():                                # no random faults
        ...
    faults.counters.calls(Op.CAS)                          # per-op counters

``enabled`` (and :meth:`Faults.disabled`) switches the *random* faults only;
faults forced with :meth:`Faults.fail_next` fire regardless, oldest first.
:class:`CountingBlob` and :class:`CountingConsensus` count without ever
injecting anything (for benchmarks). All of it is thread-safe.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import random
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

from persist.errors import Determinate, ExternalError, Indeterminate, InvalidUsage
from persist.location import Blob, CaSResult, Consensus, VersionedData

T = TypeVar("T")


class Op(enum.StrEnum):
    """The operations the wrappers count and can fail."""

    BLOB_GET = "blob.get"
    BLOB_SET = "blob.set"
    BLOB_DELETE = "blob.delete"
    BLOB_LIST_KEYS = "blob.list_keys"
    HEAD = "consensus.head"
    CAS = "consensus.compare_and_set"
    SCAN = "consensus.scan"
    TRUNCATE = "consensus.truncate"
    CONSENSUS_LIST_KEYS = "consensus.list_keys"

    @property
    def is_write(self) -> bool:
        return self in _WRITES


_WRITES = frozenset({Op.BLOB_SET, Op.BLOB_DELETE, Op.CAS, Op.TRUNCATE})


class Fault(enum.Enum):
    """How an injected failure behaves."""

    DETERMINATE = "determinate"
    """Fail before the operation; raise ``Determinate``. Any op."""
    INDETERMINATE = "indeterminate"
    """Fail before the operation; raise ``Indeterminate``. Writes only."""
    AFTER = "after"
    """Do the operation, then raise ``Indeterminate``. Writes only."""


def _check_applicable(op: Op, fault: Fault) -> None:
    if fault is not Fault.DETERMINATE and not op.is_write:
        raise InvalidUsage(
            f"fault {fault.value!r} applies to writes only, not to {op.value!r}; "
            f"reads fail with {Fault.DETERMINATE.value!r}"
        )


@dataclasses.dataclass
class OpStats:
    """Counters for one operation.

    ``calls`` counts every call made through a wrapper, ``injected`` those
    failed on purpose, ``bytes_written``/``bytes_read`` the payload bytes of
    calls that reached the inner backend, ``mismatches`` the compare-and-sets
    that returned MISMATCH.
    """

    calls: int = 0
    injected: int = 0
    bytes_written: int = 0
    bytes_read: int = 0
    mismatches: int = 0

    def __add__(self, other: OpStats) -> OpStats:
        mine, theirs = dataclasses.astuple(self), dataclasses.astuple(other)
        return OpStats(*(a + b for a, b in zip(mine, theirs, strict=True)))


class Counters:
    """Per-operation :class:`OpStats`, safe to share between wrappers and threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stats: dict[Op, OpStats] = {}

    def _add(self, op: Op, **deltas: int) -> None:
        with self._lock:
            stats = self._stats.setdefault(op, OpStats())
            for name, delta in deltas.items():
                setattr(stats, name, getattr(stats, name) + delta)

    def __getitem__(self, op: Op | str) -> OpStats:
        """A copy of the counters of ``op``."""
        with self._lock:
            return dataclasses.replace(self._stats.get(Op(op), OpStats()))

    def calls(self, op: Op | str) -> int:
        """How many calls of ``op`` were made."""
        return self[op].calls

    def snapshot(self) -> dict[Op, OpStats]:
        """A copy of every operation's counters."""
        with self._lock:
            return {op: dataclasses.replace(s) for op, s in self._stats.items()}

    def total(self) -> OpStats:
        """All operations' counters summed."""
        return sum(self.snapshot().values(), OpStats())

    def reset(self) -> None:
        """Set every counter back to zero."""
        with self._lock:
            self._stats.clear()


class Faults:
    """A seeded source of faults shared by any number of wrappers.

    Random faults: each call of an op draws once from ``random.Random(seed)``
    and fails with the rates set for that op (their sum must be at most 1);
    rates of faults that do not apply to an op (write-only faults on reads)
    are ignored for it. Forced faults (:meth:`fail_next`) take precedence.
    """

    def __init__(
        self,
        seed: int = 0,
        *,
        enabled: bool = True,
        determinate: float = 0.0,
        indeterminate: float = 0.0,
        after: float = 0.0,
    ) -> None:
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self._rates: dict[Op, dict[Fault, float]] = {}
        self._forced: dict[Op, deque[Fault]] = {}
        self.enabled = enabled
        self.counters = Counters()
        self.set_rates(determinate=determinate, indeterminate=indeterminate, after=after)

    def set_rates(
        self,
        *,
        determinate: float = 0.0,
        indeterminate: float = 0.0,
        after: float = 0.0,
        ops: Iterable[Op | str] | None = None,
    ) -> None:
        """Set the random fault probabilities of ``ops`` (default: every op)."""
        rates = {
            Fault.DETERMINATE: determinate,
            Fault.INDETERMINATE: indeterminate,
            Fault.AFTER: after,
        }
        if any(not 0.0 <= p <= 1.0 for p in rates.values()) or sum(rates.values()) > 1.0:
            raise InvalidUsage(f"fault rates must be in [0, 1] and sum to at most 1, got {rates}")
        with self._lock:
            for op in (Op(o) for o in (Op if ops is None else ops)):
                self._rates[op] = dict(rates)

    def fail_next(self, op: Op | str, fault: Fault = Fault.DETERMINATE, n: int = 1) -> None:
        """Make the next ``n`` calls of ``op`` fail with ``fault`` (queued after earlier ones)."""
        op = Op(op)
        _check_applicable(op, fault)
        with self._lock:
            self._forced.setdefault(op, deque()).extend([fault] * n)

    def pending(self, op: Op | str) -> int:
        """How many forced faults of ``op`` have not fired yet."""
        with self._lock:
            return len(self._forced.get(Op(op), ()))

    def clear(self) -> None:
        """Drop every rate and every pending forced fault (counters are kept)."""
        with self._lock:
            self._rates.clear()
            self._forced.clear()

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        """Switch random faults off for the duration of the block."""
        was, self.enabled = self.enabled, False
        try:
            yield
        finally:
            self.enabled = was

    def draw(self, op: Op) -> Fault | None:
        """The fault for this call of ``op``, if any. Consumes forced faults and randomness."""
        with self._lock:
            forced = self._forced.get(op)
            if forced:
                return forced.popleft()
            if not self.enabled:
                return None
            u = self._rng.random()
            for fault, p in self._rates.get(op, {}).items():
                if fault is not Fault.DETERMINATE and not op.is_write:
                    continue
                if u < p:
                    return fault
                u -= p
            return None


class _Wrapper:
    """Counting, and fault injection when ``_faults`` is set."""

    _faults: Faults | None
    counters: Counters

    def _run(
        self,
        op: Op,
        what: str,
        call: Callable[[], T],
        written: int = 0,
        read: Callable[[T], int] | None = None,
    ) -> T:
        self.counters._add(op, calls=1)
        fault = self._faults.draw(op) if self._faults is not None else None
        if fault is Fault.DETERMINATE or fault is Fault.INDETERMINATE:
            self.counters._add(op, injected=1)
            kind: type[ExternalError] = Determinate if fault is Fault.DETERMINATE else Indeterminate
            raise kind(f"injected fault before {op.value} {what}")
        result = call()
        self.counters._add(
            op,
            bytes_written=written,
            bytes_read=read(result) if read is not None else 0,
            mismatches=1 if result is CaSResult.MISMATCH else 0,
        )
        if fault is Fault.AFTER:
            self.counters._add(op, injected=1)
            raise Indeterminate(f"injected fault after {op.value} {what} (it was done)")
        return result


class CountingBlob(_Wrapper, Blob):
    """A :class:`Blob` that counts calls and bytes per operation into ``counters``."""

    def __init__(self, inner: Blob, counters: Counters | None = None) -> None:
        self.inner = inner
        self.counters = counters if counters is not None else Counters()
        self._faults = None
        self.keys_nest = inner.keys_nest  # capabilities: those of what is wrapped

    def get(self, key: str) -> bytes | None:
        return self._run(
            Op.BLOB_GET, repr(key), lambda: self.inner.get(key), read=lambda r: len(r) if r else 0
        )

    def set(self, key: str, value: bytes) -> None:
        self._run(Op.BLOB_SET, repr(key), lambda: self.inner.set(key, value), written=len(value))

    def delete(self, key: str) -> None:
        self._run(Op.BLOB_DELETE, repr(key), lambda: self.inner.delete(key))

    def delete_many(self, keys: Sequence[str]) -> None:
        if keys:  # (one call, as on S3: counted and faulted as one delete)
            self._run(Op.BLOB_DELETE, f"{keys[0]!r} and {len(keys) - 1} more", lambda: self.inner.delete_many(keys))

    def list_keys(self, prefix: str) -> Iterator[str]:
        return self._run(Op.BLOB_LIST_KEYS, repr(prefix), lambda: self.inner.list_keys(prefix))

    def storage_now_ms(self) -> int | None:
        return self.inner.storage_now_ms()  # (not counted, no faults: a clock reading)

    def close(self) -> None:
        self.inner.close()


class CountingConsensus(_Wrapper, Consensus):
    """A :class:`Consensus` that counts calls and bytes per operation into ``counters``."""

    def __init__(self, inner: Consensus, counters: Counters | None = None) -> None:
        self.inner = inner
        self.counters = counters if counters is not None else Counters()
        self._faults = None
        # capabilities: those of what is wrapped
        self.checks_expectation = inner.checks_expectation
        self.detects_truncated = inner.detects_truncated
        self.lists_keys = inner.lists_keys

    def head(self, key: str, hint: int | None = None) -> VersionedData | None:
        return self._run(
            Op.HEAD, repr(key), lambda: self.inner.head(key, hint), read=lambda r: len(r.data) if r else 0
        )

    def compare_and_set(self, key: str, expected: int | None, data: bytes) -> CaSResult:
        return self._run(
            Op.CAS,
            f"{key!r} expected={expected}",
            lambda: self.inner.compare_and_set(key, expected, data),
            written=len(data),
        )

    def scan(self, key: str, from_seqno: int, limit: int) -> list[VersionedData]:
        return self._run(
            Op.SCAN,
            repr(key),
            lambda: self.inner.scan(key, from_seqno, limit),
            read=lambda r: sum(len(v.data) for v in r),
        )

    def truncate(self, key: str, seqno: int) -> int:
        return self._run(
            Op.TRUNCATE, f"{key!r} to {seqno}", lambda: self.inner.truncate(key, seqno)
        )

    def list_keys(self) -> Iterator[str]:
        return self._run(Op.CONSENSUS_LIST_KEYS, "", self.inner.list_keys)

    def close(self) -> None:
        self.inner.close()


class UnreliableBlob(CountingBlob):
    """A :class:`Blob` that fails as ``faults`` says; counts into ``faults.counters``."""

    def __init__(self, inner: Blob, faults: Faults) -> None:
        super().__init__(inner, faults.counters)
        self._faults = faults
        self.faults = faults


class UnreliableConsensus(CountingConsensus):
    """A :class:`Consensus` that fails as ``faults`` says; counts into ``faults.counters``."""

    def __init__(self, inner: Consensus, faults: Faults) -> None:
        super().__init__(inner, faults.counters)
        self._faults = faults
        self.faults = faults
