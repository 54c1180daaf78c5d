"""Batches: updates written to blob storage ahead of being appended.

A :class:`Batch` is a transmittable pointer to rows already durable in blob
storage (or small enough to travel inline). Appending it to a shard is a
metadata-only compare-and-set; re-timestamping it to a later time
(:meth:`Batch.rewrite_ts`) rewrites no data. A :class:`BatchBuilder` flushes
sorted Parquet parts at a target size while rows arrive, uploading up to
``upload_parallelism`` parts at once, so memory stays bounded for a batch of
any size.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

import pyarrow as pa

from persist.codec import KIND_BATCH, frame, unframe
from persist.config import PersistConfig
from persist.errors import ExternalError, InvalidUsage
from persist.location import Blob
from persist.machine import _backoff
from persist.parts import PartRef, Run, encode_inline, runs_rows, runs_size, sort_updates, write_part
from persist.schema import CLOSED, Schema, schema_fingerprint, check_table, check_ts, check_upper, rows_to_table

_CHUNK_ROWS = 8192


@dataclass(frozen=True)
class Batch:
    """Updates of one shard with times in ``[lower, upper)``, written but not appended.

    Move it between processes with :meth:`to_bytes` / :meth:`from_bytes`.
    A batch that will never be appended should be :meth:`delete`\\ d.
    """

    shard_id: str
    id: str
    lower: int
    upper: int
    runs: tuple[Run, ...]
    schema_text: str  # the schema's text or its fingerprint; kept as the fingerprint

    def __post_init__(self) -> None:
        object.__setattr__(self, "schema_text", schema_fingerprint(self.schema_text))

    @property
    def rows(self) -> int:
        return runs_rows(self.runs)

    @property
    def size(self) -> int:
        return runs_size(self.runs)

    @property
    def parts(self) -> list[PartRef]:
        return [p for r in self.runs for p in r.parts]

    def rewrite_ts(self, ts: int, upper: int | None = None) -> Batch:
        """This batch with every update time advanced to at least ``ts``.

        No data is rewritten: the parts are shared, the new time is metadata.
        ``ts`` must not be below ``lower``. The new bounds are
        ``[ts, max(upper, ts + 1))``, or ``[ts, upper)`` when given (at least that big).
        """
        check_ts(ts, "rewrite ts")
        if ts < self.lower:
            raise InvalidUsage(f"cannot rewrite batch times back to {ts}: its lower is {self.lower}")
        new_upper = max(self.upper, ts + 1) if upper is None else check_upper(upper)
        if new_upper <= ts:
            raise InvalidUsage(f"rewrite upper {new_upper} must be past the rewrite ts {ts}")
        if new_upper < self.upper:
            # The rows may have times up to self.upper - 1, which a rewrite to
            # ts < self.upper leaves as they are: they must stay inside the bounds.
            raise InvalidUsage(f"rewrite upper {new_upper} must not be below the batch's upper {self.upper}")
        return replace(self, lower=ts, upper=new_upper, runs=tuple(r.rewritten(ts) for r in self.runs))

    def to_bytes(self) -> bytes:
        j = {
            "shard_id": self.shard_id,
            "id": self.id,
            "lower": self.lower,
            "upper": self.upper,
            "runs": [r.to_json() for r in self.runs],
            "schema": schema_fingerprint(self.schema_text),
        }
        return frame(KIND_BATCH, json.dumps(j, separators=(",", ":")).encode())

    @staticmethod
    def from_bytes(data: bytes) -> Batch:
        j = json.loads(unframe("serialized batch", data, KIND_BATCH))
        return Batch(j["shard_id"], j["id"], j["lower"], j["upper"], tuple(Run.from_json(r) for r in j["runs"]), j["schema"])

    def same_schema(self, schema_text: str) -> bool:
        """Whether this batch was written with the schema whose text is ``schema_text``."""
        return schema_fingerprint(self.schema_text) == schema_fingerprint(schema_text)

    def delete(self, blob: Blob) -> None:
        """Delete this batch's parts. Only for a batch that was never appended."""
        for p in self.parts:
            blob.delete(p.key)


