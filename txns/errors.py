"""Errors of the txns layer. Bad input raises persist's ``InvalidUsage`` family."""

from __future__ import annotations

from persist.errors import InvalidUsage, PersistError


class TimestampUnavailable(PersistError):
    """The requested time is already closed in the txns shard.

    ``upper`` is the earliest time that could work now. A transaction that
    raised this is still valid: commit it again at ``upper`` or later (its
    batches are re-timestamped, not rewritten).
    """

    def __init__(self, what: str, ts: int, upper: int) -> None:
        super().__init__(f"{what} at {ts} is not possible: the txns shard upper is {upper}; use a time >= {upper}")
        self.ts = ts
        self.upper = upper


class NotRegistered(InvalidUsage):
    """A data shard is not registered at the time asked (never, not yet, or forgotten)."""


__all__ = ["TimestampUnavailable", "NotRegistered"]
