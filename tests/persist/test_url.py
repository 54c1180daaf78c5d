"""Locations by URL (:mod:`persist.url`): the scheme registry, open_location's checks, and redact."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import persist.url
from persist.errors import InvalidUsage
from persist.mem import open_mem
from persist.url import (
    Location,
    LocationURL,
    accepted_forms,
    local_path,
    open_location,
    redact,
    register_scheme,
    schemes,
    unregister_scheme,
    validate_url,
)

# ---- open_location ------------------------------------------------------------------


def test_open_location_unknown_scheme() -> None:
    with pytest.raises(InvalidUsage) as info:
        open_location("ftp://host/path")
    message = str(info.value)
    assert "ftp://host/path" in message and "unknown scheme 'ftp'" in message
    for form in ("mem://NAME", "file://PATH", "s3://BUCKET"):
        assert form in message


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("no-scheme-at-all", "missing '://'"),
        ("mem://", "needs a NAME"),
        ("file://", "needs a PATH"),
        ("s3://", "missing BUCKET"),
        ("s3:///prefix", "missing BUCKET"),
        ("s3://Bad_Bucket/p", "not a valid bucket name"),
        ("s3://ab/p", "not a valid bucket name"),
        ("s3://bucket/p?colour=red", "unknown query parameter 'colour'"),
        ("s3://bucket/p?region=a&region=b", "given twice"),
        ("s3://bucket/p?region=", "is empty"),
        ("s3://bucket/p?endpoint_url=ftp://host", "endpoint_url must be"),
        ("s3://bucket/p#frag", "no fragment"),
    ],
)
def test_open_location_malformed(url: str, why: str) -> None:
    for check in (open_location, validate_url):  # validate_url: the same checks, opening nothing
        with pytest.raises(InvalidUsage) as info:
            check(url)
        message = str(info.value)
        assert why in message
        assert "accepted forms" in message and "s3://BUCKET" in message


@pytest.mark.parametrize(
    "url",
    [
        "s3://AKIAEXAMPLE:hunter2-secret@bucket/p",
        "s3://bucket/p?aws_secret_access_key=hunter2-secret",
        "s3://bucket/p?endpoint_url=http://user:hunter2-secret@host:9000",
    ],
)
def test_open_location_refuses_credentials_in_url(url: str) -> None:
    with pytest.raises(InvalidUsage, match="credentials") as info:
        open_location(url)
    assert "hunter2-secret" not in str(info.value)


@pytest.mark.s3
def test_open_location_missing_bucket(
    s3_url_factory: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "sEcReT-" + uuid.uuid4().hex
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    url = s3_url_factory().replace("s3://test-", "s3://missing-", 1)
    bucket = url.split("/")[2]
    assert validate_url(url).name == "s3"  # (it contacts nothing: the bucket is found missing on opening)
    with pytest.raises(InvalidUsage) as info:
        open_location(url)
    message = str(info.value)
    assert f"bucket {bucket!r} does not exist" in message
    assert "create it" in message and f"s3://{bucket}" in message
    assert secret not in message and secret not in repr(info.value.__cause__)


def test_open_location_file_creates_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    absolute = tmp_path / "abs" / "store"
    loc = open_location(f"file://{absolute}")
    loc.blob.set("k", b"v")
    assert (absolute / "blob" / "k").read_bytes() == b"v"
    monkeypatch.chdir(tmp_path)
    # `file://rel/store` reads "rel" as a host name: refused (it used to create ./rel/store silently)
    with pytest.raises(InvalidUsage, match="file:///absolute/path"):
        open_location("file://rel/store")
    assert not (tmp_path / "rel").exists(), "nothing was created"


def test_open_location_mem_is_shared_by_name() -> None:
    name = f"mem://shared-{uuid.uuid4().hex}"
    a, b = open_location(name), open_location(name)
    a.blob.set("k", b"v")
    assert b.blob.get("k") == b"v"
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.url = "mem://other"  # type: ignore[misc]


def test_redact() -> None:
    assert redact("s3://AKIA:secret@bucket/p?region=us-east-1") == "s3://bucket/p?region=us-east-1"
    redacted = redact(
        "s3://bucket/p?aws_secret_access_key=abc&X-Amz-Signature=def&session_token=ghi&region=eu"
    )
    assert "abc" not in redacted and "def" not in redacted and "ghi" not in redacted
    assert "region=eu" in redacted and "REDACTED" in redacted
    assert redact("file:///tmp/x") == "file:///tmp/x"
    nested = redact("s3://b/p?endpoint_url=http://user:pw-secret@host:9000&region=eu")
    assert "pw-secret" not in nested and "endpoint_url=http://host:9000" in nested


# ---- the scheme registry ------------------------------------------------------------


def test_the_built_in_schemes() -> None:
    registered = schemes()
    assert list(registered)[:3] == ["mem", "file", "s3"]
    assert registered["mem"].process_local and not registered["file"].process_local
    assert not registered["s3"].process_local
    assert accepted_forms()[:3] == (
        "mem://NAME",
        "file://PATH",
        "s3://BUCKET[/PREFIX][?endpoint_url=URL&region=REGION]",
    )
    assert "mem://NAME" not in accepted_forms(shared_only=True)
    assert accepted_forms() == persist.url.ACCEPTED_FORMS  # (the old constant follows the registry)


@pytest.fixture
def scratch_scheme() -> Iterator[list[LocationURL]]:
    """A ``scratch://NAME`` scheme (mem storage) registered for the test; the URLs its opener saw."""
    seen: list[LocationURL] = []

    def open_scratch(u: LocationURL) -> Location:
        seen.append(u)
        if not u.rest:
            raise u.invalid("scratch:// needs a NAME")
        return Location(u.url, *open_mem(f"scratch-{u.rest}"))

    register_scheme("scratch", open_scratch, forms=["scratch://NAME", "scratch://NAME/"], process_local=True)
    try:
        yield seen
    finally:
        unregister_scheme("scratch")


