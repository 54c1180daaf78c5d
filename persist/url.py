"""Locations by URL: the one place that turns a URL into storage backends.

Accepted forms::

    mem://NAME                                  in-process, shared by NAME (tests)
    file:///ABSOLUTE/PATH                       a local directory, created if missing
                                                (file://localhost/ABSOLUTE/PATH too; a host name
                                                such as file://tmp/x is refused: it is not a path)
    s3://BUCKET[/PREFIX][?endpoint_url=URL&region=REGION]
                                                S3 or an S3-compatible store
    s3model+file:///ABSOLUTE/PATH[?latency_ms=MS&cas_per_key_s=N]
                                                a local directory behind a model of S3's
                                                latency and throttling (benchmarks: persist.s3model)

Each scheme is registered (:func:`register_scheme`) with an opener and the
forms to list in error messages; mem, file and s3 are registered here, and
another backend registers its own scheme the same way (see
:mod:`persist.testing` for the conformance suite it should pass).
:func:`open_location` dispatches on the scheme, :func:`validate_url` checks a
URL without opening it, :func:`accepted_forms` lists the forms.

Example::

    >>> loc = open_location("mem://doc-example")
    >>> loc.blob.set("k", b"v")
    >>> loc.blob.get("k")
    b'v'

Credentials never go in a URL: S3 credentials come from boto3's standard
chain. Every part of a URL is on an allow-list, and anything else is refused
(without echoing it): userinfo, a fragment, a query parameter other than
``endpoint_url`` and ``region`` (s3 only), a control character (raw or
percent-encoded), and an ``endpoint_url`` beyond ``http[s]://HOST[:PORT][/PATH]``
(no userinfo, query, fragment or ``;`` parameters; a plain path). Use
:func:`redact` before printing a URL (every message of this package does):
it keeps the scheme, host and path, and the values of the allowed
parameters when they have the allowed form, and prints every other value
(and any fragment or userinfo) as ``REDACTED``.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

from persist.errors import Determinate, InvalidUsage
from persist.location import Blob, Consensus
from persist.redact import CONTROL_RE, ENDPOINT_PATH_RE, HOST_RE, PARAM_NAME_RE, REGION_RE, redact_endpoint
from persist.redact import redact as redact  # (re-exported: persist.url.redact is public)

_S3_PARAMS = frozenset({"endpoint_url", "region"})
_SECRETISH = re.compile(
    r"secret|password|passwd|token|credential|signature|access_?key|session|auth|sig|key", re.IGNORECASE
)
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


@dataclass(frozen=True)
class Location:
    """An opened storage location: its URL and its two backends."""

    url: str
    blob: Blob
    consensus: Consensus

    def close(self) -> None:
        """Release both backends' resources."""
        self.blob.close()
        self.consensus.close()

    def __repr__(self) -> str:
        return f"Location({redact(self.url)!r})"


# ---- the scheme registry -----------------------------------------------------------


@dataclass(frozen=True)
class LocationURL:
    """A location URL as a scheme's opener sees it.

    ``url`` is exactly as typed: put it in messages through :func:`redact`
    only (or raise :meth:`invalid`, which does).
    """

    url: str
    scheme: str
    """The scheme, lower-cased."""
    rest: str
    """Everything after ``://``, unparsed (not unquoted)."""

    def invalid(self, why: str) -> InvalidUsage:
        """The error for a malformed URL: the redacted URL, ``why``, and the accepted forms."""
        return _bad(self.url, why)

    def split(self) -> SplitResult:
        """``urllib.parse.urlsplit`` of the URL; :meth:`invalid` if it cannot be parsed."""
        try:
            return urlsplit(self.url)
        except ValueError as e:
            raise self.invalid(f"cannot parse it ({e})") from None


Opener = Callable[[LocationURL], Location]
"""Opens a location: checks the URL (raising ``url.invalid(why)``), then opens both backends."""


