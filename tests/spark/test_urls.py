"""Which URLs Spark accepts (txns.spark's ``check_url``): decided by the scheme registry, no session needed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from persist.errors import InvalidUsage
from persist.mem import open_mem
from persist.url import Location, LocationURL, register_scheme, unregister_scheme
from txns.spark import check_url


def test_urls_executors_can_reach(tmp_path: Path) -> None:
    for url in (f"file://{tmp_path}/store", f"file://localhost{tmp_path}/store", "s3://bucket/p?region=eu"):
        assert check_url(url) == url
    assert not (tmp_path / "store").exists(), "checking opens nothing"


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("mem://x", r"in-memory location.*use one of: file://PATH, s3://BUCKET"),
        ("file://relative/store", "file:///absolute/path"),
        ("file://", "needs a PATH"),
        ("ftp://host/x", "unknown scheme 'ftp'"),
        ("s3://Bad_Bucket", "not a valid bucket name"),
    ],
)
def test_urls_executors_cannot_reach(url: str, match: str) -> None:
    with pytest.raises(InvalidUsage, match=match):
        check_url(url)


@pytest.fixture
def two_schemes() -> Iterator[None]:
    def opener(u: LocationURL) -> Location:
        return Location(u.url, *open_mem(u.rest))

    register_scheme("localonly", opener, forms="localonly://NAME", process_local=True)
    register_scheme("shared", opener, forms="shared://NAME")
    try:
        yield
    finally:
        unregister_scheme("localonly")
        unregister_scheme("shared")


def test_registered_schemes_follow_their_process_local_flag(two_schemes: None) -> None:
    assert check_url("shared://x") == "shared://x"
    with pytest.raises(InvalidUsage, match=r"in-memory location.*shared://NAME") as info:
        check_url("localonly://x")
    assert "localonly://NAME" not in str(info.value).split("use one of:")[1]
