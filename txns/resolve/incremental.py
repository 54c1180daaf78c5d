"""The incremental resolver: the fixpoint's answer (and its round count) kept up to date as intents change.

State, per transaction: its reads and writes, its final outcome, and its
*history*: its tentative outcome in fixpoint rounds 0, 1, ..., d-1, where d is
the first round from which its outcome never changes again (round 0 is "all
commit"). Per key: the sorted ids of its writers, of its readers and of its
committed writers (the last of which is the store's value).

A transaction's outcome in round n depends only on the round n-1 outcomes of
the writers of the keys it reads with smaller ids, and only on those a
backwards scan from it visits: it stops at the first writer committed in round
n-1. Once every writer a scan visits is past its history (n-1 >= d), every
later round visits the same writers with the same outcomes, so the outcome is
final; this bounds the rounds one transaction is evaluated for. The fixpoint's
round count is then ``1 + max d`` over all transactions (the fixpoint reaches
the final rollback set after max d rounds and needs one more to see no change).

A change (a transaction added, removed, or its rows changed) re-evaluates
transactions in id order from a heap: the changed one, then, whenever an
evaluation changes an outcome or history, the readers of the keys it writes
with larger ids, up to and including the next writer of that key that commits
in every round (no scan goes past it). Because the heap pops ids in ascending
order and every push is above the id being evaluated, a transaction is
evaluated at most once per change, after everything below it is final. A new
transaction whose id is above every other one has no readers above it: it costs
one evaluation, proportional to the keys it touches (and the writers it scans
past on them), independent of the history.

The bookkeeping above (histories, outcome counts, the run in id order from the
heap, the queueing downstream) is :mod:`txns.resolve._incremental_base`'s,
shared with :mod:`txns.resolve.incremental_additive`; this module supplies how
intent rows become transactions and how a transaction is evaluated.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Hashable
from typing import Any

import pyarrow as pa

from txns.resolve._incremental_base import IncrementalBase, TxnState
from txns.resolve.rule import COLUMNS, check, freeze

Row = tuple[Any, bool, Any, Any]


class _Txn(TxnState[tuple[Hashable, Any, Any]]):  # frozen key -> (frozen val, key, val)
    __slots__ = ()

    def rows(self) -> list[Row]:
        return [(k, True, key, v) for k, (_, key, v) in self.reads.items()] + [
            (k, False, key, v) for k, (_, key, v) in self.writes.items()
        ]


class Resolver(IncrementalBase[_Txn]):
    """Resolution of a changing set of intents, maintained incrementally.

    ``add`` and ``retract`` take Arrow tables ``intents(id, is_read, key, val)``
    (as :func:`txns.resolve.resolve`); ids must be mutually comparable Python
    values once converted (ints, strings, ...). Intents are a set: adding a row
    that is there is no change. At most one read and one write per (id, key):
    adding a second one with another value, or retracting a row that is not
    there (same id, is_read, key and val), raises ``ValueError`` and changes nothing.
    ``rollback``, ``store`` and ``rounds`` always equal :func:`txns.resolve.resolve`
    of the current intents (``store`` rows in no particular order).
    ``evaluations`` counts transaction evaluations (a diagnostic for tests).

    >>> rows = [(1, False, "alice", "100"), (2, True, "bob", None), (2, False, "bob", "50"),
    ...     (3, True, "alice", "100"), (3, True, "bob", "50"), (3, False, "alice", "70"), (3, False, "bob", "80"),
    ...     (4, True, "alice", "100"), (4, True, "bob", "50"), (4, False, "alice", "60"), (4, False, "bob", "90"),
    ...     (5, True, "alice", "70"), (5, True, "bob", "80"), (5, False, "alice", "50"), (5, False, "bob", "100"),
    ...     (6, True, "x", None), (6, False, "x", "A"), (7, True, "x", "A"), (7, False, "x", "B"),
    ...     (8, True, "x", "A"), (8, False, "x", "C"), (9, True, "x", "C"), (9, False, "x", "D")]
    >>> table = lambda rs: pa.table(dict(zip(["id", "is_read", "key", "val"], map(list, zip(*rs)))))
    >>> r = Resolver()
    >>> r.add(table(rows[15:]))  # transactions 6..9 first
    >>> r.rollback["id"].to_pylist(), r.rounds
    ([8, 9], 3)
    >>> r.add(table(rows[:15]))  # then 1..5, below them
    >>> r.rollback["id"].to_pylist(), sorted(r.store["key"].to_pylist())
    ([4, 8, 9], ['alice', 'bob', 'x'])
    >>> r.retract(table(rows[19:21]))  # drop transaction 8: 9 reads x=C, never written
    >>> r.rollback["id"].to_pylist(), r.evaluations > 0
    ([4, 9], True)
    """

    def __init__(self) -> None:
        super().__init__()
        self._schema = pa.schema([("id", pa.int64()), ("is_read", pa.bool_()), ("key", pa.string()),
                                  ("val", pa.string())])
        self._typed = False

    # ---- the answers

    @property
    def store(self) -> pa.Table:
        """The latest committed write per key (``key``, ``val``; deleted keys left out). O(keys)."""
        keys, vals = [], []
        for k, ws in self._committed.items():
            if ws:
                _, key, val = self._txns[ws[-1]].writes[k]
                if val is not None:
                    keys.append(key)
                    vals.append(val)
        return pa.table({
            "key": pa.array(keys, type=self._schema.field("key").type),
            "val": pa.array(vals, type=self._schema.field("val").type),
        })

    # ---- changes

    def add(self, intents: pa.Table) -> None:
        """Add intent rows (new transactions, or more rows of existing ones)."""
        changes: dict[Any, list[Row]] = {}
        for i, r, k, v in self._rows(intents):
            changes.setdefault(i, []).append((freeze(k), r, k, v))
        merged = {}
        for i, rows in changes.items():
            tx = _Txn()
            old = self._txns.get(i)
            for fk, r, k, v in (old.rows() if old else []) + rows:
                side = tx.reads if r else tx.writes
                if fk in side and side[fk][0] == freeze(v):
                    continue  # intents are a set: the same row again is no change
                if fk in side:
                    raise ValueError(f"transaction {i!r} would have two {'reads' if r else 'writes'} of {k!r}")
                side[fk] = (freeze(v), k, v)
            merged[i] = tx
        for i, tx in merged.items():
            if i in self._txns:
                self._remove(i)
            self._insert(i, tx)
        self._run()

    def retract(self, intents: pa.Table) -> None:
        """Remove intent rows; each must be present (same id, is_read, key and val)."""
        changes: dict[Any, list[Row]] = {}
        for i, r, k, v in self._rows(intents):
            changes.setdefault(i, []).append((freeze(k), r, k, v))
        reduced: dict[Any, _Txn | None] = {}
        for i, rows in changes.items():
            old = self._txns.get(i)
            tx = _Txn()
            if old is not None:
                tx.reads, tx.writes = dict(old.reads), dict(old.writes)
            for fk, r, k, v in {(fk, r, freeze(v)): (fk, r, k, v) for fk, r, k, v in rows}.values():
                side = tx.reads if r else tx.writes
                if fk not in side or side[fk][0] != freeze(v):
                    raise ValueError(f"no intent ({i!r}, {r}, {k!r}, {v!r}) to retract")
                del side[fk]
            reduced[i] = tx if tx.reads or tx.writes else None
        for i, new in reduced.items():
            self._remove(i)
            if new is not None:
                self._insert(i, new)
        self._run()

    # ---- internals

    def _rows(self, intents: pa.Table) -> list[tuple[Any, bool, Any, Any]]:
        t = check(intents)
        if not self._typed and t.num_rows:
            self._schema, self._typed = t.schema, True
        elif t.num_rows and t.schema.types != self._schema.types:
            raise ValueError(f"intents of types {t.schema.types}, not {self._schema.types} as before")
        return list(zip(*(t[c].to_pylist() for c in COLUMNS), strict=True))

    def _rollback_type(self) -> pa.DataType:
        return self._schema.field("id").type

    def _round(self, i: Any, tx: _Txn, m: int) -> tuple[bool, bool]:
        """(does every read of transaction ``i`` see its value in round m + 1, stable from then on)."""
        ok, stable = True, True
        for k, (v, _, _) in tx.reads.items():
            ws = self._writers.get(k, [])
            red: Hashable = None
            for j in range(bisect_left(ws, i) - 1, -1, -1):
                w = self._txns[ws[j]]
                if len(w.hist) > m:
                    stable = False
                if w.status(m):
                    red = w.writes[k][0]
                    break
            if red != v:
                ok = False
        return ok, stable
