"""Test support shipped with persist: an S3 server on loopback that behaves like S3.

Used by the test suite and the benchmarks (and usable by anyone testing code
on persist). Needs the ``dev`` extra (moto).

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
import logging
import os
import threading
from collections.abc import Iterator
from typing import Any

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
    PUTs are atomic (see the module doc).
    """
    from moto.server import ThreadedMotoServer

    werkzeug_log = logging.getLogger("werkzeug")  # one INFO line per request is noise
    old_level = werkzeug_log.level
    werkzeug_log.setLevel(logging.WARNING)
    with fake_aws_env(), atomic_moto_puts():
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        try:
            host, port = server.get_host_and_port()
            yield f"http://{host}:{port}"
        finally:
            server.stop()
            werkzeug_log.setLevel(old_level)
