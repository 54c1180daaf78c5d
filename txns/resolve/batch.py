"""The batch resolver: the post's fixpoint, literally, one vectorised round at a time.

Each round takes the tentative rollback set ``B`` (empty at first) and computes

1. writes: the write intents of transactions not in ``B``;
2. reads: for each read intent, the value of the latest of those writes to its
   key with a smaller id (null if none);
3. the new ``B``: the transactions with a read that differs (nulls equal).

until ``B`` stops changing. One round is a sort-merge (``searchsorted``) over the
writes, so a round costs O(n log n) for n intents; the number of rounds is at
most the number of distinct ids plus one (see :mod:`txns.resolve`) and small
for sparse conflicts (8 for benchmarks/bench_resolve.py's version of the post's
10,000-transaction workload).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from txns.resolve.rule import Resolution, check, codes, id_ranks


def resolve(intents: pa.Table) -> Resolution:
    """Resolve ``intents(id, is_read, key, val)`` by the fixpoint.

    ``id``: any Arrow type that sorts (int64 in the post; callers with
    (epoch, uuid) ids map them to one sortable value). ``key``, ``val``: any Arrow
    type (a struct column for a (table, key) pair); a null ``val`` is "absent" in
    a read and a delete in a write. Intents are a set: a row twice counts once.
    At most one read and one write per (id, key), else ``ValueError`` (two reads,
    or two writes, of one key by one transaction with different values).

    The post's nine transactions:

    >>> import pyarrow as pa
    >>> rows = [(1, False, "alice", "100"), (2, True, "bob", None), (2, False, "bob", "50"),
    ...     (3, True, "alice", "100"), (3, True, "bob", "50"), (3, False, "alice", "70"), (3, False, "bob", "80"),
    ...     (4, True, "alice", "100"), (4, True, "bob", "50"), (4, False, "alice", "60"), (4, False, "bob", "90"),
    ...     (5, True, "alice", "70"), (5, True, "bob", "80"), (5, False, "alice", "50"), (5, False, "bob", "100"),
    ...     (6, True, "x", None), (6, False, "x", "A"), (7, True, "x", "A"), (7, False, "x", "B"),
    ...     (8, True, "x", "A"), (8, False, "x", "C"), (9, True, "x", "C"), (9, False, "x", "D")]
    >>> intents = pa.table(dict(zip(["id", "is_read", "key", "val"], map(list, zip(*rows)))))
    >>> res = resolve(intents)
    >>> res.rollback["id"].to_pylist(), res.rounds
    ([4, 8, 9], 3)
    >>> sorted(zip(res.store["key"].to_pylist(), res.store["val"].to_pylist()))
    [('alice', '50'), ('bob', '100'), ('x', 'B')]
    """
    t = check(intents)
    rank, uniq = id_ranks(t["id"])
    m = len(uniq)
    is_read = np.asarray(t["is_read"].to_numpy(zero_copy_only=False), dtype=bool)
    kc = codes(t["key"])
    vc = codes(t["val"])
    nk = int(kc.max()) + 1 if len(kc) else 0
    slot = (rank * 2 + is_read) * max(nk, 1) + kc
    if len(np.unique(slot)) != len(np.unique(np.stack([slot, vc]), axis=1)[0]):
        raise ValueError("intents hold two reads or two writes of one key by one transaction, with different values")

    w = np.flatnonzero(~is_read)
    w = w[np.lexsort((rank[w], kc[w]))]  # writes by (key, id)
    w_rank, w_key, w_val = rank[w], kc[w], vc[w]
    w_comp = w_key * m + w_rank
    r = np.flatnonzero(is_read)
    r_rank, r_key, r_val = rank[r], kc[r], vc[r]
    r_comp = r_key * m + r_rank

    rolled = np.zeros(m, dtype=bool)
    rounds = 0
    while True:
        rounds += 1
        alive = ~rolled[w_rank]
        a_comp, a_key, a_val = w_comp[alive], w_key[alive], w_val[alive]
        red = np.full(len(r), -1, dtype=np.int64)
        if len(a_comp) and len(r):
            pos = np.searchsorted(a_comp, r_comp, side="left") - 1
            p = np.maximum(pos, 0)
            found = (pos >= 0) & (a_key[p] == r_key)
            red = np.where(found, a_val[p], -1)
        new = np.zeros(m, dtype=bool)
        new[r_rank[red != r_val]] = True
        if np.array_equal(new, rolled):
            break
        rolled = new

    rollback = pa.table({"id": uniq.filter(pa.array(rolled))})
    alive_rows = w[~rolled[w_rank]]
    last = np.ones(len(alive_rows), dtype=bool)  # the last committed write of each key
    if len(alive_rows):
        last[:-1] = kc[alive_rows[:-1]] != kc[alive_rows[1:]]
    winners = alive_rows[last]
    winners = winners[vc[winners] >= 0]  # a delete leaves the key out
    store = t.take(pa.array(winners, type=pa.int64())).select(["key", "val"])
    return Resolution(rollback=rollback, store=store, rounds=rounds)
