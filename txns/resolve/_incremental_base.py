"""What the two incremental resolvers share: per-transaction histories, the run in id order, downstream queueing.

:class:`txns.resolve.incremental.Resolver` and
:class:`txns.resolve.incremental_additive.AdditiveResolver` differ in how a
transaction's rows are read and checked, how a read is evaluated and what
``store`` holds; the bookkeeping below is theirs in common. Their module
docstrings state why it yields the batch fixpoint; this one states what it keeps.

**State** (:class:`IncrementalBase`). Per transaction (:class:`TxnState`): its
reads and plain writes by frozen key, its final outcome (None: not evaluated
yet), and its *history*, the tentative outcomes in fixpoint rounds 0..d-1
(it never ends with the final outcome, so its length is d). Per key: the
sorted ids of its readers, of its plain writers and of its plain writers whose
final outcome is commit. The ids that finally roll back; the number of
evaluated transactions per history length. A heap of ids to evaluate.

**Invariants** (between calls, when the heap is empty): (B1) the readers and
plain writers of each key are exactly the transactions holding a read or plain
write of it, sorted; (B2) the committed writers of a key, ``_rolled`` and
``_depths`` agree with every transaction's recorded (final, history), as
``_account`` keeps them; so ``rollback`` is the rolled-back ids and ``rounds``
is 1 + the longest history.

**A run** pops ids in ascending order (each once per run, however often
queued) and re-evaluates them (``_evaluate``: round after round of the
subclass's ``_round``, until a round consulted only statuses past their
histories); when the (final, history) changes, ``_account`` records it and
``_downstream`` queues the readers of the keys the transaction writes
(``TxnState.outputs``) above it, up to and including the key's next plain
writer that commits in every round (no scan goes past it). Every push is above
the id being evaluated, so a transaction is evaluated after everything below
it is final.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort
from collections.abc import Hashable, Iterable
from typing import Any, Generic, TypeVar

import pyarrow as pa

V = TypeVar("V")


class TxnState(Generic[V]):
    """One transaction's reads and plain writes (frozen key -> ``V``) and its recorded (final, history)."""

    __slots__ = ("final", "hist", "reads", "writes")

    def __init__(self) -> None:
        self.reads: dict[Hashable, V] = {}
        self.writes: dict[Hashable, V] = {}
        self.final: bool | None = None  # None: not evaluated yet
        self.hist: tuple[bool, ...] = ()

    def status(self, n: int) -> bool:
        """Committed in fixpoint round ``n``?"""
        if n < len(self.hist):
            return self.hist[n]
        assert self.final is not None, "a transaction consulted before it was evaluated"
        return self.final

    def outputs(self) -> Iterable[Hashable]:
        """The keys whose readers above this transaction can see it: its plain writes."""
        return self.writes


T = TypeVar("T", bound=TxnState[Any])


