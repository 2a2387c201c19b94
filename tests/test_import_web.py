"""An imported transcript on the web page (real Chromium, real daemon): the session list
and the transcript show the transcript's own times, not the time of the import."""

# pytest fixtures come from web_helpers by import; test parameters name them again
# ruff: noqa: F811

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from helpers import DaemonProcess
from playwright.sync_api import BrowserContext
from web_helpers import (  # noqa: F401  (fixtures)
    browser,
    client,
    context,
    daemon,
    open_session,
    ui_url,
)

REAL = Path(__file__).resolve().parent.parent / "bench" / "data" / "transcripts"

# the page's own formatting of a time (daemon/web/dom.js fmtTime), run in the page
FMT_TIME = """sec => new Date(sec * 1000).toLocaleString(undefined, {
  year: "numeric", month: "short", day: "numeric",
  hour: "2-digit", minute: "2-digit", second: "2-digit"})"""


def _unix(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_the_page_shows_an_imported_transcripts_times(daemon: DaemonProcess, client: Any,
                                                      context: BrowserContext,
                                                      tmp_path: Path) -> None:
    src = REAL / "claude-code" / "reliability-coverage-test-fix.jsonl"
    path = tmp_path / "web-times.jsonl"
    shutil.copyfile(src, path)
    lines = [json.loads(ln) for ln in src.read_text(encoding="utf-8").splitlines()]
    last = max(_unix(r["timestamp"]) for r in lines if "timestamp" in r)
    os.utime(path, (last, last))
    r = subprocess.run([sys.executable, "-m", "ctxd.clients.cli", "import", "claude-code",
                        str(path), "--connection-file", str(daemon.connection_file)],
                       env=daemon.env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    sid = "claude-code-web-times"
    session = client.call("session/get", {"sessionId": sid})["session"]
    first = client.call("archive/read", {"sessionId": sid, "limit": 1})["messages"][0]
    expected_first = _unix(lines[first["metadata"]["line"] - 1]["timestamp"])

    page = context.new_page()
    page.goto(ui_url(daemon))
    row = page.locator(f"#sessions tr[data-session-id='{sid}']")
    row.wait_for()
    # the "created" column: the transcript's start (its first message), not today
    assert session["createdAt"] == expected_first
    assert row.locator("td").nth(5).inner_text() == page.evaluate(FMT_TIME, expected_first)
    assert row.locator("td").nth(5).inner_text() != page.evaluate(
        FMT_TIME, datetime.now().timestamp())

    page = open_session(context, daemon, sid)
    meta = page.locator(f"article.msg[data-id='{first['id']}'] .meta")
    meta.wait_for()
    assert meta.inner_text().endswith(page.evaluate(FMT_TIME, expected_first))
