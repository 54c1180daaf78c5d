"""The keyed read cache of a transaction (txns.db.key_cache) against a model: never a wrong row, bounded."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import txns.db.key_cache as key_cache
from txns.db.key_cache import KeyCache

# (table, key, the key's rows at the read time: fixed, as a transaction's read time is)
ROWS = {(t, k): [{"k": k, "v": f"{t}{k}"}] if k % 3 else [] for t in "ab" for k in range(12)}

ops = st.lists(
    st.tuples(st.sampled_from(["add", "lookup"]), st.sampled_from("ab"), st.lists(st.integers(0, 11), max_size=6)),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_the_cache_returns_only_rows_added_and_stays_bounded(steps: list[tuple[str, str, list[int]]]) -> None:
    limit = 5
    mp = pytest.MonkeyPatch()
    mp.setattr(key_cache, "KEY_CACHE_KEYS", limit)
    try:
        c = KeyCache()
        added: set[tuple[str, int]] = set()
        for op, table, keys in steps:
            ks = [(k,) for k in dict.fromkeys(keys)]
            if op == "add":
                c.add(table, {(k,): ROWS[(table, k)] for k in dict.fromkeys(keys)})
                added |= {(table, k) for k in keys}
            else:
                found, missing = c.lookup(table, ks)
                assert set(found) | set(missing) == set(ks) and not set(found) & set(missing)
                assert [k for k in ks if k not in found] == missing  # (in the order asked)
                for (k,), rows in found.items():
                    assert (table, k) in added and rows == ROWS[(table, k)]
            assert sum(len(v) for v in c._rows.values()) <= limit
    finally:
        mp.undo()


def test_an_addition_past_the_bound_starts_over() -> None:
    c = KeyCache()
    c.add("a", {(1,): []})
    big = {(k,): [] for k in range(key_cache.KEY_CACHE_KEYS)}
    c.add("b", big)
    assert c.lookup("a", [(1,)]) == ({}, [(1,)])  # evicted: read again
    assert c.lookup("b", [(7,)]) == ({(7,): []}, [])
