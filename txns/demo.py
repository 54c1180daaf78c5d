"""``txns demo``: a database of three tables on a local directory, used as a user would.

What it does, step by step (every step prints what it did):

1. ``txns.connect("file://DIR")`` finds or creates the database (its root
   record); one transaction replaces the demo's tables (drops them if a
   previous run left them, creates ``accounts``, ``transfers`` and ``audit``):
   DDL is transactional.
2. The opening transaction inserts every account (an Arrow table) and an
   audit row.
3. ``N`` transfers, each one transaction over all three tables: the two old
   balances retracted and the new ones inserted, a ``transfers`` row and an
   ``audit`` row, with metadata recorded in history.
4. Reads: balances now (pandas) and, by wall-clock time travel, halfway
   through; then, at every commit in the history, the checks: the total is
   unchanged, each account has one balance, ``transfers`` and ``audit`` hold
   the same transactions (atomicity across tables).
5. History: the newest commits, what each did, its metadata.
6. Retention at work: ``accounts`` gets a zero retention and the database is
   compacted; its stored rows fall from every version ever written to the
   live balances, and a read halfway back now says where history starts,
   while ``transfers`` (7 days) still reads there.

With ``--spark`` it also reads the balances as a Spark DataFrame (Java 17
needed). Re-running in the same directory reuses the database.
"""

from __future__ import annotations

import datetime as dt
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import pyarrow as pa

import txns
from persist import InvalidUsage, ReadBelowSince

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ACCOUNTS = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi")
OPENING_BALANCE = 12_500
TOTAL = OPENING_BALANCE * len(ACCOUNTS)
MAX_TRANSFER = 1_000

SCHEMAS: dict[str, pa.Schema] = {
    "accounts": pa.schema(
        [pa.field("account", pa.string(), nullable=False), pa.field("balance", pa.int64(), nullable=False)]
    ),
    "transfers": pa.schema(
        [
            pa.field("transfer", pa.int64(), nullable=False),
            pa.field("src", pa.string(), nullable=False),
            pa.field("dst", pa.string(), nullable=False),
            pa.field("amount", pa.int64(), nullable=False),
        ]
    ),
    "audit": pa.schema(
        [pa.field("transfer", pa.int64(), nullable=False), pa.field("event", pa.string(), nullable=False)]
    ),
}
"""The demo's tables."""

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


# ---- the plan ------------------------------------------------------------------------


def plan_transfers(n: int, seed: int = 7) -> list[tuple[str, str, int]]:
    """``n`` random transfers ``(src, dst, amount)``; balances never go negative."""
    rng = random.Random(seed)
    bal = dict.fromkeys(ACCOUNTS, OPENING_BALANCE)
    out = []
    for _ in range(n):
        src = rng.choice([a for a in ACCOUNTS if bal[a] > 0])
        dst = rng.choice([a for a in ACCOUNTS if a != src])
        amount = rng.randint(1, min(MAX_TRANSFER, bal[src]))
        bal[src] -= amount
        bal[dst] += amount
        out.append((src, dst, amount))
    return out


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


# ---- the demo ------------------------------------------------------------------------


