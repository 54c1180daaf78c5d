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
  see ``Database._commit``).
- A table's data shard never changes: rename keeps it; a new table (even
  with a dropped table's name) gets a fresh shard.
- A user table's columns are the data shard's key; its val is empty. Rows
  are a multiset: the shard's ``diff`` is each row's multiplicity. A keyed
  table's shard key starts with its primary key columns (so parts, sorted
  by the shard key, are sorted by primary key); the user's column order is
  the catalog schema's.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa

from persist import InvalidUsage, Schema
from txns.db.errors import InvalidPrimaryKey, InvalidTableName

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
        raise InvalidUsage(
            f"column names {bad} are reserved (changes() adds 'ts' and 'diff' columns); rename them"
        )
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


__all__ = [
    "CATALOG_SCHEMA",
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
