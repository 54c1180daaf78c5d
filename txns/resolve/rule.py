"""The relation, the resolution rule and the sequential reference model.

An intent row is ``(id, is_read, key, val)``:

- ``is_read`` true: the transaction ``id`` read ``key`` and saw ``val``; a null
  ``val`` means it saw the key absent.
- ``is_read`` false: the transaction means to write ``val`` to ``key``; a null
  ``val`` is a delete.

The rule, in id order: a transaction commits iff every one of its reads equals
the value of the latest write to that key by a *committed* transaction with a
smaller id (null if there is none, or if that write is a delete). The store is,
per key, the value of the latest committed write; a key whose latest committed
write is a delete (or that no committed transaction writes) is not in it.

:func:`sequential` is that rule run one transaction at a time: the model the
fixpoint (:mod:`txns.resolve.batch`) and the incremental resolver
(:mod:`txns.resolve.incremental`) are tested against.

>>> import pyarrow as pa
>>> t = pa.table({"id": [1, 2, 2, 3, 3], "is_read": [False, True, False, True, False],
...               "key": ["a", "a", "a", "a", "b"], "val": ["1", "1", "2", "1", "x"]})
>>> rollback, store = sequential(t)
>>> rollback["id"].to_pylist(), sorted(zip(store["key"].to_pylist(), store["val"].to_pylist()))
([3], [('a', '2')])
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

COLUMNS = ("id", "is_read", "key", "val")


@dataclass(frozen=True)
class Resolution:
    """What resolving a set of intents decides.

    ``rollback``: one column ``id``, the transactions that roll back, ascending.
    ``store``: columns ``key``, ``val``: the latest committed write per key
    (deleted keys left out), in no particular order.
    ``rounds``: rounds of the fixpoint until nothing changed (the last round is
    the one that found no change; an empty input takes 1).
    """

    rollback: pa.Table
    store: pa.Table
    rounds: int


def freeze(value: Any) -> Hashable:
    """A hashable stand-in for a Python value of an Arrow scalar (structs, lists, maps).

    >>> freeze({"table": "t", "key": [1, 2]})
    (('table', 't'), ('key', (1, 2)))
    """
    if isinstance(value, dict):
        return tuple((k, freeze(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    return value  # type: ignore[no-any-return]


def check(intents: pa.Table) -> pa.Table:
    """``intents`` with its four columns, one chunk each; ``ValueError`` if malformed.

    Malformed: a column missing, a null ``id``, ``is_read`` or ``key``, ``is_read``
    not boolean. (Duplicate ``(id, is_read, key)`` rows are checked where they are
    resolved.)

    >>> check(pa.table({"id": [1], "is_read": [False], "key": ["a"], "val": [None]})).num_rows
    1
    """
    missing = [c for c in COLUMNS if c not in intents.column_names]
    if missing:
        raise ValueError(f"intents lack column(s) {missing}; need {list(COLUMNS)}")
    t = intents.select(list(COLUMNS)).combine_chunks()
    if not pa.types.is_boolean(t.schema.field("is_read").type):
        raise ValueError(f"is_read must be boolean, not {t.schema.field('is_read').type}")
    for c in ("id", "is_read", "key"):
        if t[c].null_count:
            raise ValueError(f"intents.{c} has nulls")
    return t


def codes(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Dense int64 codes, equal iff the values are equal; null is -1.

    >>> codes(pa.array(["b", None, "a", "b"])).tolist()
    [0, -1, 1, 0]
    """
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    try:
        enc = pc.dictionary_encode(arr)
        return np.asarray(enc.indices.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
        seen: dict[Hashable, int] = {}
        out = np.empty(len(arr), dtype=np.int64)
        for i, v in enumerate(arr.to_pylist()):
            out[i] = -1 if v is None else seen.setdefault(freeze(v), len(seen))
        return out


def id_ranks(ids: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, pa.Array]:
    """(rank of each id among the distinct ids in ascending order, those distinct ids).

    >>> r, u = id_ranks(pa.array([30, 10, 30]))
    >>> r.tolist(), u.to_pylist()
    ([1, 0, 1], [10, 30])
    """
    uniq = pc.unique(ids)
    uniq = uniq.take(pc.sort_indices(uniq))
    rank = pc.index_in(ids, value_set=uniq)
    return np.asarray(rank.to_numpy(zero_copy_only=False), dtype=np.int64), uniq


def sequential(intents: pa.Table) -> tuple[pa.Table, pa.Table]:
    """The rule, one transaction at a time in id order: ``(rollback, store)`` as in :class:`Resolution`.

    A reference (quadratic in nothing, but pure Python): the resolvers must agree with it.

    >>> t = pa.table({"id": [2, 1], "is_read": [True, False], "key": ["k", "k"], "val": [None, "v"]})
    >>> sequential(t)[0]["id"].to_pylist()
    [2]
    """
    t = check(intents)
    txns: dict[Any, list[tuple[bool, Any, Any]]] = {}
    for i, r, k, v in zip(*(t[c].to_pylist() for c in COLUMNS), strict=True):
        txns.setdefault(i, []).append((r, k, v))
    committed: dict[Hashable, tuple[Any, Any]] = {}  # frozen key -> (key, val); val None = deleted
    rolled = []
    for i in sorted(txns):
        rows = txns[i]
        if all(freeze(committed.get(freeze(k), (k, None))[1]) == freeze(v) for r, k, v in rows if r):
            for r, k, v in rows:
                if not r:
                    committed[freeze(k)] = (k, v)
        else:
            rolled.append(i)
    live = [kv for kv in committed.values() if kv[1] is not None]
    rollback = pa.table({"id": pa.array(rolled, type=t.schema.field("id").type)})
    store = pa.table({
        "key": pa.array([k for k, _ in live], type=t.schema.field("key").type),
        "val": pa.array([v for _, v in live], type=t.schema.field("val").type),
    })
    return rollback, store
