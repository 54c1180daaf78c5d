"""``txns demo``: the whole flow, with Spark, on a local directory (no server).

What it does, step by step:

1. Opens a store in a local directory (``file://``), starts a local Spark
   session, creates a txns shard and registers three tables: ``accounts``
   (key ``account``, val ``balance``), ``transfers`` (key ``txn``, val
   ``src, dst, amount``) and ``audit`` (key ``txn``, val ``event``).
2. Plans one opening transaction (every account gets the same balance) and
   ``N`` random transfers. Each transfer is one transaction over all three
   tables: a ``transfers`` row, an ``audit`` row, and in ``accounts`` the
   retraction of both old balances and the insertion of both new ones.
3. Writes the data with Spark: for each table, one Spark job whose
   executors write the rows of *every* transaction into blob storage as
   Parquet parts, one group of parts per transaction, and send back only
   part descriptors (:func:`write_grouped`). The driver turns each group into
   a ``persist.Batch``. (A job per table per transaction would cost a Spark
   job each, far too slow for hundreds of small transactions.)
4. Commits the transactions one by one, each with one compare-and-append on
   the txns shard, and applies each (metadata only); applied entries are
   tidied by the next commit.
5. Reads: current balances, a time-travel read at an earlier commit, and a
   check at every timestamp that the accounts total is unchanged, each
   account has exactly one balance, and ``transfers`` and ``audit`` hold
   the same transactions (atomicity across tables).

Timestamps are plain counters here: the txns shard's upper is the next
free commit time.
"""

from __future__ import annotations

import contextlib
import functools
import json
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import pyarrow as pa

from persist import Batch, InvalidUsage, PersistClient, PersistError, Schema, ShardId
from persist.parts import PartRef, Run
from txns.errors import TimestampUnavailable
from txns.handle import TxnsHandle
from txns.txn import Tidy, Txn, TxnApply

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ACCOUNTS = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi")
OPENING_BALANCE = 12_500
TOTAL = OPENING_BALANCE * len(ACCOUNTS)
MAX_TRANSFER = 1_000

SCHEMAS: dict[str, Schema] = {
    "accounts": Schema(
        key=pa.schema([pa.field("account", pa.string(), nullable=False)]),
        val=pa.schema([pa.field("balance", pa.int64(), nullable=False)]),
    ),
    "transfers": Schema(
        key=pa.schema([pa.field("txn", pa.int64(), nullable=False)]),
        val=pa.schema(
            [
                pa.field("src", pa.string(), nullable=False),
                pa.field("dst", pa.string(), nullable=False),
                pa.field("amount", pa.int64(), nullable=False),
            ]
        ),
    ),
    "audit": Schema(
        key=pa.schema([pa.field("txn", pa.int64(), nullable=False)]),
        val=pa.schema([pa.field("event", pa.string(), nullable=False)]),
    ),
}
"""The demo's tables. Every DataFrame also has a ``txn`` group column; ``accounts`` has ``diff``."""

_SPARK_DDL = {
    "accounts": "txn long, account string, balance long, diff long",
    "transfers": "txn long, src string, dst string, amount long",
    "audit": "txn long, event string",
}
"""DataFrame schemas (``transfers`` and ``audit`` key on ``txn``, which is also the group)."""

_LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
logger.utils.name = org.apache.spark.util.Utils
logger.utils.level = error
"""
"""Spark's startup logging: errors only. (The root stays at WARN, the level PySpark's shell
logic expects, so it does not announce a change of level; ``setLogLevel`` lowers it after.)"""


# ---- Spark ---------------------------------------------------------------------------


def spark_session(master: str = "local[2]", app_name: str = "txns-demo") -> SparkSession:
    """A quiet :func:`txns.spark.session`: no UI, no progress bars, errors only.

    Its Python workers run this interpreter (``PYSPARK_PYTHON``).
    """
    import txns.spark

    conf_dir = Path(tempfile.gettempdir()) / "txns-spark-log4j2"
    conf_dir.mkdir(exist_ok=True)
    log_conf = conf_dir / "log4j2.properties"
    if not log_conf.exists() or log_conf.read_text() != _LOG4J2:
        log_conf.write_text(_LOG4J2)
    java_opts = f"-Dlog4j2.configurationFile=file:{log_conf}"
    conf = {
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": java_opts,
        "spark.executor.extraJavaOptions": java_opts,
        "spark.sql.shuffle.partitions": "4",
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
    }
    spark = txns.spark.session(master, app_name, conf)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


GROUP_PART_ROWS = "grp long, " + "key string, rows long, size long, crc long"
"""What a task of :func:`write_grouped` returns: one row per part written, with its group."""


def _write_groups(
    url: str, shard_id: str, schema_text: str, group_col: str, drop_group: bool, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """mapInArrow function of :func:`write_grouped`: each group's rows become parts, descriptors come back."""
    import pyarrow.compute as pc

    from persist import PersistConfig
    from txns.spark.write import write_tables

    tables = [pa.Table.from_batches([b]) for b in batches if b.num_rows]
    if not tables:
        return
    table = pa.concat_tables(tables).combine_chunks().sort_by([(group_col, "ascending")])
    target = PersistConfig().part_target_bytes
    offset = 0
    for c in pc.value_counts(table.column(group_col)).to_pylist():
        group, n = c["values"], c["counts"]
        sub = table.slice(offset, n)
        offset += n
        if drop_group:
            sub = sub.drop_columns([group_col])
        if "diff" not in sub.column_names:
            sub = sub.append_column("diff", pa.repeat(pa.scalar(1, pa.int64()), n))
        sub = sub.append_column("ts", pa.repeat(pa.scalar(0, pa.uint64()), n))
        for rb in write_tables(url, shard_id, schema_text, target, iter([sub])):
            yield pa.RecordBatch.from_pydict(
                {
                    "grp": pa.repeat(pa.scalar(group, pa.int64()), rb.num_rows),
                    **{k: rb.column(k) for k in ("key", "rows", "size", "crc")},
                }
            )


def write_grouped(df: DataFrame, url: str, shard_id: str, schema: Schema, group_col: str = "txn") -> dict[int, Batch]:
    """Write ``df`` into ``shard_id`` with one Spark job: one :class:`persist.Batch` per value of ``group_col``.

    The grouped form of :func:`txns.spark.write_batch`, for many small
    transactions: a Spark job per transaction would cost far more than the
    data. Executors write each group's rows as Parquet parts straight into
    the store at ``url`` and return only part descriptors; the driver makes
    one batch (times ``[0, 1)``, ready for ``Txn.write_batch``) per group.
    ``df`` has the shard's key and val columns by name, ``group_col`` (an
    integer; kept as data too when it is also a schema column), and
    optionally ``diff`` (default 1). A group split across Spark partitions
    simply gets several parts; repartition by ``group_col`` to avoid that.
    Columns are checked on the driver first (``SchemaMismatch``).
    """
    from txns.spark import check_url
    from txns.spark.write import check_columns

    check_url(url)
    shard_id = str(ShardId.parse(str(shard_id)))
    drop_group = group_col not in schema.key_names + schema.val_names
    data = df.drop(group_col) if drop_group else df
    columns = check_columns(data.schema, schema, shard_id)
    fn = functools.partial(_write_groups, url, shard_id, schema.to_text(), group_col, drop_group)
    selected = df.select(*dict.fromkeys([*columns, group_col]))
    rows = selected.mapInArrow(fn, GROUP_PART_ROWS).collect()
    parts: dict[int, list[PartRef]] = {}
    for r in rows:
        parts.setdefault(r["grp"], []).append(PartRef(r["key"], r["rows"], r["size"], r["crc"]))
    text = schema.to_text()
    return {
        g: Batch(shard_id, uuid.uuid4().hex, 0, 1, (Run(parts=tuple(refs), rows=sum(p.rows for p in refs)),), text)
        for g, refs in sorted(parts.items())
    }


# ---- the plan ------------------------------------------------------------------------


