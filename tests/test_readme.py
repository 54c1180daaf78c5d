"""Every code block of README.md runs, in order, and prints what its comments say.

Python blocks run in one namespace (later blocks use names from earlier
ones), with the README's ``/tmp/...`` store paths moved into a temporary
directory. A line ``print(...)  # X`` where ``X`` starts like a Python value
(``[``, ``(``, ``{``, a quote or a digit) must print exactly ``X``. Blocks
that use Spark run only in the Spark test. The ``txns`` command block must
list real commands and options.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import README
from txns.cli import build_parser

_CHECKED = re.compile(r"^(\s*)print\((.*)\)\s+#\s*([\[\({'\"0-9].*)$")


def blocks(lang: str) -> list[str]:
    """The README's fenced blocks whose language is ``lang`` ("" for bare fences), in order."""
    out: list[str] = []
    current: list[str] | None = None
    current_lang = ""
    for line in README.read_text().splitlines():
        if line.startswith("```"):
            if current is None:
                current, current_lang = [], line[3:].strip()
            else:
                if current_lang == lang:
                    out.append("\n".join(current) + "\n")
                current = None
        elif current is not None:
            current.append(line)
    return out


def checked(source: str) -> str:
    """``source`` with each ``print(...)  # value`` turned into a check of what it prints."""
    out = []
    for line in source.splitlines():
        m = _CHECKED.match(line)
        if m:
            indent, args, expected = m.groups()
            out.append(f"{indent}__check(({args},), {expected.strip()!r})")
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def run_blocks(tmp_path: Path, with_spark: bool, spark_url: str | None = None) -> dict:
    """Run the README's Python blocks (the Spark one too ``with_spark``); ``spark_url``: only the
    Spark block, with its store there instead of a local directory."""

    def check(args: tuple, expected: str) -> None:
        got = " ".join(str(a) for a in args)
        assert got == expected, f"README says {expected!r}, the code printed {got!r}"

    ns: dict = {"__check": check, "__name__": "readme"}
    ran = 0
    for src in blocks("python"):
        spark_block = "txns_spark" in src
        if (spark_block and not with_spark) or (spark_url is not None and not spark_block):
            continue
        if spark_url is not None:
            assert '"file:///tmp/sparkshop"' in src
            src = src.replace('"file:///tmp/sparkshop"', repr(spark_url))
        src = src.replace("file:///tmp/", f"file://{tmp_path}/")
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(checked(src), "README.md", "exec"), ns)
        ran += 1
    ns["__ran"] = ran
    return ns


def test_readme_python_blocks_run(tmp_path: Path) -> None:
    ns = run_blocks(tmp_path, with_spark=False)
    assert ns["__ran"] == len([b for b in blocks("python") if "txns_spark" not in b]) >= 4
    # and the database they built is what the README says
    import txns

    db = txns.connect(f"file://{tmp_path}/shop", create=False)
    assert db.tables() == ["accounts"]
    rows = db.table("accounts").to_arrow().to_pylist()
    assert len(rows) == 1002  # the two accounts and the 1000 a DuckDB query made
    assert {r["account"]: r["balance"] for r in rows} == {
        "alice": 70,
        "bob": 30,
        **{f"user{i}": 10 for i in range(1000)},
    }
    assert db.retention.days == 30


def test_readme_checks_what_it_prints() -> None:
    n = sum(1 for b in blocks("python") for line in b.splitlines() if _CHECKED.match(line))
    assert n >= 3  # the checked prints above are really checked


@pytest.mark.spark
def test_readme_spark_block_runs(tmp_path: Path, moto_endpoint: str) -> None:
    # (moto_endpoint: its credentials are in the environment before Spark's JVM starts here, which
    # the S3 run below reuses: the JVM hands its environment to the Python workers)
    ns = run_blocks(tmp_path, with_spark=True)
    assert ns["__ran"] == len(blocks("python"))
    ns["spark"].stop()


def test_readme_command_block_lists_real_commands() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    commands = sub.choices  # type: ignore[attr-defined]
    lines = [ln for b in blocks("") for ln in b.splitlines() if ln.startswith("txns ")]
    assert len(lines) >= 9
    for line in lines:
        usage = line.split("  ")[0].split()
        name = usage[1]
        if name == "--version":
            continue
        assert name in commands, line
        options = {o for a in commands[name]._actions for o in a.option_strings}
        for word in usage[2:]:
            for opt in re.findall(r"--[a-z-]+", word):
                assert opt in options, (line, opt)


def test_quick_start_is_two_commands() -> None:
    text = README.read_text()
    section = text.split("## Quick start", 1)[1].split("##", 1)[0]
    block = section.split("```", 2)[1]
    commands = [ln for ln in block.splitlines() if ln.strip()]
    assert len(commands) == 2
    assert commands[0].endswith("txns demo") and commands[1].endswith("-m pytest")


@pytest.mark.spark
def test_readme_spark_block_runs_on_s3(tmp_path: Path, s3_url_factory: Callable[..., str]) -> None:
    """The same Spark block with its store on S3 (moto over HTTP): every print checked again."""
    url = s3_url_factory("sparkshop")
    ns = run_blocks(tmp_path, with_spark=True, spark_url=url)
    assert ns["__ran"] == 1
    assert ns["db"].url.startswith("s3://")
    ns["spark"].stop()
