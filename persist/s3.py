"""S3 and S3-compatible backends: ``s3://BUCKET/PREFIX``.

Layout under the location's prefix::

    <prefix>/blob/<key>                              one object per blob key
    <prefix>/consensus/<key>/<20-digit seqno>        one object per version

Consensus compare-and-set is one conditional PUT of version ``expected + 1``
with ``If-None-Match: *`` (put-if-absent); the store is the arbiter among
racing writers. A lost race comes back as HTTP 412 (``PreconditionFailed``) or
409 (``ConditionalRequestConflict``) and is returned as
:data:`CaSResult.MISMATCH`. There is no read on the happy path, so the
expectation is not checked against the head: see the SUBTLE note on
:class:`persist.location.Consensus` for what that means for callers.

SUBTLE: botocore retries a request after a timeout or a 5xx. A conditional PUT
whose first attempt landed but timed out is retried and gets 412 back: that
MISMATCH is indistinguishable from a lost race, so the layer above checks its
idempotency token after any MISMATCH. For the same reason a write whose last
attempt failed "determinately" (connection refused) is reported
``Indeterminate`` when an earlier attempt was sent: we count attempts per call
with a ``before-send`` hook (see :func:`classify`).

Credentials come from boto3's standard chain (environment, shared config
files, instance or container roles). This module never logs nor stores them.
Both backends of one location share one boto3 client (clients are
thread-safe).
"""

from __future__ import annotations

import email.utils
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import boto3
import botocore.config
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ParamValidationError,
    PartialCredentialsError,
)

from persist._internal.threads import ThreadPool
from persist.errors import Determinate, ExternalError, Indeterminate, InvalidUsage
from persist.location import Blob, CaSResult, Consensus, VersionedData, next_seqno
from persist.redact import redact_endpoint

#: Client configuration, in one place. Timeouts bound every request; retries
#: are few because the layer above retries persist operations itself.
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0
MAX_ATTEMPTS = 3

_SEQNO_RE = re.compile(r"[0-9]{20}")
MAX_POOL_CONNECTIONS = 64
_SCAN_GETS = 8  # versions a scan fetches at once (a reader catching up on a chain of state diffs)


def _map(fn: Callable[[int], T], items: list[int]) -> list[T]:
    """``[fn(x) for x in items]``, run on a shared pool when there is more than one."""
    if len(items) <= 1:
        return [fn(x) for x in items]
    pool = ThreadPool.of_process("persist-s3-scan", _SCAN_GETS)
    try:
        futures = [pool.submit(fn, x) for x in items]
    except RuntimeError:  # (shutting down: no new threads)
        return [fn(x) for x in items]
    return [f.result() for f in futures]


_DELETE_BATCH = 1000  # the most keys one DeleteObjects request takes
_MAX_RELISTS = 100
_MISMATCH_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict"})
_MISMATCH_STATUSES = frozenset({409, 412})
_NOT_PROCESSED_CODES = frozenset({"SlowDown", "RequestTimeout"})
CONFLICT_RETRIES = 4
"""How often a compare-and-set answered ``409 ConditionalRequestConflict`` is sent again before it
is returned as a MISMATCH (the layer above then re-reads the head and decides)."""
CONFLICT_BACKOFF_S = 0.02
"""The first pause before such a retry; it doubles each time (0.02 + 0.04 + 0.08 + 0.16 s at most)."""

T = TypeVar("T")


class _AttemptCounter(threading.local):
    """HTTP attempts made by the current thread's current boto3 call."""

    count = 0


_ATTEMPTS = _AttemptCounter()


def _count_attempt(**_kwargs: Any) -> None:
    _ATTEMPTS.count += 1


def make_client(
    endpoint_url: str | None = None,
    region: str | None = None,
    *,
    max_attempts: int = MAX_ATTEMPTS,
    connect_timeout: float = CONNECT_TIMEOUT_S,
    read_timeout: float = READ_TIMEOUT_S,
) -> Any:
    """A boto3 S3 client configured for persist.

    With a custom ``endpoint_url`` (MinIO, moto, R2, ...) it uses path-style
    addressing, which every S3-compatible store supports.
    """
    config = botocore.config.Config(
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        retries={"mode": "standard", "total_max_attempts": max_attempts},
        s3={"addressing_style": "path"} if endpoint_url else None,
        # (txns applies up to 64 data shards at once; boto3's default pool keeps 10 connections)
        max_pool_connections=MAX_POOL_CONNECTIONS,
    )
    session = boto3.session.Session()
    client = session.client("s3", endpoint_url=endpoint_url, region_name=region, config=config)
    client.meta.events.register("before-send.s3", _count_attempt, unique_id="persist-count-attempts")
    return client


