"""The S3 backend's specifics (:mod:`persist.s3`): error classification, layout, moto races, cheap opens.

The contract every backend keeps is checked by tests/persist/test_conformance.py.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)
from botocore.stub import Stubber

from persist.errors import Determinate, Indeterminate
from persist.location import CaSResult
from persist.s3 import CONFLICT_RETRIES, HEAD_HINT_EVERY, S3Consensus, classify, make_client, open_s3
from persist.testing import race_compare_and_set
from persist.url import open_location

COMMITTED, MISMATCH = CaSResult.COMMITTED, CaSResult.MISMATCH


def test_s3_backend_capabilities() -> None:
    """Compare-and-set is one put-if-absent: the expectation is not checked against the head."""
    client = make_client(region="us-east-1")
    consensus = S3Consensus(client, "bucket", "prefix")
    assert (consensus.checks_expectation, consensus.detects_truncated, consensus.lists_keys) == (False, False, True)
    client.close()


def _client_error(status: int, code: str) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "PutObject",
    )


@pytest.mark.parametrize(
    ("exc", "write_kind"),
    [
        (ReadTimeoutError(endpoint_url="http://x"), Indeterminate),
        (ConnectionClosedError(endpoint_url="http://x"), Indeterminate),
        (_client_error(500, "InternalError"), Indeterminate),
        (_client_error(503, "ServiceUnavailable"), Indeterminate),
        (_client_error(503, "SlowDown"), Determinate),  # throttled: not processed
        (_client_error(400, "RequestTimeout"), Determinate),  # the store never had the whole request
        (RuntimeError("something unknown"), Indeterminate),
        (EndpointConnectionError(endpoint_url="http://x"), Determinate),
        (ConnectTimeoutError(endpoint_url="http://x"), Determinate),
        (_client_error(403, "AccessDenied"), Determinate),
    ],
)
def test_s3_classify(exc: Exception, write_kind: type[Exception]) -> None:
    assert type(classify(exc, op_is_write=True)) is write_kind
    assert type(classify(exc, op_is_write=False)) is Determinate
    # After a retry, an earlier attempt may have landed: never determinate.
    assert type(classify(exc, op_is_write=True, attempts=2)) is Indeterminate


@pytest.mark.parametrize(
    ("status", "code"), [(412, "PreconditionFailed"), (409, "ConditionalRequestConflict")]
)
def test_s3_cas_conflicts_are_mismatches(status: int, code: str) -> None:
    client = make_client(region="us-east-1")
    consensus = S3Consensus(client, "bucket", "prefix")
    with Stubber(client) as stub:
        # (a 409 conflict is sent again, CONFLICT_RETRIES times, before it counts as a MISMATCH)
        for _ in range(CONFLICT_RETRIES + 1 if status == 409 else 1):
            stub.add_client_error("put_object", service_error_code=code, http_status_code=status)
        assert consensus.compare_and_set("k", 3, b"x") is MISMATCH
        stub.assert_no_pending_responses()
        stub.add_client_error(
            "put_object", service_error_code="InternalError", http_status_code=500
        )
        with pytest.raises(
            Indeterminate,
            match="compare_and_set s3://bucket/prefix/consensus/k/00000000000000000004",
        ):
            consensus.compare_and_set("k", 3, b"x")
    client.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_s3_unreachable_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    client = make_client(endpoint, "us-east-1", max_attempts=1)
    consensus = S3Consensus(client, "bucket")
    with pytest.raises(Determinate):
        consensus.compare_and_set("k", None, b"x")  # refused: nothing was sent
    with pytest.raises(Determinate):
        consensus.head("k")
    client.close()
    retrying = make_client(endpoint, "us-east-1", max_attempts=2)
    with pytest.raises(Indeterminate):
        # Refused twice, but a retried write is never reported determinate.
        S3Consensus(retrying, "bucket").compare_and_set("k", None, b"x")
    retrying.close()


@pytest.mark.s3
def test_s3_layout_and_prefix_isolation(s3_url_factory: Callable[..., str], s3_admin: Any) -> None:
    url = s3_url_factory("tenant/one")
    bucket = url.split("/")[2]
    endpoint_query = url.partition("?")[2]
    one = open_location(url)
    two = open_location(f"s3://{bucket}/tenant/two?{endpoint_query}")
    bare = open_location(f"s3://{bucket}?{endpoint_query}")  # empty prefix
    try:
        one.blob.set("a/b", b"x")
        assert one.consensus.compare_and_set("shard/s1", None, b"v1") is COMMITTED
        listed = {o["Key"] for o in s3_admin.list_objects_v2(Bucket=bucket)["Contents"]}
        assert listed == {
            "tenant/one/blob/a/b",
            "tenant/one/consensus/shard/s1/00000000000000000001",
        }
        assert two.blob.get("a/b") is None and list(two.blob.list_keys("")) == []
        assert two.consensus.head("shard/s1") is None and list(two.consensus.list_keys()) == []
        bare.blob.set("k", b"top")
        assert bare.blob.get("k") == b"top"
        assert s3_admin.get_object(Bucket=bucket, Key="blob/k")["Body"].read() == b"top"
        assert list(one.blob.list_keys("")) == ["a/b"]
    finally:
        for loc in (one, two, bare):
            loc.close()


@pytest.mark.s3
def test_s3_missing_bucket_is_an_error_not_a_missing_key(
    s3_url_factory: Callable[..., str], s3_admin: Any
) -> None:
    url = s3_url_factory()
    loc = open_location(url)
    s3_admin.delete_bucket(Bucket=url.split("/")[2])
    try:
        with pytest.raises(Determinate, match="NoSuchBucket"):
            loc.blob.get("k")
        with pytest.raises(Determinate, match="NoSuchBucket"):
            loc.consensus.head("k")
    finally:
        loc.close()


@pytest.mark.s3
def test_s3_thread_race_with_slow_moto(
    s3_url_factory: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The conformance suite's thread race again, with moto slowed between its If-None-Match check and its write.

    Without the lock moto_server (persist.testing) puts around moto's PutObject handler this lets
    several writers win most rounds; with it, exactly one wins each.
    """
    from moto.s3.models import S3Backend

    original = S3Backend.put_object

    def slow_put_object(self: Any, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.002)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(S3Backend, "put_object", slow_put_object)
    loc = open_location(s3_url_factory())
    try:
        race_compare_and_set(loc.consensus, "race", threads=8, rounds=10)
    finally:
        loc.close()


