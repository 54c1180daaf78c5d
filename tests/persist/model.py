"""A reference model of one persist shard, and helpers shared by the shard tests.

The model is deliberately naive: it keeps every update ever appended (with
its time as the shard will report it, i.e. after any ``rewrite_ts``), the
shard's upper and its since, and answers reads by brute force. The real
shard must agree with it at every valid ``as_of``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa

from persist import Listen, PersistClient, Progress, ReadHandle, Schema, ShardId, Updates

Update = tuple[tuple[tuple, tuple], int, int]

SCHEMA = Schema(key=pa.schema([("k", pa.int64())]), val=pa.schema([("v", pa.string())]))
"""The schema most shard tests use: an int key and a string val."""


def upd(k: int, v: str, ts: int, diff: int = 1) -> Update:
    """One update of :data:`SCHEMA`."""
    return (((k,), (v,)), ts, diff)


def consolidate(updates: Iterable[Update], as_of: int | None = None) -> list[Update]:
    """Updates with times advanced to ``as_of`` (if given; dropping later ones), diffs summed, zeros dropped, sorted."""
    sums: Counter[tuple[tuple[tuple, tuple], int]] = Counter()
    for kv, ts, diff in updates:
        if as_of is not None:
            if ts > as_of:
                continue
            ts = as_of
        sums[(kv, ts)] += diff
    return sorted((kv, ts, d) for (kv, ts), d in sums.items() if d != 0)


@dataclass
class ShardModel:
    """Everything a shard should answer, computed the slow and obvious way."""

    upper: int = 0
    since: int = 0
    updates: list[Update] = field(default_factory=list)

    def append(self, updates: Iterable[Update], expected_upper: int, new_upper: int) -> None:
        assert expected_upper == self.upper, "the model only takes appends at its upper"
        assert new_upper > expected_upper
        for u in updates:
            assert expected_upper <= u[1] < new_upper, f"model append out of bounds: {u}"
            self.updates.append(u)
        self.upper = new_upper

    def hold(self, holds: Iterable[int]) -> None:
        """Recompute the since from the holds, as the shard does on every write."""
        hs = list(holds)
        if hs:
            self.since = max(self.since, min(hs))

    def snapshot(self, as_of: int) -> list[Update]:
        assert self.since <= as_of < self.upper, f"as_of {as_of} not readable in [{self.since}, {self.upper})"
        return consolidate(self.updates, as_of)

    def changes_after(self, as_of: int) -> list[Update]:
        """Updates with times in ``(as_of, upper)``, consolidated per time."""
        return consolidate(u for u in self.updates if u[1] > as_of)


def drain_listen(listen: Listen, upper: int) -> tuple[list[Update], list[int]]:
    """Every event of ``listen`` until its frontier reaches ``upper``.

    Returns the updates (in emitted order) and the progress uppers. Checks the
    listen protocol on the way: updates come in time order, each at a time
    at or past the previous progress and below the next one, and progress
    strictly advances.
    """
    got: list[Update] = []
    progress: list[int] = []
    frontier = listen.frontier
    pending: list[Update] = []
    while listen.frontier < upper:
        events = listen.next(timeout_s=0.0)
        assert events, f"listen made no progress at frontier {listen.frontier} < upper {upper}"
        for ev in events:
            if isinstance(ev, Updates):
                pending.extend(ev.updates)
            else:
                assert isinstance(ev, Progress), ev
                assert ev.upper > frontier, f"progress went from {frontier} to {ev.upper}"
                times = [u[1] for u in pending]
                assert times == sorted(times), f"updates not in time order: {times}"
                assert all(frontier <= t < ev.upper for t in times), (frontier, ev.upper, times)
                got.extend(pending)
                pending = []
                frontier = ev.upper
                progress.append(ev.upper)
    assert not pending, f"updates {pending} were emitted without a following progress"
    assert listen.frontier == upper
    return got, progress


def shard_blob_keys(client: PersistClient, shard: ShardId) -> set[str]:
    """Every blob key under the shard's prefix."""
    return set(client.blob.list_keys(f"{shard}/"))


def read_all(reader: ReadHandle, lo: int, hi: int) -> dict[int, list[Update]]:
    """Snapshots at every ``as_of`` in ``[lo, hi)``."""
    return {t: reader.snapshot_and_fetch(t) for t in range(lo, hi)}


class FakeClock:
    """A settable millisecond clock for ``PersistConfig(clock_ms=...)``."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = start_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, seconds: float) -> None:
        self.now_ms += int(seconds * 1000)
