"""A fault-injecting HTTP/1.1 proxy for testing persist against S3 (moto) under storage faults.

:class:`FaultProxy` listens on ``127.0.0.1`` (a port the OS picks), forwards
every request to one upstream HTTP endpoint (for example a moto server from
:func:`persist.testing.moto_server`) and, as a seeded random plan says,
breaks some of them the ways a real network and a real S3 do::

    plan = FaultPlan(drop_before=0.02, drop_reply=0.02, error_503=0.02, truncate=0.02,
                     outage_every_s=10, outage_s=2)
    with FaultProxy("http://127.0.0.1:5000", seed=7, faults=plan) as proxy:
        url = f"s3://bucket/prefix?endpoint_url={proxy.url}&region=us-east-1"
        ...
        proxy.set_enabled(False)        # pass everything through from now on
        proxy.counters()                # {"requests": ..., "drop_reply": ..., ...}

Fault kinds (:class:`Fault`), each with a per-request probability:

- ``drop_before``: the request is read, then the client connection is closed
  without forwarding it. Nothing happened upstream; the client sees a
  closed or reset connection.
- ``drop_reply``: the request is forwarded and answered upstream, then the
  client connection is closed without answering: *the write landed, the
  reply was lost*.
- ``error_503``: an S3 error reply (HTTP 503, ``SlowDown`` or
  ``ServiceUnavailable``, with the S3 XML error body) without forwarding.
- ``truncate``: the request is forwarded; the reply declares the full
  ``Content-Length`` but only half of the body is sent before the
  connection is closed (replies with an empty body pass unharmed).
- ``outage``: bursts. At random times (mean gap ``outage_every_s``) every
  request for ``outage_s`` seconds is dropped (``drop`` mode: connections
  are accepted and closed) or refused (``refuse`` mode: the listening socket
  is closed, so connecting fails with *connection refused*, then reopened on
  the same port). :meth:`FaultProxy.start_outage` starts one at once.

Extras for benchmarks: ``latency_s`` added before forwarding each request,
and ``conditional_puts_per_key_s``: a cap on conditional PUTs (with
``If-None-Match`` or ``If-Match``) per second per key, beyond which they
are answered ``503 SlowDown`` as S3 does.

Broken stores (``conditional``, a :class:`ConditionalMode`), the two ways
S3-compatible servers have shipped broken conditional writes, for
:mod:`persist.check_store`'s tests:

- ``ignore``: conditional PUTs are forwarded without their ``If-None-Match``
  and ``If-Match`` headers: every one lands, overwriting.
- ``split``: check, then write, not atomically: the proxy asks upstream
  with a ``HEAD`` (signed as the PUT was: for stores that do not check
  signatures) whether the condition holds (answering ``412`` if not),
  sleeps ``split_pause_s``, then forwards the PUT without its conditional
  headers. Racing writers that all pass the check all win.

S3 error replies for exact tests (:meth:`FaultProxy.force` only, never
random): ``error_500`` (``500 InternalError``), ``conflict_409`` (``409
ConditionalRequestConflict``, AWS's answer to a conditional write racing
another of the same key) and ``request_timeout`` (``400 RequestTimeout``),
all without forwarding.

Requests may carry their body with ``Content-Length`` or
``Transfer-Encoding: chunked`` (forwarded chunked, chunk by chunk with the
trailers, so ``aws-chunked`` bodies with trailing checksums stay intact;
chunk extensions are dropped, as moto's server rejects them);
``Expect: 100-continue`` is answered by the proxy. Client connections are kept alive; each request goes upstream on
a fresh connection, so the proxy itself never makes a request ambiguous.
:meth:`FaultProxy.force` queues exact faults for deterministic tests.

Everything is bounded: sockets have timeouts, every loop has a count or a
deadline, and leaving the ``with`` block stops the accept thread and closes
every connection. Only loopback is ever bound. Thread-safe.
"""

from __future__ import annotations

import contextlib
import enum
import random
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from urllib.parse import urlsplit

