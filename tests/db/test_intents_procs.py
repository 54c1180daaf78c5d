"""db.submit across processes on moto S3 through the fault proxy: one outcome per intent, writes exactly once.

Three spawned processes submit intents (adds to counters; reads-then-writes
on a keyed table) through a :class:`persist.fault_proxy.FaultProxy` that
drops requests, loses replies, answers 503 and truncates bodies, and wait for
each outcome (running resolution steps themselves). Afterwards, on a clean
connection, a verifier replays every intent the intents table holds, in id
order, with the rule: the outcomes it computes must be the recorded ones
(exactly one per intent, none for anything else), the tables must equal the
replay's state, and every outcome a process was told must be the recorded one.
"""

from __future__ import annotations

import multiprocessing
import random
import time
from typing import Any

import pyarrow as pa
import pytest

import txns
from persist import PersistConfig, PersistError
from persist.fault_proxy import FaultPlan, FaultProxy
from tests.seaweedfs import S3_BACKENDS
from txns.db.intents import INTENTS, OUTCOMES, IntentFuture

KEYS = [f"k{i}" for i in range(6)]
COUNTERS = [f"c{i}" for i in range(3)]
PER_PROCESS = 10


def _worker(url: str, seed: int, out: Any) -> None:
    rng = random.Random(seed)
    cfg = PersistConfig(retry_deadline_s=2.0)
    db: txns.Database | None = None
    told: list[tuple[str, int, bool, int]] = []
    errors = 0
    n = 0
    deadline = time.monotonic() + 150
    while n < PER_PROCESS and time.monotonic() < deadline:
        try:
            if db is None:
                db = txns.connect(url, config=cfg)
            if rng.random() < 0.5:
                c = rng.choice(COUNTERS)
                f = db.submit(adds={("counters", c): {"n": 1}})
            else:
                k = rng.choice(KEYS)
                row = db.read().get("kv", k)  # what it saw; another process may change it before resolution
                new = {"k": k, "v": (row["v"] if row else 0) + 1}
                f = db.submit(reads={("kv", k): row}, writes={("kv", k): new})
            n += 1
        except PersistError:
            errors += 1  # (a submit that failed may still have landed: the verifier replays every intent)
            continue
        while time.monotonic() < deadline:
            try:
                o = f.result(timeout=60)
                told.append((o.intent, o.epoch, o.committed, o.ts))
                break
            except PersistError:
                errors += 1
    out.put((told, errors))


def _value_of(table: str, row: dict[str, Any] | None) -> Any:
    """A row of ``table`` as the replay keeps it (its value column), None for absent."""
    return None if row is None else row["v" if table == "kv" else "n"]


def _replay(intents: list[tuple[int, str, dict[str, Any]]]) -> tuple[dict[str, bool], dict[str, Any], dict[str, Any]]:
    kv: dict[Any, Any] = {}
    counters: dict[Any, Any] = dict.fromkeys(COUNTERS, 0)
    state = {"kv": kv, "counters": counters}
    outcome = {}
    for _epoch, intent, body in sorted(intents, key=lambda x: (x[0], x[1])):
        ok = all(_value_of(t, v) == state[t].get(k[0]) for t, k, v in body["r"])
        outcome[intent] = ok
        if ok:
            for t, k, v in body["w"]:
                state[t][k[0]] = _value_of(t, v)
            for t, k, d in body["a"]:
                if k[0] in state[t]:
                    state[t][k[0]] += d["n"]
    return outcome, kv, counters


@pytest.mark.s3
@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("s3_backend", S3_BACKENDS)
def test_processes_submit_through_faults_and_every_intent_gets_one_outcome(
    s3_url_factory: Any, s3_endpoint: str
) -> None:
    import json

    direct_url = s3_url_factory("intents")
    db = txns.connect(direct_url)
    # every change of the tables is at or after this; reading from 0 instead is refused once their since
    # moves (to now - retention: whenever a retention hold moves, which an applier may do at any time)
    start = db.latest()
    db.create_table("kv", pa.schema([("k", pa.string()), ("v", pa.int64())]), primary_key=["k"])
    db.create_table("counters", pa.schema([("k", pa.string()), ("n", pa.int64())]), primary_key=["k"])
    with db.transaction() as t:
        t.upsert("counters", [{"k": c, "n": 0} for c in COUNTERS])
    db.submit(writes={("kv", "k0"): {"k": "k0", "v": 0}}).result()  # (creates the intent tables)
    plan = FaultPlan(drop_before=0.01, drop_reply=0.01, error_503=0.01, truncate=0.01)
    with FaultProxy(s3_endpoint, seed=5, faults=plan) as proxy:
        url = direct_url.replace(s3_endpoint, proxy.url)
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(url, seed, out)) for seed in range(3)]
        for p in procs:
            p.start()
        results = [out.get(timeout=300) for _ in procs]
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        injected = proxy.counters()
    db.resolve_intents()  # anything submitted whose submitter gave up waiting
    rows = db.table(INTENTS).changes(start)
    intents = [
        (ts, i, json.loads(b))
        for ts, i, b, d in zip(*(rows.column(c).to_pylist() for c in ("ts", "intent", "body", "diff")), strict=True)
        if d > 0
    ]
    outcomes = db.table(OUTCOMES).changes(start)
    recorded: dict[str, tuple[int, bool, int]] = {}
    for r in outcomes.to_pylist():
        assert r["diff"] == 1
        assert r["intent"] not in recorded, f"two outcomes for {r['intent']}"
        recorded[r["intent"]] = (r["epoch"], r["committed"], r["ts"])
    assert set(recorded) == {i for _, i, _ in intents}  # exactly one outcome per intent, none for anything else
    expect, kv, counters = _replay(intents)
    assert {i: c for i, (_, c, _) in recorded.items()} == expect
    assert {r["k"]: r["v"] for r in db.table("kv").to_arrow().to_pylist()} == kv
    assert {r["k"]: r["n"] for r in db.table("counters").to_arrow().to_pylist()} == counters
    told = [t for r in results for t in r[0]]
    assert len(told) >= 15, f"too few intents completed: {len(told)} (errors {[r[1] for r in results]})"
    for intent, epoch, committed, ts in told:
        assert recorded[intent] == (epoch, committed, ts)
        assert IntentFuture(db, intent, epoch).result().committed == committed
    assert sum(injected.get(k, 0) for k in ("drop_before", "drop_reply", "error_503", "truncate")) > 0
    db.close()
