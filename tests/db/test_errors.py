"""Every bad input to the database API raises a clear exception and changes nothing.

"Changes nothing" is checked on the store itself: the set of files of the
``file://`` store (blobs and consensus versions) is the same before and
after, and so are the tables' contents, the latest time and the history.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import txns
from persist import InvalidUsage, PersistClient, PersistConfig, ReadBelowSince, SchemaMismatch
from tests.seaweedfs import S3_BACKENDS
from txns.db import clock

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int32(), nullable=False),
        pa.field("name", pa.string()),
        pa.field("amount", pa.float64()),
    ]
)
GOOD = [{"id": 1, "name": "a", "amount": 1.5}]


class Store:
    def __init__(self, root: Path, config: PersistConfig | None = None) -> None:
        self.root = root
        self.url = f"file://{root}"
        self.db = txns.connect(self.url, config=config)
        self.db.create_table("t", SCHEMA)
        with self.db.transaction() as t:
            t.insert("t", GOOD)
        self.db._settle()  # (commits are applied in the background: let that finish before comparing files)

    def files(self) -> set[str]:
        return {str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file()}

    def state(self) -> tuple:
        db = self.db
        contents = {n: sorted(map(str, db.table(n).to_arrow().to_pylist())) for n in db.tables()}
        return db.latest(), db.tables(), contents, db.history().to_pylist()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "db")
    yield s
    s.db.close()


def unchanged(store: Store, fn: Callable[[], Any], exc: type[BaseException], match: str) -> BaseException:
    """Run ``fn``, expecting ``exc`` matching ``match``; check the store is exactly as before."""
    store.db._settle()
    before_state = store.state()
    before_files = store.files()
    with pytest.raises(exc, match=match) as info:
        fn()
    assert store.files() == before_files
    assert store.state() == before_state
    return info.value


def in_txn(store: Store, fn: Callable[[txns.Transaction], Any]) -> Callable[[], Any]:
    def run() -> None:
        with store.db.transaction() as t:
            fn(t)

    return run


# ---- names ---------------------------------------------------------------------------------


def test_unknown_table(store: Store) -> None:
    db = store.db
    e = unchanged(store, lambda: db.table("nope"), txns.TableNotFound, r"no table 'nope'.*tables then: \['t'\]")
    assert isinstance(e, KeyError) and isinstance(e, InvalidUsage)
    unchanged(store, in_txn(store, lambda t: t.insert("nope", GOOD)), txns.TableNotFound, "no table 'nope'")
    unchanged(store, in_txn(store, lambda t: t.retract("nope", GOOD)), txns.TableNotFound, "no table 'nope'")
    unchanged(store, lambda: db.drop_table("nope"), txns.TableNotFound, "no table 'nope'")
    unchanged(store, lambda: db.rename_table("nope", "other"), txns.TableNotFound, "no table 'nope'")
    unchanged(store, lambda: db.history(table="nope"), txns.TableNotFound, "no table 'nope'")
    unchanged(store, lambda: txns.Table(db, "nope").to_arrow(), txns.TableNotFound, "no table 'nope'")


def test_duplicate_create_table(store: Store) -> None:
    db = store.db
    unchanged(store, lambda: db.create_table("t", SCHEMA), txns.TableExists, "table 't' already exists")
    unchanged(
        store,
        in_txn(store, lambda t: (t.create_table("u", SCHEMA), t.create_table("u", SCHEMA))),
        txns.TableExists,
        "table 'u' already exists",
    )
    unchanged(store, lambda: db.rename_table("t", "t"), txns.TableExists, "'t' already exists")


@pytest.mark.parametrize(
    "name",
    ["", "1abc", "a b", "a-b", "x" * 129, "t;drop", "ünïcode"],
)
def test_invalid_table_names(store: Store, name: str) -> None:
    unchanged(store, lambda: store.db.create_table(name, SCHEMA), txns.InvalidTableName, "invalid table name")


def test_non_string_table_name(store: Store) -> None:
    unchanged(store, lambda: store.db.create_table(5, SCHEMA), txns.InvalidTableName, "must be a str")  # type: ignore[arg-type]
    unchanged(store, lambda: store.db.rename_table("t", "no good"), txns.InvalidTableName, "invalid new table name")


@pytest.mark.parametrize(
    ("schema", "match"),
    [
        ({"id": "int"}, "must be a pyarrow.Schema"),
        (pa.schema([]), "at least one column"),
        (pa.schema([("a", pa.int64()), ("a", pa.string())]), "repeated"),
        (pa.schema([("ts", pa.int64())]), "reserved"),
        (pa.schema([("diff", pa.int64())]), "reserved"),
        (pa.schema([("xs", pa.list_(pa.int64()))]), "flat type"),
        (pa.schema([("m", pa.struct([("a", pa.int64())]))]), "flat type"),
    ],
)
def test_bad_schemas(store: Store, schema: Any, match: str) -> None:
    unchanged(store, lambda: store.db.create_table("u", schema), InvalidUsage, match)


# ---- data ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "exc", "match"),
    [
        ([{"id": 1, "name": "a"}], SchemaMismatch, r"missing \['amount'\]"),
        ([{"id": 1, "name": "a", "amount": 1.0, "extra": 2}], SchemaMismatch, r"unexpected \['extra'\]"),
        ([{"id": "one", "name": "a", "amount": 1.0}], SchemaMismatch, r"column 'id' is int32, but the data has string"),
        ([{"id": 1, "name": 7, "amount": 1.0}], SchemaMismatch, r"column 'name' is string, but the data has int64"),
        ([{"id": 2**40, "name": "a", "amount": 1.0}], SchemaMismatch, r"column 'id' .* does not fit int32"),
        ([{"id": None, "name": "a", "amount": 1.0}], SchemaMismatch, r"column 'id' is not nullable"),
        (
            [{"id": 1, "name": "a", "amount": 1.0}, {"id": 2, "name": "b"}],
            SchemaMismatch,
            r"row #1 has different columns",
        ),
        ([{"id": 1, "name": "a", "amount": 1.0}, "row"], InvalidUsage, r"row #1 is a str"),
        ([{}, {}], SchemaMismatch, r"row #0 has no columns"),  # (Arrow made zero rows of them: a silent no-op)
        (pd.DataFrame({"id": [1.5], "name": ["a"], "amount": [1.0]}), SchemaMismatch, r"'id' .* does not fit int32"),
        ({1, 2}, InvalidUsage, "cannot insert a builtins.set"),
        (None, InvalidUsage, "nothing to write"),
        (42, InvalidUsage, "cannot insert"),
    ],
)
def test_bad_inserts(store: Store, data: Any, exc: type[BaseException], match: str) -> None:
    unchanged(store, in_txn(store, lambda t: t.insert("t", data)), exc, match)


def test_bad_insert_leaves_the_transaction_usable(store: Store) -> None:
    db = store.db
    with db.transaction() as t:
        with pytest.raises(SchemaMismatch):
            t.insert("t", [{"id": 2, "name": "b"}])
        with pytest.raises(SchemaMismatch):  # a stream whose second batch is bad: none of it stays
            good = pa.table({"id": pa.array([7], pa.int32()), "name": ["x"], "amount": [0.0]})
            bad = pa.table({"id": pa.array([8], pa.int64()), "name": [None], "amount": ["no"]})
            t.insert("t", iter_reader(good, bad))
        t.insert("t", [{"id": 3, "name": "c", "amount": 3.0}])
    assert sorted(db.table("t").to_arrow().column("id").to_pylist()) == [1, 3]


def iter_reader(*tables: pa.Table) -> pa.RecordBatchReader:
    def gen() -> Iterator[pa.RecordBatch]:
        for t in tables:
            yield from t.to_batches()

    return pa.RecordBatchReader.from_batches(tables[0].schema, gen())


def test_retract_absent_rows(store: Store) -> None:
    unchanged(
        store,
        in_txn(store, lambda t: t.retract("t", [{"id": 9, "name": "z", "amount": 0.0}])),
        txns.RowNotFound,
        r"cannot retract .*'id': 9.*Nothing was retracted",
    )
    unchanged(store, in_txn(store, lambda t: t.retract("t", GOOD + GOOD)), txns.RowNotFound, "1 more occurrence")


# ---- time ----------------------------------------------------------------------------------


def test_reading_a_dropped_table_after_the_drop(store: Store) -> None:
    db = store.db
    before_drop = db.latest()
    db.drop_table("t")
    after_drop = db.latest()
    unchanged(store, lambda: txns.Table(db, "t").to_arrow(as_of=after_drop), txns.TableNotFound, "no table 't'")
    assert txns.Table(db, "t").to_arrow(as_of=before_drop).column("id").to_pylist() == [1]


def test_as_of_before_the_retained_history(store: Store) -> None:
    db = store.db
    first = db.latest()
    with db.transaction() as t:
        t.insert("t", [{"id": 2, "name": "b", "amount": 2.0}])
    db.set_retention(dt.timedelta(0))
    db.compact()
    earliest = txns.Table(db, "t").earliest()
    assert earliest > first
    e = unchanged(store, lambda: db.table("t").to_arrow(as_of=first), ReadBelowSince, "earliest readable time is")
    assert isinstance(e, ReadBelowSince) and e.since == earliest
    assert str(earliest) in str(e) and clock.to_datetime(earliest).isoformat(timespec="milliseconds") in str(e)
    unchanged(store, lambda: db.table("t").changes(first), ReadBelowSince, "earliest readable time")
    unchanged(store, lambda: db.tables(as_of=first), ReadBelowSince, "earliest readable time")
    # within the retained history: unchanged
    assert sorted(db.table("t").to_arrow(as_of=earliest).column("id").to_pylist()) == [1, 2]


def test_as_of_before_the_database_existed(store: Store) -> None:
    unchanged(store, lambda: store.db.tables(as_of=5), ReadBelowSince, "before the database .* was created")
    unchanged(
        store,
        lambda: store.db.table("t").to_arrow(as_of=dt.datetime(2001, 1, 1, tzinfo=dt.UTC)),
        ReadBelowSince,
        "before the database",
    )


@pytest.mark.parametrize(
    ("as_of", "match"),
    [
        ("yesterday", "must be a timestamp"),
        (-1, ">= 0"),
        (dt.date(2024, 1, 1), "not a date"),
        (True, "must be a timestamp"),
        (1.5, "must be a timestamp"),
    ],
)
def test_bad_as_of(store: Store, as_of: Any, match: str) -> None:
    unchanged(store, lambda: store.db.table("t").to_arrow(as_of=as_of), InvalidUsage, match)


def test_bad_projection_and_filter(store: Store) -> None:
    tbl = store.db.table("t")
    unchanged(store, lambda: tbl.to_arrow(columns=["nope"]), InvalidUsage, r"unknown column\(s\) \['nope'\]")
    unchanged(store, lambda: tbl.to_arrow(columns="id"), InvalidUsage, "list of column names")
    unchanged(store, lambda: tbl.to_arrow(columns=[]), InvalidUsage, "at least one column")
    unchanged(store, lambda: tbl.scan(filter="id > 1"), InvalidUsage, "pyarrow.compute expression")
    unchanged(store, lambda: tbl.to_arrow(filter=pc.field("nope") > 1), InvalidUsage, "does not apply")
    unchanged(store, lambda: tbl.changes("then"), InvalidUsage, "start must be a timestamp")


# ---- settings, metadata, lifecycle -------------------------------------------------------------


def test_bad_settings_and_metadata(store: Store) -> None:
    db = store.db
    unchanged(store, lambda: db.set_retention(dt.timedelta(days=-1)), InvalidUsage, "must not be negative")
    unchanged(store, lambda: db.set_retention(7), InvalidUsage, "datetime.timedelta")  # type: ignore[arg-type]
    unchanged(store, lambda: db.create_table("u", SCHEMA, retention=3600), InvalidUsage, "timedelta")  # type: ignore[arg-type]
    unchanged(store, lambda: db.transaction(metadata={"when": dt.datetime.now()}), InvalidUsage, "JSON-serializable")
    unchanged(store, lambda: db.transaction(metadata=["job"]), InvalidUsage, "must be a dict")  # type: ignore[arg-type]
    unchanged(store, lambda: db.history(limit=-1), InvalidUsage, "non-negative")


def test_transaction_used_after_commit(store: Store) -> None:
    with store.db.transaction() as t:
        pass
    assert t.commit_info is not None and t.commit_info.ts is None  # nothing to commit
    unchanged(store, lambda: t.insert("t", GOOD), txns.TransactionClosed, "committed")
    unchanged(store, t.commit, txns.TransactionClosed, "committed")


# ---- locations -----------------------------------------------------------------------------------


def test_create_false_on_an_empty_directory(tmp_path: Path) -> None:
    missing = tmp_path / "nothing" / "here"
    with pytest.raises(txns.DatabaseNotFound, match=r"no database at .*nothing/here.*txns init"):
        txns.connect(f"file://{missing}", create=False)
    assert not (tmp_path / "nothing").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(txns.DatabaseNotFound, match=r"create one with txns.connect"):
        txns.connect(f"file://{empty}", create=False)
    assert list(empty.iterdir()) == []


def test_create_false_on_mem() -> None:
    with pytest.raises(txns.DatabaseNotFound, match="mem://no-db-here"):
        txns.connect("mem://no-db-here", create=False)


@pytest.mark.s3
@pytest.mark.parametrize("s3_backend", S3_BACKENDS)
def test_create_false_on_an_empty_bucket(s3_url_factory: Callable[..., str], s3_admin: Any) -> None:
    url = s3_url_factory()
    with pytest.raises(txns.DatabaseNotFound, match="no database at"):
        txns.connect(url, create=False)
    bucket = url.split("/")[2]
    assert s3_admin.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0


@pytest.mark.parametrize("url", ["file://relative/dir", "file://tmp/x", "file://~/db", "file://host.example/abs"])
def test_file_url_with_a_host_is_refused(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidUsage, match=r"file:///absolute/path") as info:
        txns.connect(url)
    assert repr(url) in str(info.value)  # quoted as typed
    assert list(tmp_path.iterdir()) == []  # nothing created


def test_messages_quote_the_url_as_typed_without_secrets(tmp_path: Path) -> None:
    url = f"file://localhost{tmp_path}/db"
    with pytest.raises(txns.DatabaseNotFound) as info:
        txns.connect(url, create=False)
    assert repr(url) in str(info.value)
    secret = "s3://bucket-name/p?aws_secret_access_key=hunter2&region=eu-west-1"
    with pytest.raises(InvalidUsage) as info2:
        txns.connect(secret)
    assert "hunter2" not in str(info2.value)
    assert "s3://bucket-name/p?aws_secret_access_key=REDACTED&region=eu-west-1" in str(info2.value)


def test_localhost_file_url_is_accepted(tmp_path: Path) -> None:
    db = txns.connect(f"file://localhost{tmp_path}/db")
    db.create_table("t", SCHEMA)
    assert txns.connect(f"file://{tmp_path}/db").tables() == ["t"]


def test_a_location_that_holds_something_else(tmp_path: Path) -> None:
    """A store with shards but no root record is not a database: create=False says so, touches nothing."""
    client = PersistClient.open(f"file://{tmp_path}/s")
    client.blob.set("unrelated", b"x")
    before = sorted(os.listdir(tmp_path / "s"))
    with pytest.raises(txns.DatabaseNotFound):
        txns.connect(f"file://{tmp_path}/s", create=False)
    assert sorted(os.listdir(tmp_path / "s")) == before