DATE_FRESH_S = 60.0
"""S3's clock is read from its last response's ``Date`` header while that is younger than this; else one request."""


class _DateClock:
    """The S3 server's clock, from the ``Date`` header of every response a client receives (no extra request).

    ``Date`` has second precision: the server's time at receipt is taken as
    the header's second plus half a second, advanced by the monotonic time
    since. One per boto3 client (attached to it by :meth:`of`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: tuple[int, float] | None = None  # (server ms at receipt, time.monotonic() then)

    @staticmethod
    def of(client: Any) -> _DateClock:
        clock: _DateClock | None = getattr(client, "_persist_date_clock", None)
        if clock is None:
            clock = _DateClock()
            client._persist_date_clock = clock
            client.meta.events.register("after-call.s3", clock.note, unique_id="persist-date-clock")
        return clock

    def note(self, http_response: Any = None, **_kwargs: Any) -> None:
        date = getattr(http_response, "headers", {}).get("Date") if http_response is not None else None
        if not date:
            return
        try:
            ms = int(email.utils.parsedate_to_datetime(date).timestamp() * 1000) + 500
        except (TypeError, ValueError):
            return
        with self._lock:
            self._seen = (ms, time.monotonic())

    def now_ms(self, max_age_s: float) -> int | None:
        """The server's time now, if a response came within ``max_age_s``."""
        with self._lock:
            seen = self._seen
        if seen is None or time.monotonic() - seen[1] > max_age_s:
            return None
        return seen[0] + int((time.monotonic() - seen[1]) * 1000)


def sibling_client(client: Any, **client_options: Any) -> Any:
    """A new client like ``client`` (one :func:`make_client` made): the same endpoint and region, other options."""
    custom_endpoint = (client.meta.config.s3 or {}).get("addressing_style") == "path"
    return make_client(client.meta.endpoint_url if custom_endpoint else None, client.meta.region_name, **client_options)


def is_conditional_refusal(exc: BaseException) -> bool:
    """Whether ``exc`` is the store refusing a conditional write: 412 ``PreconditionFailed`` (the
    condition does not hold) or 409 ``ConditionalRequestConflict`` (a racing conditional write of
    the same key is in flight). Either way the write did not happen."""
    if not isinstance(exc, ClientError):
        return False
    return _code(exc) in _MISMATCH_CODES or _status(exc) in _MISMATCH_STATUSES


def _is_conflict(exc: ClientError) -> bool:
    return _code(exc) == "ConditionalRequestConflict" or (_status(exc) == 409 and _code(exc) != "PreconditionFailed")


def _status(exc: ClientError) -> int | None:
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return int(status) if status is not None else None


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def classify(exc: BaseException, op_is_write: bool, what: str = "s3 request", attempts: int = 1) -> ExternalError:
    """The persist error for a failed boto3 call. The one place that decides.

    - A read-only operation never changed anything: always ``Determinate``.
    - A write is ``Determinate`` only when no attempt can have reached the
      store: the connection was refused or timed out before sending, the
      request was rejected locally (bad parameters, no credentials), or the
      store answered with a 4xx rejection (``400 RequestTimeout`` included:
      the store never had the whole request) or ``503 SlowDown`` (throttled,
      not processed), and in every case only if this was the first attempt
      (``attempts``; an earlier attempt may have landed). A ``500
      InternalError`` or any other 5xx may have been applied.
    - Everything else for a write (read timeouts, closed connections, 5xx,
      anything unknown) is ``Indeterminate``.

    ``what`` names the operation and object for the message. Messages carry
    the botocore error text, which never contains credentials.
    """
    message = f"{what} failed: {exc}"
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        message += (
            " (configure credentials through the standard AWS chain, e.g. AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)"
        )
    if not op_is_write:
        return Determinate(message)
    never_sent = isinstance(
        exc,
        (
            EndpointConnectionError,
            ConnectTimeoutError,
            NoCredentialsError,
            PartialCredentialsError,
            ParamValidationError,
        ),
    )
    rejected = isinstance(exc, ClientError) and (
        _code(exc) in _NOT_PROCESSED_CODES or ((status := _status(exc)) is not None and 400 <= status < 500)
    )
    if (never_sent or rejected) and attempts <= 1:
        return Determinate(message)
    return Indeterminate(message)


def _join(*parts: str) -> str:
    return "/".join(p for p in parts if p)


