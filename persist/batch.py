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
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import pyarrow as pa

from persist._internal.codec import KIND_BATCH, frame, unframe
from persist._internal.ids import random_hex
from persist._internal.parts import (
    SMALL_TABLE_ROWS,
    PartRef,
    Run,
    encode_inline,
    exact_key_type,
    part_key,
    runs_rows,
    runs_size,
    sort_updates,
    write_part,
)
from persist._internal.retry import retry_storage
from persist.config import PersistConfig
from persist.errors import InvalidUsage
from persist.location import Blob
from persist.schema import CLOSED, Schema, check_table, check_ts, check_upper, rows_to_table, schema_fingerprint

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
    schema_fingerprint: str  # given the schema's text or its fingerprint; kept as the fingerprint

    def __post_init__(self) -> None:
        object.__setattr__(self, "schema_fingerprint", schema_fingerprint(self.schema_fingerprint))

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
            "schema": self.schema_fingerprint,
        }
        return frame(KIND_BATCH, json.dumps(j, separators=(",", ":")).encode())

    @staticmethod
    def from_bytes(data: bytes) -> Batch:
        j = json.loads(unframe("serialized batch", data, KIND_BATCH))
        runs = tuple(Run.from_json(r) for r in j["runs"])
        return Batch(j["shard_id"], j["id"], j["lower"], j["upper"], runs, j["schema"])

    def same_schema(self, schema_text: str) -> bool:
        """Whether this batch was written with the schema whose text is ``schema_text``."""
        return self.schema_fingerprint == schema_fingerprint(schema_text)

    def delete(self, blob: Blob) -> None:
        """Delete this batch's parts. Only for a batch that was never appended."""
        for p in self.parts:
            blob.delete(p.key)


@dataclass
class _Slot:
    """One part of a builder: its rows until the upload succeeded, its key, its upload."""

    key: str
    table: pa.Table | None
    future: Future[PartRef] | None
    ref: PartRef | None = None


class BatchBuilder:
    """Builds a :class:`Batch` with bounded memory.

    Retry-safe: a storage failure in :meth:`add` means that row was not
    added (nothing else changes); a storage failure in :meth:`finish`
    leaves the builder whole, and calling ``finish`` again retries exactly
    the uploads that failed (under the same part keys, so nothing leaks).
    A finished builder returns the same batch from every ``finish`` call.

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
        self.id = random_hex()  # the batch's id, the same on every finish attempt
        self._rows: list[Any] = []
        self._tables: list[pa.Table] = []
        self._buffered = 0
        self._slots: list[_Slot] = []
        self._pool: ThreadPoolExecutor | None = None
        self._count = 0
        self._result: Batch | None = None

    def add(self, key: tuple[Any, ...], val: tuple[Any, ...], ts: int, diff: int) -> None:
        """Add one update ``((key, val), ts, diff)``."""
        self._check_open()
        if len(self._rows) + 1 >= _CHUNK_ROWS:
            self._make_room()
        self._rows.append(((key, val), ts, diff))
        if len(self._rows) >= _CHUNK_ROWS:
            self._take_rows()

    def add_updates(self, updates: Iterable[Any]) -> None:
        """Add updates ``((key, val), ts, diff)``; their shape is checked when rows are taken."""
        self._check_open()
        for upd in updates:
            if len(self._rows) + 1 >= _CHUNK_ROWS:
                self._make_room()
            self._rows.append(upd)
            if len(self._rows) >= _CHUNK_ROWS:
                self._take_rows()

    def add_table(self, table: pa.Table) -> None:
        """Add rows given as Arrow (key and val columns by name, ``ts``, ``diff``)."""
        self._check_open()
        table = check_table(self.schema, table)
        self._check_times(table)
        self._make_room()
        self._push(table)

    def _check_open(self) -> None:
        if self._result is not None:
            raise InvalidUsage("this batch builder has already finished; start a new one")

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
        if table.num_rows <= SMALL_TABLE_ROWS:
            times = [t for t in table.column("ts").to_pylist() if t is not None]
            if not times:
                return
            lo, hi = min(times), max(times)
        else:
            import pyarrow.compute as pc

            mm = pc.min_max(table.column("ts")).as_py()
            lo, hi = mm["min"], mm["max"]
        if lo < self.lower or hi >= self.upper:
            bad = lo if lo < self.lower else hi
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
        """Hand the buffered rows to an upload (never waits, never fails)."""
        if not self._tables:
            return
        table = sort_updates(pa.concat_tables(self._tables))
        self._tables, self._buffered = [], 0
        key = part_key(self.shard_id)
        self._slots.append(_Slot(key, table, self._submit(key, table)))

    def _submit(self, key: str, table: pa.Table) -> Future[PartRef]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.config.upload_parallelism)
        return self._pool.submit(self._upload, key, table)

    def _settle(self, slot: _Slot) -> None:
        """Wait for ``slot``'s upload (starting it again if an earlier one failed); raise if it fails.

        A failed upload keeps its rows, and the next call uploads them again.
        """
        if slot.ref is not None:
            return
        if slot.future is None and self._pool is None:
            assert slot.table is not None  # a slot keeps its rows until uploaded
            slot.ref = self._upload(slot.key, slot.table)  # (raises with the rows kept, to upload again)
            slot.table = None
            return
        if slot.future is None:
            assert slot.table is not None  # a slot keeps its rows until uploaded
            slot.future = self._submit(slot.key, slot.table)
        try:
            slot.ref = slot.future.result()
        except BaseException:
            slot.future = None  # to be uploaded again by the next attempt
            raise
        slot.table = None  # uploaded: the rows need not stay in memory

    def _make_room(self) -> None:
        """Bound the bytes held: settle the oldest uploads while too many are unsettled.

        Called before rows are accepted, so a failure here adds nothing.
        """
        open_slots = [s for s in self._slots if s.ref is None]
        while len(open_slots) >= self.config.upload_parallelism:
            self._settle(open_slots.pop(0))

    def _upload(self, key: str, table: pa.Table) -> PartRef:
        """Write one part, retrying storage failures until ``retry_deadline_s`` (as every persist write does).

        Every attempt writes the slot's own key, so an attempt that landed
        but reported a failure is overwritten, not leaked.
        """
        return retry_storage(lambda: write_part(self.blob, self.shard_id, table, key), self.config.retry_deadline_s)

    def finish(self) -> Batch:
        """Flush what is buffered, wait for every upload, and return the batch.

        On a storage failure the builder stays whole: call ``finish`` again.
        """
        if self._result is not None:
            return self._result
        if not self._slots and not self._tables and 0 < len(self._rows) <= SMALL_TABLE_ROWS:
            small = self._finish_small()
            if small is not None:
                return small
        self._take_rows()
        if not self._slots and self._tables:
            table = sort_updates(pa.concat_tables(self._tables))
            # (an encoding is about as big as the buffers: skip encoding what cannot fit)
            if table.nbytes <= 2 * self.inline_max_bytes:
                inline = encode_inline(table)
                if len(inline) <= self.inline_max_bytes:
                    self._tables, self._buffered = [], 0
                    return self._done((Run(inline=inline, rows=table.num_rows),))
            # One part in all: uploaded by this thread (no pool to start), rows kept until it lands.
            self._tables, self._buffered = [], 0
            self._slots.append(_Slot(part_key(self.shard_id), table, None))
        else:
            self._flush()
        for slot in self._slots:
            self._settle(slot)
        refs = tuple(s.ref for s in self._slots if s.ref is not None)
        return self._done((Run(parts=refs, rows=sum(r.rows for r in refs)),) if refs else ())

    def _finish_small(self) -> Batch | None:
        """The batch of a few buffered rows, inline, sorted in Python (None: not this way).

        The same batch as the general path (rows sorted by key, val and time,
        inline), without the Arrow calls whose start-up costs more than a few
        rows take (concatenating, sorting): only for schemas whose key and
        val types order alike in Python and Arrow (integers, strings, binary,
        booleans; a null compared with a value raises TypeError, so nulls
        take the general path), and only when the encoding fits inline.
        """
        rows = self._rows
        if len(rows) > 1:
            if not _sorts_in_python(self.schema):
                return None
            try:
                rows = sorted(rows, key=_update_order)
            except (TypeError, ValueError, IndexError):
                return None  # (a malformed or null-holding update: the general path checks and sorts it)
        table = rows_to_table(self.schema, rows)
        self._check_times(table)
        inline = encode_inline(table)  # (a few rows: encoded before their size is known, which costs as much)
        if len(inline) > self.inline_max_bytes:
            return None
        self._rows = []
        self._count += table.num_rows
        return self._done((Run(inline=inline, rows=table.num_rows),))

    def _done(self, runs: tuple[Run, ...]) -> Batch:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._slots = []
        self._result = Batch(self.shard_id, self.id, self.lower, self.upper, runs, self.schema.to_text())
        return self._result


def _update_order(update: Any) -> tuple[Any, ...]:
    """An update's place in a part: by key, val, then time (:func:`persist._internal.parts.sort_updates`)."""
    (key, val), ts, _diff = update
    return (key, val, ts)


