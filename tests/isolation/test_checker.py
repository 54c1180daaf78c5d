"""Tests of the list-append isolation checker (:mod:`tests.isolation.checker`).

Valid histories come from a tiny in-memory reference that runs transactions
one at a time; anomalies are built by hand (or by mutating a valid history)
and must be reported under the right name. ``HYPOTHESIS_PROFILE=slow`` runs
the property tests deeper.
"""

from __future__ import annotations

import itertools
import os
import random
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.isolation.checker import (
    CYCLE_ANOMALIES,
    Key,
    Op,
    check,
    dump_history,
    load_history,
)

_COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.filter_too_much]}
settings.register_profile("isolation-ci", max_examples=60, **_COMMON)  # type: ignore[arg-type]
settings.register_profile("isolation-slow", max_examples=1000, **_COMMON)  # type: ignore[arg-type]
PROFILE = settings.get_profile(
    "isolation-slow" if os.environ.get("HYPOTHESIS_PROFILE") == "slow" else "isolation-ci"
)

LEVELS = ("serializable", "strict_serializable")
KEYS: list[Key] = ["x", "y", ("t", 1)]

# ----------------------------------------------------------------------------
# a reference: runs transactions one at a time on an in-memory store

Spec = Sequence[tuple[str, Key]]  # ("append", key) / ("r", key)
# outcomes: "ok", "fail" (not applied), "info-applied", "info-lost"
Outcome = str


def run_serially(
    specs: Sequence[Spec],
    outcomes: Sequence[Outcome],
    offsets: Sequence[tuple[float, float]] | None = None,
) -> list[Op]:
    """Run ``specs`` in order; op ``i`` takes effect at time ``2 * i``.

    Without ``offsets`` the intervals are ``[2i, 2i + 1]`` (no overlap);
    with them ``[2i - before, 2i + after]``, which may overlap but always
    contain the point where the op took effect, so real time agrees with the
    serial order.
    """
    state: dict[Key, list[int]] = defaultdict(list)
    values = itertools.count(1)
    ops = []
    for i, (spec, outcome) in enumerate(zip(specs, outcomes, strict=True)):
        local: dict[Key, list[int]] = {}
        mops: list[tuple] = []
        for kind, key in spec:
            current = local.setdefault(key, list(state[key]))
            if kind == "append":
                value = next(values)
                current.append(value)
                mops.append(("append", key, value))
            else:
                mops.append(("r", key, tuple(current)))
        if outcome in ("ok", "info-applied"):
            state.update(local)
        before, after = offsets[i] if offsets is not None else (0.0, 1.0)
        status = outcome.split("-")[0]
        ops.append(Op(f"t{i}", f"p{i % 3}", 2.0 * i - before, 2.0 * i + after, status, tuple(mops)))
    return ops


