"""DataFrames of distributed engines (Spark) as transaction inputs, without the core importing the engine.

``Transaction.insert(table, df)`` with a Spark DataFrame hands it to the
engine's module, imported by name on first use (``txns.spark.txn_io``): its
executors write the parts, and the transaction gets their descriptors
(``Transaction._add_batch``). So ``import txns`` never imports pyspark, and
a user who never passes a Spark DataFrame never loads ``txns.spark``.

An object belongs to an engine when its class comes from the engine's
package (``pyspark.sql...DataFrame``, classic or Spark Connect).
"""

from __future__ import annotations

import importlib
from types import ModuleType

ENGINES = {"pyspark": "txns.spark.txn_io"}
"""Top-level package of a DataFrame's class -> the module that writes such DataFrames into transactions."""


def engine_of(data: object) -> ModuleType | None:
    """The module that writes ``data`` into a transaction, if ``data`` is an engine's DataFrame; else None."""
    module = type(data).__module__ or ""
    top = module.split(".", 1)[0]
    name = ENGINES.get(top)
    if name is None or type(data).__name__ != "DataFrame":
        return None
    return importlib.import_module(name)


__all__ = ["ENGINES", "engine_of"]
