"""The web page in a real headless Chromium (Debian's), against a real daemon process.

Playwright drives /usr/bin/chromium (never a downloaded browser). Without Chromium or
Playwright these tests fail: the page is a feature, not an optional extra. Access and
the HTTP side are in test_web_access.py.
"""

# pytest fixtures come from web_helpers by import; test parameters name them again
# ruff: noqa: F811

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import DaemonProcess, agent_turn, wait_for
from playwright.sync_api import Browser, BrowserContext, Page, expect
from web_helpers import (  # noqa: F401  (fixtures)
    WAIT_MS,
    browser,
    client,
    context,
    daemon,
    fmt,
    new_session,
    open_session,
    ui_url,
    watch_errors,
)

from ctxd.protocol.errors import CtxdError, ErrorCode

# the README's picture: written only on purpose (CTXD_UPDATE_SCREENSHOT=1), so running
# the tests leaves a clean checkout clean
README_SCREENSHOT = Path(__file__).resolve().parent.parent / "docs" / "ui.png"
UPDATE_SCREENSHOT = os.environ.get("CTXD_UPDATE_SCREENSHOT") == "1"


def numbers(page: Page) -> dict[str, str]:
    return {k: page.inner_text(f"#n-{k}") for k in
            ("active", "tokens", "compactions", "archive", "approvals", "run", "paused")}


def test_page_shows_the_numbers_and_updates_live(daemon: DaemonProcess, client: Any,
                                                 context: BrowserContext) -> None:
    sid = new_session(client, "numbers", turns=5)
    page = open_session(context, daemon, sid)
    errors = watch_errors(page)
    # the one-time login left the address bar; the page holds a key of its own in its
    # origin's localStorage, and no cookie (browsers send those to every port)
    assert "login" not in page.url and page.url.endswith(f"/s/{sid}")
    assert context.cookies() == [] and page.evaluate("document.cookie") == ""
    key = page.evaluate("localStorage.getItem('ctxd.pageKey')")
    assert isinstance(key, str) and len(key) >= 40 and key not in daemon.info()["token"]
    st = client.call("context/status", {"sessionId": sid})
    got = numbers(page)
    assert got["active"] == fmt(st["activeMessages"])
    assert got["tokens"] == fmt(st["estimatedTokens"])
    assert got["archive"] == fmt(st["archiveMessages"]) == "21"
    assert got["compactions"] == "0" and got["approvals"] == "0" and got["run"] == "idle"
    assert page.locator("#transcript .msg").count() == 21
    # a Python client appends: the page shows the message and the new numbers
    client.call("messages/append", {"sessionId": sid, "messages": [
        {"role": "user", "content": "live from python 🐍 实时"}]})
    page.wait_for_selector("#transcript .msg.role-user >> text=live from python 🐍 实时")
    expect(page.locator("#n-archive")).to_have_text("22")
    st = client.call("context/status", {"sessionId": sid})
    expect(page.locator("#n-tokens")).to_have_text(fmt(st["estimatedTokens"]))
    # and the page appends: the Python client reads it from the archive
    page.fill("#message-input", "from the page")
    page.click("#send")
    page.wait_for_selector("#transcript .msg >> text=from the page")
    last = client.call("archive/read", {"sessionId": sid, "afterId": 0})["messages"][-1]
    assert (last["role"], last["content"]) == ("user", "from the page")
    assert errors == []


