"""Opening an S3 shard with many retained versions lists a bounded number of them (the head hint)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from persist.location import CaSResult
from persist.s3 import HEAD_HINT_EVERY, open_s3

pytestmark = pytest.mark.s3


def _listed_keys(client: Any) -> Callable[[], int]:
    """A counter of the keys every ListObjectsV2 answer of ``client`` carried."""
    seen = [0]

    def count(parsed: dict, **_: Any) -> None:
        seen[0] += len(parsed.get("Contents", []))

    client.meta.events.register("after-call.s3.ListObjectsV2", count)
    return lambda: seen[0]


def test_a_fresh_head_lists_from_the_hint_not_every_version(moto_endpoint: str, s3_admin: Any) -> None:
    import uuid

    bucket = f"cheap-{uuid.uuid4().hex[:20]}"
    s3_admin.create_bucket(Bucket=bucket)
    _, writer = open_s3(bucket, "p", endpoint_url=moto_endpoint, region="us-east-1")
    expected = None
    n = 3 * HEAD_HINT_EVERY + 5
    for i in range(n):
        assert writer.compare_and_set("k", expected, f"v{i}".encode()) is CaSResult.COMMITTED
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


def test_a_missing_or_stale_hint_only_costs_a_longer_listing(moto_endpoint: str, s3_admin: Any) -> None:
    import uuid

    bucket = f"cheap-{uuid.uuid4().hex[:20]}"
    s3_admin.create_bucket(Bucket=bucket)
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
