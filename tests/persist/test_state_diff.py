"""State versions written as diffs (persist._internal.state_diff): exact round trips, chains, costs.

The bar: applying a written diff to the version before it gives exactly the
state the writer had (checked on random transitions against the whole
state); a reader from nothing, a reader a few versions behind and a reader
across truncation all see what the writer wrote; a version with a new
truncation mark, the first version and every ``state_rollup_every``-th are
whole; a one-row append uploads far fewer bytes than the state.
"""

from __future__ import annotations

import itertools
import json
import random
import struct
import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from persist import PersistClient, PersistConfig, ShardId, UpperMismatch
from persist._internal.codec import DIFF_VERSION, KIND_STATE, ZSTD_VERSION, unframe
from persist._internal.parts import PartRef, Run
from persist._internal.state import (
    Chain,
    CriticalReaderState,
    HollowBatch,
    LeasedReaderState,
    ShardState,
    WriterState,
)
from persist._internal.state_diff import encode_diff, encode_version, read_version
from persist.location import Consensus, VersionedData
from persist.unreliable import CountingConsensus, Faults, Op
from persist.url import Location, open_location
from tests.helpers import faulty_client, mem_url
from tests.persist.model import SCHEMA, upd

# ---- random states and transitions --------------------------------------------

_ids = st.text("0123456789abcdef", min_size=4, max_size=8)


@st.composite
def _runs(draw: st.DrawFn) -> tuple[Run, ...]:
    out = []
    for _ in range(draw(st.integers(0, 2))):
        parts = tuple(
            PartRef(
                f"p/{draw(_ids)}", draw(st.integers(1, 9)), draw(st.integers(1, 999)), draw(st.integers(0, 2**32 - 1))
            )
            for _ in range(draw(st.integers(0, 2)))
        )
        inline = draw(st.none() | st.binary(min_size=0, max_size=40))
        out.append(Run(parts, inline, draw(st.integers(0, 50)), draw(st.none() | st.integers(0, 100))))
    return tuple(out)


@st.composite
def _states(draw: st.DrawFn) -> ShardState:
    n = draw(st.integers(0, 6))
    bounds = sorted(draw(st.sets(st.integers(0, 1000), min_size=n + 1, max_size=n + 1)))
    batches = [HollowBatch(draw(_ids), lo, hi, 0, draw(_runs())) for lo, hi in itertools.pairwise(bounds)]
    return ShardState(
        shard_id="s1",
        schema=draw(st.none() | st.just("schema-text")),
        since=draw(st.integers(0, 10)),
        upper=bounds[-1] if n else draw(st.integers(0, 10)),
        batches=batches,
        writers={draw(_ids): WriterState(1, 2, draw(_ids)) for _ in range(draw(st.integers(0, 3)))},
        leased={draw(_ids): LeasedReaderState(draw(st.integers(0, 9)), 3, 4) for _ in range(draw(st.integers(0, 3)))},
        critical={draw(_ids): CriticalReaderState(draw(st.integers(0, 9)), 7) for _ in range(draw(st.integers(0, 2)))},
        walltime_ms=draw(st.integers(0, 10**6)),
        marks=sorted({(i, i * 10) for i in draw(st.lists(st.integers(1, 50), max_size=3))}),
        garbage=[(f"g/{draw(_ids)}", draw(st.integers(0, 99))) for _ in range(draw(st.integers(0, 4)))],
        seqno=5,
    )


