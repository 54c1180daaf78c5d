"""Unit tests of :mod:`persist.fault_proxy` (the chaos runs' HTTP proxy before S3): every fault kind happens."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import botocore.config
import pytest
from botocore.exceptions import BotoCoreError, ClientError

from persist.fault_proxy import Fault, FaultPlan, FaultProxy, OutageMode


def _s3(endpoint: str, attempts: int = 1) -> Any:
    """A boto3 client with no retries (so each fault shows), path style."""
    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        config=botocore.config.Config(
            retries={"mode": "standard", "total_max_attempts": attempts},
            s3={"addressing_style": "path"},
            connect_timeout=2,
            read_timeout=10,
        ),
    )


@pytest.fixture
def bucket(s3_bucket_factory: Callable[..., str]) -> str:
    return s3_bucket_factory("proxy")


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_endpoint, seed=1) as p:
        yield p


def _exists(s3_admin: Any, bucket: str, key: str) -> bool:
    try:
        s3_admin.head_object(Bucket=bucket, Key=key)
        return True
    except ClientError:
        return False


@pytest.mark.s3
def test_proxy_passes_through_with_keep_alive(proxy: FaultProxy, bucket: str, s3_admin: Any) -> None:
    c = _s3(proxy.url)
    for i in range(10):
        c.put_object(Bucket=bucket, Key=f"k{i}", Body=b"v" * (i * 1000))
    assert c.get_object(Bucket=bucket, Key="k9")["Body"].read() == b"v" * 9000
    assert c.head_object(Bucket=bucket, Key="k3")["ContentLength"] == 3000
    keys = [o["Key"] for o in c.list_objects_v2(Bucket=bucket)["Contents"]]
    assert keys == sorted(f"k{i}" for i in range(10))
    with pytest.raises(ClientError) as e:  # upstream errors are relayed as they are
        c.put_object(Bucket=bucket, Key="k1", Body=b"x", IfNoneMatch="*")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    n = proxy.counters()
    assert n["requests"] == n["forwarded"] == 14
    assert n["connections"] <= 2  # kept alive
    assert all(n[f.value] == 0 for f in Fault)
    c.close()


@pytest.mark.s3
def test_drop_before_forwarding_never_reaches_upstream(proxy: FaultProxy, bucket: str, s3_admin: Any) -> None:
    c = _s3(proxy.url)
    proxy.force(Fault.DROP_BEFORE)
    with pytest.raises(BotoCoreError, match=r"Connection was closed|reset"):
        c.put_object(Bucket=bucket, Key="dropped", Body=b"never")
    assert not _exists(s3_admin, bucket, "dropped")
    c.put_object(Bucket=bucket, Key="after", Body=b"ok")  # the client reconnects
    n = proxy.counters()
    assert n["drop_before"] == 1 and n["forwarded"] == 1
    c.close()


@pytest.mark.s3
def test_reply_dropped_write_landed(proxy: FaultProxy, bucket: str, s3_admin: Any) -> None:
    """The write lands upstream while the client sees a connection error."""
    c = _s3(proxy.url)
    proxy.force(Fault.DROP_REPLY)
    with pytest.raises(BotoCoreError, match=r"Connection was closed|reset"):
        c.put_object(Bucket=bucket, Key="landed", Body=b"it is there")
    assert s3_admin.get_object(Bucket=bucket, Key="landed")["Body"].read() == b"it is there"
    # a conditional retry then finds it: the classic "412 after a lost reply"
    with pytest.raises(ClientError) as e:
        c.put_object(Bucket=bucket, Key="landed", Body=b"again", IfNoneMatch="*")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert proxy.counters()["drop_reply"] == 1
    c.close()


@pytest.mark.s3
def test_503_is_an_s3_error_without_forwarding(proxy: FaultProxy, bucket: str, s3_admin: Any) -> None:
    c = _s3(proxy.url)
    proxy.force(Fault.ERROR_503, times=2)
    with pytest.raises(ClientError) as e:
        c.put_object(Bucket=bucket, Key="refused", Body=b"x")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert e.value.response["Error"]["Code"] in ("SlowDown", "ServiceUnavailable")
    assert not _exists(s3_admin, bucket, "refused")
    with pytest.raises(ClientError) as e:  # HEAD: no body, and the connection stays usable
        c.head_object(Bucket=bucket, Key="refused")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    c.put_object(Bucket=bucket, Key="fine", Body=b"x")
    n = proxy.counters()
    assert n["error_503"] == 2 and n["forwarded"] == 1 and n["connections"] == 1
    # botocore retries 503s: with retries on, the same fault is survived
    proxy.force(Fault.ERROR_503)
    _s3(proxy.url, attempts=3).put_object(Bucket=bucket, Key="retried", Body=b"y")
    assert _exists(s3_admin, bucket, "retried")
    c.close()


@pytest.mark.s3
def test_truncated_reply_declares_the_full_length(proxy: FaultProxy, bucket: str, s3_admin: Any) -> None:
    s3_admin.put_object(Bucket=bucket, Key="big", Body=b"0123456789" * 100)
    c = _s3(proxy.url)
    proxy.force(Fault.TRUNCATE)
    with pytest.raises(BotoCoreError, match=r"IncompleteRead|Connection broken"):
        c.get_object(Bucket=bucket, Key="big")["Body"].read()
    # raw: the full length is declared, half the body arrives, then the connection ends
    proxy.force(Fault.TRUNCATE)
    url = c.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "big"})
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
    conn.request("GET", url.split(str(proxy.port), 1)[1])
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Content-Length") == "1000"
    with pytest.raises(http.client.IncompleteRead) as e:
        resp.read()
    assert len(e.value.partial) == 500
    conn.close()
    assert proxy.counters()["truncate"] == 2
    c.close()


@pytest.mark.s3
@pytest.mark.parametrize("mode", [OutageMode.DROP, OutageMode.REFUSE])
def test_outage_window(proxy: FaultProxy, bucket: str, mode: OutageMode) -> None:
    c = _s3(proxy.url)
    c.put_object(Bucket=bucket, Key="before", Body=b"x")
    proxy.start_outage(1.0, mode)
    assert proxy.in_outage()
    started = time.monotonic()
    failures = 0
    for _ in range(3):
        with pytest.raises(BotoCoreError):
            c.list_objects_v2(Bucket=bucket)
        failures += 1
    if mode is OutageMode.REFUSE:
        time.sleep(2 * 0.05 + 0.05)  # the accept loop closes the listener
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", proxy.port), timeout=1).close()
    time.sleep(max(0.0, 1.0 - (time.monotonic() - started)) + 0.3)
    assert not proxy.in_outage()
    assert [o["Key"] for o in c.list_objects_v2(Bucket=bucket)["Contents"]] == ["before"]
    n = proxy.counters()
    assert n["outage"] == 1 and n[f"outage_{mode.value}"] == 1
    assert failures == 3
    c.close()


@pytest.mark.s3
def test_random_outages_come_and_go(moto_endpoint: str, bucket: str) -> None:
    plan = FaultPlan(outage_every_s=0.3, outage_s=0.3, outage_mode=OutageMode.MIXED)
    with FaultProxy(moto_endpoint, seed=3, faults=plan) as p:
        c = _s3(p.url)
        ok = failed = 0
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:
            try:
                c.list_objects_v2(Bucket=bucket)
                ok += 1
            except BotoCoreError:
                failed += 1
            time.sleep(0.02)
        assert p.counters()["outage"] >= 2
        assert ok > 0 and failed > 0
        p.set_enabled(False)  # ends the outage at once
        c.list_objects_v2(Bucket=bucket)
        c.close()


def _chunked(parts: list[bytes], trailers: dict[str, str] | None = None) -> bytes:
    out = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts if p)
    out += b"0\r\n" + b"".join(f"{k}: {v}\r\n".encode() for k, v in (trailers or {}).items()) + b"\r\n"
    return out


@pytest.mark.s3
def test_chunked_request_bodies(proxy: FaultProxy, bucket: str, s3_admin: Any) -> None:
    parts = [b"a" * 10, b"b" * 70000, b"c"]
    # http.client's own chunked encoding
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    conn.request("PUT", f"/{bucket}/chunked1", body=iter(parts), encode_chunked=True)
    resp = conn.getresponse()
    resp.read()
    assert resp.status == 200
    # a fault after a chunked request: the whole body was read, the connection stays in sync
    proxy.force(Fault.ERROR_503)
    conn.request("PUT", f"/{bucket}/chunked2", body=iter(parts[:1]), encode_chunked=True)
    r = conn.getresponse()
    assert r.status == 503 and b"<Code>" in r.read()
    conn.request("PUT", f"/{bucket}/chunked2", body=iter([b"hello ", b"world"]), encode_chunked=True)
    r = conn.getresponse()
    r.read()
    assert r.status == 200
    conn.close()
    assert s3_admin.get_object(Bucket=bucket, Key="chunked1")["Body"].read() == b"".join(parts)
    assert s3_admin.get_object(Bucket=bucket, Key="chunked2")["Body"].read() == b"hello world"
    assert proxy.counters()["connections"] == 1


class _RecordingUpstream:
    """A one-request HTTP server on loopback that records the raw request it got (for exact checks)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.sock.settimeout(10)
        self.raw = b""
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        conn.settimeout(10)
        with conn:
            for _ in range(1000):
                data = conn.recv(65536)
                if not data:
                    break
                self.raw += data
                _head, sep, body = self.raw.partition(b"\r\n\r\n")
                if sep and b"\r\n0\r\n" in b"\r\n" + body and body.endswith(b"\r\n\r\n"):
                    break
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    def close(self) -> None:
        self.thread.join(10)
        self.sock.close()


