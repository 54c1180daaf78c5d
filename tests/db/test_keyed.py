"""Keyed tables (``primary_key=[...]``), reads inside transactions, and read-only transactions.

On a ``file://`` store. The API: ``get`` / ``upsert`` / ``delete`` /
``update`` / keyed ``insert`` / ``read`` in ``db.transaction()``,
``db.read()`` pinned at one timestamp; the bad inputs (each raises having
changed nothing and leaves the transaction usable); read-your-writes; reads
at the transaction's read timestamp; the read set; and a Hypothesis state
machine of two keyed tables against a dict model.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import txns
import txns.db.keyed as keyed_mod
import txns.db.own_writes as own_writes_mod
from persist import InvalidUsage, SchemaMismatch
from txns.cli import main
from txns.db.errors import InvalidPrimaryKey

ACCOUNTS = pa.schema([("account", pa.string()), ("balance", pa.int64())])
# the key is not the first columns, and compound: the data shard puts it first, users never see that
ORDERS = pa.schema(
    [
        ("note", pa.string()),
        ("order_id", pa.int32()),
        ("amount", pa.int64()),
        pa.field("customer", pa.string(), nullable=False),
    ]
)


@pytest.fixture
def db(db_url: str) -> Iterator[txns.Database]:
    """A database with a keyed table ``accounts``, a two-column keyed table ``orders`` and an unkeyed ``log``, all
    with rows (this module's ``db``: tests/db/conftest.py's is empty)."""
    d = txns.connect(db_url)
    d.create_table("accounts", ACCOUNTS, primary_key=["account"])
    d.create_table("orders", ORDERS, primary_key=["customer", "order_id"])
    d.create_table("log", pa.schema([("event", pa.string())]))  # unkeyed
    with d.transaction() as t:
        t.insert("accounts", [{"account": "alice", "balance": 10}, {"account": "bob", "balance": 0}])
        t.insert(
            "orders",
            [
                {"customer": "a", "order_id": 1, "amount": 5, "note": None},
                {"customer": "a", "order_id": 2, "amount": 6, "note": "x"},
                {"customer": "b", "order_id": 1, "amount": 7, "note": None},
            ],
        )
    yield d
    d.close()


def table_dict(db: txns.Database, name: str, key: list[str], as_of: Any = None) -> dict[tuple, dict]:
    rows = db.table(name).to_arrow(as_of=as_of).to_pylist()
    out = {tuple(r[c] for c in key): r for r in rows}
    assert len(out) == len(rows), f"two rows of one key in {name}: {rows}"
    return out


def balances(db: txns.Database, as_of: Any = None) -> dict[str, int]:
    return {k[0]: r["balance"] for k, r in table_dict(db, "accounts", ["account"], as_of).items()}


# ---- creating keyed tables ---------------------------------------------------------------------


def test_primary_key_is_stored_and_survives_reopening(db: txns.Database, db_url: str) -> None:
    assert db.table("accounts").primary_key == ["account"]
    assert db.table("orders").primary_key == ["customer", "order_id"]
    assert db.table("log").primary_key is None
    # the user's schema exactly: no internal metadata, the user's column order
    for name, schema in (("accounts", ACCOUNTS), ("orders", ORDERS)):
        assert db.table(name).schema == schema and db.table(name).schema.metadata is None
        got = db.table(name).to_arrow()
        assert got.schema == schema and got.schema.metadata is None
        assert got.column_names == schema.names
    # the data shard sorts by the primary key first
    e = db.entry("orders", db.latest())
    assert db.handle.data_schema(e.data_id).key.names[:2] == ["customer", "order_id"]
    db.close()
    out = io.StringIO()
    assert main(["tables", db_url, "--json"], out=out) == 0
    shown = {t["name"]: t["primary_key"] for t in json.loads(out.getvalue())["tables"]}
    assert shown == {"accounts": ["account"], "log": None, "orders": ["customer", "order_id"]}
    again = txns.connect(db_url, create=False)
    try:
        assert again.table("orders").primary_key == ["customer", "order_id"]
        assert again.table("orders").schema == ORDERS
        with again.transaction() as t:
            assert t.get("orders", ("a", 2)) == {"customer": "a", "order_id": 2, "amount": 6, "note": "x"}
            # a rename and a retention change keep the key
            t.rename_table("orders", "orders2")
        again.set_table_retention("orders2", None)
        assert again.table("orders2").primary_key == ["customer", "order_id"]
    finally:
        again.close()


@pytest.mark.parametrize(
    ("pk", "match"),
    [
        (["nope"], r"unknown column\(s\) \['nope'\]"),
        ([], "at least one column"),
        (["a", "a"], r"repeats column\(s\) \['a'\]"),
        ("a", "must be a list of column names"),
        ([1], "must be a list of column names"),
        (["f"], "floating-point"),
    ],
)
def test_bad_primary_keys(db_url: str, pk: Any, match: str) -> None:
    db = txns.connect(db_url)
    schema = pa.schema([("a", pa.int64()), ("f", pa.float64())])
    with pytest.raises(InvalidPrimaryKey, match=match):
        db.create_table("t", schema, primary_key=pk)
    assert db.tables() == []
    with db.transaction() as t:  # inside a transaction too; the transaction stays usable
        with pytest.raises(InvalidUsage, match=match):
            t.create_table("t", schema, primary_key=pk)
        t.create_table("t", schema, primary_key=["a"])
    assert db.tables() == ["t"] and db.table("t").primary_key == ["a"]
    db.close()


# ---- the keyed operations ------------------------------------------------------------------------


def test_get_upsert_delete_update(db: txns.Database) -> None:
    with db.transaction() as t:
        assert t.get("accounts", ("alice",)) == {"account": "alice", "balance": 10}
        assert t.get("accounts", "alice") == {"account": "alice", "balance": 10}  # a bare value: 1-column key
        assert t.get("accounts", ("carol",)) is None
        assert t.upsert("accounts", [{"account": "alice", "balance": 7}, {"account": "carol", "balance": 1}]) == 2
        assert t.update("accounts", ("bob",), {"balance": 3}) == {"account": "bob", "balance": 3}
        assert t.delete("accounts", [("carol",), "nobody"]) == 1  # a missing key is fine
        assert t.get("orders", ("b", 1))["amount"] == 7
        t.delete("orders", [("b", 1)])
        t.upsert("orders", pd.DataFrame({"customer": ["a"], "order_id": [1], "amount": [50], "note": ["new"]}))
    info = t.commit_info
    assert info is not None and info.ts is not None
    # the old rows were retracted, the new ones added
    assert info.tables["accounts"] == {"added": 3, "retracted": 3}
    assert info.tables["orders"] == {"added": 1, "retracted": 2}
    assert balances(db) == {"alice": 7, "bob": 3}
    assert table_dict(db, "orders", ["customer", "order_id"]) == {
        ("a", 1): {"customer": "a", "order_id": 1, "amount": 50, "note": "new"},
        ("a", 2): {"customer": "a", "order_id": 2, "amount": 6, "note": "x"},
    }
    # an upsert of the same row again writes nothing
    with db.transaction() as t:
        t.upsert("accounts", [{"account": "alice", "balance": 7}])
    assert t.commit_info is not None and t.commit_info.ts is None


def test_read_your_writes(db: txns.Database) -> None:
    with db.transaction() as t:
        assert t.get("accounts", ("alice",)) == {"account": "alice", "balance": 10}
        t.upsert("accounts", [{"account": "alice", "balance": 11}])
        assert t.get("accounts", ("alice",)) == {"account": "alice", "balance": 11}
        t.insert("accounts", [{"account": "dave", "balance": 4}])
        assert t.get("accounts", ("dave",)) == {"account": "dave", "balance": 4}
        t.delete("accounts", ["bob"])
        assert t.get("accounts", ("bob",)) is None
        t.upsert("accounts", [{"account": "bob", "balance": 9}])  # deleted, then back
        assert t.get("accounts", ("bob",)) == {"account": "bob", "balance": 9}
        got = t.read("accounts")
        assert got.schema == ACCOUNTS
        assert sorted(got.to_pylist(), key=lambda r: r["account"]) == [
            {"account": "alice", "balance": 11},
            {"account": "bob", "balance": 9},
            {"account": "dave", "balance": 4},
        ]
        assert sorted(
            t.read("accounts", filter=pc.field("balance") > 5, columns=["account"]).column(0).to_pylist()
        ) == [
            "alice",
            "bob",
        ]
        # a filter excluding the own row of a key also hides the committed row it replaced
        t.update("orders", ("a", 1), {"amount": 500})
        got = t.read("orders", filter=pc.field("amount") < 100, columns=["customer", "order_id"]).to_pylist()
        assert sorted((r["customer"], r["order_id"]) for r in got) == [("a", 2), ("b", 1)]
        assert sorted(t.read("orders", filter=pc.field("amount") < 100).column("amount").to_pylist()) == [6, 7]
        assert t.read("orders", columns=["amount"]).schema == pa.schema([("amount", pa.int64())])
        # an unkeyed table: inserts and retractions applied as a multiset
        t.insert("log", [{"event": "e1"}, {"event": "e1"}, {"event": "e2"}])
        t.retract("log", [{"event": "e1"}])
        assert sorted(t.read("log").column("event").to_pylist()) == ["e1", "e2"]
        assert t.read("log", filter=pc.field("event") == "e2").num_rows == 1
        # a table created here
        t.create_table("fresh", ACCOUNTS, primary_key=["account"])
        assert t.get("fresh", "x") is None
        t.upsert("fresh", [{"account": "x", "balance": 1}])
        assert t.read("fresh").to_pylist() == [{"account": "x", "balance": 1}]
    assert balances(db) == {"alice": 11, "bob": 9, "dave": 4}
    assert sorted(db.table("log").to_arrow().column("event").to_pylist()) == ["e1", "e2"]
    assert db.table("fresh").to_arrow().to_pylist() == [{"account": "x", "balance": 1}]


def test_reads_happen_at_the_read_timestamp(db: txns.Database) -> None:
    with db.transaction() as other:
        other.insert("log", [{"event": "old"}])
    t = db.transaction()
    t.get("accounts", ("bob",))  # the first read fixes the read time (a transaction that only writes takes none)
    with db.transaction() as other:  # lands after it
        other.upsert("accounts", [{"account": "alice", "balance": 99}])
        other.insert("log", [{"event": "new"}])
    assert t.get("accounts", ("alice",)) == {"account": "alice", "balance": 10}
    assert t.read("log").column("event").to_pylist() == ["old"]
    with pytest.raises(txns.RowNotFound):  # the retract check reads at the read time too
        t.retract("log", [{"event": "new"}])
    t.retract("log", [{"event": "old"}])
    t.abort()


def test_duplicate_keys(db: txns.Database) -> None:
    with db.transaction() as t:
        with pytest.raises(
            txns.DuplicateKey, match=r"'accounts'.*\{'account': 'alice'\} \(committed\).*use upsert\(\)"
        ):
            t.insert("accounts", [{"account": "zed", "balance": 1}, {"account": "alice", "balance": 1}])
        t.insert("accounts", [{"account": "carol", "balance": 1}])
        with pytest.raises(txns.DuplicateKey, match=r"\{'account': 'carol'\} \(written earlier in this transaction\)"):
            t.insert("accounts", [{"account": "carol", "balance": 2}])
        with pytest.raises(txns.DuplicateKey, match=r"key \{'account': 'eve'\} more than once"):
            t.insert("accounts", [{"account": "eve", "balance": 1}, {"account": "eve", "balance": 2}])
        with pytest.raises(
            txns.DuplicateKey, match=r"key \{'customer': 'a', 'order_id': 3\} more than once; an upsert"
        ):
            t.upsert(
                "orders",
                [
                    {"customer": "a", "order_id": 3, "amount": 1, "note": None},
                    {"customer": "a", "order_id": 3, "amount": 2, "note": None},
                ],
            )
        with pytest.raises(txns.DuplicateKey, match=r"\{'customer': 'b', 'order_id': 1\}"):
            t.insert("orders", [{"customer": "b", "order_id": 1, "amount": 1, "note": None}])
        assert isinstance(txns.DuplicateKey("x"), InvalidUsage)
        # nothing of the failed calls was buffered; the transaction goes on
        assert t.get("accounts", ("zed",)) is None and t.get("accounts", ("eve",)) is None
    assert balances(db) == {"alice": 10, "bob": 0, "carol": 1}
    assert len(table_dict(db, "orders", ["customer", "order_id"])) == 3


def test_update_errors(db: txns.Database) -> None:
    with db.transaction() as t:
        with pytest.raises(txns.RowNotFound, match=r"'accounts' has no row with key \{'account': 'zed'\}"):
            t.update("accounts", ("zed",), {"balance": 1})
        with pytest.raises(InvalidPrimaryKey, match=r"cannot change primary key column\(s\) \['account'\]"):
            t.update("accounts", ("alice",), {"account": "al"})
        with pytest.raises(SchemaMismatch, match=r"no column\(s\) \['nope'\]"):
            t.update("accounts", ("alice",), {"nope": 1})
        with pytest.raises(SchemaMismatch, match="balance"):
            t.update("accounts", ("alice",), {"balance": "ten"})
        with pytest.raises(InvalidUsage, match="dict of column"):
            t.update("accounts", ("alice",), [("balance", 1)])  # type: ignore[arg-type]
        assert t.update("accounts", ("alice",), {"account": "alice", "balance": 12}) == {
            "account": "alice",
            "balance": 12,
        }
        assert t.update("orders", ("a", 2), {"note": None})["note"] is None
    assert balances(db) == {"alice": 12, "bob": 0}


def test_unkeyed_tables_refuse_keyed_operations(db: txns.Database) -> None:
    msg = r"table 'log' has no primary key; create it with primary_key=\[\.\.\.\]"
    with db.transaction() as t:
        for call in (
            lambda: t.get("log", ("x",)),
            lambda: t.upsert("log", [{"event": "x"}]),
            lambda: t.delete("log", ["x"]),
            lambda: t.update("log", ("x",), {"event": "y"}),
        ):
            with pytest.raises(InvalidPrimaryKey, match=msg):
                call()
        t.insert("log", [{"event": "x"}])  # insert and retract work as always
        t.retract("log", [{"event": "x"}])
        t.insert("log", [{"event": "y"}])
    with db.read() as r, pytest.raises(InvalidPrimaryKey, match=msg):
        r.get("log", "y")
    assert db.table("log").to_arrow().to_pylist() == [{"event": "y"}]


@pytest.mark.parametrize(
    ("table", "key", "match"),
    [
        ("accounts", ("alice", "x"), r"has 2 value\(s\), but the primary key \['account'\] has 1"),
        ("orders", "a", r"has 1 value\(s\), but the primary key \['customer', 'order_id'\] has 2"),
        ("orders", ("a", 1, 2), "has 3 value"),
        ("accounts", (5,), "do not fit the primary key"),
        ("orders", ("a", "one"), "do not fit the primary key"),
        ("orders", ("a", 1.5), "do not fit the primary key"),
        ("accounts", (None,), "must not be null"),
    ],
)
def test_bad_keys(db: txns.Database, table: str, key: Any, match: str) -> None:
    with db.transaction() as t:
        with pytest.raises(InvalidPrimaryKey, match=match):
            t.get(table, key)
        with pytest.raises(InvalidPrimaryKey, match=match):
            t.delete(table, [key])
    assert t.commit_info is not None and t.commit_info.ts is None
    assert t._read_set == {}  # nothing was read


def test_null_keys_in_data_are_refused(db: txns.Database) -> None:
    with db.transaction() as t:
        with pytest.raises(InvalidPrimaryKey, match="'account' must not be null"):
            t.upsert("accounts", [{"account": None, "balance": 1}])
        with pytest.raises(InvalidPrimaryKey, match="'account' must not be null"):
            t.insert("accounts", [{"account": None, "balance": 1}])
        with pytest.raises(SchemaMismatch, match="missing"):  # a key column missing from the data
            t.upsert("accounts", [{"balance": 1}])
    assert balances(db) == {"alice": 10, "bob": 0}


def test_delete_inputs(db: txns.Database) -> None:
    with db.transaction() as t:
        t.upsert("accounts", [{"account": f"u{i}", "balance": i} for i in range(6)])
    with db.transaction() as t:
        assert t.delete("accounts", ["u0", ("u1",)]) == 2
        assert t.delete("accounts", pa.table({"account": ["u2"], "balance": [0]})) == 1  # other columns ignored
        assert t.delete("accounts", pd.DataFrame({"account": ["u3", "u3", "zz"]})) == 1
        assert t.delete("accounts", [{"account": "u4"}]) == 1
        assert t.delete("accounts", ("u5",)) == 1  # one key tuple
        assert t.delete("accounts", pa.array(["u5", "alice"])) == 1  # values of a one-column key
        t.upsert("accounts", [{"account": "alice", "balance": 10}])
        assert t.delete("accounts", []) == 0
        with pytest.raises(InvalidPrimaryKey, match=r"lack the primary key column\(s\) \['account'\]"):
            t.delete("accounts", pa.table({"balance": [1]}))
        with pytest.raises(InvalidPrimaryKey, match="keys must be a list"):
            t.delete("accounts", "alice")
        assert t.delete("orders", pa.table({"customer": ["a", "b"], "order_id": pa.array([1, 1], pa.int64())})) == 2
    assert balances(db) == {"alice": 10, "bob": 0}
    assert set(table_dict(db, "orders", ["customer", "order_id"])) == {("a", 2)}


def test_retract_and_stream_insert_on_keyed_tables(db: txns.Database) -> None:
    def reader(*tables: pa.Table) -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(ACCOUNTS, (b for tb in tables for b in tb.to_batches()))

    with db.transaction() as t:
        with pytest.raises(txns.RowNotFound, match=r"its row is \{'account': 'alice', 'balance': 10\}"):
            t.retract("accounts", [{"account": "alice", "balance": 11}])
        with pytest.raises(txns.RowNotFound, match="retracted once already"):
            t.retract("accounts", [{"account": "bob", "balance": 0}, {"account": "bob", "balance": 0}])
        assert t.retract("accounts", [{"account": "alice", "balance": 10}]) == 1
        assert t.get("accounts", "alice") is None
        one = pa.table({"account": ["s1"], "balance": [1]}, schema=ACCOUNTS)
        with pytest.raises(txns.DuplicateKey, match="s1"):  # a key twice across a stream's batches
            t.insert("accounts", reader(one, one))
        assert t.insert("accounts", reader(one, pa.table({"account": ["s2"], "balance": [2]}, schema=ACCOUNTS))) == 2
    assert balances(db) == {"bob": 0, "s1": 1, "s2": 2}


def test_keyed_writes_are_bounded(db: txns.Database, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(own_writes_mod, "KEYED_WRITES_BYTES", 1000)
    with db.transaction() as t:
        with pytest.raises(InvalidUsage, match="limited to"):
            t.upsert("accounts", [{"account": f"k{i}", "balance": i} for i in range(200)])
        t.upsert("accounts", [{"account": "k", "balance": 1}])
    assert balances(db) == {"alice": 10, "bob": 0, "k": 1}


def test_get_pushes_the_key_into_the_reads_and_caches(db: txns.Database, monkeypatch: pytest.MonkeyPatch) -> None:
    filters: list[Any] = []
    real = keyed_mod.PlanReader

    def spy(blob: Any, plan: Any, columns: Any, filter: Any, deadline: float, cache: Any = None) -> Any:
        filters.append(filter)
        return real(blob, plan, columns, filter, deadline, cache)

    monkeypatch.setattr(keyed_mod, "PlanReader", spy)
    with db.transaction() as t:
        t.upsert("accounts", [{"account": f"x{i}", "balance": i} for i in range(50)])
    filters.clear()
    with db.transaction() as t:
        assert t.get("accounts", "x7") == {"account": "x7", "balance": 7}
        assert t.get("accounts", "x7") == {"account": "x7", "balance": 7}  # cached
        assert t.get("accounts", "nobody") is None
        assert t.get("accounts", "nobody") is None  # absence cached too
    assert len(filters) == 2 and all(f is not None for f in filters)
    assert "x7" in str(filters[0])
    # a point read returns just the key's row, even from a big table
    table = keyed_mod.read_at(db.planner, db.entry("accounts", db.latest()), db.latest(), ["account"], filters[0])
    assert table.to_pylist() == [{"account": "x7"}]


def test_read_set(db: txns.Database) -> None:
    acc = db.entry("accounts", db.latest()).data_id
    orders = db.entry("orders", db.latest()).data_id
    log = db.entry("log", db.latest()).data_id
    with db.transaction() as t:
        t.get("accounts", "alice")
        t.upsert("accounts", [{"account": "carol", "balance": 1}])
        t.delete("accounts", ["nobody"])
        with pytest.raises(txns.DuplicateKey):
            t.insert("accounts", [{"account": "bob", "balance": 1}])  # a read even though it raised
        t.update("orders", ("a", 1), {"amount": 1})
        assert t._read_set == {acc: {("alice",), ("carol",), ("nobody",), ("bob",)}, orders: {("a", 1)}}
        t.read("accounts")
        t.get("accounts", "dave")
        t.insert("log", [{"event": "x"}])  # a blind write reads nothing
        assert t._read_set == {acc: None, orders: {("a", 1)}}
        t.retract("log", [{"event": "x"}])
        t.create_table("fresh", ACCOUNTS, primary_key=["account"])
        t.get("fresh", "x")
        assert t._read_set == {acc: None, orders: {("a", 1)}, log: None}


def test_time_travel_after_upserts(db: txns.Database) -> None:
    seen: list[tuple[int, dict[str, int]]] = [(db.latest(), {"alice": 10, "bob": 0})]
    for i in range(4):
        with db.transaction() as t:
            a = t.get("accounts", ("alice",))
            assert a is not None
            t.upsert("accounts", [{"account": "alice", "balance": a["balance"] - 2}])
            b = t.get("accounts", ("bob",))
            t.upsert("accounts", [{"account": "bob", "balance": (b["balance"] if b else 0) + 2}])
            if i == 2:
                t.delete("accounts", ["bob"])
        assert t.commit_info is not None and t.commit_info.ts is not None
        seen.append((t.commit_info.ts, balances(db)))
    assert seen[-1][1] == {"alice": 2, "bob": 2}
    for ts, want in seen:
        assert balances(db, as_of=ts) == want
        with db.read(as_of=ts) as r:
            assert {row["account"]: row["balance"] for row in r.table("accounts").to_arrow().to_pylist()} == want
    # the history of one key: every upsert a retraction and an addition
    ch = db.table("accounts").changes(seen[1][0]).to_pylist()
    assert sum(c["diff"] for c in ch if c["account"] == "alice") == 0  # 4 retractions, 4 additions


def test_read_transaction_is_pinned(db: txns.Database) -> None:
    with db.read() as r:
        ts = r.ts
        assert r.ts == db.latest()
        with db.transaction() as t:
            t.upsert("accounts", [{"account": "alice", "balance": 1}])
            t.delete("orders", [("a", 1)])
            t.create_table("later", ACCOUNTS)
        assert db.latest() > ts
        # through r: still the old state, at r.ts, of every table
        accounts = r.table("accounts")
        assert {x["account"]: x["balance"] for x in accounts.to_arrow().to_pylist()} == {"alice": 10, "bob": 0}
        assert r.table("orders").count() == 3
        assert r.table("orders").to_arrow(filter=pc.field("customer") == "a").num_rows == 2
        assert sum(b.num_rows for b in r.table("orders").scan()) == 3
        assert r.table("accounts").primary_key == ["account"]
        assert r.get("accounts", "alice") == {"account": "alice", "balance": 10}
        assert r.tables() == ["accounts", "log", "orders"]
        with pytest.raises(txns.TableNotFound):
            r.table("later")
        # changes through r.ts only: the fixture's commit at r.ts, not the upsert after it
        assert r.table("accounts").changes(ts).select(["account", "diff"]).to_pylist() == [
            {"account": "alice", "diff": 1},
            {"account": "bob", "diff": 1},
        ]
        # the database itself moved on
        assert balances(db) == {"alice": 1, "bob": 0}
        assert db.table("orders").count() == 2
    with pytest.raises(txns.TransactionClosed):
        r.table("accounts")
    assert accounts.to_arrow().num_rows == 2  # a table it gave stays pinned
    assert {x["account"]: x["balance"] for x in accounts.to_arrow().to_pylist()} == {"alice": 10, "bob": 0}


# ---- a state machine against a dict model ------------------------------------------------------

_COMMON = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
}
settings.register_profile("keyed-ci", max_examples=20, stateful_step_count=12, **_COMMON)  # type: ignore[arg-type]
settings.register_profile("keyed-slow", max_examples=100, stateful_step_count=30, **_COMMON)  # type: ignore[arg-type]
PROFILE = settings.get_profile("keyed-slow" if os.environ.get("HYPOTHESIS_PROFILE") == "slow" else "keyed-ci")

# two keyed tables: a one-column key (a bare value), and a compound key
MODEL_TABLES = {
    "k1": (pa.schema([("v", pa.string()), ("id", pa.int64())]), ["id"]),
    "k2": (pa.schema([("g", pa.string()), ("n", pa.int16()), ("v", pa.int64())]), ["g", "n"]),
}
KEYS = {"k1": [(i,) for i in range(4)], "k2": [(g, n) for g in ("x", "y") for n in (0, 1)]}
VALUES = {"k1": ["p", "q", None], "k2": [0, 1, -5]}


def model_row(table: str, key: tuple, value: Any) -> dict[str, Any]:
    if table == "k1":
        return {"v": value, "id": key[0]}
    return {"g": key[0], "n": key[1], "v": value}


class CallerError(Exception):
    """An exception of the caller's: the transaction commits nothing."""


class KeyedMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="txns-db-keyed-")
        self.db = txns.connect(f"file://{self.dir}/db")
        for name, (schema, pk) in MODEL_TABLES.items():
            self.db.create_table(name, schema, primary_key=pk)
        self.model: dict[str, dict[tuple, dict[str, Any]]] = {n: {} for n in MODEL_TABLES}

    def teardown(self) -> None:
        self.db.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _key_arg(self, table: str, key: tuple) -> Any:
        return key[0] if table == "k1" and key[0] % 2 else key  # bare values sometimes

    @rule(data=st.data(), n_ops=st.integers(1, 5), caller_fails=st.booleans())
    def transaction(self, data: st.DataObject, n_ops: int, caller_fails: bool) -> None:
        work = {n: dict(m) for n, m in self.model.items()}
        try:
            with self.db.transaction() as t:
                for _ in range(n_ops):
                    op = data.draw(st.sampled_from(["upsert", "delete", "insert", "update", "get", "read"]))
                    table = data.draw(st.sampled_from(sorted(MODEL_TABLES)))
                    m = work[table]
                    pk = MODEL_TABLES[table][1]
                    keys = data.draw(st.lists(st.sampled_from(KEYS[table]), min_size=1, max_size=3))
                    if op == "get":
                        k = keys[0]
                        assert t.get(table, self._key_arg(table, k)) == m.get(k), (table, k)
                    elif op == "read":
                        got = t.read(table).to_pylist()
                        assert sorted(got, key=repr) == sorted(m.values(), key=repr)
                    elif op == "delete":
                        n = t.delete(table, [self._key_arg(table, k) for k in keys])
                        assert n == len({k for k in keys if k in m})
                        for k in keys:
                            m.pop(k, None)
                    elif op == "update":
                        k = keys[0]
                        v = data.draw(st.sampled_from(VALUES[table]))
                        if k in m:
                            assert t.update(table, self._key_arg(table, k), {"v": v}) == model_row(table, k, v)
                            m[k] = model_row(table, k, v)
                        else:
                            with pytest.raises(txns.RowNotFound):
                                t.update(table, self._key_arg(table, k), {"v": v})
                            event("update of a missing key")
                    else:
                        rows = [model_row(table, k, data.draw(st.sampled_from(VALUES[table]))) for k in keys]
                        repeated = len(set(keys)) < len(keys)
                        if op == "insert" and (repeated or any(k in m for k in keys)):
                            with pytest.raises(txns.DuplicateKey):
                                t.insert(table, rows)
                            event("insert of an existing key")
                        elif op == "upsert" and repeated:
                            with pytest.raises(txns.DuplicateKey):
                                t.upsert(table, rows)
                        else:
                            assert getattr(t, op)(table, rows) == len(rows)
                            for k, r in zip(keys, rows, strict=True):
                                m[k] = r
                    # the transaction sees exactly the model, key by key
                    for k in KEYS[table]:
                        assert t.get(table, k) == m.get(k)
                    assert {tuple(r[c] for c in pk) for r in t.read(table).to_pylist()} == set(m)
                if caller_fails:
                    raise CallerError()
        except CallerError:
            event("the caller raised")
            return
        self.model = work

    @rule()
    def reopen(self) -> None:
        self.db.close()
        self.db = txns.connect(f"file://{self.dir}/db", create=False)

    @invariant()
    def tables_match(self) -> None:
        for name, (_schema, pk) in MODEL_TABLES.items():
            assert table_dict(self.db, name, pk) == self.model[name], name
        with self.db.read() as r:
            for name in MODEL_TABLES:
                for k in KEYS[name]:
                    assert r.get(name, k) == self.model[name].get(k), (name, k)


KeyedMachine.TestCase.settings = PROFILE
TestKeyedModel = KeyedMachine.TestCase
