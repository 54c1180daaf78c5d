"""Chaos: exactly-once commits under storage faults and killed processes (issue #7).

- The SHORT profile (in the default run): one seed on S3 (moto behind the
  fault proxy: a 40 s run phase, ~55 s in all), one on SeaweedFS behind the
  fault proxy (a real S3 server: 35 s, fewer kills) and one on a directory (kills only:
  12 s, ~20 s in all). ``CHAOS_SECONDS`` overrides the
  run-phase length, ``CHAOS_SEED`` the seed.
- The TIGHT short case (in the default run, ``-k tight``): moto behind the
  fault proxy with the GC windows shrunk to seconds (part grace 1 s,
  retention 4 s, leases 6 s), the maintainer (compaction and GC) and two
  long-lived readers alongside the workers: ~45 s of run, ~90 s in all. It
  asserts that parts were deleted, versions truncated and leases lapsed
  (:mod:`persist.metrics`, summed over every process).
- The LONG profile (``CHAOS_PROFILE=long``): several seeds (``CHAOS_SEEDS``,
  default ``1,2,3``) x minutes (``CHAOS_SECONDS``, default 180) x {S3
  default, S3 tight, directory}. ``benchmarks/chaos.py`` runs the same with a
  table of results.

A run fails if the verifier (or a worker, or the driver) found any
violation: see :mod:`tests.chaos.driver` for what is checked. The fault
proxy itself is tested by tests/persist/test_fault_proxy.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.driver import ChaosConfig, ChaosResult, run_chaos, tight_faults

PROFILE = os.environ.get("CHAOS_PROFILE", "short")
LONG = PROFILE == "long"


def _env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def _check(res: ChaosResult) -> None:
    print(res.summary())
    assert res.acked > 0, f"nothing was committed:\n{res.summary()}"
    assert res.ok, f"the chaos run found violations:\n{res.summary()}"


def _run(tmp_path: Path, **kw: Any) -> ChaosResult:
    log: Callable[[str], None] = lambda m: print(m, flush=True)  # noqa: E731
    return run_chaos(ChaosConfig(work_dir=tmp_path / "chaos", log=log, **kw))


SHORT_S3_S = _env_float("CHAOS_SECONDS", 40.0)
SHORT_FILE_S = _env_float("CHAOS_SECONDS", 12.0)
SHORT_GROUP_S3_S = _env_float("CHAOS_SECONDS", 25.0)
SHORT_SEAWEEDFS_S = _env_float("CHAOS_SECONDS", 35.0)
SHORT_SEED = int(os.environ.get("CHAOS_SEED", "1"))


@pytest.mark.chaos
@pytest.mark.s3
@pytest.mark.slow
@pytest.mark.timeout(int(SHORT_S3_S) + 420)
@pytest.mark.skipif(LONG, reason="CHAOS_PROFILE=long runs the long profile instead")
def test_chaos_short_s3(tmp_path: Path) -> None:
    """One seed on moto behind the fault proxy: every fault kind, kills, CLI runs (~60 s)."""
    _check(_run(tmp_path, backend="s3", seconds=SHORT_S3_S, seed=SHORT_SEED))


@pytest.mark.chaos
@pytest.mark.s3
@pytest.mark.seaweedfs
@pytest.mark.slow
@pytest.mark.timeout(int(SHORT_SEAWEEDFS_S) + 420)
@pytest.mark.skipif(LONG, reason="CHAOS_PROFILE=long runs the long profile instead")
def test_chaos_short_seaweedfs(tmp_path: Path, seaweedfs_endpoint: str) -> None:
    """One seed on SeaweedFS behind the fault proxy: every fault kind, kills, CLI runs (~75 s)."""
    res = _run(
        tmp_path, backend="s3", seconds=SHORT_SEAWEEDFS_S, seed=SHORT_SEED, upstream=seaweedfs_endpoint, kill_every_s=8
    )
    _check(res)


@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.timeout(int(SHORT_FILE_S) + 300)
@pytest.mark.skipif(LONG, reason="CHAOS_PROFILE=long runs the long profile instead")
def test_chaos_short_file(tmp_path: Path) -> None:
    """One seed on a local directory: kills only (~20 s)."""
    _check(_run(tmp_path, backend="file", seconds=SHORT_FILE_S, seed=SHORT_SEED))


@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.timeout(int(SHORT_FILE_S) + 300)
@pytest.mark.skipif(LONG, reason="CHAOS_PROFILE=long runs the long profile instead")
def test_chaos_short_group_commit_file(tmp_path: Path) -> None:
    """Group commit (txns.group_commit) on a directory: 4 workers queueing, sequencers SIGKILLed (~25 s)."""
    _check(_run(tmp_path, backend="file", seconds=SHORT_FILE_S, seed=SHORT_SEED, workers=4, group_commit=True))


@pytest.mark.chaos
@pytest.mark.s3
@pytest.mark.slow
@pytest.mark.timeout(int(SHORT_GROUP_S3_S) + 420)
@pytest.mark.skipif(LONG, reason="CHAOS_PROFILE=long runs the long profile instead")
def test_chaos_short_group_commit_s3(tmp_path: Path) -> None:
    """Group commit on moto behind the fault proxy: every fault kind, sequencers SIGKILLed (~45 s)."""
    res = _run(
        tmp_path, backend="s3", seconds=SHORT_GROUP_S3_S, seed=SHORT_SEED, workers=4, group_commit=True, kill_every_s=8
    )
    _check(res)


SHORT_TIGHT_S = _env_float("CHAOS_SECONDS", 45.0)


@pytest.mark.chaos
@pytest.mark.s3
@pytest.mark.slow
@pytest.mark.timeout(int(3 * SHORT_TIGHT_S) + 420)
@pytest.mark.skipif(LONG, reason="CHAOS_PROFILE=long runs the long profile instead")
def test_chaos_short_tight_s3(tmp_path: Path) -> None:
    """The GC windows inside the run (~90 s): moto behind the fault proxy with part grace 1 s, consensus
    retention 4 s and reader leases 6 s; the maintainer compacting and collecting garbage (and killed)
    alongside the workers, and two long-lived readers whose every read the verifier checks against the
    history. Parts must be deleted, versions truncated and leases lapse, with no violation."""
    res = _run(
        tmp_path,
        backend="s3",
        variant="tight",
        seconds=SHORT_TIGHT_S,
        seed=SHORT_SEED,
        faults=tight_faults(),
        kill_every_s=10.0,  # (a worker takes seconds to start on a busy machine: let it commit first)
        pad_every=3,  # (a third of transfers write a Parquet part: compaction retires parts, GC deletes them)
        # past the 45 s, until each has happened at least once, and the maintainer finished a compaction
        # and a GC round (on a busy machine this takes longer)
        goals={"parts_deleted": 1, "versions_truncated": 1, "reader_leases_lapsed": 1, "compact": 1, "gc": 1},
        max_seconds=3 * SHORT_TIGHT_S,
    )
    _check(res)
    p = res.persist
    assert p.get("parts_deleted", 0) > 0, f"no retired part was deleted:\n{res.summary()}"
    assert p.get("versions_truncated", 0) > 0, f"no consensus version was truncated:\n{res.summary()}"
    assert p.get("reader_leases_lapsed", 0) > 0, f"no reader lease lapsed:\n{res.summary()}"
    assert res.side_stats.get("compact", 0) > 0 and res.side_stats.get("gc", 0) > 0, res.summary()
    assert res.verifier.get("reads_exact", 0) > 0, f"no long-lived read was checked:\n{res.summary()}"


LONG_SEEDS = [int(s) for s in os.environ.get("CHAOS_SEEDS", "1,2,3").split(",") if s.strip()]
LONG_S = _env_float("CHAOS_SECONDS", 180.0)
LONG_CASES = [
    pytest.param("s3", "default", marks=pytest.mark.s3),
    pytest.param("s3", "tight", marks=pytest.mark.s3),
    pytest.param("file", "default"),
]


@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.timeout(int(LONG_S) + 900)
@pytest.mark.skipif(not LONG, reason="the long chaos profile runs with CHAOS_PROFILE=long")
@pytest.mark.parametrize("seed", LONG_SEEDS)
@pytest.mark.parametrize(("backend", "variant"), LONG_CASES)
def test_chaos_long(tmp_path: Path, backend: str, variant: str, seed: int) -> None:
    """Several seeds x minutes on S3 (both worker variants) and on a directory."""
    _check(_run(tmp_path, backend=backend, variant=variant, seconds=LONG_S, seed=seed))
