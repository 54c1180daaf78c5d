"""Tests of :class:`txns.resolve.AdditiveResolver`: the incremental resolver for additive writes.

The references are ``resolve_additive`` (rollback, store and rounds),
``sequential_additive``, and the independent model of test_additive.py. The
resolver must agree with them after any sequence of adds and retractions, ids
in any order. Also tested: the reference's three transactions in every order and
in several chunkings, the refused changes (each leaves the state as it was), and
the cost bound of the module docstring. On a history of 5,000 transactions, most
of them readers and adders of counters, each new transaction above it takes one
evaluation, a few plain-writer scan steps, and one adder-index query per round
per counter read, none of them growing with the history.
``HYPOTHESIS_PROFILE=slow`` runs the properties deeper.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.resolve.test_additive import (
    ADDS,
    BASE,
    BASES,
    OUTCOME,
    READS,
    Add,
    Row,
    answer,
    draw_transactions,
    model,
    tables,
)
from tests.resolve.test_resolve import PROFILE
from txns.resolve import AdditiveResolver, Resolution, resolve_additive, sequential_additive
from txns.resolve import incremental_additive as module

Answer = tuple[list[Any], dict[Any, Any]]


def state(r: AdditiveResolver) -> tuple[Answer, int]:
    return answer(Resolution(r.rollback, r.store, r.rounds)), r.rounds


def check_against_batch(
    r: AdditiveResolver, rows: list[Row], adds: list[Add], base: dict[str, int] | None, with_model: bool = True
) -> None:
    """The resolver's rollback, store and rounds are resolve_additive's; rollback and store sequential_additive's
    (and the independent model's: quadratic, so left out on big inputs)."""
    tabs = tables(rows, adds, base)
    batch = resolve_additive(*tabs)
    got, rounds = state(r)
    assert got == answer(batch)
    assert rounds == batch.rounds
    assert got == answer(sequential_additive(*tabs))
    if with_model:
        assert got == model(rows, adds, base)


def check_adder_indexes(r: AdditiveResolver) -> None:
    """Invariant (I2) of the module docstring, white-box: each key's trees (unless marked stale, to be rebuilt) give,
    for every round m up to the longest history, the count and deltas of its adders committed in round m and the
    count of those still in their history; past that, the final outcomes."""
    for adders in r._adders.values():
        assert adders.ids == sorted(adders.ids) and len(adders.txns) == len(adders.deltas) == len(adders.ids)
        if adders.stale:
            continue
        longest = max((len(tx.hist) for tx in adders.txns), default=0)
        assert len(adders.fix_sums) == len(adders.fix_counts) == len(adders.deeper) == longest
        for m in range(longest + 2):
            for lo, hi in itertools.combinations(range(len(adders.ids) + 1), 2):
                txs = [(p, adders.txns[p]) for p in range(lo, hi)]
                committed = [p for p, tx in txs if module._committed_in(tx.final, tx.hist, m)]
                still_moving = any(len(tx.hist) > m for _, tx in txs)
                assert adders.committed(lo, hi, m) == (
                    len(committed), sum(adders.deltas[p] for p in committed), not still_moving
                )


def add(r: AdditiveResolver, rows: list[Row], adds: list[Add]) -> None:
    i, a, _ = tables(rows, adds, None)
    r.add(i if rows else None, a if adds else None)


def retract(r: AdditiveResolver, rows: list[Row], adds: list[Add]) -> None:
    i, a, _ = tables(rows, adds, None)
    r.retract(i if rows else None, a if adds else None)


def base_table(base: dict[str, int] | None) -> pa.Table | None:
    return tables([], [], base)[2]


# ---- the reference's three transactions: T1: B += C, T2: A += B, T3: C += A; A = 10, B = 20, C = 30


def three(order: tuple[int, ...]) -> tuple[list[Row], list[Add], tuple[int, dict[str, int]]]:
    pos = {t: n + 1 for n, t in enumerate(order)}
    victim, store = OUTCOME[order[0]]
    return [(pos[t], True, *READS[t]) for t in (1, 2, 3)], [(pos[t], *ADDS[t]) for t in (1, 2, 3)], (pos[victim], store)


CHUNKINGS = ["all_at_once", "one_txn_descending", "reads_then_adds", "adds_then_reads", "one_row_at_a_time_shuffled"]


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("order", list(itertools.permutations([1, 2, 3])))
def test_three_transactions(order: tuple[int, int, int], chunking: str) -> None:
    rows, adds, (victim, store) = three(order)
    r = AdditiveResolver(base_table(BASE))
    if chunking == "all_at_once":
        add(r, rows, adds)
    elif chunking == "one_txn_descending":
        for i in (3, 2, 1):
            add(r, [x for x in rows if x[0] == i], [x for x in adds if x[0] == i])
            check_against_batch(r, [x for x in rows if x[0] >= i], [x for x in adds if x[0] >= i], BASE)
    elif chunking == "reads_then_adds":
        add(r, rows, [])
        add(r, [], adds)
    elif chunking == "adds_then_reads":
        add(r, [], adds)
        add(r, rows, [])
    else:
        items: list[tuple[Row | None, Add | None]] = [(x, None) for x in rows] + [(None, x) for x in adds]
        random.Random("".join(map(str, order))).shuffle(items)
        for row, delta in items:
            add(r, [row] if row else [], [delta] if delta else [])
    assert state(r)[0] == ([victim], store)
    check_against_batch(r, rows, adds, BASE)
    # and back out one transaction at a time, top first
    for i in (3, 2, 1):
        retract(r, [x for x in rows if x[0] == i], [x for x in adds if x[0] == i])
        check_against_batch(r, [x for x in rows if x[0] < i], [x for x in adds if x[0] < i], BASE)
    assert r.rollback.num_rows == 0 and answer(Resolution(r.rollback, r.store, 1))[1] == BASE


# ---- examples


def test_an_adder_with_a_long_history_is_consulted_round_by_round() -> None:
    """2 adds to k and rolls back in round 1 only; 3 reads k = 5, so its history follows 2's a round later."""
    rows: list[Row] = [
        (0, False, "x", 1),
        (1, True, "z", 7), (1, False, "x", 2),  # z is never written: rolls back from round 1 on
        (2, True, "x", 1),  # round 1 sees 1's x = 2: rolled back; from round 2 on x = 1: commits
        (3, True, "k", 5),  # round 1: 5; round 2: 2 rolled back in round 1, k absent; round 3 on: 5
    ]
    adds: list[Add] = [(2, "k", 5)]
    r = AdditiveResolver()
    add(r, rows, adds)
    check_against_batch(r, rows, adds, None)
    assert r.rounds == resolve_additive(*tables(rows, adds, None)).rounds == 4
    evaluations, queries = r.evaluations, r.tree_queries
    add(r, [(4, True, "k", 5)], [])  # one adder-index query per round, until past 2's history
    assert r.evaluations - evaluations == 1 and r.tree_queries - queries == 3
    check_against_batch(r, [*rows, (4, True, "k", 5)], adds, None)


def test_deletes_and_base() -> None:
    rows: list[Row] = [
        (1, False, "a", None),  # delete a (base 4)
        (3, True, "a", 2),  # absent + 2 (from 2's add) = 2
        (4, True, "b", None),  # b never written
        (5, False, "b", 7), (6, True, "b", 8),
    ]
    adds: list[Add] = [(2, "a", 2), (5, "c", 1), (6, "b", 1), (7, "b", 1)]
    base = {"a": 4, "c": 0}
    r = AdditiveResolver(base_table(base))
    add(r, rows[::-1], adds[::-1])
    check_against_batch(r, rows, adds, base)
    retract(r, [(1, False, "a", None)], [])  # now 3 sees 4 + 2
    check_against_batch(r, rows[1:], adds, base)
    add(r, [(1, False, "a", 0)], [])  # 0 is a value, not a delete
    check_against_batch(r, [(1, False, "a", 0), *rows[1:]], adds, base)


def test_float_deltas() -> None:
    i = pa.table({"id": [3, 4], "is_read": [True, True], "key": ["k", "k"], "val": [1.5, 2.0]})
    a = pa.table({"id": [1, 2, 3], "key": ["k", "k", "k"], "delta": [1.0, 0.5, 0.25]})
    r = AdditiveResolver()
    r.add(i, a)
    batch = resolve_additive(i, a)
    assert answer(Resolution(r.rollback, r.store, r.rounds)) == answer(batch) == ([4], {"k": 1.75})
    assert r.store.schema.field("val").type == pa.float64() and r.rounds == batch.rounds


def test_struct_keys_and_string_ids() -> None:
    key = pa.struct([("table", pa.string()), ("key", pa.int64())])
    counter = {"table": "t", "key": 1}
    i = pa.table({"id": pa.array(["e1-2", "e1-3"]), "is_read": [True, True], "key": pa.array([counter] * 2, key),
                  "val": pa.array([1, 1], pa.int64())})
    a = pa.table({"id": pa.array(["e1-1", "e1-2"]), "key": pa.array([counter] * 2, key), "delta": [1, 1]})
    r = AdditiveResolver()
    r.add(adds=a)
    r.add(i)
    batch = resolve_additive(i, a)
    assert r.rollback.equals(batch.rollback) and r.rollback["id"].to_pylist() == ["e1-3"]
    assert r.store.to_pylist() == batch.store.to_pylist() == [{"key": counter, "val": 2}]
    r.retract(i.slice(1))
    assert r.rollback.num_rows == 0


# ---- refused changes


def test_refused_changes_leave_the_state_unchanged() -> None:
    rows: list[Row] = [(1, True, "a", None), (1, False, "b", 1), (2, True, "b", 1), (3, True, "c", 2)]
    adds: list[Add] = [(1, "c", 2), (2, "a", 1)]
    r = AdditiveResolver(base_table({"a": 0}))
    add(r, rows, adds)
    before = (state(r), r.rollback, sorted(r.store.to_pylist(), key=str))

    def unchanged() -> None:
        assert (state(r), r.rollback, sorted(r.store.to_pylist(), key=str)) == before

    add(r, rows[:2], adds[:1])  # a set: the same rows again are no change
    add(r, [rows[0], rows[0]], [adds[0], adds[0]])
    unchanged()
    refused: list[tuple[str, Any]] = [
        ("two reads", lambda: add(r, [(1, True, "a", 5)], [])),
        ("two writes", lambda: add(r, [(1, False, "b", 2)], [])),
        ("two writes", lambda: add(r, [(9, False, "z", 1), (9, False, "z", 2)], [])),
        ("add to 'c' twice", lambda: add(r, [], [(1, "c", 3)])),
        ("add to 'k' twice", lambda: add(r, [], [(9, "k", 1), (9, "k", 2)])),
        ("both write and add", lambda: add(r, [(2, False, "a", 4)], [])),
        ("both write and add", lambda: add(r, [], [(1, "b", 4)])),
        ("both write and add", lambda: add(r, [(8, False, "q", 1), (7, True, "q", 1)], [(8, "q", 1)])),
        ("no intent", lambda: retract(r, [(1, True, "a", 1)], [])),  # another value
        ("no intent", lambda: retract(r, [(5, True, "a", None)], [])),  # no such transaction
        ("no intent", lambda: retract(r, [(1, True, "a", None), (2, False, "b", 1)], [])),  # half of it is there
        ("no add", lambda: retract(r, [], [(1, "c", 3)])),
        ("no add", lambda: retract(r, [(1, True, "a", None)], [(2, "c", 2)])),
        ("numeric", lambda: r.add(pa.table({"id": [4], "is_read": [True], "key": ["a"], "val": ["x"]}))),
        ("numeric", lambda: r.add(adds=pa.table({"id": [4], "key": ["a"], "delta": ["x"]}))),
        ("column", lambda: r.add(adds=pa.table({"id": [4], "key": ["a"]}))),
        ("column", lambda: r.add(pa.table({"id": [4], "key": ["a"], "val": [1]}))),
        ("nulls", lambda: r.add(adds=pa.table({"id": [4], "key": ["a"], "delta": pa.array([None], pa.int64())}))),
        ("not .* as before", lambda: r.add(adds=pa.table({"id": ["x"], "key": ["a"], "delta": [1]}))),
    ]
    for message, change in refused:
        with pytest.raises(ValueError, match=message):
            change()
        unchanged()
    # retracting a row twice in one call retracts it once
    retract(r, [(3, True, "c", 2), (3, True, "c", 2)], [])
    check_against_batch(r, rows[:3], adds, {"a": 0})
    with pytest.raises(ValueError, match="twice"):
        AdditiveResolver(pa.table({"key": ["a", "a"], "val": [1, 2]}))
    with pytest.raises(ValueError, match="numeric"):
        AdditiveResolver(pa.table({"key": ["a"], "val": ["x"]}))


# ---- properties


@st.composite
def transactions(draw: st.DrawFn, ids: list[int]) -> tuple[list[Row], list[Add]]:
    """Each key may get a read, and a plain write or (two times in five) an add."""
    return draw_transactions(draw, ids, kinds=5, add_kinds=2)


@PROFILE
@given(st.data())
def test_interleaved_adds_and_retractions_match_batch(data: st.DataObject) -> None:
    base = data.draw(BASES)
    r = AdditiveResolver(base_table(base))
    rows: list[Row] = []
    adds: list[Add] = []
    for _ in range(data.draw(st.integers(1, 8))):
        op = data.draw(st.sampled_from(["add", "add", "extend", "again", "retract", "retract_txn"]))
        used = sorted({x[0] for x in rows} | {x[0] for x in adds})
        if op == "add":
            free = sorted(set(range(41)) - set(used))
            ids = data.draw(st.lists(st.sampled_from(free), unique=True, max_size=4)) if free else []
            new_rows, new_adds = data.draw(transactions(ids))
        elif op == "extend" and used:  # more rows for an existing transaction, none conflicting
            i = data.draw(st.sampled_from(used))
            reads = {k for j, r_, k, _ in rows if j == i and r_}
            writes = {k for j, r_, k, _ in rows if j == i and not r_} | {k for j, k, _ in adds if j == i}
            more_rows, more_adds = data.draw(transactions([i]))
            new_rows = [x for x in more_rows if x[2] not in (reads if x[1] else writes)]
            new_adds = [x for x in more_adds if x[1] not in writes]
        elif op == "again" and used:  # rows that are there: no change
            new_rows = data.draw(st.lists(st.sampled_from(rows), max_size=3)) if rows else []
            new_adds = data.draw(st.lists(st.sampled_from(adds), max_size=3)) if adds else []
            add(r, new_rows, new_adds)
            new_rows, new_adds = [], []
        elif op == "retract" and used:
            gone_rows = data.draw(st.lists(st.sampled_from(rows), unique=True, max_size=3)) if rows else []
            gone_adds = data.draw(st.lists(st.sampled_from(adds), unique=True, max_size=3)) if adds else []
            retract(r, gone_rows, gone_adds)
            rows = [x for x in rows if x not in gone_rows]
            adds = [x for x in adds if x not in gone_adds]
            new_rows, new_adds = [], []
        elif op == "retract_txn" and used:
            i = data.draw(st.sampled_from(used))
            retract(r, [x for x in rows if x[0] == i], [x for x in adds if x[0] == i])
            rows = [x for x in rows if x[0] != i]
            adds = [x for x in adds if x[0] != i]
            new_rows, new_adds = [], []
        else:
            new_rows, new_adds = [], []
        if new_rows or new_adds:
            add(r, new_rows, new_adds)
            rows += new_rows
            adds += new_adds
        check_against_batch(r, rows, adds, base)
        check_adder_indexes(r)


@PROFILE
@given(st.data())
def test_ids_arriving_in_any_order_and_chunking(data: st.DataObject) -> None:
    """The same transactions, added in a random order in random chunks (rows and adds apart), resolve the same."""
    base = data.draw(BASES)
    ids = data.draw(st.lists(st.integers(0, 30), unique=True, max_size=10))
    rows, adds = data.draw(transactions(ids))
    items: list[tuple[Row | None, Add | None]] = [(x, None) for x in rows] + [(None, x) for x in adds]
    items = data.draw(st.permutations(items))
    r = AdditiveResolver(base_table(base))
    k = 0
    while k < len(items):
        n = data.draw(st.integers(1, 4))
        chunk = items[k : k + n]
        add(r, [x for x, _ in chunk if x], [y for _, y in chunk if y])
        k += n
    check_against_batch(r, rows, adds, base)


# ---- cost


def counters_workload(
    first: int, count: int, counters: int = 10, plain_keys: int = 1_000
) -> tuple[list[Row], list[Add]]:
    """Every fifth transaction plain (reads a key expecting absence, writes another); the rest read a counter at
    the snapshot (0) and add 1 to one. Few commit; on the counters outcomes oscillate for a few rounds."""
    rows: list[Row] = []
    adds: list[Add] = []
    for i in range(first, first + count):
        h = random.Random(i)
        if i % 5 == 0:
            rows.append((i, True, f"p{h.randrange(plain_keys)}", None))
            rows.append((i, False, f"p{h.randrange(plain_keys)}", i))
        else:
            rows.append((i, True, f"c{h.randrange(counters)}", 0))
            adds.append((i, f"c{h.randrange(counters)}", 1))
    return rows, adds


def test_new_transactions_cost_what_they_touch_not_the_history() -> None:
    base = {f"c{n}": 0 for n in range(10)}
    rows, adds = counters_workload(1, 5_000)
    r = AdditiveResolver(base_table(base))
    add(r, rows, adds)
    assert r.rounds >= 4  # outcomes on the counters oscillate for a few rounds before they settle
    evaluations, steps, queries = r.evaluations, r.scan_steps, r.tree_queries
    new_rows, new_adds = counters_workload(5_001, 100)  # above every id; 80 read and add to counters of ~400 adders
    add(r, new_rows, new_adds)
    assert r.evaluations - evaluations == 100  # one evaluation each, nothing downstream
    assert r.scan_steps - steps <= 3 * 100  # plain readers: a writer or two each; counters: no scan
    assert r.tree_queries - queries <= r.rounds * 100  # one O(log adders) query per round of a counter read
    check_against_batch(r, rows + new_rows, adds + new_adds, base, with_model=False)

    # a counter with only blind adders (no reads among them): a reader above visits none of them
    blind: list[Add] = [(i, "n", 1) for i in range(10_001, 13_001)]
    add(r, [], blind)
    evaluations, steps, queries = r.evaluations, r.scan_steps, r.tree_queries
    add(r, [(13_001, True, "n", 3_000), (13_002, True, "n", 3_001)], [(13_001, "n", 1)])
    assert (r.evaluations - evaluations, r.scan_steps - steps, r.tree_queries - queries) == (2, 0, 2)
    assert {13_001, 13_002}.isdisjoint(r.rollback["id"].to_pylist())  # n was 3,000, then 3,001

    # an adder below the history: the readers of c3 above it change their histories, and so, through what they
    # add, do the readers of the other counters; still each transaction is evaluated at most once
    evaluations = r.evaluations
    add(r, [], [(0, "c3", 1)])
    assert r.evaluations - evaluations <= 1 + 5_100 + 2
    check_against_batch(
        r, [*rows, *new_rows, (13_001, True, "n", 3_000), (13_002, True, "n", 3_001)],
        [(0, "c3", 1), *adds, *new_adds, *blind, (13_001, "n", 1)], base, with_model=False,
    )
