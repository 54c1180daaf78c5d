"""Tests of :mod:`txns.resolve`: the post's example, and Hypothesis properties against sequential models.

The reference here is independent of the library: :func:`model` runs the rule
one transaction at a time in id order, and :func:`fixpoint` runs the post's
``to_rollback`` iteration literally (rounds counted), both on plain Python
rows. Keys are strings, or a ``{table, key}`` struct (several tables in one
intents relation). ``HYPOTHESIS_PROFILE=slow`` runs the properties deeper.
"""

from __future__ import annotations

import os
import random
from collections.abc import Hashable
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txns.resolve import (
    Resolution,
    Resolver,
    dead_intents,
    maintain,
    remove_committed_reads,
    remove_failed,
    remove_overwritten_writes,
    resolve,
    sequential,
)
from txns.resolve.rule import freeze

_COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}
settings.register_profile("resolve-ci", max_examples=150, **_COMMON)  # type: ignore[arg-type]
settings.register_profile("resolve-slow", max_examples=1500, **_COMMON)  # type: ignore[arg-type]
PROFILE = settings.get_profile("resolve-slow" if os.environ.get("HYPOTHESIS_PROFILE") == "slow" else "resolve-ci")

Row = tuple[Any, bool, Any, Any]
COLS = ["id", "is_read", "key", "val"]
STRUCT_KEY = pa.struct([("table", pa.string()), ("key", pa.int64())])


STRING = pa.string()


def table(rows: list[Row], key_type: pa.DataType = STRING, val_type: pa.DataType = STRING) -> pa.Table:
    cols = list(zip(*rows, strict=True)) if rows else [[], [], [], []]
    return pa.table(
        [pa.array(cols[0], pa.int64()), pa.array(cols[1], pa.bool_()), pa.array(cols[2], key_type),
         pa.array(cols[3], val_type)],
        names=COLS,
    )


def rows_of(t: pa.Table) -> list[Row]:
    return list(zip(*(t[c].to_pylist() for c in COLS), strict=True))


def canon(rows: list[Row]) -> list[tuple[Any, ...]]:
    """Rows in the post's display order (id, is_read desc, key), hashable."""
    return sorted(((i, r, freeze(k), freeze(v)) for i, r, k, v in rows), key=lambda x: (x[0], not x[1], repr(x[2])))


def store_of(t: pa.Table) -> dict[Hashable, Hashable]:
    keys, vals = t["key"].to_pylist(), t["val"].to_pylist()
    assert len({freeze(k) for k in keys}) == len(keys), "a key twice in the store"
    return {freeze(k): freeze(v) for k, v in zip(keys, vals, strict=True)}


def rolled_of(t: pa.Table) -> list[Any]:
    ids = t["id"].to_pylist()
    assert ids == sorted(ids)
    return ids


# ---- the independent references


def _txns(rows: list[Row]) -> dict[Any, list[Row]]:
    out: dict[Any, list[Row]] = {}
    for row in rows:
        out.setdefault(row[0], []).append(row)
    return out


def model(rows: list[Row]) -> tuple[list[Any], dict[Hashable, Hashable]]:
    """The rule, one transaction at a time in id order: (rolled back ids, store)."""
    state: dict[Hashable, Hashable] = {}
    rolled = []
    for i, txn in sorted(_txns(rows).items()):
        if all(state.get(freeze(k)) == freeze(v) for _, r, k, v in txn if r):
            for _, r, k, v in txn:
                if not r:
                    state[freeze(k)] = freeze(v)
        else:
            rolled.append(i)
    return rolled, {k: v for k, v in state.items() if v is not None}


def fixpoint(rows: list[Row]) -> tuple[list[Any], int]:
    """The post's WITH MUTUALLY RECURSIVE block, literally: (rollback, rounds)."""
    rollback: set[Any] = set()
    rounds = 0
    while True:
        rounds += 1
        writes = [(i, freeze(k), freeze(v)) for i, r, k, v in rows if not r and i not in rollback]
        new = set()
        for i, r, k, v in rows:
            if r:
                before = [w for w in writes if w[1] == freeze(k) and w[0] < i]
                red = max(before, key=lambda w: w[0])[2] if before else None
                if red != freeze(v):
                    new.add(i)
        if new == rollback:
            return sorted(rollback), rounds
        rollback = new


# ---- the post's example

