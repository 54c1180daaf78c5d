"""A Hypothesis state machine that throws bad and edge-case input at the public API (issue 26).

Names (reserved, with a final newline, too long, not strings), schemas
(nested, reserved or repeated columns, not a schema), rows (values of every
kind into every column type: overflowing, lossy, naive and aware datetimes,
NaN, wrong kinds; missing and unexpected columns; not rows at all),
``as_of`` values, retentions, URLs (with secrets in them) and the CLI. Every
call must either succeed or raise one of the library's exceptions
(``persist.PersistError`` and its ``InvalidUsage`` family,
``txns.TransactionConflict``), never a raw ``KeyError`` / ``ValueError`` /
``TypeError`` / ``AssertionError`` / ``OverflowError``; a call that raises
changes nothing. After every step the database is compared with a model:
the user tables' names and contents (as multisets), at the latest time and
as of every earlier commit. A successful insert must store exactly the
values the conversion rules give (``arrow_io``'s module doc): a lossy value
accepted is a failure.

Runs on ``file://`` (the CLI refuses in-process ``mem://``). The default
profile is sized for CI; ``HYPOTHESIS_PROFILE=slow`` runs it deeper.
"""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import math
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import txns
from persist import InvalidUsage, PersistConfig, PersistError
from tests.helpers import file_url
from txns.cli import main

D = decimal.Decimal
UTC = dt.UTC
SECRET = "fuzz-secret-7f3a9c"

_COMMON = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
}
settings.register_profile("fuzz-ci", max_examples=8, stateful_step_count=12, **_COMMON)  # type: ignore[arg-type]
settings.register_profile("fuzz-slow", max_examples=150, stateful_step_count=40, **_COMMON)  # type: ignore[arg-type]
PROFILE = settings.get_profile("fuzz-slow" if os.environ.get("HYPOTHESIS_PROFILE") == "slow" else "fuzz-ci")

LIBRARY_ERRORS = (PersistError, txns.TransactionConflict)

# column types, by a short code
TYPES = {
    "i": pa.int64(),
    "b": pa.int8(),
    "f": pa.float32(),
    "g": pa.float64(),
    "s": pa.string(),
    "d": pa.date32(),
    "t": pa.timestamp("us", tz="UTC"),
    "n": pa.timestamp("ms"),
    "m": pa.decimal128(10, 2),
}
GOOD_NAMES = ["acct", "orders", "t_1", "_x"]
BAD_NAMES: list[Any] = [
    "acct\n",
    "txns_intents",
    "txns_outcomes",
    "TXNS_mine",
    "",
    "1abc",
    "a-b",
    "a" * 129,
    "é",
    None,
    5,
    b"acct",
]
VALUES: list[Any] = [
    None,
    0,
    1,
    -1,
    127,
    128,
    2**24 + 1,
    2**53 + 1,
    2**63 - 1,
    2**64,
    -(2**63),
    0.5,
    1.5,
    3.0,
    16777217.0,
    1e300,
    -1e300,
    math.nan,
    math.inf,
    "x",
    "",
    "1",
    b"b",
    True,
    D("0.5"),
    D("1.25"),
    D("1.234"),
    D(2**60 + 1),
    dt.datetime(2024, 1, 1),
    dt.datetime(2024, 1, 1, 12, 30),
    dt.datetime(2024, 1, 1, 0, 0, 0, 1500),
    dt.datetime(2024, 1, 1, 9, tzinfo=dt.timezone(dt.timedelta(hours=9))),
    dt.datetime(2024, 1, 1, tzinfo=UTC),
    dt.date(2024, 1, 1),
    dt.time(1, 2),
    dt.timedelta(seconds=1),
    [1],
    {"a": 1},
]
AS_OFS: list[Any] = [
    -1,
    2**63,
    2**64,
    1.5,
    "yesterday",
    "2024-01-01",
    dt.date(2024, 1, 1),
    dt.timedelta(days=1),
    dt.datetime(1900, 1, 1),
    dt.datetime(1, 1, 1),
    dt.datetime(1970, 1, 1, tzinfo=UTC),
    True,
    [1],
]
RETENTIONS: list[Any] = [
    dt.timedelta(0),
    dt.timedelta(days=1),
    dt.timedelta(days=7),
    dt.timedelta(days=-1),
    7,
    1.5,
    "7d",
    None,
    dt.timedelta(days=3650),
]
if hasattr(txns.db.retention, "MAX_RETENTION"):  # retentions bounded when set (issue 26, item 9)
    RETENTIONS += [dt.timedelta(microseconds=-1), dt.timedelta.max, dt.timedelta(days=10**6)]