def test_a_registered_scheme_opens_and_is_listed(scratch_scheme: list[LocationURL]) -> None:
    name = uuid.uuid4().hex
    loc = open_location(f"SCRATCH://{name}")  # (schemes are case-insensitive)
    loc.blob.set("k", b"v")
    assert open_location(f"scratch://{name}").blob.get("k") == b"v"
    assert [(u.scheme, u.rest) for u in scratch_scheme] == [("scratch", name), ("scratch", name)]
    assert scratch_scheme[0].url == f"SCRATCH://{name}"
    assert validate_url(f"scratch://{name}").name == "scratch"  # (registered without a check: not opened)
    assert len(scratch_scheme) == 2
    with pytest.raises(InvalidUsage, match=r"scratch:// needs a NAME; accepted forms: .*scratch://NAME, scratch://NAME/"):
        open_location("scratch://")
    with pytest.raises(InvalidUsage, match=r"unknown scheme 'nope'.*scratch://NAME"):
        open_location("nope://x")
    assert "scratch://NAME" not in accepted_forms(shared_only=True)


def test_unregistering_forgets_the_scheme(scratch_scheme: list[LocationURL]) -> None:
    unregister_scheme("scratch")
    assert "scratch" not in schemes() and "scratch://NAME" not in accepted_forms()
    with pytest.raises(InvalidUsage, match="unknown scheme 'scratch'"):
        open_location("scratch://x")
    unregister_scheme("scratch")  # (not registered: no error)


def test_registration_is_checked(scratch_scheme: list[LocationURL]) -> None:
    opener = schemes()["scratch"].opener
    with pytest.raises(InvalidUsage, match="already registered"):
        register_scheme("scratch", opener, forms="scratch://NAME")
    with pytest.raises(InvalidUsage, match="already registered"):
        register_scheme("S3", opener, forms="s3://X")
    assert schemes()["s3"].opener is not opener
    with pytest.raises(InvalidUsage, match="invalid scheme name"):
        register_scheme("no scheme", opener, forms="x")
    with pytest.raises(InvalidUsage, match="at least one URL form"):
        register_scheme("formless", opener, forms=[])
    assert "formless" not in schemes()
    replaced = register_scheme("scratch", opener, forms="scratch://OTHER", replace=True)
    assert schemes()["scratch"] is replaced and replaced.forms == ("scratch://OTHER",)
    assert not replaced.process_local


def test_validate_url_opens_nothing(tmp_path: Path) -> None:
    target = tmp_path / "not" / "yet"
    assert validate_url(f"file://{target}").name == "file"
    assert validate_url(f"mem://{uuid.uuid4().hex}").process_local
    assert validate_url("s3://bucket/p?endpoint_url=http://127.0.0.1:1&region=eu").name == "s3"
    assert not (tmp_path / "not").exists()
    with pytest.raises(InvalidUsage, match="file:///absolute/path"):
        validate_url("file://relative/store")


def test_local_path(tmp_path: Path) -> None:
    assert local_path(f"file://{tmp_path}/db") == tmp_path / "db"
    assert local_path(f"file://localhost{tmp_path}/db") == tmp_path / "db"
    assert local_path("file:///a%20b/c") == Path("/a b/c")
    assert not (tmp_path / "db").exists()
    for url in (
        "file://relative/db",
        "file://",
        f"file://{tmp_path}?x=1",
        "mem://x",
        "s3://bucket/p",
        "ftp://h",
        "nothing",
    ):
        assert local_path(url) is None, url
