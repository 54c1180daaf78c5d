"""No secret in a URL is ever printed (issue 26, item 4).

A secret typed into any part of a location URL that is not on the
allow-list (a fragment, an unknown query parameter, userinfo, a value
smuggled into ``endpoint_url``) is refused before anything is contacted, and
appears in no message: not the exception (nor its chain), not the CLI's
stderr or stdout (``--json`` too), not ``redact``'s output, not a repr.
"""

from __future__ import annotations

import io
import json
import uuid

import pytest

import txns
from persist import InvalidUsage
from persist.mem import open_mem
from persist.url import Location, open_location, redact, validate_url
from txns.cli import main

SECRET = "hunter2-" + uuid.uuid4().hex
EP = "http://127.0.0.1:9"

SECRET_URLS = [
    f"s3://bucket/p#aws_secret_access_key={SECRET}",
    f"s3://bucket/p#{SECRET}",
    f"s3://bucket/p?endpoint_url={EP}/#{SECRET}",
    f"s3://bucket/p?endpoint_url={EP}/%23{SECRET}",
    f"s3://bucket/p?endpoint_url={EP}/?token={SECRET}&region=us-east-1",
    f"s3://bucket/p?endpoint_url={EP}/;aws_secret_access_key={SECRET}&region=us-east-1",
    f"s3://bucket/p?endpoint_url={EP}/%3Baws_secret_access_key%3D{SECRET}",
    f"s3://bucket/p?endpoint_url=http://{SECRET}@127.0.0.1:9",
    f"s3://bucket/p?endpoint_url=http://user:{SECRET}@127.0.0.1:9",
    f"s3://bucket/p?sig={SECRET}",
    f"s3://bucket/p?x-amz-security-token={SECRET}&region=us-east-1",
    f"s3://bucket/p?X-Amz-Signature={SECRET}",
    f"s3://bucket/p?colour={SECRET}",
    f"s3://bucket/p?{SECRET}",
    f"s3://bucket/p?{SECRET}=1",
    f"s3://bucket/p?region={SECRET};x",
    f"s3://AKIA:{SECRET}@bucket/p",
    f"s3://{SECRET}@bucket/p",
    f"file:///tmp/x#{SECRET}",
    f"file:///tmp/x?token={SECRET}",
    f"mem://x#{SECRET}",
    f"mem://x?sig={SECRET}",
    f"ftp://host/p?sig={SECRET}",
]


def _messages(e: BaseException) -> str:
    """Every text an exception shows: its message, repr and those of the chain a traceback prints."""
    out = []
    seen: BaseException | None = e
    while seen is not None:
        out += [str(seen), repr(seen), repr(seen.args)]
        seen = seen.__cause__ or (None if seen.__suppress_context__ else seen.__context__)
    return "\n".join(out)


@pytest.mark.parametrize("url", SECRET_URLS)
def test_a_secret_in_a_url_is_refused_and_never_printed(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # credentials in the environment: an S3 location would be contacted (and its errors retried) if accepted
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    assert SECRET not in redact(url)
    if "@" not in url:  # (userinfo is left out)
        assert "REDACTED" in redact(url)
    for call in (open_location, validate_url, txns.connect):
        with pytest.raises(InvalidUsage) as info:
            call(url)
        assert SECRET not in _messages(info.value), call


@pytest.mark.parametrize("url", SECRET_URLS)
@pytest.mark.parametrize("command", [["tables"], ["init"], ["inspect"], ["gc"], ["history"]])
def test_the_cli_prints_no_secret(url: str, command: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    for extra in ([], ["--json"]):
        out, err = io.StringIO(), io.StringIO()
        assert main([*command, url, *extra], out, err) == 2
        assert SECRET not in out.getvalue() and SECRET not in err.getvalue()
        if extra:
            assert json.loads(out.getvalue())["error"]["exit_status"] == 2


def test_redact_keeps_what_is_on_the_allow_list() -> None:
    url = "s3://bucket/some/prefix?endpoint_url=http://127.0.0.1:9000/base&region=us-east-1"
    assert redact(url) == url
    assert redact("file:///tmp/x y") == "file:///tmp/x y"
    assert redact("mem://name") == "mem://name"
    assert redact(f"s3://b/p?region=eu&token={SECRET}") == "s3://b/p?region=eu&token=REDACTED"
    assert redact(f"s3://b/p?endpoint_url=http://h:9/x;{SECRET}") == "s3://b/p?endpoint_url=http://h:9/REDACTED"
    assert redact("s3://b/p\n") == "s3://b/p\\n"
    assert redact(12) == "<not a URL: a int>"  # type: ignore[arg-type]


def test_a_location_repr_is_redacted() -> None:
    blob, consensus = open_mem(f"repr-{uuid.uuid4().hex}")
    loc = Location(f"s3://bucket/p?token={SECRET}", blob, consensus)
    assert SECRET not in repr(loc) and "REDACTED" in repr(loc)


@pytest.mark.parametrize(
    "url",
    [
        "file:///tmp/x%00y",
        "file:///tmp/x\x00y",
        "file:///tmp/x\ny",
        "file:///tmp/x%0Ay",
        "s3://bucket\n/p",
        "mem://a\tb",
    ],
)
def test_control_characters_are_refused_clearly(url: str) -> None:
    for call in (open_location, validate_url, txns.connect):
        with pytest.raises(InvalidUsage, match="control character"):
            call(url)


def test_a_url_that_is_not_a_str_is_refused_clearly() -> None:
    for bad in (None, 12, b"file:///tmp/x"):
        for call in (open_location, validate_url):
            with pytest.raises(InvalidUsage, match="must be a str"):
                call(bad)  # type: ignore[arg-type]
