"""Shared fixtures: a moto S3 server, fresh S3 buckets, and one URL per backend.

The moto server (:func:`persist.testing.moto_server`) runs in this process,
on 127.0.0.1 with a port the OS picks, with fake credentials in the
environment and conditional PUTs made atomic as on real S3. It is started
only by tests that ask for S3.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from persist.testing import moto_server


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "s3: needs the moto S3 server (started in-process)")
    config.addinivalue_line("markers", "spark: needs pyspark and a local Spark session")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")


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
def s3_url_factory(moto_endpoint: str, s3_admin: Any) -> Callable[..., str]:
    """A function creating a fresh bucket and returning an ``s3://`` URL into it."""

    def make(prefix: str = "root") -> str:
        bucket = f"test-{uuid.uuid4().hex[:24]}"
        s3_admin.create_bucket(Bucket=bucket)
        return f"s3://{bucket}/{prefix}?endpoint_url={moto_endpoint}&region=us-east-1"

    return make


@pytest.fixture(params=["mem", "file", pytest.param("s3", marks=pytest.mark.s3)])
def location_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL of a fresh, empty store, once per backend kind."""
    kind = request.param
    if kind == "mem":
        return f"mem://test-{uuid.uuid4().hex}"
    if kind == "file":
        return f"file://{tmp_path / 'store'}"
    factory: Callable[..., str] = request.getfixturevalue("s3_url_factory")
    return factory()
