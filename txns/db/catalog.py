"""The catalog: table name -> data shard, schema, creation time, retention.

The catalog is itself a data shard registered in the database's txns shard,
so DDL is an ordinary write in a transaction: ``create_table`` adds a row,
``drop_table`` retracts it, ``rename_table`` retracts it and adds it back
under the new name (same data shard), all in the same single conditional
write as the transaction's data. Reading the catalog at a time gives the
tables as they were then: ``db.tables(as_of=t)`` and reads of a table as of
a time before its drop.

Every column is in the key (the val is empty), so each row is one table::

    name: string, data_id: string, schema: string (base64 Arrow IPC),
    created_ms: int64, retention_ms: int64 (null: the database's default)

A keyed table's primary key rides in the stored schema's metadata (key
``txns.primary_key``, a JSON list of column names); ``TableEntry.schema`` is
the user's schema without it, ``TableEntry.primary_key`` the key. Tables of
older databases (no such metadata) are unkeyed, so the catalog's own shard
schema is unchanged.

Invariants:

- At any time at most one row per name has a positive count (DDL commits
  validate against the catalog at the exact time below their commit time,
  see :mod:`txns.db.committer`).
- A table's data shard never changes: rename keeps it; a new table (even
  with a dropped table's name) gets a fresh shard.
- A user table's columns are the data shard's key; its val is empty. Rows
  are a multiset: the shard's ``diff`` is each row's multiplicity. A keyed
  table's shard key starts with its primary key columns (so parts, sorted
  by the shard key, are sorted by primary key); the user's column order is
  the catalog schema's.
- :class:`Catalog` caches a view by the catalog's latest write at or below
  the time read (the catalog is the same at every time from one write to
  the next), so a latest read of a table costs no catalog read unless DDL
  committed; a view is cached only from the catalog as read, or as a DDL
  commit validated it at exactly its commit time.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

import pyarrow as pa

from persist import InvalidUsage, PersistClient, ReadBelowSince, Schema, SnapshotPlan, replan
from txns.db import clock
from txns.db.errors import InvalidPrimaryKey, InvalidTableName, TableNotFound
from txns.db.scan import PlanReader, read_table
from txns.errors import NotRegistered
from txns.handle import TxnsHandle
from txns.txn import Txn

T = TypeVar("T")

CATALOG_SCHEMA = Schema(
    key=pa.schema(
        [
            pa.field("name", pa.string(), nullable=False),
            pa.field("data_id", pa.string(), nullable=False),
            pa.field("schema", pa.string(), nullable=False),
            pa.field("created_ms", pa.int64(), nullable=False),
            pa.field("retention_ms", pa.int64(), nullable=True),
        ]
    ),
    val=pa.schema([]),
)

PRIMARY_KEY_META = b"txns.primary_key"
"""The stored schema's metadata key holding a keyed table's primary key (a JSON list of column names)."""

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")  # fullmatch only: ``$`` would pass a final newline
RESERVED_COLUMNS = ("ts", "diff")

SYSTEM_PREFIX = "txns_"
"""Table names starting with this (in any case) are the library's own tables: ``txns_intents``,
``txns_outcomes``, ``txns_resolver`` (``db.submit``), ``txns_sinks`` (Spark sinks). Anyone may
read them and set their retention; only the library creates, writes, drops or renames them."""


def check_name(name: object, what: str = "table name") -> str:
    """``name`` if it is a valid table name, else InvalidTableName saying what is allowed."""
    if not isinstance(name, str):
        raise InvalidTableName(f"a {what} must be a str, got {type(name).__name__} {name!r}")
    if not _NAME_RE.fullmatch(name):
        raise InvalidTableName(
            f"invalid {what} {name!r}: use 1-128 characters, letters, digits and '_', "
            f"not starting with a digit (e.g. 'orders', 'daily_totals_2024')"
        )
    return name


def is_system_name(name: object) -> bool:
    """Whether ``name`` is a system table's name (see :data:`SYSTEM_PREFIX`)."""
    return isinstance(name, str) and name[: len(SYSTEM_PREFIX)].lower() == SYSTEM_PREFIX


def check_writable(name: object, action: str, allowed: frozenset[str] = frozenset()) -> None:
    """InvalidTableName if ``name`` is a system table's and not in ``allowed`` (the library's own writes).

    ``action`` says what was refused (``"create"``, ``"write to"``, ``"drop"``...).
    """
    if is_system_name(name) and name not in allowed:
        raise InvalidTableName(
            f"cannot {action} table {name!r}: names starting with {SYSTEM_PREFIX!r} are reserved for the "
            f"library's own tables (it alone creates, writes and drops them; they are readable, and "
            f"set_table_retention works on them); pick another name"
        )


