"""A handle idle while others committed and compacted reads exactly the table at one time (issue 24).

The scenario of the empty Spark Connect overwrite: a long-lived handle
wrote a table (so it caches that table's data shard state), then stayed
idle past its lease on the txns shard while another handle appended to the
table, compacted the txns shard past that append, and overwrote the table
(retract everything, add the new rows: one commit). Its read planned the
old cached state plus the log's entries from the cache's since on, and so
left out the append (applied, tidied from the log, below the since): the
overwrite's retractions cancelled the append's row and the new one, and the
table read back empty, a state it never had.
"""

from __future__ import annotations

import time

import pyarrow as pa

import txns
from persist import PersistConfig

ACCOUNTS = pa.schema([("account", pa.string()), ("balance", pa.int64())])
LEASE_S = 0.2
"""The idle handle's lease on the txns shard (it lapses while the other handle works)."""
FILLER_COMMITS = 18
"""Commits of the other handle between the append and the overwrite: its maintenance compacts the txns shard."""


def _rows(db: txns.Database, name: str, as_of: int | None = None) -> list[tuple[str, int]]:
    return sorted((r["account"], r["balance"]) for r in db.table(name).to_arrow(as_of).to_pylist())


def test_idle_handle_reads_the_overwrite_whole(db_url: str) -> None:
    idle = txns.connect(db_url, config=PersistConfig(reader_lease_s=LEASE_S))
    idle.create_table("scratch", ACCOUNTS)
    idle.create_table("other", ACCOUNTS)
    with idle.transaction() as t:
        t.insert("scratch", [{"account": "old", "balance": 0}])
    assert _rows(idle, "scratch") == [("old", 0)]  # (the idle handle now caches the shard's state)
    time.sleep(LEASE_S * 3)  # idle past its lease: the txns shard may be compacted past its hold

    with txns.connect(db_url, create=False) as busy:
        with busy.transaction() as t:
            t.insert("scratch", [{"account": "carol", "balance": 7}])
        for i in range(FILLER_COMMITS):
            with busy.transaction() as t:
                t.insert("other", [{"account": f"x{i}", "balance": i}])
        with busy.transaction() as t:  # an overwrite: retractions and new rows in one commit
            t.truncate("scratch")
            t.insert("scratch", [{"account": "carol", "balance": 7}])

    # (the scenario happened: the txns shard was compacted past the idle handle's cached state)
    e = idle.entry("scratch", idle.latest())
    assert idle.handle.data_writer(e.data_id).shard.state().upper < idle.handle.cache.since

    assert _rows(idle, "scratch") == [("carol", 7)]
    with txns.connect(db_url, create=False) as fresh:
        for ts in fresh.history("scratch").column("ts").to_pylist():
            assert _rows(idle, "scratch", ts) == _rows(fresh, "scratch", ts), ts
    idle.close()
