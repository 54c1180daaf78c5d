"""Helpers for the txns tests: a reference model of committed data, stores with counters or faults.

The model is deliberately dumb: every successful commit appends its updates
at its commit time, and the contents of a data shard at ``as_of`` are the
consolidated sum of every update committed to it at or before ``as_of``.
Registration bookkeeping mirrors ``TxnsHandle.register`` / ``forget``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

import pyarrow as pa

from persist import Determinate, Indeterminate, PersistClient, PersistConfig, Schema, ShardId
from persist.location import Blob, Consensus
from persist.mem import MemBlob, MemConsensus
from persist.unreliable import Counters, CountingBlob, CountingConsensus, Faults, UnreliableBlob, UnreliableConsensus
from persist.url import Location, open_location
from tests.helpers import mem_url
from txns import TXNS_SCHEMA, Entry, TxnsHandle
from txns.commits import commits_shard_id

T = TypeVar("T")

SCHEMA = Schema(key=pa.schema([("k", pa.int64())]), val=pa.schema([("v", pa.string())]))
"""The schema of every data shard in these tests: key (k: int64), val (v: string)."""

Row = tuple[tuple, tuple]  # ((k,), (v,))


def new_id() -> str:
    return str(ShardId.new())


def row(k: int, v: str = "") -> Row:
    return ((k,), (v,))


def consolidated(updates: Iterable, as_of: int | None = None) -> dict[Row, int]:
    """Sum diffs per (key, val), dropping zeros. With ``as_of``, assert every time equals it."""
    out: dict[Row, int] = defaultdict(int)
    for (key, val), ts, diff in updates:
        if as_of is not None:
            assert ts == as_of, f"snapshot at {as_of} returned an update at {ts}"
        out[(key, val)] += diff
    return {r: d for r, d in out.items() if d != 0}


@dataclass
class Registration:
    register_ts: int
    forget_ts: int | None = None


@dataclass
class TxnsModel:
    """What has been committed, as the tests believe it.

    ``upper`` is the txns shard's upper: every successful register, forget or
    commit at ``ts`` (which must be >= upper) moves it to ``ts + 1``.
    """

    upper: int = 0
    regs: dict[str, list[Registration]] = field(default_factory=lambda: defaultdict(list))
    writes: dict[str, list[tuple[int, Row, int]]] = field(default_factory=lambda: defaultdict(list))
    commits: list[int] = field(default_factory=list)

    def registered_now(self, d: str) -> bool:
        regs = self.regs.get(d)
        return bool(regs) and regs[-1].forget_ts is None

    def registered_at(self, d: str, ts: int) -> bool:
        return any(r.register_ts <= ts and (r.forget_ts is None or ts < r.forget_ts) for r in self.regs.get(d, []))

    def current_registration(self, d: str) -> Registration | None:
        return self.regs[d][-1] if self.registered_now(d) else None

    def register(self, ts: int, ds: Iterable[str]) -> None:
        new = [d for d in ds if not self.registered_now(d)]
        if new:
            assert ts >= self.upper
            for d in new:
                self.regs[d].append(Registration(ts))
            self.upper = ts + 1

    def forget(self, ts: int, ds: Iterable[str]) -> None:
        todo = [d for d in ds if self.registered_now(d)]
        if todo:
            assert ts >= self.upper
            for d in todo:
                self.regs[d][-1].forget_ts = ts
            self.upper = ts + 1

    def commit(self, ts: int, updates: dict[str, list[tuple[Row, int]]]) -> None:
        assert ts >= self.upper, (ts, self.upper)
        for d, ups in updates.items():
            assert self.registered_at(d, ts), f"model: {d} not registered at {ts}"
            for r, diff in ups:
                self.writes[d].append((ts, r, diff))
        self.commits.append(ts)
        self.upper = ts + 1

    def contents(self, d: str, as_of: int) -> dict[Row, int]:
        out: dict[Row, int] = defaultdict(int)
        for ts, r, diff in self.writes.get(d, []):
            if ts <= as_of:
                out[r] += diff
        return {r: n for r, n in out.items() if n != 0}

    def write_times(self, d: str) -> list[int]:
        return sorted({ts for ts, _, _ in self.writes.get(d, [])})


class Store:
    """One shared store (in memory, or at ``url``); every client gets its own counting or fault-injecting wrappers.

    All wrappers share ``counters`` (and ``faults`` if given), so counts and
    faults cover every client of the store.
    """

    def __init__(
        self, faults: Faults | None = None, config: PersistConfig | None = None, url: str | None = None
    ) -> None:
        self.blob: Blob
        self.consensus: Consensus
        self._location: Location | None = None
        if url is None:  # the default: in memory
            self.blob, self.consensus = MemBlob(), MemConsensus()
            self.url = mem_url("txns-test")
        else:  # a real backend (file, S3): every client shares its blob and consensus
            self._location = open_location(url)
            self.blob, self.consensus = self._location.blob, self._location.consensus
            self.url = url
        self.faults = faults
        self.counters = faults.counters if faults is not None else Counters()
        self.config = config

    def close(self) -> None:
        """Release a real backend's connections (nothing for the in-memory one)."""
        if self._location is not None:
            self._location.close()

    def client(self, config: PersistConfig | None = None) -> PersistClient:
        blob: Blob
        consensus: Consensus
        if self.faults is not None:
            blob = UnreliableBlob(self.blob, self.faults)
            consensus = UnreliableConsensus(self.consensus, self.faults)
        else:
            blob = CountingBlob(self.blob, self.counters)
            consensus = CountingConsensus(self.consensus, self.counters)
        return PersistClient(Location(self.url, blob, consensus), config or self.config)