@st.composite
def _changed(draw: st.DrawFn, prev: ShardState) -> ShardState:
    """``prev`` after a few of the changes transitions make (appends, compactions, leases, GC...)."""
    new = prev.clone()
    for _ in range(draw(st.integers(0, 4))):
        what = draw(st.sampled_from(["append", "extend", "compact", "drop", "writer", "leased", "critical", "misc"]))
        if what == "append":
            hi = new.upper + draw(st.integers(1, 9))
            new.batches.append(HollowBatch(draw(_ids), new.upper, hi, 0, draw(_runs())))
            new.upper = hi
        elif what == "extend" and new.batches:
            last = new.batches[-1]
            new.upper += 3
            new.batches[-1] = HollowBatch(last.id, last.lower, new.upper, last.since, last.runs)
        elif what == "compact" and new.batches:
            i = draw(st.integers(0, len(new.batches) - 1))
            j = draw(st.integers(i, len(new.batches) - 1))
            merged = HollowBatch(draw(_ids), new.batches[i].lower, new.batches[j].upper, new.since, draw(_runs()))
            new.batches[i : j + 1] = [merged]
        elif what == "drop" and new.batches:
            new.batches = new.batches[draw(st.integers(1, len(new.batches))) :]
        elif what == "writer":
            if new.writers and draw(st.booleans()):
                new.writers.pop(draw(st.sampled_from(sorted(new.writers))))
            else:
                new.writers[draw(_ids)] = WriterState(draw(st.integers(0, 9)), 2, draw(_ids))
        elif what == "leased":
            new.leased[draw(_ids)] = LeasedReaderState(draw(st.integers(0, 9)), 3, 4)
            if draw(st.booleans()) and new.leased:
                new.leased.pop(draw(st.sampled_from(sorted(new.leased))))
        elif what == "critical":
            new.critical[draw(_ids)] = CriticalReaderState(draw(st.integers(0, 9)), draw(st.integers(0, 9)))
        else:
            new.since += draw(st.integers(0, 3))
            new.walltime_ms += 1
            new.schema = draw(st.sampled_from([new.schema, "other-schema"]))
            new.marks = [*new.marks, (99, 10**6)] if draw(st.booleans()) else new.marks[1:]
            new.garbage = [*new.garbage[draw(st.integers(0, len(new.garbage))) :], (f"g/{draw(_ids)}", 5)]
    return new


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_diff_applied_to_the_previous_version_gives_exactly_the_new_one(data: st.DataObject) -> None:
    prev = data.draw(_states())
    new = data.draw(_changed(prev))
    new.seqno = prev.seqno = 5
    prev.chain = Chain(3, 2, 100, 10**6)
    # through the bytes, as a reader gets them
    framed = encode_diff(prev, new, 3)
    decoded_prev = ShardState.decode("k", prev.encode(), 5)
    decoded_prev.chain = prev.chain
    got, base = read_version("k", framed, 6, decoded_prev)
    assert got is not None and base == 3
    new.seqno = 6
    assert got == new
    assert got.to_json() == new.to_json()
    assert got.chain == Chain(3, 3, 100 + len(framed), 10**6)
    # and on the writer's own objects
    again, _ = read_version("k", framed, 6, prev)
    assert again == new


def _version(data: bytes) -> int:
    return int(struct.unpack(">H", data[5:7])[0])


def test_the_first_version_marks_and_every_nth_are_rollups() -> None:
    prev = ShardState(shard_id="s1", seqno=1, chain=Chain(1, 0, 0, 10**6))
    new = prev.clone()
    new.upper = 5
    data, chain = encode_version(prev, new, 2, rollup_every=4)
    assert _version(data) == DIFF_VERSION and chain == Chain(1, 1, len(data), 10**6)
    # a chain that would reach rollup_every versions: whole
    prev.chain = Chain(1, 3, 10, 10**6)
    data, chain = encode_version(prev, new, 2, rollup_every=4)
    assert _version(data) == ZSTD_VERSION and chain == Chain(2, 0, 0, len(data))
    # diffs outweighing two rollups: whole
    prev.chain = Chain(1, 1, 2 * 200, 200)
    assert _version(encode_version(prev, new, 2, rollup_every=16)[0]) == ZSTD_VERSION
    # a new truncation mark at this seqno: whole (truncation below it keeps every chain)
    prev.chain = Chain(1, 0, 0, 10**6)
    new.marks = [(2, 123)]
    assert _version(encode_version(prev, new, 2, rollup_every=16)[0]) == ZSTD_VERSION
    # unknown chain, or not the previous version: whole; rollup_every=1: never a diff
    new.marks = []
    for p, every in ((ShardState(shard_id="s1", seqno=1), 16), (prev, 1)):
        assert _version(encode_version(p, new, 2, rollup_every=every)[0]) == ZSTD_VERSION
    assert _version(encode_version(prev, new, 3, rollup_every=16)[0]) == ZSTD_VERSION


