"""The web page's calls (`daemon/web/methods.js`), generated from the protocol's schema:
current, and in a real Chromium against a real daemon, sending what the table declares
and refusing in the page what it does not."""

# pytest fixtures come from web_helpers by import; test parameters name them again
# ruff: noqa: F811

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from helpers import DaemonProcess
from playwright.sync_api import BrowserContext
from web_helpers import (  # noqa: F401  (fixtures)
    browser,
    client,
    context,
    daemon,
    new_session,
    open_session,
    watch_errors,
)

from ctxd.protocol import gen_js
from ctxd.protocol.methods import METHODS

WEB = Path(gen_js.__file__).resolve().parent.parent / "daemon" / "web"


def test_methods_js_is_current() -> None:
    assert gen_js.main(["--check"]) == 0, "run python -m ctxd.protocol.gen_js"


def test_check_detects_a_stale_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "methods.js"
    assert gen_js.main(["--check", "--output", str(out)]) == 1  # missing
    assert gen_js.main(["--output", str(out)]) == 0
    assert gen_js.main(["--check", "--output", str(out)]) == 0
    out.write_text(out.read_text().replace("sessionGet", "sessionFetch"))
    assert gen_js.main(["--check", "--output", str(out)]) == 1
    assert "stale" in capsys.readouterr().err


def test_every_method_has_a_page_call_and_the_page_sends_no_raw_names() -> None:
    text = (WEB / "methods.js").read_text(encoding="utf-8")
    for name in METHODS:
        assert f"  {gen_js.js_name(name)}(" in text, name
    # the page's own modules call through methods.js, never `rpc.call("a/b", ...)`
    for js in WEB.glob("*.js"):
        if js.name in ("methods.js", "rpc.js"):
            continue
        assert not re.search(r"\.call\(\s*\"", js.read_text(encoding="utf-8")), js.name


def test_the_page_calls_send_declared_params_and_refuse_others(
        daemon: DaemonProcess, client: Any, context: BrowserContext) -> None:
    sid = new_session(client, "page calls", turns=3)
    page = open_session(context, daemon, sid)
    errors = watch_errors(page)
    got = page.evaluate("""async (sid) => {
        const api = window.ctxd.api;
        const refusal = async (f) => { try { await f(); return null; }
                                        catch (e) { return `${e.name}: ${e.message}`; } };
        return {
            read: await api.archiveRead(sid, { limit: 2 }),
            status: await api.contextStatus(sid),
            typo: await refusal(() => api.archiveRead(sid, { limt: 2 })),
            missing: await refusal(() => api.sessionGet()),
            daemonSays: await refusal(() => api.archiveRead(sid, { limit: 0 })),
        };
    }""", sid)
    assert len(got["read"]["messages"]) == 2
    assert got["status"]["sessionId"] == sid
    assert got["status"]["archiveMessages"] == client.call(
        "context/status", {"sessionId": sid})["archiveMessages"]
    assert got["typo"].startswith("TypeError: archive/read: unknown parameter 'limt'")
    assert "beforeId" in got["typo"]  # the accepted ones are named
    assert got["missing"] == "TypeError: session/get: missing required parameter 'sessionId'"
    # a declared param out of range is the daemon's to refuse, with its own message
    assert got["daemonSays"] is not None and "'limit'" in got["daemonSays"]
    assert not [e for e in errors if "methods.js" in e]