URLS: list[Any] = [
    "file://relative/path",
    "file:///tmp/x%00y",
    "file:///tmp/x\ny",
    f"file:///tmp/x#{SECRET}",
    f"s3://bucket/p#aws_secret_access_key={SECRET}",
    f"s3://bucket/p?sig={SECRET}",
    f"s3://bucket/p?endpoint_url=http://127.0.0.1:9/;aws_secret_access_key={SECRET}",
    f"s3://bucket/p?endpoint_url=http://127.0.0.1:9/%23{SECRET}",
    f"s3://u:{SECRET}@bucket/p",
    "s3://Bad_Bucket/p",
    "ftp://host/x",
    "no-scheme",
    "",
    None,
    3,
    b"file:///tmp/x",
]


class Refuse(Exception):
    """The model's verdict: this value does not convert without loss (the library must refuse it)."""


def stored(v: Any, code: str) -> Any:
    """What a value given for a column of type ``code`` is stored as, by the documented rules; Refuse if none."""
    if v is None:
        return None
    if isinstance(v, (bool, list, dict, bytes, dt.time, dt.timedelta)):
        raise Refuse
    if code in "ib":
        lo, hi = (-(2**63), 2**63 - 1) if code == "i" else (-128, 127)
        whole = isinstance(v, int) or (isinstance(v, float) and math.isfinite(v) and v.is_integer())
        if whole and lo <= int(v) <= hi:
            return int(v)
        raise Refuse
    if code in "fg":
        if isinstance(v, int):
            if abs(v) > 2 ** (24 if code == "f" else 53):
                raise Refuse
            return float(v)
        if isinstance(v, D):  # the float must read back as the decimal, at the decimal's scale
            f = float(pa.scalar(float(v), pa.float32()).as_py()) if code == "f" else float(v)
            exp = v.as_tuple().exponent
            assert isinstance(exp, int)
            with decimal.localcontext(decimal.Context(prec=80)):
                if D(f).quantize(D(1).scaleb(min(0, exp))) != v:
                    raise Refuse
            return f
        if isinstance(v, float):
            if code == "g" or not math.isfinite(v):
                return v
            f32 = pa.array([v], pa.float64()).cast(pa.float32(), safe=False)[0].as_py()
            if math.isinf(f32):
                raise Refuse
            return f32
        raise Refuse
    if code == "s":
        if isinstance(v, str):
            return v
        raise Refuse
    if code == "d":
        if isinstance(v, dt.datetime):
            u = v.astimezone(UTC).replace(tzinfo=None) if v.tzinfo else v
            if u.time() != dt.time(0):
                raise Refuse
            return u.date()
        if isinstance(v, dt.date):
            return v
        raise Refuse
    if code in "tn":
        if not isinstance(v, dt.datetime):
            raise Refuse
        if code == "n" and v.microsecond % 1000:
            raise Refuse
        aware = v.replace(tzinfo=UTC) if v.tzinfo is None else v.astimezone(UTC)  # naive means UTC
        return aware if code == "t" else aware.replace(tzinfo=None)
    if code == "m":
        if isinstance(v, (int, D)) and not isinstance(v, bool):
            q = D(v).quantize(D("0.01")) if abs(D(v)) < D(10) ** 8 else None
            if q is None or q != D(v):
                raise Refuse
            return q
        raise Refuse
    raise AssertionError(code)


def _row_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """A hashable, NaN-safe form of a row (NaN never equals itself)."""
    items = sorted(row.items(), key=lambda kv: kv[0])
    return tuple((k, "NaN" if isinstance(v, float) and math.isnan(v) else v) for k, v in items)


