"""persist's public read surface: ShardView, the manifest functions, PartRetired and replan, check(prev).

These are what the layers above use instead of persist's internals (docs/index.md,
"Layers"); each test pins the contract they rely on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pyarrow as pa
import pytest

from persist import (
    CorruptObject,
    PartRetired,
    PersistClient,
    PersistConfig,
    ReadBelowSince,
    ReadTimeout,
    Schema,
    ShardId,
    replan,
)
from persist.location import Blob
from persist.manifest import fetch_part, read_run
from persist.unreliable import CountingBlob
from tests.helpers import mem_url

SCHEMA = Schema(key=pa.schema([("k", pa.int64())]), val=pa.schema([("v", pa.string())]))


def _shard_with_parts(rows: int = 3) -> tuple[PersistClient, str]:
    """A shard whose every batch is a Parquet part (nothing inline), with times 0..rows-1."""
    client = PersistClient.open(mem_url("api"), PersistConfig(inline_max_bytes=0, compaction_enabled=False))
    sid = str(ShardId.new())
    w = client.open_writer(sid, SCHEMA)
    for i in range(rows):
        w.compare_and_append([(((i,), (f"v{i}",)), i, 1)], i, i + 1)
    return client, sid


def test_a_view_plans_and_reads_what_a_reader_would() -> None:
    client, sid = _shard_with_parts()
    view = client.shard(sid)
    assert (view.state().since, view.state().upper) == (0, 3)
    plan = view.plan(SCHEMA, as_of=1)
    assert plan.as_of == 1 and all(r.parts for r in plan.runs)
    assert view.fetch_plan(plan) == [(((0,), ("v0",)), 1, 1), (((1,), ("v1",)), 1, 1)]
    reader = client.open_leased_reader(sid, SCHEMA)
    assert replan(lambda: view.fetch_plan(view.plan(SCHEMA, 2))) == reader.snapshot_and_fetch(2)
    reader.expire()  # (its hold would keep the since at 0)
    with pytest.raises(ReadTimeout):
        view.plan(SCHEMA, as_of=3)  # the upper is not past it, even fresh
    client.open_critical_since(sid, "c", 0).compare_and_downgrade_since(0, 0, 2)
    client.open_writer(sid, SCHEMA).compare_and_append([], 3, 4)  # (a write recomputes the since)
    with pytest.raises(ReadBelowSince):
        view.plan(SCHEMA, as_of=1, state=view.fetch())


def test_a_missing_part_is_corrupt_while_referenced_and_retired_otherwise() -> None:
    client, sid = _shard_with_parts()
    view = client.shard(sid)
    ref = view.state().batches[0].runs[0].parts[0]
    assert isinstance(view.missing_part("never-a-part"), PartRetired)
    client.blob.delete(ref.key)  # lost: the state still references it
    err = view.missing_part(ref.key)
    assert isinstance(err, CorruptObject) and ref.key in str(err)
    with pytest.raises(PartRetired) as e:  # the manifest level cannot look at the state: it says "plan again"
        fetch_part(client.blob, ref)
    assert e.value.key == ref.key
    with pytest.raises(PartRetired):
        list(read_run(client.blob, view.state().batches[0].runs[0], SCHEMA.arrow))
    with pytest.raises(CorruptObject):  # a view's read classifies it: referenced, so lost
        view.fetch_plan(view.plan(SCHEMA, as_of=2))


def test_a_part_that_does_not_match_its_descriptor_is_corrupt() -> None:
    client, sid = _shard_with_parts(1)
    ref = client.shard(sid).state().batches[0].runs[0].parts[0]
    data = client.blob.get(ref.key)
    assert data is not None and fetch_part(client.blob, ref) == data
    client.blob.set(ref.key, data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(CorruptObject, match="CRC-32C"):
        fetch_part(client.blob, ref)


def test_replan_retries_only_a_retired_part_and_gives_up_after_its_attempts() -> None:
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise PartRetired("retired", "k")
        return "read"

    assert replan(flaky) == "read" and len(calls) == 3
    calls.clear()

    def always() -> str:
        calls.append(1)
        raise PartRetired("retired", "k")

    with pytest.raises(PartRetired):
        replan(always, attempts=4)
    assert len(calls) == 4
    calls.clear()

    def corrupt() -> str:
        calls.append(1)
        raise CorruptObject("k", "bad")

    with pytest.raises(CorruptObject):
        replan(corrupt)
    assert len(calls) == 1, "only PartRetired is retried"


def test_part_retired_is_retryable_not_bad_usage() -> None:
    from persist import InvalidUsage, PersistError

    assert issubclass(PartRetired, PersistError) and not issubclass(PartRetired, InvalidUsage)


def test_check_asserts_the_invariants_about_change() -> None:
    client, sid = _shard_with_parts()
    state = client.shard(sid).fetch()
    state.check()
    state.check(state)
    with pytest.raises(AssertionError, match="upper went back"):
        replace(state, upper=2, batches=state.batches[:2]).check(state)
    later = replace(state, since=2)
    with pytest.raises(AssertionError, match="since went back"):
        state.check(later)
    with pytest.raises(AssertionError, match="still referenced"):
        replace(state, garbage=[(state.batches[0].runs[0].parts[0].key, 0)]).check()
    with pytest.raises(AssertionError, match="not contiguous"):
        replace(state, batches=[state.batches[0], state.batches[2]]).check()


def test_compact_all_reports_a_lost_part_as_corrupt_not_as_an_internal_error() -> None:
    client, sid = _shard_with_parts()
    w = client.open_writer(sid, SCHEMA)
    ref = w.shard.state().batches[1].runs[0].parts[0]
    client.blob.delete(ref.key)
    before = w.shard.fetch()
    with pytest.raises(CorruptObject):
        w.compact_all()
    after = w.shard.fetch()
    assert (after.seqno, after.batches) == (before.seqno, before.batches), "nothing applied"


class _RaceOnFirstPart(CountingBlob):
    """Runs ``race()`` (once armed) just before the first part is written: between a merge's read and its write."""

    def __init__(self, inner: Blob) -> None:
        super().__init__(inner)
        self.race: Callable[[], None] | None = None

    def set(self, key: str, value: bytes) -> None:
        race, self.race = self.race, None
        if race is not None and "/parts/" in key:
            race()
        else:
            self.race = race
        super().set(key, value)


def test_compact_all_merges_again_when_another_compaction_wins_its_write() -> None:
    """An append's maintenance that merges some batches first must not leave compact_all's shard unmerged."""
    client, sid = _shard_with_parts(rows=4)
    blob = _RaceOnFirstPart(client.blob)
    racing = PersistClient(replace(client.location, blob=blob), client.config)
    other = client.open_writer(sid, SCHEMA)  # (through the plain blob: the race runs once)

    def race() -> None:
        other.compact_all()  # replaces every batch compact_all read ...
        other.compare_and_append([(((9,), ("v9",)), 4, 1)], 4, 5)  # ... and one more arrives

    blob.race = race
    report = racing.open_writer(sid, SCHEMA).compact_all()
    assert blob.race is None, "the race ran"
    state = client.open_writer(sid, SCHEMA).shard.fetch()
    assert report["merged_all"] and len(state.batches) == 1
    assert state.batches[0].rows == 5  # (distinct keys: nothing consolidates away)
