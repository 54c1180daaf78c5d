"""Faults as real S3 returns them, through the fault proxy in front of moto, classified by :mod:`persist.s3`.

Each S3 answer, forced on the exact request it is about (the conditional
PUT of a compare-and-set, or any request):

- ``409 ConditionalRequestConflict`` (a racing conditional write of the same
  key in flight; AWS: retry): the compare-and-set sends it again and
  commits; when every attempt conflicts it is a MISMATCH, nothing written;
- ``503 SlowDown``, ``500 InternalError``, ``400 RequestTimeout``: botocore
  retries them; a retry that lands commits; when every attempt fails, the
  write is ``Indeterminate`` (an earlier attempt may have landed), a read is
  ``Determinate``, and a single attempt that failed so is ``Determinate``
  only where S3 never applies it (``SlowDown``, ``RequestTimeout``; not a
  500 nor a ``ServiceUnavailable``);
- a ``412`` for a write that landed before its reply was lost (the reply is
  dropped, botocore sends the PUT again and the store answers 412): a
  MISMATCH to the backend, recognised as our own write by persist's
  idempotency token one layer up, so the append is committed once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from persist import Determinate, ExternalError, Indeterminate, PersistClient, PersistConfig, ShardId
from persist.fault_proxy import Fault, FaultProxy
from persist.location import CaSResult
from persist.s3 import CONFLICT_RETRIES, MAX_ATTEMPTS, S3Blob, S3Consensus, make_client
from tests.persist.model import SCHEMA, ShardModel, upd

pytestmark = pytest.mark.s3
COMMITTED, MISMATCH = CaSResult.COMMITTED, CaSResult.MISMATCH


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_endpoint, seed=3) as p:
        yield p


@pytest.fixture
def bucket(s3_bucket_factory: Callable[..., str]) -> str:
    return s3_bucket_factory("s3faults")


def _backends(proxy: FaultProxy, bucket: str, attempts: int = MAX_ATTEMPTS) -> tuple[S3Blob, S3Consensus, Any]:
    client = make_client(proxy.url, "us-east-1", max_attempts=attempts, read_timeout=10)
    return S3Blob(client, bucket, "p"), S3Consensus(client, bucket, "p"), client


def _versions(s3_admin: Any, bucket: str, key: str = "k") -> list[str]:
    listed = s3_admin.list_objects_v2(Bucket=bucket, Prefix=f"p/consensus/{key}/").get("Contents", [])
    return [o["Key"].rsplit("/", 1)[1] for o in listed]


def test_409_conflict_is_sent_again_and_commits(proxy: FaultProxy, bucket: str, s3_admin: Any) -> None:
    _, consensus, client = _backends(proxy, bucket)
    proxy.force(Fault.CONFLICT_409, times=2, conditional_puts_only=True)
    assert consensus.compare_and_set("k", None, b"mine") is COMMITTED
    assert proxy.counters()["conflict_409"] == 2
    head = consensus.head("k")
    assert head is not None and (head.seqno, head.data) == (1, b"mine")
    client.close()


def test_409_on_every_attempt_is_a_mismatch_and_writes_nothing(
    proxy: FaultProxy, bucket: str, s3_admin: Any
) -> None:
    _, consensus, client = _backends(proxy, bucket)
    proxy.force(Fault.CONFLICT_409, times=CONFLICT_RETRIES + 1, conditional_puts_only=True)
    assert consensus.compare_and_set("k", None, b"mine") is MISMATCH
    assert proxy.counters()["conflict_409"] == CONFLICT_RETRIES + 1
    assert _versions(s3_admin, bucket) == []
    assert consensus.compare_and_set("k", None, b"again") is COMMITTED  # nothing left over
    client.close()


@pytest.mark.parametrize("fault", [Fault.ERROR_503, Fault.ERROR_500, Fault.REQUEST_TIMEOUT])
def test_retried_server_errors_commit_once(proxy: FaultProxy, bucket: str, s3_admin: Any, fault: Fault) -> None:
    _, consensus, client = _backends(proxy, bucket)
    proxy.force(fault, times=MAX_ATTEMPTS - 1, conditional_puts_only=True)
    assert consensus.compare_and_set("k", None, b"mine") is COMMITTED
    assert proxy.counters()[fault.value] == MAX_ATTEMPTS - 1
    assert _versions(s3_admin, bucket) == [f"{1:020d}"]
    client.close()


@pytest.mark.parametrize("fault", [Fault.ERROR_503, Fault.ERROR_500, Fault.REQUEST_TIMEOUT])
def test_server_errors_on_every_attempt(proxy: FaultProxy, bucket: str, s3_admin: Any, fault: Fault) -> None:
    blob, consensus, client = _backends(proxy, bucket)
    proxy.force(fault, times=MAX_ATTEMPTS, conditional_puts_only=True)
    with pytest.raises(Indeterminate, match="compare_and_set"):  # retried: an earlier attempt may have landed
        consensus.compare_and_set("k", None, b"mine")
    assert _versions(s3_admin, bucket) == []
    proxy.force(fault, times=MAX_ATTEMPTS)
    with pytest.raises(Determinate, match="blob get"):  # a read never changed anything
        blob.get("anything")
    client.close()
    # one attempt only: S3 never applies a request it answered SlowDown or RequestTimeout; a 500 may have
    _, single, client = _backends(proxy, bucket, attempts=1)
    proxy.force(fault, conditional_puts_only=True)
    with pytest.raises(ExternalError) as info:
        single.compare_and_set("k", None, b"mine")
    # (the proxy's 503 is SlowDown or ServiceUnavailable, picked by its seed)
    never_applied = any(f"({code})" in str(info.value) for code in ("SlowDown", "RequestTimeout"))
    assert type(info.value) is (Determinate if never_applied else Indeterminate), info.value
    assert never_applied == (fault is Fault.REQUEST_TIMEOUT or "SlowDown" in str(info.value))
    client.close()


def test_412_for_our_own_landed_write_is_a_mismatch_to_the_backend(
    proxy: FaultProxy, bucket: str, s3_admin: Any
) -> None:
    """The reply is lost after the write landed; botocore's retry is answered 412."""
    _, consensus, client = _backends(proxy, bucket)
    proxy.force(Fault.DROP_REPLY, conditional_puts_only=True)
    assert consensus.compare_and_set("k", None, b"mine") is MISMATCH
    assert proxy.counters()["drop_reply"] == 1
    head = consensus.head("k")
    assert head is not None and (head.seqno, head.data) == (1, b"mine")  # it was ours
    client.close()


