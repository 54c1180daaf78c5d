"""Tables by name through a Spark Connect session (``SparkSession.builder.remote(...)``).

A child process starts a local Spark Connect server (``remote("local[2]")``:
its own JVM, so it cannot clash with the test run's classic session), and
uses the ``txns`` data source through the Connect client only: register and
SQL views, reads (latest, as of a time, multiplicities), writes (append,
overwrite), a DataFrame inside a database transaction, MERGE, and a
streaming sink. It prints what it read; this process checks the database
itself. What needs a classic session (RDDs) is listed in the README.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

import txns

pytestmark = pytest.mark.spark

ACCOUNTS = pa.schema([("account", pa.string()), ("balance", pa.int64())])

_CHILD = r"""
import json, os, sys
os.environ["PYSPARK_PYTHON"] = sys.executable  # the Connect server's Python workers import txns
import txns, txns.spark
from pyspark.sql import SparkSession
from pyspark.sql.connect.session import SparkSession as ConnectSession

url, first, src, cp = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
db = txns.connect(url, create=False)
spark = SparkSession.builder.remote("local[2]").config("spark.sql.shuffle.partitions", "4").getOrCreate()
assert isinstance(spark, ConnectSession), type(spark)
out = {"views": txns.spark.register(spark, db)}
read = lambda: spark.read.format("txns").option("url", url)
rows = lambda df: sorted(map(list, df.collect()))
out["latest"] = rows(read().load("accounts"))
out["as_of_first"] = rows(read().option("asOf", str(first)).load("accounts"))
out["diff"] = rows(read().option("diff", "true").load("accounts"))
new = spark.createDataFrame([("carol", 7)], "account string, balance long")
new.write.format("txns").option("url", url).mode("append").save("scratch")
out["sql_sum"] = spark.sql("SELECT sum(balance) AS s FROM scratch").collect()[0]["s"]
with db.transaction() as t:  # a Connect DataFrame inside a database transaction
    t.insert("orders", spark.createDataFrame([(1, "alice"), (2, "carol")], "id long, account string"))
txns.spark.merge(db, "accounts", spark.createDataFrame([("alice", 100), ("dave", 1)], "account string, balance long"))
q = (spark.readStream.schema("id long, account string").json(src)
     .writeStream.format("txns").option("url", url).option("checkpointLocation", cp)
     .trigger(availableNow=True).start("orders"))
q.awaitTermination(300)
out["streamed"] = spark.read.format("txns").option("url", url).load("orders").count()
new.write.format("txns").option("url", url).mode("overwrite").save("scratch")
spark.stop()
print("RESULT " + json.dumps(out))
"""


def test_tables_by_name_through_spark_connect(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/db"
    db = txns.connect(url)
    db.create_table("accounts", ACCOUNTS, primary_key=["account"])
    db.create_table("orders", pa.schema([("id", pa.int64()), ("account", pa.string())]))
    db.create_table("scratch", ACCOUNTS)
    with db.transaction() as t:
        t.insert("accounts", [{"account": "alice", "balance": 10}, {"account": "bob", "balance": 5}])
        t.insert("scratch", [{"account": "old", "balance": 0}])
    first = t.commit_info.ts  # type: ignore[union-attr]
    with db.transaction() as t:
        t.upsert("accounts", [{"account": "bob", "balance": 6}])
    src = tmp_path / "in"
    src.mkdir()
    (src / "f0.json").write_text('{"id": 3, "account": "bob"}\n{"id": 4, "account": "alice"}\n')
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, url, str(first), str(src), str(tmp_path / "cp")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line[len("RESULT ") :])

    assert sorted(out["views"]) == ["accounts", "orders", "scratch"]
    assert out["latest"] == [["alice", 10], ["bob", 6]]
    assert out["as_of_first"] == [["alice", 10], ["bob", 5]]
    assert out["diff"] == [["alice", 10, 1], ["bob", 6, 1]]
    assert out["sql_sum"] == 7  # read after the append (of 7 to a 0), through the view
    assert out["streamed"] == 4
    # what the Connect session wrote, read back by this process
    accounts = {r["account"]: r["balance"] for r in db.table("accounts").to_arrow().to_pylist()}
    assert accounts == {"alice": 100, "bob": 6, "dave": 1}
    orders = Counter((r["id"], r["account"]) for r in db.table("orders").to_arrow().to_pylist())
    assert orders == Counter({(1, "alice"): 1, (2, "carol"): 1, (3, "bob"): 1, (4, "alice"): 1})
    # (this long-lived handle was idle while the child worked: issue 24's overwrite read back empty here)
    assert db.table("scratch").to_arrow().to_pylist() == [{"account": "carol", "balance": 7}]
    # every commit of the session lands whole: each one reads as a state the writes allow
    allowed = [[], [("old", 0)], [("carol", 7), ("old", 0)], [("carol", 7)]]
    with txns.connect(url, create=False) as fresh:
        for ts in fresh.history("scratch").column("ts").to_pylist():
            got = sorted((r["account"], r["balance"]) for r in fresh.table("scratch").to_arrow(ts).to_pylist())
            assert got in allowed, (ts, got)
            assert got == sorted((r["account"], r["balance"]) for r in db.table("scratch").to_arrow(ts).to_pylist())
    db.close()
