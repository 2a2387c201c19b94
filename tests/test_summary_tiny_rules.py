"""A manual compaction of a context made only of tiny rules is effective.

Ten or more messages of a few tokens each ("Never use tabs.", "不要用制表符。"): a summary
with the full legend and a pointer per line would cost more than the messages it
replaces. A small summary is written compactly (a short legend, neighbouring plain
items on one line with one pointer range), so the compaction shrinks the context and
every rule is still there, verbatim. Through a real Engine on a SQLite file and through
a real daemon over its JSON-RPC wire.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import DaemonProcess

from ctxd.daemon.engine import Engine
from ctxd.daemon.recall import explain

RULES_EN = [
    "Never use tabs.", "Always run tests.", "Do not push to main.", "Never commit secrets.",
    "Always use UTF-8.", "Do not add dependencies.", "Never skip CI.", "Always write docs.",
    "Do not rename files.", "Never use eval.", "Always pin versions.", "Do not log tokens.",
    "Never force push.", "Always squash merges.", "Do not touch vendor/.", "Never disable lint.",
]
RULES_ZH = [
    "不要用制表符。", "必须先跑测试。", "禁止推到 main。", "不要提交密钥。",
    "必须用 UTF-8。", "不要加依赖。", "禁止跳过 CI。", "必须写文档。",
    "不要改文件名。", "禁止用 eval。", "必须固定版本。", "不要打印令牌。",
    "禁止强推。", "必须压缩合并。", "不要动 vendor/。", "禁止关掉 lint。",
]


def tiny_rules(n: int, zh: bool, replies: bool) -> list[dict[str, Any]]:
    """`n` messages: distinct one-line rules, each answered by "ok" when `replies`."""
    rules = RULES_ZH if zh else RULES_EN
    out: list[dict[str, Any]] = []
    i = 0
    while len(out) < n:
        out.append({"role": "user", "content": rules[i % len(rules)]})
        i += 1
        if replies and len(out) < n:
            out.append({"role": "assistant", "content": "好" if zh else "ok"})
    return out


def model_input(messages: list[dict[str, Any]]) -> str:
    return "\n".join(str(m.get("content") or "") for m in messages)


@pytest.mark.parametrize("replies", [False, True], ids=["rules-only", "answered"])
@pytest.mark.parametrize("zh", [False, True], ids=["en", "zh"])
@pytest.mark.parametrize("n", [10, 11, 12, 16])
def test_manual_compaction_of_tiny_rules_is_effective(
    engine: Engine, n: int, zh: bool, replies: bool
) -> None:
    sid = engine.create_session().session_id
    msgs = tiny_rules(n, zh, replies)
    engine.append(sid, msgs)
    result = asyncio.run(engine.compact(sid, force=True))
    assert result.effective, result
    assert result.after.tokens < result.before.tokens
    assert result.after.messages < result.before.messages
    after = engine.context_messages(sid)
    text = model_input(after)
    # every rule is still in the model input, in its own words
    for m in msgs:
        if m["role"] == "user":
            assert m["content"] in text, m["content"]
    summary = after[0]["content"]
    # the rules that left share lines, each line with one pointer range into the session
    ranges = re.findall(r" #(\d+)-(\d+)$", summary, re.MULTILINE)
    assert ranges and all(1 <= int(a) < int(b) <= n for a, b in ranges), summary
    # ... and context/explain still resolves every item to its own message
    out = explain(engine, sid)
    assert out.broken_pointers == 0
    cited = {src["snippet"].strip() for item in out.items for src in item["sources"]}
    left = {m["content"] for m in msgs[: result.summarized_to] if m["role"] == "user"}
    assert left <= cited


def test_a_large_summary_keeps_a_pointer_per_line(engine: Engine) -> None:
    """The compact form is for small summaries only: one with many long rules keeps the
    full legend and a pointer on every line."""
    sid = engine.create_session().session_id
    long_rules = [
        {"role": "user", "content": f"Never edit vendor/lib{i}.py by hand; regenerate it with "
                                    f"tools/gen_{i}.sh and commit the generator's output."}
        for i in range(30)
    ]
    engine.append(sid, long_rules)
    assert asyncio.run(engine.compact(sid, force=True)).effective
    summary = engine.context_messages(sid)[0]["content"]
    assert "search_past_messages recalls the full text" in summary
    lines = [ln for ln in summary.splitlines() if ln.startswith("- ")]
    assert len(lines) >= 20
    assert all(re.search(r" #\d+$", ln) for ln in lines), lines


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("tiny-rules")).start()
    try:
        yield d
    finally:
        d.stop()


@pytest.mark.parametrize("zh", [False, True], ids=["en", "zh"])
def test_over_the_wire_manual_compaction_of_tiny_rules(daemon: DaemonProcess, zh: bool) -> None:
    with daemon.client(wire="jsonrpc") as c:
        sid = c.call("session/create", {"title": "tiny rules"})["sessionId"]
        msgs = tiny_rules(10, zh, replies=False)
        c.call("messages/append", {"sessionId": sid, "messages": msgs})
        out = c.call("context/compact", {"sessionId": sid, "force": True})
        assert out["effective"], out
        assert out["after"]["tokens"] < out["before"]["tokens"]
        ctx = c.call("context/get", {"sessionId": sid})["messages"]
        assert len(ctx) == out["after"]["messages"] < 10
        text = model_input(ctx)
        assert all(m["content"] in text for m in msgs)
        # a second manual compaction right away: the rules stay, nothing grows
        c.call("messages/append", {"sessionId": sid, "messages": tiny_rules(10, zh, False)})
        again = c.call("context/compact", {"sessionId": sid, "force": True})
        assert again["effective"], again
        assert again["after"]["tokens"] < again["before"]["tokens"]
        ctx = c.call("context/get", {"sessionId": sid})["messages"]
        assert all(m["content"] in model_input(ctx) for m in msgs)