def random_specs(rng: random.Random, n: int, keys: Sequence[Key], max_mops: int = 4) -> list[Spec]:
    """Read-then-write style transactions: a few reads, then a few appends, on random keys."""
    specs = []
    for _ in range(n):
        reads = [("r", rng.choice(keys)) for _ in range(rng.randint(0, max_mops // 2))]
        writes = [("append", rng.choice(keys)) for _ in range(rng.randint(0 if reads else 1, max_mops // 2))]
        tail = [("r", rng.choice(keys))] if rng.random() < 0.2 else []
        specs.append(reads + writes + tail)
    return specs


def random_outcomes(rng: random.Random, n: int) -> list[Outcome]:
    return rng.choices(["ok", "fail", "info-applied", "info-lost"], weights=[85, 5, 5, 5], k=n)


def op(
    id: str, mops: Sequence[tuple], start: float, end: float, status: str = "ok", process: str | None = None
) -> Op:
    return Op(id, process or f"p-{id}", start, end, status, tuple(mops))


def assert_found(ops: Sequence[Op], name: str, level: str, *mentioning: str) -> None:
    result = check(ops, level)  # type: ignore[arg-type]
    assert not result.valid, result.summary()
    assert name in result.anomalies, result.summary()
    for op_id in mentioning:
        assert any(f"{op_id}@" in text for text in result.anomalies[name]), result.summary()


def assert_valid(ops: Sequence[Op], level: str) -> None:
    result = check(ops, level)  # type: ignore[arg-type]
    assert result.valid, result.summary()
    assert result.anomalies == {}


# ----------------------------------------------------------------------------
# valid histories


@pytest.mark.parametrize("seed", range(5))
def test_serial_history_is_valid(seed: int) -> None:
    rng = random.Random(seed)
    specs = random_specs(rng, 300, KEYS)
    ops = run_serially(specs, random_outcomes(rng, len(specs)))
    rng.shuffle(ops)  # list order means nothing
    for level in LEVELS:
        assert_valid(ops, level)
    result = check(ops, "strict_serializable")
    assert result.edge_counts["ww"] > 0 and result.edge_counts["wr"] > 0 and result.edge_counts["rw"] > 0
    # a transitive reduction: about one rt edge per op, not O(n^2)
    assert 0 < result.edge_counts["rt"] <= 2 * len(ops)


@pytest.mark.parametrize("seed", range(5))
def test_concurrent_serializable_history_is_valid(seed: int) -> None:
    rng = random.Random(100 + seed)
    specs = random_specs(rng, 300, KEYS)
    offsets = [(rng.uniform(0, 6), rng.uniform(0, 6)) for _ in specs]
    ops = run_serially(specs, random_outcomes(rng, len(specs)), offsets)
    assert sum(1 for a, b in itertools.pairwise(ops) if b.start < a.end) > 100  # really concurrent
    for level in LEVELS:
        assert_valid(ops, level)


def test_serializable_but_not_real_time_order() -> None:
    # T2 runs (and ends) before T1 starts, yet must be ordered after it: T2 read T1's append
    ops = [
        op("T1", [("append", "x", 1)], 10, 11),
        op("T2", [("r", "x", (1,))], 0, 1),
    ]
    assert_valid(ops, "serializable")
    assert_found(ops, "G1c-realtime", "strict_serializable", "T1", "T2")


# ----------------------------------------------------------------------------
# hand-built anomalies


def test_lost_update_is_g_single() -> None:
    ops = [
        op("T0", [("append", "x", 1)], 0, 1),
        op("T1", [("r", "x", (1,)), ("append", "x", 2)], 2, 5),
        op("T2", [("r", "x", (1,)), ("append", "x", 3)], 3, 6),
        op("T3", [("r", "x", (1, 2, 3))], 7, 8),
    ]
    for level in LEVELS:
        assert_found(ops, "G-single", level, "T1", "T2")
        result = check(ops, level)  # type: ignore[arg-type]
        [text] = result.anomalies["G-single"]
        assert "-ww[" in text and "-rw[" in text and "T0@" not in text and "T3@" not in text
        assert set(result.anomalies) == {"G-single"}


def test_write_skew_is_g2() -> None:
    ops = [
        op("T1", [("r", "x", ()), ("r", "y", ()), ("append", "x", 1)], 0, 5),
        op("T2", [("r", "x", ()), ("r", "y", ()), ("append", "y", 2)], 1, 6),
        op("T3", [("r", "x", (1,)), ("r", "y", (2,))], 7, 8),
    ]
    for level in LEVELS:
        assert_found(ops, "G2", level, "T1", "T2")
        result = check(ops, level)  # type: ignore[arg-type]
        [text] = result.anomalies["G2"]
        assert text.count("-rw[") == 2
        assert set(result.anomalies) == {"G2"}


def test_circular_information_flow_is_g1c() -> None:
    ops = [
        op("T1", [("append", "x", 1), ("r", "y", (2,))], 0, 5),
        op("T2", [("append", "y", 2), ("r", "x", (1,))], 1, 6),
    ]
    for level in LEVELS:
        assert_found(ops, "G1c", level, "T1", "T2")
        assert set(check(ops, level).anomalies) == {"G1c"}  # type: ignore[arg-type]


def test_write_cycle_is_g0() -> None:
    ops = [
        op("T1", [("append", "x", 1), ("append", "y", 2)], 0, 5),
        op("T2", [("append", "x", 3), ("append", "y", 4)], 1, 6),
        op("T3", [("r", "x", (1, 3)), ("r", "y", (4, 2))], 7, 8),
    ]
    for level in LEVELS:
        assert_found(ops, "G0", level, "T1", "T2")
        result = check(ops, level)  # type: ignore[arg-type]
        assert set(result.anomalies) == {"G0"}
        assert result.anomalies["G0"][0].count("-ww[") == 2


def test_g0_via_a_never_read_append() -> None:
    # T1's second append to x was never read, so it is after T2's 3: T1's appends are interleaved with T2's
    ops = [
        op("T1", [("append", "x", 1), ("append", "x", 2)], 0, 5),
        op("T2", [("append", "x", 3)], 1, 6),
        op("T3", [("r", "x", (1, 3))], 7, 8),
    ]
    assert_found(ops, "G0", "serializable", "T1", "T2")


def test_aborted_read_is_g1a() -> None:
    ops = [
        op("T1", [("append", "x", 1)], 0, 1, status="fail"),
        op("T2", [("r", "x", (1,))], 2, 3),
    ]
    for level in LEVELS:
        assert_found(ops, "G1a", level, "T1", "T2")


def test_intermediate_read_is_g1b() -> None:
    ops = [
        op("T1", [("append", "x", 1), ("append", "x", 2)], 0, 5),
        op("T2", [("r", "x", (1,))], 1, 4),
        op("T3", [("r", "x", (1, 2))], 6, 7),
    ]
    for level in LEVELS:
        assert_found(ops, "G1b", level, "T1", "T2")
    # a read of the writer's final state is fine
    ok = [ops[0], op("T2", [("r", "x", (1, 2))], 1, 6)]
    assert_valid(ok, "strict_serializable")


def test_incompatible_order() -> None:
    ops = [
        op("T0", [("append", "x", 1)], 0, 1),
        op("T1", [("append", "x", 2)], 2, 3),
        op("T2", [("append", "x", 3)], 2, 3),
        op("T3", [("r", "x", (1, 2))], 4, 5),
        op("T4", [("r", "x", (1, 3))], 4, 5),
    ]
    for level in LEVELS:
        assert_found(ops, "incompatible-order", level, "T3", "T4")


def test_duplicate_elements() -> None:
    ops = [
        op("T0", [("append", "x", 1)], 0, 1),
        op("T1", [("r", "x", (1, 1))], 2, 3),
    ]
    for level in LEVELS:
        assert_found(ops, "duplicate-elements", level, "T1")


def test_garbage_read() -> None:
    ops = [op("T1", [("r", "x", (7,))], 0, 1)]
    assert_found(ops, "garbage-read", "serializable", "T1")


def test_internal_inconsistency() -> None:
    base = op("T0", [("append", "x", 1)], 0, 1)
    own_append_missing = op("T1", [("append", "x", 5), ("r", "x", (1,))], 2, 3)
    assert_found([base, own_append_missing], "internal", "serializable", "T1")
    non_repeatable = op("T1", [("r", "x", ()), ("r", "x", (1,))], 2, 3)
    assert_found([base, non_repeatable], "internal", "serializable", "T1")
    consistent = op("T1", [("r", "x", (1,)), ("append", "x", 5), ("r", "x", (1, 5))], 2, 3)
    assert_valid([base, consistent], "strict_serializable")


def test_stale_read_is_a_realtime_anomaly_only() -> None:
    ops = [
        op("T1", [("append", "x", 5)], 0, 1),
        op("T2", [("r", "x", ())], 2, 3),
    ]
    assert_valid(ops, "serializable")
    assert_found(ops, "G-single-realtime", "strict_serializable", "T1", "T2")
    text = check(ops, "strict_serializable").anomalies["G-single-realtime"][0]
    assert "-rt[" in text and "-rw[" in text
    # the same with overlapping or touching intervals is fine (real-time order needs end < start)
    assert_valid([ops[0], replace(ops[1], start=0.5)], "strict_serializable")
    assert_valid([ops[0], replace(ops[1], start=1.0)], "strict_serializable")
    instant = replace(ops[1], start=1.0, end=1.0)
    assert_valid([ops[0], replace(ops[0], id="T0", mops=()), instant], "strict_serializable")


def test_stale_read_through_intermediate_ops() -> None:
    # T1's append is seen by T2 in real time; T4 (after T2 and T3) misses it
    ops = [
        op("T1", [("append", "x", 5)], 0, 1),
        op("T2", [("append", "y", 6)], 2, 3),
        op("T3", [("r", "z", ())], 4, 5),
        op("T4", [("r", "x", ())], 6, 7),
    ]
    assert_valid(ops, "serializable")
    assert_found(ops, "G-single-realtime", "strict_serializable", "T1", "T4")


# ----------------------------------------------------------------------------
# outcome unknown


def test_info_observed_counts_as_committed() -> None:
    ops = [
        op("T1", [("append", "x", 1)], 0, 1, status="info"),
        op("T2", [("r", "x", (1,))], 2, 3),
    ]
    for level in LEVELS:
        result = check(ops, level)  # type: ignore[arg-type]
        assert result.valid, result.summary()
        assert result.op_counts["info-committed"] == 1 and result.op_counts["committed"] == 2
        assert result.edge_counts["wr"] == 1


def test_info_observed_joins_cycles() -> None:
    # the info op is committed (T2 read it), so T2's other read makes a G1c cycle with it
    ops = [
        op("T1", [("append", "x", 1), ("r", "y", (2,))], 0, 9, status="info"),
        op("T2", [("append", "y", 2), ("r", "x", (1,))], 1, 6),
    ]
    assert_found(ops, "G1c", "serializable", "T1", "T2")


def test_info_never_observed_is_ignored() -> None:
    lost = [
        op("T1", [("append", "x", 5), ("r", "y", (99,))], 0, 1, status="info"),
        op("T2", [("r", "x", ())], 2, 3),
    ]
    result = check(lost, "strict_serializable")
    assert result.valid, result.summary()
    assert result.op_counts["info-committed"] == 0 and result.op_counts["committed"] == 1
    # were T1 ok, T2's read would be stale and T1's read garbage
    assert not check([replace(lost[0], status="ok"), lost[1]], "strict_serializable").valid
    # reading its own append does not make an info op committed
    self_read = [op("T1", [("append", "x", 5), ("r", "x", (5,))], 0, 1, status="info"), lost[1]]
    result = check(self_read, "strict_serializable")
    assert result.valid and result.op_counts["info-committed"] == 0, result.summary()


def test_info_commit_may_land_after_its_end() -> None:
    # no rt edge out of an info op: its commit may take effect after the client gave up
    ops = [
        op("T1", [("append", "x", 5)], 0, 1, status="info"),
        op("T2", [("r", "x", ())], 2, 3),
        op("T3", [("r", "x", (5,))], 4, 5),
    ]
    assert_valid(ops, "strict_serializable")


# ----------------------------------------------------------------------------
# records


def test_json_round_trip(tmp_path: Path) -> None:
    ops = [
        Op("a", "w1", 1.5, 2.5, "ok", (("append", ("t", 1), 3), ("r", "x", None)), read_ts=4, commit_ts=5),
        Op("b", "w2", 2.0, 3.0, "info", [["r", ("t", 1), [3]]]),  # type: ignore[arg-type]
    ]
    assert ops[0].mops[1] == ("r", "x", ())
    assert Op.from_json(ops[0].to_json()) == ops[0]
    path = tmp_path / "history.jsonl"
    dump_history(ops[:1], path)
    dump_history(ops[1:], path, append=True)
    loaded = load_history(path)
    assert loaded == ops
    assert check(loaded).valid


def test_bad_records_are_rejected() -> None:
    with pytest.raises(ValueError, match="status"):
        op("T1", [], 0, 1, status="maybe")
    with pytest.raises(ValueError, match="micro-op"):
        op("T1", [("write", "x", 1)], 0, 1)
    with pytest.raises(ValueError, match="appended by both"):
        check([op("T1", [("append", "x", 1)], 0, 1), op("T2", [("append", "x", 1)], 0, 1)])
    with pytest.raises(ValueError, match="level"):
        check([], "snapshot")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------
# size


def test_big_history_checks_quickly() -> None:
    rng = random.Random(7)
    keys = [f"k{i}" for i in range(20)]
    specs = random_specs(rng, 5000, keys)
    offsets = [(rng.uniform(0, 10), rng.uniform(0, 10)) for _ in specs]
    ops = run_serially(specs, random_outcomes(rng, len(specs)), offsets)
    started = time.monotonic()
    result = check(ops, "strict_serializable")
    elapsed = time.monotonic() - started
    assert result.valid, result.summary()
    assert elapsed < 15, elapsed  # a few seconds normally; generous for a loaded machine
    # one stale read among them is found
    stale = _stale_read_mutations(ops)[-1]
    broken = check(_apply_stale_read(ops, stale), "strict_serializable")
    assert not broken.valid and set(broken.anomalies) <= set(CYCLE_ANOMALIES), broken.summary()


# ----------------------------------------------------------------------------
# properties

mop_st = st.tuples(st.sampled_from(["append", "r"]), st.sampled_from(KEYS))
txn_st = st.lists(mop_st, min_size=1, max_size=4)
outcome_st = st.sampled_from(["ok", "ok", "ok", "ok", "fail", "info-applied", "info-lost"])
offset_st = st.tuples(st.integers(0, 30), st.integers(0, 30)).map(lambda t: (t[0] / 10, t[1] / 10))


@st.composite
def serial_histories(draw: st.DrawFn, min_size: int = 1) -> list[Op]:
    txns = draw(st.lists(st.tuples(txn_st, outcome_st), min_size=min_size, max_size=25))
    offsets = None
    if draw(st.booleans()):
        offsets = draw(st.lists(offset_st, min_size=len(txns), max_size=len(txns)))
    ops = run_serially([t for t, _ in txns], [o for _, o in txns], offsets)
    return draw(st.permutations(ops))


@PROFILE
@given(serial_histories())
def test_serial_executions_are_valid(ops: list[Op]) -> None:
    for level in LEVELS:
        assert_valid(ops, level)


StaleRead = tuple[int, int, int]  # (op index, mop index, last position of a missable value)


def _stale_read_mutations(ops: Sequence[Op]) -> list[StaleRead]:
    """Reads that can be cut to miss an ok op's append that ended before the reader started.

    Only a committed op's only read of its key, before any append of its own
    to that key, so the mutation breaks no internal consistency.
    """
    writer = {(k, v): o for o in ops for k, v in o.appends()}
    found = []
    for i, reader in enumerate(ops):
        if reader.status != "ok":
            continue
        for j, (kind, key, values) in enumerate(reader.mops):
            if kind != "r" or sum(1 for m in reader.mops if m[1] == key and m[0] == "r") > 1:
                continue
            if any(m[1] == key for m in reader.mops[:j]):
                continue
            missable = [
                p
                for p, v in enumerate(values)
                if writer[(key, v)].status == "ok" and writer[(key, v)].end < reader.start
            ]
            if missable:
                found.append((i, j, max(missable)))
    return found


def _apply_stale_read(ops: Sequence[Op], mutation: StaleRead, keep: int | None = None) -> list[Op]:
    i, j, last_missable = mutation
    keep = last_missable if keep is None else keep
    kind, key, values = ops[i].mops[j]
    mops = list(ops[i].mops)
    mops[j] = (kind, key, values[:keep])
    return [*ops[:i], replace(ops[i], mops=tuple(mops)), *ops[i + 1 :]]


@PROFILE
@given(st.data())
def test_stale_reads_violate_strict_serializability(data: st.DataObject) -> None:
    ops = data.draw(serial_histories(min_size=3))
    mutations = _stale_read_mutations(ops)
    assume(mutations)
    mutation = data.draw(st.sampled_from(mutations))
    keep = data.draw(st.integers(0, mutation[2]))
    mutated = _apply_stale_read(ops, mutation, keep)
    result = check(mutated, "strict_serializable")
    assert not result.valid
    assert set(result.anomalies) & set(CYCLE_ANOMALIES), result.summary()
    assert "internal" not in result.anomalies and "incompatible-order" not in result.anomalies
