"""The ``txns`` command under bad input (issue 26, item 11).

Bad numbers (NaN, infinities, overflowing values) are usage errors (exit 2,
one clear line), not "unexpected ValueError" (exit 1); with ``--json`` every
outcome, errors included, is one JSON document on stdout; in-process
locations (``mem://``) are refused, since whatever the command made or read
there would vanish with it.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

import txns
from tests.helpers import file_url
from txns.cli import main


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def url(tmp_path: Path) -> str:
    u = file_url(tmp_path / "db")
    txns.connect(u).close()
    return u


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["gc", "{url}", "--older-than", "nan"], "--older-than must be a number of seconds >= 0"),
        (["gc", "{url}", "--older-than", "inf"], "--older-than must be a number of seconds >= 0"),
        (["gc", "{url}", "--older-than=-inf"], "--older-than must be a number of seconds >= 0"),
        (["init", "{new}", "--retention-days", "nan"], "--retention-days must be a number of days >= 0"),
        (["init", "{new}", "--retention-days", "inf"], "--retention-days must be a number of days >= 0"),
        (["init", "{new}", "--retention-days", "1e300"], "is too large"),
        (["init", "{url}", "--retention-days", "1e300"], "is too large"),
        (["show", "{url}", "t", "--as-of", "²"], "is neither a timestamp nor an ISO datetime"),
    ],
)
def test_bad_numbers_are_usage_errors(url: str, tmp_path: Path, argv: list[str], says: str) -> None:
    new = file_url(tmp_path / "new")
    argv = [a.format(url=url, new=new) for a in argv]
    for extra in ([], ["--json"]):
        code, out, err = run(*argv, *extra)
        assert code == 2, err
        assert says in err and "unexpected" not in err and err.count("\n") == 1
        if extra:
            assert json.loads(out)["error"]["exit_status"] == 2 and says in json.loads(out)["error"]["message"]
        else:
            assert out == ""
    assert not (tmp_path / "new").exists()  # a refused init created nothing


def test_json_errors_are_one_document_on_stdout_for_every_command(url: str, tmp_path: Path) -> None:
    missing = file_url(tmp_path / "missing")
    cases = [
        (["init", "s3://x/p"], 2),  # not a valid bucket name
        (["tables", missing], 2),
        (["tables", url, "--as-of", "yesterday"], 2),
        (["show", url, "nope"], 2),
        (["show", url, "nope", "--limit", "-1"], 2),
        (["history", url, "--limit", "-1"], 2),
        (["inspect", url, "not-an-id"], 2),
        (["apply", missing], 2),
        (["compact", url, "--table", "nope"], 2),
        (["gc", url, "--older-than", "-1"], 2),
        (["tables"], 2),  # argparse: a missing argument
        (["history", url, "--limit", "many"], 2),  # argparse: not an int
        (["nonsense", url], 2),
    ]
    for argv, status in cases:
        code, out, err = run(*argv, "--json")
        assert code == status, (argv, err)
        doc = json.loads(out)  # exactly one document
        assert set(doc) == {"command", "error"} and doc["error"]["exit_status"] == status, argv
        assert doc["error"]["message"] and doc["error"]["message"] in err, argv
        code, out, err = run(*argv)
        assert code == status and out == "" and err, argv


def test_json_success_is_one_document_for_every_command(url: str) -> None:
    for argv in (
        ["init", url],
        ["tables", url],
        ["history", url],
        ["inspect", url],
        ["apply", url],
        ["compact", url],
        ["gc", url],
    ):
        code, out, err = run(*argv, "--json")
        assert code == 0, (argv, err)
        assert isinstance(json.loads(out), dict), argv


@pytest.mark.parametrize("command", ["init", "tables", "history", "inspect", "apply", "compact", "gc"])
def test_in_process_locations_are_refused(command: str) -> None:
    code, out, err = run(command, "mem://cli-misuse")
    assert code == 2 and out == ""
    assert "in-process" in err and "file://" in err
    assert "created a database" not in err
    with pytest.raises(txns.DatabaseNotFound):
        txns.connect("mem://cli-misuse", create=False)  # (in this process too: nothing was made)
