"""Executors that cannot import txns: one clear error at the first use, not an executor's stack trace.

Runs a fresh Spark application in a subprocess whose Python workers start
an interpreter without site-packages (``python -S``), where neither txns
nor its dependencies can be imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

SCRIPT = textwrap.dedent(
    """
    import os, sys
    from pyspark.sql import SparkSession
    import txns.spark
    from persist import InvalidUsage

    spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("OFF")
    try:
        txns.spark.register(spark)
    except InvalidUsage as e:
        print("REFUSED:", e)
    else:
        print("ACCEPTED")
    spark.stop()
    """
)


def test_executors_without_the_package_get_one_clear_error(tmp_path: Path) -> None:
    bare = tmp_path / "bare-python"
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    env = {**os.environ, "PYSPARK_PYTHON": str(bare), "PYTHONPATH": ""}
    env.pop("PYSPARK_DRIVER_PYTHON", None)
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith(("REFUSED", "ACCEPTED")))
    assert line.startswith("REFUSED"), line
    assert "cannot import txns" in line
    assert "txns.spark.session()" in line and "PYSPARK_PYTHON" in line
    assert str(bare) in line and "ModuleNotFoundError" in line  # names the workers' Python and the failure


def test_the_check_passes_on_a_session_whose_workers_run_this_interpreter(spark) -> None:
    from txns.spark._common import _CHECKED_SESSIONS, check_executors

    check_executors(spark)
    assert spark.sparkContext.applicationId in _CHECKED_SESSIONS
