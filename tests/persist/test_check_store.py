"""``persist.check_store`` and ``txns check-store``: good stores pass, both kinds of broken store are flagged.

Good: moto behind the project's atomic fixture, SeaweedFS, ``file://`` and
``mem://``. Broken (the fault proxy in front of moto): a store that ignores
the conditional headers, and one whose check and write are not atomic (a
HEAD, a pause, an unconditional PUT). Plain moto is not a negative case: it
serializes most races by luck (issue 24).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from persist.check_store import check_store
from persist.errors import InvalidUsage
from persist.fault_proxy import ConditionalMode, FaultPlan, FaultProxy
from tests.seaweedfs import S3_BACKENDS
from txns.cli import main

CORRECTNESS = [
    "If-None-Match: * enforced",
    "If-Match enforced",
    "race: If-None-Match",
    "race: If-Match",
    "read-after-write",
    "list-after-write",
    "delete",
]
SMALL: dict[str, Any] = {"racers": 6, "race_keys": 8, "match_rounds": 4, "latency_samples": 5, "sustain_s": 0.3}


def _passes(report: Any) -> None:
    assert report.ok, report.table()
    assert [r.name for r in report.results if r.ok is True] == CORRECTNESS
    latency, rate = (r for r in report.results if r.ok is None)
    assert latency.value is not None and latency.value > 0 and latency.unit == "ms"
    assert rate.value is not None and rate.value > 0 and rate.unit == "/s"
    assert report.table().splitlines()[-1].startswith("PASS")


def test_file_store_passes_and_is_left_as_it_was(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _passes(check_store(f"file://{root}", **SMALL))
    assert not root.exists()  # it did not exist before: nothing left
    root.mkdir()
    (root / "mine").write_text("x")
    _passes(check_store(f"file://{root}", **SMALL))
    assert [p.name for p in root.iterdir()] == ["mine"]


def test_mem_store_passes() -> None:
    _passes(check_store("mem://check-store-test", **SMALL))


@pytest.mark.s3
@pytest.mark.parametrize("s3_backend", S3_BACKENDS)
def test_s3_stores_pass_and_are_left_empty(s3_url_factory: Callable[..., str], s3_admin: Any) -> None:
    url = s3_url_factory("probe")
    _passes(check_store(url, **SMALL))
    bucket = url.split("/")[2]
    assert s3_admin.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0


def _through(moto_endpoint: str, url: str, proxy: FaultProxy) -> str:
    return url.replace(moto_endpoint, proxy.url)


@pytest.mark.s3
def test_a_store_ignoring_conditional_headers_is_flagged(
    moto_endpoint: str, s3_url_factory: Callable[..., str], s3_admin: Any
) -> None:
    url = s3_url_factory("ignoring")
    with FaultProxy(moto_endpoint, faults=FaultPlan(conditional=ConditionalMode.IGNORE)) as proxy:
        report = check_store(_through(moto_endpoint, url, proxy), **SMALL)
        assert proxy.counters()["conditional_ignored"] > 0
    broken = {r.name for r in report.broken}
    assert {"If-None-Match: * enforced", "If-Match enforced", "race: If-None-Match"} <= broken, report.table()
    assert not report.ok
    last = report.table().splitlines()[-1]
    assert last.startswith("FAIL") and "If-None-Match: * enforced" in last
    assert s3_admin.list_objects_v2(Bucket=url.split("/")[2]).get("KeyCount", 0) == 0  # cleaned up all the same


@pytest.mark.s3
def test_a_store_checking_and_writing_apart_is_flagged(
    moto_endpoint: str, s3_url_factory: Callable[..., str]
) -> None:
    url = s3_url_factory("split")
    plan = FaultPlan(conditional=ConditionalMode.SPLIT, split_pause_s=0.2)
    with FaultProxy(moto_endpoint, faults=plan) as proxy:
        report = check_store(_through(moto_endpoint, url, proxy), **SMALL)
        assert proxy.counters()["conditional_split"] > 0
    # one writer at a time sees the conditions kept: only the races tell
    assert {r.name for r in report.broken} == {"race: If-None-Match", "race: If-Match"}, report.table()
    assert "more than one winner" in next(r.detail for r in report.broken)


def test_bad_arguments_and_urls_are_refused() -> None:
    with pytest.raises(InvalidUsage, match="racers >= 2"):
        check_store("mem://x", racers=1)
    with pytest.raises(InvalidUsage):
        check_store("nope://x")


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = main(["check-store", *argv], out, err)
    return rc, out.getvalue(), err.getvalue()


def test_cli_on_a_good_store(tmp_path: Path) -> None:
    rc, out, _ = _cli(f"file://{tmp_path}/db", "--racers", "4", "--keys", "4", "--rounds", "2", "--seconds", "0.2")
    assert rc == 0, out
    assert "race: If-None-Match" in out and out.rstrip().splitlines()[-1].startswith("PASS")
    rc, out, _ = _cli(f"file://{tmp_path}/db", "--racers", "4", "--keys", "4", "--rounds", "2", "--json")
    j = json.loads(out)
    assert rc == 0 and j["ok"] is True and j["broken"] == [] and len(j["checks"]) == 9


@pytest.mark.s3
def test_cli_on_a_broken_store_exits_1_saying_what_is_broken(
    moto_endpoint: str, s3_url_factory: Callable[..., str]
) -> None:
    url = s3_url_factory("cli")
    with FaultProxy(moto_endpoint, faults=FaultPlan(conditional=ConditionalMode.IGNORE)) as proxy:
        rc, out, _ = _cli(_through(moto_endpoint, url, proxy), "--keys", "4", "--rounds", "2", "--seconds", "0.2")
        assert rc == 1
        assert "BROKEN" in out and "FAIL: do not use this store" in out and "If-Match enforced" in out
        rc, out, _ = _cli(_through(moto_endpoint, url, proxy), "--keys", "4", "--rounds", "2", "--json")
    assert rc == 1 and "If-None-Match: * enforced" in json.loads(out)["broken"]


def test_cli_bad_url_exits_2() -> None:
    rc, _, err = _cli("nope://x")
    assert rc == 2 and "txns check-store:" in err
