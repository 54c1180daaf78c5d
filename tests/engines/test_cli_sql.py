"""``txns sql URL QUERY``: a table for the terminal, JSON, CSV, ``--as-of``; errors with exit statuses."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pyarrow as pa
import pytest

import txns
from tests import helpers
from txns.cli import main

pytest.importorskip("duckdb")


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def url(tmp_path: Path) -> tuple[str, int]:
    """A database with ``orders`` and ``prices``; also the time before the second order."""
    u = helpers.file_url(tmp_path / "db")
    db = txns.connect(u)
    db.create_table("orders", pa.schema([("item", pa.string()), ("qty", pa.int64())]))
    db.create_table("prices", pa.schema([("item", pa.string()), ("price", pa.float64())]))
    with db.transaction() as t:
        t.insert("prices", [{"item": "pen", "price": 1.5}, {"item": "ink, blue", "price": 4.0}])
        t.insert("orders", [{"item": "pen", "qty": 2}])
    before = db.latest()
    with db.transaction() as t:
        t.insert("orders", [{"item": "ink, blue", "qty": 1}])
    db.close()
    return u, before


QUERY = "SELECT o.item, o.qty * p.price AS cost FROM orders o JOIN prices p USING (item) ORDER BY item"


def test_sql_prints_a_table_json_and_csv(url: tuple[str, int]) -> None:
    u, before = url
    code, out, err = run("sql", u, QUERY)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("2 rows as of ")
    assert lines[1].split() == ["item", "cost"] and set(lines[2]) <= {"-", " "}
    assert lines[3].split() == ["ink,", "blue", "4.0"] and lines[4].split() == ["pen", "3.0"]
    code, out, err = run("sql", u, QUERY, "--json", "--as-of", str(before))
    assert code == 0, err
    doc = json.loads(out)
    assert doc["as_of"] == before and doc["columns"] == ["item", "cost"]
    assert doc["rows"] == [{"item": "pen", "cost": 3.0}]
    code, out, err = run("sql", u, QUERY, "--csv")
    assert code == 0, err
    assert list(csv.reader(io.StringIO(out))) == [["item", "cost"], ["ink, blue", "4.0"], ["pen", "3.0"]]


def test_sql_errors(url: tuple[str, int], tmp_path: Path) -> None:
    u, _ = url
    code, out, err = run("sql", u, "SELECT * FROM nowhere", "--json")
    assert code == 2 and "nowhere" in err
    assert json.loads(out)["error"]["type"] == "CliError"
    code, _, err = run("sql", u, "SELEC 1")
    assert code == 2 and "DuckDB refused the query" in err
    code, _, err = run("sql", u, "SELECT 1", "--json", "--csv")
    assert code == 2 and "not allowed with argument" in err
    code, _, err = run("sql", helpers.file_url(tmp_path / "none"), "SELECT 1")
    assert code == 2 and "no database" in err