class _S3Base:
    """What both backends share: the client, the bucket, the key prefix."""

    def __init__(self, client: Any, bucket: str, prefix: str, area: str) -> None:
        self._client = client
        self._bucket = bucket
        self._prefix = prefix.strip("/")
        self._base = _join(self._prefix, area) + "/"

    @property
    def client(self) -> Any:
        """The boto3 client (shared by both backends of a location)."""
        return self._client

    @property
    def bucket(self) -> str:
        return self._bucket

    @property
    def prefix(self) -> str:
        """The location's key prefix, without slashes at its ends ("" for the bucket's root)."""
        return self._prefix

    def _call(self, fn: Callable[..., T], what: str, write: bool, **kwargs: Any) -> T:
        """Run one boto3 call, translating failures with :func:`classify`."""
        _ATTEMPTS.count = 0
        try:
            return fn(**kwargs)
        except Exception as e:
            raise classify(e, write, what, _ATTEMPTS.count) from e

    def _where(self, key: str) -> str:
        return f"s3://{self._bucket}/{key}"

    def _get_bytes(self, key: str, what: str) -> bytes | None:
        """The object at the full S3 ``key``, or None if it does not exist."""
        try:
            resp = self._client.get_object(Bucket=self._bucket, Key=key)
        except ClientError as e:
            missing_key = _code(e) in ("NoSuchKey", "404") or _status(e) == 404
            if missing_key and _code(e) != "NoSuchBucket":
                return None
            raise classify(e, False, what) from e
        except Exception as e:
            raise classify(e, False, what) from e
        body = resp["Body"]
        try:
            return bytes(body.read())
        except Exception as e:
            raise classify(e, False, what) from e
        finally:
            body.close()

    def _list(
        self, prefix: str, what: str, delimiter: str | None = None, start_after: str | None = None
    ) -> Iterator[str]:
        """Full keys under ``prefix``, ascending, page by page."""
        kwargs: dict[str, Any] = {"Bucket": self._bucket, "Prefix": prefix}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        if start_after:
            kwargs["StartAfter"] = start_after
        while True:
            page = self._call(self._client.list_objects_v2, what, False, **kwargs)
            for obj in page.get("Contents", []):
                yield str(obj["Key"])
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            kwargs["ContinuationToken"] = token

    def _delete_objects(self, full_keys: Sequence[str], what: str) -> None:
        """Delete ``full_keys`` (missing ones are not an error): one DeleteObjects request per 1,000."""
        for i in range(0, len(full_keys), _DELETE_BATCH):
            batch = full_keys[i : i + _DELETE_BATCH]
            resp = self._call(
                self._client.delete_objects,
                what,
                True,
                Bucket=self._bucket,
                Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
            )
            errors = resp.get("Errors", [])
            if errors:
                first = errors[0]
                raise Indeterminate(
                    f"{what}: {len(errors)} deletes failed, first {first.get('Key')!r}: "
                    f"{first.get('Code')} {first.get('Message')}"
                )

    def close(self) -> None:
        """Release the shared client's pooled connections.

        The other backend of the same location keeps working: botocore opens
        new connections on its next request.
        """
        self._client.close()


class S3Blob(_S3Base, Blob):
    """Blobs as objects under ``<prefix>/blob/``."""

    def __init__(self, client: Any, bucket: str, prefix: str = "") -> None:
        super().__init__(client, bucket, prefix, "blob")
        self._clock = _DateClock.of(client)

    def storage_now_ms(self) -> int | None:
        """S3's clock: from the last response's ``Date`` header, else from a ``HeadBucket`` made now."""
        now = self._clock.now_ms(DATE_FRESH_S)
        if now is None:
            self._call(self._client.head_bucket, f"s3 clock {self._where('')}", False, Bucket=self._bucket)
            now = self._clock.now_ms(DATE_FRESH_S)
        return now

    def get(self, key: str) -> bytes | None:
        full = self._base + key
        return self._get_bytes(full, f"s3 blob get {self._where(full)}")

    def set(self, key: str, value: bytes) -> None:
        full = self._base + key
        self._call(
            self._client.put_object,
            f"s3 blob set {self._where(full)}",
            True,
            Bucket=self._bucket,
            Key=full,
            Body=bytes(value),
        )

    def delete(self, key: str) -> None:
        full = self._base + key
        self._call(
            self._client.delete_object,
            f"s3 blob delete {self._where(full)}",
            True,
            Bucket=self._bucket,
            Key=full,
        )

    def delete_many(self, keys: Sequence[str]) -> None:
        if keys:
            full = [self._base + k for k in keys]
            self._delete_objects(full, f"s3 blob delete of {len(full)} keys from {self._where(full[0])}")

    def list_keys(self, prefix: str) -> Iterator[str]:
        full = self._base + prefix
        keys = [k[len(self._base) :] for k in self._list(full, f"s3 blob list_keys {self._where(full)}")]
        return iter(keys)


