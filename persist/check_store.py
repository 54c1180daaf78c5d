"""Check a store before trusting it: a bounded, self-cleaning probe of what persist relies on.

Every guarantee of persist (and of txns above it) rests on the store's
conditional writes: a compare-and-set is one ``PUT`` with ``If-None-Match:
*``, and exactly one of any racing writers may win it. Several
S3-compatible servers have shipped conditional writes that ignore the
headers or check and write in two steps that a racer can split; on such a
store nothing breaks loudly, data is silently lost or duplicated. Run this
first on a new store::

    >>> report = check_store("mem://check-store-doc", racers=4, race_keys=4, match_rounds=2, sustain_s=0.1)
    >>> report.ok
    True
    >>> [r.name for r in report.results if r.ok is None]
    ['conditional PUT latency', 'conditional PUTs/s, one key']

(or ``txns check-store URL`` from a shell). It checks, in this order:

1. ``If-None-Match: *`` is enforced: a second conditional PUT of a key is
   refused (412 or 409) and the first value stays.
2. ``If-Match`` is enforced: a PUT with a wrong or stale ETag is refused; one
   with the current ETag lands.
3. Atomicity under races, put-if-absent: ``racers`` threads PUT each of
   ``race_keys`` fresh keys at once (released by a barrier); exactly one is
   told it won each key, and the key holds the winner's bytes.
4. Atomicity under races, ``If-Match``: ``match_rounds`` times, ``racers``
   threads PUT one key with the same current ETag; exactly one wins each
   version, and the key holds the winner's bytes.
5. Read-after-write (from another client), list-after-write, and delete.
6. Measured, never judged: the latency of a conditional PUT (median and
   90th percentile of ``latency_samples``) and the conditional PUTs per
   second one key sustains (one writer chaining ``If-Match`` for
   ``sustain_s`` seconds; persist commits at most that often per shard).

Any failed check makes :attr:`StoreReport.ok` False; :meth:`StoreReport.table`
names what is broken. A request failing (a 5xx, a timeout) fails the check it
was part of, saying so: a store that errs under a few racing writers is not
one to trust either.

Stores. On ``s3://`` the probe sends the real headers with boto3 (one
attempt per request, no retries, so every answer is the store's own), under
``<prefix>/check-store-<random>/``, and deletes every object it wrote at the
end (also when a check fails or raises). On other schemes (``file://``,
``mem://``, registered ones) the same checks go through the location's
:class:`~persist.location.Consensus` (conditional writes are its versions:
put-if-absent is the first version, ``If-Match`` is a compare-and-set on the
head's seqno) and :class:`~persist.location.Blob`; a ``file://`` probe works
in a subdirectory ``.check-store-<random>`` that is removed at the end.

Bounded: the work is fixed by the arguments, every S3 request has the
client's connect and read timeouts, every thread is joined with a deadline.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import statistics
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from persist.errors import InvalidUsage
from persist.location import CaSResult
from persist.url import Location, local_path, open_location, redact

__all__ = ["CheckResult", "StoreReport", "check_store"]

JOIN_TIMEOUT_S = 120.0
"""The longest a race waits for its threads (each request has the client's own timeouts)."""
_MAX_SUSTAIN_PUTS = 5000


@dataclass(frozen=True)
class CheckResult:
    """One line of the report: a correctness check (``ok`` True or False) or a measurement (``ok`` None)."""

    name: str
    ok: bool | None
    detail: str
    value: float | None = None
    unit: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail, "value": self.value, "unit": self.unit}


