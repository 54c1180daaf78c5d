"""The transaction's structure: small classes, one state enum, what each part keeps."""

from __future__ import annotations

import ast
from pathlib import Path

import pyarrow as pa
import pytest

import txns
from txns.db.txn_state import TxnState

DB = Path(__file__).resolve().parents[2] / "txns" / "db"


def test_no_class_of_the_database_layer_is_over_500_lines() -> None:
    big = []
    for p in sorted(DB.glob("*.py")):
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.ClassDef) and n.end_lineno is not None and n.end_lineno - n.lineno >= 500:
                big.append(f"{p.name}: {n.name} ({n.end_lineno - n.lineno + 1} lines)")
    assert big == []
    assert any(p.name == "transaction.py" for p in DB.glob("*.py"))  # (the walk saw the code)


def test_the_state_moves_once_from_open(tmp_path: Path) -> None:
    db = txns.connect(f"file://{tmp_path / 'db'}")
    try:
        db.create_table("t", pa.schema([("x", pa.int64())]))
        t = db.transaction()
        assert t._state is TxnState.OPEN
        t.insert("t", [{"x": 1}])
        t.commit()
        assert t._state is TxnState.COMMITTED
        with pytest.raises(txns.TransactionClosed, match="this transaction is committed"):
            t.insert("t", [{"x": 2}])
        t.abort()  # (nothing to abandon: it stays committed)
        assert t._state is TxnState.COMMITTED
        a = db.transaction()
        a.insert("t", [{"x": 3}])
        a.abort()
        assert a._state is TxnState.ABANDONED
        with pytest.raises(txns.TransactionClosed, match="this transaction is abandoned"):
            a.commit()
        assert db.table("t").count() == 1
    finally:
        db.close()