def plan_transactions(n: int, seed: int = 7) -> dict[str, list[tuple]]:
    """Rows of every table for the opening transaction (txn 0) and ``n`` transfers (txns 1..n).

    Balances never go negative. Rows carry their transaction number first.
    """
    rng = random.Random(seed)
    bal = dict.fromkeys(ACCOUNTS, OPENING_BALANCE)
    rows: dict[str, list[tuple]] = {"accounts": [], "transfers": [], "audit": []}
    for a in ACCOUNTS:
        rows["accounts"].append((0, a, OPENING_BALANCE, 1))
    rows["audit"].append((0, f"open {len(ACCOUNTS)} accounts with {OPENING_BALANCE} each"))
    for t in range(1, n + 1):
        src = rng.choice([a for a in ACCOUNTS if bal[a] > 0])
        dst = rng.choice([a for a in ACCOUNTS if a != src])
        amount = rng.randint(1, min(MAX_TRANSFER, bal[src]))
        for a, delta in ((src, -amount), (dst, amount)):
            rows["accounts"].append((t, a, bal[a], -1))
            bal[a] += delta
            rows["accounts"].append((t, a, bal[a], 1))
        rows["transfers"].append((t, src, dst, amount))
        rows["audit"].append((t, f"transfer {t}: {src} -> {dst} {amount}"))
    return rows


# ---- output helpers ------------------------------------------------------------------


