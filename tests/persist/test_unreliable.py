"""The wrappers of :mod:`persist.unreliable`: injected faults, counters, and the capabilities they forward.

Tests taking ``location`` run once per backend (mem, file, s3); that the
wrappers keep the storage contract is checked by tests/persist/test_conformance.py.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from persist.errors import Determinate, Indeterminate, InvalidUsage
from persist.location import CaSResult
from persist.mem import MemBlob, MemConsensus
from persist.testing import write_versions
from persist.unreliable import (
    Counters,
    CountingBlob,
    CountingConsensus,
    Fault,
    Faults,
    Op,
    UnreliableBlob,
    UnreliableConsensus,
)
from persist.url import Location

COMMITTED, MISMATCH = CaSResult.COMMITTED, CaSResult.MISMATCH


@pytest.fixture
def faults() -> Faults:
    return Faults(seed=42)


def unreliable(location: Location, faults: Faults) -> tuple[UnreliableBlob, UnreliableConsensus]:
    return UnreliableBlob(location.blob, faults), UnreliableConsensus(location.consensus, faults)


@pytest.mark.parametrize("fault", [Fault.DETERMINATE, Fault.INDETERMINATE])
def test_fail_before_writes_nothing(location: Location, faults: Faults, fault: Fault) -> None:
    blob, consensus = unreliable(location, faults)
    expected_error = Determinate if fault is Fault.DETERMINATE else Indeterminate
    faults.fail_next(Op.BLOB_SET, fault)
    with pytest.raises(expected_error, match=r"before blob\.set"):
        blob.set("k", b"v")
    assert location.blob.get("k") is None
    faults.fail_next(Op.CAS, fault)
    with pytest.raises(expected_error):
        consensus.compare_and_set("c", None, b"v1")
    assert location.consensus.head("c") is None
    # Nothing pending any more: the retries go through.
    blob.set("k", b"v")
    assert consensus.compare_and_set("c", None, b"v1") is COMMITTED
    location.blob.set("d", b"x")
    faults.fail_next(Op.BLOB_DELETE, fault)
    with pytest.raises(expected_error):
        blob.delete("d")
    assert location.blob.get("d") == b"x"
    write_versions(location.consensus, "t", 3)
    faults.fail_next(Op.TRUNCATE, fault)
    with pytest.raises(expected_error):
        consensus.truncate("t", 3)
    assert len(location.consensus.scan("t", 1, 10)) == 3


def test_fail_after_writes_then_raises_indeterminate(location: Location, faults: Faults) -> None:
    blob, consensus = unreliable(location, faults)
    faults.fail_next(Op.BLOB_SET, Fault.AFTER)
    with pytest.raises(Indeterminate, match="it was done"):
        blob.set("k", b"v")
    assert location.blob.get("k") == b"v"
    faults.fail_next(Op.CAS, Fault.AFTER)
    with pytest.raises(Indeterminate):
        consensus.compare_and_set("c", None, b"v1")
    head = location.consensus.head("c")
    assert head is not None and (head.seqno, head.data) == (1, b"v1")
    # A blind retry now loses: why the layer above checks its idempotency token.
    assert consensus.compare_and_set("c", None, b"v1") is MISMATCH
    faults.fail_next(Op.BLOB_DELETE, Fault.AFTER)
    with pytest.raises(Indeterminate):
        blob.delete("k")
    assert location.blob.get("k") is None
    write_versions(location.consensus, "t", 3)
    faults.fail_next(Op.TRUNCATE, Fault.AFTER)
    with pytest.raises(Indeterminate):
        consensus.truncate("t", 3)
    assert [v.seqno for v in location.consensus.scan("t", 1, 10)] == [3]


def test_read_faults(faults: Faults) -> None:
    blob, consensus = UnreliableBlob(MemBlob(), faults), UnreliableConsensus(MemConsensus(), faults)
    calls: list[tuple[Op, Callable[[], object]]] = [
        (Op.BLOB_GET, lambda: blob.get("k")),
        (Op.BLOB_LIST_KEYS, lambda: blob.list_keys("")),
        (Op.HEAD, lambda: consensus.head("k")),
        (Op.SCAN, lambda: consensus.scan("k", 1, 1)),
        (Op.CONSENSUS_LIST_KEYS, lambda: consensus.list_keys()),
    ]
    for op, call in calls:
        faults.fail_next(op)
        with pytest.raises(Determinate):
            call()
        call()
        for fault in (Fault.INDETERMINATE, Fault.AFTER):
            with pytest.raises(InvalidUsage, match="writes only"):
                faults.fail_next(op, fault)


def test_forced_faults_queue_and_count(faults: Faults) -> None:
    blob = UnreliableBlob(MemBlob(), faults)
    faults.fail_next("blob.set", Fault.DETERMINATE, n=2)
    faults.fail_next(Op.BLOB_SET, Fault.AFTER)
    assert faults.pending(Op.BLOB_SET) == 3
    for expected in (Determinate, Determinate, Indeterminate):
        with pytest.raises(expected):
            blob.set("k", b"12345")
    blob.set("k", b"12345")
    assert faults.pending(Op.BLOB_SET) == 0
    stats = faults.counters[Op.BLOB_SET]
    assert (stats.calls, stats.injected, stats.bytes_written) == (4, 3, 10)


def test_random_faults_are_seeded_and_switchable() -> None:
    def pattern(seed: int) -> list[str]:
        faults = Faults(seed=seed, determinate=0.2, indeterminate=0.1, after=0.1)
        consensus = UnreliableConsensus(MemConsensus(), faults)
        out = []
        for _ in range(300):
            try:
                head = consensus.head("k")
                consensus.compare_and_set("k", head.seqno if head else None, b"x")
                out.append("ok")
            except Indeterminate as e:
                out.append("after" if "it was done" in str(e) else "indeterminate")
            except Determinate:
                out.append("determinate")
        return out

    a, b = pattern(7), pattern(7)
    assert a == b
    assert a != pattern(8)
    assert {"ok", "after", "indeterminate", "determinate"} <= set(a)

    faults = Faults(seed=1, determinate=1.0)
    blob = UnreliableBlob(MemBlob(), faults)
    with pytest.raises(Determinate):
        blob.get("k")
    with faults.disabled():
        assert blob.get("k") is None
        faults.fail_next(Op.BLOB_GET)  # forced faults fire even when disabled
        with pytest.raises(Determinate):
            blob.get("k")
    faults.enabled = False
    assert blob.get("k") is None
    faults.enabled = True
    faults.set_rates(determinate=0.0)
    assert blob.get("k") is None
    faults.set_rates(determinate=1.0, ops=[Op.BLOB_SET])
    assert blob.get("k") is None
    with pytest.raises(Determinate):
        blob.set("k", b"v")
    with pytest.raises(InvalidUsage):
        faults.set_rates(determinate=0.6, after=0.6)


def test_counting_wrappers(location: Location) -> None:
    counters = Counters()
    blob = CountingBlob(location.blob, counters)
    consensus = CountingConsensus(location.consensus, counters)
    blob.set("a", b"abc")
    blob.set("b", b"de")
    assert blob.get("a") == b"abc"
    assert blob.get("missing") is None
    assert sorted(blob.list_keys("")) == ["a", "b"]
    assert consensus.compare_and_set("k", None, b"1234") is COMMITTED
    assert consensus.compare_and_set("k", None, b"1234") is MISMATCH
    assert consensus.head("k") is not None
    assert len(consensus.scan("k", 1, 10)) == 1
    assert counters.calls(Op.BLOB_SET) == 2 and counters[Op.BLOB_SET].bytes_written == 5
    assert counters.calls(Op.BLOB_GET) == 2 and counters[Op.BLOB_GET].bytes_read == 3
    assert counters.calls(Op.BLOB_LIST_KEYS) == 1
    cas = counters[Op.CAS]
    assert (cas.calls, cas.mismatches, cas.bytes_written, cas.injected) == (2, 1, 8, 0)
    assert counters[Op.HEAD].bytes_read == 4 and counters[Op.SCAN].bytes_read == 4
    assert counters.total().calls == 9
    counters.reset()
    assert counters.total().calls == 0


class _PutIfAbsentConsensus(MemConsensus):
    """(Only its declared capabilities matter here.)"""

    checks_expectation = False
    detects_truncated = False
    lists_keys = False


class _NestlessBlob(MemBlob):
    keys_nest = False


def test_wrappers_forward_the_capabilities_of_what_they_wrap(faults: Faults) -> None:
    for inner in (MemConsensus(), _PutIfAbsentConsensus()):
        for wrapped in (CountingConsensus(inner), UnreliableConsensus(inner, faults)):
            flags = (wrapped.checks_expectation, wrapped.detects_truncated, wrapped.lists_keys)
            assert flags == (inner.checks_expectation, inner.detects_truncated, inner.lists_keys)
    assert (MemConsensus().checks_expectation, _PutIfAbsentConsensus().checks_expectation) == (True, False)
    for blob in (MemBlob(), _NestlessBlob()):
        assert CountingBlob(blob).keys_nest is blob.keys_nest
        assert UnreliableBlob(blob, faults).keys_nest is blob.keys_nest
    # wrappers of wrappers too
    assert UnreliableConsensus(CountingConsensus(_PutIfAbsentConsensus()), faults).detects_truncated is False
