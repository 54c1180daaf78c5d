"""Shared helpers for the benchmarks: a moto S3 server, request counting, memory, tables.

Counting happens at two levels:

- **wire** (S3 only): handlers on the botocore client that persist itself
  created (``client.location.blob._client``), registered for ``before-send``
  (once per HTTP attempt, retries included) and ``response-received`` (once
  per attempt, with the status). Bytes are the ``Content-Length`` of the
  request and response bodies, i.e. what went over the wire (headers are not
  counted). Categories are ``<METHOD> <area>``, where the area is
  ``consensus`` (shard state versions), ``blob`` (data parts) or ``bucket``.
- **logical** (every backend): wrappers around the location's ``Blob`` and
  ``Consensus`` counting calls (``cas``, ``head``, ``blob set`` ...) and the
  bytes they carry. On ``mem://`` and ``file://`` this is the only level; on
  S3 one ``head`` is a LIST plus a GET on the wire.

The moto server runs in a child process (so it does not take the measured
process's GIL) on 127.0.0.1 with a port the OS picks, with fake credentials
in the environment. Its app is served by cheroot, which keeps connections
alive as S3 does (:func:`persist.testing.moto_server`); ``server="werkzeug"``
serves it on moto's own server instead, which closes every connection. It
shares the machine's 2 cores with the benchmark, and its per-request latency
(a few ms) is nothing like real S3's (tens of ms): request and byte counts
carry over to S3, times do not. SUBTLE: moto's PutObject handler checks
``If-None-Match: *`` and stores the object without a lock, so two racing
conditional PUTs can both win; :func:`moto_server` serializes moto's
server-side handler with one lock (:mod:`persist.testing`, shared with the
tests) so that the compare-and-set arbitration is atomic, like real S3's.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

if __name__ == "__main__":  # run as the moto server's child process
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from persist import PersistClient, PersistConfig
from persist.location import Blob, CaSResult, Consensus, VersionedData
from persist.testing import atomic_moto_puts, fake_aws_env
from persist.testing import moto_server as in_process_moto
from persist.url import Location, open_location

MB = 1 << 20


# ---- moto ------------------------------------------------------------------------------


MOTO_SERVERS = ("cheroot", "werkzeug")
"""What serves moto's app: ``cheroot`` (:func:`persist.testing.moto_server`, connections kept
alive, what the tests use) or ``werkzeug`` (moto's own server, which closes every connection
after its response; the baseline of ``bench_moto_cost.py``)."""


@contextlib.contextmanager
def moto_server(in_process: bool = False, server: str = "cheroot") -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a moto S3 server with atomic conditional PUTs.

    By default the server runs in a child process (this module run with
    ``--moto-server``), so that it does not compete with the measured client
    for this process's GIL; it still shares the machine's cores. ``server``:
    one of :data:`MOTO_SERVERS`.
    """
    if server not in MOTO_SERVERS:
        raise ValueError(f"moto server {server!r}: expected one of {', '.join(MOTO_SERVERS)}")
    with fake_aws_env():
        if in_process:
            with _moto(server) as endpoint:
                _warm_up(endpoint)
                yield endpoint
            return
        proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--moto-server", server],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            endpoint = proc.stdout.readline().strip()
            if not endpoint.startswith("http://"):
                raise RuntimeError(f"moto server did not start (said {endpoint!r})")
            _warm_up(endpoint)
            yield endpoint
        finally:
            if proc.stdin is not None:
                proc.stdin.close()  # the child exits when its stdin closes
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _moto(server: str) -> contextlib.AbstractContextManager[str]:
    return in_process_moto() if server == "cheroot" else _werkzeug_moto()


@contextlib.contextmanager
def _werkzeug_moto() -> Iterator[str]:
    """moto's own server (werkzeug's), with the tests' atomic conditional PUTs: the old baseline."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one INFO line per request
    with fake_aws_env(), atomic_moto_puts():
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        try:
            host, port = server.get_host_and_port()
            yield f"http://{host}:{port}"
        finally:
            server.stop()


def _serve_moto_until_stdin_closes(server: str) -> None:
    with _moto(server) as endpoint:
        print(endpoint, flush=True)
        sys.stdin.read()


def _warm_up(endpoint: str) -> None:
    """One of each request kind, so moto's lazy imports are not billed to the first measurement."""
    import boto3
    from botocore.exceptions import ClientError

    c = boto3.session.Session().client("s3", endpoint_url=endpoint, region_name="us-east-1")
    c.create_bucket(Bucket="bench-warm-up")
    c.put_object(Bucket="bench-warm-up", Key="k/00000000000000000001", Body=b"x", IfNoneMatch="*")
    with contextlib.suppress(ClientError):
        c.put_object(Bucket="bench-warm-up", Key="k/00000000000000000001", Body=b"x", IfNoneMatch="*")
    c.get_object(Bucket="bench-warm-up", Key="k/00000000000000000001")["Body"].read()
    c.list_objects_v2(Bucket="bench-warm-up", Prefix="k/", Delimiter="/")
    c.delete_objects(Bucket="bench-warm-up", Delete={"Objects": [{"Key": "k/00000000000000000001"}]})
    c.close()