def test_a_diff_needs_its_previous_version() -> None:
    prev = ShardState(shard_id="s1", seqno=1, chain=Chain(1, 0, 0, 10**6))
    new = prev.clone()
    new.upper = 7
    data = encode_diff(prev, new, 1)
    assert read_version("k", data, 2, None) == (None, 1)
    assert read_version("k", data, 3, prev) == (None, 1)  # prev is seqno 1, the diff follows seqno 2
    assert read_version("k", data, 2, prev) == (ShardState(shard_id="s1", upper=7, seqno=2), 1)


# ---- through a real store ------------------------------------------------------------


def test_readers_from_nothing_and_from_behind_see_what_the_writer_wrote() -> None:
    url = mem_url("diffs")
    config = PersistConfig(inline_max_bytes=4096, compaction_enabled=False, state_rollup_every=8)
    writer = PersistClient.open(url, config)
    shard = ShardId.new()
    w = writer.open_writer(shard, SCHEMA)
    faults = Faults(seed=0)  # (no rates set: it only counts)
    behind = faulty_client(url, faults, config)
    follower = behind.open_leased_reader(shard, SCHEMA)
    kinds = []
    for i in range(40):
        w.compare_and_append([upd(i, f"v{i}", i)], i, i + 1)
        head = writer.consensus.head(str(shard))
        assert head is not None
        kinds.append(_version(head.data))
        # a fresh client (nothing cached) reads the same state as the writer holds
        assert PersistClient.open(url, config)._machine(shard).fetch() == writer._machine(shard).state()
        if i % 3 == 0:
            # a handle a few versions behind catches up by one scan, with no head read
            heads, scans = faults.counters.calls(Op.HEAD), faults.counters.calls(Op.SCAN)
            assert behind._machine(shard).fetch() == writer._machine(shard).state()
            assert (faults.counters.calls(Op.HEAD), faults.counters.calls(Op.SCAN)) == (heads, scans + 1)
    assert DIFF_VERSION in kinds and ZSTD_VERSION in kinds
    # never more than 7 diffs in a row (rollup every 8)
    run = 0
    for k in kinds:
        run = run + 1 if k == DIFF_VERSION else 0
        assert run < 8
    assert follower.snapshot_and_fetch(39) == [upd(i, f"v{i}", 39) for i in range(40)]


class _VersionsRead(CountingConsensus):
    """Records the seqno of every version a scan or a head returned."""

    def __init__(self, inner: Consensus) -> None:
        super().__init__(inner)
        self.seqnos: list[int] = []

    def head(self, key: str, hint: int | None = None) -> VersionedData | None:
        v = super().head(key, hint)
        self.seqnos += [v.seqno] if v is not None else []
        return v

    def scan(self, key: str, from_seqno: int, limit: int) -> list[VersionedData]:
        vs = super().scan(key, from_seqno, limit)
        self.seqnos += [v.seqno for v in vs]
        return vs


def test_a_handle_far_behind_reads_no_version_twice() -> None:
    """Past ``_CATCH_UP_VERSIONS`` (16) behind, a read goes by the head's chain, and reuses the versions
    its catch-up scan already read (it read those again: up to twice the GETs on S3)."""
    url = mem_url("far-behind")
    config = PersistConfig(inline_max_bytes=4096, compaction_enabled=False)
    writer = PersistClient.open(url, config)
    shard = ShardId.new()
    w = writer.open_writer(shard, SCHEMA)
    upper = 0
    for behind in range(17, 41):
        loc = open_location(url)
        consensus = _VersionsRead(loc.consensus)
        m = PersistClient(Location(url, loc.blob, consensus), config)._machine(shard)
        m.fetch()
        for _ in range(behind):
            w.compare_and_append([upd(upper, "x", upper)], upper, upper + 1)
            upper += 1
        consensus.seqnos.clear()
        assert m.fetch() == writer._machine(shard).state()
        read = consensus.seqnos
        assert len(read) == len(set(read)), f"{behind} behind: versions read twice: {sorted(read)}"
        assert len(read) <= behind


