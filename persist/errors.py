"""The public error hierarchy of persist.

Few kinds, each telling the caller what to do:

- ``InvalidUsage``: the caller asked for something that can never work (bad
  URL, wrong schema, update outside the append bounds, read below the since).
  Nothing was changed. Fix the call; do not retry it as is.
- ``UpperMismatch``: a compare-and-append lost to another writer. Nothing was
  changed; ``.current`` is the shard's actual upper. Retry with that.
- ``Determinate``: a storage operation failed and definitely did not happen.
  Safe to retry.
- ``Indeterminate``: a storage operation failed and may or may not have
  happened (a timeout, a reset connection, a 5xx). Retrying persist's own
  operations is safe: every write carries an idempotency token, so a retry is
  never applied twice nor lost.
- ``CorruptObject``: an object failed its checksum or format check. Nothing
  corrupt is ever returned; the message names the key.
- ``ReadTimeout``: a read waited the bounded time for the upper to pass its
  ``as_of`` and gave up. Nothing was changed.
- ``PartRetired``: a read planned against an older state found one of its
  parts gone: compaction replaced it after the plan was made (and the grace
  period passed). Nothing is wrong with the data: plan the read again
  (:func:`persist.replan` does). A part the current state still references
  is never reported so: that is ``CorruptObject``.

The outcome rule, kept by every write path of persist and txns (append,
batch append, since downgrades, register, forget, apply, commit,
compaction, GC): once any attempt of an operation may have written, every
later failure of that operation is ``Indeterminate``, whatever failed last
(a read that would have told the outcome included). ``Determinate`` is only
ever raised for an operation none of whose attempts can have landed. For a
transaction, ``Indeterminate`` means: commit the same transaction again (its
durable identity finds an earlier commit); ``Determinate`` means it did not
commit.

Lost compare-and-set races at the storage layer are values
(:class:`persist.location.CaSResult`), never exceptions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar


class PersistError(Exception):
    """Base class of every error persist raises."""


class InvalidUsage(PersistError, ValueError):
    """Bad input: the request can never succeed as given. Nothing was changed."""


class SchemaMismatch(InvalidUsage):
    """Data or a handle's schema does not match the shard's registered schema."""


class ReadBelowSince(InvalidUsage):
    """A read asked for an ``as_of`` that compaction has already passed."""

    def __init__(self, message: str, since: int) -> None:
        super().__init__(message)
        self.since = since


class UpperMismatch(PersistError):
    """A compare-and-append found the shard's upper was not the expected one.

    Nothing was appended. ``current`` is the upper found; retry against it.
    """

    def __init__(self, expected: int, current: int) -> None:
        super().__init__(
            f"upper mismatch: expected upper {expected}, shard upper is {current}; "
            f"retry with expected_upper={current}"
        )
        self.expected = expected
        self.current = current


class ExternalError(PersistError):
    """A storage failure. See :class:`Determinate` and :class:`Indeterminate`."""


class Determinate(ExternalError):
    """A storage operation that definitely did not happen. Safe to retry."""


class Indeterminate(ExternalError):
    """A storage operation that may or may not have happened."""


class CorruptObject(PersistError):
    """An object failed its checksum or format check; nothing of it is returned."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"corrupt object {key!r}: {why}")
        self.key = key


class ReadTimeout(PersistError):
    """A read waited its bounded time for the upper to pass ``as_of``."""

    def __init__(self, message: str, upper: int) -> None:
        super().__init__(message)
        self.upper = upper


class PartRetired(PersistError):
    """A planned read found a part that compaction retired since. Plan the read again (``persist.replan``)."""

    def __init__(self, message: str, key: str = "") -> None:
        super().__init__(message)
        self.key = key  # the retired part's blob key ("" when re-raised from a Spark executor's message)


class LeaseExpired(PersistError):
    """A reader's lease expired; its hold on the since is gone. Open a new reader."""


# ---- the outcome rule, applied ------------------------------------------------------


class WriteTracker:
    """Whether the operation being run may have written anything yet."""

    __slots__ = ("may_have_written",)

    def __init__(self) -> None:
        self.may_have_written = False


_OPERATION: ContextVar[WriteTracker | None] = ContextVar("persist_operation", default=None)


def note_write() -> None:
    """Record that the current operation may have written (a write was sent, or landed)."""
    tracker = _OPERATION.get()
    if tracker is not None:
        tracker.may_have_written = True


@contextlib.contextmanager
def aside() -> Iterator[None]:
    """Run a block whose writes are not part of the enclosing operation (they cannot change its outcome).

    For housekeeping done while an operation runs, such as renewing a
    reader's lease: a write there does not make the operation's result
    uncertain. Inside, a nested :func:`operation` starts afresh.
    """
    token = _OPERATION.set(None)
    try:
        yield
    finally:
        _OPERATION.reset(token)


@contextlib.contextmanager
def operation(what: str) -> Iterator[WriteTracker]:
    """Run one user-visible operation under the outcome rule.

    A storage failure leaving the block is re-raised as ``Indeterminate``
    when anything inside may have written (see :func:`note_write`). Nested
    operations belong to the outermost one. Work handed to other threads
    joins the operation when run in a copy of the caller's context
    (``contextvars.copy_context().run``).
    """
    outer = _OPERATION.get()
    if outer is not None:
        yield outer
        return
    tracker = WriteTracker()
    token = _OPERATION.set(tracker)
    try:
        yield tracker
    except ExternalError as e:
        if tracker.may_have_written and not isinstance(e, Indeterminate):
            raise Indeterminate(f"{what}: {e} (an earlier step of it may have written)") from e
        raise
    finally:
        _OPERATION.reset(token)