def new_bucket_url(endpoint: str, prefix: str = "bench") -> str:
    """Create a fresh bucket on ``endpoint``; return an ``s3://`` URL into it."""
    import boto3

    bucket = f"bench-{uuid.uuid4().hex[:20]}"
    admin = boto3.session.Session().client("s3", endpoint_url=endpoint, region_name="us-east-1")
    admin.create_bucket(Bucket=bucket)
    admin.close()
    return f"s3://{bucket}/{prefix}?endpoint_url={endpoint}&region=us-east-1"


# ---- counting --------------------------------------------------------------------------


@dataclass
class Stat:
    """Requests (or calls) and body bytes of one category."""

    requests: int = 0
    bytes_out: int = 0
    bytes_in: int = 0

    def __sub__(self, other: Stat) -> Stat:
        return Stat(self.requests - other.requests, self.bytes_out - other.bytes_out, self.bytes_in - other.bytes_in)

    def __add__(self, other: Stat) -> Stat:
        return Stat(self.requests + other.requests, self.bytes_out + other.bytes_out, self.bytes_in + other.bytes_in)


Snapshot = dict[str, Stat]


def diff(after: Snapshot, before: Snapshot) -> Snapshot:
    """``after - before`` per category, dropping categories that did not change."""
    out: Snapshot = {}
    for k, v in after.items():
        d = v - before.get(k, Stat())
        if d.requests or d.bytes_out or d.bytes_in:
            out[k] = d
    return out


def total(s: Snapshot, pred: Callable[[str], bool] = lambda _k: True) -> Stat:
    out = Stat()
    for k, v in s.items():
        if pred(k):
            out = out + v
    return out


