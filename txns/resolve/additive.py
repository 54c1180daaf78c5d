"""Additive writes (issue #11, part 6): ``adds(id, key, delta)`` beside ``intents``, and pairwise conflicts.

**The relation.** Plain reads and writes stay in ``intents(id, is_read, key, val)``
(unchanged, so the other resolvers are untouched); additive writes are a
separate table ``adds(id, key, delta)``: transaction ``id`` adds the number
``delta`` to ``key``. A separate table rather than a ``kind`` column because a
delta is not a value (it has its own column type and no null), and because a
relation without additive writes is then exactly the old one. Values of keys
that anyone adds to must be numeric (``val``, ``delta``: integer or floating
Arrow types; int64 arithmetic if all are integers, else float64). An optional
``base(key, val)`` table is the store before the epoch (the reference's
``A = 10, B = 20, C = 30``); the plain model starts from an empty store.
Rejected (``ValueError``): two add rows for one (id, key); a plain write and an
add of one key by one transaction; two reads or two writes of one key by one
transaction with different values.

**The rule.** The *value of k as of t* is the value of the latest plain write
to k by a committed transaction with id < t (or base's value if there is none;
a delete reads as absent) plus the sum of the deltas added to k by committed
transactions with ids between that write and t; an absent key with no such
delta is absent (null), an absent key with deltas counts from 0. Transaction t
commits iff each of its reads (k, v) has v equal to the value of k as of t.
Additive writes never conflict with each other (they commute: whatever order
they commit in, the sum is the same); only a read of a key that an additive
write changes can conflict. :func:`sequential_additive` is this rule, one
transaction at a time; :func:`resolve_additive` is the fixpoint of
:mod:`txns.resolve` on it, and the package proof carries over word for word
(the value of k as of t depends only on which ids below t committed).

**Pairwise conflicts** (:func:`pairwise`), as in the ivm-ordering reference,
where reads take a snapshot and writes are additive. A *pairwise conflict* is a
pair (s, t) of transactions with s < t, s adding a nonzero delta to a key k
that t reads. The pairwise resolver decides t from the pairs alone, never from
a sum: in id order, t rolls back iff one of its reads did not see the epoch's
snapshot (v differs from base's value of k), or it is in a pairwise conflict
(s, t) with a committed s. That is, "the read's value does not account for s's
delta" is taken literally: a read of the snapshot accounts for no delta of the
epoch. It equals the rule (:func:`resolve_additive`, same rollback, same store)
exactly when

- (P1) every read saw the snapshot: each read (t, k, v) has v = base's value of
  k (null if absent); the data-plane design's reads, taken at insert time, do;
- (P2) no nonempty set of the epoch's deltas to one key sums to 0; checkable
  sufficient form, used in the tests: per key, all deltas nonzero and of one
  sign (counts, inserts into a multiset). Float deltas must also sum exactly;
- (P3) no plain write to a key that is read (checked: ``ValueError``).

Proof: by (P3) the value of a read key k as of t is base(k) + the sum of the
committed deltas to k before t; by (P2) that sum is 0, i.e. the value equals
base(k), iff there is no committed delta to k before t; by (P1) the read
expected base(k). So "the read matches" is "no committed pairwise conflict",
for every read, in id order, and the two rules decide every transaction alike.
Without (P1) the pairwise resolver rolls back a read that a sum would have
made right (base 10, s adds 5, t read 15); without (P2) it rolls back a read
whose deltas cancelled (s adds 5, s' adds -5); the tests show both.

**The reference's three transactions.** Base A = 10, B = 20, C = 30. T1: B += C
(reads C = 30, adds 30 to B); T2: A += B (reads B = 20, adds 20 to A); T3:
C += A (reads A = 10, adds 10 to C). The pairwise conflicts form the cycle
T1 -> T2 (T2 reads B, which T1 adds to), T2 -> T3, T3 -> T1: any two can run in
parallel, all three cannot. In id order 1, 2, 3 the pairs (1, 2) and (2, 3) go
forward (a writer before a reader of its key), (3, 1) backward. T1 commits (no
earlier writer); T2 rolls back (T1 committed and added 30 to B, so B is 50, not
the 20 T2 read); T3 commits: its only earlier conflicting writer, T2, rolled
back, so A is still 10. Final store A = 10, B = 50, C = 40, the serial outcome
of T1 then T3 (T3 reads A, which T1 does not touch; T1 reads C before T3
adds). In any order exactly one transaction rolls back: the cycle's three
pairs go forward (writer placed before reader) one or two at a time; with one
forward pair its reader rolls back; with two, the first forward pair's reader
rolls back, and that removes the writer of the second pair. Concretely, the
transaction placed first always commits and the reader of the key it adds to
always rolls back: orders (1, 2, 3) and (1, 3, 2) roll back T2; (2, 1, 3) and
(2, 3, 1) roll back T3 (store A = 30, B = 50, C = 30); (3, 1, 2) and (3, 2, 1)
roll back T1 (store A = 30, B = 20, C = 40); tests/resolve/test_additive.py
checks all six. So pairwise checking needs no cycle detection: the id order breaks the
cycle, at the cost of one rollback, which is optimal (no serial order commits
all three, as the reference shows).

>>> import pyarrow as pa
>>> intents = pa.table({"id": [1, 2, 3], "is_read": [True, True, True], "key": ["C", "B", "A"],
...                     "val": [30, 20, 10]})
>>> adds = pa.table({"id": [1, 2, 3], "key": ["B", "A", "C"], "delta": [30, 20, 10]})
>>> base = pa.table({"key": ["A", "B", "C"], "val": [10, 20, 30]})
>>> res = pairwise(intents, adds, base)
>>> res.rollback["id"].to_pylist(), sorted(zip(res.store["key"].to_pylist(), res.store["val"].to_pylist()))
([2], [('A', 10), ('B', 50), ('C', 40)])
>>> resolve_additive(intents, adds, base).rollback.equals(res.rollback)
True
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txns.resolve.rule import Resolution, check, codes, freeze

ADDS_COLUMNS = ("id", "key", "delta")
TWICE = "intents hold two reads or two writes of one key by one transaction, with different values"


def is_number(t: pa.DataType) -> bool:
    """Is ``t`` a type values and deltas may have (integer, floating, or null: all absent)?"""
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_null(t))


def check_adds(adds: pa.Table) -> pa.Table:
    """``adds`` reduced to its columns ``id, key, delta``, one chunk each; ``ValueError`` if one lacks or has nulls."""
    missing = [c for c in ADDS_COLUMNS if c not in adds.column_names]
    if missing:
        raise ValueError(f"adds lack column(s) {missing}; need {list(ADDS_COLUMNS)}")
    a = adds.select(list(ADDS_COLUMNS)).combine_chunks()
    for c in ADDS_COLUMNS:
        if a[c].null_count:
            raise ValueError(f"adds.{c} has nulls")
    return a


def _check(intents: pa.Table, adds: pa.Table | None, base: pa.Table | None) -> tuple[pa.Table, pa.Table, pa.Table]:
    t = check(intents)
    key_type = t.schema.field("key").type
    id_type = t.schema.field("id").type
    if adds is None:
        adds = pa.table({"id": pa.array([], id_type), "key": pa.array([], key_type), "delta": pa.array([], pa.int64())})
    a = check_adds(adds)
    a = a.set_column(0, "id", a["id"].cast(id_type)).set_column(1, "key", a["key"].cast(key_type))
    if base is None:
        base = pa.table({"key": pa.array([], key_type), "val": pa.array([], t.schema.field("val").type)})
    b = base.select(["key", "val"]).combine_chunks()
    b = b.set_column(0, "key", b["key"].cast(key_type))
    for name, typ in (("intents.val", t.schema.field("val").type), ("adds.delta", a.schema.field("delta").type),
                      ("base.val", b.schema.field("val").type)):
        if not is_number(typ):
            raise ValueError(f"{name} must be numeric, not {typ}")
    return t, a, b


def _float(*types: pa.DataType) -> bool:
    return any(pa.types.is_floating(x) for x in types)


def _num(col: pa.ChunkedArray | pa.Array, as_float: bool) -> tuple[np.ndarray, np.ndarray]:
    """(values with nulls as 0, null mask) as float64 or int64."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    null = np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    dtype = np.float64 if as_float else np.int64
    filled = arr.cast(pa.float64() if as_float else pa.int64()).fill_null(0)
    return np.asarray(filled.to_numpy(zero_copy_only=False), dtype=dtype), null