def test_compact_from_the_page_shrinks_numbers_and_pointers_jump(
        daemon: DaemonProcess, client: Any, context: BrowserContext) -> None:
    sid = new_session(client, "compaction demo: refactor the handlers", turns=60)
    client.call("context/pins/add", {"sessionId": sid, "text": "Never touch the production DB."})
    page = open_session(context, daemon, sid)
    errors = watch_errors(page)
    before = client.call("context/status", {"sessionId": sid})
    assert page.inner_text("#n-active") == fmt(before["activeMessages"])
    # the summarizer in use, with no failure to show
    assert page.inner_text("#n-summarizer") == before["summarizer"] == "builtin"
    # the newest page only: the start of the session is not in the DOM yet
    assert page.locator("#transcript .msg[data-id]").count() <= 100
    page.fill("#compact-instructions", "keep every file path")
    page.click("#compact-button")
    page.wait_for_selector("#compact-result.ok")
    after = client.call("context/status", {"sessionId": sid})
    assert after["activeMessages"] < before["activeMessages"]
    assert after["compactionCount"] == 1
    expect(page.locator("#n-active")).to_have_text(fmt(after["activeMessages"]))
    assert page.inner_text("#n-tokens") == fmt(after["estimatedTokens"])
    assert page.inner_text("#n-compactions") == "1"
    assert "Effective" in page.inner_text("#compact-result")
    # the summary, by section, with pointers; the oldest pointer is paged in on click
    page.wait_for_selector("#summary-box .pointer")
    ids = [int(x) for x in page.eval_on_selector_all(
        "#summary-box .pointer", "els => els.map(e => e.dataset.id)")]
    first = min(ids)
    assert page.locator(f"#transcript .msg[data-id='{first}']").count() == 0
    page.locator(f"#summary-box .pointer[data-id='{first}']").first.click()
    target = page.locator(f"#transcript .msg[data-id='{first}']")
    target.wait_for()
    assert "target" in (target.get_attribute("class") or "")
    assert "archived-only" in (target.get_attribute("class") or "")
    assert target.is_visible() and _in_viewport(page, f"#transcript .msg[data-id='{first}']")
    want = next(m for m in client.call("archive/read", {"sessionId": sid, "afterId": first - 1,
                                                        "limit": 1})["messages"])
    assert want["id"] == first
    assert str(want["content"]).split("\n")[0] in target.inner_text()
    # the rest of the panel: pins, tail, history with its chart, explain
    assert "Never touch the production DB." in page.inner_text("#pins-box")
    ids = client.call("context/get", {"sessionId": sid})["messageIds"]
    tail = ids[ids.index(None) + 1:]
    assert page.locator("#tail-box .tail-row").count() == len(tail)
    page.wait_for_selector("#history-box table.history tbody tr")
    assert page.locator("#history-chart path.line.active").count() == 1
    assert "manual" in page.inner_text("#history-box")
    page.check("#explain-toggle")
    page.wait_for_selector("#summary-box .explain-src")
    assert errors == []


def test_screenshot_of_a_working_session(daemon: DaemonProcess, client: Any,
                                         context: BrowserContext, tmp_path: Path) -> None:
    """The README's picture: a session mid-run, compacted once, a tool call awaiting approval.
    `CTXD_UPDATE_SCREENSHOT=1 pytest tests/test_web_page.py -k screenshot` updates
    docs/ui.png; otherwise the picture goes to a temporary directory."""
    shot = README_SCREENSHOT if UPDATE_SCREENSHOT else tmp_path / "ui.png"
    sid = client.call("session/create", {"title": "Refactor the payment service (支付服务)"})[
        "sessionId"]
    client.call("context/pins/add", {"sessionId": sid,
                                     "text": "Never run migrations against production."})
    client.call("messages/append", {"sessionId": sid, "messages": [
        {"role": "system", "content": "You are a careful coding agent working in ~/src/pay."}]})
    for i in range(12):
        client.call("messages/append", {"sessionId": sid, "messages": agent_turn(i)})
    client.call("context/compact", {"sessionId": sid, "force": True})
    run = client.call("run/start", {"sessionId": sid})["runId"]
    client.call("messages/append", {"sessionId": sid, "runId": run, "messages": [
        {"role": "user", "content": "把支付服务的重试逻辑改成指数退避，然后跑一下测试 ✅"},
        {"role": "assistant", "content": "I'll read the retry helper first.", "tool_calls": [
            {"id": "call_read", "type": "function", "function": {
                "name": "read_file", "arguments": json.dumps({"path": "pay/retry.py"})}}]},
        {"role": "tool", "tool_call_id": "call_read",
         "content": "def retry(fn, attempts=3):\n    for i in range(attempts):\n"
                    "        try:\n            return fn()\n        except IOError:\n"
                    "            time.sleep(1)\n"},
        {"role": "assistant", "content": "Switching to exponential backoff (1 s, 2 s, 4 s) "
         "and running the test suite.", "tool_calls": [
            {"id": "call_test", "type": "function", "function": {
                "name": "run_shell", "arguments": json.dumps(
                    {"command": "pytest -q tests/test_retry.py", "cwd": "~/src/pay"})}}]}]})
    client.call("approval/request", {"sessionId": sid, "runId": run, "toolCallId": "call_test",
                                     "toolName": "run_shell",
                                     "arguments": {"command": "pytest -q tests/test_retry.py",
                                                   "cwd": "~/src/pay"}})
    page = open_session(context, daemon, sid)
    page.locator(".approval").wait_for()
    page.wait_for_selector("#history-box table.history tbody tr")
    page.evaluate("() => window.ctxd.transcript.scrollToBottom()")
    page.wait_for_timeout(200)
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 50_000
    assert page.is_disabled("#compact-button")
    client.call("run/finish", {"runId": run, "outcome": "cancelled"})


