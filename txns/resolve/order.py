"""Choosing the serialization order within an epoch (issue #11, part 7).

The rule of :mod:`txns.resolve` serializes transactions in id order. Within an
epoch the ids carry no user meaning (any serial order is a correct
serialization), so the resolver may pick the order, and the order decides how
many commit: a transaction rolls back when it read a key that an earlier
committed transaction wrote, so a reader placed *before* the writers of what
it read survives. :func:`reorder` picks an order; :func:`renumber` rewrites the
ids to positions in it; :func:`resolve_reordered` resolves in it. Correctness
does not depend on the strategy: the result is the rule applied in the new
order (the tests check it against the sequential model), only the number of
commits changes. Following transaction-repair section 6.1, strategies:

- ``"id"``: the ids' order (the identity).
- ``"random"``: a uniformly random permutation (``seed``): breaks long chains
  (X_i reads r_i, writes r_i+1) into expected 2 sqrt(k) pieces.
- ``"read_only_first"``: transactions that write nothing first (they can never
  make another roll back), then the rest, each group in id order.
- ``"readers_first"`` (default): a topological order of the conflict graph
  with an edge t -> s when t reads a key that s writes (or adds to; t != s):
  readers before the writers of what they read. Greedy, one transaction at a
  time: place the unplaced transaction with the fewest unplaced readers of its
  writes (0 while the graph is acyclic: a topological step; when only cycles
  are left, the fewest-violations choice breaks one), ties by fewer writes
  (read-only and read-mostly first), then at random (``seed``; randomization
  against long chains). Cost O(sum over keys of readers x writers) Python steps
  (fine for sparse conflicts; quadratic on a hot key).

The post's 10,000-transaction workload (benchmarks/bench_resolve_order.py):
each transaction reads two keys expecting absence and writes two others, so
a transaction commits iff no earlier committed transaction wrote what it read;
placing readers first commits more of them.

>>> import pyarrow as pa
>>> t = pa.table({"id": [1, 2, 2], "is_read": [False, True, False], "key": ["a", "a", "b"],
...               "val": ["x", None, "y"]})
>>> reorder(t, "readers_first").to_pylist()  # 2 reads a, which 1 writes: 2 goes first
[{'id': 1, 'position': 1}, {'id': 2, 'position': 0}]
>>> res, order = resolve_reordered(t)
>>> res.rollback["id"].to_pylist(), sorted(res.store["key"].to_pylist())
([], ['a', 'b'])
>>> from txns.resolve import resolve
>>> resolve(t).rollback["id"].to_pylist()  # in id order 2 rolls back
[2]
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txns.resolve.batch import resolve
from txns.resolve.rule import Resolution, check, codes, id_ranks

STRATEGIES = ("id", "random", "read_only_first", "readers_first")


def reorder(intents: pa.Table, strategy: str = "readers_first", seed: int = 0,
            adds: pa.Table | None = None) -> pa.Table:
    """A serialization order: a table ``(id, position)``, one row per distinct id (ascending), positions 0..m-1.

    ``adds(id, key, delta)`` (:mod:`txns.resolve.additive`), if given, counts as
    writes (its ids take part too). ``strategy``: one of :data:`STRATEGIES`.

    >>> t = pa.table({"id": [5, 7], "is_read": [False, False], "key": ["a", "b"], "val": ["x", "y"]})
    >>> reorder(t, "id")["position"].to_pylist()
    [0, 1]
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; one of {STRATEGIES}")
    t = check(intents)
    ids = t["id"].combine_chunks()
    keys = t["key"].combine_chunks()
    is_read = np.asarray(t["is_read"].to_numpy(zero_copy_only=False), dtype=bool)
    if adds is not None and adds.num_rows:
        ids = pa.concat_arrays([ids, adds["id"].combine_chunks().cast(ids.type)])
        keys = pa.concat_arrays([keys, adds["key"].combine_chunks().cast(keys.type)])
        is_read = np.concatenate([is_read, np.zeros(adds.num_rows, dtype=bool)])
    rank, uniq = id_ranks(ids)
    m = len(uniq)
    rng = random.Random(seed)
    if strategy == "id":
        perm = list(range(m))
    elif strategy == "random":
        perm = list(range(m))
        rng.shuffle(perm)
    else:
        writes = np.bincount(rank[~is_read], minlength=m)
        if strategy == "read_only_first":
            perm = np.flatnonzero(writes == 0).tolist() + np.flatnonzero(writes > 0).tolist()
        else:
            perm = _readers_first(rank, codes(keys), is_read, m, writes, rng.random)
    position = np.empty(m, dtype=np.int64)
    position[np.asarray(perm, dtype=np.int64)] = np.arange(m, dtype=np.int64)
    return pa.table({"id": uniq, "position": pa.array(position, pa.int64())})


