"""A handle left idle while others commit reads the table at one time (issue #25, item 1).

The bug: a ``Database`` kept open in a parent process while worker processes
committed, compacted and tidied read 142 of 1,318 rows, all recent: a state
the table never had. Its txns cache's lease lapsed while it was idle, so the
cache restarted from a snapshot at the txns shard's current since, which
names only the writes still in the log; the read planner completed the
handle's old cached state of the data shard with those, checked against
the write times the cache knew, which no longer included the writes
applied and tidied in between. The same held for the catalog (a table
created meanwhile was missing).

Here the idle time is a clock moved past the reader lease (no sleeping),
and the other process a second ``Database`` with a client of its own. On
the code before the fix this test read the catalog as ``["events"]`` and
the table as ``["e4"]``, on every backend.
"""

from __future__ import annotations

import time

import pyarrow as pa

import txns
from persist import PersistConfig

EVENTS = pa.schema([("id", pa.string())])


def test_an_idle_handle_whose_lease_lapsed_reads_every_commit(location_url: str) -> None:
    skew = [0]

    def config() -> PersistConfig:
        return PersistConfig(reader_lease_s=2.0, clock_ms=lambda: int(time.time() * 1000) + skew[0])

    idle = txns.connect(location_url, config=config())
    idle.create_table("events", EVENTS)
    busy = txns.connect(location_url, config=config())

    def insert(i: int) -> None:
        with busy.transaction() as t:
            t.insert("events", [{"id": f"e{i}"}])

    busy.create_table("other", EVENTS)
    for i in range(5):
        insert(i)
        busy._settle()  # (each commit tidies the one before: the log keeps only the last)
    skew[0] += 10_000  # the idle handle's lease (2 s) lapses
    busy.latest()  # the busy handle's hold moves up to its last commit; its write drops the lapsed lease

    assert idle.tables() == ["events", "other"]
    assert sorted(idle.table("events").to_arrow().column("id").to_pylist()) == [f"e{i}" for i in range(5)]
    idle.close()
    busy.close()