def _in_viewport(page: Page, selector: str) -> bool:
    return bool(page.eval_on_selector(selector, """el => {
        const r = el.getBoundingClientRect();
        const s = document.querySelector('#transcript-scroller').getBoundingClientRect();
        return r.bottom > s.top && r.top < s.bottom; }"""))


def test_pending_approval_blocks_two_tabs_and_the_first_answer_wins(
        daemon: DaemonProcess, client: Any, context: BrowserContext) -> None:
    sid = new_session(client, "approvals", turns=2)
    watcher = daemon.client("zmq")
    stream = watcher.notifications()
    watcher.subscribe(sid)
    run = client.call("run/start", {"sessionId": sid})["runId"]
    client.call("messages/append", {"sessionId": sid, "runId": run, "messages": [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_rm", "type": "function", "function": {
                "name": "delete_files",
                "arguments": json.dumps({"glob": "build/*", "说明": "清理"})}}]}]})
    tab1 = open_session(context, daemon, sid)
    tab2 = context.new_page()
    tab2.goto(tab1.url)
    tab2.wait_for_selector("body[data-ready=true]")
    approval = client.call("approval/request", {
        "sessionId": sid, "runId": run, "toolCallId": "call_rm", "toolName": "delete_files",
        "arguments": {"glob": "build/*"}})
    for tab in (tab1, tab2):
        card = tab.locator(f".approval[data-approval-id='{approval['approvalId']}']")
        card.wait_for()
        assert "delete_files" in card.inner_text() and "build/*" in card.inner_text()
        assert tab.is_disabled("#compact-button") and tab.is_disabled("#message-input")
        assert tab.is_disabled("#send")
        assert "awaits approval" in tab.inner_text("#composer-reason")
        assert "awaits approval" in tab.inner_text("#compact-reason")
        assert tab.inner_text("#n-approvals") == "1"
    tab1.fill(".approval .reason-input", "only the build dir")
    tab1.click(".approval button.approve")
    for tab in (tab2, tab1):
        tab.wait_for_selector(".approval", state="detached")
        expect(tab.locator("#message-input")).to_be_enabled()
        assert not tab.is_disabled("#compact-button")
        assert tab.inner_text("#n-approvals") == "0"
        assert tab.inner_text("#composer-reason") == ""
    got = wait_for(stream, "approval/didResolve")
    assert got["approval"]["status"] == "approved"
    resolved = client.call("approval/list", {"sessionId": sid})["approvals"]
    assert [(a["status"], a["reason"]) for a in resolved] == [("approved", "only the build dir")]
    # a second answer loses: the first decision stands
    with pytest.raises(CtxdError) as err:
        client.call("approval/resolve", {"approvalId": approval["approvalId"],
                                         "decision": "denied"})
    assert err.value.code == ErrorCode.CONFLICT
    assert tab2.locator(".approval").count() == 0
    # the next call is denied from the other tab, with a reason the agent gets
    client.call("messages/append", {"sessionId": sid, "runId": run, "messages": [
        {"role": "tool", "tool_call_id": "call_rm", "content": "removed 3 files"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_push", "type": "function", "function": {
                "name": "git_push", "arguments": json.dumps({"force": True})}}]}]})
    second = client.call("approval/request", {
        "sessionId": sid, "runId": run, "toolCallId": "call_push", "toolName": "git_push",
        "arguments": {"force": True}})["approvalId"]
    tab2.locator(f".approval[data-approval-id='{second}']").wait_for()
    tab2.fill(".approval .reason-input", "no force pushes: open a PR")
    tab2.click(".approval button.deny")
    tab1.locator(".approval").wait_for(state="detached")
    got = wait_for(stream, "approval/didResolve",
                   where=lambda p: p["approval"]["approvalId"] == second)
    assert (got["approval"]["status"], got["approval"]["reason"]) == (
        "denied", "no force pushes: open a PR")
    expect(tab1.locator("#message-input")).to_be_enabled()
    stream.close()
    watcher.close()