class Progress:
    """A one-line progress indicator on ``err`` (rewritten in place on a terminal)."""

    def __init__(self, err: TextIO, label: str, total: int) -> None:
        self.err, self.label, self.total = err, label, total
        self.tty = err.isatty()
        self.started = time.monotonic()
        self._last = 0.0
        self._step = max(1, total // 10)

    def update(self, done: int) -> None:
        now = time.monotonic()
        if self.tty:
            if now - self._last >= 0.1 or done == self.total:
                self.err.write(f"\r  {self.label}: {done}/{self.total}")
                self.err.flush()
                self._last = now
        elif done % self._step == 0 or done == self.total:
            self.err.write(f"  {self.label}: {done}/{self.total}\n")
            self.err.flush()

    def done(self) -> float:
        if self.tty:
            self.err.write("\n")
            self.err.flush()
        return time.monotonic() - self.started


def _balances(handle: TxnsHandle, accounts_id: str, as_of: int) -> dict[str, int]:
    """Balances at ``as_of``, read in Python (``TxnsHandle.snapshot``)."""
    return _sum_balances(handle.snapshot(accounts_id, as_of))


def _sum_balances(updates: list) -> dict[str, int]:
    out: dict[str, int] = {}
    for ((account,), (balance,)), _ts, diff in updates:
        out[account] = out.get(account, 0) + balance * diff
    return out


def _spark_balances(spark: SparkSession, handle: TxnsHandle, accounts_id: str, as_of: int) -> dict[str, int] | None:
    """Balances at ``as_of`` read as a DataFrame (executors read the parts); None without ``txns.spark.snapshot``."""
    try:
        from txns.spark import snapshot
    except ImportError:
        return None
    df = snapshot(spark, handle.client.url, handle.txns_id, accounts_id, as_of, handle=handle)
    out: dict[str, int] = {}
    for r in df.collect():
        out[r["account"]] = out.get(r["account"], 0) + int(r["balance"]) * int(r["diff"])
    return out


# ---- the demo ------------------------------------------------------------------------


def run_demo(
    directory: str,
    n_txns: int = 300,
    master: str = "local[2]",
    out: TextIO | None = None,
    err: TextIO | None = None,
    seed: int = 7,
) -> int:
    """Run the demo in ``directory`` (created if missing); return the exit status (0: every check held)."""
    out = out or sys.stdout
    err = err or sys.stderr
    started = time.monotonic()

    def say(line: str = "") -> None:
        out.write(line + "\n")
        out.flush()

    root = Path(directory).expanduser().resolve()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InvalidUsage(f"cannot create the demo directory {str(root)!r}: {e}") from None
    url = "file://" + str(root)
    client = PersistClient.open(url)
    say(f"txns demo: store {url} (a local directory, no server)")

    err.write(f"  starting Spark ({master})...\n")
    err.flush()
    t0 = time.monotonic()
    spark = spark_session(master)
    say(f"  spark {spark.version} on {master}, started in {time.monotonic() - t0:.1f}s")
    try:
        return _run(spark, client, url, root, n_txns, seed, say, err, started)
    finally:
        spark.stop()


def _run(
    spark: SparkSession,
    client: PersistClient,
    url: str,
    root: Path,
    n_txns: int,
    seed: int,
    say: Callable[[str], None],
    err: TextIO,
    started: float,
) -> int:
    # 1. the txns shard and the tables
    txns_id = str(ShardId.new())
    ids = {name: str(ShardId.new()) for name in SCHEMAS}
    names = {d: name for name, d in ids.items()}
    handle = TxnsHandle.open(client, txns_id)
    register_ts = handle.upper
    handle.register(register_ts, {ids[n]: s for n, s in SCHEMAS.items()})
    (root / "demo.json").write_text(json.dumps({"url": url, "txns_id": txns_id, "tables": ids}, indent=2) + "\n")
    say(f"\n[1/5] txns shard {txns_id}; registered 3 tables at ts {register_ts}:")
    for name, d in ids.items():
        s = SCHEMAS[name]
        say(f"      {name:<9} {d}  key ({', '.join(s.key_names)})  val ({', '.join(s.val_names)})")

    # 2. write every transaction's data with Spark
    t0 = time.monotonic()
    rows = plan_transactions(n_txns, seed)
    err.write("  spark write: opening transaction (Txn.write_dataframe)...\n")
    err.flush()
    opening = handle.begin()
    opening_accounts = [r[1:] for r in rows["accounts"] if r[0] == 0]
    opening.write_dataframe(
        ids["accounts"], spark.createDataFrame(opening_accounts, "account string, balance long, diff long")
    )
    opening.write_dataframe(
        ids["audit"], spark.createDataFrame([r for r in rows["audit"] if r[0] == 0], _SPARK_DDL["audit"])
    )
    batches: dict[str, dict[int, Batch]] = {}
    par = spark.sparkContext.defaultParallelism
    for i, name in enumerate(SCHEMAS):
        err.write(f"  spark write: table {name}, transfers 1..{n_txns} ({i + 1}/3)...\n")
        err.flush()
        df = spark.createDataFrame([r for r in rows[name] if r[0] > 0], _SPARK_DDL[name]).repartition(par, "txn")
        batches[name] = write_grouped(df, url, ids[name], SCHEMAS[name], group_col="txn")
    n_parts = sum(len(b.parts) for per in batches.values() for b in per.values())
    n_parts += sum(len(b.parts) for bs in opening.batches().values() for b in bs)
    say(
        f"\n[2/5] Spark executors wrote {n_txns + 1} transactions ({sum(len(r) for r in rows.values())} rows) as "
        f"{n_parts} Parquet parts: the opening one with Txn.write_dataframe, the {n_txns} transfers "
        f"with one grouped job per table; {time.monotonic() - t0:.1f}s"
    )

    # 3. commit and apply, one transaction at a time
    t0 = time.monotonic()
    commit_ts: list[int] = []
    pending = Tidy()
    prog = Progress(err, "commit + apply", n_txns + 1)
    for t in range(n_txns + 1):
        txn = opening if t == 0 else handle.begin()
        for name in SCHEMAS:
            b = batches[name].get(t)
            if b is not None:
                txn.write_batch(ids[name], b)
        txn.tidy(pending)
        applied = _commit(handle, txn)
        commit_ts.append(applied.commit_ts)
        pending = applied.apply(handle)
        prog.update(t + 1)
    _tidy(handle, pending)
    secs = prog.done()
    upper = handle.upper
    say(
        f"\n[3/5] committed and applied {n_txns + 1} transactions at ts {commit_ts[0]}..{commit_ts[-1]} "
        f"({secs:.1f}s, {(n_txns + 1) / secs:.0f} txn/s); txns upper {upper}"
    )

    # 4. snapshots and time travel
    accounts = ids["accounts"]
    now = upper - 1
    then = commit_ts[len(commit_ts) // 2]
    t0 = time.monotonic()
    err.write("  spark read: balances now and then...\n")
    err.flush()
    py_now, py_then = _balances(handle, accounts, now), _balances(handle, accounts, then)
    spark_now = _spark_balances(spark, handle, accounts, now)
    spark_then = _spark_balances(spark, handle, accounts, then)
    bal_now = py_now if spark_now is None else spark_now
    bal_then = py_then if spark_then is None else spark_then
    say(f"\n[4/5] balances now (ts {now}) and, by time travel, at ts {then} (after transfer {len(commit_ts) // 2}):")
    say(f"      {'account':<9} {'ts ' + str(then):>10} {'ts ' + str(now):>10}")
    for a in ACCOUNTS:
        say(f"      {a:<9} {bal_then.get(a, 0):>10} {bal_now.get(a, 0):>10}")
    say(f"      {'total':<9} {sum(bal_then.values()):>10} {sum(bal_now.values()):>10}")
    n_then = len(handle.snapshot(ids["transfers"], then))
    n_now = len(handle.snapshot(ids["transfers"], now))
    say(f"      transfers: {n_then} at ts {then}, {n_now} at ts {now}")
    bad: list[str] = []
    if spark_now is None:
        say(f"      (read in Python: txns.spark.snapshot is not available; {time.monotonic() - t0:.1f}s)")
    elif (spark_now, spark_then) == (py_now, py_then):
        say(f"      read as Spark DataFrames; the Python reads agree ({time.monotonic() - t0:.1f}s)")
    else:
        bad.append(f"Spark and Python reads differ: {spark_now} vs {py_now}, {spark_then} vs {py_then}")
        say(f"      SPARK AND PYTHON READS DIFFER: {bad[-1]}")

    # 5. the invariants at every timestamp, against the planned ledger
    lo = max(commit_ts[0], client.inspect(accounts)["since"])
    by_txn: dict[int, list[tuple]] = {}
    for r in rows["accounts"]:
        by_txn.setdefault(r[0], []).append(r)
    expected: dict[str, int] = {}
    next_txn = 0
    prog = Progress(err, "check timestamps", upper - lo)
    for i, ts in enumerate(range(lo, upper)):
        while next_txn < len(commit_ts) and commit_ts[next_txn] <= ts:
            for _t, account, balance, diff in by_txn.get(next_txn, ()):
                expected[account] = expected.get(account, 0) + balance * diff
            next_txn += 1
        acc = handle.snapshot(accounts, ts)
        bal = _sum_balances(acc)
        n_tr = len(handle.snapshot(ids["transfers"], ts))
        n_au = len(handle.snapshot(ids["audit"], ts))
        if sum(bal.values()) != TOTAL:
            bad.append(f"total {sum(bal.values())} != {TOTAL} at ts {ts}")
        if len(acc) != len(ACCOUNTS) or any(d != 1 for _, _, d in acc):
            bad.append(f"at ts {ts}: accounts do not have exactly one balance each: {acc}")
        if bal != expected:
            bad.append(f"at ts {ts}: balances {bal} differ from the ledger {expected}")
        if n_tr != next_txn - 1 or n_au != next_txn:
            bad.append(f"at ts {ts}: {n_tr} transfers and {n_au} audit rows after {next_txn} transactions")
        prog.update(i + 1)
    secs = prog.done()
    n_ts = upper - lo
    if bad:
        say(f"\n[5/5] CHECK FAILED at {len(bad)} points; first: {bad[0]}")
    else:
        say(
            f"\n[5/5] total = {TOTAL} at all {n_ts} timestamps (ts {lo}..{upper - 1}); at each, every account "
            f"has one balance, balances match the ledger, and transfers and audit hold the same "
            f"transactions ({secs:.1f}s)"
        )

    # the operator's view
    from txns.cli import inspect_txns, render_inspect

    with_names = render_inspect(inspect_txns(url, txns_id), names)
    say("\n" + with_names)
    say(f"\n  try: txns inspect {url} {txns_id}")
    say(f"       txns apply|compact|gc {url} {txns_id}   (ids also in {root / 'demo.json'})")
    say(f"\ndone in {time.monotonic() - started:.1f}s")
    with contextlib.suppress(PersistError):  # releasing our read hold early is a nicety
        handle.close()
    return 0 if not bad else 1


def _commit(handle: TxnsHandle, txn: Txn) -> TxnApply:
    """Commit ``txn`` at the txns upper, higher if another writer took that time."""
    ts = handle.upper
    while True:
        try:
            return txn.commit_at(handle, ts)
        except TimestampUnavailable as e:
            ts = e.upper


def _tidy(handle: TxnsHandle, tidy: Tidy) -> None:
    """Retract the last applied entries with one commit at the upper (retrying higher)."""
    while tidy.entries:
        try:
            handle.tidy_at(handle.upper, tidy)
            return
        except TimestampUnavailable:
            continue


__all__ = ["SCHEMAS", "plan_transactions", "run_demo", "spark_session", "write_grouped"]