POST: list[Row] = [
    (1, False, "alice", "100"),
    (2, True, "bob", None), (2, False, "bob", "50"),
    (3, True, "alice", "100"), (3, True, "bob", "50"), (3, False, "alice", "70"), (3, False, "bob", "80"),
    (4, True, "alice", "100"), (4, True, "bob", "50"), (4, False, "alice", "60"), (4, False, "bob", "90"),
    (5, True, "alice", "70"), (5, True, "bob", "80"), (5, False, "alice", "50"), (5, False, "bob", "100"),
    (6, True, "x", None), (6, False, "x", "A"),
    (7, True, "x", "A"), (7, False, "x", "B"),
    (8, True, "x", "A"), (8, False, "x", "C"),
    (9, True, "x", "C"), (9, False, "x", "D"),
]
POST_STORE = {"alice": "50", "bob": "100", "x": "B"}


def _post_struct(rows: list[Row]) -> list[Row]:
    return [(i, r, {"table": "accounts" if k != "x" else "letters", "key": len(k)}, v) for i, r, k, v in rows]


def test_post_example_batch() -> None:
    res = resolve(table(POST))
    assert rolled_of(res.rollback) == [4, 8, 9]
    assert store_of(res.store) == POST_STORE
    assert res.rounds == 3  # the post: iter 1 rolls back 4 and 8, iter 2 adds 9, iter 3 is stable
    assert fixpoint(POST) == ([4, 8, 9], 3)
    assert model(POST) == ([4, 8, 9], POST_STORE)
    rb, store = sequential(table(POST))
    assert rolled_of(rb) == [4, 8, 9] and store_of(store) == POST_STORE


def test_post_example_struct_keys_and_int_values() -> None:
    rows = [(i, r, k, None if v is None else sum(map(ord, v))) for i, r, k, v in _post_struct(POST)]
    res = resolve(table(rows, STRUCT_KEY, pa.int64()))
    assert rolled_of(res.rollback) == [4, 8, 9] and res.rounds == 3
    assert res.store.schema.field("key").type == STRUCT_KEY
    assert store_of(res.store) == model(rows)[1]
    assert len(store_of(res.store)) == 3


@pytest.mark.parametrize("order", ["ascending", "descending", "shuffled", "one_by_one_reversed"])
def test_post_example_incremental(order: str) -> None:
    r = Resolver()
    if order == "ascending":
        r.add(table(POST))
    elif order == "descending":
        r.add(table(POST[::-1]))
    elif order == "shuffled":
        rows = POST[:]
        random.Random(7).shuffle(rows)
        for k in range(0, len(rows), 5):
            r.add(table(rows[k : k + 5]))
    else:
        for row in POST[::-1]:
            r.add(table([row]))
    assert rolled_of(r.rollback) == [4, 8, 9]
    assert store_of(r.store) == POST_STORE
    assert r.rounds == 3


def test_post_maintenance_tasks() -> None:
    """Each task leaves exactly the rows the post prints (23 -> 15 -> 8 -> 3)."""
    res = resolve(table(POST))
    after1 = remove_failed(table(POST), res)
    assert canon(rows_of(after1)) == canon([row for row in POST if row[0] not in (4, 8, 9)])
    assert after1.num_rows == 15
    after2 = remove_committed_reads(after1, res)
    assert canon(rows_of(after2)) == canon([
        (1, False, "alice", "100"), (2, False, "bob", "50"), (3, False, "alice", "70"), (3, False, "bob", "80"),
        (5, False, "alice", "50"), (5, False, "bob", "100"), (6, False, "x", "A"), (7, False, "x", "B"),
    ])
    after3 = remove_overwritten_writes(after2, res)
    assert canon(rows_of(after3)) == canon([(5, False, "alice", "50"), (5, False, "bob", "100"), (7, False, "x", "B")])
    assert canon(rows_of(maintain(table(POST), res))) == canon(rows_of(after3))
    assert canon(rows_of(dead_intents(table(POST), res))) == canon(
        [row for row in POST if (row[0], row[2]) not in {(5, "alice"), (5, "bob"), (7, "x")} or row[1]]
    )
    # "intents now contains the same rows as in store"; and the answers did not change
    for step in (after1, after2, after3):
        again = resolve(step)
        assert store_of(again.store) == POST_STORE and rolled_of(again.rollback) == []
    # task 3 alone, reads still present: only writes no later read can see go (alice@1 is read by 3 and 4)
    alone = remove_overwritten_writes(table(POST), res)
    assert sorted(set(POST) - set(rows_of(alone))) == []


def test_rejects_malformed() -> None:
    with pytest.raises(ValueError, match="two"):
        resolve(table([(1, False, "a", "1"), (1, False, "a", "2")]))
    twice = resolve(table(POST + POST[:4]))
    assert rolled_of(twice.rollback) == [4, 8, 9] and store_of(twice.store) == POST_STORE
    with pytest.raises(ValueError, match="column"):
        resolve(table(POST).drop_columns(["val"]))
    r = Resolver()
    r.add(table(POST))
    r.add(table([(3, True, "alice", "100"), (3, True, "alice", "100")]))  # a set: the same row is no change
    with pytest.raises(ValueError, match="two"):
        r.add(table([(3, True, "alice", "99")]))
    with pytest.raises(ValueError, match="retract"):
        r.retract(table([(3, True, "alice", "99")]))
    assert rolled_of(r.rollback) == [4, 8, 9]  # a refused change changes nothing


