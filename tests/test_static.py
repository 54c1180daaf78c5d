"""The static checks stay clean: mypy (strict, on the library) and ruff (the whole repository).

Both are configured in pyproject.toml ([tool.mypy], [tool.ruff]) and are dev
dependencies: if one is missing the test fails (pip install -e '.[dev]').
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 300  # a cold mypy run (no .mypy_cache) takes well under a minute on 2 cores


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )


def _report(tool: str, r: subprocess.CompletedProcess[str]) -> str:
    return f"{tool} exited {r.returncode}:\n{r.stdout}{r.stderr}"


def test_mypy_strict() -> None:
    """``mypy`` with no arguments checks what pyproject.toml names (persist, txns), strictly."""
    r = _run("mypy")
    assert r.returncode == 0, _report("mypy", r)


def test_ruff() -> None:
    r = _run("ruff", "check", ".")
    assert r.returncode == 0, _report("ruff check .", r)
