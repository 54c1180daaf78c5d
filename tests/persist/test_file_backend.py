"""The file backend's specifics (:mod:`persist.file`): its layout, refused keys, processes racing.

The contract every backend keeps is checked by tests/persist/test_conformance.py.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from persist.errors import InvalidUsage
from persist.file import FileBlob, FileConsensus
from persist.location import CaSResult, next_seqno

COMMITTED = CaSResult.COMMITTED


def test_file_backend_capabilities(tmp_path: Path) -> None:
    assert FileBlob(tmp_path).keys_nest is False
    consensus = FileConsensus(tmp_path)
    assert (consensus.checks_expectation, consensus.detects_truncated, consensus.lists_keys) == (True, True, True)


def _process_race_worker(
    root: str, key: str, target: int, wid: int, barrier: Any, results: Any
) -> None:
    """Write ``key`` from head to ``target``, reporting the seqnos this process won."""
    consensus = FileConsensus(Path(root))
    won: list[int] = []
    barrier.wait(timeout=60)
    while True:
        head = consensus.head(key)
        current = head.seqno if head is not None else None
        if current is not None and current >= target:
            break
        if (
            consensus.compare_and_set(key, current, f"{wid}:{next_seqno(current)}".encode())
            is COMMITTED
        ):
            won.append(next_seqno(current))
    results.put((wid, won))


def test_file_consensus_process_race(tmp_path: Path) -> None:
    """Processes (spawned, not forked) race on one key of a file location."""
    procs, target = 4, 40
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(procs)
    results = ctx.Queue()
    workers = [
        ctx.Process(
            target=_process_race_worker, args=(str(tmp_path), "race", target, w, barrier, results)
        )
        for w in range(procs)
    ]
    for w in workers:
        w.start()
    outcomes = dict(results.get(timeout=120) for _ in workers)
    for w in workers:
        w.join(timeout=30)
        assert w.exitcode == 0
    won = [s for seqnos in outcomes.values() for s in seqnos]
    assert sorted(won) == list(range(1, target + 1)), "every seqno won exactly once"
    winner = {s: wid for wid, seqnos in outcomes.items() for s in seqnos}
    versions = FileConsensus(tmp_path).scan("race", 1, 1000)
    assert [(v.seqno, v.data) for v in versions] == [
        (s, f"{winner[s]}:{s}".encode()) for s in range(1, target + 1)
    ]


def test_file_layout_and_temp_files_are_invisible(tmp_path: Path) -> None:
    blob, consensus = FileBlob(tmp_path), FileConsensus(tmp_path)
    blob.set("a/b", b"x")
    assert (tmp_path / "blob" / "a" / "b").read_bytes() == b"x"
    assert consensus.compare_and_set("shard/s1", None, b"v1") is COMMITTED
    version = tmp_path / "consensus" / "kshard%2Fs1" / "00000000000000000001"
    assert version.read_bytes() == b"v1"
    # Leftovers of a crashed writer are never read nor listed.
    (tmp_path / "blob" / "a" / ".tmp-crashed").write_bytes(b"partial")
    (version.parent / ".tmp-crashed").write_bytes(b"partial")
    assert list(blob.list_keys("")) == ["a/b"]
    head = consensus.head("shard/s1")
    assert head is not None and (head.seqno, head.data) == (1, b"v1")
    assert list(consensus.list_keys()) == ["shard/s1"]
    assert not [
        p
        for p in version.parent.iterdir()
        if p.name.startswith(".tmp-") and p.name != ".tmp-crashed"
    ]


@pytest.mark.parametrize(
    "key", ["", "/abs", "../escape", "a/../b", "a//b", "a/./b", "a/.tmp-x", "trailing/"]
)
def test_file_blob_rejects_unsafe_keys(tmp_path: Path, key: str) -> None:
    blob = FileBlob(tmp_path)
    with pytest.raises(InvalidUsage, match="invalid blob key"):
        blob.set(key, b"x")
    with pytest.raises(InvalidUsage):
        blob.get(key)


def test_file_blob_key_and_nested_key_conflict(tmp_path: Path) -> None:
    blob = FileBlob(tmp_path)
    blob.set("a", b"file")
    with pytest.raises(InvalidUsage, match="nested"):
        blob.set("a/b", b"x")
    with pytest.raises(InvalidUsage, match="nested"):
        blob.set("a/b/c", b"x")
    blob.set("d/e", b"x")
    with pytest.raises(InvalidUsage, match="nested"):
        blob.set("d", b"x")
    assert sorted(blob.list_keys("")) == ["a", "d/e"]

