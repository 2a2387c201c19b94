"""The summary's size follows what it replaces; priority under the budget; manual
compaction of short contexts; instructions; rebuild.

Hand-written sessions in English and Chinese, through a real Engine on a SQLite file in
a temp dir, and through a real daemon over its wire and the CLI.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from pathlib import Path
from typing import Any

import pytest
from helpers import agent_turn, make_config, tool_turn

from ctxd.daemon.config import load_config
from ctxd.daemon.engine import Engine
from ctxd.daemon.summarizers.builtin import BuiltinSummarizer
from ctxd.daemon.summary import Summary, SummaryRequest
from ctxd.daemon.tokens import TokenCounter
from ctxd.protocol.errors import ApprovalPending
from ctxd.protocol.types import CompactResult

SHARE = load_config(environ={}).compaction.summary_share

RULE_ZH = "数据库迁移必须在周五之前完成，熊猫团队负责审核。"
RULE_EN = "Never run migrations on Mondays."


# ------------------------------------------------------------------ builders


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def call_and_result(cid: str, name: str, args: dict[str, Any], out: str) -> list[dict[str, Any]]:
    return [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": cid, "type": "function",
             "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}]},
        {"role": "tool", "tool_call_id": cid, "content": out},
    ]


def step_turn(n: int, zh: bool = False) -> list[dict[str, Any]]:
    """A routine request of one shape, its tool call and the agent's report."""
    ask = (f"第 {n} 步：请检查模块 m{n}.py 并运行它的测试。" if zh
           else f"Step {n}: please check module m{n}.py and run its tests.")
    done = f"模块 m{n}.py 已检查，测试通过。" if zh else f"Module m{n}.py checked, tests pass."
    return [user(ask), *call_and_result(f"s{n}", "run_tests", {"path": f"m{n}.py"},
                                        f"{n} passed"), assistant(done)]


EN_SESSION = [
    user("We are adding CSV export to the reports service. " + RULE_EN),
    assistant("I'll start with the exporter in reports/export.py."),
    *call_and_result("e1", "read_file", {"path": "reports/export.py"}, "def export(): ...\n" * 6),
    user("Keep the column order the same as the on-screen table."),
    *call_and_result("e2", "edit_file", {"path": "reports/export.py", "old": "a", "new": "b"},
                     "1 replacement"),
    assistant("Added the CSV writer; the header row follows the table's columns."),
    user("Run the unit tests for the exporter, please."),
    *call_and_result("e3", "run_shell", {"command": "pytest -q tests/test_export.py"},
                     "tests/test_export.py ....\n4 passed"),
    assistant("All four exporter tests pass."),
]

ZH_SESSION = [
    user("我们要给报表服务加导出功能。" + RULE_ZH),
    assistant("我先看一下 reports/export.py。"),
    *call_and_result("z1", "read_file", {"path": "reports/export.py"}, "def export(): ...\n" * 6),
    user("不要修改 vendor/ 目录下的任何文件。"),
    *call_and_result("z2", "edit_file", {"path": "reports/export.py", "old": "a", "new": "b"},
                     "1 replacement"),
    assistant("已经加上 CSV 写入，表头顺序和页面表格一致。"),
    user("请运行导出模块的单元测试。"),
    *call_and_result("z3", "run_shell", {"command": "pytest -q tests/test_export.py"},
                     "tests/test_export.py ....\n4 passed"),
    assistant("导出模块的四个测试都通过了。"),
]


def summary_text(engine: Engine, sid: str) -> str:
    return "\n".join(str(m.get("content") or "") for m in engine.context_messages(sid)
                     if m["role"] == "system")


def recount(engine: Engine, sid: str) -> tuple[int, int]:
    msgs = engine.context_messages(sid)
    return len(msgs), sum(engine.tokens.count_message(m) for m in msgs)


def replaced_tokens(engine: Engine, sid: str, result: CompactResult) -> int:
    archive = engine.read_archive(sid, limit=5000).messages
    lo, hi = result.summarized_from, result.summarized_to
    return sum(m["tokens"] for m in archive if lo <= m["id"] <= hi)


