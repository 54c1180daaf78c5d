"""Retention: the database holds each table's since at now - retention, so compaction forgets old history.

The clock is the database's own (``PersistConfig.clock_ms``), moved forward
by the test instead of sleeping; it stands for every client's and the
storage's time at once, so the clock skew check is off (``max_clock_skew=None``).
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pyarrow as pa
import pytest

import txns
from persist import PersistConfig, ReadBelowSince
from tests.helpers import mem_url
from txns.db import clock
from txns.db.database import DROPPED_REPORT

RETENTION = dt.timedelta(hours=1)


class FakeClock:
    """Real time plus an offset the test moves forward, or a time it sets (frozen)."""

    def __init__(self) -> None:
        self.offset_ms = 0
        self.frozen_ms: int | None = None

    def __call__(self) -> int:
        if self.frozen_ms is not None:
            return self.frozen_ms
        return int(time.time() * 1000) + self.offset_ms


def stored(db: txns.Database, name: str) -> dict:
    db._settle()  # commits are applied (and holds moved) in the background: let it finish first
    return db.client.inspect(db.entry(name, db.latest()).data_id)


def version(i: int) -> pa.Table:
    return pa.table({"k": pa.array(range(10), pa.int64()), "v": pa.array([i] * 10, pa.int64())})


def snapshot(db: txns.Database, as_of: int) -> list:
    return sorted(map(tuple, (r.values() for r in db.table("t").to_arrow(as_of=as_of).to_pylist())))


@pytest.mark.timeout(300)
def test_a_thousand_updates_compact_back_to_the_live_rows(tmp_path: Path) -> None:
    fake = FakeClock()
    # (in memory: the protocol is the same on every backend, and 1,000 commits go faster)
    db = txns.connect(mem_url("retention"), retention=RETENTION, config=PersistConfig(part_grace_s=0, clock_ms=fake))
    db.create_table("t", pa.schema([("k", pa.int64()), ("v", pa.int64())]))
    with db.transaction() as t:
        t.insert("t", version(0))
    commits = [t.commit_info.ts]  # type: ignore[union-attr]
    n = 1000
    for i in range(1, n + 1):
        with db.transaction() as t:
            t.retract("t", version(i - 1))
            t.insert("t", version(i))
        commits.append(t.commit_info.ts)  # type: ignore[union-attr]
    before = stored(db, "t")
    assert before["rows"] >= 10 * n  # every version is still stored: nothing could consolidate yet
    assert snapshot(db, commits[1]) == [(k, 1) for k in range(10)]

    # Time passes: everything but the last 10 commits falls out of the retention window.
    keep_from = commits[n - 10]
    fake.frozen_ms = clock.wall_ms(keep_from) + int(RETENTION.total_seconds() * 1000)
    within = {ts: snapshot(db, ts) for ts in commits[n - 10 :]}
    report = db.compact()["t"]
    after = stored(db, "t")
    assert after["since"] <= keep_from
    assert after["rows"] <= 10 + 20 * 10  # the live rows plus the changes still retained
    assert after["rows"] < before["rows"] / 20
    assert after["parts"] <= max(1, before["parts"])
    assert report["before"]["rows"] == before["rows"] and report["after"]["rows"] == after["rows"]
    # reads within the retention are unchanged
    for ts, rows in within.items():
        assert snapshot(db, ts) == rows
    # reads before it say where history starts
    with pytest.raises(ReadBelowSince, match="earliest readable time") as info:
        db.table("t").to_arrow(as_of=commits[1])
    assert info.value.since == after["since"]

    # Once the whole history is older than the retention, storage is the live rows alone.
    fake.frozen_ms += int(RETENTION.total_seconds() * 1000) * 2
    db.compact()
    final = stored(db, "t")
    assert final["rows"] == 10 and final["batches"] == 1 and final["parts"] <= 1
    assert snapshot(db, db.latest()) == [(k, n) for k in range(10)]
    assert db.table("t").count() == 10
    # history keeps its records (the commits shard is not the table)
    assert db.history(table="t").num_rows == n + 2


def test_per_table_retention(db_url: str) -> None:
    fake = FakeClock()
    db = txns.connect(
        db_url, retention=RETENTION, config=PersistConfig(part_grace_s=0, clock_ms=fake), max_clock_skew=None
    )
    schema = pa.schema([("k", pa.int64()), ("v", pa.int64())])
    db.create_table("short", schema, retention=dt.timedelta(minutes=1))
    db.create_table("long", schema)
    firsts = {}
    for name in ("short", "long"):
        with db.transaction() as t:
            t.insert(name, version(0))
        firsts[name] = t.commit_info.ts  # type: ignore[union-attr]
        with db.transaction() as t:
            t.retract(name, version(0))
            t.insert(name, version(1))
    fake.offset_ms = 10 * 60 * 1000  # ten minutes on: past the short retention, within the long one
    db.compact()
    with pytest.raises(ReadBelowSince):
        db.table("short").to_arrow(as_of=firsts["short"])
    assert snapshot_of(db, "long", firsts["long"]) == [(k, 0) for k in range(10)]
    assert stored(db, "short")["rows"] == 10
    assert stored(db, "long")["rows"] == 30


def snapshot_of(db: txns.Database, name: str, as_of: int) -> list:
    return sorted(map(tuple, (r.values() for r in db.table(name).to_arrow(as_of=as_of).to_pylist())))


def test_commits_move_the_holds_without_an_explicit_compact(db_url: str) -> None:
    """The database moves a written table's hold as it commits (at most once a minute) and compacts small tables."""
    fake = FakeClock()
    db = txns.connect(
        db_url,
        retention=dt.timedelta(minutes=5),
        config=PersistConfig(part_grace_s=0, clock_ms=fake),
        max_clock_skew=None,
    )
    db.create_table("t", pa.schema([("k", pa.int64()), ("v", pa.int64())]))
    with db.transaction() as t:
        t.insert("t", version(0))
    for i in range(1, 50):
        with db.transaction() as t:
            t.retract("t", version(i - 1))
            t.insert("t", version(i))
    assert stored(db, "t")["rows"] >= 500
    fake.offset_ms = 60 * 60 * 1000  # an hour later
    with db.transaction() as t:
        t.retract("t", version(49))
        t.insert("t", version(50))
    s = stored(db, "t")
    assert s["since"] > 0
    assert s["rows"] <= 30  # the live rows plus the last commit's change
    assert snapshot_of(db, "t", db.latest()) == [(k, 50) for k in range(10)]