def test_sortable_non_integer_ids() -> None:
    rows = [(f"e{i // 4:03d}-{i:05d}", r, k, v) for i, r, k, v in POST]  # (epoch, seq) as a sortable string
    t = pa.table([pa.array([x[c] for x in rows]) for c in range(4)], names=COLS)
    res = resolve(t)
    assert res.rollback["id"].to_pylist() == [f"e{i // 4:03d}-{i:05d}" for i in (4, 8, 9)]
    r = Resolver()
    r.add(t)
    assert r.rollback["id"].to_pylist() == res.rollback["id"].to_pylist()


# ---- properties

VALS = ["a", "b", None]


@st.composite
def txn_rows(draw: st.DrawFn, ids: list[int], struct: bool) -> list[Row]:
    """Transactions with the given ids over 3 keys and values a/b/absent (so reads often match)."""
    keys = [{"table": t, "key": n} for t, n in (("t", 0), ("t", 1), ("u", 0))] if struct else ["k0", "k1", "k2"]
    rows: list[Row] = []
    for i in ids:
        for j, k in enumerate(keys):
            if draw(st.integers(0, 2)) == 0:
                rows.append((i, True, k, draw(st.sampled_from(VALS))))
            if draw(st.integers(0, 2)) == 0 or (j == 0 and not any(x[0] == i for x in rows)):
                rows.append((i, False, k, draw(st.sampled_from(VALS))))
    return rows


@st.composite
def intents(draw: st.DrawFn, max_txns: int = 10) -> tuple[list[Row], bool]:
    struct = draw(st.booleans())
    ids = draw(st.lists(st.integers(0, 40), unique=True, max_size=max_txns))
    return draw(txn_rows(ids, struct)), struct


def typed(rows: list[Row], struct: bool) -> pa.Table:
    return table(rows, STRUCT_KEY if struct else pa.string())


def check_resolution(res: Resolution, rows: list[Row]) -> None:
    rolled, store = model(rows)
    assert rolled_of(res.rollback) == rolled
    assert store_of(res.store) == store
    assert res.rounds == fixpoint(rows)[1]


@PROFILE
@given(intents())
def test_fixpoint_equals_sequential_and_batch(case: tuple[list[Row], bool]) -> None:
    rows, struct = case
    rolled, rounds = fixpoint(rows)
    assert rolled == model(rows)[0]  # the claim the module docstring proves
    assert 1 <= rounds <= len({r[0] for r in rows}) + 1
    check_resolution(resolve(typed(rows, struct)), rows)
    rb, store = sequential(typed(rows, struct))
    assert rolled_of(rb) == rolled and store_of(store) == model(rows)[1]


@PROFILE
@given(st.data())
def test_incremental_matches_model(data: st.DataObject) -> None:
    """Adds (ids in any order, new transactions or rows of existing ones), retractions and maintenance."""
    struct = data.draw(st.booleans())
    r = Resolver()
    current: list[Row] = []
    for _ in range(data.draw(st.integers(1, 8))):
        op = data.draw(st.sampled_from(["add", "add", "extend", "retract", "retract_txn", "maintain"]))
        used = {row[0] for row in current}
        if op == "add":
            free = sorted(set(range(41)) - used)
            ids = data.draw(st.lists(st.sampled_from(free), unique=True, max_size=4)) if free else []
            new = data.draw(txn_rows(ids, struct))
        elif op == "extend" and current:
            # more rows for an existing transaction (no duplicate (id, is_read, key))
            i = data.draw(st.sampled_from(sorted(used)))
            have = {(row[1], freeze(row[2])) for row in current if row[0] == i}
            new = [row for row in data.draw(txn_rows([i], struct)) if (row[1], freeze(row[2])) not in have]
        elif op == "retract" and current:
            new = []
            gone = data.draw(st.lists(st.sampled_from(current), unique_by=lambda x: canon([x])[0], max_size=4))
            r.retract(typed(gone, struct))
            current = [row for row in current if row not in gone]
        elif op == "retract_txn" and current:
            new = []
            i = data.draw(st.sampled_from(sorted(used)))
            r.retract(typed([row for row in current if row[0] == i], struct))
            current = [row for row in current if row[0] != i]
        elif op == "maintain":
            new = []
            res = resolve(typed(current, struct))
            dead = rows_of(dead_intents(typed(current, struct), res))
            r.retract(typed(dead, struct))
            current = [row for row in current if row not in dead]
            assert store_of(resolve(typed(current, struct)).store) == store_of(res.store)
        else:
            new = []
        if new:
            r.add(typed(new, struct))
            current += new
        check_resolution(Resolution(r.rollback, r.store, r.rounds), current)


