"""``Table.to_dataset``: direct part files where the snapshot allows, consolidated rows elsewhere; pushdown.

Every result is checked against ``to_arrow`` (the checked, consolidated
read) as the model, as a multiset of rows.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

import txns
from persist import CorruptObject, InvalidUsage, PersistConfig
from persist.url import local_path
from tests import helpers
from txns.db.dataset import PartFiles, direct_files, snapshot_dataset
from txns.db.scan import PlanReader

SCHEMA = pa.schema([("y", pa.int64()), ("x", pa.int64()), ("name", pa.string())])


def rows(t: pa.Table) -> Counter[tuple[object, ...]]:
    return Counter(tuple(r.values()) for r in t.to_pylist())


def batch(lo: int, n: int) -> pa.Table:
    ys = list(range(lo, lo + n))
    return pa.table({"y": ys, "x": [y * 2 for y in ys], "name": [f"n{y}" for y in ys]}, schema=SCHEMA)


def fill(db: txns.Database, writes: int = 10, n: int = 100) -> txns.Table:
    t = db.create_table("t", SCHEMA)
    for i in range(writes):
        with db.transaction() as tx:
            tx.insert("t", batch(i * n, n))
    return t


def test_inserted_only_table_is_read_directly_and_filters_skip_parts(db: txns.Database) -> None:
    t = fill(db)
    d = t.to_dataset()
    assert isinstance(d, ds.FileSystemDataset)  # no retraction, diff 1: every part direct
    assert len(d.files) == 10
    assert rows(d.to_table()) == rows(t.to_arrow())
    # pushdown: a filter on y keeps the row groups whose statistics may match, and no others
    f = pc.field("y") >= 950
    kept = [rg for frag in d.get_fragments() for rg in frag.split_by_row_group(filter=f)]
    total = sum(frag.metadata.num_row_groups for frag in d.get_fragments())
    assert total == 10 and len(kept) == 1
    got = d.to_table(columns=["x"], filter=f)
    assert got.column_names == ["x"] and sorted(got.column("x").to_pylist()) == [y * 2 for y in range(950, 1000)]


def test_uncompacted_retractions_are_consolidated_and_other_parts_stay_direct(db: txns.Database) -> None:
    t = fill(db)
    gone = batch(120, 3).to_pylist()  # rows of the second write's part only
    with db.transaction() as tx:
        tx.retract("t", gone)
        tx.insert("t", batch(5000, 2))  # (a new part, diff 1, outside the retracted keys)
    with db.transaction() as tx:  # the same row twice
        tx.insert("t", pa.concat_tables([batch(7000, 1), batch(7000, 1)]))
    d = t.to_dataset()
    want = t.to_arrow()
    assert want.num_rows == 1000 - 3 + 2 + 2
    assert rows(d.to_table()) == rows(want)
    assert isinstance(d, ds.UnionDataset)
    # the part holding the retracted rows and the retraction's part are consolidated; the other
    # nine inserts' parts, the new part and the duplicates' part are read directly
    e = db.entry("t", db.latest())
    refs = [ref for run in db.planner.plan(e, db.latest()).runs for ref in run.parts]
    near = {ref.key.rsplit("/", 1)[-1] for ref in refs if ref.lo <= 122 and ref.hi >= 120}  # type: ignore[operator]
    direct = {f.rsplit("/", 1)[-1] for f in direct_files(d)}
    assert len(refs) == 13 and len(near) == 2
    assert len(direct) == 11 and near.isdisjoint(direct)
    # filters and projections still apply to both halves
    f = (pc.field("y") >= 100) & (pc.field("y") < 200)
    assert rows(d.to_table(filter=f)) == rows(t.to_arrow(filter=f))
    # compaction within the retained history keeps the retraction (times are not merged): same rows
    db.compact()
    assert rows(t.to_dataset().to_table()) == rows(want)
    # with no history kept, compaction consolidates: one part, the duplicate stored once with diff 2,
    # read directly (its second copy added in memory)
    db.set_table_retention("t", dt.timedelta(0))
    db.compact()
    d2 = t.to_dataset()
    assert rows(d2.to_table()) == rows(want)
    assert len(list(direct_files(d2))) == 1 and isinstance(d2, ds.UnionDataset)
    assert d2.children[1].count_rows() == 1  # the one extra copy


def test_keyed_table_updates_consolidate_the_parts_of_their_keys(db: txns.Database) -> None:
    # the primary key is not the first column: part bounds are of the key (the shard's first column)
    k = db.create_table("k", pa.schema([("v", pa.int64()), ("id", pa.int64())]), primary_key=["id"])
    for i in range(5):
        with db.transaction() as tx:
            tx.insert("k", [{"id": j, "v": j + 10_000} for j in range(i * 100, i * 100 + 100)])
    with db.transaction() as tx:
        tx.update("k", 250, {"v": -1})
    d = k.to_dataset()
    assert rows(d.to_table()) == rows(k.to_arrow()) and d.count_rows() == 500
    assert d.to_table(filter=pc.field("id") == 250).to_pylist() == [{"v": -1, "id": 250}]
    assert len(list(direct_files(d))) == 4  # the four inserts without key 250


def test_retraction_of_every_part_consolidates_everything(db: txns.Database) -> None:
    t = fill(db, writes=3)
    with db.transaction() as tx:
        tx.retract("t", [batch(0, 1).to_pylist()[0], batch(100, 1).to_pylist()[0], batch(200, 1).to_pylist()[0]])
    d = t.to_dataset()
    assert list(direct_files(d)) == []
    assert rows(d.to_table()) == rows(t.to_arrow()) and d.count_rows() == 297


def test_snapshot_is_fixed_when_made_and_as_of_reads_the_past(db: txns.Database) -> None:
    t = fill(db, writes=2)
    before = db.latest()
    d = t.to_dataset()
    with db.transaction() as tx:
        tx.retract("t", batch(0, 50).to_pylist())
        tx.insert("t", batch(9000, 5))
    assert d.count_rows() == 200  # made before the commit
    assert t.to_dataset().count_rows() == 155
    past = t.to_dataset(as_of=before)
    assert rows(past.to_table()) == rows(t.to_arrow(as_of=before))
    with db.read(as_of=before) as r:
        assert rows(r.table("t").to_dataset().to_table()) == rows(t.to_arrow(as_of=before))


def test_inline_rows_and_mem_locations(tmp_path: Path) -> None:
    for url in (helpers.file_url(tmp_path / "inline"), helpers.mem_url("engines-ds")):
        db = txns.connect(url)  # small writes ride inline in the log
        t = db.create_table("t", SCHEMA)
        with db.transaction() as tx:
            tx.insert("t", batch(0, 5))
        with db.transaction() as tx:
            tx.retract("t", batch(0, 1))
        d = t.to_dataset()
        assert rows(d.to_table()) == rows(t.to_arrow()) and d.count_rows() == 4
        db.close()


@pytest.mark.s3
def test_s3_parts_are_read_through_pyarrow_s3(s3_url_factory) -> None:  # type: ignore[no-untyped-def]
    db = txns.connect(s3_url_factory("engines"), config=PersistConfig(inline_max_bytes=0, compaction_enabled=False))
    try:
        t = fill(db, writes=3, n=50)
        d = t.to_dataset()
        assert isinstance(d, ds.FileSystemDataset) and len(d.files) == 3
        assert rows(d.to_table(filter=pc.field("y") < 10)) == rows(t.to_arrow(filter=pc.field("y") < 10))
    finally:
        db.close()


class CountingFiles(pafs.FileSystemHandler):
    """A local file system that counts the bytes read from each file (what an engine really read)."""

    def __init__(self) -> None:
        self.fs = pafs.LocalFileSystem()
        self.read: Counter[str] = Counter()

    def get_type_name(self) -> str:
        return "counting"

    def equals(self, other: object) -> bool:
        return other is self

    def normalize_path(self, path: str) -> str:
        return path

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return self.fs.get_file_info(paths)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return self.fs.get_file_info(selector)

    def open_input_file(self, path: str) -> pa.NativeFile:
        inner, read = self.fs.open_input_file(path), self.read

        class Counted:
            closed = False

            def read(self, n: int = -1) -> bytes:
                data = inner.read(n)
                read[path] += len(data)
                return bytes(data)

            def seek(self, pos: int, whence: int = 0) -> int:
                return inner.seek(pos, whence)

            def tell(self) -> int:
                return inner.tell()

            def size(self) -> int:
                return inner.size()

            def close(self) -> None:
                inner.close()

        return pa.PythonFile(Counted(), mode="r")

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return self.open_input_file(path)

    def _no(self, *args: object) -> None:
        raise NotImplementedError("read-only")

    create_dir = delete_dir = delete_dir_contents = delete_root_dir_contents = delete_file = _no
    move = copy_file = open_output_stream = open_append_stream = _no


def test_duckdb_reads_only_the_row_groups_a_filter_can_match(db: txns.Database) -> None:
    duckdb = pytest.importorskip("duckdb")
    t = fill(db, writes=10, n=1000)
    e = db.entry("t", db.latest())
    counting = CountingFiles()
    files = PartFiles(pafs.PyFileSystem(counting), str(local_path(db.url) / "blob"))  # type: ignore[operator]
    reader = PlanReader(db.client.blob, db.planner.plan(e, db.latest()), list(SCHEMA.names), None, 30.0)
    d = snapshot_dataset(reader, files)
    assert isinstance(d, ds.FileSystemDataset) and len(d.files) == 10
    assert len(counting.read) == 10  # every footer, read once when the dataset is made (the engine reuses them)
    counting.read.clear()
    assert duckdb.sql("SELECT sum(x), sum(y) FROM d").fetchall() == [(sum(range(10_000)) * 2, sum(range(10_000)))]
    full = dict(counting.read)
    counting.read.clear()
    assert duckdb.sql("SELECT sum(x) FROM d WHERE y >= 9000").fetchall() == [(sum(range(9000, 10_000)) * 2,)]
    pruned = dict(counting.read)
    # the full scan read every part; the filter read the one part whose statistics can match
    assert len(full) == 10 and len(pruned) == 1
    assert sum(pruned.values()) < 0.2 * sum(full.values())
    (path,) = pruned
    assert pq.read_metadata(path).row_group(0).column(0).statistics.min == 9000
    assert t.count() == 10_000


def test_parts_pyarrow_cannot_reach_are_consolidated_in_memory(db: txns.Database) -> None:
    t = fill(db, writes=2, n=10)
    e = db.entry("t", db.latest())
    nowhere = pafs.S3FileSystem(
        endpoint_override="127.0.0.1:9",  # (the discard port: nothing listens)
        scheme="http",
        access_key="x",
        secret_key="x",
        region="us-east-1",
        connect_timeout=1,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1),
    )
    reader = PlanReader(db.client.blob, db.planner.plan(e, db.latest()), list(SCHEMA.names), None, 30.0)
    d = snapshot_dataset(reader, PartFiles(nowhere, "bucket/blob"))
    assert isinstance(d, ds.InMemoryDataset) and rows(d.to_table()) == rows(t.to_arrow())


def test_a_part_of_another_size_is_corrupt(db: txns.Database) -> None:
    t = fill(db, writes=2, n=10)
    e = db.entry("t", db.latest())
    ref = db.planner.plan(e, db.latest()).runs[0].parts[0]
    path = local_path(db.url) / "blob" / ref.key  # type: ignore[operator]
    with open(path, "ab") as f:
        f.write(b"junk")
    with pytest.raises(CorruptObject, match="size"):
        t.to_dataset()


def test_hold_s_is_checked_and_a_held_dataset_reads_after_compaction(db: txns.Database) -> None:
    # (that a hold keeps retired parts from GC is persist's hold_parts, tested with persist)
    t = fill(db, writes=3, n=10)
    with pytest.raises(InvalidUsage, match="for_s"):
        t.to_dataset(hold_s=-1)
    held = t.to_dataset(hold_s=60)
    want = rows(t.to_arrow())
    db.set_table_retention("t", dt.timedelta(0))
    db.compact()  # merges the three parts into one and retires them
    assert rows(held.to_table()) == want and len(list(direct_files(t.to_dataset()))) == 1