def test_chunked_body_forwarded_with_trailers_and_100_continue() -> None:
    """Chunk extensions are dropped, chunks and trailers forwarded (as aws-chunked needs)."""
    up = _RecordingUpstream()
    try:
        with FaultProxy(up.url) as p:
            sock = socket.create_connection(("127.0.0.1", p.port), timeout=10)
            with sock:
                sock.sendall(
                    b"PUT /b/k HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
                    b"Expect: 100-continue\r\nX-Amz-Trailer: x-amz-checksum-crc32\r\n\r\n"
                )
                assert sock.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
                sock.sendall(b"6;ext=1\r\nhello \r\n5\r\nworld\r\n0\r\nx-amz-checksum-crc32: AAAA\r\n\r\n")
                reply = sock.recv(65536)
            assert reply.startswith(b"HTTP/1.1 200 OK\r\n") and reply.endswith(b"\r\n\r\nok")
            assert b"Content-Length: 2\r\n" in reply
    finally:
        up.close()
    head, _, body = up.raw.partition(b"\r\n\r\n")
    assert head.startswith(b"PUT /b/k HTTP/1.1\r\n")
    assert b"Transfer-Encoding: chunked" in head and b"Expect" not in head and b"Connection: close" in head
    assert body == b"6\r\nhello \r\n5\r\nworld\r\n0\r\nx-amz-checksum-crc32: AAAA\r\n\r\n"


