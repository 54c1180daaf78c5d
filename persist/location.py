"""The two storage interfaces everything in persist stands on.

``Blob`` is a key-value store of immutable-ish objects; ``Consensus`` is a
linearizable log of versions per key. Both store raw bytes: framing with a
format version and a checksum is the layer above's job (:mod:`persist._internal.codec`).

Backends (one module each): :mod:`persist.mem` (in-process, for tests),
:mod:`persist.file` (a local directory, the embedded default),
:mod:`persist.s3` (S3 and S3-compatible stores). :mod:`persist.url` picks one
from a URL.

Failure model. A backend raises :class:`persist.errors.Determinate` when the
operation definitely did not happen and :class:`persist.errors.Indeterminate`
when it may have (timeouts, resets, 5xx). Unknown failures are indeterminate.
A lost compare-and-set is a result (:data:`CaSResult.MISMATCH`), not an error.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class VersionedData:
    """One version of a consensus key: its sequence number and its bytes."""

    seqno: int
    data: bytes


class CaSResult(enum.Enum):
    """The outcome of :meth:`Consensus.compare_and_set`."""

    COMMITTED = "committed"
    MISMATCH = "mismatch"


class Blob(ABC):
    """A durable map from string keys to bytes.

    Contract:
    - ``set`` is atomic: a concurrent or later ``get`` sees either the whole
      old value (or nothing) or the whole new one, never a mix.
    - After ``set`` returns, ``get`` from any client returns the new value.
    - ``delete`` of a missing key is not an error.
    - ``list_keys(prefix)`` yields every key starting with ``prefix`` that
      existed for the whole listing (keys written or deleted during it may or
      may not appear). Order is unspecified.
    Persist writes each data object once, under a unique key, and never
    overwrites it, so readers never race a change of contents.

    Capabilities: class attributes a backend sets when it differs from the
    default; wrappers forward those of what they wrap. The conformance suite
    (:class:`persist.testing.BlobConformance`) checks what each one claims.
    """

    keys_nest: bool = True
    """Whether a key may also be the directory part of other keys (``a`` and
    ``a/b`` both set). False (the file backend, where ``a`` is a file or a
    directory): the second ``set`` raises ``InvalidUsage`` and changes nothing.
    Persist's own keys never nest, so it works either way."""

    @abstractmethod
    def get(self, key: str) -> bytes | None:
        """The value at ``key``, or None if there is none."""

    @abstractmethod
    def set(self, key: str, value: bytes) -> None:
        """Atomically store ``value`` at ``key``, replacing any old value."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key`` if present."""

    def delete_many(self, keys: Sequence[str]) -> None:
        """Remove each of ``keys`` that is present (missing ones are not an error).

        Not atomic: a failure may leave any of them deleted and the others
        not; calling it again finishes the job. The default deletes them one
        by one; S3 deletes up to 1,000 in one request (DeleteObjects).
        """
        for key in keys:
            self.delete(key)

    @abstractmethod
    def list_keys(self, prefix: str) -> Iterator[str]:
        """Every key that starts with ``prefix``."""

    def storage_now_ms(self) -> int | None:
        """The storage's own clock now (ms since the epoch), or None when it has none of its own.

        For clients to measure their clock's skew against the one clock they
        all share. At most one request, often none: the file store stats a
        probe file it creates and deletes (the file system's clock); S3 reads
        the ``Date`` header of its last response (second precision), making
        a request only when it has received none for a while. The default
        (and the in-process store, whose clock is this process's) is None.
        """
        return None

    def close(self) -> None:  # noqa: B027 - optional to override: a no-op by default
        """Release resources. The default does nothing."""


