"""One numbering for people and models: the same message shows the same `#N` (its place in
its session) in the summary the model reads, `ctxd explain`, `ctxd search`, `ctxd show`,
the search tool, the protocol's results and the web page; archive ids, where shown, are
written `msg N`. A real daemon process, the CLI as a subprocess, a real Chromium.
"""

# pytest fixtures come from web_helpers by import; test parameters name them again
# ruff: noqa: F811

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from helpers import DaemonProcess, agent_turn
from lsp_harness import Editor
from playwright.sync_api import BrowserContext
from web_helpers import (  # noqa: F401  (fixtures)
    browser,
    client,
    context,
    daemon,
    open_session,
    watch_errors,
)

from ctxd.clients.lsp import documents as docs
from ctxd.daemon.compaction.rules import SUMMARY_HEADER

RULE = "Never run migrations on Mondays; 数据库迁移必须在周五之前完成。"


def cli(d: DaemonProcess, *args: str) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "ctxd.clients.cli", *args,
         "--connection-file", str(d.connection_file)],
        env=d.env, capture_output=True, text=True, timeout=60, encoding="utf-8")
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture(scope="module")
def numbered(daemon: DaemonProcess) -> Iterator[dict[str, Any]]:
    """A compacted session whose archive ids run ahead of its ordinals: another session's
    messages are appended in between."""
    with daemon.client() as client:
        yield _build(client)


def _build(client: Any) -> dict[str, Any]:
    other = client.call("session/create", {"title": "noise"})["sessionId"]
    sid = client.call("session/create", {"title": "numbering 编号"})["sessionId"]
    ids: list[int] = []

    def append(messages: list[dict[str, Any]]) -> list[int]:
        client.call("messages/append", {"sessionId": other, "messages": [
            {"role": "user", "content": "noise from another session"}] * 3})
        got = client.call("messages/append", {"sessionId": sid, "messages": messages})
        ids.extend(got["messageIds"])
        return list(got["messageIds"])

    append([{"role": "system", "content": "You are a careful coding agent."}])
    for i in range(4):
        append(agent_turn(i))
    [rule_id] = append([{"role": "user", "content": RULE}])
    for i in range(4, 30):
        append(agent_turn(i))
    assert client.call("context/compact", {"sessionId": sid, "force": True})["effective"]
    return {"sessionId": sid, "ids": ids, "ruleId": rule_id,
            "ruleOrdinal": ids.index(rule_id) + 1}


def test_summary_explain_search_and_show_agree_on_each_number(
    daemon: DaemonProcess, client: Any, numbered: dict[str, Any]
) -> None:
    sid, rule_id, n = numbered["sessionId"], numbered["ruleId"], numbered["ruleOrdinal"]
    ids: list[int] = numbered["ids"]
    assert rule_id != n  # the two numbers differ, so confusing them would show

    # the summary the model reads cites the rule by its place in the session
    messages = client.call("context/get", {"sessionId": sid})["messages"]
    summary = next(m["content"] for m in messages
                   if m["role"] == "system" and m["content"].startswith(SUMMARY_HEADER))
    [line] = [ln for ln in summary.splitlines() if "Never run migrations" in ln]
    assert line.endswith(f" #{n}")

    # explain: every source's ordinal is its place in the session, the rule's among them
    explained = client.call("context/explain", {"sessionId": sid})
    sources = [s for item in explained["items"] for s in item["sources"]]
    assert sources and all(s["ordinal"] == ids.index(s["id"]) + 1 for s in sources)
    prov = explained["provenance"]
    assert prov["coversFromOrdinal"] == ids.index(prov["coversFrom"]) + 1
    assert prov["coversToOrdinal"] == ids.index(prov["coversTo"]) + 1
    text = cli(daemon, "explain", sid)
    assert f"#{n}  msg {rule_id}  user" in text
    assert f"summarizes #{prov['coversFromOrdinal']}–#{prov['coversToOrdinal']} " \
           f"(msg {prov['coversFrom']}–{prov['coversTo']})" in text

    # search: the protocol's hit, the CLI and the model's search tool
    hits = client.call("archive/search", {"query": "migrations Mondays", "sessionId": sid})
    [hit] = hits["hits"]
    assert (hit["messageId"], hit["ordinal"]) == (rule_id, n)
    assert f"#{n}  msg {rule_id}  {sid}  user" in cli(
        daemon, "search", "migrations Mondays", "--session", sid)
    tool = client.call("tools/call", {"sessionId": sid, "name": "search_past_messages",
                                      "arguments": {"query": "数据库迁移"}})
    assert f"[msg {rule_id} · user · #{n} · " in tool["content"]

    # show: the archive listing gives the rule its #N; a message still in context has
    # the same #N on both sides
    shown = cli(daemon, "show", sid, "--limit", str(len(ids)))
    assert re.search(rf"^#{n}\s+msg {rule_id}\s+ user: Never run migrations", shown, re.M)
    last, last_n = ids[-1], len(ids)
    assert len(re.findall(rf"#{last_n}\s+msg {last}\s", shown)) == 2
    assert f"messages in context: #1, #{ids.index(prov['coversTo']) + 2}–#{last_n} " in shown
    # every numbered line of the listing pairs a message's #N with its own archive id
    pairs = re.findall(r"#(\d+)\s+msg (\d+)\s", shown)
    assert len(pairs) > len(ids)
    assert all(int(o) == ids.index(int(i)) + 1 for o, i in pairs)

    # a page of the archive says where it starts
    page = client.call("archive/read", {"sessionId": sid, "afterId": rule_id - 1, "limit": 3})
    assert page["messages"][0]["id"] == rule_id and page["firstOrdinal"] == n
    older = client.call("archive/read", {"sessionId": sid, "beforeId": ids[-1], "limit": 5})
    assert older["firstOrdinal"] == len(ids) - 5


