"""Long-lived readers under writers, compaction, retention, GC and lease lapses (issue #25, item 2).

The checker (:mod:`tests.isolation.read_checker`) first, on hand-made
histories: each anomaly it names is found, and valid reads pass. Then the
short profile of :func:`tests.isolation.long_readers.run_long_readers` on
``file://`` (with two planted readers, the negative control: one serving a
stale cache, one a state that never existed; both must be caught, and no
honest reader may be flagged) and on moto S3 (honest readers only). Every
run must also have made GC delete parts, truncate consensus versions and
lapse a reader's lease, or it would not have tested what it claims. The
long profile is ``benchmarks/long_readers.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from persist.testing import fake_aws_env
from tests.chaos.driver import moto_subprocess
from tests.isolation.long_readers import LongConfig, LongResult, run_long_readers
from tests.isolation.long_worker import load_commits
from tests.isolation.read_checker import Commit, TableRead, check_reads, digest

# ---- the checker ------------------------------------------------------------------------------


def _commit(op: str, ts: int, added: list[str], deleted: list[str] = (), at: float = 0.0) -> Commit:  # type: ignore[assignment]
    return Commit(op, ts, tuple((i, 1) for i in added), tuple((i, 1) for i in deleted), at, at + 1.0)


def _read(rid: str, ids: list[str], start: float, end: float, as_of: int | None = None) -> TableRead:
    rows = tuple((i, 1) for i in ids)
    n, h = digest(rows)
    return TableRead(rid, "reader", as_of, start, end, n, h, rows)


# commits a@10 (acknowledged at 1), b@20 (invoked 2, acknowledged 3), c@30 deleting a (invoked 4, acknowledged 5)
HISTORY = [_commit("a", 10, ["a"], at=0.0), _commit("b", 20, ["b"], at=2.0), _commit("c", 30, ["c"], ["a"], at=4.0)]


def test_reads_of_states_in_their_window_and_at_their_as_of_are_valid() -> None:
    reads = [
        _read("1", ["a"], 1.5, 1.8),  # after a's ack, before b's invoke: exactly {a}
        _read("2", ["a"], 2.5, 3.5),  # b in flight: {a} or {a, b}
        _read("3", ["a", "b"], 2.5, 3.5),
        _read("4", ["b", "c"], 6.0, 7.0),
        _read("5", ["a", "b"], 6.0, 7.0, as_of=25),  # as_of: the state at 25, whenever read
        _read("6", [], 6.0, 7.0, as_of=9),
    ]
    res = check_reads(HISTORY, reads)
    assert res.valid, res.summary()
    assert res.reads == {"latest": 4, "as_of": 2}


def test_a_stale_a_future_and_a_mixed_read_are_each_found() -> None:
    reads = [
        _read("stale", ["a"], 6.0, 7.0),  # c was acknowledged before it started
        _read("future", ["a", "b"], 1.5, 1.8),  # b was invoked after it ended
        _read("mixed", ["b"], 6.0, 7.0),  # without a, without c: never the table
        _read("as-of", ["a"], 6.0, 7.0, as_of=25),  # the state at 10, not at 25
    ]
    res = check_reads(HISTORY, reads)
    assert set(res.anomalies) == {"stale", "future", "never-existed", "wrong-as-of"}, res.summary()
    assert all(len(v) == 1 for v in res.anomalies.values())
    assert "1 missing" in res.anomalies["never-existed"][0] and "('c', 1)" in res.anomalies["never-existed"][0]


def test_transactions_of_one_group_commit_are_one_state() -> None:
    history = [_commit("a", 10, ["a"], at=0.0), _commit("b", 10, ["b"], at=0.0)]
    res = check_reads(history, [_read("1", ["a"], 5.0, 6.0), _read("2", ["a", "b"], 5.0, 6.0)])
    assert set(res.anomalies) == {"never-existed"}, res.summary()  # only a: half a commit


def test_writers_records_must_agree_with_history(tmp_path: Path) -> None:
    from tests.isolation.proc_worker import Recorder

    out = tmp_path / "w.jsonl"
    rec = Recorder(out)
    for op, status, ts in (("ok1", "ok", 10), ("ok2", "ok", 20), ("failed", "fail", None), ("unknown", "info", None)):
        rec.write({"t": "invoke", "id": op, "process": "w", "start": 1.0, "added": [[op, 1]], "deleted": []})
        rec.write({"t": "complete", "id": op, "status": status, "ts": ts, "end": 2.0})
    rec.write({"t": "invoke", "id": "killed", "process": "w", "start": 3.0, "added": [["killed", 1]], "deleted": []})
    rec.close()
    history = {"ok1": [10], "ok2": [21], "failed": [30], "unknown": [40], "killed": [50, 60], "stranger": [70]}
    commits, problems = load_commits([out], history)
    assert {c.op: c.ts for c in commits} == {"ok1": 10, "ok2": 21, "failed": 30, "unknown": 40, "killed": 50}
    assert {c.op: c.complete for c in commits}["unknown"] is None  # never acknowledged: no lower bound for reads
    text = "\n".join(problems)
    for bad in ("'stranger', which no writer invoked", "'killed' committed 2 times", "'ok2' was acknowledged at 20",
                "'failed' failed"):  # fmt: skip
        assert bad in text, problems
    assert len(problems) == 4


# ---- the runs ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moto_upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A moto S3 server in a subprocess, for the module."""
    log = tmp_path_factory.mktemp("long-readers-moto") / "moto.log"
    with fake_aws_env(), moto_subprocess(sys.executable, log) as endpoint:
        yield endpoint


