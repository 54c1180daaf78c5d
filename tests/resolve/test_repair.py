"""Transaction repair of functions (txns.resolve.repair) against a sequential model, with Hypothesis.

The workload (module-level dataclasses, so they pickle for the process pool
of ``tests/db/test_run_batch.py``, which reuses it): accounts ``acct(id,
bal)`` keyed by ``id``; transfers that abort when the balance would go
negative, increments, read-then-delete, and writes guarded by reads of
absent keys. The model runs the functions one by one in list order on a
dict, an ``Abort`` discarding that function's writes.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txns.db.errors import Abort
from txns.resolve.repair import (
    ABORTED,
    COMMITTED,
    DELETE,
    BatchContext,
    Execution,
    execute,
    repair,
    same_row,
)

TABLE = "acct"
KEYS = {TABLE: ("id",)}
State = dict[str, int]  # account -> balance


# ---- the workload ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Transfer:
    """Move ``amount`` from ``src`` to ``dst``; abort if ``src`` is missing or would go negative."""

    src: str
    dst: str
    amount: int

    def __call__(self, ctx: Any) -> int:
        s = ctx.get(TABLE, self.src)
        if s is None or s["bal"] < self.amount:
            raise Abort(f"insufficient funds in {self.src}")
        ctx.put(TABLE, {"id": self.src, "bal": s["bal"] - self.amount})
        d = ctx.get(TABLE, self.dst)  # (after the put: src == dst reads its own write)
        ctx.put(TABLE, {"id": self.dst, "bal": (d["bal"] if d else 0) + self.amount})
        return int(s["bal"])


@dataclass(frozen=True)
class Increment:
    """Add ``delta`` to ``key`` (created at ``delta`` if absent)."""

    key: str
    delta: int

    def __call__(self, ctx: Any) -> None:
        r = ctx.get(TABLE, self.key)
        ctx.put(TABLE, {"id": self.key, "bal": (r["bal"] if r else 0) + self.delta})


@dataclass(frozen=True)
class ReadThenDelete:
    """Delete ``key`` if ``watch`` holds at least ``limit`` (``watch`` may be ``key``)."""

    key: str
    watch: str
    limit: int

    def __call__(self, ctx: Any) -> bool:
        w = ctx.get(TABLE, self.watch)
        if w is not None and w["bal"] >= self.limit:
            ctx.delete(TABLE, self.key)
            return True
        return False


@dataclass(frozen=True)
class OpenIfAbsent:
    """Create ``key`` at ``bal`` if it is absent; else abort (a uniqueness constraint)."""

    key: str
    bal: int

    def __call__(self, ctx: Any) -> None:
        if ctx.get(TABLE, self.key) is not None:
            raise Abort(f"{self.key} exists")
        ctx.put(TABLE, {"id": self.key, "bal": self.bal})


Op = Transfer | Increment | ReadThenDelete | OpenIfAbsent


class ModelCtx:
    """The sequential model's context: reads and writes a working copy of the state."""

    def __init__(self, state: State) -> None:
        self.state = dict(state)

    def get(self, table: str, key: str) -> dict[str, Any] | None:
        assert table == TABLE
        return {"id": key, "bal": self.state[key]} if key in self.state else None

    def put(self, table: str, row: dict[str, Any]) -> None:
        self.state[row["id"]] = row["bal"]

    def delete(self, table: str, key: str) -> None:
        self.state.pop(key, None)


def sequential(fns: list[Any], state: State) -> tuple[State, list[str], list[Any]]:
    """Run ``fns`` one by one in order on ``state``: final state, outcomes, return values."""
    outcomes: list[str] = []
    results: list[Any] = []
    for fn in fns:
        ctx = ModelCtx(state)
        try:
            r = fn(ctx)
        except Abort:
            outcomes.append(ABORTED)
            results.append(None)
            continue
        state = ctx.state
        outcomes.append(COMMITTED)
        results.append(r)
    return state, outcomes, results


def accounts(n: int) -> list[str]:
    return [f"a{i}" for i in range(n)]