def verbatim_tokens(engine: Engine, summary: Summary) -> int:
    """Tokens of the lines kept whole whatever the span's size: the rules in force and
    the latest request, with their section headers."""
    rules = [i for i in summary.sections.get("constraints", []) if i.status == "current"]
    goals = summary.sections.get("goals", [])[-1:]
    text = ""
    if rules:
        text += "## Constraints and user corrections\n" + "\n".join(
            i.line(summary.ordinals) for i in rules)
    if goals:
        text += "\n## Goals\n" + goals[0].line(summary.ordinals)
    return engine.tokens.count_text(text) if text else 0


def check_pairs(messages: list[dict[str, Any]]) -> None:
    """Every tool result in the context has its call there, and no call's result was
    summarized while the call stayed."""
    calls = {c["id"] for m in messages for c in m.get("tool_calls") or ()}
    results = {m["tool_call_id"] for m in messages if m["role"] == "tool"}
    assert results <= calls, results - calls
    first = next(m for m in messages if m["role"] != "system")
    assert first["role"] != "tool"


# ------------------------------------------------------------ size of a span


@pytest.mark.parametrize("session", [EN_SESSION, ZH_SESSION], ids=["en", "zh"])
def test_small_span_summary_is_a_share_of_what_it_replaces(tmp_path: Path,
                                                           session: list[dict[str, Any]]) -> None:
    engine = Engine(make_config(tmp_path))
    try:
        sid = engine.create_session().session_id
        engine.append(sid, [{"role": "system", "content": "You are a coding agent."}])
        engine.append(sid, session)
        result = asyncio.run(engine.compact(sid, force=True))
        assert result.effective, result
        st = engine.context_state(sid)
        replaced = replaced_tokens(engine, sid, result)
        assert replaced < 5000
        text = engine.tokens.count_text(st.summary.render())
        assert text <= SHARE * replaced + verbatim_tokens(engine, st.summary), (
            text, replaced, st.summary.render())
        # the whole summary message (header included) is smaller than what it replaced
        assert st.summary_tokens < replaced
        assert result.after.tokens < result.before.tokens
        # the rule is kept verbatim
        rule = RULE_EN if session is EN_SESSION else RULE_ZH
        assert rule.rstrip(".") in summary_text(engine, sid)
        assert (engine.status(sid).active_messages,
                engine.status(sid).estimated_tokens) == recount(engine, sid)
    finally:
        engine.close()


def test_summary_budget_still_bounds_every_summary(tmp_path: Path) -> None:
    engine = Engine(make_config(tmp_path, summary_budget_tokens=300))
    try:
        sid = engine.create_session().session_id
        for i in range(40):
            engine.append(sid, agent_turn(i))
            engine.append(sid, [user(f"Always keep the payload of endpoint {i} under 4 KB.")])
        asyncio.run(engine.compact(sid, force=True))
        st = engine.context_state(sid)
        assert 0 < engine.tokens.count_text(st.summary.render()) <= 300
    finally:
        engine.close()


_turn_numbers = itertools.count()


def _random_session(rng: random.Random, n_turns: int) -> list[list[dict[str, Any]]]:
    """Turns of many shapes: chat, rules, Chinese, long tool output, parallel calls."""
    turns: list[list[dict[str, Any]]] = []
    for _ in range(n_turns):
        t = next(_turn_numbers)  # tool call ids are unique in a session
        kind = rng.choice(["chat", "chat", "rule", "zh", "tool", "tools", "long", "step"])
        if kind == "chat":
            turns.append([user(f"ok {t}"), assistant("fine")])
        elif kind == "rule":
            turns.append([user(f"Never change the schema of table t{t} without a migration.")])
        elif kind == "zh":
            turns.append([user(f"请把第 {t} 个接口的超时改成 {rng.randint(5, 90)} 秒。"),
                          assistant("好的。")])
        elif kind == "tool":
            turns.append(tool_turn(t, result="ok"))
        elif kind == "tools":
            calls = [{"id": f"p{t}_{k}", "type": "function",
                      "function": {"name": "read_file",
                                   "arguments": json.dumps({"path": f"src/p{t}_{k}.py"})}}
                     for k in range(3)]
            turns.append([{"role": "assistant", "content": None, "tool_calls": calls},
                          *({"role": "tool", "tool_call_id": c["id"], "content": "x = 1"}
                            for c in calls)])
        elif kind == "long":
            turns.append(tool_turn(t, result="line of output\n" * rng.randint(20, 200)))
        else:
            turns.append(step_turn(t))
    return turns


