"""persist.metrics counts what maintenance did, and only that (persist/metrics.py).

On a fresh in-memory store with an injected clock: a leased reader that
stops heartbeating is counted once, when a committed write drops it; a
compare-and-set that lost its race counts nothing; retired parts count when
deleted; truncated versions as ``truncate`` reported them.
"""

from __future__ import annotations

import pytest

from persist import PersistClient, PersistConfig, ShardId, metrics
from tests.helpers import mem_url
from tests.persist.model import SCHEMA, upd


def _delta(before: dict[str, int]) -> dict[str, int]:
    now = metrics.snapshot()
    return {k: now[k] - before[k] for k in now if now[k] != before[k]}


def test_a_lapsed_reader_lease_is_counted_once_when_a_write_drops_it() -> None:
    now = [1_000_000]
    client = PersistClient.open(mem_url("metrics"), PersistConfig(reader_lease_s=10.0, clock_ms=lambda: now[0]))
    shard = ShardId.new()
    w = client.open_writer(shard, SCHEMA)
    client.open_leased_reader(shard, SCHEMA)  # never heartbeats again
    w.compare_and_append([upd(1, "a", 0)], 0, 1)
    before = metrics.snapshot()
    now[0] += 9_000
    w.compare_and_append([upd(2, "a", 1)], 1, 2)
    assert _delta(before) == {}, "a lease inside its time is not lapsed"
    now[0] += 2_000
    w.compare_and_append([upd(3, "a", 2)], 2, 3)
    w.compare_and_append([upd(4, "a", 3)], 3, 4)
    assert _delta(before) == {metrics.READER_LEASES_LAPSED: 1}


def test_deleted_parts_and_truncated_versions_are_counted() -> None:
    config = PersistConfig(inline_max_bytes=0, part_grace_s=0, consensus_retention_s=0, gc_every_versions=1_000)
    client = PersistClient.open(mem_url("metrics"), config)
    shard = ShardId.new()
    w = client.open_writer(shard, SCHEMA)
    w.auto_maintain = False
    for i in range(6):
        w.compare_and_append([upd(i, "a", i)], i, i + 1)
    before = metrics.snapshot()
    assert w.compact() > 0
    deleted = w.collect_garbage()
    truncated = w.shard.truncate_old_versions()
    assert deleted > 0 and truncated > 0
    assert _delta(before) == {metrics.PARTS_DELETED: deleted, metrics.VERSIONS_TRUNCATED: truncated}


def test_an_unknown_counter_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown persist metric"):
        metrics.count("parts_deletd")