@st.composite
def workloads(draw: st.DrawFn, max_ops: int = 25) -> tuple[State, list[Op]]:
    names = accounts(draw(st.integers(1, 6)))
    name = st.sampled_from(names)
    state = draw(st.dictionaries(name, st.integers(0, 20)))
    op = st.one_of(
        st.builds(Transfer, name, name, st.integers(0, 15)),
        st.builds(Increment, name, st.integers(-5, 10)),
        st.builds(ReadThenDelete, name, name, st.integers(0, 20)),
        st.builds(OpenIfAbsent, name, st.integers(0, 20)),
    )
    return state, draw(st.lists(op, max_size=max_ops))


def reader(state: State) -> Any:
    def read(table: str, key: tuple[Any, ...]) -> dict[str, Any] | None:
        assert table == TABLE and len(key) == 1
        return {"id": key[0], "bal": state[key[0]]} if key[0] in state else None

    return read


def applied(state: State, writes: dict[tuple[str, tuple[Any, ...]], Any]) -> State:
    out = dict(state)
    for (table, key), w in writes.items():
        assert table == TABLE
        if w is DELETE:
            out.pop(key[0], None)
        else:
            assert w["id"] == key[0]
            out[key[0]] = w["bal"]
    return out


def run_repair(fns: list[Any], base: State, speculative: list[Execution | None] | None = None) -> Any:
    return repair(fns, reader(base), keys=KEYS, aborts=(Abort,), speculative=speculative)


def speculate(fns: list[Any], state: State) -> list[Execution | None]:
    return [execute(f, reader(state), KEYS, aborts=(Abort,), capture=True) for f in fns]


SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---- against the model -------------------------------------------------------------------------


@SETTINGS
@given(workloads())
def test_repair_without_speculation_is_serial(w: tuple[State, list[Op]]) -> None:
    base, fns = w
    res = run_repair(list(fns), base)
    state, outcomes, results = sequential(list(fns), base)
    assert applied(base, res.writes) == state
    assert res.outcomes == outcomes and res.results == results
    assert res.aborted.keys() == {i for i, o in enumerate(outcomes) if o == ABORTED}
    assert res.executions == len(fns) and res.repairs == 0


@SETTINGS
@given(workloads(), st.dictionaries(st.sampled_from(accounts(6)), st.integers(0, 20)))
def test_repair_of_speculation_on_another_state_is_serial(w: tuple[State, list[Op]], other: State) -> None:
    base, fns = w
    spec = speculate(list(fns), other)
    res = run_repair(list(fns), base, spec)
    state, outcomes, results = sequential(list(fns), base)
    assert applied(base, res.writes) == state
    assert res.outcomes == outcomes and res.results == results
    assert res.executions == len(fns) + res.repairs
    assert res.executions_per_fn == [1 + r for r in res.repairs_per_fn]
    # the final executions are valid speculation: a second repair runs nothing again
    again = run_repair(list(fns), base, list(res.final))
    assert again.repairs == 0 and again.writes == res.writes and again.outcomes == outcomes


@SETTINGS
@given(workloads())
def test_external_reads_are_the_base_reads_not_written_earlier(w: tuple[State, list[Op]]) -> None:
    base, fns = w
    res = run_repair(list(fns), base, speculate(list(fns), base))
    read = reader(base)
    for (table, key), seen in res.reads.items():
        assert same_row(read(table, key), seen)
    # every read a final execution took from the base is there
    written: set[Any] = set()
    for ex in res.final:
        for k in ex.reads:
            if k not in written:
                assert k in res.reads
        if ex.ok:
            written |= ex.writes.keys()


# ---- counts ------------------------------------------------------------------------------------


def test_independent_functions_need_no_repair() -> None:
    fns: list[Any] = [Increment(f"k{i}", 1) for i in range(10)]
    base: State = {}
    res = run_repair(fns, base, speculate(fns, base))
    assert res.repairs == 0 and res.executions == 10
    assert applied(base, res.writes) == {f"k{i}": 1 for i in range(10)}


def test_a_chain_needs_n_minus_one_repairs() -> None:
    fns: list[Any] = [Increment("k", 1) for _ in range(10)]
    res = run_repair(fns, {}, speculate(fns, {}))
    assert res.repairs == 9 and res.executions == 19
    assert res.repairs_per_fn == [0] + [1] * 9
    assert applied({}, res.writes) == {"k": 10}