@dataclass(frozen=True)
class StoreReport:
    """What :func:`check_store` found on one store."""

    url: str
    """The store's URL, redacted."""
    results: tuple[CheckResult, ...]

    @property
    def ok(self) -> bool:
        """Whether every correctness check passed (measurements do not count)."""
        return all(r.ok is not False for r in self.results)

    @property
    def broken(self) -> list[CheckResult]:
        """The checks that failed."""
        return [r for r in self.results if r.ok is False]

    def verdict(self) -> str:
        if self.ok:
            return "PASS: conditional writes are enforced and atomic; persist's guarantees hold on this store"
        names = ", ".join(r.name for r in self.broken)
        return f"FAIL: do not use this store with persist or txns; broken: {names}"

    def table(self) -> str:
        """The report as a text table, ending with the verdict."""
        rows = [("check", "result", "detail")]
        for r in self.results:
            if r.ok is None:
                result = f"{r.value:.1f} {r.unit}" if r.value is not None else "-"
            else:
                result = "ok" if r.ok else "BROKEN"
            rows.append((r.name, result, r.detail))
        widths = [max(len(row[i]) for row in rows) for i in range(2)]
        lines = [f"store {self.url}"]
        for row in rows:
            lines.append(f"  {row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]}".rstrip())
        lines.append(self.verdict())
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "ok": self.ok,
            "verdict": self.verdict(),
            "broken": [r.name for r in self.broken],
            "checks": [r.to_json() for r in self.results],
        }


# ---- what the probe does to a store ---------------------------------------------------