def sequential_additive(
    intents: pa.Table, adds: pa.Table | None = None, base: pa.Table | None = None
) -> tuple[pa.Table, pa.Table]:
    """The rule with additive writes, one transaction at a time in id order: ``(rollback, store)``.

    >>> i = pa.table({"id": [1, 3], "is_read": [False, True], "key": ["k", "k"], "val": [1, 1]})
    >>> a = pa.table({"id": [2], "key": ["k"], "delta": [5]})
    >>> rb, store = sequential_additive(i, a)
    >>> rb["id"].to_pylist(), store.to_pylist()
    ([3], [{'key': 'k', 'val': 6}])
    """
    t, a, b = _check(intents, adds, base)
    txns: dict[Any, tuple[list[tuple[bool, Any, Any]], list[tuple[Any, Any]]]] = {}
    for i, r, k, v in zip(*(t[c].to_pylist() for c in ("id", "is_read", "key", "val")), strict=True):
        txns.setdefault(i, ([], []))[0].append((r, k, v))
    for i, k, d in zip(*(a[c].to_pylist() for c in ADDS_COLUMNS), strict=True):
        txns.setdefault(i, ([], []))[1].append((k, d))
    for rows, deltas in txns.values():
        plain = {(r, freeze(k)): freeze(v) for r, k, v in rows}
        if len(plain) != len({(r, freeze(k), freeze(v)) for r, k, v in rows}):
            raise ValueError(TWICE)
        ks = [freeze(k) for k, _ in deltas]
        if len(set(ks)) != len(ks) or any((False, k) in plain for k in ks):
            raise ValueError("a transaction adds to a key twice, or both writes and adds to it")
    state: dict[Hashable, tuple[Any, Any]] = {
        freeze(k): (k, v) for k, v in zip(b["key"].to_pylist(), b["val"].to_pylist(), strict=True)
    }
    rolled = []
    for i in sorted(txns):
        rows, deltas = txns[i]
        if all(state.get(freeze(k), (k, None))[1] == v for r, k, v in rows if r):
            for r, k, v in rows:
                if not r:
                    state[freeze(k)] = (k, v)
            for k, d in deltas:
                old = state.get(freeze(k), (k, None))[1]
                state[freeze(k)] = (k, (0 if old is None else old) + d)
        else:
            rolled.append(i)
    as_float = _float(t.schema.field("val").type, a.schema.field("delta").type, b.schema.field("val").type)
    live = [kv for kv in state.values() if kv[1] is not None]
    rollback = pa.table({"id": pa.array(rolled, type=t.schema.field("id").type)})
    store = pa.table({
        "key": pa.array([k for k, _ in live], type=t.schema.field("key").type),
        "val": pa.array([v for _, v in live], type=pa.float64() if as_float else pa.int64()),
    })
    return rollback, store