def test_no_compaction_makes_the_model_input_bigger(tmp_path: Path) -> None:
    engine = Engine(make_config(tmp_path))
    rng = random.Random(19)
    results: list[dict[str, Any]] = []
    try:
        for shape in range(24):
            sid = engine.create_session().session_id
            if shape % 3 == 0:
                engine.add_pin(sid, "Deploy only from the release branch.")
            for turn in _random_session(rng, rng.randint(4, 45)):
                engine.append(sid, turn)
                if engine.auto_compaction_due(sid):
                    results.append(asyncio.run(engine.compact(sid, trigger="auto")))
            for _ in range(rng.randint(1, 3)):
                results.append(asyncio.run(engine.compact(sid, force=rng.random() < 0.8)))
                for turn in _random_session(rng, rng.randint(0, 6)):
                    engine.append(sid, turn)
            check_pairs(engine.context_messages(sid))
            assert (engine.status(sid).active_messages,
                    engine.status(sid).estimated_tokens) == recount(engine, sid)
        assert sum(1 for r in results if r.effective) >= 20
        for r in results:
            assert r.after.tokens <= r.before.tokens, r
            assert r.after.messages <= r.before.messages, r
            if r.effective:
                assert r.after.tokens < r.before.tokens, r
    finally:
        engine.close()


# ------------------------------------------------------- manual compaction


