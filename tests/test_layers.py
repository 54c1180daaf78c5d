"""The layering rules of docs/index.md ("Layers"), checked on the source.

- Nothing outside ``persist`` imports ``persist._internal`` or a name that
  starts with ``_`` from persist, or reads a private attribute that only
  persist's classes define.
- No import cycle among the library's modules, function-level (lazy)
  imports included; imports under ``if TYPE_CHECKING:`` are annotations
  only and do not count.
- txns' core never imports Spark, the CLI or the demo; persist never imports txns.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (the package ``txns`` itself re-exports the database API: it is not the core)
CORE = {"txns.cache", "txns.commits", "txns.entries", "txns.errors", "txns.handle", "txns.subscribe", "txns.txn"}


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
    for m, p in MODULES.items():
        if not m.startswith(prefix):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and node.attr.startswith("_"):
                names.add(node.attr)
            elif isinstance(node, ast.FunctionDef) and node.name.startswith("_") and not node.name.startswith("__"):
                names.add(node.name)
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
    bad += [
        f"{m} -> {t}"
        for m in CORE
        for t in edges[m]
        if t.startswith(("txns.spark", "txns.db", "txns.cli", "txns.demo"))
    ]
    for m in CORE:
        bad += [f"{m} imports {mod}" for mod, _ in _imports(m) if mod.split(".")[0] == "pyspark"]
    assert bad == [], "layering: an arrow points the wrong way:\n" + "\n".join(bad)


def test_the_checks_see_the_code() -> None:
    # (guards the tests above against passing vacuously)
    edges = _edges()
    assert "persist._internal.machine" in MODULES and "txns.db.database" in MODULES
    assert "txns.handle" in edges["txns.db.database"]
    assert "persist.shard" in edges["persist.read"]
    assert _private_attrs("persist") & {"_machine", "_state"}
