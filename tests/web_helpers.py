"""Shared by the web page's browser tests: Debian's headless Chromium via Playwright, a
real daemon process, and the ways a test logs a page in."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import DaemonProcess, agent_turn
from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
# Playwright polls for each expected state until this deadline, so a generous one costs
# nothing when the page is quick and keeps a loaded 2-core machine from failing the test
WAIT_MS = 60_000
expect.set_options(timeout=WAIT_MS)

@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    # DEBUG: the log must stay free of the page's secrets even at its most talkative
    d = DaemonProcess(tmp_path_factory.mktemp("web"), env={
        "CTXD_LOG_LEVEL": "DEBUG", "CTXD_MAX_ACTIVE_MESSAGES": "100000"}).start()
    yield d
    d.stop()

@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert os.path.exists(CHROMIUM), "Debian's chromium is required: bash .ci/run installs it"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()

@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    ctx.set_default_timeout(WAIT_MS)
    yield ctx
    ctx.close()

@pytest.fixture
def client(daemon: DaemonProcess) -> Iterator[Any]:
    with daemon.client("jsonrpc") as c:
        yield c

def ui_url(daemon: DaemonProcess, session: str | None = None) -> str:
    """What `ctxd ui --no-browser` prints."""
    cmd = [sys.executable, "-m", "ctxd.clients.cli", "ui", "--no-browser",
           "--connection-file", str(daemon.connection_file)] + ([session] if session else [])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=daemon.env)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()

def watch_errors(page: Page) -> list[str]:
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    return errors

def open_session(context: BrowserContext, daemon: DaemonProcess, sid: str) -> Page:
    page = context.new_page()
    page.goto(ui_url(daemon, sid))
    page.wait_for_selector("body[data-ready=true]")
    return page

def new_session(client: Any, title: str, turns: int = 0) -> str:
    sid = client.call("session/create", {"title": title})["sessionId"]
    client.call("messages/append", {"sessionId": sid, "messages": [
        {"role": "system", "content": "You are a careful coding agent."}]})
    for i in range(turns):
        client.call("messages/append", {"sessionId": sid, "messages": agent_turn(i)})
    return sid

def fmt(n: int) -> str:
    return f"{n:,}"