class IncrementalBase(Generic[T]):
    """The per-transaction bookkeeping, the run and the downstream queueing of an incremental resolver.

    A subclass supplies ``_round`` (whether a transaction's reads succeed in a
    round, from the statuses below it in the round before), ``_rollback_type`` (the Arrow type of ``rollback``'s ids),
    and extends ``_insert``/``_remove``/``_account`` for any other index it keeps.
    """

    def __init__(self) -> None:
        self._txns: dict[Any, T] = {}
        self._readers: dict[Hashable, list[Any]] = {}
        self._writers: dict[Hashable, list[Any]] = {}  # plain writers
        self._committed: dict[Hashable, list[Any]] = {}  # plain writers whose final outcome is commit
        self._rolled: set[Any] = set()
        self._depths: dict[int, int] = {}  # history length -> number of transactions
        self._heap: list[Any] = []
        self.evaluations = 0

    # ---- the answers

    @property
    def rollback(self) -> pa.Table:
        """The transactions that roll back: one column ``id``, ascending."""
        return pa.table({"id": pa.array(sorted(self._rolled), type=self._rollback_type())})

    @property
    def rounds(self) -> int:
        """The rounds the fixpoint over the current input takes (1 when nothing ever rolls back)."""
        return 1 + max((d for d, c in self._depths.items() if c), default=0)

    # ---- for subclasses

    def _rollback_type(self) -> pa.DataType:
        raise NotImplementedError

    def _round(self, i: Any, tx: T, m: int) -> tuple[bool, bool]:
        """(does every read of transaction ``i`` see its value in round m + 1, given the round-m statuses below
        ``i``; was every status consulted past its history, so that every later round repeats this one)."""
        raise NotImplementedError

    # ---- the index

    def _insert(self, i: Any, tx: T) -> None:
        """Index a new transaction (not evaluated yet) and queue it."""
        self._txns[i] = tx
        for k in tx.reads:
            insort(self._readers.setdefault(k, []), i)
        for k in tx.writes:
            insort(self._writers.setdefault(k, []), i)
        heapq.heappush(self._heap, i)

    def _remove(self, i: Any) -> None:
        """Unindex transaction ``i`` and queue the readers it could affect."""
        tx = self._txns[i]
        self._account(i, tx, None, ())
        for k in tx.reads:
            _discard(self._readers[k], i)
        for k in tx.writes:
            _discard(self._writers[k], i)
        del self._txns[i]
        self._downstream(i, tx)

    def _account(self, i: Any, tx: T, final: bool | None, hist: tuple[bool, ...]) -> None:
        """Move transaction ``i`` from its recorded outcome/history to (final, hist)."""
        if tx.final is not None:
            self._depths[len(tx.hist)] -= 1
            if tx.final:
                for k in tx.writes:
                    _discard(self._committed[k], i)
            else:
                self._rolled.discard(i)
        tx.final, tx.hist = final, hist
        if final is not None:
            self._depths[len(hist)] = self._depths.get(len(hist), 0) + 1
            if final:
                for k in tx.writes:
                    insort(self._committed.setdefault(k, []), i)
            else:
                self._rolled.add(i)

    def _downstream(self, i: Any, tx: T, queued: dict[Hashable, Any] | None = None) -> None:
        """Queue the readers whose evaluations can consult transaction ``i`` (the keys of ``tx.outputs()``).

        ``queued`` (during a run, whose evaluations go up in id order): per key, the
        highest reader queued for it in this run. The readers of the key between
        ``i`` and that one are still queued (queued above an earlier, lower
        evaluation, not popped yet), so only those above it are pushed. Without
        it, a counter's n adders would push its readers O(n) times each.
        """
        for k in tx.outputs():
            readers = self._readers.get(k)
            if not readers:
                continue
            ws = self._writers.get(k, [])
            hi = len(readers)
            for j in range(bisect_right(ws, i), len(ws)):
                w = self._txns[ws[j]]
                if w.final and not w.hist:  # commits in every round: no scan passes it
                    hi = bisect_right(readers, ws[j])
                    break
            lo = bisect_right(readers, i)
            if queued is not None and k in queued:
                lo = max(lo, bisect_right(readers, queued[k]))
            for r in readers[lo:hi]:
                heapq.heappush(self._heap, r)
            if queued is not None and hi > lo:
                queued[k] = readers[hi - 1]

    # ---- evaluation

    def _evaluate(self, i: Any, tx: T) -> tuple[bool, tuple[bool, ...]]:
        """(final outcome, history) of transaction ``i``, from those of the transactions below it: its rounds
        (``_round``) one after another until one is stable."""
        self.evaluations += 1
        hist = [True]  # round 0: everything commits
        n = 1
        while True:
            ok, stable = self._round(i, tx, n - 1)
            if stable:
                while hist and hist[-1] == ok:
                    hist.pop()
                return ok, tuple(hist)
            hist.append(ok)
            n += 1

    def _run(self) -> None:
        """Evaluate the queued transactions in id order, queueing downstream whatever changes."""
        queued: dict[Hashable, Any] = {}  # per key, the highest reader queued by this run's evaluations
        last = None
        while self._heap:
            i = heapq.heappop(self._heap)
            if i == last:
                continue
            last = i
            tx = self._txns.get(i)
            if tx is None:
                continue
            was = (tx.final, tx.hist)
            final, hist = self._evaluate(i, tx)
            if (final, hist) != was:
                self._account(i, tx, final, hist)
                self._downstream(i, tx, queued)


def _discard(xs: list[Any], x: Any) -> None:
    """Remove ``x`` from the sorted list ``xs`` if it is there."""
    j = bisect_left(xs, x)
    if j < len(xs) and xs[j] == x:
        del xs[j]