class ApiFuzz(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="txns-fuzz-")
        self.url = file_url(Path(self.dir) / "db")
        self.db = txns.connect(self.url, config=PersistConfig(read_wait_s=0.05))
        self.model: dict[str, tuple[str, Counter[tuple[Any, ...]]]] = {}  # name -> (column codes, rows)
        self.snapshots: list[tuple[int, dict[str, Counter[tuple[Any, ...]]]]] = []
        self.retention = self.db.retention
        self.keyed: set[str] = set()

    def teardown(self) -> None:
        self.db.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ---- helpers ----------------------------------------------------------------------------

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> tuple[bool, Any]:
        """(True, result) or (False, the library's exception); anything else fails the test."""
        before = self.db.latest()
        try:
            return True, fn(*args, **kwargs)
        except LIBRARY_ERRORS as e:
            assert str(e), f"{type(e).__name__} with no message"
            assert SECRET not in str(e)
            assert self.db.latest() == before, f"{type(e).__name__} raised, yet something committed: {e}"
            return False, e

    def committed(self) -> None:
        """Record the model as of the latest commit (for time-travel checks)."""
        ts = self.db.latest()
        self.snapshots.append((ts, {n: Counter(rows) for n, (_, rows) in self.model.items()}))

    @staticmethod
    def _columns(codes: str) -> list[str]:
        return [f"c{i}{c}" for i, c in enumerate(codes)]

    # ---- rules ------------------------------------------------------------------------------

    @initialize(codes=st.text("ibfgsdtnm", min_size=1, max_size=3))
    def first_table(self, codes: str) -> None:
        schema = pa.schema([(n, TYPES[c]) for n, c in zip(self._columns(codes), codes, strict=True)])
        self.db.create_table("acct", schema)
        self.model["acct"] = (codes, Counter())
        self.committed()

    @rule(
        name=st.sampled_from(GOOD_NAMES + BAD_NAMES),
        codes=st.text("ibfgsdtnm", min_size=1, max_size=3),
        twist=st.sampled_from(["none", "none", "dup", "reserved", "nested", "empty", "not_schema", "pk", "pk_unknown"]),
    )
    def create_table(self, name: Any, codes: str, twist: str) -> None:
        cols = self._columns(codes)
        fields = [(n, TYPES[c]) for n, c in zip(cols, codes, strict=True)]
        pk = None
        if twist == "dup":
            fields.append(fields[0])
        elif twist == "reserved":
            fields.append(("diff", pa.int64()))
        elif twist == "nested":
            fields.append(("l", pa.list_(pa.int64())))
        elif twist == "empty":
            fields = []
        elif twist == "pk":
            pk = [cols[0]]
        elif twist == "pk_unknown":
            pk = ["nope"]
        schema: Any = {"a": "int"} if twist == "not_schema" else pa.schema(fields)
        ok, _ = self.call(self.db.create_table, name, schema, primary_key=pk)
        valid = (
            name in GOOD_NAMES and name not in self.model and twist in ("none", "pk") and not (pk and codes[0] in "fg")
        )
        assert ok == valid, (name, codes, twist)
        if ok:
            self.model[name] = (codes, Counter())
            if pk is not None:
                self.keyed.add(name)
            self.committed()

    @rule(
        data=st.data(), n=st.integers(0, 3), twist=st.sampled_from(["none", "none", "none", "missing", "extra", "junk"])
    )
    def insert(self, data: st.DataObject, n: int, twist: str) -> None:
        name = data.draw(st.sampled_from(sorted(self.model) + BAD_NAMES[:3]))
        codes = self.model[name][0] if name in self.model else "i"
        cols = self._columns(codes)
        rows: Any = [{c: data.draw(st.sampled_from(VALUES)) for c in cols} for _ in range(n)]
        if twist == "missing" and rows:
            rows[0].pop(cols[0])
        elif twist == "extra" and rows:
            rows[-1]["zz"] = 1
        elif twist == "junk":
            rows = data.draw(st.sampled_from([None, 5, "rows", [1, 2], {cols[0]: [1, 2], "zz": [1]}, b"x"]))
        ok, _ = self.call(self._insert, name, rows)
        if name not in self.model or (twist in ("missing", "extra") and rows):
            assert not ok, (name, rows)
            return
        expected: list[dict[str, Any]] | None
        try:
            expected = [{c: stored(r[c], k) for c, k in zip(cols, codes, strict=True)} for r in rows]
        except (Refuse, TypeError, KeyError):
            expected = None
        if not ok:
            return
        assert expected is not None, f"accepted a value the rules refuse: {name} {codes} {rows!r}"
        if name in self.keyed:
            keys = [r[cols[0]] for r in expected]
            have = {dict(k)[cols[0]] for k in self.model[name][1]}
            assert None not in keys and len(set(keys)) == len(keys) and not (set(keys) & have)
        self.model[name][1].update(_row_key(r) for r in expected)
        if expected:
            self.committed()

    def _insert(self, name: Any, rows: Any) -> None:
        with self.db.transaction() as t:
            t.insert(name, rows)

    @rule(data=st.data(), bad_first=st.booleans())
    def retract_one(self, data: st.DataObject, bad_first: bool) -> None:
        """Retract a row that is there, in a transaction that may first do something bad (then nothing happens)."""
        if not self.model:
            return
        name = data.draw(st.sampled_from(sorted(self.model)))
        rows = self.model[name][1]
        if not rows:
            return
        row = dict(data.draw(st.sampled_from(sorted(rows, key=repr))))
        row = {k: (math.nan if v == "NaN" else v) for k, v in row.items()}

        def go() -> None:
            with self.db.transaction() as t:
                t.retract(name, [row])
                if bad_first:
                    t.insert(name, [{"zz": 1}])

        ok, _ = self.call(go)
        if bad_first:
            assert not ok
            return
        has_nan = any(isinstance(v, float) and math.isnan(v) for v in row.values())
        assert ok or has_nan, row  # (NaN never equals itself: such a row may not be found)
        if not ok:
            return
        rows[_row_key(row)] -= 1
        rows += Counter()
        self.committed()

    @rule(data=st.data())
    def drop_or_rename(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.model) + BAD_NAMES[:4]))
        new = data.draw(st.sampled_from(GOOD_NAMES + BAD_NAMES[:4]))
        if data.draw(st.booleans()):
            ok, _ = self.call(self.db.drop_table, name)
            assert ok == (name in self.model)
            if ok:
                del self.model[name]
                self.keyed.discard(name)
        else:
            ok, _ = self.call(self.db.rename_table, name, new)
            assert ok == (name in self.model and new in GOOD_NAMES and new not in self.model)
            if ok:
                self.model[new] = self.model.pop(name)
                if name in self.keyed:
                    self.keyed = (self.keyed - {name}) | {new}
        if ok:
            self.committed()

    @rule(as_of=st.sampled_from(AS_OFS), name=st.sampled_from(GOOD_NAMES + BAD_NAMES[:3]))
    def read_bad_as_of(self, as_of: Any, name: Any) -> None:
        ok, _ = self.call(lambda: self.db.table(name).to_arrow(as_of=as_of))
        assert not ok, (name, as_of)

    @rule(i=st.integers(0, 1000))
    def read_as_of_a_commit(self, i: int) -> None:
        ts, tables = self.snapshots[i % len(self.snapshots)]
        for name, rows in tables.items():
            ok, got = self.call(self._read_at, name, ts)
            if not ok:
                assert isinstance(got, txns.ReadBelowSince), got
                continue
            assert Counter(_row_key(r) for r in got.to_pylist()) == rows, (name, ts)
        ok, names = self.call(self.db.tables, as_of=ts)
        if ok:
            assert {n for n in names if not n.startswith("txns_")} == set(tables), ts

    def _read_at(self, name: str, ts: int) -> pa.Table:
        with self.db.read(as_of=ts) as r:  # (a table dropped since: db.table(name) names the latest tables)
            return r.table(name).to_arrow()

    @rule(retention=st.sampled_from(RETENTIONS))
    def set_retention(self, retention: Any) -> None:
        ok, _ = self.call(self.db.set_retention, retention)
        if ok:
            self.retention = retention
        assert self.db.retention == self.retention
        other = txns.connect(self.url, create=False)
        try:
            assert other.retention == self.retention  # stored values read back
        finally:
            other.close()

    @rule(url=st.sampled_from(URLS))
    def connect_bad_url(self, url: Any) -> None:
        try:
            txns.connect(url, create=False).close()
        except InvalidUsage as e:
            assert SECRET not in str(e) and SECRET not in repr(e)
        else:
            raise AssertionError(f"connected to {url!r}")

    @rule(
        argv=st.sampled_from(
            [
                ["tables"],
                ["history", "--limit", "2"],
                ["show", "{name}"],
                ["gc", "--older-than", "nan"],
                ["show", "{name}", "--as-of", "yesterday"],
                ["init", "--retention-days", "inf"],
            ]
        )
    )
    def cli(self, argv: list[str]) -> None:
        name = sorted(self.model)[0] if self.model else "nope"
        args = [argv[0], self.url, *(a.format(name=name) for a in argv[1:]), "--json"]
        out, err = io.StringIO(), io.StringIO()
        code = main(args, out, err)
        doc = json.loads(out.getvalue())  # one JSON document, success or not
        assert code in (0, 2), (args, err.getvalue())
        if argv[0] == "tables":
            assert code == 0 and {t["name"] for t in doc["tables"] if not t["name"].startswith("txns_")} == set(
                self.model
            )
            assert {t["name"]: t["rows"] for t in doc["tables"] if t["name"] in self.model} == {
                n: sum(rows.values()) for n, (_, rows) in self.model.items()
            }
        if code == 2:
            assert "unexpected" not in err.getvalue() and set(doc) == {"command", "error"}

    @rule()
    def reopen(self) -> None:
        self.db.close()
        self.db = txns.connect(self.url, create=False, config=PersistConfig(read_wait_s=0.05))

    # ---- the model ----------------------------------------------------------------------------

    @invariant()
    def matches_the_model(self) -> None:
        names = [n for n in self.db.tables() if not n.startswith("txns_")]
        assert sorted(names) == sorted(self.model)
        for name, (_, rows) in self.model.items():
            got = self.db.table(name).to_arrow().to_pylist()
            assert Counter(_row_key(r) for r in got) == rows, name


TestApiFuzz = ApiFuzz.TestCase
TestApiFuzz.settings = PROFILE