def _supported(t: pa.DataType) -> bool:
    supported: bool = (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_boolean(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
        or pa.types.is_decimal(t)
        or pa.types.is_date(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_time(t)
        or pa.types.is_duration(t)
    )
    return supported


def check_schema(schema: object) -> pa.Schema:
    """``schema`` if it is a valid table schema (a flat ``pyarrow.Schema``), else InvalidUsage."""
    if not isinstance(schema, pa.Schema):
        raise InvalidUsage(
            f"a table schema must be a pyarrow.Schema, got {type(schema).__name__}; "
            f"e.g. pa.schema([('account', pa.string()), ('balance', pa.int64())])"
        )
    if len(schema) == 0:
        raise InvalidUsage("a table needs at least one column")
    names = list(schema.names)
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InvalidUsage(f"column names must be distinct; repeated: {dup}")
    bad = [n for n in names if n in RESERVED_COLUMNS]
    if bad:
        raise InvalidUsage(f"column names {bad} are reserved (changes() adds 'ts' and 'diff' columns); rename them")
    for f in schema:
        if not isinstance(f.name, str) or not f.name:
            raise InvalidUsage(f"column names must be non-empty strings, got {f.name!r}")
        if not _supported(f.type):
            raise InvalidUsage(
                f"column {f.name!r} has type {f.type}, which tables do not support; use a flat type "
                f"(integers, floats, bool, string, binary, decimal, date, time, timestamp, duration)"
            )
    return pa.schema(list(schema))  # drop schema metadata: it is not part of the table's identity


def check_primary_key(schema: pa.Schema, primary_key: object) -> tuple[str, ...] | None:
    """``primary_key`` (None, or a list of ``schema``'s column names) as a tuple, else InvalidPrimaryKey.

    The names must be distinct existing columns, at least one, none of a
    floating-point type (float equality is not exact: NaN, -0.0).
    """
    if primary_key is None:
        return None
    example = f"e.g. primary_key=[{schema.names[0]!r}]"
    if isinstance(primary_key, (str, bytes)) or not isinstance(primary_key, Sequence):
        raise InvalidPrimaryKey(
            f"primary_key must be a list of column names, {example}; got {type(primary_key).__name__} {primary_key!r}"
        )
    names = list(primary_key)
    if not names:
        raise InvalidPrimaryKey(f"primary_key must name at least one column, {example} (or be None for no key)")
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise InvalidPrimaryKey(f"primary_key must be a list of column names (str), got {bad[0]!r} in {names!r}")
    unknown = [n for n in names if n not in schema.names]
    if unknown:
        raise InvalidPrimaryKey(f"primary_key names unknown column(s) {unknown}; the table has {list(schema.names)}")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InvalidPrimaryKey(f"primary_key repeats column(s) {dup}: {names}")
    floats = [n for n in names if pa.types.is_floating(schema.field(n).type)]
    if floats:
        raise InvalidPrimaryKey(
            f"primary key column(s) {floats} are floating-point; float equality is not exact (NaN, -0.0): "
            f"key on an integer, string, decimal, date or timestamp column instead"
        )
    return tuple(names)


def schema_to_text(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def schema_from_text(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def data_schema(schema: pa.Schema, primary_key: Sequence[str] | None = None) -> Schema:
    """The data shard schema of a table: every column in the key (the primary key's first), an empty val."""
    if primary_key:
        first = [schema.field(n) for n in primary_key]
        schema = pa.schema([*first, *(f for f in schema if f.name not in primary_key)])
    return Schema(key=schema, val=pa.schema([]))


@dataclass(frozen=True)
class TableEntry:
    """One table in the catalog. ``schema`` is the user's (no metadata); ``primary_key`` None: unkeyed."""

    name: str
    data_id: str
    schema: pa.Schema
    created_ms: int
    retention_ms: int | None = None
    primary_key: tuple[str, ...] | None = None

    def stored_schema(self) -> pa.Schema:
        """The schema as the catalog stores it: the primary key (if any) in its metadata."""
        if self.primary_key is None:
            return self.schema
        return self.schema.with_metadata({PRIMARY_KEY_META: json.dumps(list(self.primary_key)).encode()})

    def key(self) -> tuple[Any, ...]:
        """The catalog row (computed once: an entry is immutable)."""
        cached = self.__dict__.get("_key")
        if cached is None:
            text = schema_to_text(self.stored_schema())
            cached = (self.name, self.data_id, text, self.created_ms, self.retention_ms)
            object.__setattr__(self, "_key", cached)
        return cast(tuple[Any, ...], cached)

    @staticmethod
    def from_key(key: tuple[Any, ...]) -> TableEntry:
        name, data_id, text, created_ms, retention_ms = key
        schema = schema_from_text(text)
        meta = schema.metadata or {}
        pk = tuple(json.loads(meta[PRIMARY_KEY_META])) if PRIMARY_KEY_META in meta else None
        if meta:
            schema = schema.remove_metadata()
        return TableEntry(name, data_id, schema, created_ms, retention_ms, pk)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TableEntry) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())


@dataclass(frozen=True)
class CatalogView:
    """The catalog as of one time: live tables by name."""

    as_of: int
    tables: dict[str, TableEntry]

    @staticmethod
    def from_updates(as_of: int, updates: list[Any]) -> CatalogView:
        """From a consolidated snapshot of the catalog shard (``((key, ()), ts, diff)``)."""
        tables: dict[str, TableEntry] = {}
        for (key, _val), _ts, diff in updates:
            if diff > 0:
                e = TableEntry.from_key(key)
                tables[e.name] = e
        return CatalogView(as_of, tables)

    def by_data_id(self) -> dict[str, TableEntry]:
        return {e.data_id: e for e in self.tables.values()}


class LogReads(Protocol):
    """What the catalog needs from the read planner (:class:`txns.db.planner.ReadPlanner`)."""

    def log_plan(self, data_id: str, ts: int) -> SnapshotPlan | None: ...

    def read_checked(self, data_id: str, read: Callable[[], T]) -> T: ...

    def plan_reader(self, plan: SnapshotPlan, cols: list[str], filter: Any = None) -> PlanReader: ...


CACHED_VIEWS = 64
"""The most catalog views :class:`Catalog` keeps (it forgets them all past that)."""


class Catalog:
    """The database's catalog: its views by time, cached, its registration, and table lookups.

    Owns the cache of views (``_views``, under ``_cache_lock``) and the
    shortest table retention seen in a view. Uses the txns handle only
    under ``handle_lock``.
    """

    def __init__(
        self,
        client: PersistClient,
        handle: TxnsHandle,
        handle_lock: threading.RLock,
        catalog_id: str,
        created_ms: int,
        url: str,
        reads: LogReads,
    ) -> None:
        self.client = client
        self.handle = handle
        self.catalog_id = catalog_id
        self._created_ms = created_ms
        self._url = url  # (redacted)
        self._lock = handle_lock
        self._cache_lock = threading.Lock()
        self._views: dict[tuple[str, int], CatalogView] = {}
        #: the shortest table retention seen in a catalog view (None: none seen)
        self.min_table_retention_ms: int | None = None
        self._reads = reads

    def register_in(self, txn: Txn) -> None:
        """Have ``txn``, which writes the catalog, register it in the same write unless it is registered.

        The catalog is registered by the first commit that writes it (a new
        database's first DDL). A stale view costs nothing: registering an
        already registered shard is a no-op at commit time.
        """
        d = self.catalog_id
        if d in self.handle.cache.registered_now():
            return
        try:
            txn.register(d)
        except NotRegistered:  # its creator crashed before recording the catalog's schema
            self.client.register_schema(d, CATALOG_SCHEMA)
            txn.register(d)

    def _registered_ts(self) -> int | None:
        regs = self.handle.cache.registrations.get(self.catalog_id)
        return regs[0].register_ts if regs else None

    def at(self, ts: int) -> CatalogView:
        """The catalog at timestamp ``ts`` (already resolved)."""
        with self._lock:
            cache = self.handle.cache
            born = clock.ts_of_ms(self._created_ms)
            if ts < born:
                raise ReadBelowSince(
                    f"as_of {clock.describe(ts)} is before the database at {self._url!r} was created "
                    f"(at {clock.describe(born)})",
                    born,
                )
            created = self._registered_ts()
            if created is None and ts >= cache.frontier:
                cache.sync()
                created = self._registered_ts()
            if created is None or ts < created:
                return CatalogView(ts, {})  # no DDL yet at ts: the first one registers the catalog
            since = self.handle.data_writer(self.catalog_id).shard.state().since
            if ts < since:
                raise self._below(ts, since)
            # The catalog is the same at every time from its latest write up to
            # its next one: cache by that write (or, with none since the txns
            # cache's since, by that since).
            key: tuple[str, int] | None = None
            if cache.since <= ts < cache.frontier:
                w = cache.latest_write_le(self.catalog_id, ts)
                key = ("w", w) if w is not None else ("since", cache.since)
                with self._cache_lock:
                    hit = self._views.get(key)
                if hit is not None:
                    return CatalogView(ts, hit.tables)
                if w is None and created is not None and created >= cache.since:
                    # Registered within what the cache knows and never written up to ts:
                    # empty, without a read (a new database's first transaction).
                    return CatalogView(ts, {})
            try:
                view = self.read(ts)
            except NotRegistered:
                raise ReadBelowSince(
                    f"as_of {clock.describe(ts)} is before the database at {self._url!r} was created", created or 0
                ) from None
            except ReadBelowSince as e:
                raise self._below(ts, e.since) from None
            if key is not None:
                self._remember(key, view)
            return view

    def entry(self, name: str, ts: int) -> TableEntry:
        """The catalog entry of table ``name`` at ``ts``, or TableNotFound saying what exists."""
        view = self.at(ts)
        e = view.tables.get(name)
        if e is None:
            known = sorted(view.tables)
            raise TableNotFound(
                f"no table {name!r} in the database at {self._url!r} as of {clock.describe(ts)}; "
                f"tables then: {known if known else 'none'}"
                + ("" if known else "; create one with db.create_table(name, schema)")
            )
        return e

    def read(self, ts: int) -> CatalogView:
        """Read the catalog shard at ``ts`` (without writing anything when the txns cache allows); not cached."""
        d = self.catalog_id
        cols = list(CATALOG_SCHEMA.key_names)
        reads = self._reads

        def read() -> CatalogView:
            plan = reads.log_plan(d, ts)
            if plan is None:
                return CatalogView.from_updates(ts, self.handle.snapshot(d, ts))
            rows = reads.read_checked(d, lambda: read_table(reads.plan_reader(plan, cols)))
            entries = [TableEntry.from_key(tuple(r[c] for c in cols)) for r in rows.to_pylist()]
            return CatalogView(ts, {e.name: e for e in entries})

        return replan(read)

    def committed(self, ts: int, live: dict[str, TableEntry]) -> None:
        """Cache ``live`` as the catalog at ``ts``: the one a DDL commit validated, with its changes.

        Exact: a DDL commit expects exactly the upper it validated at, so no
        commit lies between; and only when the commit wrote the catalog (a
        transaction may create and drop a table again, writing nothing).
        """
        cache = self.handle.cache
        if cache.since <= ts < cache.frontier and cache.latest_write_le(self.catalog_id, ts) == ts:
            self._remember(("w", ts), CatalogView(ts, dict(live)))

    def forget_views(self) -> None:
        """Drop every cached view (after compaction moved the catalog's since)."""
        with self._cache_lock:
            self._views.clear()

    def cached_views(self) -> int:
        """How many views are cached (diagnostics)."""
        with self._cache_lock:
            return len(self._views)

    def _remember(self, key: tuple[str, int], view: CatalogView) -> None:
        rets = [e.retention_ms for e in view.tables.values() if e.retention_ms is not None]
        with self._cache_lock:
            if len(self._views) > CACHED_VIEWS:
                self._views.clear()
            self._views[key] = view
            if rets:
                low = min(rets)
                cur = self.min_table_retention_ms
                self.min_table_retention_ms = low if cur is None else min(cur, low)

    def _below(self, ts: int, since: int) -> ReadBelowSince:
        return ReadBelowSince(
            f"as_of {clock.describe(ts)} is before the retained history of the database at {self._url!r}; "
            f"the earliest readable time is {clock.describe(since)}",
            since,
        )


__all__ = [
    "CACHED_VIEWS",
    "CATALOG_SCHEMA",
    "Catalog",
    "LogReads",
    "PRIMARY_KEY_META",
    "SYSTEM_PREFIX",
    "CatalogView",
    "TableEntry",
    "check_name",
    "check_primary_key",
    "check_schema",
    "check_writable",
    "data_schema",
    "is_system_name",
    "schema_from_text",
    "schema_to_text",
]