def test_chinese_search_jumps_to_the_message(daemon: DaemonProcess, client: Any,
                                             context: BrowserContext) -> None:
    sid = new_session(client, "搜索 search")
    hit_id = client.call("messages/append", {"sessionId": sid, "messages": [
        {"role": "user", "content": "下周我们需要把数据库迁移到新的服务器上。"}]})["messageIds"][0]
    for i in range(40):
        client.call("messages/append", {"sessionId": sid, "messages": agent_turn(i)})
    page = open_session(context, daemon, sid)
    errors = watch_errors(page)
    assert page.locator(f"#transcript .msg[data-id='{hit_id}']").count() == 0
    page.fill("#search-input", "迁移")
    page.press("#search-input", "Enter")
    hit = page.locator(f"#search-results .hit[data-message-id='{hit_id}']")
    hit.wait_for()
    assert hit.locator("mark").first.inner_text() == "迁移"
    assert "archived only" in hit.inner_text() or "in context" in hit.inner_text()
    hit.click()
    target = page.locator(f"#transcript .msg[data-id='{hit_id}']")
    target.wait_for()
    assert "target" in (target.get_attribute("class") or "")
    assert _in_viewport(page, f"#transcript .msg[data-id='{hit_id}']")
    assert "数据库迁移" in target.inner_text()
    # from another session's page, "all sessions" opens the hit's session at the message
    other = new_session(client, "elsewhere")
    page.goto(page.url.split("/s/")[0] + f"/s/{other}")
    page.wait_for_selector("body[data-ready=true]")
    page.select_option("#search-scope", "all")
    page.fill("#search-input", "迁移")
    page.press("#search-input", "Enter")
    page.locator(f"#search-results .hit[data-message-id='{hit_id}']").click()
    page.wait_for_url(re.compile(f"/s/{sid}#m{hit_id}$"))
    page.locator(f"#transcript .msg.target[data-id='{hit_id}']").wait_for()
    assert errors == []


def test_markup_in_content_stays_text(daemon: DaemonProcess, client: Any,
                                      context: BrowserContext) -> None:
    evil = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'
    marked = "zebracorn " + evil
    sid = client.call("session/create", {"title": "t " + evil})["sessionId"]
    client.call("context/pins/add", {"sessionId": sid, "text": "pin " + evil})
    run = client.call("run/start", {"sessionId": sid})["runId"]
    client.call("messages/append", {"sessionId": sid, "runId": run, "messages": [
        {"role": "user", "content": marked},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "x" + evil[:20], "arguments": json.dumps({"html": evil})}}]},
        {"role": "tool", "tool_call_id": "c1", "content": evil * 40_000}]})  # ~3 MB
    client.call("run/finish", {"runId": run, "outcome": "completed"})
    client.call("context/compact", {"sessionId": sid, "force": True})
    page = open_session(context, daemon, sid)
    errors = watch_errors(page)
    page.goto(ui_url(daemon))  # the list shows the title
    page.wait_for_selector(f"#sessions tr[data-session-id='{sid}']")
    page.goto(ui_url(daemon, sid))
    page.wait_for_selector("body[data-ready=true]")
    page.fill("#search-input", "zebracorn")
    page.press("#search-input", "Enter")
    page.wait_for_selector("#search-results .hit")
    page.wait_for_timeout(300)
    assert page.evaluate("window.__pwned") is None
    assert page.locator("main img, #search-results img, main script").count() == 0
    user = page.locator("#transcript .msg.role-user .body")
    assert user.inner_text() == marked
    assert "<img src=x" in page.inner_text("#search-results .hit .snippet")
    assert evil in page.inner_text("#pins-box")
    assert evil in page.inner_text("#crumb")
    # the huge tool output is cut in view, with a button for the rest
    tool = page.locator("#transcript .msg.role-tool")
    assert len(tool.inner_text()) < 5000
    tool.locator("button.expand").click()
    assert len(tool.inner_text()) > len(evil) * 40_000
    assert page.evaluate("window.__pwned") is None
    assert errors == []


