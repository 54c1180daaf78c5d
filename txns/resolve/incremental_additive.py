"""The incremental resolver for additive writes: ``resolve_additive``'s answer kept up to date as its input changes.

The relation and the rule are those of :mod:`txns.resolve.additive`: plain
``intents(id, is_read, key, val)``, additive writes ``adds(id, key, delta)``,
a ``base(key, val)`` store. The value of k as of t is the latest committed plain
write to k below t (or base's; a delete is absent) plus the committed deltas to
k between that write and t; absent with deltas counts from 0. The design is
:mod:`txns.resolve.incremental`'s (per-transaction histories of tentative
outcomes by fixpoint round, evaluation in id order from a heap, downstream
re-evaluation), and that bookkeeping is shared with it in
:mod:`txns.resolve._incremental_base` (here extended: ``_insert``, ``_remove``
and ``_account`` also keep the adder indexes, and a transaction's adds count
as writes downstream); this docstring states what changes.

**State.** Per transaction: its reads, plain writes and adds; its final outcome;
its *history*, the tentative outcomes in fixpoint rounds 0..d-1, where d is
the first round from which the outcome never changes (round 0: all commit; the
history never ends with its final outcome, so its length is d). Per key: the
sorted ids of its readers, of its plain writers and of its finally committed
plain writers; its base value. Per key that is added to, an *adder index*: its
adders' ids in ascending order, their deltas, and Fenwick trees over those
positions:

- ``final``: per adder, its delta and a 1 if its final outcome is commit;
- for each round m below H, the key's longest adder history, a *correction*
  ``fix[m]``: (committed in round m - committed finally) times the delta and
  times 1. This is nonzero only for an adder still in its history at m whose
  round-m outcome differs from its final one. Also ``deeper[m]``: a 1 per adder
  whose history is longer than m.

Why corrections per round, rather than one tree of the adders that commit in
every round plus a list of the rest: take a counter that everyone reads at the
snapshot and adds to. Outcomes there oscillate for a few rounds before they
settle. In the tests' 5,000-transaction workload, a third of the adders have
histories such as (commit, roll back, commit) and roll back in the end. Such a
list would be a third of the history. A correction tree makes any history cost
O(log A_k) per query, and an adder with history length d costs O(d log A_k) to
update.

**Invariants** (between calls, when the heap is empty). (I1) Every
transaction's (final, history) is the fixpoint's: history[n] says whether it is
outside B_n, for n < d(t); final says whether it is outside S. (I2) Each key's
adder index holds every adder of the key with its recorded (final, history).
Its trees are exact (H corrections), or marked stale and rebuilt before their
next query. (I3) ``rounds`` = 1 + the longest history, kept as counts of
transactions per history length. (I4) The committed plain writers of a key are
the plain writers whose final outcome is commit.

**Evaluating a read** of k by t in round n uses the statuses of round
m = n - 1:

1. Scan k's plain writers below t, from the top down, to the first writer w
   committed in round m. Without one, start from the base.
2. Take the adders of k strictly between w and t (two bisections). Their number
   and sum of deltas in round m are ``final`` plus ``fix[m]`` over that range
   (just ``final`` if m >= H), in O(log A_k).
3. The value is null if w is a delete, or there is no w and no base value,
   and no adder counted. Otherwise it is w's (or base's) value, 0 if none,
   plus the sum.

The round's outcome is *stable* (final from round n on) when every status it
consulted is past its history (m >= its length). That covers the writers the
scan visited, and the adders in (w, t): ``deeper[m]`` over that range is 0, or
m >= H. A transaction is evaluated round after round until stable, as in
:mod:`txns.resolve.incremental`.

**Cost.** Let A_k be the adders of k and p the plain writers the scan passes.
One round of one read of k costs O(log |writers of k| + p + log A_k), and no
adder is visited one by one. A transaction is evaluated for at most 1 + (the
longest history among what it consults) rounds. When an adder's outcome or
history changes from length d to d', that costs O(max(d, d') log A_k) per key
it adds to, plus queueing the readers downstream. Each key's readers are
queued at most once per run, not once per changed adder below them (see
``_downstream``).

A new transaction whose id is above every other is evaluated once. Nothing is
downstream of it, and its adds are appended to the trees, O(H_k log A_k). So
it costs the above per key it touches, and none of the history. On a key that
is only added to (a counter), a read costs O(log A_k) per round.
``scan_steps`` counts the plain writers visited and ``tree_queries`` the adder
range queries. The tests check both on a history of 5,000 transactions.

An adder inserted below existing adders of its key, or removed from below the
top, marks the key's trees stale. The next query rebuilds them in
O(H_k A_k). Such a change re-evaluates the key's readers above it anyway,
apart from the readers of other keys.

**Why it equals the batch fixpoint.** The package claim
(:mod:`txns.resolve`) carries over: whether t is in F(B) depends only on B
below t (additive.py). So it suffices that each transaction's computed history
and final outcome are the iteration's B_n membership. This goes by induction
in id order, as in :mod:`txns.resolve.incremental`, with three changes:

(a) *Each round is exact.* Given the true statuses of round m below t, steps
1-3 compute the value of k as of t in round n. The scan is incremental.py's.
For each adder in (w, t), ``final`` plus ``fix[m]`` counts exactly its round-m
status. Below H that is by the definition of the correction. From H on, every
adder is past its history, so its status is its final outcome. So t's round-n
outcome is its membership in B_n.

(b) *Stability.* A stable round consulted only statuses that no longer change.
So every later round's scan stops at the same w, past writers that still roll
back, and counts the same adders. The value and outcome repeat, and the
computed (final, history) is the true one.

(c) *Downstream.* t's evaluation reads the (final, history) of the plain
writers and adders of the keys it reads, below it, as far as a scan reaches.
A plain writer w that commits in every round stops every scan above it at or
above w. It also starts the adder range above w. So a change at i (inserted,
removed, or a changed outcome or history) can only affect readers of the keys
i writes or adds to, with ids above i, up to and including the next such
writer. Those are the readers queued, as in incremental.py. The heap pops ids
in ascending order and only pushes ids above the one being evaluated. So
each transaction is evaluated after everything below it is final, at most
once per change. A reader that is already queued and not yet popped need not
be queued again. A transaction not evaluated yet is recorded as committing,
but no reader above it is evaluated before it is.

*Rounds match exactly.* ``resolve_additive`` counts rounds like
:func:`txns.resolve.resolve`. It starts from B_0 = {}, and the round that finds
no change is counted. By the package docstring that is 1 + max d(t), and
d(t) is the history's length. So ``rounds`` equals its count, not only a
bound. *Store:* per key, take the latest finally committed plain writer (or
base), plus the finally committed adders above it, from ``final``. This is the
value after every transaction of S's complement, which is
``sequential_additive``'s store.

**Numbers.** Sums use Python numbers in tree order. ``resolve_additive``
takes differences of a numpy cumulative sum, and ``sequential_additive`` adds
one delta at a time. With integers (in int64) all three are exact and equal.
With floats they agree when every partial sum is exact (e.g. multiples of a
power of two of moderate size). Otherwise a read's comparison may round
differently in each, as it already can between the two batch functions.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Hashable, Iterable
from itertools import chain
from typing import Any

import pyarrow as pa

from txns.resolve._incremental_base import IncrementalBase, TxnState
from txns.resolve.additive import ADDS_COLUMNS, check_adds, is_number
from txns.resolve.rule import COLUMNS, check, freeze

Number = int | float
ReadOrWrite = tuple[Any, bool, Hashable, Any, Number | None]  # (id, is_read, frozen key, key, val)
AddRow = tuple[Any, Hashable, Any, Number]  # (id, frozen key, key, delta)
Types = tuple[pa.DataType | None, pa.DataType | None, bool]  # (id type, key type, values as float)


class _Fenwick:
    """Sums of positions ``[lo, hi)`` with point updates, O(log n); append and pop at the end, O(log n)."""

    __slots__ = ("tree",)

    def __init__(self, values: Iterable[Number] = ()) -> None:
        tree: list[Number] = [0, *values]  # 1-based: tree[i] sums positions (i - lowbit(i), i]
        n = len(tree) - 1
        for i in range(1, n + 1):
            j = i + (i & -i)
            if j <= n:
                tree[j] += tree[i]
        self.tree = tree

    def prefix(self, count: int) -> Number:
        """The sum of the first ``count`` positions."""
        total: Number = 0
        tree = self.tree
        while count > 0:
            total += tree[count]
            count &= count - 1
        return total

    def range(self, lo: int, hi: int) -> Number:
        return self.prefix(hi) - self.prefix(lo)

    def add(self, pos: int, delta: Number) -> None:
        tree = self.tree
        i, n = pos + 1, len(tree) - 1
        while i <= n:
            tree[i] += delta
            i += i & -i

    def append(self, value: Number) -> None:
        tree = self.tree
        i = len(tree)
        stop = i - (i & -i)
        total: Number = value
        j = i - 1
        while j > stop:  # the nodes covering (stop, i - 1]
            total += tree[j]
            j &= j - 1
        tree.append(total)

    def pop(self) -> None:
        self.tree.pop()  # no other node covers the last position

    @classmethod
    def zeros(cls, n: int) -> _Fenwick:
        out = cls()
        out.tree = [0] * (n + 1)
        return out


def _committed_in(final: bool | None, hist: tuple[bool, ...], m: int) -> bool:
    """Committed in round ``m``, by a recorded (final, history)? Not evaluated yet counts as committing."""
    if m < len(hist):
        return hist[m]
    return final is None or final


class _Adders:
    """The adders of one key, in id order, and Fenwick trees over their positions.

    ``final_sums``/``final_counts``: the delta and a 1 of each adder whose final
    outcome is commit (not evaluated yet counts as commit). For each round m
    below the longest history, ``fix_sums[m]``/``fix_counts[m]`` correct them to
    round m: (committed in round m - committed finally) times the delta and
    times 1, nonzero only for an adder still in its history at m that differs
    from its final outcome there; ``deeper[m]``: a 1 for each adder whose history
    is longer than m.
    """

    __slots__ = ("deeper", "deltas", "depths", "final_counts", "final_sums", "fix_counts", "fix_sums", "ids",
                 "stale", "txns")

    def __init__(self) -> None:
        self.ids: list[Any] = []
        self.txns: list[_Txn] = []
        self.deltas: list[Number] = []
        self.depths: dict[int, int] = {}  # history length -> adders
        self.final_sums = _Fenwick()
        self.final_counts = _Fenwick()
        self.fix_sums: list[_Fenwick] = []
        self.fix_counts: list[_Fenwick] = []
        self.deeper: list[_Fenwick] = []
        self.stale = False  # an insertion or removal below the top: rebuild the trees before the next query

    def _longest(self) -> int:
        return max((d for d, c in self.depths.items() if c), default=0)

    def _trees(self) -> list[list[_Fenwick]]:
        return [[self.final_sums], [self.final_counts], self.fix_sums, self.fix_counts, self.deeper]

    def insert(self, i: Any, tx: _Txn, delta: Number) -> None:
        """A new adder, not evaluated yet (history length 0, counted as committing)."""
        pos = bisect_left(self.ids, i)
        at_top = pos == len(self.ids)
        self.ids.insert(pos, i)
        self.txns.insert(pos, tx)
        self.deltas.insert(pos, delta)
        self.depths[0] = self.depths.get(0, 0) + 1
        if at_top and not self.stale:
            self.final_sums.append(delta)
            self.final_counts.append(1)
            for tree in chain(self.fix_sums, self.fix_counts, self.deeper):
                tree.append(0)
        else:
            self.stale = True

    def remove(self, i: Any) -> None:
        """Remove an adder."""
        pos = bisect_left(self.ids, i)
        at_top = pos == len(self.ids) - 1
        self.depths[len(self.txns[pos].hist)] -= 1
        del self.ids[pos], self.txns[pos], self.deltas[pos]
        if at_top and not self.stale:
            for trees in self._trees():
                for tree in trees:
                    tree.pop()
            longest = self._longest()
            del self.fix_sums[longest:], self.fix_counts[longest:], self.deeper[longest:]
        else:
            self.stale = True

    def classify(
        self, i: Any, was: tuple[bool | None, tuple[bool, ...]], now: tuple[bool | None, tuple[bool, ...]]
    ) -> None:
        """Adder ``i``'s recorded (final, history) went from ``was`` to ``now``. O(longer history * log adders)."""
        self.depths[len(was[1])] -= 1
        self.depths[len(now[1])] = self.depths.get(len(now[1]), 0) + 1
        if self.stale:
            return
        longest = self._longest()
        n = len(self.ids)
        while len(self.deeper) < longest:  # a round below which no adder was in its history: nothing to correct
            self.fix_sums.append(_Fenwick.zeros(n))
            self.fix_counts.append(_Fenwick.zeros(n))
            self.deeper.append(_Fenwick.zeros(n))
        pos = bisect_left(self.ids, i)
        delta = self.deltas[pos]
        final_was, final_now = _committed_in(was[0], (), 0), _committed_in(now[0], (), 0)
        if final_was != final_now:
            self.final_sums.add(pos, delta if final_now else -delta)
            self.final_counts.add(pos, 1 if final_now else -1)
        for m in range(max(len(was[1]), len(now[1]))):
            fix_was = int(_committed_in(*was, m)) - int(final_was)
            fix_now = int(_committed_in(*now, m)) - int(final_now)
            if fix_was != fix_now:
                self.fix_sums[m].add(pos, (fix_now - fix_was) * delta)
                self.fix_counts[m].add(pos, fix_now - fix_was)
            deep_was, deep_now = len(was[1]) > m, len(now[1]) > m
            if deep_was != deep_now:
                self.deeper[m].add(pos, 1 if deep_now else -1)
        del self.fix_sums[longest:], self.fix_counts[longest:], self.deeper[longest:]

    def fresh(self) -> None:
        """Rebuild the trees if marked stale. O(longest history * adders)."""
        if not self.stale:
            return
        recorded = [(tx.final, tx.hist) for tx in self.txns]
        finals = [_committed_in(f, (), 0) for f, _ in recorded]
        self.final_sums = _Fenwick(d if c else 0 for d, c in zip(self.deltas, finals, strict=True))
        self.final_counts = _Fenwick(int(c) for c in finals)
        rounds = range(self._longest())
        fixes = [[int(_committed_in(f, h, m)) - int(c) for (f, h), c in zip(recorded, finals, strict=True)]
                 for m in rounds]
        self.fix_sums = [_Fenwick(x * d for x, d in zip(fix, self.deltas, strict=True)) for fix in fixes]
        self.fix_counts = [_Fenwick(fix) for fix in fixes]
        self.deeper = [_Fenwick(int(len(h) > m) for _, h in recorded) for m in rounds]
        self.stale = False

    def committed(self, lo: int, hi: int, m: int) -> tuple[int, Number, bool]:
        """(number, sum of deltas) of the adders at positions [lo, hi) committed in round m, and whether every one
        of them is past its history at m (their statuses are the same in every later round). O(log adders)."""
        self.fresh()
        count, total = self.final_counts.range(lo, hi), self.final_sums.range(lo, hi)
        if m >= len(self.deeper):
            return int(count), total, True
        return (int(count + self.fix_counts[m].range(lo, hi)), total + self.fix_sums[m].range(lo, hi),
                self.deeper[m].range(lo, hi) == 0)


