"""URLs fit for messages: only the parts on the allow-list, every other value ``REDACTED``.

:mod:`persist.url` refuses every URL part that is not on its allow-list
(see its module doc) and prints URLs through :func:`redact` (an
``endpoint_url`` value through :func:`redact_endpoint`). Both work from the
allow-list, not from a list of secret-looking names: whatever is not known
to be harmless is not printed. ``persist.s3.open_s3`` prints its endpoint
through :func:`redact_endpoint` too (it may be called without a URL).
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

REDACTED = "REDACTED"
PARAM_NAME_RE = re.compile(r"[A-Za-z][A-Za-z_.-]{0,31}")
"""A query parameter name plain enough to print (no digits: no keys)."""
REGION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A region's allowed form."""
ENDPOINT_PATH_RE = re.compile(r"[A-Za-z0-9._~/-]*")
"""An ``endpoint_url``'s allowed path."""
HOST_RE = re.compile(r"[A-Za-z0-9._:-]{1,255}")
"""An ``endpoint_url``'s allowed host."""
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
"""Control characters: never in a URL."""


def redact(url: object) -> str:
    """``url`` fit for messages and logs: only the parts on the allow-list, every other value ``REDACTED``.

    Kept as typed: the scheme, the host (less any userinfo) and the path.
    Query parameters: ``region`` and ``endpoint_url`` keep their values when
    these have the allowed form (a plain name; ``http[s]://HOST[:PORT][/PATH]``,
    itself redacted the same way); any other parameter prints as
    ``name=REDACTED`` (a name that is not short and plain, as ``REDACTED``);
    a fragment as ``#REDACTED``. Control characters print escaped.
    """
    if not isinstance(url, str):
        return f"<not a URL: a {type(url).__name__}>"
    head, hash_, _fragment = url.partition("#")
    head, qmark, query = head.partition("?")
    scheme, sep, rest = head.partition("://")
    if sep:
        netloc, slash, path = rest.partition("/")
        if "@" in netloc:
            netloc = netloc.rpartition("@")[2]
        head = f"{scheme}{sep}{netloc}{slash}{path}"
    out = head
    if qmark:
        out += "?" + "&".join(_redact_param(piece) for piece in query.split("&"))
    if hash_:
        out += "#" + REDACTED
    return CONTROL_RE.sub(lambda m: repr(m.group())[1:-1], out)


def _redact_param(piece: str) -> str:
    name, eq, value = piece.partition("=")
    plain = unquote(name)
    if not PARAM_NAME_RE.fullmatch(plain):
        return REDACTED
    if not eq:
        return REDACTED  # a bare word may be a pasted secret
    if plain == "region" and REGION_RE.fullmatch(unquote(value)):
        return piece
    if plain == "endpoint_url" and value:
        return f"{name}={redact_endpoint(unquote(value))}"
    return f"{name}={REDACTED}"


def redact_endpoint(url: str) -> str:
    """An ``endpoint_url`` value for messages: ``scheme://host[:port]`` and a plain path; the rest ``REDACTED``."""
    try:
        ep = urlsplit(url)
        host, port = ep.hostname, ep.port
    except ValueError:
        return REDACTED
    if ep.scheme not in ("http", "https") or not host or not HOST_RE.fullmatch(host):
        return REDACTED
    out = f"{ep.scheme}://{host}" + (f":{port}" if port is not None else "")
    if ep.path:
        out += ep.path if ENDPOINT_PATH_RE.fullmatch(ep.path) else "/" + REDACTED
    if ep.query:
        out += "?" + REDACTED
    if ep.fragment or url.endswith("#"):
        out += "#" + REDACTED
    return out


__all__ = ["REDACTED", "redact", "redact_endpoint"]