@dataclass(frozen=True)
class Scheme:
    """A registered URL scheme: how to open its URLs and what to tell users about them."""

    name: str
    """The scheme, lower-case (``s3`` for ``s3://...``)."""
    opener: Opener
    forms: tuple[str, ...]
    """The URL forms to list in error messages, e.g. ``("s3://BUCKET[/PREFIX]",)``."""
    process_local: bool = False
    """True when the storage lives in the opening process only (``mem://``):
    another process opening the same URL (a Spark executor, a CLI) sees
    different, empty storage."""
    check: Callable[[LocationURL], None] | None = None
    """Checks the URL's syntax without opening anything (no I/O, no side
    effect), raising ``url.invalid(why)``; see :func:`validate_url`. The
    opener checks again (it must not rely on this having run)."""
    local_path: Callable[[LocationURL], Path] | None = None
    """For schemes that name a local directory (``file://``): that directory,
    without creating it (raising ``url.invalid(why)`` if the URL is malformed);
    see :func:`local_path`."""


_SCHEMES: dict[str, Scheme] = {}
_SCHEMES_LOCK = threading.Lock()
_SCHEME_RE = re.compile(r"[a-z][a-z0-9+.-]*")


def register_scheme(
    name: str,
    opener: Opener,
    *,
    forms: str | Sequence[str],
    process_local: bool = False,
    check: Callable[[LocationURL], None] | None = None,
    local_path: Callable[[LocationURL], Path] | None = None,
    replace: bool = False,
) -> Scheme:
    """Make :func:`open_location` open ``NAME://...`` URLs with ``opener``.

    ``forms`` (one or several) are listed in the error for any malformed or
    unknown URL. See :class:`Scheme` for the other fields. Registering a
    name that is taken raises ``InvalidUsage`` unless ``replace``.

    Register at import time of the module defining the backend, and import
    that module in every process that opens such URLs (Spark executors
    too: they open locations by URL).

    >>> from persist.mem import open_mem
    >>> def open_scratch(u: LocationURL) -> Location:
    ...     if not u.rest:
    ...         raise u.invalid("scratch:// needs a NAME")
    ...     return Location(u.url, *open_mem("scratch-" + u.rest))
    >>> _ = register_scheme("scratch", open_scratch, forms="scratch://NAME", process_local=True)
    >>> open_location("scratch://a").blob.get("k") is None
    True
    >>> "scratch://NAME" in accepted_forms()
    True
    >>> unregister_scheme("scratch")
    """
    name = name.lower()
    if not _SCHEME_RE.fullmatch(name):
        raise InvalidUsage(f"invalid scheme name {name!r}: a letter, then letters, digits, '+', '-' or '.'")
    scheme = Scheme(
        name,
        opener,
        (forms,) if isinstance(forms, str) else tuple(forms),
        process_local=process_local,
        check=check,
        local_path=local_path,
    )
    if not scheme.forms:
        raise InvalidUsage(f"scheme {name!r}: give at least one URL form")
    with _SCHEMES_LOCK:
        if name in _SCHEMES and not replace:
            raise InvalidUsage(f"scheme {name!r} is already registered (pass replace=True to replace it)")
        _SCHEMES[name] = scheme
    return scheme


def unregister_scheme(name: str) -> None:
    """Forget the scheme ``name`` (no error if it is not registered)."""
    with _SCHEMES_LOCK:
        _SCHEMES.pop(name.lower(), None)


def schemes() -> dict[str, Scheme]:
    """The registered schemes by name, in registration order (a copy)."""
    with _SCHEMES_LOCK:
        return dict(_SCHEMES)


def accepted_forms(*, shared_only: bool = False) -> tuple[str, ...]:
    """The URL forms of every registered scheme; ``shared_only``: of those not process-local."""
    return tuple(
        form for s in schemes().values() if not (shared_only and s.process_local) for form in s.forms
    )


def __getattr__(name: str) -> object:
    if name == "ACCEPTED_FORMS":  # computed on each access: the forms of the schemes registered now
        return accepted_forms()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _bad(url: str, why: str) -> InvalidUsage:
    forms = ", ".join(accepted_forms())
    return InvalidUsage(f"invalid location URL {redact(url)!r}: {why}; accepted forms: {forms}")


