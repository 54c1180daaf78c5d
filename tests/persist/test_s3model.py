"""The S3 model (persist.s3model): the storage contract, latency before every request, a cap shared by processes.

No wall-clock thresholds: latency is checked by the sleeps the model asks
for (and that each comes before its request), the cap by counts with a
frozen clock (a bucket that never refills grants exactly its burst, however
the processes interleave).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from persist import Determinate, InvalidUsage
from persist.file import open_file
from persist.location import Blob, CaSResult, Consensus
from persist.s3model import S3Model, S3ModelBlob, S3ModelConsensus
from persist.testing import BlobConformance, ConsensusConformance, location_clients
from persist.unreliable import Op
from persist.url import local_path, open_location, validate_url


class TestS3ModelConformance(BlobConformance, ConsensusConformance):
    @pytest.fixture
    def blob_factory(self, tmp_path: Path) -> Iterator[Callable[[], Blob]]:
        with location_clients(f"s3model+file://{tmp_path}/s?latency_ms=0&cas_per_key_s=0") as new:
            yield lambda: new().blob

    @pytest.fixture
    def consensus_factory(self, tmp_path: Path) -> Iterator[Callable[[], Consensus]]:
        with location_clients(f"s3model+file://{tmp_path}/s?latency_ms=0&cas_per_key_s=0") as new:
            yield lambda: new().consensus


def test_every_request_sleeps_the_latency_first(tmp_path: Path) -> None:
    log: list[str] = []
    model = S3Model(tmp_path / "state", latency_s=0.06, cas_per_key_s=0, sleep=lambda s: log.append(f"sleep {s}"))
    inner_blob, inner_consensus = open_file(tmp_path / "db")

    class Logged(Blob):
        def get(self, key: str) -> bytes | None:
            log.append("get")
            return inner_blob.get(key)

        def set(self, key: str, value: bytes) -> None:
            log.append("set")
            inner_blob.set(key, value)

        def delete(self, key: str) -> None:
            inner_blob.delete(key)

        def list_keys(self, prefix: str) -> Iterator[str]:
            return inner_blob.list_keys(prefix)

    blob = S3ModelBlob(Logged(), model)
    consensus = S3ModelConsensus(inner_consensus, model)
    blob.set("a", b"1")
    assert blob.get("a") == b"1"
    assert log == ["sleep 0.06", "set", "sleep 0.06", "get"]  # each request waits, then runs
    log.clear()
    assert consensus.compare_and_set("k", None, b"v") is CaSResult.COMMITTED
    assert consensus.head("k") is not None  # (a LIST and a GET on S3: two requests)
    assert log == ["sleep 0.06", "sleep 0.12"]
    assert model.requests == 5 and model.slept_s == pytest.approx(0.3)
    assert blob.counters.calls(Op.BLOB_SET) == 1 and consensus.counters.calls(Op.CAS) == 1


def test_url_parameters_reach_the_model(tmp_path: Path) -> None:
    url = f"s3model+file://{tmp_path}/db?latency_ms=2.5&cas_per_key_s=7"
    assert validate_url(url).name == "s3model+file"
    assert local_path(url) == tmp_path / "db"
    loc = open_location(url)
    assert isinstance(loc.blob, S3ModelBlob) and isinstance(loc.consensus, S3ModelConsensus)
    model = loc.blob.model
    assert model is loc.consensus.model and model.latency_s == 0.0025 and model.cas_per_key_s == 7
    loc.blob.set("x", b"y")
    assert model.requests == 1 and model.slept_s == pytest.approx(0.0025)
    loc.close()
    defaults = open_location(f"s3model+file://{tmp_path}/d2").blob
    assert isinstance(defaults, S3ModelBlob) and defaults.model.latency_s == 0.06
    assert open_location(f"file://{tmp_path}/db").blob.get("x") == b"y"  # the same data, without the model


@pytest.mark.parametrize(
    ("query", "why"),
    [
        ("latency=5", "unknown query parameter 'latency'"),
        ("latency_ms=-1", "must be a number >= 0"),
        ("latency_ms=fast", "must be a number >= 0"),
        ("latency_ms=1&latency_ms=2", "given twice"),
    ],
)
def test_bad_urls_say_why(tmp_path: Path, query: str, why: str) -> None:
    with pytest.raises(InvalidUsage, match=why):
        validate_url(f"s3model+file://{tmp_path}/db?{query}")
    with pytest.raises(InvalidUsage, match="take no host"):
        open_location("s3model+file://relative/db")


FROZEN = 1_000_000.0


def _hammer(state_dir: str, db_dir: str, now: float, n: int, out: Any) -> None:
    model = S3Model(state_dir, latency_s=0, cas_per_key_s=5, throttle_retries=0, clock=lambda: now)
    consensus = S3ModelConsensus(open_file(db_dir)[1], model)
    outcomes = []
    for _ in range(n):
        try:
            head = consensus.head("hot")
            outcomes.append(consensus.compare_and_set("hot", None if head is None else head.seqno, b"x").name)
        except Determinate as e:
            assert "throttled" in str(e)
            outcomes.append("throttled")
    out.put(outcomes)


def test_the_cap_is_one_token_bucket_shared_by_processes(tmp_path: Path) -> None:
    """3 processes x 10 conditional writes of one key, cap 5/s, a clock that never moves: 5 pass in all."""
    ctx = multiprocessing.get_context("spawn")

    def run(now: float) -> list[str]:
        out = ctx.Queue()
        ps = [ctx.Process(target=_hammer, args=(str(tmp_path / "state"), str(tmp_path / "db"), now, 10, out))
              for _ in range(3)]
        for p in ps:
            p.start()
        got = [o for _ in ps for o in out.get(timeout=120)]
        for p in ps:
            p.join(30)
            assert p.exitcode == 0
        return got

    first = run(FROZEN)
    assert len(first) == 30 and first.count("throttled") == 25  # per-process buckets would pass 15
    head = open_file(tmp_path / "db")[1].head("hot")
    assert head is not None and head.seqno == first.count("COMMITTED")  # (granted writes ran; losers mismatched)
    again = run(FROZEN + 0.4)  # 0.4 s later: 2 tokens refilled
    assert again.count("throttled") == 28
    model = S3Model(tmp_path / "state", latency_s=0, cas_per_key_s=5, throttle_retries=0, clock=lambda: FROZEN + 0.4)
    assert model.take_token("another key")  # each key has its own bucket
    assert not model.take_token("hot")


def test_a_throttled_write_is_retried_then_fails_determinate(tmp_path: Path) -> None:
    sleeps: list[float] = []
    model = S3Model(tmp_path / "state", latency_s=0.01, cas_per_key_s=1, clock=lambda: FROZEN, sleep=sleeps.append)
    consensus = S3ModelConsensus(open_file(tmp_path / "db")[1], model)
    assert consensus.compare_and_set("k", None, b"1") is CaSResult.COMMITTED
    with pytest.raises(Determinate, match="throttled"):
        consensus.compare_and_set("k", 1, b"2")
    assert model.granted == 1 and model.throttled == 3  # 1 + THROTTLE_RETRIES tries, nothing written
    assert sleeps.count(0.01) == 4 and len(sleeps) == 4 + 2  # a request per try, a backoff between tries
    head = consensus.head("k")
    assert head is not None and head.seqno == 1
