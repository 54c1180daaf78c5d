"""The txns shard's schema and entries.

Every entry is one update of the txns shard with key ``(data_id, batch)`` and
val ``(ts,)``:

- a registration: ``(data_id, b"")`` with val ``(register_ts,)``, added at
  ``register_ts``; forgetting retracts exactly it at ``forget_ts``;
- an append: ``(data_id, batch_bytes)`` with val ``(commit_ts,)``, added at
  ``commit_ts``; tidy retracts exactly it (same bytes) at a later time.

The original time lives in the value because compaction of the txns shard
moves update times up to its since. Batch bytes carry a unique batch id, so
no two appends are equal and a retraction cancels exactly one entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from persist import Batch, Schema

TXNS_SCHEMA = Schema(
    key=pa.schema([pa.field("data_id", pa.string(), nullable=False), pa.field("batch", pa.binary(), nullable=False)]),
    val=pa.schema([pa.field("commit_ts", pa.uint64(), nullable=False)]),
)


@dataclass(frozen=True, order=True)
class Entry:
    """One txns-shard entry (see the module doc). ``batch == b""`` for a registration."""

    ts: int
    data_id: str
    batch: bytes

    @property
    def is_registration(self) -> bool:
        return self.batch == b""

    def update(self, at: int, diff: int) -> tuple[tuple[tuple[str, bytes], tuple[int]], int, int]:
        return ((self.data_id, self.batch), (self.ts,)), at, diff

    @staticmethod
    def from_kv(key: tuple[Any, ...], val: tuple[Any, ...]) -> Entry:
        return Entry(val[0], key[0], key[1])

    def decode_batch(self) -> Batch:
        return Batch.from_bytes(self.batch)