def run_demo(
    directory: str,
    n_txns: int = 300,
    master: str = "local[2]",
    out: TextIO | None = None,
    err: TextIO | None = None,
    seed: int = 7,
    spark: bool = False,
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
    db = txns.connect(url)
    try:
        bad = _run(db, url, n_txns, seed, say, err, master if spark else None)
    finally:
        db.close()
    say(f"\ndone in {time.monotonic() - started:.1f}s")
    return 0 if not bad else 1


def _hms(when: dt.datetime) -> str:
    """A time of day, local, to the millisecond."""
    return when.astimezone().strftime("%H:%M:%S.%f")[:-3]


def _balances(table: pa.Table) -> dict[str, int]:
    return {r["account"]: r["balance"] for r in table.to_pylist()}


def _run(
    db: txns.Database, url: str, n: int, seed: int, say: Callable[[str], None], err: TextIO, master: str | None
) -> list[str]:
    bad: list[str] = []
    say(f"txns demo: database {url} (a local directory, no server; {len(db.history())} earlier commits)")

    # 1. the tables, replaced in one transaction
    with db.transaction(metadata={"demo": "setup"}) as t:
        for name in SCHEMAS:
            if name in db.tables():
                t.drop_table(name)
            t.create_table(name, SCHEMAS[name])
    setup = t.commit_info
    assert setup is not None  # the transaction committed
    say(f"\n[1/6] one transaction created the tables ({', '.join(setup.operations)}):")
    for name, schema in SCHEMAS.items():
        say(f"      {name:<9} {', '.join(f'{f.name} {f.type}' for f in schema)}")

    # 2. the opening transaction: Arrow in
    opening = pa.table(
        {"account": list(ACCOUNTS), "balance": [OPENING_BALANCE] * len(ACCOUNTS)}, schema=SCHEMAS["accounts"]
    )
    with db.transaction(metadata={"demo": "open"}) as t:
        t.insert("accounts", opening)
        t.insert("audit", [{"transfer": 0, "event": f"open {len(ACCOUNTS)} accounts with {OPENING_BALANCE} each"}])
    opened = t.commit_info
    assert opened is not None and opened.time is not None  # the transaction committed rows
    say(f"\n[2/6] opened {len(ACCOUNTS)} accounts with {OPENING_BALANCE} each at {_hms(opened.time)} "
        f"(commit timestamp {opened.ts})")
    first_ts = opened.ts

    # 3. the transfers: each one transaction over three tables
    plan = plan_transfers(n, seed)
    bal = dict.fromkeys(ACCOUNTS, OPENING_BALANCE)
    prog = Progress(err, "transfers", n)
    halfway: dt.datetime | None = None
    halfway_bal: dict[str, int] = {}
    for i, (src, dst, amount) in enumerate(plan, start=1):
        with db.transaction(metadata={"transfer": i}) as t:
            t.retract("accounts", [{"account": a, "balance": bal[a]} for a in (src, dst)])
            t.insert(
                "accounts",
                [{"account": src, "balance": bal[src] - amount}, {"account": dst, "balance": bal[dst] + amount}],
            )
            t.insert("transfers", [{"transfer": i, "src": src, "dst": dst, "amount": amount}])
            t.insert("audit", [{"transfer": i, "event": f"transfer {i}: {src} -> {dst} {amount}"}])
        bal[src] -= amount
        bal[dst] += amount
        if i == n // 2 or (halfway is None and i == n):
            time.sleep(0.002)
            halfway, halfway_bal = dt.datetime.now(dt.UTC), dict(bal)
            time.sleep(0.002)
        prog.update(i)
    secs = prog.done()
    say(f"\n[3/6] committed {n} transfers, each one atomic transaction over accounts, transfers and audit "
        f"({secs:.1f}s, {n / secs:.0f} txn/s)")

    # 4. reads now and by wall-clock time travel, then the checks at every commit
    assert halfway is not None
    accounts = db.table("accounts")
    now_df = accounts.to_pandas()
    then = _balances(accounts.to_arrow(as_of=halfway))
    now = dict(zip(now_df["account"], now_df["balance"], strict=True))
    say(f"\n[4/6] balances now and as of {_hms(halfway)} (halfway, a time travel read by wall-clock time):")
    say(f"      {'account':<9} {'halfway':>10} {'now':>10}")
    for a in ACCOUNTS:
        say(f"      {a:<9} {then.get(a, 0):>10} {now.get(a, 0):>10}")
    say(f"      {'total':<9} {sum(then.values()):>10} {sum(now.values()):>10}")
    if now != bal:
        bad.append(f"balances now {now} differ from the ledger {bal}")
    if then != halfway_bal:
        bad.append(f"balances halfway {then} differ from the ledger {halfway_bal}")
    if master is not None:
        bad += _spark_check(db, master, now, say, err)
    history = db.history()
    commit_ts = sorted(ts for ts in history.column("ts").to_pylist() if ts >= first_ts)
    prog = Progress(err, "checks at every commit", len(commit_ts))
    for k, ts in enumerate(commit_ts):
        acc = db.table("accounts").to_arrow(as_of=ts)
        b = _balances(acc)
        n_tr = db.table("transfers").to_arrow(as_of=ts, columns=["transfer"]).num_rows
        n_au = db.table("audit").to_arrow(as_of=ts, columns=["transfer"]).num_rows
        if sum(b.values()) != TOTAL:
            bad.append(f"total {sum(b.values())} != {TOTAL} at ts {ts}")
        if acc.num_rows != len(ACCOUNTS):
            bad.append(f"at ts {ts}: {acc.num_rows} balances for {len(ACCOUNTS)} accounts")
        if n_au != n_tr + 1:
            bad.append(f"at ts {ts}: {n_tr} transfers but {n_au} audit rows")
        prog.update(k + 1)
    secs = prog.done()
    if bad:
        say(f"      CHECK FAILED at {len(bad)} points; first: {bad[0]}")
    else:
        say(f"      total = {TOTAL} at all {len(commit_ts)} commits; at each, every account has one balance and "
            f"transfers and audit hold the same transfers ({secs:.1f}s)")

    # 5. history
    say(f"\n[5/6] history: {history.num_rows} commits; the newest three:")
    for r in history.slice(0, 3).to_pylist():
        say(f"      {_hms(r['time'])}  ts {r['ts']}  {', '.join(r['tables'])}: +{r['rows_added']} "
            f"-{r['rows_retracted']} rows  metadata {r['metadata']}")

    # 6. retention at work
    before = db.client.inspect(db.entry("accounts", db.latest()).data_id)
    db.set_table_retention("accounts", dt.timedelta(0))
    db.compact()
    after = db.client.inspect(db.entry("accounts", db.latest()).data_id)
    say(f"\n[6/6] retention: accounts now keeps no history; compaction took its stored rows from "
        f"{before['rows']} (every balance ever written) to {after['rows']} (the live ones)")
    try:
        db.table("accounts").to_arrow(as_of=halfway)
        bad.append("accounts was still readable halfway back after compaction with zero retention")
    except ReadBelowSince as e:
        say(f"      reading accounts halfway back now says: {e}")
    still = db.table("transfers").to_arrow(as_of=halfway, columns=["transfer"]).num_rows
    say(f"      transfers keeps the default {db.retention.days} days: {still} transfers as of halfway")
    if after["rows"] != len(ACCOUNTS):
        bad.append(f"accounts stores {after['rows']} rows after compaction, not {len(ACCOUNTS)}")
    if _balances(db.table("accounts").to_arrow()) != bal:
        bad.append("balances changed across compaction")
    db.set_table_retention("accounts", None)

    say(f"\n  try: txns tables {url}")
    say(f"       txns show {url} accounts")
    say(f"       txns history {url} --limit 5")
    say(f"       txns show {url} accounts --as-of {halfway.astimezone().isoformat(timespec='milliseconds')}")
    return bad


def _spark_check(
    db: txns.Database, master: str, now: dict[str, int], say: Callable[[str], None], err: TextIO
) -> list[str]:
    """Read the balances as a Spark DataFrame (executors read the Parquet parts) and compare."""
    from txns.spark import snapshot

    err.write(f"  starting Spark ({master})...\n")
    spark = spark_session(master)
    try:
        ts = db.latest()
        e = db.entry("accounts", ts)
        df = snapshot(spark, db.client.url, db.root.txns_id, e.data_id, ts, handle=db.handle)
        got: dict[str, int] = {}
        for r in df.collect():
            got[r["account"]] = got.get(r["account"], 0) + int(r["balance"]) * int(r["diff"])
    finally:
        spark.stop()
    say(f"      read as a Spark DataFrame too: {'the same' if got == now else 'DIFFERENT'}")
    return [] if got == now else [f"Spark read {got}, Python read {now}"]


__all__ = ["SCHEMAS", "plan_transfers", "run_demo", "spark_session"]