class _Txn(TxnState[tuple[Any, Number | None]]):  # reads: frozen key -> (key, val seen); writes: (key, val)
    __slots__ = ("adds",)

    def __init__(self) -> None:
        super().__init__()
        self.adds: dict[Hashable, tuple[Any, Number]] = {}  # frozen key -> (key, delta)

    def outputs(self) -> Iterable[Hashable]:
        """The keys whose readers above this transaction can see it: its plain writes and adds."""
        return chain(self.writes, self.adds)

    def unevaluated_copy(self) -> _Txn:
        """A copy of the rows, not evaluated."""
        tx = _Txn()
        tx.reads, tx.writes, tx.adds = dict(self.reads), dict(self.writes), dict(self.adds)
        return tx

    def same_rows(self, other: _Txn) -> bool:
        return self.reads == other.reads and self.writes == other.writes and self.adds == other.adds

    def empty(self) -> bool:
        return not (self.reads or self.writes or self.adds)


class AdditiveResolver(IncrementalBase[_Txn]):
    """Resolution of a changing set of intents and additive writes, maintained incrementally.

    ``add`` and ``retract`` take ``intents(id, is_read, key, val)`` and/or
    ``adds(id, key, delta)`` (Arrow tables, as :func:`txns.resolve.resolve_additive`);
    ``base(key, val)`` is fixed at construction. Values and deltas are numeric;
    ids must be mutually comparable Python values once converted. The first
    table with rows fixes the id and key types; later ones are cast to them.
    Intents and adds are sets: a row that is there already is no change. Refused
    with ``ValueError``, changing nothing: a second read (or write) of a key by
    one transaction with another value, a second add to a key by one
    transaction with another delta, a plain write and an add of one key by one
    transaction, retracting a row that is not there (same id, key and val or
    delta), malformed or non-numeric tables.

    ``rollback``, ``store`` and ``rounds`` always equal ``resolve_additive`` of
    the current intents, adds and base (``store`` rows in no particular order;
    its ``val`` is float64 once a floating ``val``, ``delta`` or base value has
    been seen, else int64). ``evaluations`` counts transaction evaluations and
    ``scan_steps`` the plain writers they visited, ``tree_queries`` their
    range queries on adder indexes (diagnostics: see the module docstring for
    the bounds).

    The reference's three transactions (T1: B += C, T2: A += B, T3: C += A),
    T2 and T3 first, then T1 below them:

    >>> import pyarrow as pa
    >>> base = pa.table({"key": ["A", "B", "C"], "val": [10, 20, 30]})
    >>> reads = pa.table({"id": [1, 2, 3], "is_read": [True, True, True], "key": ["C", "B", "A"],
    ...                   "val": [30, 20, 10]})
    >>> adds = pa.table({"id": [1, 2, 3], "key": ["B", "A", "C"], "delta": [30, 20, 10]})
    >>> r = AdditiveResolver(base)
    >>> r.add(reads.slice(1), adds.slice(1))  # T2 commits (A = 30), so T3's read of A = 10 fails
    >>> r.rollback["id"].to_pylist(), sorted(zip(r.store["key"].to_pylist(), r.store["val"].to_pylist()))
    ([3], [('A', 30), ('B', 20), ('C', 30)])
    >>> r.add(reads.slice(0, 1), adds.slice(0, 1))  # T1 commits (B = 50): T2 rolls back, T3 commits
    >>> r.rollback["id"].to_pylist(), sorted(zip(r.store["key"].to_pylist(), r.store["val"].to_pylist()))
    ([2], [('A', 10), ('B', 50), ('C', 40)])
    >>> r.rounds
    3
    >>> r.retract(adds=adds.slice(0, 1))  # T1 now only reads: T2 commits again, and T3 rolls back
    >>> r.rollback["id"].to_pylist(), r.rounds
    ([3], 2)

    A counter: a thousand blind adds, then a reader above them, which visits none of them.

    >>> c = AdditiveResolver()
    >>> c.add(adds=pa.table({"id": list(range(1, 1001)), "key": ["n"] * 1000, "delta": [1] * 1000}))
    >>> steps = c.scan_steps
    >>> c.add(pa.table({"id": [1001], "is_read": [True], "key": ["n"], "val": [1000]}))
    >>> c.rollback.num_rows, c.store.to_pylist(), c.scan_steps - steps
    (0, [{'key': 'n', 'val': 1000}], 0)
    """

    def __init__(self, base: pa.Table | None = None) -> None:
        super().__init__()
        self._adders: dict[Hashable, _Adders] = {}
        self._base: dict[Hashable, Number | None] = {}
        self._key_of: dict[Hashable, Any] = {}  # frozen key -> key, for the store
        self._id_type: pa.DataType | None = None
        self._key_type: pa.DataType | None = None
        self._base_key_type: pa.DataType = pa.string()
        self._as_float = False
        self.scan_steps = 0
        self.tree_queries = 0
        if base is not None:
            self._read_base(base)

    # ---- the answers

    @property
    def store(self) -> pa.Table:
        """Per key, its value after every committed transaction (``key``, ``val``; absent keys left out)."""
        keys, vals = [], []
        final = max(1, self.rounds)  # a round past every history: statuses are final outcomes
        for fk in dict.fromkeys(chain(self._base, self._writers, self._adders)):
            value, _, _ = self._value(fk, None, final, committed_only=True)
            if value is not None:
                keys.append(self._key_of[fk])
                vals.append(value)
        return pa.table({
            "key": pa.array(keys, type=self._base_key_type if self._key_type is None else self._key_type),
            "val": pa.array(vals, type=pa.float64() if self._as_float else pa.int64()),
        })

    # ---- changes

    def add(self, intents: pa.Table | None = None, adds: pa.Table | None = None) -> None:
        """Add intent rows and/or additive writes (new transactions, or more rows of existing ones)."""
        rows, add_rows, types = self._read(intents, adds)
        changed: dict[Any, _Txn] = {}

        def txn(i: Any) -> _Txn:
            if i not in changed:
                old = self._txns.get(i)
                changed[i] = old.unevaluated_copy() if old is not None else _Txn()
            return changed[i]

        for i, is_read, fk, key, val in rows:
            side = txn(i).reads if is_read else txn(i).writes
            had = side.get(fk)
            if had is None:
                side[fk] = (key, val)
            elif had[1] != val:
                what = "reads" if is_read else "writes"
                raise ValueError(f"transaction {i!r} would have two {what} of {key!r} ({had[1]!r} and {val!r})")
        for i, fk, key, delta in add_rows:
            had_add = txn(i).adds.get(fk)
            if had_add is None:
                txn(i).adds[fk] = (key, delta)
            elif had_add[1] != delta:
                raise ValueError(f"transaction {i!r} would add to {key!r} twice ({had_add[1]!r} and {delta!r})")
        for i, tx in changed.items():
            for fk in tx.writes.keys() & tx.adds.keys():
                raise ValueError(f"transaction {i!r} would both write and add to {tx.adds[fk][0]!r}")
        self._id_type, self._key_type, self._as_float = types
        for i, tx in changed.items():
            old = self._txns.get(i)
            if old is not None and old.same_rows(tx):
                continue  # intents are a set: the same rows again are no change
            if old is not None:
                self._remove(i)
            self._insert(i, tx)
        self._run()

    def retract(self, intents: pa.Table | None = None, adds: pa.Table | None = None) -> None:
        """Remove intent rows and/or additive writes; each must be present (same id, key and val or delta)."""
        rows, add_rows, _ = self._read(intents, adds)
        reduced: dict[Any, _Txn] = {}

        def txn(i: Any) -> _Txn | None:
            if i not in reduced:
                old = self._txns.get(i)
                if old is None:
                    return None
                reduced[i] = old.unevaluated_copy()
            return reduced[i]

        unique_rows = {(i, is_read, fk, val): (i, is_read, fk, key, val) for i, is_read, fk, key, val in rows}
        for i, is_read, fk, key, val in unique_rows.values():  # the same row twice is retracted once
            tx = txn(i)
            side = None if tx is None else tx.reads if is_read else tx.writes
            if side is None or fk not in side or side[fk][1] != val:
                raise ValueError(f"no intent ({i!r}, {is_read}, {key!r}, {val!r}) to retract")
            del side[fk]
        unique_adds = {(i, fk, delta): (i, fk, key, delta) for i, fk, key, delta in add_rows}
        for i, fk, key, delta in unique_adds.values():
            tx = txn(i)
            if tx is None or fk not in tx.adds or tx.adds[fk][1] != delta:
                raise ValueError(f"no add ({i!r}, {key!r}, {delta!r}) to retract")
            del tx.adds[fk]
        for i, tx in reduced.items():
            self._remove(i)
            if not tx.empty():
                self._insert(i, tx)
        self._run()

    # ---- reading tables

    def _read_base(self, base: pa.Table) -> None:
        missing = [c for c in ("key", "val") if c not in base.column_names]
        if missing:
            raise ValueError(f"base lacks column(s) {missing}; need ['key', 'val']")
        b = base.select(["key", "val"]).combine_chunks()
        if b["key"].null_count:
            raise ValueError("base.key has nulls")
        if not is_number(b.schema.field("val").type):
            raise ValueError(f"base.val must be numeric, not {b.schema.field('val').type}")
        for key, val in zip(b["key"].to_pylist(), b["val"].to_pylist(), strict=True):
            fk = freeze(key)
            if fk in self._base:
                raise ValueError("base holds a key twice")
            self._base[fk] = val
            self._key_of[fk] = key
        self._base_key_type = b.schema.field("key").type
        self._as_float = pa.types.is_floating(b.schema.field("val").type)

    def _read(
        self, intents: pa.Table | None, adds: pa.Table | None
    ) -> tuple[list[ReadOrWrite], list[AddRow], Types]:
        """The rows of the tables, and the (id type, key type, as float) they leave; nothing changes yet."""
        types = (self._id_type, self._key_type, self._as_float)
        rows: list[ReadOrWrite] = []
        add_rows: list[AddRow] = []
        if intents is not None:
            t, types = _conform(check(intents), "intents", "val", types)
            rows = [(i, r, freeze(k), k, v) for i, r, k, v in zip(*(t[c].to_pylist() for c in COLUMNS), strict=True)]
        if adds is not None:
            a, types = _conform(check_adds(adds), "adds", "delta", types)
            add_rows = [(i, freeze(k), k, d) for i, k, d in zip(*(a[c].to_pylist() for c in ADDS_COLUMNS), strict=True)]
        return rows, add_rows, types

    # ---- the index (the adder indexes and the key names, beyond the base's)

    def _insert(self, i: Any, tx: _Txn) -> None:
        super()._insert(i, tx)
        for fk, (_, delta) in tx.adds.items():
            adders = self._adders.get(fk)
            if adders is None:
                adders = self._adders[fk] = _Adders()
            adders.insert(i, tx, delta)
        for fk, (key, _) in chain(tx.reads.items(), tx.writes.items(), tx.adds.items()):
            self._key_of.setdefault(fk, key)

    def _remove(self, i: Any) -> None:
        tx = self._txns[i]
        super()._remove(i)
        for fk in tx.adds:
            self._adders[fk].remove(i)

    def _account(self, i: Any, tx: _Txn, final: bool | None, hist: tuple[bool, ...]) -> None:
        was = (tx.final, tx.hist)
        super()._account(i, tx, final, hist)
        for fk in tx.adds:
            self._adders[fk].classify(i, was, (final, hist))

    def _rollback_type(self) -> pa.DataType:
        return pa.int64() if self._id_type is None else self._id_type

    # ---- evaluation

    def _round(self, i: Any, tx: _Txn, m: int) -> tuple[bool, bool]:
        """(does every read of transaction ``i`` see its value in round m + 1, stable from then on)."""
        ok, stable = True, True
        for fk, (_, seen) in tx.reads.items():
            value, steady, steps = self._value(fk, i, m)
            self.scan_steps += steps
            stable = stable and steady
            if (value is None) != (seen is None) or (value is not None and value != seen):
                ok = False
        return ok, stable

    def _value(
        self, fk: Hashable, before: Any, m: int, committed_only: bool = False
    ) -> tuple[Number | None, bool, int]:
        """(value of key ``fk`` as of id ``before`` in round ``m``, whether stable from round m on, steps).

        ``before`` None: after every transaction. ``committed_only``: take the
        latest plain writer from the finally committed ones (``m`` must be past
        every history then).
        """
        stable, steps = True, 0
        start: Number | None = self._base.get(fk)
        after: Any = None  # the id of the plain writer the value starts from; None: the base
        if committed_only:
            ws = self._committed.get(fk)
            if ws:
                after = ws[-1]
                start = self._txns[after].writes[fk][1]
        else:
            ws = self._writers.get(fk)
            if ws:
                for j in range(bisect_left(ws, before) - 1, -1, -1):
                    steps += 1
                    w = self._txns[ws[j]]
                    if len(w.hist) > m:
                        stable = False
                    if w.status(m):
                        after = ws[j]
                        start = w.writes[fk][1]
                        break
        adders = self._adders.get(fk)
        if adders is None or not adders.ids:
            return start, stable, steps
        ids = adders.ids
        lo = 0 if after is None else bisect_right(ids, after)
        hi = len(ids) if before is None else bisect_left(ids, before)
        count: int = 0
        total: Number = 0
        if hi > lo:
            self.tree_queries += 1
            count, total, settled = adders.committed(lo, hi, m)
            stable = stable and settled
        if start is None:
            return (total if count else None), stable, steps
        return start + total, stable, steps


