"""The runnable examples in the public API's docstrings stay true."""

from __future__ import annotations

import doctest
import importlib

import pytest

# Every module here has runnable examples (asserted): a module without any has nothing to test here.
MODULES = [
    "persist",
    "persist.schema",
    "persist.client",
    "persist.read",
    "persist.write",
    "persist.url",
    "persist.manifest",
    "persist.shard",
    "persist.check_store",
    "txns",
    "txns.handle",
    "txns.subscribe",
    "txns.group_commit",
    "txns.db",
    "txns.db.database",
    "txns.db.engine",
    "txns.engines",
    "txns.resolve",
    "txns.resolve.rule",
    "txns.resolve.batch",
    "txns.resolve.incremental",
    "txns.resolve.incremental_additive",
    "txns.resolve.maintain",
    "txns.resolve.additive",
    "txns.resolve.order",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} doctest example(s) failed in {name}"
    assert result.attempted > 0, f"{name} lost its usage example (every module listed has examples)"
