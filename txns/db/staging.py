"""A transaction's staged data: the persist batches it will commit, per table, and their row counts.

Rows go into persist batch builders (one for additions and one for
retractions per table, times ``[0, 1)``, ``diff`` +1 / -1), which spill
sorted Parquet parts at the part size, so memory stays bounded for writes of
any size. A stream goes to a batch of its own; an engine adds batches its
workers wrote (:mod:`txns.db.engine`).

Invariants:

- Every part written belongs to a builder or a batch held here until the
  commit takes the batches, or :meth:`Staging.discard` deletes them (an
  abandoned transaction leaves no part behind, except the batches an engine
  asked to keep: ``keep_on_abort``); a stream that fails midway deletes its
  own batch at once, so none of it is staged.
- ``counts`` (data shard id -> [added, retracted]) counts every row staged,
  for the commit's history.
- Tables created by the transaction get writers opened here (nothing is
  written for them until the commit registers them).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import pyarrow as pa

from persist import Batch, BatchBuilder, Schema, WriteHandle, finish_all
from txns.db.pool import each

if TYPE_CHECKING:
    from txns.db.database import Database


def updates(table: pa.Table, diff: int) -> pa.Table:
    """``table``'s rows as persist updates at time 0 with ``diff``."""
    n = table.num_rows
    table = table.append_column(pa.field("ts", pa.uint64()), _constant(0, pa.uint64(), n))
    return table.append_column(pa.field("diff", pa.int64()), _constant(diff, pa.int64(), n))


_CONSTANTS: dict[tuple[int, str], pa.Array] = {}
_CONSTANT_MAX_ROWS = 1 << 20


def _constant(value: int, type_: pa.DataType, n: int) -> pa.Array:
    """``n`` copies of ``value``: a slice of one cached array (up to 1M rows; no new buffers per batch)."""
    if n > _CONSTANT_MAX_ROWS:
        return pa.repeat(pa.scalar(value, type_), n)
    key = (value, str(type_))
    cached = _CONSTANTS.get(key)
    if cached is None or len(cached) < n:  # (a race makes two arrays at worst: both right)
        cached = _CONSTANTS[key] = pa.repeat(pa.scalar(value, type_), n)
    return cached.slice(0, n)


class Staging:
    """The batches a transaction stages (see the module doc)."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._writers: dict[str, WriteHandle] = {}  # writers of tables created here (not registered yet)
        self._builders: dict[tuple[str, int], BatchBuilder] = {}
        self.batches: dict[str, list[Batch]] = {}
        self.counts: dict[str, list[int]] = {}  # data_id -> [added, retracted]
        self._kept: set[int] = set()  # ids of engines' batches an abandoned transaction must not delete

    def open_new(self, data_id: str, schema: Schema) -> None:
        """A writer for a table created in the transaction (a read only: nothing is written yet)."""
        self._writers[data_id] = self._db.client.open_writer(data_id, schema)

    def _writer(self, data_id: str) -> WriteHandle:
        w = self._writers.get(data_id)
        return w if w is not None else self._db.handle.data_writer(data_id)

    def add(self, data_id: str, rows: pa.Table, diff: int) -> None:
        """Stage ``rows`` (conformed to the table's schema) with ``diff`` (+1 added, -1 retracted)."""
        if not rows.num_rows:
            return
        b = self._builders.get((data_id, diff))
        if b is None:
            b = self._writer(data_id).builder(0, 1)
            self._builders[(data_id, diff)] = b
        b.add_table(updates(rows, diff))

    def add_stream(self, data_id: str, pieces: Iterable[pa.Table]) -> int:
        """Stage every piece (conformed) as a batch of its own; return the rows. A failure deletes it whole."""
        b = self._writer(data_id).builder(0, 1)
        rows = 0
        try:
            for p in pieces:
                if p.num_rows:
                    b.add_table(updates(p, 1))
                    rows += p.num_rows
        except BaseException:
            try:
                b.finish().delete(self._db.client.blob)
            except Exception:  # noqa: BLE001 - best effort; gc finds leaked parts
                pass
            raise
        batch = b.finish()
        if batch.rows:
            self.batches.setdefault(data_id, []).append(batch)
        return rows

    def add_batch(self, data_id: str, batch: Batch, keep_on_abort: bool) -> None:
        """Stage a batch written elsewhere (an engine's)."""
        if keep_on_abort:
            self._kept.add(id(batch))
        if batch.rows:
            self.batches.setdefault(data_id, []).append(batch)

    def count(self, data_id: str, added: int, retracted: int) -> None:
        c = self.counts.setdefault(data_id, [0, 0])
        c[0] += added
        c[1] += retracted

    def finish(self) -> None:
        """Finish every builder (their last parts encoded and uploaded at once, on the shared pool).

        A builder that finished moves its batch over (so a discard deletes its
        parts); one that failed stays. Raises the first failure.
        """
        done, failure = finish_all(dict(sorted(self._builders.items())), each)
        for (d, sign), batch in done.items():
            del self._builders[(d, sign)]
            if batch.rows:
                self.batches.setdefault(d, []).append(batch)
        if failure is not None:
            raise failure

    def forget(self, data_id: str) -> None:
        """Delete what is staged for ``data_id`` (a table created and dropped again in the transaction)."""
        for b in self.batches.pop(data_id, []):
            b.delete(self._db.client.blob)
        self.counts.pop(data_id, None)

    def discard(self) -> None:
        """Delete every part staged (best effort: ``gc_leaked`` finds what is left), engines' kept batches aside."""
        blob = self._db.client.blob
        for b in self._builders.values():
            try:
                b.finish().delete(blob)
            except Exception:  # noqa: BLE001 - best effort; gc deletes leaked parts
                pass
        self._builders = {}
        for bs in self.batches.values():
            for batch in bs:
                if id(batch) in self._kept:
                    continue
                try:
                    batch.delete(blob)
                except Exception:  # noqa: BLE001
                    pass
        self.batches = {}


__all__ = ["Staging", "updates"]
