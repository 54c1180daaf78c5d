"""A part's rows are sorted by every column but ``diff``, whether or not ``sort_updates`` had to sort.

``sort_updates`` returns rows whose first column strictly increases as they
are (one comparison pass, no sort); checked against a full sort on
generated tables: first columns sorted, unsorted, with ties, with nulls, of
several types, the later columns in any order.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from persist._internal.parts import sort_updates

TYPES: dict[str, tuple[pa.DataType, st.SearchStrategy[Any]]] = {
    "int64": (pa.int64(), st.integers(-5, 5) | st.integers(-(2**63), 2**63 - 1)),
    "uint8": (pa.uint8(), st.integers(0, 255)),
    "string": (pa.string(), st.text(max_size=3)),
    "binary": (pa.large_binary(), st.binary(max_size=3)),
    "timestamp": (pa.timestamp("us", tz="UTC"), st.datetimes(timezones=st.just(dt.UTC))),
    "float64": (pa.float64(), st.floats(allow_nan=False)),  # (never taken as sorted: always sorted)
}


def full_sort(t: pa.Table) -> pa.Table:
    return t.sort_by([(n, "ascending") for n in t.column_names if n != "diff"])


@st.composite
def tables(draw: st.DrawFn) -> pa.Table:
    typ, values = TYPES[draw(st.sampled_from(sorted(TYPES)))]
    first = draw(st.lists(values | st.none() if draw(st.booleans()) else values, min_size=2, max_size=30))
    if draw(st.booleans()):  # an ordered first column, maybe without ties
        first = sorted({v for v in first if v is not None}) if draw(st.booleans()) else sorted(first, key=repr)
    n = len(first)
    return pa.table(
        {
            "k": pa.array(first, typ),
            "v": pa.array(draw(st.lists(st.integers(-3, 3), min_size=n, max_size=n)), pa.int64()),
            "ts": pa.array(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), pa.uint64()),
            "diff": pa.array([1] * n, pa.int64()),
        }
    )


@settings(max_examples=100, deadline=None)
@given(tables())
def test_sorted_like_a_full_sort(t: pa.Table) -> None:
    got = sort_updates(t)
    assert got.drop_columns(["diff"]).equals(full_sort(t).drop_columns(["diff"]))
    assert sorted(map(str, got.to_pylist())) == sorted(map(str, t.to_pylist()))  # the same rows


def test_an_increasing_first_column_is_kept_as_it_is() -> None:
    t = pa.table({"k": [1, 2, 5], "v": [9, 0, 3], "ts": pa.array([0, 0, 0], pa.uint64()), "diff": [1, 1, 1]})
    assert sort_updates(t) is t
    tied = pa.table({"k": [1, 1, 5], "v": [9, 0, 3], "ts": pa.array([0, 0, 0], pa.uint64()), "diff": [1, 1, 1]})
    assert sort_updates(tied).column("v").to_pylist() == [0, 9, 3]