def test_truncation_keeps_every_chain_readable() -> None:
    url = mem_url("diffs-truncate")
    now = [1_000_000]
    config = PersistConfig(
        inline_max_bytes=4096,
        compaction_enabled=False,
        consensus_retention_s=0.004,  # a mark every 1 ms of the fake clock, truncation of anything older than 4 ms
        gc_every_versions=3,
        state_rollup_every=50,
        clock_ms=lambda: now[0],
    )
    writer = PersistClient.open(url, config)
    shard = ShardId.new()
    w = writer.open_writer(shard, SCHEMA)
    for i in range(60):
        now[0] += 1 if i % 4 == 0 else 0
        w.compare_and_append([upd(i, "x", i)], i, i + 1)
        versions = writer.consensus.scan(str(shard), 0, 1000)
        first = versions[0]
        # truncation only ever cuts at a whole version
        assert _version(first.data) != DIFF_VERSION, f"the oldest kept version {first.seqno} is a diff"
        fresh = PersistClient.open(url, config).open_leased_reader(shard, SCHEMA)
        assert fresh.snapshot_and_fetch(i) == [upd(j, "x", i) for j in range(i + 1)]
        fresh.expire()
    assert writer.consensus.scan(str(shard), 0, 1000)[0].seqno > 10  # (it did truncate)


def test_a_small_append_uploads_its_change_not_the_state() -> None:
    url = mem_url("diffs-bytes")
    config = PersistConfig(inline_max_bytes=4096, compaction_enabled=False)
    client = PersistClient.open(url, config)
    shard = ShardId.new()
    w = client.open_writer(shard, SCHEMA)
    for i in range(30):  # a state of 30 inline batches
        w.compare_and_append([upd(i, random.randbytes(25).hex(), i)], i, i + 1)
    head = client.consensus.head(str(shard))
    assert head is not None and _version(head.data) == DIFF_VERSION
    whole = client._machine(shard).state().encode()
    assert len(head.data) * 4 < len(whole), (len(head.data), len(whole))
    body = json.loads(unframe("k", head.data, KIND_STATE))
    assert set(body) <= {"base", "since", "upper", "walltime_ms", "batches", "writers"}
    assert len(body["batches"][2]) == 1  # the one new batch


def test_racing_writers_with_truncation_lose_nothing() -> None:
    """Writers in their own clients race on one shard: every lost race catches up through diffs (or the
    head's chain when far behind), chains are cut by truncation all along, and nothing is lost or doubled."""
    url = mem_url("diffs-race")
    config = PersistConfig(
        inline_max_bytes=4096,
        compaction_enabled=False,
        consensus_retention_s=0.0,  # every mark is old at once: truncation as often as GC runs
        gc_every_versions=2,
        state_rollup_every=3,
    )
    shard = ShardId.new()
    PersistClient.open(url, config).open_writer(shard, SCHEMA)
    per_writer, writers = 25, 4
    errors: list[BaseException] = []
    start = threading.Barrier(writers)

    def write(w: int) -> None:
        try:
            handle = PersistClient.open(url, config).open_writer(shard, SCHEMA)
            start.wait(timeout=10)
            for i in range(per_writer):
                k = w * 1000 + i
                while True:
                    upper = handle.upper
                    try:
                        handle.compare_and_append([upd(k, f"w{w}", upper)], upper, upper + 1)
                        break
                    except UpperMismatch:  # (12-24 lost races per run, when measured)
                        continue
        except BaseException as e:  # noqa: BLE001 - re-raised by the test below
            errors.append(e)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    reader = PersistClient.open(url, config).open_leased_reader(shard, SCHEMA)
    upper = reader.fetch_recent_upper()
    assert upper == writers * per_writer
    got = reader.snapshot_and_fetch(upper - 1)
    assert sorted(u[0][0][0] for u in got) == sorted(w * 1000 + i for w in range(writers) for i in range(per_writer))
    assert all(u[2] == 1 for u in got)
    assert PersistClient.open(url, config).consensus.scan(str(shard), 0, 10_000)[0].seqno > 1  # (it did truncate)