def test_412_for_our_own_landed_write_is_recognised_by_the_append(
    proxy: FaultProxy, moto_endpoint: str, s3_url_factory: Callable[..., str]
) -> None:
    """One layer up, the append's idempotency token finds its own state version: committed once."""
    direct = s3_url_factory("own")
    config = PersistConfig(inline_max_bytes=0, compaction_enabled=False)
    faulty = PersistClient.open(direct.replace(moto_endpoint, proxy.url), config)
    clean = PersistClient.open(direct, config)
    shard = ShardId.new()
    w = faulty.open_writer(shard, SCHEMA)
    w.compare_and_append([upd(0, "a", 0)], 0, 1)
    head = clean.consensus.head(str(shard))
    assert head is not None
    before = head.seqno

    proxy.force(Fault.DROP_REPLY, conditional_puts_only=True)
    w.compare_and_append([upd(1, "b", 1)], 1, 2)  # no exception: the 412 was recognised as ours
    assert proxy.counters()["drop_reply"] == 1

    head = clean.consensus.head(str(shard))
    assert head is not None and head.seqno == before + 1, "exactly one new state version"
    model = ShardModel()
    model.append([upd(0, "a", 0)], 0, 1)
    model.append([upd(1, "b", 1)], 1, 2)
    r = clean.open_leased_reader(shard, SCHEMA)
    assert r.snapshot_and_fetch(1) == model.snapshot(1)
    r.expire()
