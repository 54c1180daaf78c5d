"""Tests of :mod:`txns.resolve.additive`: the reference's three transactions, and Hypothesis properties.

:func:`model` is an independent pure-Python run of the rule (plain writes,
additive writes, a base store); the properties check ``sequential_additive``,
``resolve_additive`` against it, and ``pairwise`` against it under exactly the
conditions (P1)-(P3) of the module docstring; examples show each condition is
needed. ``HYPOTHESIS_PROFILE=slow`` runs the properties deeper.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.resolve.test_resolve import PROFILE
from txns.resolve import Resolution, pairwise, resolve, resolve_additive, sequential_additive

Row = tuple[int, bool, str, int | None]  # intents
Add = tuple[int, str, int]  # adds
KEYS = ["a", "b", "c"]


def tables(rows: list[Row], adds: list[Add], base: dict[str, int] | None) -> tuple[pa.Table, pa.Table, pa.Table | None]:
    i = pa.table({"id": pa.array([r[0] for r in rows], pa.int64()),
                  "is_read": pa.array([r[1] for r in rows], pa.bool_()),
                  "key": pa.array([r[2] for r in rows], pa.string()),
                  "val": pa.array([r[3] for r in rows], pa.int64())})
    a = pa.table({"id": pa.array([x[0] for x in adds], pa.int64()), "key": pa.array([x[1] for x in adds], pa.string()),
                  "delta": pa.array([x[2] for x in adds], pa.int64())})
    b = None if base is None else pa.table({"key": pa.array(list(base), pa.string()),
                                             "val": pa.array(list(base.values()), pa.int64())})
    return i, a, b


def model(rows: list[Row], adds: list[Add], base: dict[str, int] | None) -> tuple[list[int], dict[str, int]]:
    state: dict[str, int | None] = dict(base or {})
    ids = sorted({r[0] for r in rows} | {x[0] for x in adds})
    rolled = []
    for t in ids:
        if all(state.get(k) == v for i, r, k, v in rows if i == t and r):
            for i, r, k, v in rows:
                if i == t and not r:
                    state[k] = v
            for i, k, d in adds:
                if i == t:
                    state[k] = (state.get(k) or 0) + d
        else:
            rolled.append(t)
    return rolled, {k: v for k, v in state.items() if v is not None}


def answer(res: Resolution | tuple[pa.Table, pa.Table]) -> tuple[list[int], dict[str, int]]:
    rb, store = (res.rollback, res.store) if isinstance(res, Resolution) else res
    keys = store["key"].to_pylist()
    assert len(set(keys)) == len(keys)
    return rb["id"].to_pylist(), dict(zip(keys, store["val"].to_pylist(), strict=True))


# ---- the reference's three transactions: T1: B += C, T2: A += B, T3: C += A; A = 10, B = 20, C = 30

READS = {1: ("C", 30), 2: ("B", 20), 3: ("A", 10)}
ADDS = {1: ("B", 30), 2: ("A", 20), 3: ("C", 10)}
BASE = {"A": 10, "B": 20, "C": 30}
# first placed -> (rolled back, store): the first commits, the reader of what it adds rolls back
OUTCOME = {
    1: (2, {"A": 10, "B": 50, "C": 40}), 2: (3, {"A": 30, "B": 50, "C": 30}), 3: (1, {"A": 30, "B": 20, "C": 40}),
}


@pytest.mark.parametrize("order", list(itertools.permutations([1, 2, 3])))
def test_three_transactions_every_order(order: tuple[int, int, int]) -> None:
    pos = {t: n + 1 for n, t in enumerate(order)}  # T_t runs at position pos[t]
    rows: list[Row] = [(pos[t], True, *READS[t]) for t in (1, 2, 3)]
    adds: list[Add] = [(pos[t], *ADDS[t]) for t in (1, 2, 3)]
    victim, store = OUTCOME[order[0]]
    expect = ([pos[victim]], store)
    assert model(rows, adds, BASE) == expect
    tabs = tables(rows, adds, BASE)
    assert answer(sequential_additive(*tabs)) == expect
    assert answer(resolve_additive(*tabs)) == expect
    assert answer(pairwise(*tabs)) == expect  # (P1)-(P3) hold: pairwise is exact here


def test_three_transactions_id_order() -> None:
    tabs = tables([(t, True, *READS[t]) for t in (1, 2, 3)], [(t, *ADDS[t]) for t in (1, 2, 3)], BASE)
    res = pairwise(*tabs)
    assert answer(res) == ([2], {"A": 10, "B": 50, "C": 40})  # T1 and T3 commit, T2 rolls back
    assert res.rounds == 3  # round 1 rolls back T2 and T3 (both see a committed adder), round 2 frees T3


def test_any_two_commit_together() -> None:
    for pair in itertools.combinations([1, 2, 3], 2):
        for order in itertools.permutations(pair):
            pos = {t: n + 1 for n, t in enumerate(order)}
            tabs = tables([(pos[t], True, *READS[t]) for t in pair], [(pos[t], *ADDS[t]) for t in pair], BASE)
            rb, _ = answer(pairwise(*tabs))
            first_reads_second = ADDS[order[0]][0] == READS[order[1]][0]
            assert rb == ([2] if first_reads_second else [])  # only a forward pair costs a rollback


# ---- each condition is needed


def test_pairwise_needs_reads_of_the_snapshot() -> None:  # (P1)
    tabs = tables([(2, True, "k", 15)], [(1, "k", 5)], {"k": 10})
    assert answer(resolve_additive(*tabs))[0] == []  # 10 + 5 is what t read
    assert answer(pairwise(*tabs))[0] == [2]  # a read off the snapshot is a rollback


def test_pairwise_needs_deltas_that_do_not_cancel() -> None:  # (P2)
    tabs = tables([(3, True, "k", 10)], [(1, "k", 5), (2, "k", -5)], {"k": 10})
    assert answer(resolve_additive(*tabs))[0] == []
    assert answer(pairwise(*tabs))[0] == [3]


def test_pairwise_rejects_plain_writes_to_read_keys() -> None:  # (P3)
    tabs = tables([(1, False, "k", 1), (2, True, "k", None)], [], None)
    with pytest.raises(ValueError, match="P3"):
        pairwise(*tabs)
    assert answer(pairwise(*tables([(1, False, "j", 1), (2, True, "k", None)], [], None))) == ([], {"j": 1})


def test_zero_delta_is_no_conflict() -> None:
    tabs = tables([(2, True, "k", 10)], [(1, "k", 0)], {"k": 10})
    assert answer(pairwise(*tabs)) == answer(resolve_additive(*tabs)) == ([], {"k": 10})


def test_rejects_malformed() -> None:
    with pytest.raises(ValueError, match="adds to a key twice"):
        resolve_additive(*tables([], [(1, "k", 1), (1, "k", 2)], None))
    with pytest.raises(ValueError, match="both writes and adds"):
        resolve_additive(*tables([(1, False, "k", 3)], [(1, "k", 2)], None))
    with pytest.raises(ValueError, match="both writes and adds"):
        sequential_additive(*tables([(1, False, "k", 3)], [(1, "k", 2)], None))
    with pytest.raises(ValueError, match="numeric"):
        resolve_additive(pa.table({"id": [1], "is_read": [True], "key": ["k"], "val": ["x"]}))
    with pytest.raises(ValueError, match="column"):
        resolve_additive(*tables([], [], None)[:1], pa.table({"id": [1], "key": ["k"]}))


def test_float_deltas() -> None:
    i = pa.table({"id": [3], "is_read": [True], "key": ["k"], "val": [1.5]})
    a = pa.table({"id": [1, 2], "key": ["k", "k"], "delta": [1.0, 0.5]})
    res = resolve_additive(i, a)
    assert answer(res) == answer(sequential_additive(i, a)) == ([], {"k": 1.5})
    assert res.store.schema.field("val").type == pa.float64()


# ---- properties


VALS = st.sampled_from([None, 0, 1, 2, 3])
BASES = st.none() | st.dictionaries(st.sampled_from(KEYS), st.integers(0, 3))


def draw_transactions(draw: st.DrawFn, ids: Iterable[int], kinds: int, add_kinds: int) -> tuple[list[Row], list[Add]]:
    """Rows and adds of transactions ``ids``: per transaction and key of KEYS, a read one time in three; of
    ``kinds`` equally likely kinds, the first is a plain write, the next ``add_kinds`` an add, the rest neither."""
    rows: list[Row] = []
    adds: list[Add] = []
    for i in ids:
        for k in KEYS:
            if draw(st.integers(0, 2)) == 0:
                rows.append((i, True, k, draw(VALS)))
            kind = draw(st.integers(0, kinds - 1))
            if kind == 0:
                rows.append((i, False, k, draw(VALS)))
            elif kind <= add_kinds:
                adds.append((i, k, draw(st.integers(-2, 2))))
    return rows, adds


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[Row], list[Add], dict[str, int] | None]:
    ids = draw(st.lists(st.integers(0, 30), unique=True, max_size=8))
    rows, adds = draw_transactions(draw, ids, kinds=6, add_kinds=1)
    return rows, adds, draw(BASES)


@PROFILE
@given(cases())
def test_resolve_additive_equals_model(case: tuple[list[Row], list[Add], dict[str, int] | None]) -> None:
    rows, adds, base = case
    expect = model(rows, adds, base)
    tabs = tables(rows, adds, base)
    assert answer(sequential_additive(*tabs)) == expect
    assert answer(resolve_additive(*tabs)) == expect
    if not adds and base is None:  # no additive writes: the plain resolver's answer
        res = resolve(tabs[0])
        assert answer(res)[0] == expect[0] and res.rounds == resolve_additive(*tabs).rounds


@st.composite
def pairwise_cases(draw: st.DrawFn) -> tuple[list[Row], list[Add], dict[str, int] | None]:
    """(P1) reads see the base; (P2) one nonzero sign per key; (P3) plain writes only to the unread key "w"."""
    base = draw(st.dictionaries(st.sampled_from(KEYS), st.integers(-3, 3)))
    sign = {k: draw(st.sampled_from([-1, 1])) for k in KEYS}
    ids = draw(st.lists(st.integers(0, 30), unique=True, max_size=10))
    rows: list[Row] = []
    adds: list[Add] = []
    for i in ids:
        for k in KEYS:
            if draw(st.integers(0, 2)) == 0:
                rows.append((i, True, k, base.get(k)))
            if draw(st.integers(0, 2)) == 0:
                adds.append((i, k, sign[k] * draw(st.integers(1, 3))))
        if draw(st.booleans()):
            rows.append((i, False, "w", draw(VALS)))
    return rows, adds, base


@PROFILE
@given(pairwise_cases())
def test_pairwise_equals_rule_under_conditions(case: tuple[list[Row], list[Add], dict[str, int] | None]) -> None:
    rows, adds, base = case
    expect = model(rows, adds, base)
    assert answer(pairwise(*tables(rows, adds, base))) == expect
    assert answer(resolve_additive(*tables(rows, adds, base))) == expect
