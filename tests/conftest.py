"""Fixtures for every test: a moto S3 server, fresh buckets, and stores by URL, per backend.

The moto server (:func:`persist.testing.moto_server`) runs in this process,
on 127.0.0.1 with a port the OS picks, with fake credentials in the
environment and conditional PUTs made atomic as on real S3. It is started
only by tests that ask for S3 (and the Spark session, see tests/spark).

Stores: ``location_url`` (mem, file and s3: a test taking it runs once per
backend) and ``location`` (that store, opened); ``durable_url`` (file and
s3: the backends other processes can reach); ``mem_url`` and ``file_url``
(one backend). Each is a fresh, empty store.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# (before anything imports it: its conformance suite's asserts then report like the tests')
pytest.register_assert_rewrite("persist.testing")

from persist.testing import moto_server  # noqa: E402 - after register_assert_rewrite
from persist.url import Location, open_location  # noqa: E402
from tests import helpers  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "s3: needs the moto S3 server (started in-process)")
    config.addinivalue_line("markers", "spark: needs pyspark and a local Spark session")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")


# ---- S3 on moto ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of an in-process moto server with atomic conditional PUTs."""
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def s3_admin(moto_endpoint: str) -> Iterator[Any]:
    """A plain boto3 client on the moto server, for creating buckets."""
    import boto3

    client = boto3.session.Session().client(
        "s3", endpoint_url=moto_endpoint, region_name="us-east-1"
    )
    yield client
    client.close()


@pytest.fixture
def s3_bucket_factory(s3_admin: Any) -> Callable[..., str]:
    """A function creating a fresh, empty bucket (its name starts with ``prefix``) and returning its name."""

    def make(prefix: str = "test") -> str:
        bucket = f"{prefix}-{uuid.uuid4().hex[:24]}"
        s3_admin.create_bucket(Bucket=bucket)
        return bucket

    return make


@pytest.fixture
def s3_url_factory(moto_endpoint: str, s3_bucket_factory: Callable[..., str]) -> Callable[..., str]:
    """A function creating a fresh bucket and returning an ``s3://`` URL into it (under ``prefix``)."""

    def make(prefix: str = "root") -> str:
        bucket = s3_bucket_factory()
        return f"s3://{bucket}/{prefix}?endpoint_url={moto_endpoint}&region=us-east-1"

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
    factory: Callable[..., str] = request.getfixturevalue("s3_url_factory")
    return factory()


@pytest.fixture(params=["mem", "file", pytest.param("s3", marks=pytest.mark.s3)])
def location_url(request: pytest.FixtureRequest) -> str:
    """A URL of a fresh, empty store, once per backend kind."""
    return _store_url(request, request.param)


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def durable_url(request: pytest.FixtureRequest) -> str:
    """A URL of a fresh, empty store other processes can reach, once per backend kind (file, s3)."""
    return _store_url(request, request.param)


@pytest.fixture
def location(location_url: str) -> Iterator[Location]:
    """The store of ``location_url``, opened (closed after the test)."""
    loc = open_location(location_url)
    yield loc
    loc.close()