@pytest.mark.s3
def test_conditional_put_cap_answers_slowdown(moto_endpoint: str, bucket: str) -> None:
    with FaultProxy(moto_endpoint, faults=FaultPlan(conditional_puts_per_key_s=1)) as p:
        c = _s3(p.url)
        c.put_object(Bucket=bucket, Key="hot", Body=b"x", IfNoneMatch="*")
        with pytest.raises(ClientError) as e:
            c.put_object(Bucket=bucket, Key="hot", Body=b"x", IfNoneMatch="*")
        assert e.value.response["Error"]["Code"] == "SlowDown"
        c.put_object(Bucket=bucket, Key="other", Body=b"x", IfNoneMatch="*")  # another key: fine
        c.put_object(Bucket=bucket, Key="hot", Body=b"x")  # unconditional: fine
        time.sleep(1.05)
        with pytest.raises(ClientError) as e:  # the window passed: the store answers (412)
            c.put_object(Bucket=bucket, Key="hot", Body=b"x", IfNoneMatch="*")
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
        assert p.counters()["throttled"] == 1
        c.close()


@pytest.mark.s3
def test_latency_and_disabled_faults(moto_endpoint: str, bucket: str) -> None:
    plan = FaultPlan(drop_before=1.0, latency_s=0.2)
    with FaultProxy(moto_endpoint, faults=plan) as p:
        c = _s3(p.url)
        with pytest.raises(BotoCoreError):
            c.list_objects_v2(Bucket=bucket)
        p.set_enabled(False)
        t = time.monotonic()
        c.list_objects_v2(Bucket=bucket)
        assert time.monotonic() - t >= 0.2
        p.set_enabled(True)
        with pytest.raises(BotoCoreError):
            c.list_objects_v2(Bucket=bucket)
        assert p.counters()["drop_before"] == 2
        c.close()


@pytest.mark.s3
def test_random_faults_follow_the_seed(moto_endpoint: str, bucket: str) -> None:
    plan = FaultPlan(drop_before=0.1, drop_reply=0.1, error_503=0.1, truncate=0.1)

    def outcomes(seed: int) -> list[str]:
        out = []
        with FaultProxy(moto_endpoint, seed=seed, faults=plan) as p:
            c = _s3(p.url)
            for _i in range(40):
                try:
                    c.get_object(Bucket=bucket, Key="seeded")["Body"].read()
                    out.append("ok")
                except ClientError as e:
                    out.append(str(e.response["ResponseMetadata"]["HTTPStatusCode"]))
                except BotoCoreError as e:
                    out.append(type(e).__name__)
            c.close()
            n = p.counters()
        assert n["requests"] == 40
        assert sum(n[f.value] for f in Fault) > 0
        return out

    boto3.session.Session().client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").put_object(
        Bucket=bucket, Key="seeded", Body=b"s" * 100
    )
    assert outcomes(5) == outcomes(5)
    assert outcomes(5) != outcomes(6)


@pytest.mark.s3
def test_stop_ends_threads_and_connections(moto_endpoint: str, bucket: str) -> None:
    before = {t.ident for t in threading.enumerate()}
    p = FaultProxy(moto_endpoint)
    with p:
        c = _s3(p.url)
        c.list_objects_v2(Bucket=bucket)  # a kept-alive connection is open now
        port = p.port
    c.close()
    time.sleep(0.1)
    left = [t for t in threading.enumerate() if t.ident not in before and t.name.startswith("fault-proxy")]
    assert left == []
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_fault_plan_is_checked() -> None:
    with pytest.raises(ValueError):
        FaultPlan(drop_before=0.6, drop_reply=0.6)
    with pytest.raises(ValueError):
        FaultPlan(drop_before=-0.1)
    with pytest.raises(ValueError):
        FaultPlan(outage_every_s=0)
    with pytest.raises(ValueError):
        FaultProxy("https://example.com")
    with pytest.raises(ValueError):
        FaultProxy("http://127.0.0.1:1").force(Fault.OUTAGE)
