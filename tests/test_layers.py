"""The layering rules of docs/index.md ("Layers"), checked on the source.

- Nothing outside ``persist`` imports ``persist._internal`` or a name that
  starts with ``_`` from persist, or reads a private attribute that only
  persist's classes define.
- No import cycle among the library's modules, function-level (lazy)
  imports included; imports under ``if TYPE_CHECKING:`` are annotations
  only and do not count.
- txns' core never imports Spark, the CLI or the demo; persist never imports txns.
  Package ``__init__`` edges count: importing a module runs its parent
  packages' ``__init__`` first, so what those import at module level is
  imported by the core too (checked on the source, and in a fresh
  interpreter: ``import txns.handle`` loads neither ``txns.db`` nor pyspark).
- Nothing loads the library's own modules by name (``importlib.import_module``
  or ``__import__`` of anything but a third-party module named by a literal,
  or a string naming one of its modules): engines are found by
  registration (:mod:`txns.engines`), so the import graph above is complete.
- Nothing outside ``txns.db`` reads a private attribute that only
  ``txns.db``'s classes define: engines go through :mod:`txns.db.engine`.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (the package ``txns`` itself re-exports the database API: it is not the core)
CORE = {
    "txns.cache",
    "txns.commits",
    "txns.engines",
    "txns.entries",
    "txns.errors",
    "txns.handle",
    "txns.subscribe",
    "txns.txn",
}
NOT_CORE = ("txns.spark", "txns.db", "txns.cli", "txns.demo")


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in ("persist", "txns"):
        for p in (ROOT / pkg).rglob("*.py"):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = p
    return mods


MODULES = _modules()


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` outside ``if TYPE_CHECKING:`` blocks."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                skip.update(id(n) for n in ast.walk(sub))
    return [n for n in ast.walk(tree) if id(n) not in skip]


def _imports(mod: str) -> list[tuple[str, str | None]]:
    """(module, imported name or None) for every runtime import in ``mod``."""
    out: list[tuple[str, str | None]] = []
    for node in _runtime_nodes(ast.parse(MODULES[mod].read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.module, a.name) for a in node.names]
    return out


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for m in MODULES:
        for module, name in _imports(m):
            for target in (module, f"{module}.{name}" if name else module):
                r = _resolve(target)
                if r is not None and r != m and not m.startswith(r + "."):  # (a package's own __init__ is not an edge)
                    edges[m].add(r)
    return edges


def test_nothing_outside_persist_imports_its_internals() -> None:
    bad = []
    for m in MODULES:
        if m.startswith("persist"):
            continue
        for module, name in _imports(m):
            if module.startswith("persist") and any(p.startswith("_") for p in module.split(".")[1:]):
                bad.append(f"{m}: import {module}")
            elif module.startswith("persist") and name is not None and name.startswith("_"):
                bad.append(f"{m}: from {module} import {name}")
    assert bad == [], "layering: code outside persist uses its internals:\n" + "\n".join(bad)


def _private_attrs(prefix: str) -> set[str]:
    """Private attribute and method names defined by the classes of modules under ``prefix``."""
    names: set[str] = set()
    for m in MODULES:
        if m.startswith(prefix):
            names |= _private_attrs_of(m)
    return names


def _private_attrs_of(m: str) -> set[str]:
    """Private attribute and method names defined in module ``m`` (class attributes included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(MODULES[m].read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and node.attr.startswith("_"):
            names.add(node.attr)
        elif isinstance(node, ast.FunctionDef) and node.name.startswith("_") and not node.name.startswith("__"):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):  # (``_system: frozenset[str] = ...`` in a class body)
            for stmt in node.body:
                if isinstance(stmt, ast.Assign | ast.AnnAssign):
                    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                    names |= {t.id for t in targets if isinstance(t, ast.Name) and t.id[:1] == "_" != t.id[1:2]}
    return names


def test_no_private_attribute_of_persist_is_read_outside_it() -> None:
    only_persist = _private_attrs("persist") - _private_attrs("txns")
    bad = []
    for m, p in MODULES.items():
        if m.startswith("persist"):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in only_persist:
                bad.append(f"{m}:{node.lineno}: .{node.attr}")
    assert bad == [], "code outside persist reads persist's private attributes:\n" + "\n".join(bad)


def test_no_import_cycles() -> None:
    edges = _edges()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert cycles == [], "import cycles:\n" + "\n".join(
        " <-> ".join(f"{v} -> {sorted(w for w in edges[v] if w in c)}" for v in c) for c in cycles
    )


def test_arrows_point_one_way() -> None:
    edges = _edges()
    bad = [f"{m} -> {t}" for m in edges if m.startswith("persist") for t in edges[m] if t.startswith("txns")]
    bad += [f"{m} -> {t}" for m in CORE for t in edges[m] if t.startswith(NOT_CORE)]
    for m in CORE:
        bad += [f"{m} imports {mod}" for mod, _ in _imports(m) if mod.split(".")[0] == "pyspark"]
    assert bad == [], "layering: an arrow points the wrong way:\n" + "\n".join(bad)


def _module_level_imports(mod: str) -> list[str]:
    """The modules ``mod`` imports when it is imported: runtime imports outside any function body."""
    tree = ast.parse(MODULES[mod].read_text())
    runtime = {id(n) for n in _runtime_nodes(tree)}
    lazy: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            lazy.update(id(n) for n in ast.walk(node))
    out = []
    for node in ast.walk(tree):
        if id(node) not in runtime or id(node) in lazy:
            continue
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return out


def _parents(mod: str) -> list[str]:
    parts = mod.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _loaded_by(mod: str) -> tuple[set[str], set[str]]:
    """What importing ``mod`` loads: (the library's modules, third-party top-level packages).

    Follows module-level imports, and the parent packages' ``__init__`` of
    every module reached (Python runs them first).
    """
    seen: set[str] = set()
    third: set[str] = set()
    todo = [mod]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo += [p for p in _parents(m) if p in MODULES]
        for name in _module_level_imports(m):
            r = _resolve(name)
            if r is None:
                third.add(name.split(".")[0])
            else:
                todo += [r, *(p for p in _parents(name) if p in MODULES)]
    return seen, third


def test_the_core_imports_without_the_database_layer() -> None:
    bad = []
    for m in sorted(CORE):
        mods, third = _loaded_by(m)
        bad += [f"importing {m} loads {x}" for x in sorted(mods) if x.startswith(NOT_CORE)]
        bad += [f"importing {m} loads pyspark" for x in third if x == "pyspark"]
    assert bad == [], "layering: the core pulls in more (package __init__ edges included):\n" + "\n".join(bad)


def test_importing_the_core_loads_no_database_layer_nor_spark() -> None:
    # (the same in a fresh interpreter: what actually lands in sys.modules)
    code = (
        "import sys, txns.handle, txns.txn, txns.cache\n"
        "print(sorted(m for m in sys.modules if m.startswith(('txns.db', 'txns.spark', 'pyspark'))))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", f"importing the core loaded: {r.stdout.strip()}"


def _names_a_module(node: ast.AST) -> str | None:
    """The library's module a string constant names exactly (``"txns.spark.batch"``), if any."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        v = node.value
        if v.startswith(("txns.", "persist.")) and all(p.isidentifier() for p in v.split(".")):
            return v
    return None


def test_nothing_loads_the_librarys_modules_by_name() -> None:
    bad = []
    for m, p in MODULES.items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                arg = node.args[0] if node.args else None
                third_party = (
                    isinstance(arg, ast.Constant)
                    and isinstance(arg.value, str)
                    and arg.value.split(".")[0] not in ("txns", "persist")
                )
                if called in ("import_module", "__import__") and not third_party:  # (import_module("duckdb") is fine)
                    bad.append(f"{m}:{node.lineno}: {called}(...)")
            elif isinstance(node, ast.ImportFrom) and node.module == "importlib":
                names = [a.name for a in node.names if a.name == "import_module"]
                bad += [f"{m}:{node.lineno}: from importlib import {n}" for n in names]
            named = _names_a_module(node)
            if named is not None:
                bad.append(f"{m}:{getattr(node, 'lineno', '?')}: the string {named!r}")
    assert bad == [], "modules loaded (or named) by a string, out of the import graph's sight:\n" + "\n".join(bad)


def test_no_private_attribute_of_txns_db_is_read_outside_it() -> None:
    only_db = _private_attrs("txns.db") - _private_attrs_outside("txns.db")
    bad = []
    for m, p in MODULES.items():
        if m == "txns.db" or m.startswith("txns.db."):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in only_db:
                bad.append(f"{m}:{node.lineno}: .{node.attr}")
    assert bad == [], "code outside txns.db uses its private attributes (use txns.db.engine):\n" + "\n".join(bad)


def _private_attrs_outside(prefix: str) -> set[str]:
    """Private names defined by the library's modules outside package ``prefix``."""
    names: set[str] = set()
    for m in MODULES:
        if not (m == prefix or m.startswith(prefix + ".")):
            names |= _private_attrs_of(m)
    return names


def test_the_checks_see_the_code() -> None:
    # (guards the tests above against passing vacuously)
    edges = _edges()
    assert "persist._internal.machine" in MODULES and "txns.db.database" in MODULES
    assert "txns.handle" in edges["txns.db.database"]
    assert "persist.shard" in edges["persist.read"]
    assert _private_attrs("persist") & {"_machine", "_state"}
    only_db = _private_attrs("txns.db") - _private_attrs_outside("txns.db")
    assert {"_add_batch", "_entry", "_system"} <= only_db
    assert "txns.db.database" in _loaded_by("txns.db.table")[0]
    assert "txns" in _loaded_by("txns.handle")[0] and "pyarrow" in _loaded_by("txns.db.table")[1]
    assert _names_a_module(ast.Constant("txns.spark.batch")) == "txns.spark.batch"
    assert _names_a_module(ast.Constant("txns")) is None