class Consensus(ABC):
    """A linearizable log of versions per key.

    Contract:
    - Versions of a key have strictly increasing sequence numbers; the first
      version of a key is seqno 1 and each later one is the previous plus one.
    - ``compare_and_set(key, expected, data)`` writes version ``expected + 1``
      (or 1 when ``expected`` is None) iff the key's latest version is
      ``expected`` (None: the key has no versions). Exactly one of any set of
      racing calls with the same ``expected`` commits. It returns
      :data:`CaSResult.COMMITTED` or :data:`CaSResult.MISMATCH`.
    - ``head`` returns the latest version; ``scan`` returns versions with
      seqno >= ``from_seqno`` in increasing order, at most ``limit`` of them.
    - ``truncate(key, seqno)`` deletes versions with seqno < ``seqno``; it
      never deletes the latest version, and raises ``InvalidUsage`` if asked
      to. It returns how many versions it deleted (an estimate is allowed).

    SUBTLE: backends that implement compare-and-set as "create version
    expected+1 if absent" (the file and S3 backends) cannot tell a missing
    version that was truncated from one never written. A caller must therefore
    never pass an ``expected`` that may be older than what a concurrent
    ``truncate`` removes. Persist guarantees this with a time horizon: it
    truncates only versions written longer ago than its retention period and
    re-reads the head before any compare-and-set whose expectation is older
    than half that period (see docs/storage.md, "Consensus truncation").

    Capabilities: class attributes a backend sets when it differs from the
    default (the default is the full contract above); wrappers forward those
    of what they wrap. The conformance suite
    (:class:`persist.testing.ConsensusConformance`) checks what each one claims.
    """

    checks_expectation: bool = True
    """Whether ``compare_and_set`` compares ``expected`` with the head, so that
    an ``expected`` ahead of the head (a version never written) is a MISMATCH.
    False for put-if-absent backends (S3's conditional PUT): they write
    version ``expected + 1`` whenever it is absent, leaving a gap. Persist
    never passes an ``expected`` it has not read, so it works either way."""

    detects_truncated: bool = True
    """Whether a ``compare_and_set`` whose ``expected`` is below a truncated
    head (None after version 1 was truncated, or a truncated seqno) is a
    MISMATCH. False for put-if-absent backends, which cannot tell a truncated
    version from one never written: callers rely on the time horizon of the
    SUBTLE note above."""

    lists_keys: bool = False
    """Whether :meth:`list_keys` is implemented (it is optional: the default
    raises ``NotImplementedError``). Only tools use it."""

    @abstractmethod
    def head(self, key: str, hint: int | None = None) -> VersionedData | None:
        """The latest version of ``key``, or None if it has none.

        ``hint``: a seqno the caller saw; the head is at least it. Backends
        that list versions may start there (the result must not depend on it).
        """

    @abstractmethod
    def compare_and_set(self, key: str, expected: int | None, data: bytes) -> CaSResult:
        """Write version ``expected + 1`` iff the latest version is ``expected``."""

    def compare_and_set_after(
        self, key: str, expected: int | None, data: bytes, ready: Callable[[], None]
    ) -> CaSResult:
        """``compare_and_set``, once ``ready()`` (the write's prerequisite) has returned.

        ``ready`` is called at most once, before the new version can be
        seen; if it raises, nothing is written and its exception propagates.
        A backend may prepare the write first (the file store writes and
        syncs the new version's temp file, so that its sync and whatever
        ``ready`` waits for overlap), and may return a MISMATCH it finds
        before calling ``ready``; the default calls ``ready`` first.
        """
        ready()
        return self.compare_and_set(key, expected, data)

    @abstractmethod
    def scan(self, key: str, from_seqno: int, limit: int) -> list[VersionedData]:
        """Versions of ``key`` with seqno >= ``from_seqno``, oldest first."""

    @abstractmethod
    def truncate(self, key: str, seqno: int) -> int:
        """Delete versions of ``key`` older than ``seqno``."""

    def list_keys(self) -> Iterator[str]:
        """Every key with at least one version (for tools). Optional."""
        raise NotImplementedError

    def close(self) -> None:  # noqa: B027 - optional to override: a no-op by default
        """Release resources. The default does nothing."""


def next_seqno(expected: int | None) -> int:
    """The seqno a compare-and-set with ``expected`` writes."""
    return 1 if expected is None else expected + 1