__all__ = ["ConditionalMode", "Fault", "FaultPlan", "FaultProxy", "OutageMode", "fault_proxy"]

MAX_HEAD_BYTES = 64 << 10
"""The most bytes a request's or a reply's status line plus headers may take."""
MAX_BODY_BYTES = 1 << 30
"""The largest request or reply body the proxy relays."""
MAX_REQUESTS_PER_CONNECTION = 100_000
MAX_CHUNKS = 1_000_000
MAX_HEADERS = 200
CLIENT_IDLE_TIMEOUT_S = 60.0
UPSTREAM_CONNECT_TIMEOUT_S = 5.0
UPSTREAM_READ_TIMEOUT_S = 120.0
ACCEPT_POLL_S = 0.05
STOP_JOIN_S = 5.0
REBIND_ATTEMPTS = 100

_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization", "te", "upgrade"}
)


class Fault(enum.StrEnum):
    """The kinds of injected fault (also the names of their counters)."""

    DROP_BEFORE = "drop_before"
    DROP_REPLY = "drop_reply"
    ERROR_503 = "error_503"
    TRUNCATE = "truncate"
    OUTAGE = "outage"
    ERROR_500 = "error_500"
    CONFLICT_409 = "conflict_409"
    REQUEST_TIMEOUT = "request_timeout"


_ERROR_REPLIES = {
    # fault: (status, reason, code, message), as S3 answers them
    Fault.ERROR_500: (
        500, "Internal Server Error", "InternalError", "We encountered an internal error. Please try again.",
    ),
    Fault.CONFLICT_409: (
        409, "Conflict", "ConditionalRequestConflict",
        "A conflicting conditional operation is currently in progress against this resource. Please try again.",
    ),
    Fault.REQUEST_TIMEOUT: (
        400, "Bad Request", "RequestTimeout",
        "Your socket connection to the server was not read from or written to within the timeout period.",
    ),
}  # fmt: skip


class ConditionalMode(enum.StrEnum):
    """What the proxy does with conditional PUTs (``If-None-Match``/``If-Match``): see the module doc."""

    ENFORCE = "enforce"  # forward them as they are: the upstream store decides
    IGNORE = "ignore"  # strip the conditional headers: every PUT lands
    SPLIT = "split"  # HEAD to check, pause, then PUT unconditionally: not atomic


class OutageMode(enum.StrEnum):
    DROP = "drop"
    REFUSE = "refuse"
    MIXED = "mixed"  # each outage picks drop or refuse at random


@dataclass
class FaultPlan:
    """What to break, and how often. Probabilities are per request; their sum must be at most 1."""

    drop_before: float = 0.0
    drop_reply: float = 0.0
    error_503: float = 0.0
    truncate: float = 0.0
    outage_every_s: float | None = None
    """Mean seconds between outage starts (exponentially distributed); None: no random outages."""
    outage_s: float = 0.0
    """How long each outage lasts."""
    outage_mode: OutageMode = OutageMode.MIXED
    latency_s: float = 0.0
    """Added before forwarding every request (also when faults are disabled)."""
    conditional_puts_per_key_s: int | None = None
    """At most this many conditional PUTs per key per second; beyond: 503 SlowDown (None: no cap)."""
    conditional: ConditionalMode = ConditionalMode.ENFORCE
    """A broken store's conditional writes (applies also when faults are disabled)."""
    split_pause_s: float = 0.05
    """``split`` mode: the pause between the check and the write."""

    def __post_init__(self) -> None:
        probs = (self.drop_before, self.drop_reply, self.error_503, self.truncate)
        if any(p < 0 for p in probs) or sum(probs) > 1.0:
            raise ValueError(f"fault probabilities must be >= 0 and sum to at most 1, got {probs}")
        if self.outage_every_s is not None and self.outage_every_s <= 0:
            raise ValueError("outage_every_s must be positive (or None)")
        if self.outage_s < 0 or self.latency_s < 0 or self.split_pause_s < 0:
            raise ValueError("outage_s, latency_s and split_pause_s must be >= 0")
        if self.conditional_puts_per_key_s is not None and self.conditional_puts_per_key_s < 1:
            raise ValueError("conditional_puts_per_key_s must be >= 1 (or None)")

    @staticmethod
    def none() -> FaultPlan:
        return FaultPlan()