# ---- cheap opens: the head hint -----------------------------------------------------------


def _listed_keys(client: Any) -> Callable[[], int]:
    """A counter of the keys every ListObjectsV2 answer of ``client`` carried."""
    seen = [0]

    def count(parsed: dict, **_: Any) -> None:
        seen[0] += len(parsed.get("Contents", []))

    client.meta.events.register("after-call.s3.ListObjectsV2", count)
    return lambda: seen[0]


@pytest.mark.s3
def test_a_fresh_head_lists_from_the_hint_not_every_version(
    moto_endpoint: str, s3_bucket_factory: Callable[..., str]
) -> None:
    bucket = s3_bucket_factory("cheap")
    _, writer = open_s3(bucket, "p", endpoint_url=moto_endpoint, region="us-east-1")
    expected = None
    n = 3 * HEAD_HINT_EVERY + 5
    for i in range(n):
        assert writer.compare_and_set("k", expected, f"v{i}".encode()) is COMMITTED
        expected = i + 1
    _, fresh = open_s3(bucket, "p", endpoint_url=moto_endpoint, region="us-east-1")
    listed = _listed_keys(fresh._client)
    head = fresh.head("k")
    assert head is not None and head.seqno == n and head.data == f"v{n - 1}".encode()
    assert listed() <= HEAD_HINT_EVERY, f"listed {listed()} versions of {n}"
    # the hint is not a version: scans, truncation and key listing ignore it
    assert [v.seqno for v in fresh.scan("k", n - 1, 10)] == [n - 1, n]
    assert list(fresh.list_keys()) == ["k"]
    assert fresh.truncate("k", n) == n - 1
    assert fresh.head("k").seqno == n  # type: ignore[union-attr]


@pytest.mark.s3
def test_a_missing_or_stale_hint_only_costs_a_longer_listing(
    moto_endpoint: str, s3_admin: Any, s3_bucket_factory: Callable[..., str]
) -> None:
    bucket = s3_bucket_factory("cheap")
    _, c = open_s3(bucket, "p", endpoint_url=moto_endpoint, region="us-east-1")
    expected = None
    for i in range(HEAD_HINT_EVERY + 3):
        c.compare_and_set("k", expected, b"x")
        expected = i + 1
    s3_admin.put_object(Bucket=bucket, Key="p/consensus/k/head-hint", Body=b"garbage")
    assert c.head("k").seqno == HEAD_HINT_EVERY + 3  # type: ignore[union-attr]
    s3_admin.delete_object(Bucket=bucket, Key="p/consensus/k/head-hint")
    assert c.head("k").seqno == HEAD_HINT_EVERY + 3  # type: ignore[union-attr]
    s3_admin.put_object(Bucket=bucket, Key="p/consensus/k/head-hint", Body=b"1")  # stale: a lower bound still
    assert c.head("k").seqno == HEAD_HINT_EVERY + 3  # type: ignore[union-attr]


@pytest.mark.s3
def test_delete_many_is_one_request_per_thousand_keys(
    moto_endpoint: str, s3_bucket_factory: Callable[..., str]
) -> None:
    bucket = s3_bucket_factory("delmany")
    blob, _ = open_s3(bucket, "p", endpoint_url=moto_endpoint, region="us-east-1")
    keys = [f"q/{i:04d}" for i in range(1005)]
    for k in keys[:30]:
        blob.set(k, b"x")
    requests: list[str] = []
    blob._client.meta.events.register("before-call.s3", lambda model, **_: requests.append(model.name))
    blob.delete_many(keys)  # (most never written: not an error)
    assert requests == ["DeleteObjects", "DeleteObjects"]
    assert list(blob.list_keys("q/")) == []


@pytest.mark.s3
def test_the_moto_fixture_keeps_connections_alive_and_answers_an_empty_put(moto_endpoint: str) -> None:
    """S3 keeps a client's connection open between requests; the tests' moto does too (moto's own server,
    werkzeug's, closed it after every response). An empty PutObject (botocore sends ``Expect: 100-continue``
    with it) is answered, not left waiting for a body."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(moto_endpoint)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request("GET", "/")  # (unsigned: refused, but answered over HTTP/1.1)
        first = conn.getresponse()
        first.read()
        assert first.version == 11 and (first.getheader("Connection") or "").lower() != "close"
        sock = conn.sock
        conn.request("GET", "/")
        conn.getresponse().read()
        assert conn.sock is sock and sock is not None, "the second request went over the same connection"
    finally:
        conn.close()

    import uuid

    bucket = f"keep-alive-{uuid.uuid4().hex[:12]}"
    client = make_client(moto_endpoint, "us-east-1", read_timeout=5, max_attempts=1)
    client.create_bucket(Bucket=bucket)
    client.put_object(Bucket=bucket, Key="empty", Body=b"", IfNoneMatch="*")
    assert client.get_object(Bucket=bucket, Key="empty")["Body"].read() == b""
