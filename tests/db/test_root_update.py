"""``update_root``: a root record change lands exactly once through lost races and uncertain writes."""

from __future__ import annotations

import uuid

import pytest

from persist import Indeterminate, PersistClient, PersistConfig
from persist.location import CaSResult
from persist.mem import MemBlob, MemConsensus
from persist.unreliable import Fault, Faults, Op, UnreliableBlob, UnreliableConsensus
from persist.url import Location
from txns.db.root import ROOT_KEY, create_root, new_proposal, read_root, update_root


def _client(deadline_s: float = 10) -> tuple[PersistClient, Faults, MemConsensus]:
    faults = Faults(seed=3)
    inner = MemConsensus()
    url = f"mem://root-{uuid.uuid4().hex}"
    loc = Location(url, UnreliableBlob(MemBlob(), faults), UnreliableConsensus(inner, faults))
    return PersistClient(loc, PersistConfig(retry_deadline_s=deadline_s)), faults, inner


def test_an_uncertain_write_that_landed_is_not_written_again() -> None:
    client, faults, _ = _client()
    root = create_root(client, new_proposal(0))
    faults.fail_next(Op.CAS, Fault.AFTER)  # the write lands, the caller hears Indeterminate
    new = update_root(client, {"retention_ms": 1234})
    assert new.retention_ms == 1234
    assert read_root(client) == new and new.seqno == root.seqno + 1  # one new version, not two


def test_uncertain_writes_that_did_not_land_are_tried_again() -> None:
    client, faults, _ = _client()
    root = create_root(client, new_proposal(0))
    faults.fail_next(Op.CAS, Fault.INDETERMINATE, n=3)  # lost on the way, three times
    new = update_root(client, {"retention_ms": 99})
    assert read_root(client) == new and new.retention_ms == 99 and new.seqno == root.seqno + 1


def test_a_lost_race_reads_the_record_again_and_keeps_the_other_change() -> None:
    client, _, inner = _client()
    root = create_root(client, new_proposal(0))
    other = PersistClient(Location(client.location.url, client.location.blob, inner), client.config)
    raced = {"done": False}
    real_cas = inner.compare_and_set

    def racing_cas(key: str, expected: int | None, data: bytes) -> CaSResult:
        if key == ROOT_KEY and not raced["done"]:  # another writer's change lands first
            raced["done"] = True
            update_root(other, {"created_ms": 7})
        return real_cas(key, expected, data)

    inner.compare_and_set = racing_cas  # type: ignore[method-assign]
    new = update_root(client, {"retention_ms": 5})
    assert raced["done"]
    assert read_root(client) == new and (new.created_ms, new.retention_ms) == (7, 5) and new.seqno == root.seqno + 2


def test_a_store_that_never_answers_gives_up_at_the_deadline() -> None:
    """(It used to loop without pause or end.)"""
    client, faults, _ = _client(deadline_s=0.5)
    root = create_root(client, new_proposal(0))
    faults.fail_next(Op.CAS, Fault.INDETERMINATE, n=1_000_000)
    with pytest.raises(Indeterminate):
        update_root(client, {"retention_ms": 99})
    assert read_root(client) == root  # nothing changed
    assert faults.counters.calls(Op.CAS) < 1000  # with pauses between the attempts