def _parse(url: str) -> tuple[Scheme, LocationURL]:
    if not isinstance(url, str):
        raise InvalidUsage(
            f"a location URL must be a str, got {type(url).__name__}; accepted forms: {', '.join(accepted_forms())}"
        )
    if CONTROL_RE.search(url) or CONTROL_RE.search(unquote(url)):
        # (urllib drops raw tabs and newlines silently; a NUL reaches the file system as a raw ValueError)
        raise _bad(url, "it holds a control character (raw or percent-encoded, such as %00 or %0A)")
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise _bad(url, "missing '://'")
    scheme = scheme.lower()
    found = _SCHEMES.get(scheme)
    if found is None:
        raise _bad(url, f"unknown scheme {scheme!r}")
    return found, LocationURL(url, scheme, rest)


def open_location(url: str) -> Location:
    """Open the location ``url`` names, with its scheme's registered opener.

    Raises ``InvalidUsage`` naming the (redacted) URL and listing the accepted
    forms when the URL is malformed or its scheme unknown, and saying what to
    do when an S3 bucket is missing or inaccessible.
    """
    scheme, parsed = _parse(url)
    return scheme.opener(parsed)


def validate_url(url: str) -> Scheme:
    """The scheme of ``url``, after checking the URL without opening anything.

    Raises ``InvalidUsage`` as :func:`open_location` would for a malformed
    URL or an unknown scheme (a scheme registered without a ``check`` is
    checked only by opening). Nothing is created nor contacted: a missing S3
    bucket is found by opening only.
    """
    scheme, parsed = _parse(url)
    if scheme.check is not None:
        scheme.check(parsed)
    return scheme


def local_path(url: str) -> Path | None:
    """The local directory ``url`` names, not created: for a valid ``file://`` URL
    (a scheme registered with ``local_path``); None for any other URL."""
    try:
        scheme, parsed = _parse(url)
        return scheme.local_path(parsed) if scheme.local_path is not None else None
    except InvalidUsage:
        return None


# ---- the built-in schemes ------------------------------------------------------------


def _check_mem(u: LocationURL) -> None:
    if not u.rest or "?" in u.rest or "#" in u.rest:
        raise u.invalid("mem:// needs a NAME and takes no query")


def _open_mem(u: LocationURL) -> Location:
    from persist.mem import open_mem

    _check_mem(u)
    blob, consensus = open_mem(u.rest)
    return Location(u.url, blob, consensus)


def _file_path(u: LocationURL) -> Path:
    rest = u.rest
    if "?" in rest or "#" in rest:
        raise u.invalid("file:// takes no query or fragment")
    path = unquote(rest)
    if path.startswith("localhost/"):
        path = path[len("localhost") :]
    if not path:
        raise u.invalid("file:// needs a PATH")
    if not path.startswith("/"):
        host = path.split("/", 1)[0]
        raise u.invalid(
            f"{host!r} is read as a host name, and file:// URLs take no host (a relative path is not "
            f"allowed either); for a local directory give its absolute path with three slashes, "
            f"e.g. file:///absolute/path",
        )
    return Path(path).expanduser()


def _check_file(u: LocationURL) -> None:
    _file_path(u)


def _open_file(u: LocationURL) -> Location:
    from persist.file import open_file

    root = _file_path(u)
    try:
        # (open_file makes the directory and any missing parents; their new entries, up to the
        # first parent that existed, are made durable by the location's first write)
        blob, consensus = open_file(root)
    except Determinate as e:
        raise InvalidUsage(
            f"cannot create the directory {str(root)!r} for {redact(u.url)!r}: {e.__cause__ or e}"
        ) from e
    return Location(u.url, blob, consensus)


@dataclass(frozen=True)
class _S3Target:
    bucket: str
    prefix: str
    endpoint_url: str | None
    region: str | None


