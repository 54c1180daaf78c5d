"""``consolidate``'s small-table path (Python) gives exactly what Arrow's aggregation gives."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from persist._internal import parts
from persist._internal.parts import SMALL_TABLE_ROWS, consolidate

SCHEMA = pa.schema(
    [
        pa.field("k", pa.string()),
        pa.field("b", pa.binary()),
        pa.field("v", pa.int64()),
        pa.field("flag", pa.bool_()),
        pa.field("ts", pa.uint64(), nullable=False),
        pa.field("diff", pa.int64(), nullable=False),
    ]
)

rows = st.lists(
    st.tuples(
        st.one_of(st.none(), st.sampled_from(["a", "b", "é", ""])),
        st.one_of(st.none(), st.sampled_from([b"", b"x", b"\x00"])),
        st.one_of(st.none(), st.integers(-3, 3)),
        st.one_of(st.none(), st.booleans()),
        st.integers(0, 3),
        st.integers(-2, 2),
    ),
    max_size=SMALL_TABLE_ROWS,
)


def _table(rs: list[tuple[object, ...]]) -> pa.Table:
    cols = list(zip(*rs, strict=True)) if rs else [[] for _ in SCHEMA]
    return pa.Table.from_arrays([pa.array(list(c), f.type) for c, f in zip(cols, SCHEMA, strict=True)], schema=SCHEMA)


def _by_arrow(table: pa.Table, advance_to: int | None = None) -> pa.Table:
    saved = parts.SMALL_TABLE_ROWS
    parts.SMALL_TABLE_ROWS = -1  # every table takes the aggregation path
    try:
        return consolidate(table, advance_to)
    finally:
        parts.SMALL_TABLE_ROWS = saved


@settings(max_examples=300, deadline=None)
@given(rows, st.one_of(st.none(), st.integers(0, 3)))
def test_small_path_equals_arrow_aggregation(rs: list[tuple[object, ...]], advance_to: int | None) -> None:
    table = _table(rs)
    fast, slow = consolidate(table, advance_to), _by_arrow(table, advance_to)
    assert fast.schema == slow.schema and fast.schema.names == SCHEMA.names
    assert fast.to_pylist() == slow.to_pylist()
    assert 0 not in fast.column("diff").to_pylist()


def test_floats_take_the_aggregation_path() -> None:
    """NaN and -0.0 group as Arrow says, not as Python equality would."""
    schema = pa.schema([("x", pa.float64()), ("ts", pa.uint64()), ("diff", pa.int64())])
    x = [float("nan"), float("nan"), 0.0, -0.0]
    t = pa.table({"x": x, "ts": [1, 1, 1, 1], "diff": [1, 1, 1, 1]}, schema=schema)
    out = consolidate(t)
    assert [repr(x) for x in out.column("x").to_pylist()] == ["0.0", "-0.0", "nan"]
    assert out.column("diff").to_pylist() == [1, 1, 2]
