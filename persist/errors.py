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

Lost compare-and-set races at the storage layer are values
(:class:`persist.location.CaSResult`), never exceptions.
"""

from __future__ import annotations


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


class LeaseExpired(PersistError):
    """A reader's lease expired; its hold on the since is gone. Open a new reader."""
