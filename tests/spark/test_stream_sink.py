"""The exactly-once streaming sink: ``df.writeStream.format("txns").start(table)``.

(a) the commit protocol called directly (a replayed batch id, an older one);
(b) a real streaming query over a directory of JSON files, restarted from its
checkpoint with more files; (c) a query in a subprocess SIGKILLed mid-way and
restarted from the same checkpoint until all input is consumed. Each checks
that every input row is in the table exactly once (count per row) and that
the sink's progress row is the last batch id.

Run as a script, this file is the subprocess of (c):
``python test_stream_sink.py URL INPUT_DIR CHECKPOINT``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

import txns
from persist import InvalidUsage
from txns.spark.table_write import SINKS, TableStreamWriter, sink_id, stream_progress

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

EVENTS = pa.schema([("id", pa.int64()), ("file", pa.int64())])
SPARK_EVENTS = "id long, file long"


def write_files(d: Path, first: int, n: int, per_file: int) -> list[tuple[int, int]]:
    """Files ``first .. first+n-1`` of ``per_file`` JSON rows each (written whole, then renamed in)."""
    d.mkdir(parents=True, exist_ok=True)
    out = []
    for f in range(first, first + n):
        data = [(f * 1000 + i, f) for i in range(per_file)]
        tmp = d / f".f{f:04d}.tmp"
        tmp.write_text("".join(json.dumps({"id": i, "file": ff}) + "\n" for i, ff in data))
        tmp.rename(d / f"f{f:04d}.json")
        out += data
    return out


def table_counts(db: txns.Database, name: str) -> Counter[tuple[int, int]]:
    return Counter((r["id"], r["file"]) for r in db.table(name).to_arrow().to_pylist())


def run_query(spark: SparkSession, url: str, src: Path, cp: Path, table: str = "events") -> None:
    """Consume every file in ``src`` (one file per micro-batch) into ``table``; return when done."""
    q = (
        spark.readStream.schema(SPARK_EVENTS)
        .option("maxFilesPerTrigger", 1)
        .json(str(src))
        .writeStream.format("txns")
        .option("url", url)
        .option("checkpointLocation", str(cp))
        .trigger(availableNow=True)
        .start(table)
    )
    q.awaitTermination()
    if q.exception() is not None:
        raise RuntimeError(str(q.exception()))


# ---- (a) the commit protocol ------------------------------------------------------------------


def test_commit_is_idempotent_per_batch_id(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    from pyspark.sql.types import LongType, StructField, StructType

    url = f"file://{tmp_path}/db"
    db = txns.connect(url)
    db.create_table("events", EVENTS)
    schema = StructType([StructField("id", LongType()), StructField("file", LongType())])
    opts = {"url": url, "path": "events", "checkpointLocation": str(tmp_path / "cp")}

    def batch(lo: int, hi: int) -> list[Any]:
        w = TableStreamWriter(opts, schema, False)  # (Spark builds one per commit)
        t = pa.table({"id": list(range(lo, hi)), "file": [lo] * (hi - lo)})
        return [w.write(iter(t.to_batches())), None]

    sink = sink_id(opts, "events")
    assert sink.startswith("events@") and stream_progress(db, sink) is None
    m0 = batch(0, 10)
    TableStreamWriter(opts, schema, False).commit(m0, 0)
    commits = len(db.history("events"))
    replay = batch(0, 10)  # Spark's replay of batch 0: new parts, same rows
    TableStreamWriter(opts, schema, False).commit(replay, 0)
    assert len(db.history("events")) == commits  # nothing committed
    assert db.table("events").count() == 10 and stream_progress(db, sink) == 0
    # the replay's parts were deleted; the committed ones are still read
    for p in (p for m in replay if m is not None for p in m.parts):
        assert not list((tmp_path / "db").rglob(p["key"].rsplit("/", 1)[-1]))
    TableStreamWriter(opts, schema, False).commit(batch(10, 15), 3)
    TableStreamWriter(opts, schema, False).commit(batch(100, 200), 2)  # older than the progress: skipped
    assert sorted(r["id"] for r in db.table("events").to_arrow().to_pylist()) == list(range(15))
    assert stream_progress(db, sink) == 3
    # another sink (another checkpoint) has its own progress
    other = dict(opts, checkpointLocation=str(tmp_path / "cp2"))
    TableStreamWriter(other, schema, False).commit([TableStreamWriter(other, schema, False).write(iter([]))], 0)
    assert stream_progress(db, sink_id(other, "events")) == 0 and stream_progress(db, sink) == 3
    assert db.table(SINKS).primary_key == ["sink"]
    # complete mode (overwrite): each batch replaces the contents, once
    TableStreamWriter(opts, schema, True).commit(batch(50, 52), 4)
    TableStreamWriter(opts, schema, True).commit(batch(60, 70), 4)
    assert sorted(r["id"] for r in db.table("events").to_arrow().to_pylist()) == [50, 51]


def test_sink_needs_an_identity(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    from pyspark.sql.types import LongType, StructField, StructType

    url = f"file://{tmp_path}/db"
    txns.connect(url).create_table("events", EVENTS)
    schema = StructType([StructField("id", LongType()), StructField("file", LongType())])
    with pytest.raises(InvalidUsage, match="checkpointLocation"):
        TableStreamWriter({"url": url, "path": "events"}, schema, False)
    w = TableStreamWriter({"url": url, "path": "events", "sinkId": "mine"}, schema, False)
    assert w.sink == "mine"
    assert sink_id({"checkpointlocation": "cp"}, "t") == sink_id({"checkpointLocation": os.path.abspath("cp")}, "t")
    assert sink_id({"checkpointLocation": "/a"}, "t") != sink_id({"checkpointLocation": "/b"}, "t")


# ---- (b) a real query, restarted ------------------------------------------------------------------


@pytest.mark.spark
def test_streaming_query_restart_exactly_once(spark: SparkSession, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/db"
    db = txns.connect(url)
    db.create_table("events", EVENTS)
    src, cp = tmp_path / "in", tmp_path / "cp"
    expected = write_files(src, 0, 3, 20)
    run_query(spark, url, src, cp)
    assert table_counts(db, "events") == Counter(expected)
    sink = sink_id({"checkpointLocation": str(cp)}, "events")
    assert stream_progress(db, sink) == 2  # one file per micro-batch: batches 0, 1, 2
    h = db.history("events").to_pylist()
    assert [json.loads(r["metadata"])["spark"]["batch"] for r in h[:3]] == [2, 1, 0]
    expected += write_files(src, 3, 2, 20)
    run_query(spark, url, src, cp)  # restart from the checkpoint: only the new files
    assert table_counts(db, "events") == Counter(expected)
    assert max(table_counts(db, "events").values()) == 1
    assert stream_progress(db, sink) == 4
    with pytest.raises(Exception, match="no table 'gone'"):
        run_query(spark, url, src, tmp_path / "cp-gone", "gone")


@pytest.mark.spark
def test_replay_after_lost_checkpoint_commit(spark: SparkSession, tmp_path: Path) -> None:
    """The crash window, deterministically: our commit landed, Spark did not record it in its checkpoint.

    Deleting the checkpoint's record of the last batch makes the restarted
    query replay that batch (same id, same files): the sink must skip it.
    """
    url = f"file://{tmp_path}/db"
    db = txns.connect(url)
    db.create_table("events", EVENTS)
    src, cp = tmp_path / "in", tmp_path / "cp"
    expected = write_files(src, 0, 2, 10)
    run_query(spark, url, src, cp)
    sink = sink_id({"checkpointLocation": str(cp)}, "events")
    assert stream_progress(db, sink) == 1
    commits = len(db.history("events"))
    for f in (cp / "commits").iterdir():  # "1" and ".1.crc": Spark forgets it committed batch 1
        if f.name.lstrip(".").split(".")[0] == "1":
            f.unlink()
    run_query(spark, url, src, cp)  # replays batch 1
    assert len(db.history("events")) == commits  # the replay committed nothing
    assert table_counts(db, "events") == Counter(expected)
    assert (cp / "commits" / "1").exists()  # and Spark recorded it this time
    expected += write_files(src, 2, 1, 10)
    run_query(spark, url, src, cp)
    assert table_counts(db, "events") == Counter(expected) and stream_progress(db, sink) == 2
    # a checkpoint deleted and made again at the same path is a new query: a new sink, batch ids
    # from 0 again, not skipped as replays of the old one (it reads every file again)
    shutil.rmtree(cp)
    run_query(spark, url, src, cp)
    new_sink = sink_id({"checkpointLocation": str(cp)}, "events")
    assert new_sink != sink and stream_progress(db, new_sink) == 2
    assert table_counts(db, "events") == Counter(expected + expected)


# ---- a stream into a keyed table: foreachBatch(merge_stream) --------------------------------------


@pytest.mark.spark
def test_stream_merges_into_a_keyed_table_exactly_once(spark: SparkSession, tmp_path: Path) -> None:
    from txns.spark import merge_stream

    url = f"file://{tmp_path}/db"
    db = txns.connect(url)
    db.create_table("latest", EVENTS, primary_key=["id"])  # the file that last wrote each id
    write_files(tmp_path / "in0", 0, 1, 2)
    with pytest.raises(Exception, match=r"primary key.*foreachBatch\(txns.spark.merge_stream"):
        run_query(spark, url, tmp_path / "in0", tmp_path / "cp0", table="latest")
    src, cp = tmp_path / "in", tmp_path / "cp"
    src.mkdir()
    for f, ids in ((0, range(0, 6)), (1, range(3, 9)), (2, range(0, 2))):  # later files overwrite ids
        (src / f"f{f}.json").write_text("".join(json.dumps({"id": i, "file": f}) + "\n" for i in ids))
    fn = merge_stream(url, "latest", sink="latest-feed")
    q = (
        spark.readStream.schema(SPARK_EVENTS)
        .option("maxFilesPerTrigger", 1)
        .json(str(src))
        .writeStream.foreachBatch(fn)
        .option("checkpointLocation", str(cp))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(300)
    want = {0: 2, 1: 2, 2: 0, 3: 1, 4: 1, 5: 1, 6: 1, 7: 1, 8: 1}
    got = {r["id"]: r["file"] for r in db.table("latest").to_arrow().to_pylist()}
    assert got == want and stream_progress(db, "latest-feed") == 2
    commits = len(db.history("latest"))
    # a micro-batch Spark replays (after a crash) merges nothing; the next one merges
    replay = spark.createDataFrame([(0, 99)], SPARK_EVENTS)
    fn(replay, 2)
    fn(replay, 1)
    assert {r["id"]: r["file"] for r in db.table("latest").to_arrow().to_pylist()} == want
    assert len(db.history("latest")) == commits
    fn(replay, 3)
    assert {r["id"]: r["file"] for r in db.table("latest").to_arrow().to_pylist()} == {**want, 0: 99}
    assert stream_progress(db, "latest-feed") == 3
    with pytest.raises(InvalidUsage, match="sink and batch_id together"):
        txns.spark.merge(db, "latest", replay, sink="latest-feed")
    with pytest.raises(InvalidUsage, match="sink must be a non-empty name"):
        merge_stream(url, "latest", sink="")
    db.close()


# ---- (c) killed and restarted ------------------------------------------------------------------


def _kill_restart(tmp_path: Path, files: int, kills: int, step: int) -> None:
    url = f"file://{tmp_path}/db"
    db = txns.connect(url)
    db.create_table("events", EVENTS)
    src, cp = tmp_path / "in", tmp_path / "cp"
    expected = write_files(src, 0, files, 5)

    def progress() -> int | None:  # (the sink id includes the query id, once Spark wrote the checkpoint)
        return stream_progress(db, sink_id({"checkpointLocation": str(cp)}, "events"))

    cmd = [sys.executable, os.path.abspath(__file__), url, str(src), str(cp)]
    runs = 0
    killed = 0
    while True:
        runs += 1
        assert runs <= kills + 5, "the query did not finish"
        at = progress()
        log = tmp_path / f"run{runs}.log"  # (a file, not a pipe: a full pipe would block the query)
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, start_new_session=True, stdout=out, stderr=subprocess.STDOUT)
        try:
            if killed < kills:
                target = (-1 if at is None else at) + step  # `step` more commits, then SIGKILL (mid-stream)
                deadline = time.monotonic() + 120
                while proc.poll() is None and time.monotonic() < deadline:
                    p = progress()
                    if p is not None and p >= target:
                        break
                    time.sleep(0.1)
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)  # the driver, its JVM and its Python workers
                    proc.wait()
                    killed += 1
                    continue
            proc.wait(timeout=300)
            assert proc.returncode == 0, log.read_text(errors="replace")[-3000:]
            break
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert killed == kills
    print(f"{runs} runs, {killed} killed", file=sys.stderr)
    counts = table_counts(db, "events")
    assert counts == Counter(expected), "rows lost or repeated"
    # the sink's progress is Spark's last committed micro-batch (a batch planned again after a kill
    # may take two files: FileStreamSource's maxFilesPerTrigger is not kept across a restart)
    committed = max(int(n) for n in os.listdir(cp / "commits") if n.isdigit())
    assert progress() == committed and committed <= files - 1


@pytest.mark.spark
@pytest.mark.slow
def test_killed_query_restarts_exactly_once(tmp_path: Path) -> None:
    """Slow: each subprocess starts its own JVM (10-40 s on a loaded machine). The default run
    covers the crash window in process: see test_replay_after_lost_checkpoint_commit."""
    _kill_restart(tmp_path, files=10, kills=3, step=2)


def _main(url: str, src: str, cp: str) -> None:
    import txns.spark

    spark = txns.spark.session(
        "local[2]",
        app_name="txns-sink-kill",
        conf={"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "512m", "spark.ui.enabled": "false"},
    )
    spark.sparkContext.setLogLevel("ERROR")
    txns.spark.register(spark)
    run_query(spark, url, Path(src), Path(cp))
    spark.stop()


if __name__ == "__main__":
    _main(*sys.argv[1:4])