def _sorts_in_python(schema: Schema) -> bool:
    """Whether Python orders the schema's key and val values as Arrow's sort does (cached on the schema)."""
    cached = schema.__dict__.get("_sorts_in_python")
    if cached is None:
        cached = all(exact_key_type(f.type) for f in (*schema.key, *schema.val))
        object.__setattr__(schema, "_sorts_in_python", cached)  # (immutable: as its text)
    return bool(cached)


K = TypeVar("K")

FanOut = Callable[[Callable[[BatchBuilder], Batch], Sequence[BatchBuilder]], Sequence["Batch | BaseException"]]
"""Runs a function of each builder at once; each result in its place, or the exception its call raised."""


def _own_threads(fn: Callable[[BatchBuilder], Batch], builders: Sequence[BatchBuilder]) -> list[Batch | BaseException]:
    """The default :data:`FanOut`: threads of its own (at most 8), or the calling thread for one builder."""

    def call(b: BatchBuilder) -> Batch | BaseException:
        try:
            return fn(b)
        except Exception as e:  # noqa: BLE001 - handed to the caller in its place
            return e

    if len(builders) <= 1:
        return [call(b) for b in builders]
    with ThreadPoolExecutor(max_workers=min(8, len(builders))) as threads:
        return list(threads.map(call, builders))


def finish_all(
    builders: Mapping[K, BatchBuilder], fan_out: FanOut | None = None
) -> tuple[dict[K, Batch], BaseException | None]:
    """Finish every builder at once; the batches of those that finished (by key), and the first failure.

    Every builder has its try before anything is raised, so a caller can
    keep the finished batches (and their parts) and call again for the ones
    that failed (a failed ``finish`` leaves its builder whole). ``fan_out``
    runs the finishes (default: threads of their own); the first failure is
    the one of the first key, in ``builders``' order, that failed.
    """
    keys = list(builders)
    results = (fan_out or _own_threads)(lambda b: b.finish(), [builders[k] for k in keys])
    done: dict[K, Batch] = {}
    failure: BaseException | None = None
    for k, res in zip(keys, results, strict=True):
        if isinstance(res, BaseException):
            failure = failure or res
        else:
            done[k] = res
    return done, failure


__all__ = ["Batch", "BatchBuilder", "CLOSED", "FanOut", "finish_all"]
