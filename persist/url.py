"""Locations by URL: the one place that turns a URL into storage backends.

Accepted forms::

    mem://NAME                                  in-process, shared by NAME (tests)
    file:///ABSOLUTE/PATH                       a local directory, created if missing
                                                (file://localhost/ABSOLUTE/PATH too; a host name
                                                such as file://tmp/x is refused: it is not a path)
    s3://BUCKET[/PREFIX][?endpoint_url=URL&region=REGION]
                                                S3 or an S3-compatible store

Example::

    >>> loc = open_location("mem://doc-example")
    >>> loc.blob.set("k", b"v")
    >>> loc.blob.get("k")
    b'v'

Credentials never go in a URL: S3 credentials come from boto3's standard
chain, and a URL carrying userinfo or a secret-looking query parameter is
refused (without echoing the secret). Use :func:`redact` before logging a URL:
it keeps the URL exactly as the user typed it, less any secret.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from persist.errors import InvalidUsage
from persist.location import Blob, Consensus

ACCEPTED_FORMS = (
    "mem://NAME",
    "file://PATH",
    "s3://BUCKET[/PREFIX][?endpoint_url=URL&region=REGION]",
)
_S3_PARAMS = frozenset({"endpoint_url", "region"})
_SECRETISH = re.compile(
    r"secret|password|passwd|token|credential|signature|access_?key|session|auth", re.IGNORECASE
)
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_REDACTED = "REDACTED"


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


def redact(url: str) -> str:
    """``url`` fit for messages and logs: exactly as typed, less userinfo and secret-looking query values.

    Query values that are URLs themselves (``endpoint_url``) are redacted too.
    Nothing else is rewritten, so messages quote the URL the user typed.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    out = url
    if "@" in parts.netloc:
        userinfo = parts.netloc.rpartition("@")[0] + "@"
        out = out.replace("//" + userinfo, "//", 1)
    if parts.query:
        pieces = []
        for piece in parts.query.split("&"):
            name, eq, value = piece.partition("=")
            if eq and _SECRETISH.search(unquote(name)):
                piece = f"{name}={_REDACTED}"
            elif eq and "://" in unquote(value):
                inner = unquote(value)
                red = redact(inner)
                if red != inner:
                    piece = f"{name}={red}"
            pieces.append(piece)
        query = "&".join(pieces)
        if query != parts.query:
            out = out.replace("?" + parts.query, "?" + query, 1)
    return out


def _bad(url: str, why: str) -> InvalidUsage:
    forms = ", ".join(ACCEPTED_FORMS)
    return InvalidUsage(f"invalid location URL {redact(url)!r}: {why}; accepted forms: {forms}")


def open_location(url: str) -> Location:
    """Open the location ``url`` names (see the module doc for the forms).

    Raises ``InvalidUsage`` naming the (redacted) URL and listing the accepted
    forms when the URL is malformed, and saying what to do when an S3 bucket
    is missing or inaccessible.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise _bad(url, "missing '://'")
    scheme = scheme.lower()
    if scheme == "mem":
        return _open_mem(url, rest)
    if scheme == "file":
        return _open_file(url, rest)
    if scheme == "s3":
        return _open_s3(url)
    raise _bad(url, f"unknown scheme {scheme!r}")


def _open_mem(url: str, rest: str) -> Location:
    from persist.mem import open_mem

    if not rest or "?" in rest or "#" in rest:
        raise _bad(url, "mem:// needs a NAME and takes no query")
    blob, consensus = open_mem(rest)
    return Location(url, blob, consensus)


def _open_file(url: str, rest: str) -> Location:
    from persist.file import open_file

    if "?" in rest or "#" in rest:
        raise _bad(url, "file:// takes no query or fragment")
    path = unquote(rest)
    if path.startswith("localhost/"):
        path = path[len("localhost") :]
    if not path:
        raise _bad(url, "file:// needs a PATH")
    if not path.startswith("/"):
        host = path.split("/", 1)[0]
        raise _bad(
            url,
            f"{host!r} is read as a host name, and file:// URLs take no host (a relative path is not "
            f"allowed either); for a local directory give its absolute path with three slashes, "
            f"e.g. file:///absolute/path",
        )
    root = Path(path).expanduser()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InvalidUsage(
            f"cannot create the directory {str(root)!r} for {redact(url)!r}: {e}"
        ) from e
    blob, consensus = open_file(root)
    return Location(url, blob, consensus)


def _open_s3(url: str) -> Location:
    try:
        parts = urlsplit(url)
    except ValueError as e:
        raise _bad(url, f"cannot parse it ({e})") from None
    if "@" in parts.netloc:
        raise _bad(
            url,
            "credentials do not belong in the URL; "
            "use the standard AWS chain (environment, ~/.aws)",
        )
    bucket = parts.netloc
    if not bucket:
        raise _bad(url, "missing BUCKET")
    if not _BUCKET_RE.match(bucket) or ".." in bucket:
        raise _bad(url, f"{bucket!r} is not a valid bucket name (3-63 of a-z, 0-9, '.', '-')")
    if parts.fragment:
        raise _bad(url, "s3:// takes no fragment")
    params: dict[str, str] = {}
    try:
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise _bad(url, "malformed query") from None
    for name, value in pairs:
        if name not in _S3_PARAMS:
            hint = " (credentials do not belong in the URL)" if _SECRETISH.search(name) else ""
            raise _bad(
                url,
                f"unknown query parameter {name!r}{hint}; known: {', '.join(sorted(_S3_PARAMS))}",
            )
        if name in params:
            raise _bad(url, f"query parameter {name!r} given twice")
        if not value:
            raise _bad(url, f"query parameter {name!r} is empty")
        params[name] = value
    endpoint_url = params.get("endpoint_url")
    if endpoint_url is not None:
        ep = urlsplit(endpoint_url)
        if ep.scheme not in ("http", "https") or not ep.hostname:
            raise _bad(
                url,
                f"endpoint_url must be an http:// or https:// URL, got {redact(endpoint_url)!r}",
            )
        if ep.username or ep.password:
            raise _bad(url, "credentials do not belong in endpoint_url; use the standard AWS chain")
    prefix = unquote(parts.path).strip("/")

    from persist.s3 import open_s3

    blob, consensus = open_s3(
        bucket, prefix, endpoint_url=endpoint_url, region=params.get("region")
    )
    return Location(url, blob, consensus)
