"""Tests of :mod:`txns.resolve.order`: any order is the rule in that order; readers-first commits more.

The post's workload comes from ``benchmarks/bench_resolve.py`` (imported).
``HYPOTHESIS_PROFILE=slow`` runs the property deeper.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.bench_resolve import workload
from tests.resolve.test_resolve import PROFILE, Row, model, rows_of, store_of, table
from txns.resolve import pairwise, resolve
from txns.resolve.order import STRATEGIES, renumber, reorder, resolve_reordered


def committed_fraction(res_rollback: pa.Table, m: int) -> float:
    return 1 - res_rollback.num_rows / m


@st.composite
def cases(draw: st.DrawFn) -> list[Row]:
    ids = draw(st.lists(st.integers(0, 40), unique=True, max_size=10))
    rows: list[Row] = []
    for i in ids:
        for k in ["a", "b", "c", "d"]:
            if draw(st.integers(0, 2)) == 0:
                rows.append((i, True, k, draw(st.sampled_from([None, "x", "y"]))))
            if draw(st.integers(0, 2)) == 0:
                rows.append((i, False, k, draw(st.sampled_from([None, "x", "y"]))))
    return rows


@PROFILE
@given(cases(), st.sampled_from(STRATEGIES), st.integers(0, 3))
def test_any_order_is_the_rule_in_that_order(rows: list[Row], strategy: str, seed: int) -> None:
    intents = table(rows)
    order = reorder(intents, strategy, seed)
    ids = sorted({r[0] for r in rows})
    assert order["id"].to_pylist() == ids
    assert sorted(order["position"].to_pylist()) == list(range(len(ids)))
    pos = dict(zip(ids, order["position"].to_pylist(), strict=True))
    if strategy == "id":
        assert [pos[i] for i in ids] == list(range(len(ids)))
    moved = rows_of(renumber(intents, order))
    assert moved == [(pos[i], r, k, v) for i, r, k, v in rows]
    rolled, store = model(moved)  # the rule, sequentially, in the new order
    res, order2 = resolve_reordered(intents, strategy, seed)
    assert order2.equals(order)
    back = {p: i for i, p in pos.items()}
    assert res.rollback["id"].to_pylist() == sorted(back[p] for p in rolled)
    assert store_of(res.store) == store


def test_read_only_first() -> None:
    rows: list[Row] = [(1, False, "a", "x"), (2, True, "a", None), (3, True, "b", None), (3, False, "a", "y")]
    assert reorder(table(rows), "read_only_first")["position"].to_pylist() == [1, 0, 2]


def test_chain_commits_entirely_readers_first() -> None:
    """X_i reads r_i (absent) and writes r_i+1: id order commits every other one, readers-first all."""
    n = 50
    rows: list[Row] = [row for i in range(n) for row in ((i, True, f"r{i}", None), (i, False, f"r{i + 1}", "v"))]
    assert resolve(table(rows)).rollback.num_rows == n // 2
    res, order = resolve_reordered(table(rows), "readers_first")
    assert res.rollback.num_rows == 0
    assert order["position"].to_pylist() == list(range(n))[::-1]


def test_cycle_with_additive_writes() -> None:
    """The ivm reference's T1: B += C, T2: A += B, T3: C += A: any order rolls back exactly one."""
    intents = pa.table({"id": [1, 2, 3], "is_read": [True] * 3, "key": ["C", "B", "A"], "val": [30, 20, 10]})
    adds = pa.table({"id": [1, 2, 3], "key": ["B", "A", "C"], "delta": [30, 20, 10]})
    base = pa.table({"key": ["A", "B", "C"], "val": [10, 20, 30]})
    for seed in range(4):
        order = reorder(intents, "readers_first", seed, adds=adds)
        res = pairwise(renumber(intents, order), renumber(adds, order), base)
        assert res.rollback.num_rows == 1


def test_rejects() -> None:
    with pytest.raises(ValueError, match="strategy"):
        reorder(table([(1, True, "a", None)]), "best")
    with pytest.raises(ValueError, match="does not place"):
        renumber(table([(1, True, "a", None)]), pa.table({"id": [2], "position": [0]}))


@pytest.mark.parametrize("keys", [10_000, 1_000])
def test_post_workload_commits_at_least_as_many(keys: int, capsys: Any) -> None:
    n = 10_000
    intents = workload(range(1, n + 1), keys)
    base = committed_fraction(resolve(intents).rollback, n)
    res, order = resolve_reordered(intents, "readers_first")
    frac = committed_fraction(res.rollback, n)
    moved = renumber(intents, order)
    assert resolve(moved).rollback.num_rows == res.rollback.num_rows
    with capsys.disabled():
        print(f"\n{n} txns over {keys} keys: committed {base:.3f} in id order, {frac:.3f} readers-first")
    assert frac >= base
    if keys == 10_000:
        assert frac > base + 0.1  # 0.40 -> 0.59 with seed 0
