"""Shared fixtures: a moto S3 server, fresh S3 buckets, and one URL per backend.

The moto server runs in this process (a thread), on 127.0.0.1 with a port
the OS picks, with fake credentials in the environment. It is started only
by tests that ask for S3.

SUBTLE: moto's S3 PUT handler checks ``If-None-Match: *`` and then stores the
object without holding any lock, so two racing conditional PUTs of the same
key can both succeed, which real S3 never allows. :func:`_atomic_moto_puts`
makes the check-and-store atomic by running moto's
``moto.s3.responses.S3Response.put_object`` (the server-side PutObject
handler, which does both) under one process-wide lock. It patches moto, not
persist: our backends run unchanged against it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

_FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_SECURITY_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    # Keep a developer's own AWS config out of the tests.
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}
_UNSET_AWS_ENV = ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION")

_MOTO_PUT_LOCK = threading.Lock()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "s3: needs the moto S3 server (started in-process)")
    config.addinivalue_line("markers", "spark: needs pyspark and a local Spark session")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")


@contextlib.contextmanager
def _atomic_moto_puts() -> Iterator[None]:
    """Run moto's server-side PutObject handler under ``_MOTO_PUT_LOCK``."""
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


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of an in-process moto server with atomic conditional PUTs."""
    from moto.server import ThreadedMotoServer

    # One INFO line per request from werkzeug is noise in test reports.
    werkzeug_log = logging.getLogger("werkzeug")
    old_level = werkzeug_log.level
    werkzeug_log.setLevel(logging.WARNING)
    with pytest.MonkeyPatch.context() as mp, _atomic_moto_puts():
        # Fake credentials must be in place before any client is created.
        for name, value in _FAKE_AWS_ENV.items():
            mp.setenv(name, value)
        for name in _UNSET_AWS_ENV:
            mp.delenv(name, raising=False)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        try:
            host, port = server.get_host_and_port()
            yield f"http://{host}:{port}"
        finally:
            server.stop()
            werkzeug_log.setLevel(old_level)


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
