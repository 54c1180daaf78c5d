"""Commit records: the durable identity of every transaction that wrote data.

Each txns shard has one system data shard, the *commits shard* (its id is
derived from the txns shard's id, see :func:`commits_shard_id`). Every
commit of a :class:`txns.Txn` that carries data adds one row to it, in the
same conditional write that commits the transaction:

    key ``(txn_id: string)``, val ``(commit_ts: uint64, wall_ms: int64, info: string)``

``commit_ts`` is the commit time, ``wall_ms`` the committer's wall clock when it
tried, ``info`` JSON: ``{"tables": {data_id: rows}, "metadata": {...}}``.

Invariants:

- A transaction id has at most one commit record with a positive
  multiplicity at any time: a commit of an id is only attempted after
  proving, at the very txns upper the commit expects, that no earlier
  attempt of it committed (see ``TxnsHandle.commit_entries``), unless no
  earlier attempt can have landed.
- The commits shard is registered in the same conditional write as the
  first commit that writes to it, so a record exists exactly when its
  transaction committed.
- Records are kept until retracted by retention maintenance; nothing in
  this layer retracts them yet, so the identity window is "forever".
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from persist import Schema

COMMITS_SCHEMA = Schema(
    key=pa.schema([pa.field("txn_id", pa.string(), nullable=False)]),
    val=pa.schema(
        [
            pa.field("commit_ts", pa.uint64(), nullable=False),
            pa.field("wall_ms", pa.int64(), nullable=False),
            pa.field("info", pa.string(), nullable=False),
        ]
    ),
)


COMMIT_RECORD_MAX_BYTES = 16 << 10
"""A transaction's metadata, as JSON, must fit this; records then always ride inline in the commit."""


def commits_shard_id(txns_id: str) -> str:
    """The id of the commits shard of txns shard ``txns_id`` (derived, so every process agrees)."""
    return "s" + hashlib.sha256(f"txns-commit-records:{txns_id}".encode()).hexdigest()[:32]


@dataclass(frozen=True)
class CommitRecord:
    """One committed transaction: its id, commit time, wall-clock time and info."""

    txn_id: str
    ts: int
    wall_ms: int
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def tables(self) -> dict[str, int]:
        """Rows written per data shard id."""
        return dict(self.info.get("tables", {}))

    @property
    def metadata(self) -> dict[str, Any]:
        """The metadata given when the transaction began."""
        return dict(self.info.get("metadata", {}))

    @staticmethod
    def from_row(txn_id: str, ts: int, wall_ms: int, info: str) -> CommitRecord:
        return CommitRecord(txn_id, int(ts), int(wall_ms), json.loads(info))


def encode_info(tables: dict[str, int], metadata: dict[str, Any]) -> str:
    return json.dumps({"tables": tables, "metadata": metadata}, separators=(",", ":"), sort_keys=True)


__all__ = ["COMMIT_RECORD_MAX_BYTES", "COMMITS_SCHEMA", "CommitRecord", "commits_shard_id", "encode_info"]