def test_the_web_page_shows_the_same_numbers(
    daemon: DaemonProcess, client: Any, context: BrowserContext, numbered: dict[str, Any]
) -> None:
    sid, rule_id, n = numbered["sessionId"], numbered["ruleId"], numbered["ruleOrdinal"]
    page = open_session(context, daemon, sid)
    errors = watch_errors(page)
    # the summary's pointer to the rule reads #N and jumps to the message
    pointer = page.locator(f"#summary-box .pointer[data-id='{rule_id}']").first
    pointer.wait_for()
    assert pointer.inner_text() == f"#{n}"
    pointer.click()
    target = page.locator(f"#transcript .msg[data-id='{rule_id}']")
    target.wait_for()
    assert f"#{n} · msg {rule_id} · " in target.locator(".meta").first.inner_text()
    # the newest message in the transcript and in the tail
    last = numbered["ids"][-1]
    tail = page.locator(f"#tail-box .tail-row[data-id='{last}']")
    assert f"#{len(numbered['ids'])} · msg {last}" in tail.inner_text()
    # search on the page
    page.fill("#search-input", "migrations Mondays")
    page.press("#search-input", "Enter")
    hit = page.locator(f"#search-results .hit[data-message-id='{rule_id}']")
    hit.wait_for()
    assert f"#{n} · msg {rule_id} · " in hit.inner_text()
    assert errors == []


def test_the_editor_documents_show_the_same_numbers(
    daemon: DaemonProcess, numbered: dict[str, Any], tmp_path: Path
) -> None:
    sid, rule_id, n = numbered["sessionId"], numbered["ruleId"], numbered["ruleOrdinal"]

    async def go() -> None:
        ed = Editor()
        await ed.start(daemon, tmp_path / "cache")
        try:
            await ed.connected()
            ctx = await ed.content(f"ctxd:/sessions/{sid}/context.md")
            [line] = [ln for ln in ctx.split("\n") if "Never run migrations" in ln]
            assert line.endswith(f" #{n}")
            page = await ed.content(docs.page_of(sid, rule_id).uri())
            assert f"## #{n} · msg {rule_id} user" in page
            last = numbered["ids"][-1]
            assert f"### #{len(numbered['ids'])} · msg {last} " in ctx
        finally:
            await ed.stop()

    # a thread of its own: the page's browser keeps an event loop on this one
    with ThreadPoolExecutor(1) as pool:
        pool.submit(lambda: asyncio.run(asyncio.wait_for(go(), 120))).result()