def test_lost_connection_reconnects_and_catches_up(daemon: DaemonProcess, client: Any,
                                                   context: BrowserContext) -> None:
    sid = new_session(client, "reconnect", turns=2)
    page = open_session(context, daemon, sid)
    errors = watch_errors(page)
    # drop the page's WebSocket and hold the reconnect while another client works
    page.evaluate("() => { window.ctxd.rpc.stopped = true; window.ctxd.rpc.ws.close(); }")
    expect(page.locator("#conn")).not_to_have_text("● live")
    ids = client.call("messages/append", {"sessionId": sid, "messages": [
        {"role": "user", "content": f"missed while away {i}"} for i in range(3)]})["messageIds"]
    run = client.call("run/start", {"sessionId": sid})["runId"]
    page.wait_for_timeout(300)
    assert page.locator("#transcript .msg >> text=missed while away").count() == 0
    assert page.is_disabled("#send")  # nothing is sent into the void
    page.evaluate("() => { window.ctxd.rpc.stopped = false; window.ctxd.rpc.connect(); }")
    expect(page.locator("#conn")).to_have_text("● live")
    for i, mid in enumerate(ids):
        page.locator(f"#transcript .msg[data-id='{mid}'] >> text=missed while away {i}").wait_for()
    st = client.call("context/status", {"sessionId": sid})
    expect(page.locator("#n-archive")).to_have_text(fmt(st["archiveMessages"]))
    expect(page.locator("#n-run")).to_have_text("running")
    # and live events flow again on the new connection
    client.call("run/finish", {"runId": run, "outcome": "completed"})
    expect(page.locator("#n-run")).to_have_text("idle")
    assert errors == []


def test_session_list_filters_and_opens_a_session(daemon: DaemonProcess, client: Any,
                                                  context: BrowserContext) -> None:
    a = new_session(client, "list: alpha 数据库", turns=1)
    b = new_session(client, "list: beta")
    page = context.new_page()
    page.goto(ui_url(daemon))
    row_a = page.locator(f"#sessions tr[data-session-id='{a}']")
    row_b = page.locator(f"#sessions tr[data-session-id='{b}']")
    row_a.wait_for()
    assert "alpha 数据库" in row_a.inner_text()
    assert row_a.locator("td").nth(2).inner_text() == "5"  # archived messages
    # newest first
    order = page.eval_on_selector_all("#sessions tr[data-session-id]",
                                      "rows => rows.map(r => r.dataset.sessionId)")
    assert order.index(b) < order.index(a)
    page.fill("#session-filter", "数据库")
    row_b.wait_for(state="detached")
    assert row_a.is_visible()
    # a session created elsewhere shows up without a reload
    c = new_session(client, "list: 数据库 gamma")
    page.locator(f"#sessions tr[data-session-id='{c}']").wait_for()
    row_a.locator("a").click()
    page.wait_for_url(re.compile(f"/s/{a}$"))
    page.wait_for_selector("body[data-ready=true]")
    assert page.inner_text("#crumb") == "list: alpha 数据库"
    page.go_back()
    row_a.wait_for()
    assert page.title() == "Sessions · ctxd"


