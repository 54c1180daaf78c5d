"""One conformance suite for every storage backend (mem, file, s3 over moto).

Every test taking ``store`` runs once per backend (see ``location_url`` in
conftest). The contract checked is the one in :mod:`persist.location`;
where the file and S3 backends legitimately differ from mem (S3's
compare-and-set does not read the head, see the SUBTLE note on ``Consensus``)
the test says so through ``Store.checks_expectation``.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
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

from persist.errors import Determinate, Indeterminate, InvalidUsage
from persist.file import FileBlob, FileConsensus
from persist.location import CaSResult, Consensus, next_seqno
from persist.mem import MemBlob, MemConsensus
from persist.s3 import S3Consensus, classify, make_client
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
from persist.url import Location, open_location, redact

COMMITTED, MISMATCH = CaSResult.COMMITTED, CaSResult.MISMATCH


@dataclasses.dataclass
class Store:
    kind: str
    url: str
    loc: Location

    @property
    def checks_expectation(self) -> bool:
        """Whether compare-and-set compares ``expected`` with the actual head.

        S3 only puts version ``expected + 1`` if absent (one request, no
        read), so an ``expected`` ahead of the head, or None after the first
        versions were truncated, is not caught there.
        """
        return self.kind != "s3"


@pytest.fixture
def store(location_url: str) -> Iterator[Store]:
    loc = open_location(location_url)
    yield Store(location_url.partition("://")[0], location_url, loc)
    loc.close()


def chain(store: Store, key: str, n: int, tag: str = "v") -> None:
    """Write versions 1..n of ``key`` (the key must be empty)."""
    for s in range(1, n + 1):
        assert (
            store.loc.consensus.compare_and_set(key, s - 1 or None, f"{tag}{s}".encode())
            is COMMITTED
        )


# --- Blob ---------------------------------------------------------------------------


def test_blob_missing_key_is_none(store: Store) -> None:
    assert store.loc.blob.get("nope") is None
    assert store.loc.blob.get("no/such/nested/key") is None


def test_blob_set_get_overwrite(store: Store) -> None:
    blob = store.loc.blob
    blob.set("k", b"one")
    assert blob.get("k") == b"one"
    blob.set("k", b"two, longer")
    assert blob.get("k") == b"two, longer"
    blob.set("k", b"3")
    assert blob.get("k") == b"3"


def test_blob_empty_value(store: Store) -> None:
    store.loc.blob.set("empty", b"")
    assert store.loc.blob.get("empty") == b""
    assert list(store.loc.blob.list_keys("empty")) == ["empty"]


def test_blob_large_value(store: Store) -> None:
    value = random.Random(5).randbytes(5 * 1024 * 1024 + 17)
    store.loc.blob.set("big/value", value)
    assert store.loc.blob.get("big/value") == value


def test_blob_delete(store: Store) -> None:
    blob = store.loc.blob
    blob.set("a/b", b"x")
    blob.delete("a/b")
    assert blob.get("a/b") is None
    assert list(blob.list_keys("")) == []
    blob.delete("a/b")  # missing: not an error
    blob.delete("never/was")
    blob.set("a/b", b"again")
    assert blob.get("a/b") == b"again"


def test_blob_nested_keys_and_list(store: Store) -> None:
    blob = store.loc.blob
    keys = ["a/b/c", "a/b/d", "a/x", "ab", "b", "shard/s1/batch-0001", "shard/s1/batch-0002"]
    for i, k in enumerate(keys):
        blob.set(k, f"value {i}".encode())
    for i, k in enumerate(keys):
        assert blob.get(k) == f"value {i}".encode()

    def listed(prefix: str) -> set[str]:
        return set(blob.list_keys(prefix))

    assert listed("") == set(keys)
    assert listed("a") == {"a/b/c", "a/b/d", "a/x", "ab"}
    assert listed("a/") == {"a/b/c", "a/b/d", "a/x"}
    assert listed("a/b") == {"a/b/c", "a/b/d"}
    assert listed("a/b/") == {"a/b/c", "a/b/d"}
    assert listed("a/b/c") == {"a/b/c"}
    assert listed("a/b/c/") == set()
    assert listed("shard/s1/batch-") == {"shard/s1/batch-0001", "shard/s1/batch-0002"}
    assert listed("zzz") == set()
    assert listed("zzz/") == set()
    blob.delete("a/x")
    assert listed("a/") == {"a/b/c", "a/b/d"}


def test_blob_set_visible_to_another_client(store: Store) -> None:
    other = open_location(store.url)
    try:
        store.loc.blob.set("shared", b"from one")
        assert other.blob.get("shared") == b"from one"
        other.blob.set("shared", b"from two")
        assert store.loc.blob.get("shared") == b"from two"
    finally:
        other.close()


# --- Consensus ----------------------------------------------------------------------


def test_consensus_empty_key(store: Store) -> None:
    c = store.loc.consensus
    assert c.head("k") is None
    assert c.scan("k", 1, 10) == []
    assert list(c.list_keys()) == []


def test_consensus_first_write_uses_none(store: Store) -> None:
    c = store.loc.consensus
    assert c.compare_and_set("k", None, b"first") is COMMITTED
    head = c.head("k")
    assert head is not None and (head.seqno, head.data) == (1, b"first")
    assert c.compare_and_set("k", 1, b"second") is COMMITTED
    head = c.head("k")
    assert head is not None and (head.seqno, head.data) == (2, b"second")


def test_consensus_none_mismatches_when_versions_exist(store: Store) -> None:
    c = store.loc.consensus
    chain(store, "k", 2)
    assert c.compare_and_set("k", None, b"again") is MISMATCH
    head = c.head("k")
    assert head is not None and (head.seqno, head.data) == (2, b"v2")


def test_consensus_stale_expectation_mismatches(store: Store) -> None:
    c = store.loc.consensus
    chain(store, "k", 3)
    assert c.compare_and_set("k", 1, b"stale") is MISMATCH
    assert c.compare_and_set("k", 2, b"stale") is MISMATCH
    head = c.head("k")
    assert head is not None and (head.seqno, head.data) == (3, b"v3")
    assert [v.seqno for v in c.scan("k", 1, 10)] == [1, 2, 3]


def test_consensus_expectation_ahead_of_head_mismatches(store: Store) -> None:
    if not store.checks_expectation:
        pytest.skip("s3 compare-and-set is put-if-absent only (see the SUBTLE note on Consensus)")
    c = store.loc.consensus
    assert c.compare_and_set("k", 1, b"ahead") is MISMATCH
    assert c.head("k") is None
    chain(store, "k", 3)
    assert c.compare_and_set("k", 5, b"ahead") is MISMATCH
    assert c.scan("k", 1, 10)[-1].seqno == 3


def test_consensus_arbitrary_bytes(store: Store) -> None:
    c = store.loc.consensus
    payloads = [b"", bytes(range(256)), b"\x00" * 1000, random.Random(1).randbytes(100_000)]
    for i, p in enumerate(payloads):
        assert c.compare_and_set("bytes", i or None, p) is COMMITTED
    assert [v.data for v in c.scan("bytes", 1, 10)] == payloads


def test_consensus_scan_order_and_limit(store: Store) -> None:
    c = store.loc.consensus
    chain(store, "k", 12)
    assert [(v.seqno, v.data) for v in c.scan("k", 1, 100)] == [
        (s, f"v{s}".encode()) for s in range(1, 13)
    ]
    assert [v.seqno for v in c.scan("k", 4, 3)] == [4, 5, 6]
    assert [v.seqno for v in c.scan("k", 10, 100)] == [10, 11, 12]
    assert [v.seqno for v in c.scan("k", 12, 1)] == [12]
    assert [v.seqno for v in c.scan("k", 0, 2)] == [1, 2]
    assert c.scan("k", 13, 10) == []
    assert c.scan("k", 1, 0) == []


def test_consensus_truncate(store: Store) -> None:
    c = store.loc.consensus
    chain(store, "k", 5)
    assert c.truncate("k", 3) == 2
    assert [v.seqno for v in c.scan("k", 1, 10)] == [3, 4, 5]
    assert c.truncate("k", 3) == 0
    assert c.truncate("k", 1) == 0
    assert c.truncate("k", 5) == 2  # up to and including the head is allowed
    head = c.head("k")
    assert head is not None and (head.seqno, head.data) == (5, b"v5")
    assert [v.seqno for v in c.scan("k", 1, 10)] == [5]
    # Writing goes on from the head.
    assert c.compare_and_set("k", 4, b"stale") is MISMATCH
    assert c.compare_and_set("k", 5, b"v6") is COMMITTED
    assert [v.seqno for v in c.scan("k", 1, 10)] == [5, 6]


def test_consensus_truncate_never_deletes_the_head(store: Store) -> None:
    c = store.loc.consensus
    with pytest.raises(InvalidUsage, match="latest version"):
        c.truncate("missing", 1)
    chain(store, "k", 3)
    with pytest.raises(InvalidUsage, match="latest version"):
        c.truncate("k", 4)
    with pytest.raises(InvalidUsage):
        c.truncate("k", 100)
    assert [v.seqno for v in c.scan("k", 1, 10)] == [1, 2, 3]


def test_consensus_none_after_truncation(store: Store) -> None:
    if not store.checks_expectation:
        pytest.skip(
            "s3 cannot tell a truncated version from one never written (SUBTLE note on Consensus)"
        )
    c = store.loc.consensus
    chain(store, "k", 3)
    c.truncate("k", 3)
    assert c.compare_and_set("k", None, b"reborn?") is MISMATCH
    assert c.compare_and_set("k", 1, b"stale") is MISMATCH
    head = c.head("k")
    assert head is not None and head.seqno == 3


def test_consensus_keys_are_independent(store: Store) -> None:
    c = store.loc.consensus
    keys = ["a", "a/b", "a/b/c", "shard/s 1%x", "ü-ñ", "00000000000000000001"]
    for n, k in enumerate(keys, start=1):
        chain(store, k, n, tag=f"{k}:")
    for n, k in enumerate(keys, start=1):
        head = c.head(k)
        assert head is not None and (head.seqno, head.data) == (n, f"{k}:{n}".encode())
        assert [v.seqno for v in c.scan(k, 1, 100)] == list(range(1, n + 1))
    assert sorted(c.list_keys()) == sorted(keys)
    c.truncate("a/b/c", 3)
    assert c.head("a") is not None and c.head("a/b") is not None
    assert [v.seqno for v in c.scan("a/b", 1, 10)] == [1, 2]


def test_consensus_visible_to_another_client(store: Store) -> None:
    other = open_location(store.url)
    try:
        assert store.loc.consensus.compare_and_set("k", None, b"one") is COMMITTED
        assert other.consensus.compare_and_set("k", None, b"other") is MISMATCH
        head = other.consensus.head("k")
        assert head is not None and head.data == b"one"
        assert other.consensus.compare_and_set("k", 1, b"two") is COMMITTED
        head = store.loc.consensus.head("k")
        assert head is not None and (head.seqno, head.data) == (2, b"two")
    finally:
        other.close()


def _thread_race(consensus: Consensus, key: str, threads: int, rounds: int) -> None:
    """``threads`` threads race every round; assert exactly one wins each seqno."""
    barrier = threading.Barrier(threads, timeout=60)
    wins: list[tuple[int, int]] = []  # (round, thread)
    errors: list[BaseException] = []
    lock = threading.Lock()

    def race(tid: int) -> None:
        try:
            for r in range(1, rounds + 1):
                barrier.wait()
                if (
                    consensus.compare_and_set(key, r - 1 or None, f"{tid}:{r}".encode())
                    is COMMITTED
                ):
                    with lock:
                        wins.append((r, tid))
        except BaseException as e:  # surfaced below
            errors.append(e)
            barrier.abort()

    workers = [threading.Thread(target=race, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors, errors
    assert sorted(r for r, _ in wins) == list(range(1, rounds + 1)), "exactly one winner per round"
    head = consensus.head(key)
    assert head is not None and head.seqno == rounds
    winner = dict(wins)
    assert [(v.seqno, v.data) for v in consensus.scan(key, 1, 1000)] == [
        (r, f"{winner[r]}:{r}".encode()) for r in range(1, rounds + 1)
    ]


def test_consensus_thread_race(store: Store) -> None:
    _thread_race(store.loc.consensus, "race", threads=8, rounds=30)


@pytest.mark.s3
def test_s3_thread_race_with_slow_moto(
    s3_url_factory: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race again, with moto slowed between its If-None-Match check and its write.

    Without the lock conftest puts around moto's PutObject handler this lets
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
        _thread_race(loc.consensus, "race", threads=8, rounds=10)
    finally:
        loc.close()


def _process_race_worker(
    root: str, key: str, target: int, wid: int, barrier: Any, results: Any
) -> None:
    """Write ``key`` from head to ``target``, reporting the seqnos this process won."""
    consensus = FileConsensus(Path(root))
    won: list[int] = []
    barrier.wait(timeout=60)
    while True:
        head = consensus.head(key)
        current = head.seqno if head is not None else None
        if current is not None and current >= target:
            break
        if (
            consensus.compare_and_set(key, current, f"{wid}:{next_seqno(current)}".encode())
            is COMMITTED
        ):
            won.append(next_seqno(current))
    results.put((wid, won))


def test_file_consensus_process_race(tmp_path: Path) -> None:
    """Processes (spawned, not forked) race on one key of a file location."""
    procs, target = 4, 40
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(procs)
    results = ctx.Queue()
    workers = [
        ctx.Process(
            target=_process_race_worker, args=(str(tmp_path), "race", target, w, barrier, results)
        )
        for w in range(procs)
    ]
    for w in workers:
        w.start()
    outcomes = dict(results.get(timeout=120) for _ in workers)
    for w in workers:
        w.join(timeout=30)
        assert w.exitcode == 0
    won = [s for seqnos in outcomes.values() for s in seqnos]
    assert sorted(won) == list(range(1, target + 1)), "every seqno won exactly once"
    winner = {s: wid for wid, seqnos in outcomes.items() for s in seqnos}
    versions = FileConsensus(tmp_path).scan("race", 1, 1000)
    assert [(v.seqno, v.data) for v in versions] == [
        (s, f"{winner[s]}:{s}".encode()) for s in range(1, target + 1)
    ]


# --- file backend specifics ---------------------------------------------------------


def test_file_layout_and_temp_files_are_invisible(tmp_path: Path) -> None:
    blob, consensus = FileBlob(tmp_path), FileConsensus(tmp_path)
    blob.set("a/b", b"x")
    assert (tmp_path / "blob" / "a" / "b").read_bytes() == b"x"
    assert consensus.compare_and_set("shard/s1", None, b"v1") is COMMITTED
    version = tmp_path / "consensus" / "kshard%2Fs1" / "00000000000000000001"
    assert version.read_bytes() == b"v1"
    # Leftovers of a crashed writer are never read nor listed.
    (tmp_path / "blob" / "a" / ".tmp-crashed").write_bytes(b"partial")
    (version.parent / ".tmp-crashed").write_bytes(b"partial")
    assert list(blob.list_keys("")) == ["a/b"]
    head = consensus.head("shard/s1")
    assert head is not None and (head.seqno, head.data) == (1, b"v1")
    assert list(consensus.list_keys()) == ["shard/s1"]
    assert not [
        p
        for p in version.parent.iterdir()
        if p.name.startswith(".tmp-") and p.name != ".tmp-crashed"
    ]


@pytest.mark.parametrize(
    "key", ["", "/abs", "../escape", "a/../b", "a//b", "a/./b", "a/.tmp-x", "trailing/"]
)
def test_file_blob_rejects_unsafe_keys(tmp_path: Path, key: str) -> None:
    blob = FileBlob(tmp_path)
    with pytest.raises(InvalidUsage, match="invalid blob key"):
        blob.set(key, b"x")
    with pytest.raises(InvalidUsage):
        blob.get(key)


def test_file_blob_key_and_nested_key_conflict(tmp_path: Path) -> None:
    blob = FileBlob(tmp_path)
    blob.set("a", b"file")
    with pytest.raises(InvalidUsage, match="nested"):
        blob.set("a/b", b"x")
    with pytest.raises(InvalidUsage, match="nested"):
        blob.set("a/b/c", b"x")
    blob.set("d/e", b"x")
    with pytest.raises(InvalidUsage, match="nested"):
        blob.set("d", b"x")
    assert sorted(blob.list_keys("")) == ["a", "d/e"]


# --- S3 backend specifics -----------------------------------------------------------


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
        (_client_error(503, "SlowDown"), Indeterminate),
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
        stub.add_client_error("put_object", service_error_code=code, http_status_code=status)
        assert consensus.compare_and_set("k", 3, b"x") is MISMATCH
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


# --- open_location and redact -------------------------------------------------------


def test_open_location_unknown_scheme() -> None:
    with pytest.raises(InvalidUsage) as info:
        open_location("ftp://host/path")
    message = str(info.value)
    assert "ftp://host/path" in message and "unknown scheme 'ftp'" in message
    for form in ("mem://NAME", "file://PATH", "s3://BUCKET"):
        assert form in message


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("no-scheme-at-all", "missing '://'"),
        ("mem://", "needs a NAME"),
        ("file://", "needs a PATH"),
        ("s3://", "missing BUCKET"),
        ("s3:///prefix", "missing BUCKET"),
        ("s3://Bad_Bucket/p", "not a valid bucket name"),
        ("s3://ab/p", "not a valid bucket name"),
        ("s3://bucket/p?colour=red", "unknown query parameter 'colour'"),
        ("s3://bucket/p?region=a&region=b", "given twice"),
        ("s3://bucket/p?region=", "is empty"),
        ("s3://bucket/p?endpoint_url=ftp://host", "endpoint_url must be"),
        ("s3://bucket/p#frag", "no fragment"),
    ],
)
def test_open_location_malformed(url: str, why: str) -> None:
    with pytest.raises(InvalidUsage) as info:
        open_location(url)
    message = str(info.value)
    assert why in message
    assert "accepted forms" in message and "s3://BUCKET" in message


@pytest.mark.parametrize(
    "url",
    [
        "s3://AKIAEXAMPLE:hunter2-secret@bucket/p",
        "s3://bucket/p?aws_secret_access_key=hunter2-secret",
        "s3://bucket/p?endpoint_url=http://user:hunter2-secret@host:9000",
    ],
)
def test_open_location_refuses_credentials_in_url(url: str) -> None:
    with pytest.raises(InvalidUsage, match="credentials") as info:
        open_location(url)
    assert "hunter2-secret" not in str(info.value)


@pytest.mark.s3
def test_open_location_missing_bucket(
    s3_url_factory: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "sEcReT-" + uuid.uuid4().hex
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    url = s3_url_factory().replace("s3://test-", "s3://missing-", 1)
    bucket = url.split("/")[2]
    with pytest.raises(InvalidUsage) as info:
        open_location(url)
    message = str(info.value)
    assert f"bucket {bucket!r} does not exist" in message
    assert "create it" in message and f"s3://{bucket}" in message
    assert secret not in message and secret not in repr(info.value.__cause__)


def test_open_location_file_creates_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    absolute = tmp_path / "abs" / "store"
    loc = open_location(f"file://{absolute}")
    loc.blob.set("k", b"v")
    assert (absolute / "blob" / "k").read_bytes() == b"v"
    monkeypatch.chdir(tmp_path)
    # `file://rel/store` reads "rel" as a host name: refused (it used to create ./rel/store silently)
    with pytest.raises(InvalidUsage, match="file:///absolute/path"):
        open_location("file://rel/store")
    assert not (tmp_path / "rel").exists(), "nothing was created"


def test_open_location_mem_is_shared_by_name() -> None:
    name = f"mem://shared-{uuid.uuid4().hex}"
    a, b = open_location(name), open_location(name)
    a.blob.set("k", b"v")
    assert b.blob.get("k") == b"v"
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.url = "mem://other"  # type: ignore[misc]


def test_redact() -> None:
    assert redact("s3://AKIA:secret@bucket/p?region=us-east-1") == "s3://bucket/p?region=us-east-1"
    redacted = redact(
        "s3://bucket/p?aws_secret_access_key=abc&X-Amz-Signature=def&session_token=ghi&region=eu"
    )
    assert "abc" not in redacted and "def" not in redacted and "ghi" not in redacted
    assert "region=eu" in redacted and "REDACTED" in redacted
    assert redact("file:///tmp/x") == "file:///tmp/x"
    nested = redact("s3://b/p?endpoint_url=http://user:pw-secret@host:9000&region=eu")
    assert "pw-secret" not in nested and "endpoint_url=http://host:9000" in nested


# --- unreliable and counting wrappers -----------------------------------------------


@pytest.fixture
def faults() -> Faults:
    return Faults(seed=42)


def unreliable(store: Store, faults: Faults) -> tuple[UnreliableBlob, UnreliableConsensus]:
    return UnreliableBlob(store.loc.blob, faults), UnreliableConsensus(store.loc.consensus, faults)


@pytest.mark.parametrize("fault", [Fault.DETERMINATE, Fault.INDETERMINATE])
def test_fail_before_writes_nothing(store: Store, faults: Faults, fault: Fault) -> None:
    blob, consensus = unreliable(store, faults)
    expected_error = Determinate if fault is Fault.DETERMINATE else Indeterminate
    faults.fail_next(Op.BLOB_SET, fault)
    with pytest.raises(expected_error, match=r"before blob\.set"):
        blob.set("k", b"v")
    assert store.loc.blob.get("k") is None
    faults.fail_next(Op.CAS, fault)
    with pytest.raises(expected_error):
        consensus.compare_and_set("c", None, b"v1")
    assert store.loc.consensus.head("c") is None
    # Nothing pending any more: the retries go through.
    blob.set("k", b"v")
    assert consensus.compare_and_set("c", None, b"v1") is COMMITTED
    store.loc.blob.set("d", b"x")
    faults.fail_next(Op.BLOB_DELETE, fault)
    with pytest.raises(expected_error):
        blob.delete("d")
    assert store.loc.blob.get("d") == b"x"
    chain(store, "t", 3)
    faults.fail_next(Op.TRUNCATE, fault)
    with pytest.raises(expected_error):
        consensus.truncate("t", 3)
    assert len(store.loc.consensus.scan("t", 1, 10)) == 3


def test_fail_after_writes_then_raises_indeterminate(store: Store, faults: Faults) -> None:
    blob, consensus = unreliable(store, faults)
    faults.fail_next(Op.BLOB_SET, Fault.AFTER)
    with pytest.raises(Indeterminate, match="it was done"):
        blob.set("k", b"v")
    assert store.loc.blob.get("k") == b"v"
    faults.fail_next(Op.CAS, Fault.AFTER)
    with pytest.raises(Indeterminate):
        consensus.compare_and_set("c", None, b"v1")
    head = store.loc.consensus.head("c")
    assert head is not None and (head.seqno, head.data) == (1, b"v1")
    # A blind retry now loses: why the layer above checks its idempotency token.
    assert consensus.compare_and_set("c", None, b"v1") is MISMATCH
    faults.fail_next(Op.BLOB_DELETE, Fault.AFTER)
    with pytest.raises(Indeterminate):
        blob.delete("k")
    assert store.loc.blob.get("k") is None
    chain(store, "t", 3)
    faults.fail_next(Op.TRUNCATE, Fault.AFTER)
    with pytest.raises(Indeterminate):
        consensus.truncate("t", 3)
    assert [v.seqno for v in store.loc.consensus.scan("t", 1, 10)] == [3]


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


def test_counting_wrappers(store: Store) -> None:
    counters = Counters()
    blob = CountingBlob(store.loc.blob, counters)
    consensus = CountingConsensus(store.loc.consensus, counters)
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
