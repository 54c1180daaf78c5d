"""The post's three maintenance deletions, which shrink intents without changing the answers.

Given intents ``I`` and their resolution ``R`` (``resolve(I)``):

1. :func:`remove_failed`: drop every row of a transaction in ``R.rollback``.
2. :func:`remove_committed_reads`: drop the reads of transactions not in ``R.rollback``.
3. :func:`remove_overwritten_writes`: drop a write of key k at id i if a transaction
   not in ``R.rollback`` writes k at an id above i, and no row of ``I`` reads k at an
   id above i.

:func:`maintain` runs them in that order (each on the previous one's output,
all with ``R``); :func:`dead_intents` is what it removes.

What is preserved (tested with Hypothesis in tests/resolve): for ``I'`` the output of
any of the four functions, ``resolve(I')`` has the same store as ``R``, and each
transaction id left in ``I'`` rolls back in ``resolve(I')`` iff it does in ``R``.
Why: (1) the rolled-back transactions contribute no write in the fixpoint, so
``R``'s rollback set minus them is a fixed point of the smaller input, and the
fixed point is unique; (2) a committed transaction without its reads still
commits, and nothing else depends on its reads; (3) a removed write is
neither the latest committed write to its key (a committed write comes later)
nor seen by any read (none comes later). Moreover, intents ``J`` with ids above
every id of ``I`` resolve the same on top of ``I'`` as on top of ``I`` (same store,
same outcome for ``J``'s ids): ``J``'s reads see the same latest committed writes.
Intents that arrive later with *lower* ids void this: run maintenance only on ids
below which no intent will arrive (the post's "caveat by our bounds on certain ids").
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txns.resolve.rule import Resolution, check, codes, id_ranks


def _failed(t: pa.Table, res: Resolution) -> np.ndarray:
    rolled = pc.is_in(t["id"], value_set=res.rollback["id"].combine_chunks())
    return np.asarray(rolled.to_numpy(zero_copy_only=False), dtype=bool)


def _is_read(t: pa.Table) -> np.ndarray:
    return np.asarray(t["is_read"].to_numpy(zero_copy_only=False), dtype=bool)


def _keep_unfailed(t: pa.Table, res: Resolution) -> np.ndarray:
    return ~_failed(t, res)


def _keep_uncommitted_reads(t: pa.Table, res: Resolution) -> np.ndarray:
    return np.asarray(~(_is_read(t) & ~_failed(t, res)), dtype=bool)


def _keep_unoverwritten(t: pa.Table, res: Resolution) -> np.ndarray:
    if t.num_rows == 0:
        return np.ones(0, dtype=bool)
    rank, _ = id_ranks(t["id"])
    kc = codes(t["key"])
    is_read = _is_read(t)
    nk = int(kc.max()) + 1
    last_committed_write = np.full(nk, -1, dtype=np.int64)
    cw = ~is_read & ~_failed(t, res)
    np.maximum.at(last_committed_write, kc[cw], rank[cw])
    last_read = np.full(nk, -1, dtype=np.int64)
    np.maximum.at(last_read, kc[is_read], rank[is_read])
    return np.asarray(~(~is_read & (rank < last_committed_write[kc]) & (rank >= last_read[kc])), dtype=bool)


def remove_failed(intents: pa.Table, resolution: Resolution) -> pa.Table:
    """Task 1: the intents without the rows of rolled-back transactions.

    >>> t = pa.table({"id": [1, 2, 2], "is_read": [False, True, False], "key": ["a"] * 3, "val": ["1", "0", "2"]})
    >>> from txns.resolve.batch import resolve
    >>> remove_failed(t, resolve(t))["id"].to_pylist()
    [1]
    """
    t = check(intents)
    return t.filter(pa.array(_keep_unfailed(t, resolution)))


def remove_committed_reads(intents: pa.Table, resolution: Resolution) -> pa.Table:
    """Task 2: the intents without the reads of committed (not rolled-back) transactions.

    >>> t = pa.table({"id": [1, 2, 2], "is_read": [False, True, False], "key": ["a"] * 3, "val": ["1", "1", "2"]})
    >>> from txns.resolve.batch import resolve
    >>> remove_committed_reads(t, resolve(t))["is_read"].to_pylist()
    [False, False]
    """
    t = check(intents)
    return t.filter(pa.array(_keep_uncommitted_reads(t, resolution)))


def remove_overwritten_writes(intents: pa.Table, resolution: Resolution) -> pa.Table:
    """Task 3: the intents without writes that a later committed write overwrites before any read of the key.

    >>> t = pa.table({"id": [1, 2, 3], "is_read": [False, False, False], "key": ["a"] * 3, "val": ["1", "2", "3"]})
    >>> from txns.resolve.batch import resolve
    >>> remove_overwritten_writes(t, resolve(t))["id"].to_pylist()
    [3]
    """
    t = check(intents)
    return t.filter(pa.array(_keep_unoverwritten(t, resolution)))


def _surviving_rows(t: pa.Table, res: Resolution) -> np.ndarray:
    rows = np.arange(t.num_rows)
    for keep in (_keep_unfailed, _keep_uncommitted_reads, _keep_unoverwritten):
        mask = keep(t, res)
        t, rows = t.filter(pa.array(mask)), rows[mask]
    return rows


def maintain(intents: pa.Table, resolution: Resolution) -> pa.Table:
    """All three tasks in the post's order: what remains of ``intents``.

    After all three only the store's writes remain (plus the latest committed
    write of each deleted key, a delete):

    >>> rows = [(5, False, "alice", "50"), (3, True, "alice", "100"), (3, False, "alice", "70"),
    ...         (4, True, "alice", "60"), (4, False, "alice", "0")]
    >>> t = pa.table(dict(zip(["id", "is_read", "key", "val"], map(list, zip(*rows)))))
    >>> from txns.resolve.batch import resolve
    >>> maintain(t, resolve(t)).to_pylist()
    [{'id': 5, 'is_read': False, 'key': 'alice', 'val': '50'}]
    """
    t = check(intents)
    return t.take(pa.array(_surviving_rows(t, resolution), type=pa.int64()))


def dead_intents(intents: pa.Table, resolution: Resolution) -> pa.Table:
    """The rows :func:`maintain` removes (to ``Resolver.retract`` them, or to ``DELETE``).

    >>> t = pa.table({"id": [1, 2], "is_read": [False, False], "key": ["a", "a"], "val": ["1", "2"]})
    >>> from txns.resolve.batch import resolve
    >>> dead_intents(t, resolve(t))["id"].to_pylist()
    [1]
    """
    t = check(intents)
    keep = np.zeros(t.num_rows, dtype=bool)
    keep[_surviving_rows(t, resolution)] = True
    return t.filter(pa.array(~keep))