def _short_messages(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [user(f"item {i} looks good") if i % 2 == 0 else assistant(f"noted {i}")
            for i in range(start, start + n)]


def test_forced_compaction_of_80_short_messages_is_effective(engine: Engine) -> None:
    sid = engine.create_session().session_id
    engine.append(sid, _short_messages(80))
    result = asyncio.run(engine.compact(sid, force=True))
    assert result.effective, result
    assert result.after.tokens < result.before.tokens
    assert result.after.messages <= 1 + 6  # the summary and a short tail


@pytest.mark.parametrize("n", [10, 11, 13, 17, 26])
def test_forced_compaction_of_ten_or_more_messages_is_effective(engine: Engine, n: int) -> None:
    sid = engine.create_session().session_id
    msgs: list[dict[str, Any]] = [user("Refactor the billing client; keep its public API.")]
    i = 0
    while len(msgs) < n:
        msgs += tool_turn(i, result="ok") if len(msgs) + 2 <= n else [assistant("done")]
        i += 1
    assert len(msgs) == n
    engine.append(sid, msgs)
    before = engine.context_messages(sid)
    result = asyncio.run(engine.compact(sid, force=True))
    assert result.effective, result
    after = engine.context_messages(sid)
    check_pairs(after)
    assert len(after) < len(before)
    # the request is in the summary when it left the tail
    if not any(m.get("content") == msgs[0]["content"] for m in after):
        text = summary_text(engine, sid)
        assert "Refactor the billing client" in text and "keep its public API" in text


def _file_requests(n: int, start: int, zh: bool) -> list[dict[str, Any]]:
    """Short requests naming files: each gives a goal and file items, more summary
    lines than the message had tokens, so an unbounded summary grows past what leaves."""
    out: list[dict[str, Any]] = []
    for k in range(start, start + n):
        ask = (f"检查 src/pkg/mod_{k}.py 和 tests/test_mod_{k}.py" if zh
               else f"check src/pkg/mod_{k}.py and tests/test_mod_{k}.py")
        out += [user(ask), assistant("好" if zh else "ok")]
    return out


@pytest.mark.parametrize("zh", [False, True], ids=["en", "zh"])
def test_manual_compaction_right_after_an_automatic_one(engine: Engine, zh: bool) -> None:
    sid = engine.create_session().session_id
    engine.append(sid, [{"role": "system", "content": "You are a careful agent."}])
    engine.append(sid, _file_requests(42, 0, zh))  # 85 messages: over the limit
    assert engine.auto_compaction_due(sid)
    auto = asyncio.run(engine.compact(sid, trigger="auto"))
    assert auto.effective, auto
    engine.append(sid, _file_requests(1, 100, zh))
    assert engine.status(sid).active_messages >= 26
    manual = asyncio.run(engine.compact(sid, force=True))
    assert manual.effective, manual
    assert manual.after.tokens < manual.before.tokens
    check_pairs(engine.context_messages(sid))
    # and again, right away: still shrinks while 10 or more messages are there
    engine.append(sid, _file_requests(5, 200, zh))
    while engine.status(sid).active_messages >= 10:
        again = asyncio.run(engine.compact(sid, force=True))
        assert again.effective, again
    assert (engine.status(sid).active_messages,
            engine.status(sid).estimated_tokens) == recount(engine, sid)


def test_forced_compaction_leaves_a_pending_approval_alone(engine: Engine) -> None:
    sid = engine.create_session().session_id
    for i in range(4):
        engine.append(sid, agent_turn(i))
    run = engine.start_run(sid)
    call, result = tool_turn(99)
    engine.append(sid, [call], run_id=run.run_id)
    approval = engine.request_approval(sid, run.run_id, "call_99", "read_file")
    before = engine.context_messages(sid)
    with pytest.raises(ApprovalPending):
        asyncio.run(engine.compact(sid, force=True))
    assert engine.context_messages(sid) == before
    assert any(c["id"] == "call_99" for m in before for c in m.get("tool_calls") or ())
    engine.resolve_approval(approval.approval_id, "approved")
    engine.append(sid, [result], run_id=run.run_id)
    engine.finish_run(run.run_id, "completed")
    out = asyncio.run(engine.compact(sid, force=True))
    assert out.effective, out
    check_pairs(engine.context_messages(sid))


# ----------------------------------------------------- priority under budget


def _summarize(messages: list[dict[str, Any]], budget: int,
               instructions: str | None = None) -> Summary:
    counter = TokenCounter()
    with_ids = [{**m, "id": i + 1} for i, m in enumerate(messages)]
    request = SummaryRequest(session_id="s", previous=Summary(), messages=with_ids, pins=[],
                             instructions=instructions, budget_tokens=budget,
                             count_tokens=counter.count_text)
    return BuiltinSummarizer().summarize_sync(request)


def _priority_session(zh: bool) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [user(RULE_ZH if zh else RULE_EN)]
    for n in range(1, 13):
        msgs += step_turn(n, zh)
        msgs += call_and_result(f"r{n}", "read_file", {"path": f"docs/notes_{n}.md"}, "notes")
    msgs.append(user("禁止在生产库上直接执行 DDL。" if zh
                     else "Always open a PR; never push to main."))
    return msgs


@pytest.mark.parametrize("zh", [False, True], ids=["en", "zh"])
def test_routine_lines_go_before_rules(zh: bool) -> None:
    msgs = _priority_session(zh)
    full = _summarize(msgs, 10**6)
    rules = [i.text for i in full.sections["constraints"]
             if RULE_EN[:10] in i.text or RULE_ZH[:5] in i.text or "DDL" in i.text
             or "never push" in i.text]
    assert len(rules) == 2
    counter = TokenCounter()
    full_size = counter.count_text(full.render())
    dropped_rule_at: int | None = None
    for budget in range(full_size, 20, -10):
        s = _summarize(msgs, budget)
        assert counter.count_text(s.render()) <= budget
        kept = {i.text for _, i in s.items()}
        routine_left = [
            i.text for name, i in s.items()
            if name in ("tool_activity", "files") or "m" in i.text and ".py" in i.text
        ]
        if not set(rules) <= kept:
            dropped_rule_at = dropped_rule_at or budget
            # a rule goes only once every routine line but the newest of its kind is gone
            by_section: dict[str, int] = {}
            for name, i in s.items():
                if i.text in routine_left:
                    by_section[name] = by_section.get(name, 0) + 1
            assert all(n <= 1 for n in by_section.values()), (budget, by_section)
    # a rule goes only once the summary is down to a small part of its full size: the
    # newest line of each section is kept as a floor, and with the routine requests
    # folded into one line those floors are most of what is left by then
    assert dropped_rule_at is not None and dropped_rule_at < full_size * 0.4
    # at a budget that holds the rules and a little more, the rules are all there and
    # most routine lines are gone
    tight = _summarize(msgs, dropped_rule_at + 40)
    assert set(rules) <= {i.text for _, i in tight.items()}
    assert len(tight.sections.get("files", [])) * 4 <= len(full.sections["files"])


@pytest.mark.parametrize("zh", [False, True], ids=["en", "zh"])
def test_rules_survive_many_compactions_of_routine_turns(tmp_path: Path, zh: bool) -> None:
    engine = Engine(make_config(tmp_path))
    try:
        sid = engine.create_session().session_id
        engine.append(sid, [user(RULE_ZH), assistant("好的。"), user(RULE_EN),
                            assistant("Understood.")])
        n = 0
        for _ in range(6):
            for _ in range(25):
                n += 1
                engine.append(sid, step_turn(n, zh))
            assert asyncio.run(engine.compact(sid)).effective
            text = summary_text(engine, sid)
            assert RULE_ZH in text and RULE_EN.rstrip(".") in text, text[:600]
        rebuilt = asyncio.run(engine.rebuild(sid))
        assert rebuilt.compaction_id
        text = summary_text(engine, sid)
        assert RULE_ZH in text and RULE_EN.rstrip(".") in text
        # a rebuild re-derives the summary; it does not bring messages back
        assert rebuilt.after.messages <= rebuilt.before.messages
    finally:
        engine.close()


# ------------------------------------------------------------- instructions


@pytest.mark.parametrize("zh", [False, True], ids=["en", "zh"])
def test_instructions_keep_matching_items_and_are_logged(tmp_path: Path, zh: bool) -> None:
    engine = Engine(make_config(tmp_path, summary_budget_tokens=70))
    topics = (["登录页面", "搜索栏", "头像上传", "账单导出", "侧边栏", "分页器", "主题切换",
               "通知中心", "权限管理", "日志查询"] if zh else
              ["login page", "search bar", "avatar upload", "billing export", "sidebar",
               "pager", "theme switch", "notification center", "permission admin",
               "log viewer"])
    special = "支付回调重试" if zh else "payment webhook retries"
    # a reply long enough that the summary budget binds, not the share of the span
    reply = ("我看了现有实现和相关的测试用例，改动范围不大，先从事件处理开始。" * 3 if zh else
             "I read the current implementation and its tests; the change is small, and I "
             "will start with the event handlers before touching the layout. " * 2)
    try:
        sids = []
        for focus in (None, special):
            sid = engine.create_session().session_id
            for k, topic in enumerate(topics):
                ask = (f"请改进{topic}的交互，参考第 {k} 版设计稿。" if zh
                       else f"Improve the {topic} interactions, following design draft {k}.")
                engine.append(sid, [user(ask), assistant(reply)])
                if k == 2:
                    note = (f"请改进{special}的交互，参考第 {k} 版设计稿。" if zh else
                            f"Improve the {special} handling, following design draft {k}.")
                    engine.append(sid, [user(note), assistant(reply)])
            asyncio.run(engine.compact(sid, force=True, instructions=focus))
            sids.append(sid)
        plain, focused = (summary_text(engine, s) for s in sids)
        assert special not in plain
        assert special in focused
        log = engine.compaction_log(sids[1])
        assert log[0].instructions == special
        assert engine.compaction_log(sids[0])[0].instructions is None
    finally:
        engine.close()


def test_instructions_on_a_context_too_small_say_so(engine: Engine) -> None:
    sid = engine.create_session().session_id
    engine.append(sid, [user("hello"), assistant("hi")])
    out = asyncio.run(engine.compact(sid, instructions="keep the deployment rules"))
    assert out.effective is False and out.compaction_id is None
    assert out.instructions_applied is False
    assert "instructions were not applied" in out.reason
    assert engine.compaction_log(sid)[0].instructions == "keep the deployment rules"
    applied = engine.create_session().session_id
    engine.append(applied, EN_SESSION)
    ok = asyncio.run(engine.compact(applied, force=True, instructions="keep the CSV rules"))
    assert ok.effective and ok.instructions_applied is True


def test_force_keep_messages_sets_the_tail_of_a_forced_compaction(tmp_path: Path) -> None:
    for keep in (2, 10):
        engine = Engine(make_config(tmp_path / str(keep), force_keep_messages=keep))
        try:
            sid = engine.create_session().session_id
            engine.append(sid, _short_messages(60))
            out = asyncio.run(engine.compact(sid, force=True))
            assert out.effective, out
            # the summary message and a tail of about `keep` (a user message stays first)
            assert keep - 1 <= out.after.messages - 1 <= keep + 1, out
        finally:
            engine.close()