def test_compaction_progress_shows_in_every_tab(tmp_path: Path, browser: Browser) -> None:
    from fake_llm import FakeLLM

    with FakeLLM("slow", slow_seconds=2.0) as llm:
        config = tmp_path / "ctxd.toml"
        config.write_text(f'summarizer = "openai"\n[openai]\nbase_url = "{llm.base_url}"\n'
                          'model = "fake-model"\ntimeout_seconds = 20\n')
        d = DaemonProcess(tmp_path, "--config", str(config),
                          env={"CTXD_MAX_ACTIVE_MESSAGES": "100000"}).start()
        ctx = browser.new_context(viewport={"width": 1400, "height": 900})
        ctx.set_default_timeout(WAIT_MS)
        try:
            with d.client("jsonrpc") as client:
                sid = new_session(client, "slow summarizer", turns=15)
                tab1 = open_session(ctx, d, sid)
                tab2 = ctx.new_page()
                tab2.goto(tab1.url)
                tab2.wait_for_selector("body[data-ready=true]")
                tab1.fill("#compact-instructions", "keep the file names")
                tab1.click("#compact-button")
                for tab in (tab1, tab2):  # the other tab learns it from $/progress
                    expect(tab.locator("#compact-progress")).to_be_visible()
                    expect(tab.locator("#compact-button")).to_be_disabled()
                    expect(tab.locator("#compact-reason")).to_have_text(
                        "A compaction is running.")
                expect(tab1.locator("#compact-result")).to_have_class("ok", timeout=2 * WAIT_MS)
                assert "Effective" in tab1.inner_text("#compact-result")
                # the other tab only saw the progress: it says how it ended, not "Compacting"
                expect(tab2.locator("#compact-result")).to_have_text(
                    "Compaction finished: effective.")
                for tab in (tab1, tab2):
                    expect(tab.locator("#compact-progress")).to_be_hidden()
                    expect(tab.locator("#compact-button")).to_be_enabled()
                    expect(tab.locator("#n-compactions")).to_have_text("1")
                assert "keep the file names" in llm.requests[-1].prompt
                # nothing that can move: not effective, and the page says why
                tiny = client.call("session/create", {"title": "tiny"})["sessionId"]
                client.call("messages/append", {"sessionId": tiny, "messages": [
                    {"role": "user", "content": "hi"}]})
                tab1.goto(tab1.url.replace(sid, tiny))
                tab1.wait_for_selector("body[data-ready=true]")
                tab1.click("#compact-button")
                expect(tab1.locator("#compact-result")).to_have_class("no", timeout=2 * WAIT_MS)
                result = tab1.inner_text("#compact-result")
                assert "Not effective" in result and "nothing can leave" in result
        finally:
            ctx.close()
            d.stop()


def test_a_long_tail_keeps_its_rows_readable(daemon: DaemonProcess, client: Any,
                                             context: BrowserContext) -> None:
    sid = new_session(client, "long tail")
    client.call("messages/append", {"sessionId": sid, "messages": [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"tail line {i}"}
        for i in range(40)]})
    page = open_session(context, daemon, sid)
    expect(page.locator("#tail-box .tail-row")).to_have_count(40)
    # each row as tall as its text, below the one before it; the list scrolls instead
    got = page.eval_on_selector("#tail-box .tail-list", """list => {
      const rows = [...list.querySelectorAll('.tail-row')].map((r) => {
        const box = r.getBoundingClientRect();
        const text = r.querySelector('.preview').getBoundingClientRect();
        return {top: box.top, bottom: box.bottom, height: box.height, text: text.height};
      });
      return {rows, scrolls: list.scrollHeight > list.clientHeight + 1};
    }""")
    rows = got["rows"]
    assert got["scrolls"]
    for row in rows:
        assert row["text"] > 0 and row["height"] >= row["text"], row
    for above, below in zip(rows, rows[1:], strict=False):
        assert below["top"] >= above["bottom"] - 0.5, (above, below)


def test_reading_back_keeps_a_bounded_window(daemon: DaemonProcess, client: Any,
                                             context: BrowserContext) -> None:
    sid = new_session(client, "long")
    batch = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"line {i}"}
             for i in range(900)]
    ids = client.call("messages/append", {"sessionId": sid, "messages": batch})["messageIds"]
    page = open_session(context, daemon, sid)
    errors = watch_errors(page)
    start = client.call("archive/read", {"sessionId": sid, "limit": 1})["messages"][0]["id"]
    first = f"#transcript .msg[data-id='{start}']"
    deadline = time.monotonic() + WAIT_MS / 1000
    while time.monotonic() < deadline:  # each scroll to the top pages 100 older messages in
        if page.locator(first).count():
            break
        page.evaluate("() => { document.querySelector('#transcript-scroller').scrollTop = 0; }")
        page.wait_for_timeout(150)
    assert page.locator(first).count() == 1
    expect(page.locator("#transcript")).to_have_attribute("data-start", "true")
    # the newest messages left the DOM: at most 600 are kept
    assert page.locator("#transcript .msg").count() <= 600
    assert page.locator(f"#transcript .msg[data-id='{ids[-1]}']").count() == 0
    page.click("#new-below")  # "Newest ↓" brings the newest page back
    page.locator(f"#transcript .msg[data-id='{ids[-1]}']").wait_for()
    assert page.locator("#transcript .msg").count() <= 600
    assert errors == []


