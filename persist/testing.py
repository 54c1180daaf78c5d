"""Test support shipped with persist: the storage conformance suite, and an S3 server on loopback.

Conformance suite
-----------------

:class:`BlobConformance` and :class:`ConsensusConformance` hold the contract
tests of :class:`persist.location.Blob` and :class:`persist.location.Consensus`
as pytest test methods. A backend's tests subclass them (the class name must
start with ``Test``) and provide one fixture per interface: a factory that
opens a client of one fresh, empty store, every call another client of the
*same* store (the visibility tests open two)::

    import pytest
    from persist.testing import BlobConformance, ConsensusConformance, location_clients

    class TestGcs(BlobConformance, ConsensusConformance):
        @pytest.fixture
        def blob_factory(self, gcs_url):       # gcs_url: a fresh bucket, your fixture
            with location_clients(gcs_url) as new:
                yield lambda: new().blob

        @pytest.fixture
        def consensus_factory(self, gcs_url):
            with location_clients(gcs_url) as new:
                yield lambda: new().consensus

(For a backend without a URL scheme, return the backend objects directly and
close them at teardown.) Where the contract lets backends differ, the tests
follow the capability flags the backend declares (``Blob.keys_nest``,
``Consensus.checks_expectation``, ``Consensus.detects_truncated``,
``Consensus.lists_keys``; see :mod:`persist.location`): they check what a
flag claims and skip what it disclaims, never looking at which backend runs.

pytest is a dev dependency only: this module imports it lazily, inside the
tests, so importing it (for the moto helpers, say) does not need pytest.
Its asserts report better with ``pytest.register_assert_rewrite("persist.testing")``
in your conftest, before anything imports this module.

S3 on loopback
--------------

:func:`moto_server` runs moto's S3 server in-process for the test suite and
the benchmarks (and anyone testing code on persist). Needs the ``dev`` extra
(moto, and cheroot, the HTTP server it runs moto's app on: it keeps
connections alive between requests, as S3 does, where moto's own server
closes each after its response).

SUBTLE: moto's S3 PUT handler checks ``If-None-Match: *`` and then stores the
object without holding any lock, so two racing conditional PUTs of the same
key can both succeed, which real S3 never allows. :func:`atomic_moto_puts`
makes the check-and-store atomic by running moto's server-side PutObject
handler (``moto.s3.responses.S3Response.put_object``, which does both) under
one process-wide lock. It patches moto, not persist: our backends run
unchanged against it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

from persist.errors import InvalidUsage
from persist.location import Blob, CaSResult, Consensus

if TYPE_CHECKING:
    from persist.url import Location

__all__ = [
    "FAKE_AWS_ENV",
    "UNSET_AWS_ENV",
    "BlobConformance",
    "BlobFactory",
    "ConsensusConformance",
    "ConsensusFactory",
    "atomic_moto_puts",
    "fake_aws_env",
    "location_clients",
    "moto_server",
    "race_compare_and_set",
    "write_versions",
]

FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_SECURITY_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    # Keep a developer's own AWS config out.
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}
UNSET_AWS_ENV = ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION")

_MOTO_PUT_LOCK = threading.Lock()


@contextlib.contextmanager
def fake_aws_env() -> Iterator[None]:
    """Fake credentials in the environment (set before any client is made), restored after."""
    saved = {k: os.environ.get(k) for k in (*FAKE_AWS_ENV, *UNSET_AWS_ENV)}
    os.environ.update(FAKE_AWS_ENV)
    for k in UNSET_AWS_ENV:
        os.environ.pop(k, None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def atomic_moto_puts() -> Iterator[None]:
    """Run moto's server-side PutObject handler under one process-wide lock."""
    from moto.s3.responses import S3Response

    original = S3Response.put_object

    @functools.wraps(original)
    def locked_put_object(self: Any) -> Any:
        with _MOTO_PUT_LOCK:
            return original(self)

    S3Response.put_object = locked_put_object  # type: ignore[method-assign]
    try:
        yield
    finally:
        S3Response.put_object = original  # type: ignore[method-assign]


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of an in-process moto S3 server (port chosen by the OS).

    Fake credentials are in the environment while it runs, and conditional
    PUTs are atomic (see the module doc). Connections are kept alive between
    requests, as S3 keeps them: see :func:`_serve_keep_alive`.
    """
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

    app = DomainDispatcherApplication(create_backend_app)
    with fake_aws_env(), atomic_moto_puts(), _serve_keep_alive(app) as endpoint:
        yield endpoint


@contextlib.contextmanager
def _serve_keep_alive(app: Callable[..., Any]) -> Iterator[str]:
    """Serve the WSGI ``app`` on 127.0.0.1 (port 0) with cheroot; yields its ``http://`` endpoint.

    Not moto's own server, werkzeug's development server: it (3.1 here)
    closes the connection after every response, whatever the handler's
    protocol version, and then waits up to 10 ms for more of the request
    body. So every request paid a TCP connect and a server thread, and a
    refused conditional PUT 10 ms more. cheroot keeps HTTP/1.1 connections
    alive, as S3 does, and answers ``Expect: 100-continue`` on empty bodies
    (botocore sends it on every PutObject). ``benchmarks/README.md`` ("moto's
    connections kept alive") has what each request costs on either.
    """
    from cheroot import wsgi

    server = wsgi.Server(
        ("127.0.0.1", 0),
        app,
        numthreads=16,  # moto runs under one GIL: threads only overlap socket waits
        request_queue_size=128,  # the listen backlog: 16 processes connect at once in the benchmarks
        timeout=30,  # an idle kept-alive connection is closed after this (S3 closes them too)
    )
    server.keep_alive_conn_limit = 10_000  # every client keeps a pool (persist's: up to 64 each)
    server.prepare()
    port = server.bind_addr[1]
    thread = threading.Thread(target=server.serve, name="moto-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        thread.join(timeout=10)


# ---- the conformance suite -------------------------------------------------------------

BlobFactory = Callable[[], Blob]
"""Opens a client of the test's store (every call another client of the same store)."""
ConsensusFactory = Callable[[], Consensus]
"""Opens a client of the test's store (every call another client of the same store)."""

COMMITTED, MISMATCH = CaSResult.COMMITTED, CaSResult.MISMATCH


def _pytest() -> ModuleType:
    import pytest  # a dev dependency: imported only when a test runs

    return pytest


@contextlib.contextmanager
def location_clients(url: str) -> Iterator[Callable[[], Location]]:
    """A function opening another :class:`~persist.url.Location` on ``url`` each call; all closed at exit."""
    from persist.url import open_location

    opened: list[Location] = []

    def new() -> Location:
        loc = open_location(url)
        opened.append(loc)
        return loc

    try:
        yield new
    finally:
        for loc in opened:
            loc.close()


def write_versions(consensus: Consensus, key: str, n: int, tag: str = "v") -> None:
    """Write versions 1..n of ``key`` (which must have none), with data ``f"{tag}{seqno}"``."""
    for s in range(1, n + 1):
        assert consensus.compare_and_set(key, s - 1 or None, f"{tag}{s}".encode()) is COMMITTED


def race_compare_and_set(consensus: Consensus, key: str, threads: int, rounds: int) -> None:
    """``threads`` threads race a compare-and-set every round; assert exactly one wins each seqno."""
    barrier = threading.Barrier(threads, timeout=60)
    wins: list[tuple[int, int]] = []  # (round, thread)
    errors: list[BaseException] = []
    lock = threading.Lock()

    def race(tid: int) -> None:
        try:
            for r in range(1, rounds + 1):
                barrier.wait()
                if consensus.compare_and_set(key, r - 1 or None, f"{tid}:{r}".encode()) is COMMITTED:
                    with lock:
                        wins.append((r, tid))
        except BaseException as e:  # noqa: BLE001 - surfaced below
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


class BlobConformance:
    """The :class:`~persist.location.Blob` contract, as pytest tests.

    Subclass it in a ``Test...`` class that provides the fixture
    ``blob_factory`` (a :data:`BlobFactory`; see the module doc).
    """

    def test_blob_capabilities_are_declared(self, blob_factory: BlobFactory) -> None:
        assert isinstance(blob_factory().keys_nest, bool)

    def test_blob_storage_clock(self, blob_factory: BlobFactory) -> None:
        """``storage_now_ms`` is None or the storage's time (here: the same machine's, so near this clock),
        and it leaves no key behind (the file store's probe file is deleted)."""
        blob = blob_factory()
        now = blob.storage_now_ms()
        assert now is None or abs(now - time.time() * 1000) < 60_000, now
        assert list(blob.list_keys("")) == []

    def test_blob_missing_key_is_none(self, blob_factory: BlobFactory) -> None:
        blob = blob_factory()
        assert blob.get("nope") is None
        assert blob.get("no/such/nested/key") is None

    def test_blob_set_get_overwrite(self, blob_factory: BlobFactory) -> None:
        blob = blob_factory()
        blob.set("k", b"one")
        assert blob.get("k") == b"one"
        blob.set("k", b"two, longer")
        assert blob.get("k") == b"two, longer"
        blob.set("k", b"3")
        assert blob.get("k") == b"3"

    def test_blob_empty_value(self, blob_factory: BlobFactory) -> None:
        blob = blob_factory()
        blob.set("empty", b"")
        assert blob.get("empty") == b""
        assert list(blob.list_keys("empty")) == ["empty"]

    def test_blob_large_value(self, blob_factory: BlobFactory) -> None:
        blob = blob_factory()
        value = random.Random(5).randbytes(5 * 1024 * 1024 + 17)
        blob.set("big/value", value)
        assert blob.get("big/value") == value

    def test_blob_delete(self, blob_factory: BlobFactory) -> None:
        blob = blob_factory()
        blob.set("a/b", b"x")
        blob.delete("a/b")
        assert blob.get("a/b") is None
        assert list(blob.list_keys("")) == []
        blob.delete("a/b")  # missing: not an error
        blob.delete("never/was")
        blob.set("a/b", b"again")
        assert blob.get("a/b") == b"again"

    def test_blob_delete_many(self, blob_factory: BlobFactory) -> None:
        blob = blob_factory()
        keys = [f"q/pending/{i:04d}" for i in range(12)]
        for k in keys:
            blob.set(k, k.encode())
        blob.set("q/kept", b"kept")
        blob.delete_many([*keys[:10], "q/never/was"])  # a missing key is not an error
        assert sorted(blob.list_keys("q/")) == ["q/kept", *keys[10:]]
        assert blob.get(keys[0]) is None and blob.get(keys[11]) == keys[11].encode()
        blob.delete_many([])  # nothing: not an error
        blob.delete_many(keys)  # some already gone
        assert list(blob.list_keys("q/")) == ["q/kept"]

    def test_blob_nested_keys_and_list(self, blob_factory: BlobFactory) -> None:
        blob = blob_factory()
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

    def test_blob_key_that_is_also_a_directory(self, blob_factory: BlobFactory) -> None:
        """``a`` and ``a/b`` both: allowed iff ``keys_nest``; refused without a change otherwise."""
        blob = blob_factory()
        blob.set("a", b"file")
        blob.set("d/e", b"x")
        if blob.keys_nest:
            blob.set("a/b", b"nested")
            blob.set("d", b"parent")
            assert (blob.get("a"), blob.get("a/b"), blob.get("d"), blob.get("d/e")) == (
                b"file",
                b"nested",
                b"parent",
                b"x",
            )
            assert sorted(blob.list_keys("")) == ["a", "a/b", "d", "d/e"]
            return
        pytest = _pytest()
        with pytest.raises(InvalidUsage):
            blob.set("a/b", b"nested")
        with pytest.raises(InvalidUsage):
            blob.set("d", b"parent")
        assert (blob.get("a"), blob.get("d/e")) == (b"file", b"x")
        assert sorted(blob.list_keys("")) == ["a", "d/e"]

    def test_blob_set_visible_to_another_client(self, blob_factory: BlobFactory) -> None:
        one, other = blob_factory(), blob_factory()
        one.set("shared", b"from one")
        assert other.get("shared") == b"from one"
        other.set("shared", b"from two")
        assert one.get("shared") == b"from two"


class ConsensusConformance:
    """The :class:`~persist.location.Consensus` contract, as pytest tests.

    Subclass it in a ``Test...`` class that provides the fixture
    ``consensus_factory`` (a :data:`ConsensusFactory`; see the module doc).
    """

    def test_consensus_capabilities_are_declared(self, consensus_factory: ConsensusFactory) -> None:
        c = consensus_factory()
        for flag in (c.checks_expectation, c.detects_truncated, c.lists_keys):
            assert isinstance(flag, bool)

    def test_consensus_empty_key(self, consensus_factory: ConsensusFactory) -> None:
        c = consensus_factory()
        assert c.head("k") is None
        assert c.scan("k", 1, 10) == []
        if c.lists_keys:
            assert list(c.list_keys()) == []
        else:
            with _pytest().raises(NotImplementedError):
                c.list_keys()

    def test_consensus_first_write_uses_none(self, consensus_factory: ConsensusFactory) -> None:
        c = consensus_factory()
        assert c.compare_and_set("k", None, b"first") is COMMITTED
        head = c.head("k")
        assert head is not None and (head.seqno, head.data) == (1, b"first")
        assert c.compare_and_set("k", 1, b"second") is COMMITTED
        head = c.head("k")
        assert head is not None and (head.seqno, head.data) == (2, b"second")

    def test_consensus_none_mismatches_when_versions_exist(self, consensus_factory: ConsensusFactory) -> None:
        c = consensus_factory()
        write_versions(c, "k", 2)
        assert c.compare_and_set("k", None, b"again") is MISMATCH
        head = c.head("k")
        assert head is not None and (head.seqno, head.data) == (2, b"v2")

    def test_consensus_stale_expectation_mismatches(self, consensus_factory: ConsensusFactory) -> None:
        c = consensus_factory()
        write_versions(c, "k", 3)
        assert c.compare_and_set("k", 1, b"stale") is MISMATCH
        assert c.compare_and_set("k", 2, b"stale") is MISMATCH
        head = c.head("k")
        assert head is not None and (head.seqno, head.data) == (3, b"v3")
        assert [v.seqno for v in c.scan("k", 1, 10)] == [1, 2, 3]

    def test_consensus_expectation_ahead_of_head_mismatches(self, consensus_factory: ConsensusFactory) -> None:
        c = consensus_factory()
        if not c.checks_expectation:
            _pytest().skip(
                "checks_expectation is False: compare-and-set is put-if-absent only "
                "(see the SUBTLE note on Consensus)"
            )
        assert c.compare_and_set("k", 1, b"ahead") is MISMATCH
        assert c.head("k") is None
        write_versions(c, "k", 3)
        assert c.compare_and_set("k", 5, b"ahead") is MISMATCH
        assert c.scan("k", 1, 10)[-1].seqno == 3

    def test_consensus_arbitrary_bytes(self, consensus_factory: ConsensusFactory) -> None:
        c = consensus_factory()
        payloads = [b"", bytes(range(256)), b"\x00" * 1000, random.Random(1).randbytes(100_000)]
        for i, p in enumerate(payloads):
            assert c.compare_and_set("bytes", i or None, p) is COMMITTED
        assert [v.data for v in c.scan("bytes", 1, 10)] == payloads

    def test_consensus_scan_order_and_limit(self, consensus_factory: ConsensusFactory) -> None:
        c = consensus_factory()
        write_versions(c, "k", 12)
        assert [(v.seqno, v.data) for v in c.scan("k", 1, 100)] == [
            (s, f"v{s}".encode()) for s in range(1, 13)
        ]
        assert [v.seqno for v in c.scan("k", 4, 3)] == [4, 5, 6]
        assert [v.seqno for v in c.scan("k", 10, 100)] == [10, 11, 12]
        assert [v.seqno for v in c.scan("k", 12, 1)] == [12]
        assert [v.seqno for v in c.scan("k", 0, 2)] == [1, 2]
        assert c.scan("k", 13, 10) == []
        assert c.scan("k", 1, 0) == []

    def test_consensus_truncate(self, consensus_factory: ConsensusFactory) -> None:
        c = consensus_factory()
        write_versions(c, "k", 5)
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

    def test_consensus_truncate_never_deletes_the_head(self, consensus_factory: ConsensusFactory) -> None:
        c = consensus_factory()
        pytest = _pytest()
        with pytest.raises(InvalidUsage, match="latest version"):
            c.truncate("missing", 1)
        write_versions(c, "k", 3)
        with pytest.raises(InvalidUsage, match="latest version"):
            c.truncate("k", 4)
        with pytest.raises(InvalidUsage):
            c.truncate("k", 100)
        assert [v.seqno for v in c.scan("k", 1, 10)] == [1, 2, 3]

    def test_consensus_none_after_truncation(self, consensus_factory: ConsensusFactory) -> None:
        c = consensus_factory()
        if not c.detects_truncated:
            _pytest().skip(
                "detects_truncated is False: a truncated version looks never written "
                "(SUBTLE note on Consensus)"
            )
        write_versions(c, "k", 3)
        c.truncate("k", 3)
        assert c.compare_and_set("k", None, b"reborn?") is MISMATCH
        assert c.compare_and_set("k", 1, b"stale") is MISMATCH
        head = c.head("k")
        assert head is not None and head.seqno == 3

    def test_consensus_keys_are_independent(self, consensus_factory: ConsensusFactory) -> None:
        c = consensus_factory()
        keys = ["a", "a/b", "a/b/c", "shard/s 1%x", "ü-ñ", "00000000000000000001"]
        for n, k in enumerate(keys, start=1):
            write_versions(c, k, n, tag=f"{k}:")
        for n, k in enumerate(keys, start=1):
            head = c.head(k)
            assert head is not None and (head.seqno, head.data) == (n, f"{k}:{n}".encode())
            assert [v.seqno for v in c.scan(k, 1, 100)] == list(range(1, n + 1))
        if c.lists_keys:
            assert sorted(c.list_keys()) == sorted(keys)
        c.truncate("a/b/c", 3)
        assert c.head("a") is not None and c.head("a/b") is not None
        assert [v.seqno for v in c.scan("a/b", 1, 10)] == [1, 2]

    def test_consensus_visible_to_another_client(self, consensus_factory: ConsensusFactory) -> None:
        one, other = consensus_factory(), consensus_factory()
        assert one.compare_and_set("k", None, b"one") is COMMITTED
        assert other.compare_and_set("k", None, b"other") is MISMATCH
        head = other.head("k")
        assert head is not None and head.data == b"one"
        assert other.compare_and_set("k", 1, b"two") is COMMITTED
        head = one.head("k")
        assert head is not None and (head.seqno, head.data) == (2, b"two")

    def test_consensus_thread_race(self, consensus_factory: ConsensusFactory) -> None:
        race_compare_and_set(consensus_factory(), "race", threads=8, rounds=30)
