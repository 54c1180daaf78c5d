"""PersistClient: the entry point. Opens a location by URL and hands out shard handles."""

from __future__ import annotations

import threading
import time
from typing import Any

from persist import metrics
from persist._internal.holds import PartHold, hold
from persist._internal.ids import random_hex
from persist._internal.machine import Machine
from persist._internal.parts import part_written_ms
from persist._internal.retry import retry_storage
from persist._internal.state import CriticalReaderState, ShardState
from persist.config import PersistConfig
from persist.errors import InvalidUsage, note_write, operation
from persist.read import ReadHandle, SinceHandle
from persist.schema import Schema, ShardId, check_upper
from persist.shard import ShardView
from persist.url import Location, open_location
from persist.write import WriteHandle


class PersistClient:
    """A connection to one location (``mem://``, ``file://`` or ``s3://``).

    >>> import pyarrow as pa
    >>> client = PersistClient.open("mem://doc-client")
    >>> sid = ShardId.new()
    >>> schema = Schema(key=pa.schema([("k", pa.int64())]), val=pa.schema([]))
    >>> w = client.open_writer(sid, schema)
    >>> w.compare_and_append([(((1,), ()), 3, 1)], 0, 5)
    >>> client.open_leased_reader(sid, schema).snapshot_and_fetch(4)
    [(((1,), ()), 4, 1)]
    """

    def __init__(self, location: Location, config: PersistConfig | None = None) -> None:
        self.location = location
        self.blob = location.blob
        self.consensus = location.consensus
        self.config = config or PersistConfig()
        self._machines: dict[str, Machine] = {}
        self._lock = threading.Lock()
        # Schemas this client was given, by their text: shard_schema returns them without decoding.
        self._schemas_by_text: dict[str, Schema] = {}

    @staticmethod
    def open(url: str, config: PersistConfig | None = None) -> PersistClient:
        """A client for the store at ``url``. See :func:`persist.url.open_location`.

        Transient storage failures while opening (the S3 bucket check) are
        retried until ``config.retry_deadline_s``; bad input (a malformed URL,
        a missing bucket, refused credentials) raises ``InvalidUsage`` at once.
        """
        config = config or PersistConfig()
        return PersistClient(retry_storage(lambda: open_location(url), config.retry_deadline_s), config)

    @property
    def url(self) -> str:
        return self.location.url

    def _machine(self, shard_id: ShardId | str) -> Machine:
        """The (shared, cached) state machine of a shard."""
        sid = str(_shard_id(shard_id))
        with self._lock:
            if sid not in self._machines:
                self._machines[sid] = Machine(self.consensus, sid, self.config)
            return self._machines[sid]

    def assume_new(self, shard_id: ShardId | str) -> None:
        """Take ``shard_id`` as a shard without any state, without reading it.

        Only for an id this process just made (``ShardId.new()``) and has not
        handed to anyone yet: nothing can have written it. Its first
        conditional write creates it (one that finds a state after all reads
        it and runs again, as always). A no-op once this client knows the shard.
        """
        self._machine(shard_id).assume_new()

    def shard(self, shard_id: ShardId | str) -> ShardView:
        """Read-only access to a shard's metadata (its since, upper and batches), followed by this client."""
        return ShardView(self.blob, self._machine(shard_id), self.config)

    def open_writer(self, shard_id: ShardId | str, schema: Schema, inline_max_bytes: int | None = None) -> WriteHandle:
        """A writer for ``shard_id``. Registers ``schema`` on first use; SchemaMismatch if it differs.

        ``inline_max_bytes`` overrides the config's threshold for this writer's batches.
        """
        _check_schema(schema)
        m = self._machine(shard_id)
        _check_against(m.state(), schema)
        self._know(schema, schema.to_text())
        return WriteHandle(self.blob, m, schema, self.config, inline_max_bytes)

    def register_schema(self, shard_id: ShardId | str, schema: Schema) -> None:
        """Record ``schema`` as the shard's schema (a no-op if it already is; SchemaMismatch if another)."""
        _check_schema(schema)
        text = schema.to_text()

        def transition(s: ShardState) -> tuple[None, bool]:
            return None, s.register_schema(text, schema.describe())

        self._machine(shard_id).apply(transition)
        self._know(schema, text)

    def _know(self, schema: Schema, text: str) -> None:
        known = self._schemas_by_text
        if len(known) >= _KNOWN_SCHEMAS_MAX:
            known.clear()
        known[text] = schema

    def shard_schema(self, shard_id: ShardId | str) -> Schema | None:
        """The shard's registered schema, or None if it has none yet."""
        m = self._machine(shard_id)
        text = m.state().schema or m.fetch().schema
        if not text:
            return None
        schema = self._schemas_by_text.get(text)  # (one this client holds with this text: the same schema)
        if schema is None:
            schema = Schema.from_text(text)
            self._know(schema, text)
        return schema

    def open_leased_reader(
        self, shard_id: ShardId | str, schema: Schema, *, critical_reader: str | None = None, init_upper: int = 0
    ) -> ReadHandle:
        """A reader holding the shard's since at its current value, with a lease.

        Also recorded in the same conditional write (a shard's opener needs
        no other): the shard's ``schema`` if it has none; ``critical_reader``
        (a critical since handle's id), registered at the current since with
        opaque 0 if it is not yet (get its handle with
        :meth:`open_critical_since`, which then writes nothing); and, when
        the shard's upper is still 0 and ``init_upper`` is above it, the
        upper moved to ``init_upper`` by an empty append.
        """
        _check_schema(schema)
        if critical_reader is not None and (not isinstance(critical_reader, str) or not critical_reader):
            raise InvalidUsage(f"critical reader id must be a non-empty string, got {critical_reader!r}")
        check_upper(init_upper, "init_upper")
        m = self._machine(shard_id)
        reader_id = "r" + random_hex()
        lease_ms = int(self.config.reader_lease_s * 1000)
        text = schema.to_text()

        def transition(s: ShardState) -> tuple[int, bool]:
            s.register_schema(text, schema.describe())
            now = self.config.clock_ms()
            if critical_reader is not None:
                s.register_critical_reader(critical_reader, 0)
            if init_upper > 0 and s.upper == 0:
                writer = "w" + random_hex()
                s.append(writer, writer, (), 0, init_upper, now, int(self.config.writer_lease_s * 1000))
            return s.add_leased_reader(reader_id, now, lease_ms), True

        since = m.apply(transition)
        return ReadHandle(self.blob, m, schema, self.config, reader_id, since)

    def open_critical_since(
        self, shard_id: ShardId | str, reader_id: str, opaque: int, schema: Schema | None = None
    ) -> SinceHandle:
        """The critical since handle ``reader_id``, registered (at the current since) if new.

        An existing registration keeps its since and opaque; the handle reports them.
        ``schema``: also record the shard's schema (as :meth:`register_schema`), in
        the same conditional write; nothing is written when both are there already.
        """
        if not isinstance(reader_id, str) or not reader_id:
            raise InvalidUsage(f"critical reader id must be a non-empty string, got {reader_id!r}")
        if isinstance(opaque, bool) or not isinstance(opaque, int):
            raise InvalidUsage(f"opaque must be an int, got {opaque!r}")
        if schema is not None:
            _check_schema(schema)
        text = schema.to_text() if schema is not None else None
        m = self._machine(shard_id)

        def transition(s: ShardState) -> tuple[CriticalReaderState, bool]:
            changed = schema is not None and text is not None and s.register_schema(text, schema.describe())
            cur, added = s.register_critical_reader(reader_id, opaque)
            return cur, changed or added

        cur = m.apply(transition)
        return SinceHandle(m, reader_id, cur.since, cur.opaque)

    def tombstone(self, shard_id: ShardId | str) -> bool:
        """Retire a shard for good: since and upper past every time, every hold and batch dropped.

        Its parts become garbage, deleted after ``part_grace_s`` by the next
        ``collect_garbage`` (so reads planned before this can finish); reads
        raise ``ReadBelowSince`` and appends ``UpperMismatch`` afterwards.
        For data nobody may read any more (the txns database calls it for a
        dropped table once the drop is older than the table's retention).
        Idempotent; returns whether this call retired it.
        """
        m = self._machine(shard_id)
        now = self.config.clock_ms()

        def transition(s: ShardState) -> tuple[bool, bool]:
            changed = s.tombstone(now)
            return changed, changed

        return m.apply(transition)

    def inspect(self, shard_id: ShardId | str) -> dict[str, Any]:
        """A summary of a shard's state, for tools (read fresh from storage)."""
        s = self._machine(shard_id).fetch()
        return {
            "shard_id": s.shard_id,
            "seqno": s.seqno,
            "since": s.since,
            "upper": s.upper,
            "batches": len(s.batches),
            "rows": sum(b.rows for b in s.batches),
            "parts": len(s.part_keys()),
            "bytes": sum(b.size for b in s.batches),
            "writers": len(s.writers),
            "leased_readers": len(s.leased),
            "critical_readers": {k: {"since": v.since, "opaque": v.opaque} for k, v in s.critical.items()},
            "garbage_parts": len(s.garbage),
        }

    def hold_parts(self, shard_id: ShardId | str, for_s: float) -> PartHold:
        """Keep the parts compaction retires from now on for ``for_s`` seconds (one PUT).

        A read planned after this call can read every part its plan names
        until the hold expires, however long compaction goes on meanwhile
        (it merges as usual; only the deletion of retired parts waits). Call
        ``hold.release(client.blob)`` when the read is done, or let it
        expire. See :mod:`persist._internal.holds`.
        """
        if isinstance(for_s, bool) or not isinstance(for_s, (int, float)) or not 0 < for_s <= 7 * 86400:
            raise InvalidUsage(f"for_s must be a number of seconds in (0, 604800], got {for_s!r}")
        return hold(self.blob, str(_shard_id(shard_id)), float(for_s), self.config.clock_ms())

    def gc_leaked(self, shard_id: ShardId | str, older_than_s: float, keep: set[str] | None = None) -> int:
        """Delete parts of the shard that no state references and that are older than ``older_than_s``.

        Parts of batches written but not yet appended are unreferenced too:
        pass their keys in ``keep`` (the txns layer passes every committed,
        unapplied batch), and choose ``older_than_s`` longer than any write
        takes. Returns how many parts were deleted.
        """
        with operation("gc_leaked"):
            return self._gc_leaked(str(_shard_id(shard_id)), older_than_s, keep)

    def _gc_leaked(self, sid: str, older_than_s: float, keep: set[str] | None) -> int:
        state = self._machine(sid).fetch()
        live = state.part_keys() | {k for k, _ in state.garbage} | (keep or set())
        # part keys carry the wall-clock time they were written at (parts.part_key)
        horizon = int(time.time() * 1000) - int(older_than_s * 1000)
        leaked = [
            key
            for key in self.blob.list_keys(f"{sid}/parts/")
            if key not in live and (written := part_written_ms(key)) is not None and written <= horizon
        ]
        if leaked:
            note_write()
            self.blob.delete_many(leaked)  # (one request per 1,000 parts on S3)
            metrics.count(metrics.LEAKED_PARTS_DELETED, len(leaked))
        return len(leaked)


_KNOWN_SCHEMAS_MAX = 1024
"""How many schemas (by text) a client keeps for :meth:`PersistClient.shard_schema`."""


def _shard_id(shard_id: ShardId | str) -> ShardId:
    if isinstance(shard_id, ShardId):
        return shard_id
    return ShardId.parse(shard_id)


def _check_schema(schema: Schema) -> None:
    if not isinstance(schema, Schema):
        raise InvalidUsage(f"expected a persist.Schema, got {type(schema).__name__}")


def _check_against(state: ShardState, schema: Schema) -> None:
    if state.schema is not None:
        state.register_schema(schema.to_text(), schema.describe())
