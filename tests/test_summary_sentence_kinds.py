"""Kinds by sentence in the built-in summary: a rule needs deontic force, a request is a
task, a hedge marks its own clause, pasted output is evidence, transcript boilerplate
stays in the archive, and requests of one shape fold into one line. Small hand-written
sessions in English and Chinese, asserting on the exact items per section.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from helpers import make_config
from summary_builders import summarize as run

from ctxd.daemon.compaction.rules import SUMMARY_HEADER
from ctxd.daemon.engine import Engine
from ctxd.daemon.summary import Summary


def users(*texts: str, start: int = 1) -> list[dict[str, Any]]:
    return [{"id": start + i, "role": "user", "content": t} for i, t in enumerate(texts)]



def texts(summary: Summary, section: str) -> list[str]:
    return [i.text for i in summary.sections.get(section, [])]


def marked(summary: Summary, section: str) -> list[tuple[str, bool]]:
    return [(i.text, i.unconfirmed) for i in summary.sections.get(section, [])]


# ------------------------------------------------------------ deontic vs request


def test_questions_lead_ins_and_narration_are_not_rules() -> None:
    summary = run(users(
        "Why don't the diffs show in the viewer when the timeline has them?",
        "Do NOT:\n- add heavy libraries\n- add 3D engines",
        "Raveera is a premium event platform, not rave-only or nightlife-only.",
        "I never said to rewrite that file.",
        "hook.js:608 [ErrorBoundary:App] ReferenceError: React is not defined",
        "Bot 排除不要只靠已知名單。",
        "部署前必須先跑完整測試。",
        "### Step 1: Gather Context\nnever .transfer(), never .send()",
        "<local-command-caveat>Caveat: DO NOT respond to these messages.</local-command-caveat>",
    ))
    assert texts(summary, "constraints") == [
        # a lead-in's rules are the items under it
        "Do NOT: add heavy libraries",
        "Do NOT: add 3D engines",
        "Bot 排除不要只靠已知名單。",
        "部署前必須先跑完整測試。",
        # a rule that names code is still a rule; the heading above it is no item
        "never .transfer(), never .send()",
    ]
    assert texts(summary, "goals") == [
        "Why don't the diffs show in the viewer when the timeline has them?",
        "Raveera is a premium event platform, not rave-only or nightlife-only.",
        "I never said to rewrite that file.",
    ]


def test_rules_need_deontic_force_and_requests_are_goals_in_english() -> None:
    summary = run(users(
        "Step 74: please check module m74.py and run its tests.",
        "Never run migrations on Mondays.",
        "Use Task Master MCP to set task status:",
        "Can you look at the retry loop in client.py?",
        "Make sure you only touch files under src/.",
        "Don't forget to update the changelog.",
        "Please run the linter, and do not push to main.",
    ))
    assert texts(summary, "constraints") == [
        "Never run migrations on Mondays.",
        "Make sure you only touch files under src/.",
        "Please run the linter, and do not push to main.",
    ]
    assert texts(summary, "goals") == [
        "Step 74: please check module m74.py and run its tests.",
        "Use Task Master MCP to set task status:",
        "Can you look at the retry loop in client.py?",
        "Don't forget to update the changelog.",
    ]


def test_rules_need_deontic_force_and_requests_are_goals_in_chinese() -> None:
    summary = run(users(
        "请看一下 src/app.py 的日志。",
        "数据库迁移必须在周五之前完成，熊猫团队负责审核。",
        "第 12 步：请检查模块 m12.py 并运行测试。",
        "生产环境的配置文件不要改。",
        "帮我跑一下集成测试。",
        "发布前务必通知运维。",
    ))
    assert texts(summary, "constraints") == [
        "数据库迁移必须在周五之前完成，熊猫团队负责审核。",
        "生产环境的配置文件不要改。",
        "发布前务必通知运维。",
    ]
    assert texts(summary, "goals") == [
        "请看一下 src/app.py 的日志。",
        "第 12 步：请检查模块 m12.py 并运行测试。",
        "帮我跑一下集成测试。",
    ]


def test_a_request_that_sets_a_value_is_still_a_setting() -> None:
    summary = run(users(
        "Set the importer batch size to 500.",
        "Step 3: please check module m3.py and run its tests.",
        "Please raise the importer batch size to 2000.",
    ))
    assert [(i.text, i.status) for i in summary.sections["constraints"]] == [
        ("Set the importer batch size to 500.", "superseded"),
        ("Please raise the importer batch size to 2000.", "current"),
    ]
    assert texts(summary, "goals") == ["Step 3: please check module m3.py and run its tests."]


# ----------------------------------------------------------------- hedge binding


def test_a_hedge_marks_its_own_clause_not_the_rule_before_it() -> None:
    summary = run(users(
        "Constraint: never touch vendor/. I suspect the cache is stale, but it's unconfirmed.",
        "Never edit the lockfile, but I think the resolver may be pinning an old index.",
        "The workers must stay on the read replica. I haven't confirmed that.",
        "Please fix the login bug. The export is probably slow because of the pool.",
    ))
    assert marked(summary, "constraints") == [
        ("Constraint: never touch vendor/.", False),
        ("Never edit the lockfile", False),
        # a sentence that only qualifies the one before it still marks that one
        ("The workers must stay on the read replica.", True),
    ]
    assert marked(summary, "open_items") == [
        ("I suspect the cache is stale.", True),
        ("I think the resolver may be pinning an old index.", True),
        ("The export is probably slow because of the pool.", True),
    ]
    assert marked(summary, "goals") == [("Please fix the login bug.", False)]
    rendered = summary.render()
    assert "- Constraint: never touch vendor/. [msg 1]" in rendered
    assert "- [unconfirmed] I suspect the cache is stale. [msg 1]" in (
        rendered
    )


def test_a_hedge_marks_its_own_clause_in_chinese() -> None:
    summary = run(users(
        "禁止直接推到 main 分支。我猜是缓存过期了，不过还没确认。",
        "支付服务的工作进程必须留在只读副本上。这一点尚未确认。",
        "请修复登录的问题。导出慢可能是连接池引起的。",
        "不要改 vendor 目录，我猜是缓存的问题。",
    ))
    assert marked(summary, "constraints") == [
        ("禁止直接推到 main 分支。", False),
        ("支付服务的工作进程必须留在只读副本上。", True),
        ("不要改 vendor 目录", False),
    ]
    assert marked(summary, "open_items") == [
        ("我猜是缓存过期了。", True),
        ("导出慢可能是连接池引起的。", True),
        ("我猜是缓存的问题。", True),
    ]
    assert marked(summary, "goals") == [("请修复登录的问题。", False)]
    assert "- [推测] 我猜是缓存过期了。 [msg 1]" in summary.render()


def test_the_agent_s_guess_is_kept_with_its_hedge() -> None:
    summary = run([{"id": 1, "role": "assistant", "content":
                    "Done. The slowdown is probably due to the event bus."}])
    assert marked(summary, "open_items") == [
        ("The slowdown is probably due to the event bus.", True)
    ]


def test_the_agent_s_headings_and_questions_are_no_items() -> None:
    summary = run([{"id": 1, "role": "assistant", "content":
                    "## ✅ TODO App Creation Complete\n**Next Steps**\n"
                    "- We still need to add tests for the parser.\n"
                    "Want me to switch to a toast instead of logging?\n"
                    "I'll use SQLite for the cache."}])
    assert texts(summary, "open_items") == ["We still need to add tests for the parser."]
    assert texts(summary, "decisions") == ["I'll use SQLite for the cache."]


# ---------------------------------------------------------- pasted output is evidence


PASTED = [
    "Here it is:\nTraceback (most recent call last):\n  File \"app.py\", line 3, in <module>\n"
    "    assert rows, 'must never be empty'\nAssertionError: must never be empty\nwhy?",
    "The log says:\n2024-05-01 12:00:01 WARN never retry on 409\n[INFO] always using cache\n"
    "please explain",
    "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n-x = 1\n"
    "+x = 2  # must be 2\ndoes this look right?",
    "| rule | value |\n|---|---|\n| must | never |\n- [ ] make sure the docs build\n"
    "- [x] always run lint",
    json.dumps({"only": True, "never": "do not", "retries": 3}),
    "```python\n# do not remove: must stay\nx = 1\n```\nCan you review this?",
    "[Image #1] what does this screenshot show?",
    "下面是报错：\nTraceback (most recent call last):\nValueError: 不能为空\n请看一下。",
]


def test_pasted_output_is_never_a_constraint_or_a_decision() -> None:
    summary = run([
        *users(*PASTED),
        {"id": 20, "role": "assistant", "content":
         "The diff:\n```diff\n-let's use redis\n+we decided to use kafka\n```\n"
         "| we'll use | x |\n|---|---|"},
    ])
    assert texts(summary, "constraints") == []
    assert texts(summary, "decisions") == []
    assert texts(summary, "goals") == [
        "Here it is: why?",
        "The log says: please explain",
        "does this look right?",
        "Can you review this?",
        "what does this screenshot show?",
        "下面是报错： 请看一下。",
    ]
    # the error line of a pasted traceback is still evidence of a failure
    assert "AssertionError: must never be empty" in texts(summary, "errors")
    assert "ValueError: 不能为空" in texts(summary, "errors")


# --------------------------------------------------- rules of an AGENTS.md preamble


def test_agents_md_bullets_are_constraints_verbatim() -> None:
    codex = (
        "# AGENTS.md instructions for /repo\n\n<INSTRUCTIONS>\n## Rules\n"
        "- do NOT activate any existing venv\n"
        "- Run tests with `pytest -q`.\n"
        "- Commits MUST pass lint (MUST, Blocking)\n"
        "- 提交前必须运行 ruff。\n"
        "</INSTRUCTIONS>"
    )
    wrapped = (
        "<user_instructions>\n# House style\nWe like small commits.\n"
        "1. Never commit secrets. Rotate them instead.\n"
        "2. Always write tests first.\n</user_instructions>"
    )
    preamble = (
        "## Guidelines\n- Only use the public API.\n- 禁止使用全局变量。\n"
        "- Add a health check to the worker.\n"
    )
    reminder = (
        "<system-reminder>\nAs you answer the user's questions, you can use the following "
        "context:\n# claudeMd\nContents of /repo/CLAUDE.md (project instructions):\n\n"
        "- NEVER edit generated files in gen/.\n- Use uv for installs.\n</system-reminder>\n"
        "Please add a health endpoint."
    )
    skill = (
        "Base directory for this skill: /home/u/.claude/skills/roast\n\n# Roast my product\n"
        "Read the pitch, then score it.\n- Don't sandwich with compliments.\n"
        "- Never say \"overall it's pretty good\" — find the problems."
    )
    summary = run(users(codex, wrapped, preamble, reminder, skill))
    assert texts(summary, "constraints") == [
        "do NOT activate any existing venv",
        "Commits MUST pass lint (MUST, Blocking)",
        "提交前必须运行 ruff。",
        "Never commit secrets. Rotate them instead.",
        "Always write tests first.",
        "Only use the public API.",
        "禁止使用全局变量。",
        "NEVER edit generated files in gen/.",
        # a skill's instructions are the skill's own text: archive only, no user rule
    ]
    # under a generic "## Guidelines" heading, a request is still a request
    assert texts(summary, "goals") == [
        "Add a health check to the worker.", "Please add a health endpoint."
    ]


def test_a_preamble_rule_that_introduces_a_list_keeps_its_items() -> None:
    codex = (
        "# AGENTS.md instructions for /repo\n\n"
        "## Failure handling\n"
        "- If **all** providers fail, **do not finalize**. Return a minimal plan that "
        "includes:\n\n"
        "  - The attempted providers and errors\n"
        "  - A safe, read-only analysis and suggested next checks.\n"
        "**Safety Gate checklist:**\n"
        "1. **Execution scope** is read-only or hermetic.\n"
        "- 提交前必须完成以下检查：\n"
        "  - 运行单元测试\n"
        "  - 检查格式\n"
        "\n"
        "  An indented remark, outside the list.\n"
        "- Never push to main.\n"
    )
    summary = run(users(codex))
    assert texts(summary, "constraints") == [
        "If **all** providers fail, **do not finalize**. Return a minimal plan that "
        "includes: The attempted providers and errors; A safe, read-only analysis and "
        "suggested next checks.",
        "提交前必须完成以下检查： 运行单元测试; 检查格式",
        "Never push to main.",
    ]
    # a checklist under a lead-in with no force of its own is not a rule
    assert not any("hermetic" in t for _, i in summary.items() for t in [i.text])


# -------------------------------------------------------- boilerplate left out


BOILERPLATE = {
    "environment": "<environment_context>\n  <cwd>/home/u/proj</cwd>\n  <approval_policy>never"
                   "</approval_policy>\n  <shell>zsh</shell>\n</environment_context>",
    "clear": "<command-name>/clear</command-name>\n<command-message>clear</command-message>\n"
             "<command-args></command-args>",
    "stdout": "<local-command-stdout>Compacted. ctrl+r to see full summary. Never mind."
              "</local-command-stdout>",
    "reminder": "<system-reminder>Whenever you read a file, you must consider whether it is "
                "malware.</system-reminder>",
    "notification": "<task-notification><task-id>b12</task-id><status>completed</status>"
                    "<summary>Background command \"npm test\" completed</summary>"
                    "</task-notification>",
    "continuation": "This session is being continued from a previous conversation that ran "
                    "out of context. The conversation is summarized below:\nAnalysis: the user "
                    "must have wanted X. Always respond in English.",
    "caveat": "Caveat: The messages below were generated by the user while running local "
              "commands. DO NOT respond to these messages or otherwise consider them in your "
              "response unless the user explicitly asks you to.",
    "placeholder": "[Pasted text #1 +35 lines] [Image #2] [REDACTED]",
    "hook": "Stop hook feedback: [scripts/hooks/stop.sh]: Cannot exit with unstaged changes. "
            "Before stopping, you must commit or stash them.",
    "interrupted": "[Request interrupted by user for tool use]",

}


def test_each_form_of_boilerplate_is_left_out_of_the_summary() -> None:
    for name, text in BOILERPLATE.items():
        summary = run(users(text))
        assert summary.sections == {}, name


def test_boilerplate_around_a_request_leaves_the_request() -> None:
    summary = run(users(
        BOILERPLATE["caveat"] + "\n\n" + BOILERPLATE["clear"],
        "# Context from my IDE setup:\n\n## Active file: src/app.py\n\n## Open tabs:\n"
        "- app.py: src/app.py\n- util.py: src/util.py\n\n## My request for Codex:\n"
        "fix the login bug in the session handler",
        BOILERPLATE["environment"] + "\n请把导出改成流式的。",
        "<system-reminder>The TodoWrite tool hasn't been used recently.</system-reminder>\n"
        "Never log tokens. Please add request ids to the logs. [Image #1]",
    ))
    assert texts(summary, "goals") == [
        "fix the login bug in the session handler",
        "请把导出改成流式的。",
        "Please add request ids to the logs.",
    ]
    assert texts(summary, "constraints") == ["Never log tokens."]
    rendered = summary.render()
    for marker in ("<", "Open tabs", "Caveat", "/home/u/proj", "Image #", "util.py"):
        assert marker not in rendered, marker


# ------------------------------------------------------------------------ folding


def test_a_numbered_series_of_requests_folds_into_one_line_with_range_and_count() -> None:
    steps = [f"Step {n}: please check module m{n}.py and run its tests." for n in range(74, 150)]
    summary = run(users("Never run migrations on Mondays.", *steps))
    assert texts(summary, "goals") == [
        "Steps 74–149: check module mN.py and run its tests (76 requests)"
    ]
    [item] = summary.sections["goals"]
    # the first request and the latest stay among its sources
    assert item.sources[0] == 2 and item.sources[-1] == 77
    assert texts(summary, "constraints") == ["Never run migrations on Mondays."]


def test_a_folded_line_keeps_folding_across_summaries_and_in_chinese() -> None:
    first = run(users(*[f"Step {n}: please check module m{n}.py and run its tests."
                        for n in range(1, 4)]))
    assert texts(first, "goals") == [
        "Steps 1–3: check module mN.py and run its tests (3 requests)"
    ]
    second = run(users(*[f"Step {n}: please check module m{n}.py and run its tests."
                         for n in range(4, 9)], start=10), previous=first)
    assert texts(second, "goals") == [
        "Steps 1–8: check module mN.py and run its tests (8 requests)"
    ]
    assert second.sections["goals"][0].sources[0] == 1
    assert second.sections["goals"][0].sources[-1] == 14

    zh = run(users(*[f"第 {n} 步：请检查模块 m{n}.py 并运行测试。" for n in range(1, 21)]))
    assert texts(zh, "goals") == ["第 1–20 步：检查模块 mN.py 并运行测试（共 20 条请求）"]
    bare = run(users(*[f"请检查模块 m{n}.py 并运行测试。" for n in range(5, 8)]))
    assert texts(bare, "goals") == ["检查模块 mN.py 并运行测试（N = 5–7，共 3 条请求）"]
    bare = run(users("请检查模块 m8.py 并运行测试。", start=9), previous=bare)
    assert texts(bare, "goals") == ["检查模块 mN.py 并运行测试（N = 5–8，共 4 条请求）"]
    batches = run(users(*[f"Batch {n}: import part{n}.csv." for n in range(1, 4)]))
    assert texts(batches, "goals") == ["Batches 1–3: import partN.csv (3 requests)"]
    batches = run(users("Batch 4: import part4.csv.", start=7), previous=batches)
    assert texts(batches, "goals") == ["Batches 1–4: import partN.csv (4 requests)"]
    # the same request twice is one item citing both, not a series
    again = run(users("Deploy it with 5 replicas now.", "Deploy it with 5 replicas now."))
    assert [(i.text, i.sources) for i in again.sections["goals"]] == [
        ("Deploy it with 5 replicas now.", [1, 2])
    ]
    # requests that differ in more than a number stay apart
    apart = run(users("Please tidy the parser module.", "Please tidy the cache module."))
    assert texts(apart, "goals") == [
        "Please tidy the parser module.", "Please tidy the cache module."
    ]


# ------------------------------------------- rules outlive many routine compactions


REPLY = "Done. " + "I checked the module, ran its tests and they pass. " * 6


def test_real_rules_survive_compactions_of_many_routine_steps(tmp_path: Path) -> None:
    engine = Engine(make_config(tmp_path, keep_messages=4))
    try:
        sid = engine.create_session().session_id
        engine.append(sid, [
            {"role": "user", "content": "数据库迁移必须在周五之前完成，熊猫团队负责审核。"},
            {"role": "assistant", "content": "好的。"},
            {"role": "user", "content": "Never run migrations on Mondays."},
            {"role": "assistant", "content": "Understood."},
        ])
        step = 1
        for _ in range(6):
            for _ in range(14):
                engine.append(sid, [
                    {"role": "user", "content":
                     f"Step {step}: please check module m{step}.py and run its tests."},
                    {"role": "assistant", "content": None, "tool_calls": [
                        {"id": f"c{step}", "type": "function", "function": {
                            "name": "bash", "arguments": json.dumps(
                                {"command": f"pytest -q tests/test_m{step}.py"})}}]},
                    {"role": "tool", "tool_call_id": f"c{step}", "content": "3 passed"},
                    {"role": "assistant", "content": REPLY},
                ])
                step += 1
            assert asyncio.run(engine.compact(sid)).effective
        summary = engine.context_state(sid).summary
        assert step - 1 >= 75
        assert texts(summary, "constraints") == [
            "数据库迁移必须在周五之前完成，熊猫团队负责审核。",
            "Never run migrations on Mondays.",
        ]
        goals = texts(summary, "goals")
        assert len(goals) == 1 and goals[0].startswith("Steps 1–")
        assert goals[0].endswith(" requests)")
        model_input = "\n".join(
            str(m.get("content") or "") for m in engine.context_messages(sid)
            if m["role"] == "system" and str(m.get("content")).startswith(SUMMARY_HEADER)
        )
        assert "数据库迁移必须在周五之前完成，熊猫团队负责审核。" in model_input
        assert "Never run migrations on Mondays." in model_input
    finally:
        engine.close()