class Counter:
    """Thread-safe counts per category, plus the most requests of a category in flight at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stats: dict[str, Stat] = {}
        self._inflight: dict[str, int] = {}
        self.max_inflight: dict[str, int] = {}

    def add(self, cat: str, requests: int = 0, bytes_out: int = 0, bytes_in: int = 0) -> None:
        with self._lock:
            s = self._stats.setdefault(cat, Stat())
            s.requests += requests
            s.bytes_out += bytes_out
            s.bytes_in += bytes_in

    def enter(self, cat: str) -> None:
        with self._lock:
            n = self._inflight.get(cat, 0) + 1
            self._inflight[cat] = n
            self.max_inflight[cat] = max(self.max_inflight.get(cat, 0), n)

    def leave(self, cat: str) -> None:
        with self._lock:
            self._inflight[cat] = self._inflight.get(cat, 1) - 1

    def reset_inflight(self) -> None:
        with self._lock:
            self.max_inflight = {}

    def snapshot(self) -> Snapshot:
        with self._lock:
            return {k: Stat(v.requests, v.bytes_out, v.bytes_in) for k, v in self._stats.items()}


def _area(url: str) -> str:
    parts = urlsplit(url)
    path = unquote(parts.path)
    q = parse_qs(parts.query)
    where = path + " " + " ".join(unquote(p) for p in q.get("prefix", []))
    if "/consensus/" in where:
        return "consensus"
    if "/blob/" in where:
        return "blob"
    if "delete" in q:
        return "multi"
    return "bucket"


_VERB = {
    "PutObject": "PUT",
    "GetObject": "GET",
    "ListObjectsV2": "LIST",
    "ListObjects": "LIST",
    "DeleteObject": "DELETE",
    "DeleteObjects": "DELETE",
    "HeadBucket": "HEAD",
    "HeadObject": "HEAD",
}


class WireCounter(Counter):
    """Counts the HTTP requests a botocore client sends, per ``<VERB> <area>``.

    Lost compare-and-sets (HTTP 412/409 on a consensus PUT) are also counted
    under ``PUT consensus (lost)``; they are included in ``PUT consensus``.
    """

    def __init__(self, client: Any) -> None:
        super().__init__()
        self._local = threading.local()
        uid = uuid.uuid4().hex
        client.meta.events.register("before-send.s3", self._before_send, unique_id=f"bench-send-{uid}")
        client.meta.events.register("response-received.s3", self._received, unique_id=f"bench-recv-{uid}")

    def _before_send(self, request: Any, event_name: str, **_kw: Any) -> None:
        op = event_name.rsplit(".", 1)[-1]
        cat = f"{_VERB.get(op, op)} {_area(request.url)}"
        n = request.headers.get("Content-Length")
        if n is None:
            body = request.body
            n = len(body) if isinstance(body, (bytes, bytearray)) else 0
        self._local.cat = cat
        self.add(cat, requests=1, bytes_out=int(n))
        self.enter(cat)

    def _received(self, response_dict: dict | None, exception: Exception | None, **_kw: Any) -> None:
        cat = getattr(self._local, "cat", "?")
        self.leave(cat)
        if response_dict is None:
            self.add(cat + " (error)", requests=1)
            return
        n = int(response_dict.get("headers", {}).get("content-length", 0) or 0)
        self.add(cat, bytes_in=n)
        status = int(response_dict.get("status_code", 0))
        if status in (409, 412):
            self.add(cat + " (lost)", requests=1)
        elif status >= 300 and status != 404:
            self.add(f"{cat} ({status})", requests=1)


class CountingBlob(Blob):
    """A ``Blob`` that counts its calls in ``counter`` (``blob set`` / ``blob get`` / ...)."""

    def __init__(self, inner: Blob, counter: Counter) -> None:
        self.inner, self.counter = inner, counter
        self.keys_nest = inner.keys_nest  # capabilities: those of what is wrapped

    def get(self, key: str) -> bytes | None:
        v = self.inner.get(key)
        self.counter.add("blob get", 1, 0, len(v) if v else 0)
        return v

    def set(self, key: str, value: bytes) -> None:
        self.counter.enter("blob set")
        try:
            self.inner.set(key, value)
        finally:
            self.counter.leave("blob set")
        self.counter.add("blob set", 1, len(value), 0)

    def delete(self, key: str) -> None:
        self.inner.delete(key)
        self.counter.add("blob delete", 1)

    def list_keys(self, prefix: str) -> Iterator[str]:
        self.counter.add("blob list", 1)
        return self.inner.list_keys(prefix)

    def close(self) -> None:
        self.inner.close()


class CountingConsensus(Consensus):
    """A ``Consensus`` that counts its calls (``cas``, ``cas lost``, ``head``, ``scan``, ``truncate``)."""

    def __init__(self, inner: Consensus, counter: Counter) -> None:
        self.inner, self.counter = inner, counter
        self.checks_expectation = inner.checks_expectation  # capabilities: those of what is wrapped
        self.detects_truncated = inner.detects_truncated
        self.lists_keys = inner.lists_keys

    def head(self, key: str, hint: int | None = None) -> VersionedData | None:
        v = self.inner.head(key, hint)
        self.counter.add("head", 1, 0, len(v.data) if v else 0)
        return v

    def compare_and_set(self, key: str, expected: int | None, data: bytes) -> CaSResult:
        r = self.inner.compare_and_set(key, expected, data)
        self.counter.add("cas", 1, len(data), 0)
        if r is CaSResult.MISMATCH:
            self.counter.add("cas lost", 1)
        return r

    def scan(self, key: str, from_seqno: int, limit: int) -> list[VersionedData]:
        vs = self.inner.scan(key, from_seqno, limit)
        self.counter.add("scan", 1, 0, sum(len(v.data) for v in vs))
        return vs

    def truncate(self, key: str, seqno: int) -> int:
        self.counter.add("truncate", 1)
        return self.inner.truncate(key, seqno)

    def list_keys(self) -> Iterator[str]:
        return self.inner.list_keys()

    def close(self) -> None:
        self.inner.close()


@dataclass
class Counted:
    """A persist client on a location, with its logical counter and (on S3) its wire counter."""

    client: PersistClient
    logical: Counter
    wire: WireCounter | None

    @property
    def backend(self) -> str:
        return self.client.url.split("://", 1)[0]

    def snapshot(self) -> Snapshot:
        """Wire counts on S3 (the truth), logical counts elsewhere."""
        return (self.wire or self.logical).snapshot()

    def both(self) -> tuple[Snapshot, Snapshot]:
        return self.logical.snapshot(), (self.wire.snapshot() if self.wire else {})


def open_counted(url: str, config: PersistConfig | None = None) -> Counted:
    """A ``PersistClient`` on ``url`` whose storage calls (and, on S3, HTTP requests) are counted."""
    loc = open_location(url)
    logical = Counter()
    wire = None
    if url.startswith("s3://"):
        wire = WireCounter(loc.blob._client)  # type: ignore[attr-defined]  # the client persist made
    counted = Location(loc.url, CountingBlob(loc.blob, logical), CountingConsensus(loc.consensus, logical))
    return Counted(PersistClient(counted, config), logical, wire)


@dataclass
class Measured:
    """What one measured block cost: counts per category, seconds."""

    counts: Snapshot = field(default_factory=dict)
    logical: Snapshot = field(default_factory=dict)
    seconds: float = 0.0


@contextlib.contextmanager
def measure(c: Counted) -> Iterator[Measured]:
    """Counts (wire on S3, else logical) and wall time of the block."""
    m = Measured()
    log0, wire0 = c.both()
    t0 = time.perf_counter()
    try:
        yield m
    finally:
        m.seconds = time.perf_counter() - t0
        log1, wire1 = c.both()
        m.logical = diff(log1, log0)
        m.counts = diff(wire1, wire0) if c.wire else m.logical


class Attribution:
    """Requests made inside wrapped methods (e.g. ``WriteHandle.maintain``), kept apart.

    Wrap methods with :meth:`wrap`; every call's counts (wire on S3, else
    logical) are added to :attr:`total`. The counts are process-wide, so this
    is exact only while one thread is working (the sections that use it are
    single-threaded). Nested wrapped calls are counted once.
    """

    def __init__(self, counted: Counted) -> None:
        self.counted = counted
        self.total: Snapshot = {}
        self._lock = threading.Lock()
        self._local = threading.local()

    def wrap(self, obj: object, name: str) -> None:
        original = getattr(obj, name)
        if getattr(original, "_bench_wrapped", False):
            return

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if getattr(self._local, "inside", False):
                return original(*args, **kwargs)
            self._local.inside = True
            before = self.counted.snapshot()
            try:
                return original(*args, **kwargs)
            finally:
                d = diff(self.counted.snapshot(), before)
                self._local.inside = False
                with self._lock:
                    for k, v in d.items():
                        self.total[k] = self.total.get(k, Stat()) + v

        wrapped._bench_wrapped = True  # type: ignore[attr-defined]
        setattr(obj, name, wrapped)

    def snapshot(self) -> Snapshot:
        with self._lock:
            return {k: Stat(v.requests, v.bytes_out, v.bytes_in) for k, v in self.total.items()}


def fmt_counts(s: Snapshot, with_bytes: bool = True) -> str:
    """``PUT consensus x1 (2.1 KB out), LIST consensus x1 ...`` sorted by category."""
    if not s:
        return "(none)"
    out = []
    for k in sorted(s):
        v = s[k]
        b = ""
        if with_bytes and (v.bytes_out or v.bytes_in):
            bits = []
            if v.bytes_out:
                bits.append(f"{human_bytes(v.bytes_out)} out")
            if v.bytes_in:
                bits.append(f"{human_bytes(v.bytes_in)} in")
            b = f" ({', '.join(bits)})"
        out.append(f"{k} x{v.requests}{b}")
    return ", ".join(out)


# ---- memory ----------------------------------------------------------------------------


def _status_kb(field_name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    return 0


def rss_bytes() -> int:
    """Current resident set size (VmRSS)."""
    return _status_kb("VmRSS") * 1024


def peak_rss_bytes() -> int:
    """Peak resident set size since the last :func:`reset_peak_rss` (VmHWM)."""
    return _status_kb("VmHWM") * 1024


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0). False if not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


# ---- output ----------------------------------------------------------------------------


def human_bytes(n: float) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def quantile_ms(ordered: list[float], q: float) -> float:
    """The ``q`` quantile (0.5: the median) of ``ordered`` (seconds, sorted) in milliseconds; NaN if empty."""
    return 1000 * ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


def print_table(headers: list[str], rows: list[list[Any]], title: str | None = None) -> None:
    """A Markdown table (pasteable into benchmarks/README.md)."""
    if title:
        print(f"\n### {title}\n")
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in cells:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |")
    print(flush=True)


def load() -> str:
    """The machine's load averages: other work on the 2 cores skews every time measured."""
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min)"


def emit_json(path: str | None, results: dict) -> None:
    """Write ``results`` as JSON to ``path`` (if given), for the README."""
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=2, default=str)
        print(f"results written to {path}")


if __name__ == "__main__" and sys.argv[1:2] == ["--moto-server"]:
    _serve_moto_until_stdin_closes(sys.argv[2])