def test_pins_from_the_page(daemon: DaemonProcess, client: Any, context: BrowserContext) -> None:
    sid = new_session(client, "pins", turns=1)
    page = open_session(context, daemon, sid)
    tokens = page.inner_text("#n-tokens")
    page.fill("#pin-input", "Always answer in 中文 🙂")
    page.press("#pin-input", "Enter")
    page.locator("#pins-box .pin >> text=Always answer in 中文 🙂").wait_for()
    pins = client.call("context/pins/list", {"sessionId": sid})["pins"]
    assert [p["text"] for p in pins] == ["Always answer in 中文 🙂"]
    expect(page.locator("#n-tokens")).not_to_have_text(tokens)  # the pin counts in context
    page.click(f"#pins-box .pin[data-pin-id='{pins[0]['pinId']}'] button")
    page.locator("#pins-box .pin").wait_for(state="detached")
    assert client.call("context/pins/list", {"sessionId": sid})["pins"] == []
    expect(page.locator("#n-tokens")).to_have_text(tokens)


def test_a_page_that_fell_behind_re_reads_the_session(
    daemon: DaemonProcess, client: Any, context: BrowserContext
) -> None:
    sid = new_session(client, "fell behind", turns=1)
    page = open_session(context, daemon, sid)
    errors = watch_errors(page)
    assert page.locator("#history-box table.history tbody tr").count() == 0
    # freeze the page's script: Chromium then stops reading its WebSocket, and the
    # daemon's output for it piles up until the daemon sheds its events
    cdp = context.new_cdp_session(page)
    cdp.send("Debugger.enable")
    cdp.send("Debugger.pause")
    run = client.call("run/start", {"sessionId": sid})["runId"]
    args = {"path": "README.zh.md", "content": "把配置文件里的数据库地址改成只读副本。" * 110}
    reason = "这个改动会影响生产环境的连接池，先在预发布环境验证。" * 150
    # approval events are the largest (about 22 KB a round here); at most 32 MiB of them
    shed = False
    for n in range(1500):
        call = {"id": f"frozen_{n}", "type": "function",
                "function": {"name": "write_file", "arguments": '{"path": "README.zh.md"}'}}
        client.call("messages/append", {"sessionId": sid, "runId": run, "messages": [
            {"role": "assistant", "content": "修改说明文件。", "tool_calls": [call]}]})
        approval = client.call("approval/request", {
            "sessionId": sid, "runId": run, "toolCallId": f"frozen_{n}", "toolName": "write_file",
            "arguments": args})
        client.call("approval/resolve", {
            "approvalId": approval["approvalId"], "decision": "denied", "reason": reason})
        client.call("messages/append", {"sessionId": sid, "runId": run, "messages": [
            {"role": "tool", "tool_call_id": call["id"], "content": "用户拒绝了这次修改。"}]})
        if n % 50 == 49 and "dropping its events" in daemon.log_path.read_text(errors="replace"):
            shed = True
            break
    assert shed, "the frozen page's events were never shed"
    # what happens while its events are shed reaches the page only by re-reading: the
    # events queued before the gap make it re-read the transcript and the context, but
    # only the notice makes it re-read the compaction history
    client.call("run/finish", {"runId": run, "outcome": "completed"})
    mid = client.call("messages/append", {"sessionId": sid, "messages": [
        {"role": "user", "content": "said while the page was frozen"}]})["messageIds"][0]
    client.call("context/compact", {"sessionId": sid, "force": True})
    cdp.send("Debugger.resume")
    page.wait_for_selector("#history-box table.history tbody tr")
    page.locator(f"#transcript .msg[data-id='{mid}'] >> text=said while the page was frozen"
                 ).wait_for()
    st = client.call("context/status", {"sessionId": sid})
    expect(page.locator("#n-archive")).to_have_text(fmt(st["archiveMessages"]))
    expect(page.locator("#n-run")).to_have_text("idle")
    assert errors == []
