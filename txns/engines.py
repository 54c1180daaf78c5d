"""The registry of engines: distributed DataFrame libraries (Spark) that work inside txns' transactions.

An *engine* writes its DataFrames into a transaction (``t.insert(table,
df)``: its workers write the parts, the transaction gets the batch through
:class:`txns.db.engine.EngineTxn`) and may run ``run_batch``'s parallel
phase (``executor="spark"``). It is found by registration, never by a
module name:

- :func:`register` adds an engine (an object with the :class:`Engine`
  methods). ``txns.spark`` registers Spark's when it is imported.
- :func:`engine_for` answers which engine takes an object (the first
  registered whose ``accepts`` says so: an ``isinstance`` check against its
  DataFrame classes); :func:`engine_named` which one runs ``executor=name``.
- :func:`register_loader` covers a user who never imported the engine's
  package: before answering for an object whose class comes from the
  top-level package ``package`` (e.g. ``pyspark``), or for the name
  ``name``, the registry runs ``load`` once, which imports the engine (and
  so registers it). ``txns/__init__.py`` registers Spark's loader, a plain
  ``import txns.spark`` inside a function.

Example (an engine of one's own)::

    >>> import txns.engines as engines
    >>> class Rows(list): pass
    >>> class RowsEngine:
    ...     name = "rows"
    ...     def accepts(self, data): return isinstance(data, Rows)
    ...     def insert(self, txn, table, data):
    ...         return txn.transaction.insert(table, list(data))    # (a real engine adds a batch it wrote)
    ...     def speculate(self, db, ts, fns, *, workers, session): raise NotImplementedError
    >>> engines.register(RowsEngine())
    >>> engines.engine_for(Rows()).name, engines.engine_for([1]) is None
    ('rows', True)
    >>> engines.unregister("rows")

Invariants:

- This module imports nothing of the project and no engine: ``import
  txns`` (which imports it) loads neither the database layer nor pyspark.
- A loader runs only while no registered engine answers (so normally
  once: it registers one); it runs outside the lock, and its error
  (the engine's package cannot be imported) propagates to the caller.
- One engine per name: registering a name again replaces the engine
  (re-importing a module is harmless). The registry is guarded by a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from txns.db.database import Database
    from txns.db.engine import EngineTxn
    from txns.resolve.repair import BatchContext, Execution


class Engine(Protocol):
    """What an engine provides to txns (see the module doc)."""

    @property
    def name(self) -> str:
        """The engine's name, as ``run_batch(executor=name)`` gives it (``"spark"``)."""
        ...

    def accepts(self, data: object) -> bool:
        """Whether ``data`` is one of this engine's DataFrames (``t.insert`` hands it to :meth:`insert`)."""
        ...

    def insert(self, txn: EngineTxn, table: str, data: Any) -> int:
        """Write ``data``'s rows and add them to ``txn``'s transaction as ``table``'s; return how many."""
        ...

    def speculate(
        self,
        db: Database,
        ts: int,
        fns: Sequence[Callable[[BatchContext], Any]],
        *,
        workers: int | None,
        session: Any,
    ) -> list[Execution]:
        """``run_batch``'s parallel phase: every function once against the snapshot at ``ts``, in order."""
        ...


@dataclass(frozen=True)
class _Loader:
    package: str
    name: str
    load: Callable[[], None]


_lock = threading.RLock()
_engines: dict[str, Engine] = {}
_loaders: list[_Loader] = []


def register(engine: Engine) -> None:
    """Add ``engine`` (replacing one of the same name)."""
    name = engine.name
    if not isinstance(name, str) or not name:
        raise TypeError(f"an engine's name must be a non-empty str, got {name!r}")
    with _lock:
        _engines[name] = engine


def unregister(name: str) -> None:
    """Remove the engine named ``name`` (nothing if there is none)."""
    with _lock:
        _engines.pop(name, None)


def register_loader(package: str, name: str, load: Callable[[], None]) -> None:
    """Run ``load`` (which registers an engine) the first time an object of ``package`` or the name ``name`` comes.

    ``package``: the top-level package of the engine's DataFrame classes
    (a third-party library's, e.g. ``"pyspark"``).
    """
    with _lock:
        _loaders.append(_Loader(package, name, load))


def _loaders_of(wanted: Callable[[_Loader], bool]) -> list[_Loader]:
    with _lock:
        return [x for x in _loaders if wanted(x)]


def _found(data: object) -> Engine | None:
    with _lock:
        engines = list(_engines.values())
    return next((e for e in engines if e.accepts(data)), None)


def engine_for(data: object) -> Engine | None:
    """The engine that takes ``data``, or None: ``data`` is no engine's DataFrame.

    If no registered engine takes it, the loaders of its class's top-level
    package run first (outside the registry's lock: an import may take a while).
    """
    found = _found(data)
    if found is None:
        top = (type(data).__module__ or "").split(".", 1)[0]
        for x in _loaders_of(lambda x: x.package == top):
            x.load()
        found = _found(data)
    return found


def engine_named(name: str) -> Engine | None:
    """The engine named ``name`` (its loaders run first if it is not registered yet), or None."""
    with _lock:
        found = _engines.get(name)
    if found is None:
        for x in _loaders_of(lambda x: x.name == name):
            x.load()
        with _lock:
            found = _engines.get(name)
    return found


__all__ = ["Engine", "engine_for", "engine_named", "register", "register_loader", "unregister"]
