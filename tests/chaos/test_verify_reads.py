"""The chaos verifier's check of long-lived reads (tests/chaos/verify.py, (f)): exact, as multisets.

Synthetic feeds (one transfer at time 3) and reads: a read equal to the
history passes; a duplicated row, a missing transfer, a transfer seen too
early and a torn read are each reported.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.chaos.verify import Report, replay

FEEDS = {
    "legs": [((("a", "t1"), (-5,)), 3, 1), ((("b", "t1"), (5,)), 3, 1)],
    "ledger": [((("t1",), ("a", "b", 5, "")), 3, 1)],
}
LEDGER = [["t1", "a", "b", 5, 0, 1]]
LEGS = [["a", "t1", -5, 1], ["b", "t1", 5, 1]]


def _read(ts: int, ledger: list[list[Any]], legs: list[list[Any]]) -> dict[str, Any]:
    return {"ts": ts, "kind": "as_of", "ledger": ledger, "legs": legs, "reader": "r0"}


def _check(*reads: dict[str, Any]) -> Report:
    rep = Report()
    replay(rep, FEEDS, {"t1": 3}, 1, 6, list(reads))
    return rep


def test_reads_equal_to_the_history_pass() -> None:
    rep = _check(_read(2, [], []), _read(3, LEDGER, LEGS), _read(5, LEDGER, LEGS))
    assert rep.ok, rep.violations
    assert (rep.reads_checked, rep.reads_exact) == (3, 3)


@pytest.mark.parametrize(
    ("read", "kind"),
    [
        (_read(4, LEDGER + LEDGER, LEGS), "read_duplicate"),  # a duplicated row: a dict would collapse it
        (_read(4, [["t1", "a", "b", 5, 0, 2]], LEGS), "read_duplicate"),
        (_read(4, [], []), "read_lost"),
        (_read(2, LEDGER, LEGS), "read_early"),
        (_read(4, LEDGER, LEGS[:1]), "read_torn"),
        (_read(4, LEDGER, [["a", "t1", -5, 1], ["b", "t1", 6, 1]]), "read_sum_nonzero"),
        (_read(6, LEDGER, LEGS), "read_past_upper"),
    ],
)
def test_a_wrong_read_is_reported(read: dict[str, Any], kind: str) -> None:
    rep = _check(read)
    assert kind in rep.violations, rep.violations
    if read["ts"] < 6:  # (within the history: also compared with it exactly)
        assert "read_mismatch" in rep.violations, rep.violations
