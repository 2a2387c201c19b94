"""No import cycle inside ctxd: every module's imports, walked from its source.

A cycle means two modules can only be understood (and replaced) together: the core is
layered so that each piece depends on narrower ones below it. Imports made for type
checking only and imports inside functions count too: they are the same dependency,
only deferred.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import ctxd

PACKAGES = ["ctxd", "ctxd.daemon", "ctxd.protocol", "ctxd.clients"]  # and their subpackages


def _modules() -> dict[str, Path]:
    """Every module of ctxd, by dotted name, with its source file."""
    found: dict[str, Path] = {}
    for pkg_name in PACKAGES:
        pkg = importlib.import_module(pkg_name)
        found[pkg_name] = Path(pkg.__file__ or "")
        for info in pkgutil.walk_packages(pkg.__path__, pkg_name + "."):
            if info.name in found:
                continue
            spec = importlib.util.find_spec(info.name)
            assert spec is not None and spec.origin, info.name
            found[info.name] = Path(spec.origin)
    return found


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The ctxd modules `name` imports (a package's own `__init__` counts as a module)."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    out.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target in known:
                out.add(target)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in known:
                    out.add(sub)
    out.discard(name)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_walk_finds_the_core() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, set(modules)) for name, path in modules.items()}
    # the walk sees what it must: relative, absolute and type-checking imports
    assert "ctxd.daemon.stores.sqlite" in graph["ctxd.daemon.engine"]
    assert "ctxd.daemon.archive" in graph["ctxd.daemon.stores.sqlite"]
    assert "ctxd.protocol.errors" in graph["ctxd.daemon.engine"]
    assert "ctxd.daemon.engine" in graph["ctxd.daemon.dispatch"]
    assert len(modules) > 40, sorted(modules)
    assert ctxd.__file__


def test_no_import_cycle() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, set(modules)) for name, path in modules.items()}
    cycles = _cycles(graph)
    assert not cycles, "import cycles inside ctxd:\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def test_a_cycle_is_found() -> None:
    # the checker itself must be able to fail
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
