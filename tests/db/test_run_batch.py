"""``run_batch`` (txns.db.batch) through a database: the result equals the functions run one by one.

The workload and the sequential model come from tests/resolve/test_repair.py.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

import txns
from persist import InvalidUsage
from tests import helpers
from tests.resolve.test_repair import (
    SETTINGS,
    TABLE,
    Increment,
    Op,
    State,
    Transfer,
    sequential,
    workloads,
)
from txns.db.batch import BatchResult, run_batch
from txns.db.errors import Abort, InvalidPrimaryKey, TableNotFound, TransactionConflict
from txns.resolve.repair import ABORTED, COMMITTED

SCHEMA = pa.schema([("id", pa.string()), ("bal", pa.int64())])


def new_db(state: State, url: str | None = None) -> txns.Database:
    db = txns.connect(url or f"mem://run-batch-{uuid.uuid4().hex}")
    db.create_table(TABLE, SCHEMA, primary_key=["id"])
    db.create_table("plain", SCHEMA)
    if state:
        with db.transaction() as t:
            t.upsert(TABLE, [{"id": k, "bal": v} for k, v in state.items()])
    return db


def contents(db: txns.Database) -> State:
    return {r["id"]: r["bal"] for r in db.table(TABLE).to_arrow().to_pylist()}


def check_serial(db: txns.Database, base: State, fns: list[Any], res: BatchResult) -> None:
    state, outcomes, results = sequential(fns, base)
    assert contents(db) == state
    assert res.outcomes == outcomes and res.results == results
    assert set(res.aborted) == {i for i, o in enumerate(outcomes) if o == ABORTED}
    assert res.executions == len(fns) + res.repairs


@SETTINGS
@given(workloads(max_ops=20))
def test_run_batch_equals_serial_execution(w: tuple[State, list[Op]]) -> None:
    base, ops = w
    fns: list[Any] = list(ops)
    db = new_db(base)
    try:
        before = db.history().num_rows
        res = run_batch(db, fns)
        check_serial(db, base, fns, res)
        grew = db.history().num_rows - before
        if res.commit is None:
            assert grew == 0 and contents(db) == base
        else:
            assert grew == 1  # the whole batch is one database transaction
            assert db.history(limit=1)["txn_id"].to_pylist() == [res.commit.txn_id]
        assert res.attempts == (1 if fns else 0)
    finally:
        db.close()


def test_processes_on_file(tmp_path: Path) -> None:
    base = {"a0": 10, "a1": 0, "a2": 5}
    fns: list[Any] = [
        Transfer("a0", "a1", 4),
        Transfer("a1", "a2", 4),
        Transfer("a1", "a2", 1),  # aborts: a1 is 0 after the one before
        Increment("a3", 2),
        Transfer("a2", "a0", 9),
        Increment("a0", 1),
    ]
    db = new_db(base, helpers.file_url(tmp_path / "db"))
    try:
        res = run_batch(db, fns, executor="processes", workers=2)
        check_serial(db, base, fns, res)
        assert res.outcomes[2] == ABORTED and res.aborted == {2: "insufficient funds in a1"}
        assert res.repairs >= 1
    finally:
        db.close()


def test_executor_none_runs_each_once_in_order() -> None:
    base = {"a": 3}
    fns: list[Any] = [Increment("a", 1), Transfer("a", "b", 4), Transfer("a", "b", 1)]
    db = new_db(base)
    res = run_batch(db, fns, executor=None)
    check_serial(db, base, fns, res)
    assert res.executions == 3 and res.repairs == 0 and res.outcomes == [COMMITTED, COMMITTED, ABORTED]


# ---- repairs count -----------------------------------------------------------------------------


def test_independent_functions_have_no_repairs() -> None:
    db = new_db({})
    fns: list[Any] = [Increment(f"k{i}", i) for i in range(8)]
    res = run_batch(db, fns)
    assert res.repairs == 0 and res.executions == 8 and res.executions_per_txn == 1.0
    assert contents(db) == {f"k{i}": i for i in range(8)}


def test_a_chain_has_n_minus_one_repairs() -> None:
    db = new_db({"k": 0})
    fns: list[Any] = [Increment("k", 1) for _ in range(8)]
    res = run_batch(db, fns)
    assert res.repairs == 7 and res.executions == 15 and res.repairs_per_fn == [0] + [1] * 7
    assert contents(db) == {"k": 8}


# ---- concurrent commits --------------------------------------------------------------------------


class OutsideOnFirstRun:
    """A batch function that, on its ``trigger``-th run, commits an outside change (``db.run``) first."""

    def __init__(self, db: txns.Database, key: str, delta: int, trigger: int, inner: Any) -> None:
        self.db, self.key, self.delta, self.trigger, self.inner = db, key, delta, trigger, inner
        self.runs = 0
        self.lock = threading.Lock()

    def outside(self, t: Any) -> None:
        r = t.get(TABLE, self.key)
        t.upsert(TABLE, [{"id": self.key, "bal": (r["bal"] if r else 0) + self.delta}])

    def __call__(self, ctx: Any) -> Any:
        with self.lock:
            self.runs += 1
            fire = self.runs == self.trigger
        if fire:
            self.db.run(self.outside)
        return self.inner(ctx)


def test_a_commit_between_the_snapshot_and_the_repair_is_seen() -> None:
    base = {"a": 10, "b": 0}
    db = new_db(base)
    # run 1 (the parallel phase) commits a += 100 after the snapshot was taken
    f0 = OutsideOnFirstRun(db, "a", 100, 1, Increment("c", 1))
    fns: list[Any] = [f0, Transfer("a", "b", 50), Transfer("a", "b", 30)]
    before = db.history().num_rows
    res = run_batch(db, fns)
    after_outside = {"a": 110, "b": 0}
    state, outcomes, _ = sequential([Increment("c", 1), *fns[1:]], after_outside)
    assert contents(db) == state == {"a": 30, "b": 80, "c": 1}
    assert res.outcomes == outcomes == [COMMITTED] * 3
    assert res.repairs >= 1  # the transfers aborted on the snapshot (a was 10): repaired
    assert res.executions == 3 + res.repairs and res.attempts == 1
    assert db.history().num_rows - before == 2  # the outside commit and the batch


def test_a_conflicting_commit_before_the_batch_commits_is_repaired_in_a_new_transaction() -> None:
    base = {"a": 10, "b": 0}
    db = new_db(base)
    # fn 1 reads what fn 0 writes, so it runs again in the repair (its 2nd run): then it commits
    # a += 100 outside, after the batch's transaction read a: that transaction conflicts
    f1 = OutsideOnFirstRun(db, "a", 100, 2, Transfer("b", "c", 5))
    fns: list[Any] = [Transfer("a", "b", 8), f1, Transfer("a", "d", 50)]
    res = run_batch(db, fns)
    assert res.attempts == 2
    state, outcomes, _ = sequential([fns[0], Transfer("b", "c", 5), fns[2]], {"a": 110, "b": 0})
    assert contents(db) == state == {"a": 52, "b": 3, "c": 5, "d": 50}
    assert res.outcomes == outcomes == [COMMITTED] * 3
    assert res.executions == 3 + res.repairs and res.commit is not None and res.commit.attempts == 2


def test_conflicts_on_every_attempt_give_up() -> None:
    db = new_db({"a": 1})

    def meddle(ctx: Any) -> None:
        r = ctx.get(TABLE, "a")
        db.run(lambda t: t.upsert(TABLE, [{"id": "a", "bal": (t.get(TABLE, "a") or {"bal": 0})["bal"] + 1}]))
        ctx.put(TABLE, {"id": "b", "bal": r["bal"]})

    with pytest.raises(TransactionConflict, match="3 attempts") as e:
        run_batch(db, [meddle], max_attempts=3)
    assert e.value.attempts == 3 and "b" not in contents(db)


# ---- aborts and errors -----------------------------------------------------------------------------


def test_abort_drops_only_its_function() -> None:
    db = new_db({"a": 5})

    def refuse(ctx: Any) -> None:
        ctx.put(TABLE, {"id": "z", "bal": 1})
        raise txns.Abort("no z today")

    fns: list[Any] = [Increment("a", 1), refuse, Increment("a", 1)]
    res = run_batch(db, fns)
    assert res.outcomes == [COMMITTED, ABORTED, COMMITTED] and res.aborted == {1: "no z today"}
    assert contents(db) == {"a": 7}


def test_every_function_aborting_commits_nothing() -> None:
    db = new_db({"a": 5})
    before = db.history().num_rows
    res = run_batch(db, [Transfer("a", "b", 9), Transfer("x", "b", 1)])
    assert res.commit is None and res.outcomes == [ABORTED, ABORTED]
    assert db.history().num_rows == before and contents(db) == {"a": 5}


def test_empty_batch() -> None:
    res = run_batch(new_db({}), [])
    assert res.commit is None and res.outcomes == [] and res.executions == 0


def put(table: str, row: Any) -> Any:
    def fn(ctx: Any) -> None:
        ctx.put(table, row)

    return fn


@pytest.mark.parametrize(
    ("fns", "kw", "error", "match"),
    [
        ("not a list", {}, InvalidUsage, "list of functions"),
        ([Increment("a", 1), 3], {}, InvalidUsage, "not callable"),
        ([Increment("a", 1)], {"executor": "fibers"}, InvalidUsage, "executor"),
        ([Increment("a", 1)], {"workers": 0}, InvalidUsage, "workers"),
        ([Increment("a", 1)], {"max_attempts": 0}, InvalidUsage, "max_attempts"),
        ([Increment("a", 1)], {"executor": "processes"}, InvalidUsage, "mem://|memory"),
        ([Increment("a", 1), put("nope", {"id": "a"})], {}, TableNotFound, "nope"),
        ([Increment("a", 1), put("plain", {"id": "a", "bal": 1})], {}, InvalidPrimaryKey, "primary key"),
        ([Increment("a", 1), put(TABLE, {"bal": 1})], {}, InvalidPrimaryKey, r"\['id'\]"),
        ([Increment("a", 1), put(TABLE, {"id": "q", "bal": "x"})], {}, InvalidUsage, "bal"),
        ([Increment("a", 1), put(TABLE, ["id", "q"])], {}, InvalidUsage, "dict"),
        ([Increment("a", 1), lambda ctx: ctx.get(TABLE, 5)], {}, InvalidPrimaryKey, "id"),
        ([Increment("a", 1), lambda ctx: ctx.delete("plain", "a")], {}, InvalidPrimaryKey, "primary key"),
    ],
)
def test_bad_input_commits_nothing(fns: Any, kw: dict[str, Any], error: type[Exception], match: str) -> None:
    db = new_db({"a": 1})
    before = db.history().num_rows
    with pytest.raises(error, match=match):
        run_batch(db, fns, **kw)
    assert contents(db) == {"a": 1} and db.history().num_rows == before


def test_other_exceptions_propagate_and_commit_nothing() -> None:
    db = new_db({"a": 1})

    def boom(ctx: Any) -> None:
        ctx.get(TABLE, "a")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run_batch(db, [Increment("a", 1), boom])
    assert contents(db) == {"a": 1}


def test_unpicklable_functions_are_refused_for_processes(tmp_path: Path) -> None:
    db = new_db({}, helpers.file_url(tmp_path / "db"))
    try:
        with pytest.raises(InvalidUsage, match="pickled"):
            run_batch(db, [lambda ctx: None], executor="processes", workers=1)
    finally:
        db.close()


def test_metadata_and_results() -> None:
    db = new_db({"a": 10})
    res = run_batch(db, [Transfer("a", "b", 3), Transfer("a", "b", 3)], metadata={"job": "x"})
    assert res.results == [10, 7]
    assert res.commit is not None and res.commit.metadata == {"job": "x"}
    assert db.history(limit=1)["metadata"].to_pylist() == ['{"job": "x"}']


def test_abort_class_is_the_public_one() -> None:
    assert txns.Abort is Abort


@SETTINGS
@given(st.integers(1, 12), st.integers(1, 4))
def test_transfers_conserve_money(n: int, accts: int) -> None:
    base = {f"a{i}": 5 for i in range(accts)}
    fns: list[Any] = [Transfer(f"a{i % accts}", f"a{(i * 7 + 1) % accts}", 3) for i in range(n)]
    db = new_db(base)
    res = run_batch(db, fns)
    check_serial(db, base, fns, res)
    assert sum(contents(db).values()) == 5 * accts