def _readers_first(rank: np.ndarray, kc: np.ndarray, is_read: np.ndarray, m: int, writes: np.ndarray,
                   rand: Callable[[], float]) -> list[int]:
    pairs_r = np.unique(np.stack([rank[is_read], kc[is_read]]), axis=1) if is_read.any() else np.zeros((2, 0), int)
    pairs_w = np.unique(np.stack([rank[~is_read], kc[~is_read]]), axis=1) if (~is_read).any() else np.zeros((2, 0), int)
    readers: dict[int, list[int]] = {}
    writers: dict[int, list[int]] = {}
    reads_of: dict[int, list[int]] = {}
    for r, k in pairs_r.T.tolist():
        readers.setdefault(k, []).append(r)
        reads_of.setdefault(r, []).append(k)
    for w, k in pairs_w.T.tolist():
        writers.setdefault(k, []).append(w)
    indeg = [0] * m  # unplaced readers (edges) of each transaction's writes
    for k, ws in writers.items():
        rs = readers.get(k, [])
        rset = set(rs)
        for w in ws:
            indeg[w] += len(rs) - (w in rset)
    tie = [rand() for _ in range(m)]
    wcount = writes.tolist()
    heap = [(indeg[n], wcount[n], tie[n], n) for n in range(m)]
    heapq.heapify(heap)
    placed = [False] * m
    out: list[int] = []
    while heap:
        d, _, _, n = heapq.heappop(heap)
        if placed[n] or d != indeg[n]:
            continue  # stale
        placed[n] = True
        out.append(n)
        for k in reads_of.get(n, ()):
            for w in writers.get(k, ()):
                if w != n and not placed[w]:
                    indeg[w] -= 1
                    heapq.heappush(heap, (indeg[w], wcount[w], tie[w], w))
    return out


def renumber(table: pa.Table, order: pa.Table) -> pa.Table:
    """``table`` (intents, or adds: any table with an ``id`` column) with each id replaced by its position.

    >>> o = pa.table({"id": [5, 7], "position": [1, 0]})
    >>> renumber(pa.table({"id": [7, 5, 7], "x": [1, 2, 3]}), o).to_pylist()
    [{'id': 0, 'x': 1}, {'id': 1, 'x': 2}, {'id': 0, 'x': 3}]
    """
    idx = pc.index_in(table["id"], value_set=order["id"].combine_chunks().cast(table.schema.field("id").type))
    if idx.null_count:
        raise ValueError("an id that the order does not place")
    pos = order["position"].combine_chunks().take(idx)
    return table.set_column(table.column_names.index("id"), "id", pos)


def resolve_reordered(intents: pa.Table, strategy: str = "readers_first", seed: int = 0
                      ) -> tuple[Resolution, pa.Table]:
    """Resolve in the order :func:`reorder` picks: ``(resolution, order)``.

    The resolution is :func:`txns.resolve.resolve` of the renumbered intents,
    with ``rollback`` mapped back to the original ids (ascending); ``store`` and
    ``rounds`` as computed in the new order.
    """
    order = reorder(intents, strategy, seed)
    res = resolve(renumber(intents, order))
    by_pos = order["id"].take(pc.sort_indices(order["position"]))
    back = by_pos.take(res.rollback["id"].cast(pa.int64()))
    back = back.take(pc.sort_indices(back))
    return Resolution(rollback=pa.table({"id": back}), store=res.store, rounds=res.rounds), order