def test_a_dropped_table_is_released_once_its_history_is_gone(db_url: str) -> None:
    fake = FakeClock()
    db = txns.connect(
        db_url,
        retention=RETENTION,
        config=PersistConfig(part_grace_s=60, clock_ms=fake, inline_max_bytes=0),  # (data in parts)
        max_clock_skew=None,
    )
    schema = pa.schema([("k", pa.int64()), ("v", pa.int64())])
    db.create_table("t", schema)
    db.create_table("keep", schema)
    with db.transaction() as t:
        t.insert("t", version(1))
        t.insert("keep", version(2))
    d = db.entry("t", db.latest()).data_id
    before_drop = db.latest()
    dropped = db.table("t")  # (a handle taken before the drop reads as of earlier times)
    db.drop_table("t")
    db._settle()
    assert list(db.client.blob.list_keys(f"{d}/parts/"))

    # within the retention: still readable as of before the drop, nothing released
    report = db.compact()[DROPPED_REPORT]
    assert report == {"tombstoned": 0, "forgotten": 0}
    assert sorted(map(tuple, (r.values() for r in dropped.to_arrow(as_of=before_drop).to_pylist()))) == sorted(
        (k, 1) for k in range(10)
    )
    assert d in db.handle.cache.registered_now()

    # past the retention: the drop is below every readable catalog; the shard is retired
    fake.offset_ms += 2 * 3_600_000
    with db.transaction() as t:  # (time moves on: a commit after the clock jump)
        t.insert("keep", version(3))
    report = db.compact()[DROPPED_REPORT]  # (moves the catalog's hold past the drop first)
    assert report["tombstoned"] == 1 and report["forgotten"] == 0  # parts wait for their grace period
    with pytest.raises(ReadBelowSince):
        dropped.to_arrow(as_of=before_drop)
    state = db.client.shard(d).fetch()
    assert state.is_tombstone and state.garbage

    fake.offset_ms += 120_000  # past the part grace period
    report = db.compact()[DROPPED_REPORT]
    assert report == {"tombstoned": 0, "forgotten": 1}
    db.handle.cache.sync()
    assert d not in db.handle.cache.registered_now()
    assert not list(db.client.blob.list_keys(f"{d}/parts/"))
    assert db.client.shard(d).fetch().garbage == []
    # the live table is untouched
    assert len(db.table("keep").to_arrow()) == 20
    db.close()
