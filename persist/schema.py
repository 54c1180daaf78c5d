"""Identifiers and schemas of shards, and validation of updates against them.

A shard holds updates ``((key, val), ts, diff)``. ``key`` and ``val`` are
Python tuples in the order of the fields of ``Schema.key`` and ``Schema.val``;
``ts`` is an unsigned 64-bit int and ``diff`` a signed 64-bit int. In Parquet
parts the key and val fields become columns of the same names, followed by
``ts`` (uint64) and ``diff`` (int64).
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa

from persist._internal.ids import random_hex
from persist.errors import InvalidUsage, SchemaMismatch

TS_MAX = 2**64 - 1
CLOSED = 2**64
"""The upper of a shard closed for good: past every timestamp."""
DIFF_MIN, DIFF_MAX = -(2**63), 2**63 - 1
RESERVED = ("ts", "diff")

_SHARD_RE = re.compile(r"s[0-9a-f]{32}")


@dataclass(frozen=True, order=True)
class ShardId:
    """A shard's id: ``s`` followed by 32 hex digits.

    >>> sid = ShardId.new()
    >>> ShardId.parse(str(sid)) == sid
    True
    """

    value: str

    @staticmethod
    def new() -> ShardId:
        return ShardId("s" + random_hex())

    @staticmethod
    def parse(text: str) -> ShardId:
        if not isinstance(text, str) or not _SHARD_RE.fullmatch(text):
            raise InvalidUsage(
                f"invalid shard id {text!r}: expected 's' followed by 32 lowercase hex "
                f"digits, as made by ShardId.new()"
            )
        return ShardId(text)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, eq=False)
class Schema:
    """The key and val schemas of a shard.

    >>> s = Schema(key=pa.schema([("id", pa.int64())]), val=pa.schema([("name", pa.string())]))
    >>> s.arrow.names
    ['id', 'name', 'ts', 'diff']
    """

    key: pa.Schema
    val: pa.Schema

    def __post_init__(self) -> None:
        if not isinstance(self.key, pa.Schema) or not isinstance(self.val, pa.Schema):
            raise InvalidUsage("Schema(key=..., val=...) takes two pyarrow.Schema objects")
        names = list(self.key.names) + list(self.val.names)
        if len(set(names)) != len(names):
            raise InvalidUsage(f"key and val field names must be distinct, got {names}")
        bad = [n for n in names if n in RESERVED]
        if bad:
            raise InvalidUsage(f"field names {bad} are reserved for the update time and diff; rename them")

    @property
    def arrow(self) -> pa.Schema:
        """The schema of a part: key fields, val fields, ``ts``, ``diff``."""
        cached = self.__dict__.get("_arrow")
        if cached is None:
            cached = pa.schema(
                list(self.key) + list(self.val) + [pa.field("ts", pa.uint64()), pa.field("diff", pa.int64())]
            )
            object.__setattr__(self, "_arrow", cached)  # (immutable: kept, as the text below)
        return cast(pa.Schema, cached)

    @property
    def key_names(self) -> list[str]:
        return list(self.key.names)

    @property
    def val_names(self) -> list[str]:
        return list(self.val.names)

    def to_text(self) -> str:
        """A stable serialization (base64 of Arrow IPC schemas)."""
        cached = self.__dict__.get("_text")
        if cached is None:
            k = base64.b64encode(self.key.serialize().to_pybytes()).decode()
            v = base64.b64encode(self.val.serialize().to_pybytes()).decode()
            cached = f"{k}.{v}"
            object.__setattr__(self, "_text", cached)
        return cast(str, cached)

    @staticmethod
    def from_text(text: str) -> Schema:
        k, v = text.split(".")
        return Schema(
            key=pa.ipc.read_schema(pa.py_buffer(base64.b64decode(k))),
            val=pa.ipc.read_schema(pa.py_buffer(base64.b64decode(v))),
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and self.key.equals(other.key) and self.val.equals(other.val)

    def __hash__(self) -> int:
        return hash(self.to_text())

    def describe(self) -> str:
        cached = self.__dict__.get("_describe")
        if cached is None:
            key = ", ".join(f"{f.name}: {f.type}" for f in self.key)
            val = ", ".join(f"{f.name}: {f.type}" for f in self.val)
            cached = f"key({key}) val({val})"
            object.__setattr__(self, "_describe", cached)
        return cast(str, cached)


def schema_fingerprint(schema_text: str) -> str:
    """A short, stable name of a schema (its serialized text), for batches to carry.

    A fingerprint maps to itself, so either form may be passed.
    """
    if schema_text.startswith("fp:"):
        return schema_text
    return "fp:" + hashlib.sha256(schema_text.encode()).hexdigest()[:24]


def check_ts(ts: object, what: str = "timestamp") -> int:
    """``ts`` as an int if it is a valid u64 timestamp, else InvalidUsage."""
    if isinstance(ts, bool) or not isinstance(ts, int) or not 0 <= ts <= TS_MAX:
        raise InvalidUsage(f"{what} must be an int in [0, 2**64), got {ts!r}")
    return ts


def check_upper(upper: object, what: str = "upper") -> int:
    """Like check_ts, but also allows CLOSED (2**64): a frontier past every time."""
    if isinstance(upper, bool) or not isinstance(upper, int) or not 0 <= upper <= CLOSED:
        raise InvalidUsage(f"{what} must be an int in [0, 2**64], got {upper!r}")
    return upper


def rows_to_table(schema: Schema, updates: list[Any]) -> pa.Table:
    """Updates ``((key, val), ts, diff)`` as an Arrow table of ``schema.arrow``.

    Raises SchemaMismatch naming the first bad update and field.
    """
    nk, nv = len(schema.key), len(schema.val)
    cols: list[list[Any]] = [[] for _ in range(nk + nv + 2)]
    for i, upd in enumerate(updates):
        try:
            (key, val), ts, diff = upd
        except (TypeError, ValueError):
            raise SchemaMismatch(
                f"update #{i} is {upd!r}: expected ((key_tuple, val_tuple), ts, diff)"
            ) from None
        if not isinstance(key, tuple) or len(key) != nk:
            raise SchemaMismatch(f"update #{i}: key {key!r} must be a tuple of {nk} fields ({schema.describe()})")
        if not isinstance(val, tuple) or len(val) != nv:
            raise SchemaMismatch(f"update #{i}: val {val!r} must be a tuple of {nv} fields ({schema.describe()})")
        if isinstance(diff, bool) or not isinstance(diff, int) or not DIFF_MIN <= diff <= DIFF_MAX:
            raise InvalidUsage(f"update #{i}: diff must be a signed 64-bit int, got {diff!r}")
        check_ts(ts, f"update #{i} time")
        for j, x in enumerate(key):
            cols[j].append(x)
        for j, x in enumerate(val):
            cols[nk + j].append(x)
        cols[-2].append(ts)
        cols[-1].append(diff)
    arrays = []
    for field, col in zip(schema.arrow, cols, strict=True):
        try:
            arrays.append(pa.array(col, type=field.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as e:
            bad = _first_bad(col, field.type)
            raise SchemaMismatch(
                f"field {field.name!r} expects {field.type}, but update #{bad[0]} has {bad[1]!r}: {e}"
            ) from None
    return pa.Table.from_arrays(arrays, schema=schema.arrow)


def _first_bad(col: list[Any], typ: pa.DataType) -> tuple[int, object]:
    for i, x in enumerate(col):
        try:
            pa.array([x], type=typ)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
            return i, x
    return -1, None


def check_table(schema: Schema, table: pa.Table) -> pa.Table:
    """``table`` cast to ``schema.arrow`` (by column name), or SchemaMismatch."""
    want = schema.arrow
    missing = [n for n in want.names if n not in table.column_names]
    extra = [n for n in table.column_names if n not in want.names]
    if missing or extra:
        raise SchemaMismatch(
            f"columns do not match the shard schema {schema.describe()} (+ ts, diff): "
            f"missing {missing}, unexpected {extra}"
        )
    table = table.select(want.names)
    if table.schema.equals(want):
        return table  # (the cast would change nothing: a few columns cost a one-row insert 0.3 ms of CPU)
    try:
        return table.cast(want)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        raise SchemaMismatch(f"columns cannot be converted to the shard schema {schema.describe()}: {e}") from None


def _fits(x: object, typ: pa.DataType) -> bool:
    """A quick check that ``x`` is a value of Arrow type ``typ``; unknown types ask Arrow."""
    if x is None:
        return True
    if pa.types.is_boolean(typ):
        return isinstance(x, bool)
    if pa.types.is_integer(typ):
        if isinstance(x, bool) or not isinstance(x, int):
            return False
        bits = typ.bit_width
        lo, hi = (0, 2**bits - 1) if pa.types.is_unsigned_integer(typ) else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        return bool(lo <= x <= hi)  # bool(): bounds from pyarrow's bit_width are Any to mypy
    if pa.types.is_floating(typ):
        return isinstance(x, (int, float)) and not isinstance(x, bool)
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return isinstance(x, str)
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        return isinstance(x, (bytes, bytearray))
    try:
        pa.array([x], type=typ)
        return True
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        return False


def check_row(schema: Schema, key: object, val: object) -> None:
    """SchemaMismatch unless ``key`` and ``val`` are tuples matching the schema's fields."""
    for what, row, fields in (("key", key, schema.key), ("val", val, schema.val)):
        if not isinstance(row, tuple) or len(row) != len(fields):
            raise SchemaMismatch(
                f"{what} {row!r} must be a tuple of {len(fields)} field(s); the shard schema is {schema.describe()}"
            )
        for x, f in zip(row, fields, strict=True):
            if not _fits(x, f.type) or (x is None and not f.nullable):
                raise SchemaMismatch(
                    f"{what} field {f.name!r} expects {f.type}, got {x!r}; the shard schema is {schema.describe()}"
                )
