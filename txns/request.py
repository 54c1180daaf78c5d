"""CommitRequest: everything one conditional write to the txns shard commits, as one value.

The commit path has one loop, ``TxnsHandle.commit_entries(request)``; a
:class:`txns.Txn` (``Txn.commit_at``) only builds the request. The seams the
layers above use are fields of the request:

- **the time** (``ts``): chosen by the caller. The database asks its
  timestamp oracle (``txns.db.oracle``); a low-level caller passes any time
  at or past the upper, and ``TxnsHandle.commit`` retries a taken one;
- **what the caller validated** (``expect_upper``): commit only if the txns
  upper is exactly this, so whatever the caller checked as of
  ``expect_upper - 1`` (a read set, ``txns.db.validation``) still holds at ``ts``;
  or (``check``) a check the caller runs against the txns log on every try,
  at the very upper that try appends at: a caller whose condition is cheap
  to re-check (the group-commit sequencer: "no member committed yet") keeps
  committing while other commits land, instead of failing at the first;
- **many transactions in one write** (``members``): one commit record per
  member of a group commit (``Txn.join``), all at ``ts``;
- **exactly once** (``txn_id``, ``uncertain``, ``token``): a request that may
  have landed before is looked up at the very upper it commits against, and
  an earlier commit of it is returned instead of committing twice.

Invariant: a request is immutable once built; committing it again (after an
``Indeterminate``) is the same request with ``uncertain=True``. The tidy
(entries to retract in the same write) travels beside it: it is cleared
once the write lands.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from txns.entries import Entry


@dataclass(frozen=True)
class CommitMember:
    """One transaction committed by a request, recorded as a commit record: its id, rows per data shard, metadata."""

    txn_id: str
    tables: Mapping[str, int]
    metadata: Mapping[str, Any]


@dataclass(frozen=True)
class CommitRequest:
    """One commit at ``ts``: entries to add, shards to register, records to write. See the module doc."""

    ts: int
    adds: tuple[Entry, ...]
    data_ids: tuple[str, ...]
    token: str
    txn_id: str | None = None
    uncertain: bool = False
    members: tuple[CommitMember, ...] = ()
    register: tuple[str, ...] = ()
    expect_upper: int | None = None
    #: the caller's prerequisites, called right before the conditional write (see ``Txn.before_write``)
    ready: tuple[Callable[[], None], ...] = ()
    #: called on every try with the txns upper it appends at (the handle's cache is at that upper);
    #: raises to give up with nothing committed (see the module doc)
    check: Callable[[int], None] | None = None


__all__ = ["CommitMember", "CommitRequest"]
