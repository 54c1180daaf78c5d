"""What one S3 request costs on moto's server and in the boto3 client, by kind, as the bucket grows.

For each server moto's app can run on (``MOTO_SERVERS`` in ``common.py``):
cheroot, which keeps connections alive and which the tests use, and
werkzeug, moto's own, which closes every connection after its response (the
baseline, measured in the same run).

The ceiling behind the moto rows of ``bench_contention.py``: moto's server
is one Python process, so the CPU it spends per request bounds the requests
per second all clients together get. For 0, 2,000 and 10,000 keys in the
bucket, 200 requests of each kind (GET, PUT, conditional PUT, a LIST of a
narrow prefix, DELETE) from one client; printed: the server's CPU
milliseconds per request (from ``/proc/PID/stat`` of the server's child
process), the client's (``time.process_time``) and the wall time.

Run: ``.venv/bin/python benchmarks/bench_moto_cost.py`` (about two minutes).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import boto3
from common import MOTO_SERVERS, moto_server, print_table

CALLS = 200


def _server_pid() -> int:
    """The moto server: this process's child started with ``--moto-server``."""
    me = os.getpid()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if ppid == me and b"--moto-server" in cmd:  # (the one running now: the other has exited)
            return int(pid)
    raise RuntimeError("the moto server's process was not found")


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def main() -> None:
    rows: list[list[object]] = []
    for server in MOTO_SERVERS:
        _measure(server, rows)
    print_table(["server", "keys in bucket", "request", "server CPU ms", "client CPU ms", "wall ms"], rows,
                title=f"moto: CPU per request, {CALLS} requests each")


def _measure(server_kind: str, rows: list[list[object]]) -> None:
    with moto_server(server=server_kind) as endpoint:
        server = _server_pid()
        c = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        bucket = "moto-cost"
        c.create_bucket(Bucket=bucket)
        have = 0
        for nkeys in (0, 2000, 10000):
            with ThreadPoolExecutor(16) as ex:
                list(ex.map(lambda i: c.put_object(Bucket=bucket, Key=f"data/{i:08d}", Body=b"x"),
                            range(have, nkeys)))
            have = nkeys
            c.put_object(Bucket=bucket, Key="q/x", Body=b"y")

            def cost(label: str, fn: Callable[[int], object], nkeys: int = nkeys) -> None:
                s0, c0, t0 = _cpu_s(server), time.process_time(), time.perf_counter()
                for i in range(CALLS):
                    fn(i)
                s1, c1, t1 = _cpu_s(server), time.process_time(), time.perf_counter()
                rows.append([server_kind, nkeys, label, f"{1000 * (s1 - s0) / CALLS:.1f}",
                             f"{1000 * (c1 - c0) / CALLS:.1f}", f"{1000 * (t1 - t0) / CALLS:.1f}"])

            cost("GET", lambda i: c.get_object(Bucket=bucket, Key="q/x")["Body"].read())
            cost("PUT", lambda i: c.put_object(Bucket=bucket, Key=f"q/p{i}", Body=b"y" * 200))
            cost("PUT If-None-Match", lambda i, n=nkeys: c.put_object(
                Bucket=bucket, Key=f"q/c{n}-{i}", Body=b"y" * 200, IfNoneMatch="*"))
            cost("LIST (narrow prefix)", lambda i: c.list_objects_v2(Bucket=bucket, Prefix="q/x"))
            cost("DELETE", lambda i: c.delete_object(Bucket=bucket, Key=f"q/p{i}"))


if __name__ == "__main__":
    main()