@PROFILE
@given(intents(), st.data())
def test_maintenance_preserves_answers(case: tuple[list[Row], bool], data: st.DataObject) -> None:
    """For each task and for all three: same store, same outcome of every remaining id; and intents with
    higher ids added afterwards resolve the same on top of the maintained intents as on top of the original."""
    rows, struct = case
    t = typed(rows, struct)
    res = resolve(t)
    rolled = set(rolled_of(res.rollback))
    top = max((row[0] for row in rows), default=-1) + 1
    extra = data.draw(txn_rows(list(range(top, top + data.draw(st.integers(0, 4)))), struct))
    full = resolve(typed(rows + extra, struct))
    for task in (remove_failed, remove_committed_reads, remove_overwritten_writes, maintain):
        kept = task(t, res)
        assert set(canon(rows_of(kept))) <= set(canon(rows))
        again = resolve(kept)
        assert store_of(again.store) == store_of(res.store), task.__name__
        remaining = set(kept["id"].to_pylist())
        assert set(rolled_of(again.rollback)) == rolled & remaining, task.__name__
        ext = resolve(typed(rows_of(kept) + extra, struct))
        assert store_of(ext.store) == store_of(full.store), task.__name__
        top_ids = {row[0] for row in extra}
        assert set(rolled_of(ext.rollback)) & top_ids == set(rolled_of(full.rollback)) & top_ids
    # after all three, only the latest committed write of each key is left
    left = rows_of(maintain(t, res))
    assert all(not r for _, r, _, _ in left)
    assert len(left) == len({freeze(k) for _, _, k, _ in left})
    assert dead_intents(t, res).num_rows + len(left) == len(rows)


# ---- cost of new intents


def workload(first: int, count: int, keys: int = 10_000) -> list[Row]:
    """The post's shape: per transaction two reads expecting absence and two writes, keys by a hash of the id."""
    rows: list[Row] = []
    for i in range(first, first + count):
        h = random.Random(i)
        for _ in range(2):
            rows.append((i, True, f"k{h.randrange(keys)}", None))
        for _ in range(2):
            k = f"k{h.randrange(keys)}"
            rows.append((i, False, k, f"{i}:{k}"))
    return rows


def test_new_intents_cost_touched_keys_not_history() -> None:
    r = Resolver()
    history = workload(1, 5_000, keys=1_000)
    r.add(table(history))
    before = r.evaluations
    new = workload(5_001, 25, keys=1_000)  # 100 intents with ids past every existing one
    assert len(new) == 100
    r.add(table(new))
    assert r.evaluations - before == 25  # one evaluation per new transaction, none of the 5,000 before
    rolled, store = model(history + new)
    assert rolled_of(r.rollback) == rolled and store_of(r.store) == store
    assert r.rounds == resolve(table(history + new)).rounds

    # below the history instead: re-evaluates only readers downstream of the touched keys, still far from all
    before = r.evaluations
    early = [(0, False, "k1", "early")]
    r.add(table(early))
    readers_of_k1 = len({row[0] for row in history + new if row[1] and row[2] == "k1"})
    assert r.evaluations - before <= 1 + readers_of_k1
    rolled, store = model(early + history + new)
    assert rolled_of(r.rollback) == rolled and store_of(r.store) == store


def test_rounds_see_past_a_writer_that_commits_late() -> None:
    """A writer that commits in the end but rolls back tentatively (4 here) does not shield readers above it from
    changes below it: 5's history depends on 3 through round 2, where 4 is tentatively rolled back."""
    base: list[Row] = [
        (0, False, "q", "x"),
        (1, False, "y", "1"),
        (2, True, "q", None), (2, False, "y", "2"),  # rolls back from round 1 on
        (4, True, "y", "1"), (4, False, "x", "C"),  # round 1 sees y=2: rolled back; from round 2 on: commits
        (5, True, "x", "C"),  # round 2 sees past 4: x absent, rolled back; commits from round 3 on
    ]
    assert fixpoint(base) == ([2], 4)
    extra: list[Row] = [(3, False, "x", "C")]  # now round 2 sees 3's x=C: 5 never rolls back
    assert fixpoint(base + extra) == ([2], 3)
    r = Resolver()
    r.add(table(base))
    assert r.rounds == 4
    r.add(table(extra))
    assert r.rounds == 3 and rolled_of(r.rollback) == [2]
    r.retract(table(extra))
    assert r.rounds == 4