def assert_exercised(res: LongResult, min_commits: int) -> None:
    """The run did what it is for: commits, reads of both kinds, GC, truncation, lapsed leases; no surprises."""
    summary = res.summary()
    assert not res.problems, summary
    assert res.commits >= min_commits, summary
    assert res.check is not None
    assert res.check.reads.get("latest", 0) >= 3 and res.check.reads.get("as_of", 0) >= 2, summary
    for what in ("parts_deleted", "versions_truncated", "cache-restarts", "compactions"):
        assert res.counts[what] >= 1, f"no {what}:\n{summary}"
    assert res.kills == len(res.cfg.kill_at), summary


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_long_lived_readers_on_a_directory_and_the_planted_ones_are_caught(tmp_path: Path) -> None:
    """No honest reader reads a wrong state; the stale and the mixed planted readers are each caught."""
    cfg = LongConfig(seconds=20.0, planted=("stale", "mixed"), min_ok=30, min_reads=6, max_seconds=90.0)
    res = run_long_readers("file", cfg, tmp_path / "run")
    assert_exercised(res, 30)
    assert res.check is not None
    flagged = {proc: set(kinds) for proc, kinds in res.check.by_process.items()}
    honest = {proc: kinds for proc, kinds in flagged.items() if not proc.startswith("planted-")}
    assert not honest, res.summary()
    assert "stale" in flagged.get("planted-stale0.1", set()), res.summary()
    assert flagged.get("planted-mixed1.1") == {"never-existed"}, res.summary()


@pytest.mark.slow
@pytest.mark.s3
@pytest.mark.timeout(900)
def test_long_lived_readers_on_s3(moto_upstream: str, tmp_path: Path) -> None:
    """Every read of every long-lived reader is the table at one time inside its window (or at its as_of)."""
    with fake_aws_env():
        # (moto serves every process through one lock: readers pause longer than on a directory)
        cfg = LongConfig(
            seconds=20.0, reader_idle_s=1.0, maintain_every_s=2.0, min_ok=12, min_reads=6, max_seconds=120.0
        )
        res = run_long_readers("s3", cfg, tmp_path / "run", endpoint=moto_upstream)
    assert_exercised(res, 12)
    assert res.check is not None and res.check.valid, res.summary()