def _conform(t: pa.Table, name: str, value: str, types: Types) -> tuple[pa.Table, Types]:
    """``t`` (its columns checked) with ``value`` checked numeric and ``id``, ``key`` cast to the types the resolver
    holds (``t``'s own where it holds none yet, if ``t`` has rows), and the types it leaves; else ``ValueError``."""
    value_type = t.schema.field(value).type
    if not is_number(value_type):
        raise ValueError(f"{name}.{value} must be numeric, not {value_type}")
    if not t.num_rows:
        return t, types
    id_type, key_type, as_float = types
    id_type = t.schema.field("id").type if id_type is None else id_type
    key_type = t.schema.field("key").type if key_type is None else key_type
    t = _cast(_cast(t, name, "id", id_type), name, "key", key_type)
    return t, (id_type, key_type, as_float or pa.types.is_floating(value_type))


def _cast(t: pa.Table, name: str, column: str, typ: pa.DataType | None) -> pa.Table:
    """``t`` with ``column`` cast to ``typ`` (the type the resolver holds); ``ValueError`` if it cannot be."""
    idx = t.schema.get_field_index(column)
    if typ is None or t.schema.field(idx).type == typ:
        return t
    try:
        return t.set_column(idx, column, t[column].cast(typ))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise ValueError(f"{name}.{column} of type {t.schema.field(idx).type}, not {typ} as before: {e}") from e