class _Action(enum.Enum):
    FORWARD = "forward"
    DROP_BEFORE = "drop_before"
    DROP_REPLY = "drop_reply"
    ERROR_503 = "error_503"
    TRUNCATE = "truncate"
    OUTAGE_DROP = "outage_drop"
    THROTTLE = "throttle"
    ERROR_500 = "error_500"
    CONFLICT_409 = "conflict_409"
    REQUEST_TIMEOUT = "request_timeout"


class _Closed(Exception):
    """The peer closed the connection (or it timed out) between requests."""


class _BadMessage(Exception):
    """A malformed or oversized HTTP message."""


@dataclass
class _Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]
    body: bytes  # as received (chunked bodies still chunked, trailers included)

    def header(self, name: str) -> str | None:
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None

    @property
    def is_conditional_put(self) -> bool:
        return self.method == "PUT" and (
            self.header("if-none-match") is not None or self.header("if-match") is not None
        )

    @property
    def wants_close(self) -> bool:
        conn = (self.header("connection") or "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" not in conn
        return "close" in conn


@dataclass
class _Reply:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes  # decoded (never chunked)
    bodyless: bool  # HEAD, 1xx, 204, 304: headers relayed as they are, no body


class _Reader:
    """Buffered reads from a socket with bounds on every read."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def _fill(self) -> bool:
        try:
            data = self.sock.recv(65536)
        except (TimeoutError, OSError):
            return False
        if not data:
            return False
        self.buf += data
        return True

    def read_until(self, sep: bytes, limit: int) -> bytes | None:
        """Bytes up to and including ``sep``; None if the connection ended first."""
        start = 0
        while True:
            i = self.buf.find(sep, start)
            if i >= 0:
                out = bytes(self.buf[: i + len(sep)])
                del self.buf[: i + len(sep)]
                return out
            if len(self.buf) > limit:
                raise _BadMessage(f"more than {limit} bytes without {sep!r}")
            start = max(0, len(self.buf) - len(sep) + 1)
            if not self._fill():
                return None

    def read_exact(self, n: int) -> bytes | None:
        while len(self.buf) < n:
            if not self._fill():
                return None
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def read_to_close(self, limit: int) -> bytes:
        while len(self.buf) <= limit and self._fill():
            pass
        if len(self.buf) > limit:
            raise _BadMessage(f"body larger than {limit} bytes")
        out = bytes(self.buf)
        self.buf.clear()
        return out


def _parse_headers(block: bytes) -> tuple[str, list[tuple[str, str]]]:
    """The start line and headers of a message head (which ends with a blank line)."""
    lines = block.decode("latin-1").split("\r\n")
    start = lines[0]
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise _BadMessage(f"bad header line {line[:80]!r}")
        headers.append((name, value.strip()))
        if len(headers) > MAX_HEADERS:
            raise _BadMessage("too many headers")
    return start, headers


def _get(headers: list[tuple[str, str]], name: str) -> str | None:
    name = name.lower()
    for k, v in headers:
        if k.lower() == name:
            return v
    return None


def _is_chunked(headers: list[tuple[str, str]]) -> bool:
    te = _get(headers, "transfer-encoding")
    return te is not None and te.lower().split(",")[-1].strip() == "chunked"


def _read_chunked(reader: _Reader, decode: bool) -> bytes | None:
    """A chunked body, decoded, or (``decode=False``) still chunked with its trailers but
    without chunk extensions. None if the connection ended first."""
    raw = bytearray()
    decoded = bytearray()
    for _ in range(MAX_CHUNKS):
        line = reader.read_until(b"\r\n", 4096)
        if line is None:
            return None
        size_text = line[:-2].split(b";", 1)[0].strip()
        raw += size_text + b"\r\n"
        try:
            size = int(size_text, 16)
        except ValueError:
            raise _BadMessage(f"bad chunk size {size_text[:20]!r}") from None
        if size == 0:
            for _ in range(MAX_HEADERS + 1):  # trailers, then the blank line
                trailer = reader.read_until(b"\r\n", MAX_HEAD_BYTES)
                if trailer is None:
                    return None
                raw += trailer
                if trailer == b"\r\n":
                    return bytes(decoded if decode else raw)
            raise _BadMessage("too many trailers")
        if len(raw) + size > MAX_BODY_BYTES:
            raise _BadMessage("chunked body too large")
        data = reader.read_exact(size + 2)
        if data is None:
            return None
        if data[-2:] != b"\r\n":
            raise _BadMessage("chunk not followed by CRLF")
        raw += data
        decoded += data[:-2]
    raise _BadMessage("too many chunks")


_SIGNING_HEADERS = frozenset({"host", "authorization", "x-amz-date", "x-amz-security-token", "x-amz-content-sha256"})


def _unconditional(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers if k.lower() not in ("if-none-match", "if-match")]


def _error_xml(code: str, message: str, resource: str, request_id: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message><Resource>{_xml_escape(resource)}</Resource>"
        f"<RequestId>{request_id}</RequestId><HostId>fault-proxy</HostId></Error>"
    ).encode()


def _xml_escape(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class FaultProxy:
    """A threaded HTTP/1.1 proxy on ``127.0.0.1`` in front of ``upstream_url``, injecting faults.

    Use as a context manager; ``url`` is ``http://127.0.0.1:PORT``. See the
    module docstring for the fault kinds.
    """

    def __init__(self, upstream_url: str, seed: int = 0, faults: FaultPlan | None = None) -> None:
        parts = urlsplit(upstream_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be an http:// URL, got {upstream_url!r}")
        self.upstream_host: str = parts.hostname
        self.upstream_port: int = parts.port or 80
        self.plan = faults or FaultPlan()
        self.seed = seed
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._enabled = True
        self._counters: dict[str, int] = {}
        self._forced: deque[tuple[Fault, bool]] = deque()  # (fault, conditional PUTs only)
        self._put_times: dict[str, deque[float]] = {}
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._port = 0
        self._accept_thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        # outage state: monotonic end time, mode, and when the next random one starts
        self._outage_until = 0.0
        self._outage_mode: OutageMode | None = None
        self._next_outage_at: float | None = None
        self._rebind_failures = 0

    # ---- lifecycle ---------------------------------------------------------------

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        if self._accept_thread is not None:
            raise RuntimeError("this proxy was already started")
        self._listener = self._listen(0)
        self._port = self._listener.getsockname()[1]
        self._schedule_next_outage(time.monotonic())
        self._accept_thread = threading.Thread(target=self._accept_loop, name=f"fault-proxy-{self._port}", daemon=True)
        self._accept_thread.start()

    def stop(self) -> None:
        """Stop accepting, close every connection, and wait (bounded) for the threads to end."""
        self._stop.set()
        if self._accept_thread is not None:
            self._accept_thread.join(STOP_JOIN_S)
        with self._lock:
            listener, self._listener = self._listener, None
            conns = list(self._conns)
            threads = list(self._threads)
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.close()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                c.close()
        deadline = time.monotonic() + STOP_JOIN_S
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``: use it as the S3 ``endpoint_url``."""
        return f"http://127.0.0.1:{self._port}"

    # ---- control -----------------------------------------------------------------

    def set_enabled(self, enabled: bool) -> None:
        """Turn faults on or off (off: pass everything through; a running outage ends now).

        Turning them off returns once the proxy listens again (at most about a second).
        """
        with self._lock:
            self._enabled = enabled
        if enabled:
            self._schedule_next_outage(time.monotonic())
            return
        self._end_outage()
        deadline = time.monotonic() + 1.0
        while self._listener is None and not self._stop.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)

    @property
    def enabled(self) -> bool:
        return self._enabled

    def force(self, fault: Fault, times: int = 1, conditional_puts_only: bool = False) -> None:
        """Inject ``fault`` into the next ``times`` requests (before any random fault; even when disabled).

        With ``conditional_puts_only``, into the next ``times`` conditional
        PUTs (``If-None-Match`` or ``If-Match``), letting other requests pass.
        ``Fault.OUTAGE`` cannot be forced per request; use :meth:`start_outage`.
        """
        if fault is Fault.OUTAGE:
            raise ValueError("use start_outage() for outages")
        with self._lock:
            self._forced.extend([(fault, conditional_puts_only)] * times)

    def start_outage(self, seconds: float, mode: OutageMode = OutageMode.DROP) -> None:
        """Drop (or refuse) every request for ``seconds`` from now."""
        if mode is OutageMode.MIXED:
            with self._lock:
                mode = self._rng.choice([OutageMode.DROP, OutageMode.REFUSE])
        self._begin_outage(time.monotonic() + seconds, mode)

    def in_outage(self) -> bool:
        return time.monotonic() < self._outage_until

    def counters(self) -> dict[str, int]:
        """Connections accepted, requests seen and forwarded, and faults injected by kind (a copy).

        Besides one counter per :class:`Fault` (``outage`` counts outages
        started, ``outage_drop``/``outage_refuse`` them by mode), there are
        ``outage_dropped`` (requests dropped during outages), ``throttled``
        (conditional PUTs over the cap) and ``upstream_error``.
        """
        with self._lock:
            out = {"requests": 0, "forwarded": 0, **{f.value: 0 for f in Fault}}
            out.update(self._counters)
            return out

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counters[name] = self._counters.get(name, 0) + n

    # ---- outages -----------------------------------------------------------------

    def _schedule_next_outage(self, now: float) -> None:
        every = self.plan.outage_every_s
        with self._lock:
            if every is None or self.plan.outage_s <= 0:
                self._next_outage_at = None
            else:
                self._next_outage_at = now + self._rng.expovariate(1.0 / every)

    def _tick_outages(self) -> None:
        """Start a scheduled random outage or end the current one; open or close the listener to match.

        Run by the accept thread only: it alone touches the listening socket.
        """
        now = time.monotonic()
        if self._outage_mode is not None and now >= self._outage_until:
            self._end_outage()
            self._schedule_next_outage(now)
        nxt = self._next_outage_at
        if self._enabled and self._outage_mode is None and nxt is not None and now >= nxt:
            with self._lock:
                mode = self.plan.outage_mode
                if mode is OutageMode.MIXED:
                    mode = self._rng.choice([OutageMode.DROP, OutageMode.REFUSE])
                self._next_outage_at = None
            self._begin_outage(now + self.plan.outage_s, mode)
        refusing = self._outage_mode is OutageMode.REFUSE
        if refusing and self._listener is not None:
            listener, self._listener = self._listener, None
            with contextlib.suppress(OSError):
                listener.close()
        elif not refusing and self._listener is None and not self._stop.is_set():
            self._rebind()

    def _begin_outage(self, until: float, mode: OutageMode) -> None:
        with self._lock:
            if self._outage_mode is None:
                self._counters[Fault.OUTAGE.value] = self._counters.get(Fault.OUTAGE.value, 0) + 1
            self._counters[f"outage_{mode.value}"] = self._counters.get(f"outage_{mode.value}", 0) + 1
            self._outage_until = until
            self._outage_mode = mode

    def _end_outage(self) -> None:
        with self._lock:
            self._outage_mode = None
            self._outage_until = 0.0

    def _rebind(self) -> None:
        """Listen on the same port again after a refusing outage (one try per tick, counted)."""
        try:
            self._listener = self._listen(self._port)
            self._rebind_failures = 0
        except OSError:
            self._rebind_failures += 1
            if self._rebind_failures == REBIND_ATTEMPTS:
                self._count("rebind_failed")

    @staticmethod
    def _listen(port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
            sock.listen(128)
            sock.settimeout(ACCEPT_POLL_S)
        except OSError:
            sock.close()
            raise
        return sock

    # ---- serving -----------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            self._tick_outages()
            listener = self._listener
            if listener is None:  # refusing: nothing listens
                self._stop.wait(ACCEPT_POLL_S)
                continue
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._listener is listener and not self._stop.is_set():
                    time.sleep(ACCEPT_POLL_S)  # unexpected: do not spin
                continue
            conn.settimeout(CLIENT_IDLE_TIMEOUT_S)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            t = threading.Thread(target=self._serve, args=(conn,), name=f"fault-proxy-conn-{self._port}", daemon=True)
            with self._lock:
                self._conns.add(conn)
                self._threads.add(t)
                self._counters["connections"] = self._counters.get("connections", 0) + 1
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        reader = _Reader(conn)
        try:
            for _ in range(MAX_REQUESTS_PER_CONNECTION):
                if self._stop.is_set():
                    return
                try:
                    req = self._read_request(conn, reader)
                except _Closed:
                    return
                except _BadMessage as e:
                    self._send_quietly(conn, self._simple_reply(400, "Bad Request", "BadRequest", str(e), "/", True))
                    return
                if not self._handle(conn, req):
                    return
        finally:
            with self._lock:
                self._conns.discard(conn)
                self._threads.discard(threading.current_thread())
            with contextlib.suppress(OSError):
                conn.close()

    def _read_request(self, conn: socket.socket, reader: _Reader) -> _Request:
        head = reader.read_until(b"\r\n\r\n", MAX_HEAD_BYTES)
        if head is None:
            raise _Closed()
        start, headers = _parse_headers(head)
        parts = start.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _BadMessage(f"bad request line {start[:80]!r}")
        method, target, version = parts
        if (_get(headers, "expect") or "").lower() == "100-continue":
            conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        body: bytes | None
        if _is_chunked(headers):
            body = _read_chunked(reader, decode=False)
        else:
            length = _get(headers, "content-length")
            try:
                n = int(length) if length is not None else 0
            except ValueError:
                raise _BadMessage(f"bad Content-Length {length!r}") from None
            if n < 0 or n > MAX_BODY_BYTES:
                raise _BadMessage(f"Content-Length {n} out of range")
            body = reader.read_exact(n)
        if body is None:
            raise _Closed()
        return _Request(method, target, version, headers, body)

    def _decide(self, req: _Request) -> _Action:
        now = time.monotonic()
        with self._lock:
            self._counters["requests"] = self._counters.get("requests", 0) + 1
            forced = next((f for f in self._forced if req.is_conditional_put or not f[1]), None)
            if forced is not None:
                self._forced.remove(forced)
                return _Action(forced[0].value)
            if not self._enabled:
                return _Action.FORWARD
            if now < self._outage_until:
                return _Action.OUTAGE_DROP
            cap = self.plan.conditional_puts_per_key_s
            if cap is not None and req.is_conditional_put:
                key = req.target.split("?", 1)[0]
                times = self._put_times.setdefault(key, deque())
                while times and now - times[0] >= 1.0:
                    times.popleft()
                if len(times) >= cap:
                    return _Action.THROTTLE
                times.append(now)
            r = self._rng.random()
        p = self.plan
        for prob, action in (
            (p.drop_before, _Action.DROP_BEFORE),
            (p.drop_reply, _Action.DROP_REPLY),
            (p.error_503, _Action.ERROR_503),
            (p.truncate, _Action.TRUNCATE),
        ):
            if r < prob:
                return action
            r -= prob
        return _Action.FORWARD

    def _handle(self, conn: socket.socket, req: _Request) -> bool:
        """Serve one request; False if the connection must end."""
        action = self._decide(req)
        keep = not req.wants_close
        if action is _Action.OUTAGE_DROP:
            self._count("outage_dropped")
            self._drop(conn)
            return False
        if action is _Action.DROP_BEFORE:
            self._count(Fault.DROP_BEFORE.value)
            self._drop(conn)
            return False
        if action in (_Action.ERROR_500, _Action.CONFLICT_409, _Action.REQUEST_TIMEOUT):
            self._count(action.value)
            status, reason, code, message = _ERROR_REPLIES[Fault(action.value)]
            reply = self._simple_reply(status, reason, code, message, req.target.split("?", 1)[0], not keep)
            if req.method == "HEAD":
                reply = reply[: reply.index(b"\r\n\r\n") + 4]
            return self._send_quietly(conn, reply) and keep
        if action in (_Action.ERROR_503, _Action.THROTTLE):
            if action is _Action.THROTTLE:
                self._count("throttled")
                code = "SlowDown"
            else:
                self._count(Fault.ERROR_503.value)
                with self._lock:
                    code = self._rng.choice(["SlowDown", "ServiceUnavailable"])
            message = (
                "Please reduce your request rate." if code == "SlowDown" else "Service is unable to handle request."
            )
            reply = self._simple_reply(503, "Service Unavailable", code, message, req.target.split("?", 1)[0], not keep)
            if req.method == "HEAD":  # a reply to HEAD has no body (the length stays declared)
                reply = reply[: reply.index(b"\r\n\r\n") + 4]
            return self._send_quietly(conn, reply) and keep
        if self.plan.latency_s > 0:
            time.sleep(self.plan.latency_s)
        if req.is_conditional_put and self.plan.conditional is not ConditionalMode.ENFORCE:
            refused = self._break_conditional(req)
            if refused is not None:
                return self._send_quietly(conn, refused) and keep
            req = _Request(req.method, req.target, req.version, _unconditional(req.headers), req.body)
        try:
            up = self._forward(req)
        except (OSError, _BadMessage) as e:
            self._count("upstream_error")
            reply = self._simple_reply(502, "Bad Gateway", "InternalError", f"upstream failed: {e}", "/", True)
            self._send_quietly(conn, reply)
            return False
        self._count("forwarded")
        if action is _Action.DROP_REPLY:
            self._count(Fault.DROP_REPLY.value)
            self._drop(conn)
            return False
        head = self._reply_head(up, keep)
        if action is _Action.TRUNCATE and not up.bodyless and len(up.body) >= 2:
            self._count(Fault.TRUNCATE.value)
            self._send_quietly(conn, head + up.body[: len(up.body) // 2])
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            return False
        return self._send_quietly(conn, head + (b"" if up.bodyless else up.body)) and keep

    def _break_conditional(self, req: _Request) -> bytes | None:
        """A broken store's handling of a conditional PUT (``plan.conditional``): the 412 reply to
        send, or None to forward it without its conditional headers."""
        if self.plan.conditional is ConditionalMode.IGNORE:
            self._count("conditional_ignored")
            return None
        # SPLIT: check with a HEAD, pause, write unconditionally (the race window is the pause)
        self._count("conditional_split")
        path = req.target.split("?", 1)[0]
        # (with the PUT's credentials: a server that does not check signatures, like moto, accepts them)
        creds = [(k, v) for k, v in req.headers if k.lower() in _SIGNING_HEADERS]
        head = self._forward(_Request("HEAD", path, "HTTP/1.1", creds, b""))
        etag = _get(head.headers, "etag") if head.status == 200 else None
        if_none, if_match = req.header("if-none-match"), req.header("if-match")
        holds = (if_none is None or etag is None) and (if_match is None or (etag is not None and etag == if_match))
        if not holds:
            msg = "At least one of the pre-conditions you specified did not hold"
            return self._simple_reply(412, "Precondition Failed", "PreconditionFailed", msg, path, req.wants_close)
        time.sleep(self.plan.split_pause_s)
        return None

    def _drop(self, conn: socket.socket) -> None:
        """Close the client connection without a reply: half of the time with a reset."""
        with self._lock:
            reset = self._rng.random() < 0.5
        with contextlib.suppress(OSError):
            if reset:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            else:
                conn.shutdown(socket.SHUT_RDWR)

    @staticmethod
    def _send_quietly(conn: socket.socket, data: bytes) -> bool:
        try:
            conn.sendall(data)
            return True
        except OSError:
            return False

    @staticmethod
    def _simple_reply(status: int, reason: str, code: str, message: str, resource: str, close: bool) -> bytes:
        rid = uuid.uuid4().hex[:16].upper()
        body = _error_xml(code, message, resource, rid)
        head = (
            f"HTTP/1.1 {status} {reason}\r\n"
            f"Content-Type: application/xml\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"x-amz-request-id: {rid}\r\n"
            f"Server: fault-proxy\r\n"
            f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n"
        )
        return head.encode("latin-1") + body

    @staticmethod
    def _reply_head(up: _Reply, keep: bool) -> bytes:
        lines = [f"HTTP/1.1 {up.status} {up.reason}"]
        for k, v in up.headers:
            lk = k.lower()
            if lk in _HOP_BY_HOP or lk == "transfer-encoding":
                continue
            if lk == "content-length" and not up.bodyless:
                continue
            lines.append(f"{k}: {v}")
        if not up.bodyless:
            lines.append(f"Content-Length: {len(up.body)}")
        lines.append(f"Connection: {'keep-alive' if keep else 'close'}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def _forward(self, req: _Request) -> _Reply:
        """Send ``req`` upstream on a fresh connection; the whole reply."""
        lines = [f"{req.method} {req.target} HTTP/1.1"]
        for k, v in req.headers:
            lk = k.lower()
            if lk in _HOP_BY_HOP or lk == "expect":
                continue
            lines.append(f"{k}: {v}")
        lines.append("Connection: close")
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + req.body
        with socket.create_connection((self.upstream_host, self.upstream_port), UPSTREAM_CONNECT_TIMEOUT_S) as up:
            with self._lock:
                self._conns.add(up)
            try:
                up.settimeout(UPSTREAM_READ_TIMEOUT_S)
                up.sendall(data)
                return self._read_reply(_Reader(up), req.method)
            finally:
                with self._lock:
                    self._conns.discard(up)

    @staticmethod
    def _read_reply(reader: _Reader, method: str) -> _Reply:
        for _ in range(10):  # skip interim 1xx replies
            head = reader.read_until(b"\r\n\r\n", MAX_HEAD_BYTES)
            if head is None:
                raise _BadMessage("upstream closed before replying")
            start, headers = _parse_headers(head)
            parts = start.split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/"):
                raise _BadMessage(f"bad status line {start[:80]!r}")
            status = int(parts[1])
            reason = parts[2] if len(parts) > 2 else ""
            if 100 <= status < 200:
                continue
            if method == "HEAD" or status in (204, 304):
                return _Reply(status, reason, headers, b"", True)
            body: bytes | None
            if _is_chunked(headers):
                body = _read_chunked(reader, decode=True)
            elif (length := _get(headers, "content-length")) is not None:
                n = int(length)
                if n < 0 or n > MAX_BODY_BYTES:
                    raise _BadMessage(f"upstream Content-Length {n} out of range")
                body = reader.read_exact(n)
            else:
                body = reader.read_to_close(MAX_BODY_BYTES)
            if body is None:
                raise _BadMessage("upstream reply cut short")
            return _Reply(status, reason, headers, body, False)
        raise _BadMessage("too many interim replies")


@contextlib.contextmanager
def fault_proxy(upstream_url: str, seed: int = 0, faults: FaultPlan | None = None) -> Iterator[FaultProxy]:
    """``with fault_proxy(url, seed, plan) as proxy:`` (the same as ``with FaultProxy(...)``)."""
    with FaultProxy(upstream_url, seed=seed, faults=faults) as proxy:
        yield proxy