def _s3_target(u: LocationURL) -> _S3Target:
    parts = u.split()
    if "@" in parts.netloc:
        raise u.invalid(
            "credentials do not belong in the URL; "
            "use the standard AWS chain (environment, ~/.aws)",
        )
    bucket = parts.netloc
    if not bucket:
        raise u.invalid("missing BUCKET")
    if not _BUCKET_RE.fullmatch(bucket) or ".." in bucket:
        raise u.invalid(f"{bucket!r} is not a valid bucket name (3-63 of a-z, 0-9, '.', '-')")
    if parts.fragment:
        raise u.invalid("s3:// takes no fragment")
    params: dict[str, str] = {}
    try:
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise u.invalid("malformed query") from None
    for name, value in pairs:
        if name not in _S3_PARAMS:
            shown = repr(name) if PARAM_NAME_RE.fullmatch(name) else "(its name not shown: it may be a secret)"
            hint = " (credentials do not belong in the URL)" if _SECRETISH.search(name) else ""
            raise u.invalid(
                f"unknown query parameter {shown}{hint}; known: {', '.join(sorted(_S3_PARAMS))}",
            )
        if name in params:
            raise u.invalid(f"query parameter {name!r} given twice")
        if not value:
            raise u.invalid(f"query parameter {name!r} is empty")
        params[name] = value
    region = params.get("region")
    if region is not None and not REGION_RE.fullmatch(region):
        raise u.invalid("region must be a region name (letters, digits, '-', '_', '.'), e.g. us-east-1")
    endpoint_url = params.get("endpoint_url")
    if endpoint_url is not None:
        _check_endpoint(u, endpoint_url)
    prefix = unquote(parts.path).strip("/")
    return _S3Target(bucket, prefix, endpoint_url, params.get("region"))


def _check_endpoint(u: LocationURL, endpoint_url: str) -> None:
    """``u.invalid`` unless ``endpoint_url`` is ``http[s]://HOST[:PORT][/PATH]`` with a plain path and nothing else."""
    try:
        ep = urlsplit(endpoint_url)
        port = ep.port
    except ValueError:
        raise u.invalid("endpoint_url is not a URL (e.g. http://127.0.0.1:9000)") from None
    if ep.scheme not in ("http", "https") or not ep.hostname:
        raise u.invalid(f"endpoint_url must be an http:// or https:// URL, got {redact_endpoint(endpoint_url)!r}")
    if "@" in ep.netloc:
        raise u.invalid("credentials do not belong in endpoint_url; use the standard AWS chain")
    if not HOST_RE.fullmatch(ep.hostname) or (port is None and ep.netloc.endswith(":")):
        raise u.invalid("endpoint_url has a malformed host or port")
    if ep.query or ep.fragment or "#" in endpoint_url or "?" in endpoint_url:
        raise u.invalid("endpoint_url takes no query or fragment: http[s]://HOST[:PORT][/PATH]")
    if not ENDPOINT_PATH_RE.fullmatch(ep.path):
        raise u.invalid(
            "endpoint_url's path may hold only letters, digits and '._~/-' (no ';' parameters, no escapes): "
            "http[s]://HOST[:PORT][/PATH]"
        )


def _check_s3(u: LocationURL) -> None:
    _s3_target(u)


def _open_s3(u: LocationURL) -> Location:
    target = _s3_target(u)

    from persist.s3 import open_s3

    blob, consensus = open_s3(
        target.bucket, target.prefix, endpoint_url=target.endpoint_url, region=target.region
    )
    return Location(u.url, blob, consensus)


def _s3model_target(u: LocationURL) -> tuple[Path, dict[str, float]]:
    from persist.s3model import parse_params

    path, _, query = u.rest.partition("?")
    root = _file_path(LocationURL(u.url, u.scheme, path))
    try:
        return root, parse_params(query)
    except ValueError as e:
        raise u.invalid(str(e)) from None


def _check_s3model(u: LocationURL) -> None:
    _s3model_target(u)


def _open_s3model(u: LocationURL) -> Location:
    from persist.s3model import open_s3model

    root, params = _s3model_target(u)
    try:
        blob, consensus = open_s3model(root, **params)
    except (Determinate, OSError) as e:
        raise InvalidUsage(f"cannot create the directory {str(root)!r} for {redact(u.url)!r}: {e}") from e
    return Location(u.url, blob, consensus)


register_scheme("mem", _open_mem, forms="mem://NAME", process_local=True, check=_check_mem)
register_scheme("file", _open_file, forms="file://PATH", check=_check_file, local_path=_file_path)
register_scheme(
    "s3",
    _open_s3,
    forms="s3://BUCKET[/PREFIX][?endpoint_url=URL&region=REGION]",
    check=_check_s3,
)
register_scheme(
    "s3model+file",
    _open_s3model,
    forms="s3model+file://PATH[?latency_ms=MS&cas_per_key_s=N]",
    check=_check_s3model,
    local_path=lambda u: _s3model_target(u)[0],
)
