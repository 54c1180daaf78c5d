"""The engine tests' database: a local directory, every write a Parquet part, no background compaction.

(Inline rows and background merges would change which parts a snapshot
has, at times of their choosing: the tests count parts. Tests that want
inline rows connect their own.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import txns
from persist import PersistConfig
from tests import helpers


@pytest.fixture
def db(tmp_path: Path) -> Iterator[txns.Database]:
    d = txns.connect(
        helpers.file_url(tmp_path / "db"), config=PersistConfig(inline_max_bytes=0, compaction_enabled=False)
    )
    yield d
    d.close()