def test_speculation_matching_the_base_needs_no_repair_and_stale_one_does() -> None:
    fns: list[Any] = [Transfer("a", "b", 5)]
    assert run_repair(fns, {"a": 5}, speculate(fns, {"a": 5})).repairs == 0
    res = run_repair(fns, {"a": 5}, speculate(fns, {"a": 4}))  # aborted on the stale state
    assert res.repairs == 1 and res.outcomes == [COMMITTED]
    res = run_repair(fns, {"a": 4}, speculate(fns, {"a": 5}))
    assert res.repairs == 1 and res.outcomes == [ABORTED] and res.aborted == {0: "insufficient funds in a"}
    assert res.writes == {}


# ---- the context and errors --------------------------------------------------------------------


def test_context_reads_its_own_writes_and_records_first_reads() -> None:
    calls: list[Any] = []

    def read(table: str, key: Any) -> dict[str, Any] | None:
        calls.append(key)
        return {"id": key[0], "bal": 1}

    ctx = BatchContext(read, KEYS)
    assert ctx.get(TABLE, "a") == {"id": "a", "bal": 1}
    assert ctx.get(TABLE, ("a",)) == {"id": "a", "bal": 1}  # (cached: one base read)
    ctx.put(TABLE, {"id": "b", "bal": 7})
    assert ctx.get(TABLE, "b") == {"id": "b", "bal": 7}  # own write: not a read
    ctx.delete(TABLE, "a")
    assert ctx.get(TABLE, "a") is None
    assert ctx.add(TABLE, "b", "bal", 3) == {"id": "b", "bal": 10}
    assert calls == [("a",)]
    assert ctx.execution.reads == {(TABLE, ("a",)): {"id": "a", "bal": 1}}
    assert ctx.execution.writes == {(TABLE, ("b",)): {"id": "b", "bal": 10}, (TABLE, ("a",)): DELETE}


def test_context_refuses_bad_rows() -> None:
    ctx = BatchContext(reader({}), KEYS)
    with pytest.raises(ValueError, match="primary key column"):
        ctx.put(TABLE, {"bal": 1})
    with pytest.raises(ValueError, match="no primary key known"):
        ctx.put("other", {"id": "a"})
    with pytest.raises(TypeError, match="dict"):
        ctx.put(TABLE, [("id", "a")])  # type: ignore[arg-type]
    with pytest.raises(LookupError):
        ctx.add(TABLE, "zz", "bal", 1)


def test_other_exceptions_propagate_and_speculative_ones_are_run_again() -> None:
    state = {"n": 0}

    def flaky(ctx: BatchContext) -> None:
        r = ctx.get(TABLE, "a")
        if r is None:
            raise KeyError("a")  # (only on a stale state: the serial run has "a")
        ctx.put(TABLE, {"id": "b", "bal": r["bal"]})
        state["n"] += 1

    spec = execute(flaky, reader({}), KEYS, aborts=(Abort,), capture=True)
    assert spec.error is not None and not spec.ok
    with pytest.raises(KeyError):
        execute(flaky, reader({}), KEYS, aborts=(Abort,))
    res = run_repair([Increment("a", 2), flaky], {}, [None, spec])
    assert res.repairs == 1 and applied({}, res.writes) == {"a": 2, "b": 2}
    with pytest.raises(KeyError):
        run_repair([flaky], {})


def test_speculation_must_match_the_functions() -> None:
    with pytest.raises(ValueError, match="speculative"):
        run_repair([Increment("a", 1)], {}, [])


def test_delete_and_executions_pickle() -> None:
    assert pickle.loads(pickle.dumps(DELETE)) is DELETE
    ex = execute(ReadThenDelete("a", "a", 0), reader({"a": 1}), KEYS, aborts=(Abort,))
    back = pickle.loads(pickle.dumps(ex))
    assert back == ex and back.writes[(TABLE, ("a",))] is DELETE


def test_same_row_is_null_safe() -> None:
    assert same_row(None, None) and not same_row(None, {}) and not same_row({}, None)
    assert same_row({"x": float("nan")}, {"x": float("nan")})
    assert same_row({"x": None}, {"x": None}) and not same_row({"x": None}, {"x": 0})
    assert not same_row({"x": 1}, {"x": 1, "y": 2})