HEAD_HINT_EVERY = 64
"""Every this many versions, a committer records the seqno in the key's head hint (one extra PUT)."""
_HEAD_HINT = "head-hint"


class S3Consensus(_S3Base, Consensus):
    """Versions as objects under ``<prefix>/consensus/<key>/<20-digit seqno>``.

    Cheap opens: a key keeps versions for the retention period (thousands at
    a high write rate), and S3 lists only upwards, so finding the head with
    no hint would list every one. The committer of every
    ``HEAD_HINT_EVERY``-th version also writes ``<key>/head-hint`` (its
    seqno; best effort, unconditional). A head lookup without a hint reads
    it and lists from there: at most about ``HEAD_HINT_EVERY`` versions. The
    hint is only ever a lower bound of the head (versions only grow; a
    stale or missing hint costs a longer listing, never a wrong answer).
    """

    # compare_and_set is one put-if-absent of version expected + 1, no read
    # of the head (see the module doc and the SUBTLE note on Consensus)
    checks_expectation = False
    detects_truncated = False
    lists_keys = True

    def __init__(self, client: Any, bucket: str, prefix: str = "") -> None:
        super().__init__(client, bucket, prefix, "consensus")

    def _dir(self, key: str) -> str:
        return f"{self._base}{key}/"

    def _seqnos(self, key: str, what: str, from_seqno: int = 1, limit: int | None = None) -> list[int]:
        """Seqnos of ``key`` that are >= ``from_seqno``, ascending, at most ``limit``."""
        d = self._dir(key)
        start_after = f"{d}{from_seqno - 1:020d}" if from_seqno > 1 else None
        out: list[int] = []
        # The delimiter keeps the versions of a nested key (``key/sub``) out.
        for full in self._list(d, what, delimiter="/", start_after=start_after):
            name = full[len(d) :]
            if _SEQNO_RE.fullmatch(name):
                out.append(int(name))
                if limit is not None and len(out) >= limit:
                    break
        return out

    def _read_head_hint(self, key: str, what: str) -> int | None:
        """The seqno in ``key``'s head hint, or None (absent, unreadable, malformed)."""
        try:
            data = self._get_bytes(f"{self._dir(key)}{_HEAD_HINT}", what)
        except ExternalError:
            return None  # only an optimization: the full listing decides
        text = data.decode("ascii", "replace").strip() if data else ""
        return int(text) if text.isascii() and text.isdigit() else None

    def _write_head_hint(self, key: str, seqno: int) -> None:
        try:
            self._client.put_object(Bucket=self._bucket, Key=f"{self._dir(key)}{_HEAD_HINT}", Body=str(seqno).encode())
        except Exception:  # noqa: BLE001 - best effort: a missing hint costs a longer listing only
            pass

    def head(self, key: str, hint: int | None = None) -> VersionedData | None:
        what = f"s3 consensus head {self._where(self._dir(key))}"
        if hint is None:
            hint = self._read_head_hint(key, what)
        for _ in range(_MAX_RELISTS):
            # With a hint, list from it: one short page instead of every
            # version kept for the retention period. Versions only grow, so
            # the head is at or past the hint; an empty answer means the hint
            # was wrong, and the full listing decides.
            seqnos = self._seqnos(key, what, from_seqno=hint) if hint and hint > 1 else []
            if not seqnos:
                seqnos = self._seqnos(key, what)
            if not seqnos:
                return None
            data = self._get_bytes(f"{self._dir(key)}{seqnos[-1]:020d}", what)
            if data is not None:
                return VersionedData(seqnos[-1], data)
            # A newer head was written and a truncate passed this one: re-list.
        raise Determinate(f"{what}: versions kept vanishing while reading")

    def compare_and_set(self, key: str, expected: int | None, data: bytes) -> CaSResult:
        full = f"{self._dir(key)}{next_seqno(expected):020d}"
        what = f"s3 consensus compare_and_set {self._where(full)}"
        sent = 0  # attempts of earlier calls that may have landed (a 409 did not: it is not counted)
        for conflict in range(CONFLICT_RETRIES + 1):
            _ATTEMPTS.count = 0
            try:
                self._client.put_object(Bucket=self._bucket, Key=full, Body=bytes(data), IfNoneMatch="*")
                break
            except ClientError as e:
                # SUBTLE: a 409 ConditionalRequestConflict means a racing conditional write of this
                # key was in flight and ours did not happen: try again (the race is decided by then,
                # and a lost one comes back 412). If an earlier attempt of ours landed, the retry
                # also sees 412, a MISMATCH the layer above resolves with its idempotency token.
                if _is_conflict(e) and conflict < CONFLICT_RETRIES:
                    sent += _ATTEMPTS.count - 1
                    time.sleep(CONFLICT_BACKOFF_S * (2**conflict))
                    continue
                if is_conditional_refusal(e):
                    return CaSResult.MISMATCH
                raise classify(e, True, what, sent + _ATTEMPTS.count) from e
            except Exception as e:
                raise classify(e, True, what, sent + _ATTEMPTS.count) from e
        if next_seqno(expected) % HEAD_HINT_EVERY == 0:
            self._write_head_hint(key, next_seqno(expected))
        return CaSResult.COMMITTED

    def scan(self, key: str, from_seqno: int, limit: int) -> list[VersionedData]:
        if limit <= 0:
            return []
        what = f"s3 consensus scan {self._where(self._dir(key))}"
        for _ in range(_MAX_RELISTS):
            seqnos = self._seqnos(key, what, from_seqno=max(from_seqno, 1), limit=limit)
            got = _map(lambda s: self._get_bytes(f"{self._dir(key)}{s:020d}", what), seqnos)
            if all(data is not None for data in got):
                return [VersionedData(s, data) for s, data in zip(seqnos, got, strict=True) if data is not None]
            # a concurrent truncate: list again for a consistent answer
        raise Determinate(f"{what}: versions kept vanishing while reading")

    def truncate(self, key: str, seqno: int) -> int:
        what = f"s3 consensus truncate {self._where(self._dir(key))}"
        seqnos = self._seqnos(key, what)
        if not seqnos or seqno > seqnos[-1]:
            head = seqnos[-1] if seqnos else None
            raise InvalidUsage(
                f"cannot truncate {key!r} to seqno {seqno}: it would delete the latest "
                f"version (head seqno {head}); truncate to at most the head seqno"
            )
        doomed = [f"{self._dir(key)}{s:020d}" for s in seqnos if s < seqno]
        self._delete_objects(doomed, f"{what} to {seqno}")
        return len(doomed)

    def list_keys(self) -> Iterator[str]:
        keys: set[str] = set()
        for full in self._list(self._base, f"s3 consensus list_keys {self._where(self._base)}"):
            rest = full[len(self._base) :]
            key, sep, name = rest.rpartition("/")
            if sep and _SEQNO_RE.fullmatch(name):
                keys.add(key)
        return iter(sorted(keys))


