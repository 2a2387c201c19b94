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
    assert "ctxd.daemon.stores.sqlite.store" in graph["ctxd.daemon.engine.core"]
    assert "ctxd.daemon.stores.sqlite.archive_fts" in graph["ctxd.daemon.stores.sqlite.store"]
    assert "ctxd.protocol.errors" in graph["ctxd.daemon.engine.core"]
    assert "ctxd.daemon.engine.core" in graph["ctxd.daemon.engine"]
    assert "ctxd.daemon.engine" in graph["ctxd.daemon.dispatch"]
    # and protocol/'s own imports, which the contract check walks
    assert "ctxd.protocol.files" in graph["ctxd.protocol.connection"]
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


# The store: the interface in daemon/stores/base.py, the SQL both engines run in
# daemon/stores/sql/, SQLite in daemon/stores/sqlite/ and PostgreSQL in
# daemon/stores/postgres/. It sits below the engine, so it never reaches the engine;
# each engine's folder builds on the shared SQL, never on the other engine's, and the
# shared SQL on neither.
STORE_MODULES = ("ctxd.daemon.stores",)  # the package and every module in it
ENGINE_MODULES = ("ctxd.daemon.engine",)  # the package and every module in it
SHARED_SQL = ("ctxd.daemon.stores.sql",)
SQLITE_STORE = ("ctxd.daemon.stores.sqlite",)
POSTGRES_STORE = ("ctxd.daemon.stores.postgres",)
# the contract: daemon and clients are written against it, never the other way
PROTOCOL_MODULES = ("ctxd.protocol",)
OUTSIDE_PROTOCOL = ("ctxd.daemon", "ctxd.clients")


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _reach(graph: dict[str, set[str]], start: str) -> dict[str, str]:
    """Every module `start` imports, directly or not, with the module that imports it."""
    seen: dict[str, str] = {}
    todo = [start]
    while todo:
        v = todo.pop()
        for w in graph[v]:
            if w not in seen and w != start:
                seen[w] = v
                todo.append(w)
    return seen


def _forbidden(graph: dict[str, set[str]], sources: tuple[str, ...],
               targets: tuple[str, ...]) -> list[str]:
    found = []
    for name in sorted(graph):
        if _under(name, sources):
            for w, via in sorted(_reach(graph, name).items()):
                if _under(w, targets):
                    found.append(f"{name} -> ... {via} -> {w}")
    return found


def test_protocol_imports_no_daemon_and_no_client() -> None:
    # the contract is what daemon and clients are written against, not the other way
    modules = _modules()
    graph = {name: _imports(name, path, set(modules)) for name, path in modules.items()}
    bad = _forbidden(graph, PROTOCOL_MODULES, OUTSIDE_PROTOCOL)
    assert not bad, "protocol/ imports the daemon or a client:\n" + "\n".join(bad)


def test_no_store_imports_the_engine() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, set(modules)) for name, path in modules.items()}
    # the walk sees both stores
    assert any(_under(n, ("ctxd.daemon.stores.postgres",)) for n in graph)
    assert any(_under(n, ("ctxd.daemon.stores.sqlite",)) for n in graph)
    bad = _forbidden(graph, STORE_MODULES, ENGINE_MODULES)
    assert not bad, "a store module reaches the engine:\n" + "\n".join(bad)


def test_neither_engine_imports_the_other() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, set(modules)) for name, path in modules.items()}
    # the walk sees the shared SQL, and both engines build on it
    assert any(_under(n, SHARED_SQL) for n in graph)
    assert any(_under(w, SHARED_SQL) for w in graph["ctxd.daemon.stores.postgres.store"])
    assert any(_under(w, SHARED_SQL) for w in graph["ctxd.daemon.stores.sqlite.store"])
    bad = (
        _forbidden(graph, POSTGRES_STORE, SQLITE_STORE)
        + _forbidden(graph, SQLITE_STORE, POSTGRES_STORE)
        + _forbidden(graph, SHARED_SQL, SQLITE_STORE + POSTGRES_STORE)
    )
    assert not bad, "a store engine's folder reaches the other's:\n" + "\n".join(bad)


def test_the_layer_checks_can_fail() -> None:
    graph = {"ctxd.daemon.stores.postgres.x": {"ctxd.daemon.util"},
             "ctxd.daemon.util": {"ctxd.daemon.engine.core"},
             "ctxd.daemon.engine.core": set()}
    assert _forbidden(graph, STORE_MODULES, ENGINE_MODULES) == [
        "ctxd.daemon.stores.postgres.x -> ... ctxd.daemon.util -> ctxd.daemon.engine.core"]
    # the engine may import the store, and a store other stores: neither is a violation
    fine = {"ctxd.daemon.engine.core": {"ctxd.daemon.stores.sqlite.store"},
            "ctxd.daemon.stores.sqlite.store": {"ctxd.daemon.stores.base"},
            "ctxd.daemon.stores.base": set()}
    assert _forbidden(fine, STORE_MODULES, ENGINE_MODULES) == []
    # one engine's folder reaching the other's through a module outside both
    engines = {"ctxd.daemon.stores.postgres.store": {"ctxd.daemon.stores.sql.archive",
                                                     "ctxd.daemon.messages"},
               "ctxd.daemon.stores.sql.archive": set(),
               "ctxd.daemon.messages": {"ctxd.daemon.stores.sqlite.fts"},
               "ctxd.daemon.stores.sqlite.fts": {"ctxd.daemon.stores.sql.archive"}}
    assert _forbidden(engines, POSTGRES_STORE, SQLITE_STORE) == [
        "ctxd.daemon.stores.postgres.store -> ... ctxd.daemon.messages -> "
        "ctxd.daemon.stores.sqlite.fts"]
    assert _forbidden(engines, SQLITE_STORE, POSTGRES_STORE) == []
    # protocol/ reaching the daemon, directly or through a module between
    contract = {"ctxd.protocol.methods": {"ctxd.protocol.helper"},
                "ctxd.protocol.helper": {"ctxd.daemon.dispatch"},
                "ctxd.protocol.errors": {"ctxd.clients.client"},
                "ctxd.daemon.dispatch": {"ctxd.protocol.methods"},
                "ctxd.clients.client": set()}
    assert _forbidden(contract, PROTOCOL_MODULES, OUTSIDE_PROTOCOL) == [
        "ctxd.protocol.errors -> ... ctxd.protocol.errors -> ctxd.clients.client",
        "ctxd.protocol.helper -> ... ctxd.protocol.helper -> ctxd.daemon.dispatch",
        "ctxd.protocol.methods -> ... ctxd.protocol.helper -> ctxd.daemon.dispatch",
    ]