class _Prepared:
    """Intents, adds and base as dense codes: ranks 1..m for ids (0 is the base), key codes."""

    def __init__(self, intents: pa.Table, adds: pa.Table | None, base: pa.Table | None) -> None:
        t, a, b = _check(intents, adds, base)
        self.t, self.a = t, a
        nt, na, nb = t.num_rows, a.num_rows, b.num_rows
        self.as_float = _float(t.schema.field("val").type, a.schema.field("delta").type, b.schema.field("val").type)
        ids = pa.concat_arrays([t["id"].combine_chunks(), a["id"].combine_chunks()])
        uniq = pc.unique(ids)
        self.uniq = uniq.take(pc.sort_indices(uniq))
        rank = np.asarray(pc.index_in(ids, value_set=self.uniq).to_numpy(zero_copy_only=False), dtype=np.int64) + 1
        self.m = len(self.uniq)
        keys = pa.concat_arrays([t["key"].combine_chunks(), a["key"].combine_chunks(), b["key"].combine_chunks()])
        kc = codes(keys)
        self.kc = kc
        self.nk = int(kc.max()) + 1 if len(kc) else 0
        self.M = self.m + 2  # composite (key, rank) = key * M + rank; rank m + 1 is "after everything"
        is_read = np.asarray(t["is_read"].to_numpy(zero_copy_only=False), dtype=bool)
        t_rank, t_key = rank[:nt], kc[:nt]
        vc = codes(t["val"])
        slot = (t_rank * 2 + is_read) * max(self.nk, 1) + t_key
        if len(np.unique(slot)) != len(np.unique(np.stack([slot, vc]), axis=1)[0]):
            raise ValueError(TWICE)
        a_rank, a_key = rank[nt:], kc[nt : nt + na]
        a_slot = a_rank * max(self.nk, 1) + a_key
        w_slot = slot[~is_read]  # writes: is_read = 0, so slot = rank * 2 * nk + key
        if len(np.unique(a_slot)) != na or np.isin(a_rank * 2 * max(self.nk, 1) + a_key, w_slot).any():
            raise ValueError("a transaction adds to a key twice, or both writes and adds to it")
        b_key = kc[nt + na :]
        if len(np.unique(b_key)) != nb:
            raise ValueError("base holds a key twice")
        val, val_null = _num(t["val"], self.as_float)
        delta, _ = _num(a["delta"], self.as_float)
        bval, bnull = _num(b["val"], self.as_float)
        # plain writes (base at rank 0 first), deduplicated, sorted by (key, rank)
        w = np.flatnonzero(~is_read)
        w_rank = np.concatenate([np.zeros(nb, np.int64), t_rank[w]])
        w_key = np.concatenate([b_key, t_key[w]])
        w_val = np.concatenate([bval, val[w]])
        w_null = np.concatenate([bnull, val_null[w]])
        w_comp, first = np.unique(w_key * self.M + w_rank, return_index=True)
        self.w_comp, self.w_rank, self.w_key = w_comp, w_rank[first], w_key[first]
        self.w_val, self.w_null = w_val[first], w_null[first]
        o = np.lexsort((a_rank, a_key))
        self.d_rank, self.d_key, self.d_val = a_rank[o], a_key[o], delta[o]
        self.d_comp = self.d_key * self.M + self.d_rank
        r = np.flatnonzero(is_read)
        r_comp, first = np.unique(t_key[r] * self.M + t_rank[r], return_index=True)
        r = r[first]
        self.r_rank, self.r_key, self.r_val, self.r_null = t_rank[r], t_key[r], val[r], val_null[r]
        self.r_comp = r_comp
        # the key codes of the store: every key written or added to
        self.store_rows = np.concatenate([np.arange(nb) + nt + na, w + 0, np.arange(na) + nt])
        self.keys = keys

    def values(self, alive: np.ndarray, q_key: np.ndarray, q_rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(value, is null) of keys ``q_key`` as of ranks ``q_rank``, counting transactions where ``alive``.

        ``alive`` is indexed by rank (0 = base, always alive).
        """
        wa = alive[self.w_rank]
        w_comp, w_key, w_rank, w_val, w_null = (x[wa] for x in (self.w_comp, self.w_key, self.w_rank, self.w_val,
                                                                  self.w_null))
        da = alive[self.d_rank]
        d_comp, d_val = self.d_comp[da], self.d_val[da]
        q_comp = q_key * self.M + q_rank
        pos = np.searchsorted(w_comp, q_comp, side="left") - 1
        p = np.maximum(pos, 0)
        found = (pos >= 0) & (w_key[p] == q_key) if len(w_comp) else np.zeros(len(q_comp), dtype=bool)
        start = np.where(found, q_key * self.M + (w_rank[p] if len(w_comp) else 0), q_key * self.M - 1)
        lo = np.searchsorted(d_comp, start, side="right")
        hi = np.searchsorted(d_comp, q_comp, side="left")
        csum = np.concatenate([np.zeros(1, d_val.dtype), np.cumsum(d_val)])
        total = csum[hi] - csum[lo]
        has_write = found & ~(w_null[p] if len(w_comp) else np.zeros(len(q_comp), dtype=bool))
        base = np.where(has_write, w_val[p] if len(w_comp) else 0, 0)
        null = ~has_write & (hi == lo)
        return np.where(null, 0, base + total), null

    def mismatch(self, rolled: np.ndarray) -> np.ndarray:
        """The reads (by index) that differ from the value as of their transaction, given ``rolled`` by rank."""
        alive = ~rolled
        v, null = self.values(alive, self.r_key, self.r_rank)
        out: np.ndarray = (null != self.r_null) | (~null & ~self.r_null & (v != self.r_val))
        return out

    def resolution(self, rolled: np.ndarray, rounds: int) -> Resolution:
        rollback = pa.table({"id": self.uniq.filter(pa.array(rolled[1:]))})
        _, first = np.unique(self.kc[self.store_rows], return_index=True)
        rows = self.store_rows[np.sort(first)]
        kc = self.kc[rows]
        v, null = self.values(~rolled, kc, np.full(len(kc), self.m + 1, dtype=np.int64))
        keep = ~null
        store = pa.table({
            "key": self.keys.take(pa.array(rows[keep], type=pa.int64())),
            "val": pa.array(v[keep], type=pa.float64() if self.as_float else pa.int64()),
        })
        return Resolution(rollback=rollback, store=store, rounds=rounds)


def _fixpoint(p: _Prepared, conflicted: Any) -> Resolution:
    rolled = np.zeros(p.m + 1, dtype=bool)  # by rank; rank 0 (the base) never rolls back
    rounds = 0
    while True:
        rounds += 1
        new = np.zeros(p.m + 1, dtype=bool)
        new[p.r_rank[conflicted(rolled)]] = True
        if np.array_equal(new, rolled):
            return p.resolution(rolled, rounds)
        rolled = new


def resolve_additive(intents: pa.Table, adds: pa.Table | None = None, base: pa.Table | None = None) -> Resolution:
    """Resolve plain intents plus additive writes by the rule, as the fixpoint (vectorised rounds).

    ``store`` holds, per key, its value after every committed transaction (int64
    if ``val``, ``delta`` and base's ``val`` are integers, else float64).

    >>> i = pa.table({"id": [1, 2, 3], "is_read": [True, True, True], "key": ["k", "k", "k"], "val": [None, 5, 5]})
    >>> a = pa.table({"id": [1, 2, 3], "key": ["k", "k", "k"], "delta": [5, 1, 1]})
    >>> res = resolve_additive(i, a)
    >>> res.rollback["id"].to_pylist(), res.store.to_pylist()
    ([3], [{'key': 'k', 'val': 6}])
    """
    p = _Prepared(intents, adds, base)
    return _fixpoint(p, p.mismatch)


def pairwise(intents: pa.Table, adds: pa.Table | None = None, base: pa.Table | None = None) -> Resolution:
    """Resolve by pairwise conflicts: t rolls back iff a read missed the snapshot or a committed s < t adds to it.

    Equals :func:`resolve_additive` under (P1)-(P3) of the module docstring;
    ``ValueError`` if (P3) fails (a plain write to a key that is read). A zero
    delta is no conflict.

    >>> i = pa.table({"id": [1, 2], "is_read": [True, True], "key": ["k", "k"], "val": [None, None]})
    >>> a = pa.table({"id": [1, 2], "key": ["k", "k"], "delta": [5, 1]})
    >>> pairwise(i, a).rollback["id"].to_pylist()
    [2]
    """
    p = _Prepared(intents, adds, base)
    if len(p.r_key) and np.isin(p.r_key, p.w_key[p.w_rank > 0]).any():
        raise ValueError("pairwise conflicts need no plain write to a key that is read (P3)")
    base_only = np.zeros(p.m + 1, dtype=bool)
    base_only[0] = True
    snap, snap_null = p.values(base_only, p.r_key, p.r_rank)
    stale = (snap_null != p.r_null) | (~snap_null & ~p.r_null & (snap != p.r_val))
    nz = p.d_val != 0
    d_key, d_rank = p.d_key[nz], p.d_rank[nz]

    def conflicted(rolled: np.ndarray) -> np.ndarray:
        alive = ~rolled[d_rank]
        first = np.full(max(p.nk, 1), p.m + 2, dtype=np.int64)  # per key, the first committed adder's rank
        np.minimum.at(first, d_key[alive], d_rank[alive])
        out: np.ndarray = stale | (first[p.r_key] < p.r_rank) if len(p.r_key) else stale
        return out

    return _fixpoint(p, conflicted)