def open_s3(
    bucket: str,
    prefix: str = "",
    endpoint_url: str | None = None,
    region: str | None = None,
    **client_options: Any,
) -> tuple[S3Blob, S3Consensus]:
    """Blob and consensus backends in ``bucket`` under ``prefix``, sharing one client.

    Checks that the bucket exists and is reachable with the current
    credentials; raises ``InvalidUsage`` saying what to fix if not.
    """
    client = make_client(endpoint_url, region, **client_options)
    _DateClock.of(client)  # (before the first request: its Date is the first reading of S3's clock)
    where = f"s3://{bucket}" + (f" at {redact_endpoint(endpoint_url)}" if endpoint_url else "")
    try:
        client.head_bucket(Bucket=bucket)
    except ClientError as e:
        client.close()
        status = _status(e)
        if status == 404 or _code(e) in ("NoSuchBucket", "404"):
            raise InvalidUsage(
                f"bucket {bucket!r} does not exist ({where}); create it first "
                f"(e.g. `aws s3 mb s3://{bucket}`) or fix the bucket name in the URL"
            ) from e
        if status in (401, 403):
            raise InvalidUsage(
                f"access to bucket {bucket!r} denied ({where}); check the credentials "
                f"found by the standard AWS chain and the bucket policy"
            ) from e
        raise classify(e, False, f"checking bucket {bucket!r} ({where})") from e
    except (NoCredentialsError, PartialCredentialsError) as e:
        client.close()
        raise InvalidUsage(
            f"no usable AWS credentials to open bucket {bucket!r} ({where}); set them "
            f"through the standard AWS chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
            f"~/.aws/credentials or an instance role)"
        ) from e
    except Exception as e:
        client.close()
        raise classify(e, False, f"checking bucket {bucket!r} ({where})") from e
    return S3Blob(client, bucket, prefix), S3Consensus(client, bucket, prefix)