def open_handle(store: Store, config: PersistConfig | None = None) -> tuple[PersistClient, TxnsHandle, str]:
    """A new client of ``store`` and a handle of a new txns shard on it: (client, handle, txns id)."""
    client = store.client(config)
    txns_id = new_id()
    return client, TxnsHandle.open(client, txns_id), txns_id


class Recorder:
    """Counts storage calls per shard (by key prefix), for "did this touch shard X" assertions."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def wrap(self, client: PersistClient) -> PersistClient:
        rec = self

        class RecBlob(CountingBlob):
            def get(self, key: str) -> bytes | None:
                rec.calls.append(("blob.get", key))
                return super().get(key)

            def set(self, key: str, value: bytes) -> None:
                rec.calls.append(("blob.set", key))
                super().set(key, value)

        class RecConsensus(CountingConsensus):
            def head(self, key: str, hint: int | None = None):  # type: ignore[no-untyped-def]
                rec.calls.append(("consensus.head", key))
                return super().head(key, hint)

            def scan(self, key: str, from_seqno: int, limit: int):  # type: ignore[no-untyped-def]
                rec.calls.append(("consensus.scan", key))
                return super().scan(key, from_seqno, limit)

            def compare_and_set(self, key: str, expected: int | None, data: bytes):  # type: ignore[no-untyped-def]
                rec.calls.append(("consensus.cas", key))
                return super().compare_and_set(key, expected, data)

        loc = Location(client.url, RecBlob(client.blob), RecConsensus(client.consensus))
        return PersistClient(loc, client.config)

    def touching(self, shard_id: str, ops: Iterable[str] | None = None) -> list[tuple[str, str]]:
        want = set(ops) if ops is not None else None
        return [(op, k) for op, k in self.calls if k.startswith(shard_id) and (want is None or op in want)]

    def clear(self) -> None:
        self.calls.clear()


def txns_shard_contents(client: PersistClient, txns_id: str, records: bool = False) -> list[tuple[Entry, int]]:
    """The txns shard's consolidated contents at ``upper - 1``, read with a plain persist reader.

    Entries of the system commits shard (registration and commit records) are
    left out unless ``records``.
    """
    upper = client.shard(txns_id).fetch().upper
    if upper == 0:
        return []
    reader = client.open_leased_reader(txns_id, TXNS_SCHEMA)
    try:
        ups = reader.snapshot_and_fetch(upper - 1)
    finally:
        reader.expire()
    commits = commits_shard_id(txns_id)
    entries = [(Entry.from_kv(k, v), diff) for (k, v), _ts, diff in ups]
    return [(e, d) for e, d in entries if records or e.data_id != commits]


def direct_snapshot(client: PersistClient, shard: str, as_of: int) -> list:
    """A data shard's contents at ``as_of``, read with a plain persist reader (no txns involved)."""
    reader = client.open_leased_reader(shard, SCHEMA)
    try:
        return reader.snapshot_and_fetch(as_of)
    finally:
        reader.expire()


def retrying(
    fn: Callable[[], T], faults: Faults | None, attempts: int = 40, between: Callable[[], object] | None = None
) -> T:
    """Call ``fn`` until it does not raise a storage error; the last attempt runs without random faults.

    ``between`` runs after each failure, before the retry (its own storage errors are ignored).
    """
    for _ in range(attempts):
        try:
            return fn()
        except (Determinate, Indeterminate):
            if faults is None:
                raise
        if between is not None:
            try:
                between()
            except (Determinate, Indeterminate):
                pass
    assert faults is not None
    with faults.disabled():
        return fn()