class _Target(ABC):
    """The operations the probe needs, on one store. ``etag``: S3's ETag, or a consensus seqno as text."""

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Write ``key`` iff it does not exist; False if the store refused (the precondition failed)."""

    @abstractmethod
    def put_if_match(self, key: str, etag: str, data: bytes) -> str | None:
        """Write ``key`` iff its current version is ``etag``; the new etag, or None if refused."""

    @abstractmethod
    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        """A conditionally written key's bytes and etag, or None."""

    @abstractmethod
    def refused_etags(self, previous: str, current: str) -> list[tuple[str, str]]:
        """Etags a PUT with ``If-Match`` must be refused for, when ``current`` followed ``previous``:
        (what it is, the etag)."""

    @abstractmethod
    def put(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def get(self, key: str) -> bytes | None: ...

    @abstractmethod
    def list(self, prefix: str) -> set[str]: ...

    @abstractmethod
    def delete(self, key: str) -> None: ...

    @abstractmethod
    def other_client(self) -> _Target:
        """Another client of the same probe area (for read-after-write)."""

    def cleanup(self) -> None:  # noqa: B027 - optional: nothing to clean by default
        """Delete everything the probe wrote."""

    def close(self) -> None:  # noqa: B027 - optional
        """Release the target's clients."""


class _S3Target(_Target):
    """Raw conditional PUTs with boto3 under ``<prefix>/check-store-<id>/``: one attempt per request."""

    def __init__(self, client: Any, bucket: str, base: str, refused: Callable[[Exception], bool]) -> None:
        self._client, self._bucket, self._base, self._refused = client, bucket, base, refused
        self._others: list[_S3Target] = []

    @classmethod
    def open(cls, blob: Any) -> _S3Target:
        from persist.s3 import sibling_client

        client = sibling_client(blob.client, max_attempts=1)
        base = "/".join(p for p in (blob.prefix, f"check-store-{uuid.uuid4().hex[:12]}") if p) + "/"
        return cls(client, blob.bucket, base, _s3_refused)

    def _put(self, key: str, data: bytes, **cond: str) -> dict[str, Any] | None:
        try:
            resp: dict[str, Any] = self._client.put_object(Bucket=self._bucket, Key=self._base + key, Body=data, **cond)
        except Exception as e:
            if self._refused(e):
                return None
            raise
        return resp

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self._put(key, data, IfNoneMatch="*") is not None

    def put_if_match(self, key: str, etag: str, data: bytes) -> str | None:
        resp = self._put(key, data, IfMatch=etag)
        return None if resp is None else str(resp.get("ETag", ""))

    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        from botocore.exceptions import ClientError

        try:
            resp = self._client.get_object(Bucket=self._bucket, Key=self._base + key)
        except ClientError as e:
            if e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                return None
            raise
        body = resp["Body"]
        try:
            return bytes(body.read()), str(resp.get("ETag", ""))
        finally:
            body.close()

    def refused_etags(self, previous: str, current: str) -> list[tuple[str, str]]:
        return [("a stale", previous), ("a wrong", '"00000000000000000000000000000000"')]

    def put(self, key: str, data: bytes) -> None:
        self._client.put_object(Bucket=self._bucket, Key=self._base + key, Body=data)

    def get(self, key: str) -> bytes | None:
        got = self.get_versioned(key)
        return None if got is None else got[0]

    def list(self, prefix: str) -> set[str]:
        out: set[str] = set()
        kwargs: dict[str, Any] = {"Bucket": self._bucket, "Prefix": self._base + prefix}
        for _ in range(1000):
            page = self._client.list_objects_v2(**kwargs)
            out.update(str(o["Key"])[len(self._base) :] for o in page.get("Contents", []))
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                break
            kwargs["ContinuationToken"] = token
        return out

    def delete(self, key: str) -> None:
        self._client.delete_object(Bucket=self._bucket, Key=self._base + key)

    def other_client(self) -> _S3Target:
        from persist.s3 import sibling_client

        other = _S3Target(sibling_client(self._client, max_attempts=1), self._bucket, self._base, self._refused)
        self._others.append(other)
        return other

    def cleanup(self) -> None:
        keys = sorted(self.list(""))
        for i in range(0, len(keys), 1000):
            batch = keys[i : i + 1000]
            self._client.delete_objects(
                Bucket=self._bucket, Delete={"Objects": [{"Key": self._base + k} for k in batch], "Quiet": True}
            )

    def close(self) -> None:
        for other in self._others:
            other.close()
        self._client.close()


def _s3_refused(e: Exception) -> bool:
    """Whether an S3 error is the store refusing a conditional write: 412, 409, or 404 for ``If-Match``."""
    from botocore.exceptions import ClientError

    from persist.s3 import is_conditional_refusal

    if not isinstance(e, ClientError):
        return False
    status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return is_conditional_refusal(e) or status == 404  # If-Match on a missing key: 404 NoSuchKey on AWS


class _LocationTarget(_Target):
    """The probe through a location's Consensus (conditional writes) and Blob (plain objects)."""

    def __init__(self, url: str, prefix: str, open_: Callable[[], Location], remove: Callable[[], None]) -> None:
        self._url, self._prefix, self._open, self._remove = url, prefix, open_, remove
        self._loc = open_()
        self._others: list[_LocationTarget] = []

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self._loc.consensus.compare_and_set(self._prefix + key, None, data) is CaSResult.COMMITTED

    def put_if_match(self, key: str, etag: str, data: bytes) -> str | None:
        seqno = int(etag)
        got = self._loc.consensus.compare_and_set(self._prefix + key, seqno, data)
        return str(seqno + 1) if got is CaSResult.COMMITTED else None

    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        head = self._loc.consensus.head(self._prefix + key)
        return None if head is None else (head.data, str(head.seqno))

    def refused_etags(self, previous: str, current: str) -> list[tuple[str, str]]:
        out = [("a stale", previous)]
        if self._loc.consensus.checks_expectation:  # (put-if-absent backends write a version ahead)
            out.append(("a wrong", str(int(current) + 7)))
        return out

    def put(self, key: str, data: bytes) -> None:
        self._loc.blob.set(self._prefix + key, data)

    def get(self, key: str) -> bytes | None:
        return self._loc.blob.get(self._prefix + key)

    def list(self, prefix: str) -> set[str]:
        n = len(self._prefix)
        return {k[n:] for k in self._loc.blob.list_keys(self._prefix + prefix)}

    def delete(self, key: str) -> None:
        self._loc.blob.delete(self._prefix + key)

    def other_client(self) -> _LocationTarget:
        other = _LocationTarget(self._url, self._prefix, self._open, lambda: None)
        self._others.append(other)
        return other

    def cleanup(self) -> None:
        for key in self.list(""):
            self.delete(key)
        self._remove()

    def close(self) -> None:
        for other in self._others:
            other.close()
        self._loc.close()


def _open_target(url: str) -> _Target:
    """The probe's target on ``url`` (raises InvalidUsage for a bad URL or a missing bucket)."""
    probe_id = f"check-store-{uuid.uuid4().hex[:12]}"
    root = local_path(url)
    if root is not None:  # a directory: probe in a subdirectory, removed at the end (the root is not opened)
        existed = root.exists()
        sub: Path = root / f".{probe_id}"

        def remove() -> None:
            shutil.rmtree(sub, ignore_errors=True)
            if not existed:
                with contextlib.suppress(OSError):
                    root.rmdir()  # (only if empty)

        return _LocationTarget(url, "", lambda: open_location(f"file://{sub}"), remove)
    loc = open_location(url)
    from persist.s3 import S3Blob

    if isinstance(loc.blob, S3Blob):
        try:
            return _S3Target.open(loc.blob)
        finally:
            loc.close()
    loc.close()
    return _LocationTarget(url, f"{probe_id}/", lambda: open_location(url), lambda: None)


# ---- the checks -----------------------------------------------------------------------


@dataclass
class _Race:
    """Outcomes of one race: who won, and the requests that failed."""

    winners: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _race(racers: int, attempt: Callable[[int], bool]) -> _Race:
    """``racers`` threads call ``attempt(i)`` at once (released by a barrier); who returned True."""
    out = _Race()
    lock = threading.Lock()
    barrier = threading.Barrier(racers, timeout=JOIN_TIMEOUT_S)

    def run(i: int) -> None:
        try:
            barrier.wait()
            won = attempt(i)
        except threading.BrokenBarrierError:
            return
        except Exception as e:  # noqa: BLE001 - a failed request is part of the report
            with lock:
                out.errors.append(f"{type(e).__name__}: {e}")
            return
        if won:
            with lock:
                out.winners.append(i)

    threads = [threading.Thread(target=run, args=(i,), name=f"check-store-{i}", daemon=True) for i in range(racers)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        barrier.abort()
        out.errors.append(f"a racer did not finish within {JOIN_TIMEOUT_S:.0f} s")
    return out


def _errors(errors: list[str]) -> str:
    return f"{len(errors)} requests failed (first: {errors[0][:200]})"


def _fresh(t: _Target, name: str, key: str, data: bytes) -> str | CheckResult:
    """Write the fresh ``key`` with ``If-None-Match: *``: its etag, or the failed check ``name``."""
    if not t.put_if_absent(key, data):
        return CheckResult(name, False, "the first conditional PUT of a fresh key was refused")
    got = t.get_versioned(key)
    if got is None:
        return CheckResult(name, False, "a key just written reads as missing")
    return got[1]


def _ignored(name: str, what: str, got: tuple[bytes, str] | None, want: bytes) -> CheckResult:
    found = "nothing" if got is None else repr(got[0][:20])
    return CheckResult(name, False, f"{what}; the key holds {found}, not {want!r} (the store ignores the header)")


def _check_if_none_match(t: _Target) -> CheckResult:
    name = "If-None-Match: * enforced"
    if not t.put_if_absent("inm", b"first"):
        return CheckResult(name, False, "the first conditional PUT of a fresh key was refused")
    second = t.put_if_absent("inm", b"second")
    got = t.get_versioned("inm")
    if second or got is None or got[0] != b"first":
        what = f"a second PUT with If-None-Match: * was {'accepted' if second else 'refused'}"
        return _ignored(name, what, got, b"first")
    return CheckResult(name, True, "a second conditional PUT of a key was refused; the first value kept")


def _check_if_match(t: _Target) -> CheckResult:
    name = "If-Match enforced"
    e1 = _fresh(t, name, "im", b"v1")
    if isinstance(e1, CheckResult):
        return e1
    e2 = t.put_if_match("im", e1, b"v2")
    if e2 is None:
        return CheckResult(name, False, "a PUT with the current ETag was refused")
    accepted = [what for what, etag in t.refused_etags(e1, e2) if t.put_if_match("im", etag, b"bad")]
    now = t.get_versioned("im")
    if accepted or now is None or now[0] != b"v2":
        return _ignored(name, f"a PUT with {' and '.join(accepted) or 'no'} ETag was accepted", now, b"v2")
    return CheckResult(name, True, "PUTs with a stale or wrong ETag were refused; the current one landed")


def _absent_attempt(t: _Target, key: str, racer: int) -> bool:
    return t.put_if_absent(key, f"racer {racer}".encode())


def _match_attempt(t: _Target, etag: str, round_: int, racer: int) -> bool:
    return t.put_if_match("race-match", etag, f"{round_}:{racer}".encode()) is not None


def _check_race_absent(t: _Target, racers: int, keys: int) -> CheckResult:
    name = "race: If-None-Match"
    doubles: list[str] = []
    none: list[str] = []
    errors: list[str] = []
    for k in range(keys):
        key = f"race-absent/{k}"
        race = _race(racers, functools.partial(_absent_attempt, t, key))
        errors += race.errors
        got = t.get_versioned(key)
        if len(race.winners) > 1:
            doubles.append(f"{key}: {len(race.winners)} writers told they won")
        elif len(race.winners) == 1 and (got is None or got[0] != f"racer {race.winners[0]}".encode()):
            doubles.append(f"{key}: the winner's value is not the one stored")
        elif not race.winners and not race.errors:
            none.append(key)
    if doubles:
        why = f"{len(doubles)} of {keys} keys had more than one winner: {doubles[0]} (check and write are not atomic)"
        return CheckResult(name, False, why)
    if none:
        return CheckResult(name, False, f"{len(none)} of {keys} keys had no winner ({none[0]})")
    if errors:
        return CheckResult(name, False, _errors(errors))
    return CheckResult(name, True, f"{keys} fresh keys x {racers} writers: exactly one winner each")


def _check_race_match(t: _Target, racers: int, rounds: int) -> CheckResult:
    name = "race: If-Match"
    first = _fresh(t, name, "race-match", b"start")
    if isinstance(first, CheckResult):
        return first
    doubles: list[str] = []
    errors: list[str] = []
    for r in range(rounds):
        got = t.get_versioned("race-match")
        if got is None:
            return CheckResult(name, False, "the raced key reads as missing")
        etag = got[1]
        race = _race(racers, functools.partial(_match_attempt, t, etag, r))
        errors += race.errors
        now = t.get_versioned("race-match")
        if len(race.winners) > 1:
            doubles.append(f"round {r}: {len(race.winners)} writers told they won")
        elif len(race.winners) == 1 and (now is None or now[0] != f"{r}:{race.winners[0]}".encode()):
            doubles.append(f"round {r}: the winner's value is not the one stored")
        elif not race.winners and not race.errors:
            return CheckResult(name, False, f"round {r}: no writer with the current ETag won")
    if doubles:
        why = f"{len(doubles)} of {rounds} versions had more than one winner: {doubles[0]}"
        why += " (check and write are not atomic)"
        return CheckResult(name, False, why)
    if errors:
        return CheckResult(name, False, _errors(errors))
    return CheckResult(name, True, f"{rounds} versions x {racers} writers: exactly one winner each")


def _check_read_after_write(t: _Target) -> CheckResult:
    name = "read-after-write"
    other = t.other_client()
    value = uuid.uuid4().bytes * 100
    t.put("raw", value)
    if other.get("raw") != value:
        return CheckResult(name, False, "another client did not read the value just written")
    t.put("raw", b"overwritten")
    if other.get("raw") != b"overwritten":
        return CheckResult(name, False, "another client read the old value after an overwrite")
    return CheckResult(name, True, "another client reads a new object and an overwrite at once")


def _check_list_after_write(t: _Target, n: int = 10) -> CheckResult:
    name = "list-after-write"
    want = {f"law/{i:03d}" for i in range(n)}
    for k in sorted(want):
        t.put(k, b"x")
    got = t.list("law/")
    if got != want:
        why = f"a listing right after {n} writes missed {len(want - got)} of them and had {len(got - want)} others"
        return CheckResult(name, False, why)
    return CheckResult(name, True, f"a listing right after {n} writes shows all of them")


def _check_delete(t: _Target) -> CheckResult:
    name = "delete"
    t.put("del/a", b"x")
    t.delete("del/a")
    if t.get("del/a") is not None:
        return CheckResult(name, False, "a deleted object can still be read")
    if t.list("del/"):
        return CheckResult(name, False, "a deleted object is still listed")
    t.delete("del/never-written")  # deleting a missing key must not fail
    return CheckResult(name, True, "a deleted object is gone from reads and listings")


def _measure_latency(t: _Target, samples: int) -> CheckResult:
    ms: list[float] = []
    for i in range(samples):
        start = time.perf_counter()
        t.put_if_absent(f"latency/{i}", b"x" * 256)
        ms.append((time.perf_counter() - start) * 1000)
    p90 = statistics.quantiles(ms, n=10)[-1] if len(ms) >= 2 else ms[0]
    median = statistics.median(ms)
    return CheckResult("conditional PUT latency", None, f"median of {samples} (p90 {p90:.1f} ms)", median, "ms")


def _measure_sustained(t: _Target, seconds: float) -> CheckResult:
    name = "conditional PUTs/s, one key"
    etag = _fresh(t, name, "sustain", b"0")
    if isinstance(etag, CheckResult):
        return etag
    n = 0
    start = time.perf_counter()
    while n < _MAX_SUSTAIN_PUTS and time.perf_counter() - start < seconds:
        new = t.put_if_match("sustain", etag, str(n).encode())
        if new is None:
            return CheckResult(name, False, f"PUT {n + 1} of a single writer's If-Match chain was refused")
        etag, n = new, n + 1
    elapsed = time.perf_counter() - start
    return CheckResult(name, None, f"one writer chaining If-Match, {n} PUTs in {elapsed:.1f} s", n / elapsed, "/s")


def check_store(
    url: str,
    *,
    racers: int = 8,
    race_keys: int = 24,
    match_rounds: int = 12,
    latency_samples: int = 20,
    sustain_s: float = 2.0,
) -> StoreReport:
    """Probe the store at ``url`` (see the module doc) and report; everything written is deleted after.

    Raises ``InvalidUsage`` for a bad URL, a missing bucket or bad
    arguments, and a storage error if the store fails outside a race (it
    is then unusable anyway).
    """
    if racers < 2 or race_keys < 1 or match_rounds < 1 or latency_samples < 1 or sustain_s <= 0:
        raise InvalidUsage(
            f"check_store needs racers >= 2, race_keys >= 1, match_rounds >= 1, latency_samples >= 1 and "
            f"sustain_s > 0; got {racers}, {race_keys}, {match_rounds}, {latency_samples}, {sustain_s}"
        )
    target = _open_target(url)
    results: list[CheckResult] = []
    try:
        results.append(_check_if_none_match(target))
        results.append(_check_if_match(target))
        results.append(_check_race_absent(target, racers, race_keys))
        results.append(_check_race_match(target, racers, match_rounds))
        results.append(_check_read_after_write(target))
        results.append(_check_list_after_write(target))
        results.append(_check_delete(target))
        results.append(_measure_latency(target, latency_samples))
        results.append(_measure_sustained(target, sustain_s))
    finally:
        try:
            target.cleanup()
        finally:
            target.close()
    return StoreReport(redact(url), tuple(results))
