"""Transactions resolved in the data plane: read/write-set intents, the rollback fixpoint, the store.

Follows the design in ``shared/reference/data-plane-transactions.md`` (issue
#11). Pure pyarrow/numpy; no persist, no database.

**The relation.** ``intents(id, is_read, key, val)``, an Arrow table. A
transaction is the rows of one ``id``: reads (``is_read``; ``val`` is what it
saw, null for "absent") and writes (``val`` to write, null for a delete). A
row twice counts once; at most one read and one write per (id, key). ``id`` totally orders transactions:
int64 here (any Arrow type that sorts works in the batch resolver; the
incremental one needs ids whose Python values compare). A caller with
(epoch, uuid) ids maps them to one sortable value, e.g. ``epoch << 64 | uuid``
as a decimal or a fixed-width binary, or ``epoch * N + seq`` as an int64.
``key`` and ``val`` may be any Arrow type; for several tables use a struct key
``{table, key}`` (tests do). Values compare by equality, nulls equal.

**The rule.** Transaction t *commits* iff each of its reads (k, v) has v equal
to the value of the latest write to k, by a committed transaction with id < t
(null if there is none; a committed delete reads as null, i.e. absent). The
*store* maps each key to its latest committed write, deleted keys left out.
:func:`txns.resolve.rule.sequential` is this rule, one transaction at a time.

**The fixpoint** (the post's ``to_rollback``). For a set B of ids let F(B) be
the ids with a read that differs from the latest write before it by a
transaction *not in B*. Start from B_0 = {} and iterate B_{n+1} = F(B_n)
until B_{n+1} = B_n; ``rounds`` counts the iterations, the one that saw no
change included.

*Claim.* The iteration stops after at most m + 1 rounds (m distinct ids) and
its result is S, the set the sequential rule rolls back.

*Proof.* Let t_1 < ... < t_m be the ids. (a) Locality: whether t is in F(B)
depends only on B ∩ {ids < t}, because a read of t only looks at writes with
smaller ids. (b) S is a fixed point: the sequential rule rolls t back iff a
read differs from the latest write before it by a transaction not in S, which
is the definition of t ∈ F(S). (c) The fixed point is unique: if B = F(B) and
B ≠ S, let t be the smallest id on which they differ; B and S agree below t,
so by (a) F(B) and F(S) agree on t, i.e. B and S agree on t, contradiction.
(d) Progress, by induction on n: B_n agrees with S on t_1..t_n. n = 0 is
empty. If B_n agrees with S on t_1..t_n, then for j <= n + 1, membership of
t_j in B_{n+1} = F(B_n) depends by (a) only on B_n below t_j, i.e. on
t_1..t_{j-1}, where B_n = S; so it equals membership in F(S) = S (b). Hence
B_m = S, B_{m+1} = F(S) = S: the iteration stops by round m + 1. It cannot
stop earlier on anything else: B_{n+1} = B_n makes B_n a fixed point, which
by (c) is S. So the fixpoint and the sequential rule roll back the same
transactions and (taking the latest surviving write per key) give the same
store. ∎

A sharper count, used by the incremental resolver: let d(t) be the first
round from which t's membership never changes. Then the rounds are
1 + max_t d(t) (B_n = S exactly when n >= every d(t), and one more round
sees no change). With random ids and sparse conflicts d is small: the post's
10,000-transaction workload takes a handful of rounds.

**Invariants** (tested in tests/resolve against the sequential model, with
Hypothesis): ``resolve(I)`` = sequential(I); ``Resolver`` after any sequence
of ``add``/``retract`` (ids in any order) = ``resolve`` of the current
intents, rollback, store and rounds alike; maintenance (:func:`maintain`)
keeps the store and the outcome of every remaining id, and later intents with
higher ids resolve the same on top of the maintained intents.

**Extensions.** :mod:`txns.resolve.additive` (part 6): additive writes
``adds(id, key, delta)`` beside the intents, the rule with them
(:func:`sequential_additive`, :func:`resolve_additive`), and the pairwise
resolver (:func:`pairwise`), exact under conditions stated there;
:mod:`txns.resolve.incremental_additive`: :class:`AdditiveResolver`, the
incremental resolver for them (``resolve_additive``'s answer and rounds kept up
to date under ``add``/``retract``; a read of a key that is only added to costs
O(log adders), not O(adders)).
:mod:`txns.resolve.order` (part 7): choosing the serialization order within an
epoch (:func:`txns.resolve.order.reorder`) so that more transactions commit;
the rule then applies unchanged in the new order.

>>> import pyarrow as pa
>>> t = pa.table({"id": [1, 2, 2, 3, 3], "is_read": [False, True, False, True, False],
...               "key": ["a", "a", "a", "a", "b"], "val": ["1", "1", "2", "1", "x"]})
>>> res = resolve(t)
>>> res.rollback["id"].to_pylist(), res.store.to_pylist(), res.rounds
([3], [{'key': 'a', 'val': '2'}], 2)
>>> maintain(t, res).to_pylist()
[{'id': 2, 'is_read': False, 'key': 'a', 'val': '2'}]
"""

from __future__ import annotations

from txns.resolve.additive import pairwise, resolve_additive, sequential_additive
from txns.resolve.batch import resolve
from txns.resolve.incremental import Resolver
from txns.resolve.incremental_additive import AdditiveResolver
from txns.resolve.maintain import (
    dead_intents,
    maintain,
    remove_committed_reads,
    remove_failed,
    remove_overwritten_writes,
)
from txns.resolve.repair import BatchContext, Execution, RepairResult, execute, repair
from txns.resolve.rule import Resolution, sequential

__all__ = [
    "AdditiveResolver",
    "BatchContext",
    "Execution",
    "RepairResult",
    "Resolution",
    "Resolver",
    "dead_intents",
    "execute",
    "maintain",
    "pairwise",
    "remove_committed_reads",
    "remove_failed",
    "remove_overwritten_writes",
    "repair",
    "resolve",
    "resolve_additive",
    "sequential",
    "sequential_additive",
]
