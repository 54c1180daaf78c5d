"""db.submit and the resolver (txns.db.intents): the rule through the database, exactly one outcome per intent.

The model: intents in id order ``(epoch, intent id)``, each committing iff
every read equals the key's current row (after the earlier committed ones),
its writes and adds then applied. Across processes on S3 through the fault
proxy: tests/db/test_intents_procs.py.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import txns
from persist import InvalidUsage
from txns.db.intents import INTENTS, OUTCOMES, IntentFuture

KV = pa.schema([("k", pa.string()), ("v", pa.string())])
COUNTERS = pa.schema([("k", pa.string()), ("n", pa.int64())])


def _db(kind: str = "kv") -> txns.Database:
    db = txns.connect(f"mem://intents-{uuid.uuid4().hex}")
    if kind == "kv":
        db.create_table("kv", KV, primary_key=["k"])
    else:
        db.create_table("counters", COUNTERS, primary_key=["k"])
    return db


def _row(k: str, v: str | None) -> dict[str, str] | None:
    return None if v is None else {"k": k, "v": v}


def _kv(db: txns.Database) -> dict[str, str]:
    return {r["k"]: r["v"] for r in db.table("kv").to_arrow().to_pylist()}


def _outcome_rows(db: txns.Database) -> list[dict[str, Any]]:
    return db.table(OUTCOMES).to_arrow().to_pylist()


# the reference post's nine transactions, as (reads, writes) over keys alice, bob, x of table kv
POST: list[tuple[dict[str, str | None], dict[str, str]]] = [
    ({}, {"alice": "100"}),
    ({"bob": None}, {"bob": "50"}),
    ({"alice": "100", "bob": "50"}, {"alice": "70", "bob": "80"}),
    ({"alice": "100", "bob": "50"}, {"alice": "60", "bob": "90"}),
    ({"alice": "70", "bob": "80"}, {"alice": "50", "bob": "100"}),
    ({"x": None}, {"x": "A"}),
    ({"x": "A"}, {"x": "B"}),
    ({"x": "A"}, {"x": "C"}),
    ({"x": "C"}, {"x": "D"}),
]


def _submit_post(db: txns.Database, rows: list[tuple[dict[str, str | None], dict[str, str]]]) -> list[IntentFuture]:
    return [
        db.submit(
            reads={("kv", k): _row(k, v) for k, v in reads.items()},
            writes={("kv", k): _row(k, v) for k, v in writes.items()},
        )
        for reads, writes in rows
    ]


def test_the_reference_example_one_epoch_each() -> None:
    db = _db()
    futures = _submit_post(db, POST)
    assert [f.epoch for f in futures] == sorted(f.epoch for f in futures)
    outcomes = [f.result() for f in futures]
    assert [n + 1 for n, o in enumerate(outcomes) if not o.committed] == [4, 8, 9]
    assert _kv(db) == {"alice": "50", "bob": "100", "x": "B"}
    assert all(o.ts > o.epoch for o in outcomes)
    rows = _outcome_rows(db)
    assert sorted(r["intent"] for r in rows) == sorted(f.intent for f in futures)  # one outcome each
    db.close()


def test_one_resolution_step_serializes_a_whole_batch_in_id_order() -> None:
    db = _db()
    futures = _submit_post(db, POST)
    assert db.resolve_intents() == 9  # every epoch closed: one step, one commit
    assert db.resolve_intents() == 0
    assert [n + 1 for n, f in enumerate(futures) if not f.result().committed] == [4, 8, 9]
    assert len({f.result().ts for f in futures}) == 1
    db.close()


def test_outcomes_are_the_same_from_another_database_object() -> None:
    url = f"mem://intents-shared-{uuid.uuid4().hex}"
    db = txns.connect(url)
    db.create_table("kv", KV, primary_key=["k"])
    futures = _submit_post(db, POST)
    db.resolve_intents()
    other = txns.connect(url)
    for f in futures:
        theirs = IntentFuture(other, f.intent, f.epoch).result()
        assert theirs == f.result()  # read from the outcomes table, not this process's memory
    other.close()
    db.close()


def test_reads_are_checked_against_what_ordinary_transactions_committed() -> None:
    db = _db()
    with db.transaction() as t:
        t.upsert("kv", [{"k": "a", "v": "1"}])
    stale = db.submit(reads={("kv", "a"): None}, writes={("kv", "b"): {"k": "b", "v": "x"}})
    fresh = db.submit(reads={("kv", "a"): {"k": "a", "v": "1"}}, writes={("kv", "a"): None})
    assert not stale.result().committed
    assert stale.result().reason == "a read no longer matched"
    assert fresh.result().committed
    assert _kv(db) == {}  # the delete applied
    db.close()


def test_adds_commute_and_only_readers_of_the_key_conflict() -> None:
    db = _db("counters")
    with db.transaction() as t:
        t.upsert("counters", [{"k": "a", "n": 10}, {"k": "b", "n": 0}])
    f1 = db.submit(adds={("counters", "a"): {"n": 5}})
    f2 = db.submit(adds={("counters", "a"): {"n": 7}})  # never conflicts with f1
    stale = db.submit(reads={("counters", "a"): {"k": "a", "n": 10}}, writes={("counters", "b"): {"k": "b", "n": 1}})
    seen = db.submit(reads={("counters", "a"): {"k": "a", "n": 22}}, adds={("counters", "b"): {"n": 3}})
    assert [f.result().committed for f in (f1, f2, stale, seen)] == [True, True, False, True]
    rows = {r["k"]: r["n"] for r in db.table("counters").to_arrow().to_pylist()}
    assert rows == {"a": 22, "b": 3}
    db.close()


def test_an_intent_on_a_dropped_table_rolls_back_with_the_reason() -> None:
    db = _db()
    db.create_table("tmp", KV, primary_key=["k"])
    f = db.submit(writes={("tmp", "a"): {"k": "a", "v": "1"}})
    ok = db.submit(writes={("kv", "a"): {"k": "a", "v": "1"}})
    db.drop_table("tmp")
    assert not f.result().committed and "tmp" in (f.result().reason or "")
    assert ok.result().committed
    db.close()


def test_concurrent_resolvers_give_every_intent_exactly_one_outcome() -> None:
    url = f"mem://intents-race-{uuid.uuid4().hex}"
    db = txns.connect(url)
    db.create_table("counters", COUNTERS, primary_key=["k"])
    with db.transaction() as t:
        t.upsert("counters", [{"k": f"c{i}", "n": 0} for i in range(4)])
    dbs = [txns.connect(url) for _ in range(3)]
    futures: list[IntentFuture] = []
    lock = threading.Lock()

    def submitter(i: int) -> None:
        rng = random.Random(i)
        for _ in range(15):
            k = f"c{rng.randrange(4)}"
            f = dbs[i].submit(adds={("counters", k): {"n": 1}})
            with lock:
                futures.append(f)

    def resolver(i: int) -> None:
        for _ in range(10):
            dbs[i].resolve_intents()

    ths = [threading.Thread(target=submitter, args=(i,)) for i in range(3)]
    ths += [threading.Thread(target=resolver, args=(i,)) for i in range(3)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    outcomes = [f.result() for f in futures]
    assert all(o.committed for o in outcomes)  # adds alone never conflict
    rows = _outcome_rows(db)
    per_intent: dict[str, int] = {}
    for r in rows:
        per_intent[r["intent"]] = per_intent.get(r["intent"], 0) + 1
    assert set(per_intent) == {f.intent for f in futures} and set(per_intent.values()) == {1}
    total = sum(r["n"] for r in db.table("counters").to_arrow().to_pylist())
    assert total == len(futures)  # each add applied exactly once
    for d in dbs:
        d.close()
    db.close()


def test_submit_many_shares_one_commit_and_epoch() -> None:
    db = _db()
    fs = db.submit_many([{"writes": {("kv", f"k{i}"): {"k": f"k{i}", "v": "x"}}} for i in range(5)])
    assert len({f.epoch for f in fs}) == 1
    assert all(f.result().committed for f in fs)
    assert len(_kv(db)) == 5
    # resolved intents are retired in the resolving commit; their history keeps them
    assert db.table(INTENTS).to_arrow().num_rows == 0
    ch = db.table(INTENTS).changes(fs[0].epoch, db.latest() + 1)
    updates = sorted(zip(ch.column("ts").to_pylist(), ch.column("diff").to_pylist(), strict=True))
    assert updates[:5] == [(fs[0].epoch, 1)] * 5
    assert sum(ch.column("diff").to_pylist()) == 0
    db.close()


def test_retired_intents_leave_the_stored_table_after_retention() -> None:
    import datetime as dt
    import time

    db = _db()
    for i in range(4):
        fs = db.submit_many([{"writes": {("kv", f"k{i}-{j}"): {"k": f"k{i}-{j}", "v": "x"}}} for j in range(10)])
        assert all(f.result().committed for f in fs)
    assert db.table(INTENTS).to_arrow().num_rows == 0

    def stored() -> int:
        ts = db.latest()
        return sum(r.rows for r in db.plan(db.entry(INTENTS, ts), ts).runs)

    assert stored() == 80  # 40 intents and their 40 retirements, until compaction passes both
    db.set_table_retention(INTENTS, dt.timedelta(milliseconds=1))
    time.sleep(0.01)
    db.compact()
    assert stored() == 0
    assert len(_kv(db)) == 40 and len(db.table("txns_outcomes").to_arrow()) == 40
    db.close()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "needs reads, writes or adds"),
        ({"reads": [("kv", "a")]}, "must be a dict"),
        ({"reads": {"kv": None}}, r"\(table name, primary key\) pair"),
        ({"reads": {("nope", "a"): None}}, "no table 'nope'"),
        ({"writes": {("kv", "a"): {"k": "b", "v": "1"}}}, "does not have the key"),
        ({"writes": {("kv", "a"): {"k": "a"}}}, "missing"),
        ({"adds": {("kv", "a"): {"v": 1}}}, "not a numeric non-key column"),
        ({"writes": {("txns_outcomes", "a"): None}}, "system table"),
        ({"reads": {("kv", "a"): None, ("kv", ("a",)): {"k": "a", "v": "1"}}}, "given twice"),
    ],
)
def test_bad_intents_are_refused_before_anything_is_written(kwargs: dict[str, Any], match: str) -> None:
    db = _db()
    db.submit(writes={("kv", "z"): {"k": "z", "v": "0"}}).result()  # (the intent tables exist)
    before = db.table(INTENTS).to_arrow().num_rows
    with pytest.raises(Exception, match=match) as e:
        db.submit(**kwargs)
    assert isinstance(e.value, InvalidUsage | txns.SchemaMismatch | txns.TableNotFound)
    assert db.table(INTENTS).to_arrow().num_rows == before
    db.close()


def test_a_step_reads_the_intents_only_when_some_were_submitted(monkeypatch: pytest.MonkeyPatch) -> None:
    from txns.db.table import Table

    db = _db()
    db.submit(writes={("kv", "a"): {"k": "a", "v": "1"}}).result()
    read: list[str] = []
    changes = Table.changes

    def spy(self: Table, *args: Any, **kwargs: Any) -> pa.Table:
        read.append(self.name)
        return changes(self, *args, **kwargs)

    monkeypatch.setattr(Table, "changes", spy)
    with db.transaction() as t:  # other tables move on; no intent is submitted
        t.upsert("kv", [{"k": "b", "v": "2"}])
    assert db.resolve_intents() == 0
    assert INTENTS not in read  # the txns log says the intents table was not written: nothing read
    f = db.submit(writes={("kv", "c"): {"k": "c", "v": "3"}})
    assert db.resolve_intents() == 1 and read.count(INTENTS) == 1
    assert f.result().committed and _kv(db) == {"a": "1", "b": "2", "c": "3"}
    db.close()


def test_a_waiter_reads_each_outcome_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import txns.db.intents as intents

    url = f"mem://intents-wait-{uuid.uuid4().hex}"
    db = txns.connect(url)
    db.create_table("kv", KV, primary_key=["k"])
    resolver = txns.connect(url)
    ranges: list[tuple[int, int]] = []
    outcomes = intents._outcomes

    def spy(d: txns.Database, asked: list[str], lo: int, hi: int) -> dict[str, Any]:
        ranges.append((lo, hi))
        return outcomes(d, asked, lo, hi)

    monkeypatch.setattr(intents, "_outcomes", spy)
    fs = db.submit_many([{"writes": {("kv", f"k{i}"): {"k": f"k{i}", "v": "x"}}} for i in range(3)])
    result: list[Any] = []
    waiter = threading.Thread(target=lambda: result.extend(intents.wait_all(fs, timeout=30, resolve=False)))
    waiter.start()
    for i in range(5):  # commits that are not outcomes, while the waiter polls
        with resolver.transaction() as t:
            t.upsert("kv", [{"k": f"other{i}", "v": "y"}])
        time.sleep(0.02)
    assert resolver.resolve_intents() == 3
    waiter.join(30)
    assert [o.committed for o in result] == [True, True, True]
    assert ranges and ranges[0][0] == fs[0].epoch + 1
    assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(ranges))  # back to back, no overlap
    resolver.close()
    db.close()


def test_tables_of_non_json_types_are_refused() -> None:
    db = _db()
    db.create_table("t", pa.schema([("k", pa.string()), ("d", pa.date32())]), primary_key=["k"])
    with pytest.raises(InvalidUsage, match="JSON"):
        db.submit(reads={("t", "a"): None})
    db.close()


# ---- against a sequential model --------------------------------------------------------------

_KEYS = ["a", "b", "c"]
_VALS = st.sampled_from(["0", "1", "2"])
_intent = st.fixed_dictionaries(
    {
        "reads": st.dictionaries(st.sampled_from(_KEYS), st.one_of(st.none(), _VALS), max_size=2),
        "writes": st.dictionaries(st.sampled_from(_KEYS), st.one_of(st.none(), _VALS), max_size=2),
    }
).filter(lambda d: bool(d["reads"] or d["writes"]))


def _model(start: dict[str, str], ordered: list[dict[str, Any]]) -> tuple[list[bool], dict[str, str]]:
    state = dict(start)
    out = []
    for it in ordered:
        ok = all(state.get(k) == v for k, v in it["reads"].items())
        out.append(ok)
        if ok:
            for k, v in it["writes"].items():
                if v is None:
                    state.pop(k, None)
                else:
                    state[k] = v
    return out, state


@settings(max_examples=15, deadline=None)
@given(batches=st.lists(st.lists(_intent, min_size=1, max_size=4), min_size=1, max_size=4), seed=st.integers(0, 99))
def test_resolution_equals_the_sequential_model(batches: list[list[dict[str, Any]]], seed: int) -> None:
    db = _db()
    with db.transaction() as t:
        t.upsert("kv", [{"k": "a", "v": "0"}])
    rng = random.Random(seed)
    submitted: list[tuple[IntentFuture, dict[str, Any]]] = []
    for batch in batches:
        fs = db.submit_many(
            [
                {
                    "reads": {("kv", k): _row(k, v) for k, v in it["reads"].items()},
                    "writes": {("kv", k): _row(k, v) for k, v in it["writes"].items()},
                }
                for it in batch
            ]
        )
        submitted += list(zip(fs, batch, strict=True))
        if rng.random() < 0.5:
            db.resolve_intents()  # resolve at some points, not others: steps of several epochs too
    ordered = sorted(submitted, key=lambda p: (p[0].epoch, p[0].intent))
    expect, state = _model({"a": "0"}, [it for _, it in ordered])
    assert [f.result().committed for f, _ in ordered] == expect
    assert _kv(db) == state
    outcomes = db.table(OUTCOMES).to_arrow()
    assert outcomes.num_rows == len(submitted)
    assert pc.count_distinct(outcomes.column("intent")).as_py() == len(submitted)
    db.close()


def test_a_subscriber_to_the_outcomes_table_sees_each_outcome_once() -> None:
    db = _db()
    futures = _submit_post(db, POST[:3])  # (the first submit creates the outcomes table)
    sub = db.table(OUTCOMES).subscribe(as_of=db.latest())  # no outcome yet
    assert sub.step() == []  # (the empty snapshot)
    db.resolve_intents()
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + 20
    while len(seen) < 3 and time.monotonic() < deadline:
        for t in sub.step(wait_s=0.5):
            seen += [r for r in t.to_pylist() if r["diff"] > 0]
    sub.close()
    assert sorted(r["intent"] for r in seen) == sorted(f.intent for f in futures)
    assert {r["intent"]: r["ts"] for r in seen} == {f.intent: f.result().ts for f in futures}
    assert {r["intent"]: r["committed"] for r in seen} == {f.intent: f.result().committed for f in futures}
    db.close()


def test_an_uncertain_submit_ends_in_its_outcome_or_in_not_durable() -> None:
    """After SubmitUncertain, waiting tells whether the intent landed (never by submitting it twice)."""
    from txns.db.intents import IntentNotDurable

    db = _db()
    before = db.latest()
    landed = db.submit(writes={("kv", "a"): {"k": "a", "v": "1"}})
    # the futures SubmitUncertain carries: the epoch only a lower bound
    maybe = IntentFuture(db, landed.intent, before, uncertain=True)
    never = IntentFuture(db, uuid.uuid4().hex, before, uncertain=True)
    assert maybe.result() == landed.result()
    with pytest.raises(IntentNotDurable, match="submit it again"):
        never.result(timeout=20)
    assert _kv(db) == {"a": "1"}
    db.close()
