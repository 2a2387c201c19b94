"""Handlers register themselves against the method they serve, checked at import."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ctxd.daemon import dispatch  # noqa: F401  (imports every handler module)
from ctxd.protocol.handlers import HANDLERS, HandlerTable
from ctxd.protocol.methods import CONTEXT_STATUS, METHODS, SESSION_CREATE


def _run(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)


def test_every_method_has_exactly_one_handler() -> None:
    assert {h.method.name for h in HANDLERS} == set(METHODS)
    assert len(HANDLERS) == len(METHODS)
    assert HANDLERS["session/create"].function.__qualname__ == "Engine.create_session"
    assert HANDLERS["context/clear"].owner is None  # a function given the engine
    assert HANDLERS["initialize"].connection


def test_a_method_without_a_handler_fails_at_import(tmp_path: Path) -> None:
    # a method declared in the table that nothing serves: the daemon does not import
    done = _run("""
        import msgspec
        from ctxd.protocol import methods, types
        from ctxd.protocol.declare import Method, Params

        class NoHandlerParams(Params):
            pass

        methods.METHODS["demo/unserved"] = Method(
            "demo/unserved", NoHandlerParams, "`{}`.", "Nothing serves it.", (), False,
            returns=types.Empty, client="unserved")
        import ctxd.daemon.dispatch
    """, tmp_path)
    assert done.returncode != 0
    assert "methods without a handler: demo/unserved" in done.stderr


def test_a_handler_without_a_method_fails_at_import(tmp_path: Path) -> None:
    # a handler written against a method object the table does not hold
    (tmp_path / "stray_handler.py").write_text(textwrap.dedent("""
        from ctxd.protocol import types
        from ctxd.protocol.declare import Method, Params
        from ctxd.protocol.handlers import serves

        class StrayParams(Params):
            pass

        STRAY = Method("demo/stray", StrayParams, "`{}`.", "Not in the table.", (), False,
                       returns=types.Empty, client="stray")

        @serves(STRAY)
        def stray() -> dict:
            return {}
    """), encoding="utf-8")
    done = _run("import stray_handler", tmp_path)
    assert done.returncode != 0
    assert "'demo/stray', which is not a method of the protocol table" in done.stderr


def test_a_second_handler_for_a_method_fails_at_import(tmp_path: Path) -> None:
    done = _run("""
        import ctxd.daemon.dispatch
        from ctxd.protocol.handlers import serves
        from ctxd.protocol.methods import SESSION_CREATE

        @serves(SESSION_CREATE)
        def create_session_again(engine) -> dict:
            return {}
    """, tmp_path)
    assert done.returncode != 0
    assert "'session/create' has two handlers: Engine.create_session and " \
        "create_session_again" in done.stderr


def test_a_table_of_its_own_checks_the_same_rules() -> None:
    table = HandlerTable({SESSION_CREATE.name: SESSION_CREATE})
    with pytest.raises(LookupError, match="methods without a handler: session/create"):
        table.check_complete()
    with pytest.raises(LookupError, match="not a method of the protocol table"):
        table.serves(CONTEXT_STATUS)
    table.serves(SESSION_CREATE)(lambda engine: {})
    table.check_complete()
    with pytest.raises(ValueError, match="two handlers"):
        table.serves(SESSION_CREATE)(lambda engine: {})