class BatchBuilder:
    """Builds a :class:`Batch` with bounded memory.

    >>> # builder = writer.builder(lower=0, upper=10)
    >>> # builder.add((1,), ("a",), 3, 1); batch = builder.finish()
    """

    def __init__(
        self,
        blob: Blob,
        shard_id: str,
        schema: Schema,
        lower: int,
        upper: int,
        config: PersistConfig,
        inline_max_bytes: int | None = None,
    ) -> None:
        check_ts(lower, "batch lower")
        check_upper(upper, "batch upper")
        if upper <= lower:
            raise InvalidUsage(f"batch upper {upper} must be greater than its lower {lower}")
        self.blob, self.shard_id, self.schema = blob, shard_id, schema
        self.lower, self.upper, self.config = lower, upper, config
        self.inline_max_bytes = config.inline_max_bytes if inline_max_bytes is None else inline_max_bytes
        self._rows: list = []
        self._tables: list[pa.Table] = []
        self._buffered = 0
        self._parts: list[Future[PartRef]] = []
        self._pool: ThreadPoolExecutor | None = None
        self._count = 0
        self._done = False

    def add(self, key: tuple, val: tuple, ts: int, diff: int) -> None:
        """Add one update ``((key, val), ts, diff)``."""
        self._rows.append(((key, val), ts, diff))
        if len(self._rows) >= _CHUNK_ROWS:
            self._take_rows()

    def add_updates(self, updates: Iterable) -> None:
        """Add updates ``((key, val), ts, diff)``; their shape is checked when rows are taken."""
        for upd in updates:
            self._rows.append(upd)
            if len(self._rows) >= _CHUNK_ROWS:
                self._take_rows()

    def add_table(self, table: pa.Table) -> None:
        """Add rows given as Arrow (key and val columns by name, ``ts``, ``diff``)."""
        table = check_table(self.schema, table)
        self._check_times(table)
        self._push(table)

    def _take_rows(self) -> None:
        if not self._rows:
            return
        table = rows_to_table(self.schema, self._rows)
        self._check_times(table)
        self._rows = []
        self._push(table)

    def _check_times(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        import pyarrow.compute as pc

        mm = pc.min_max(table.column("ts")).as_py()
        if mm["min"] < self.lower or mm["max"] >= self.upper:
            bad = mm["min"] if mm["min"] < self.lower else mm["max"]
            raise InvalidUsage(
                f"update time {bad} is outside the batch bounds [{self.lower}, {self.upper}); "
                f"every update must have lower <= ts < upper"
            )

    def _push(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        self._count += table.num_rows
        self._tables.append(table)
        self._buffered += table.nbytes
        if self._buffered >= self.config.part_target_bytes:
            self._flush()

    def _flush(self) -> None:
        if not self._tables:
            return
        table = sort_updates(pa.concat_tables(self._tables).combine_chunks())
        self._tables, self._buffered = [], 0
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.config.upload_parallelism)
        # bound the bytes in flight: wait for the oldest upload when the pool is full
        pending = [f for f in self._parts if not f.done()]
        if len(pending) >= self.config.upload_parallelism:
            pending[0].result()
        self._parts.append(self._pool.submit(self._upload, table))

    def _upload(self, table: pa.Table) -> PartRef:
        """Write one part, retrying storage failures until ``retry_deadline_s`` (as every persist write does).

        SUBTLE: a failed upload is kept in its future, and ``finish`` re-raises
        it on every call: without this retry, one transient blob error made the
        batch (and a transaction buffering it) impossible to ever finish. A
        retry is safe: each attempt writes a fresh key (a failed attempt can at
        worst leak an unreferenced part, for ``PersistClient.gc_leaked``).
        """
        deadline = time.monotonic() + self.config.retry_deadline_s
        attempt = 0
        while True:
            try:
                return write_part(self.blob, self.shard_id, table)
            except ExternalError:
                attempt += 1
                if time.monotonic() > deadline:
                    raise
                _backoff(attempt)

    def finish(self) -> Batch:
        """Flush what is buffered, wait for every upload, and return the batch."""
        if self._done:
            raise InvalidUsage("this batch builder has already finished; start a new one")
        self._take_rows()
        run = Run()
        if not self._parts and self._tables:
            table = sort_updates(pa.concat_tables(self._tables).combine_chunks())
            inline = encode_inline(table)
            if len(inline) <= self.inline_max_bytes:
                run = Run(inline=inline, rows=table.num_rows)
                self._tables = []
        self._flush()
        try:
            refs = tuple(f.result() for f in self._parts)
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
        self._done = True
        if refs:
            run = Run(parts=refs, rows=sum(r.rows for r in refs))
        runs = (run,) if run.rows else ()
        return Batch(self.shard_id, uuid.uuid4().hex, self.lower, self.upper, runs, self.schema.to_text())


__all__ = ["Batch", "BatchBuilder", "CLOSED"]
