"""Faults public transcripts showed in the built-in summary: numbered lists written on
one line, JSON a tag was cut out of, a pasted report sent again after an interrupt,
requests and pasted text read as rules, placeholders and skill texts kept as items.
Small hand-written sessions in English and Chinese, asserting on the exact items.
"""

from __future__ import annotations

from typing import Any

from summary_builders import assistant, call, result, user
from summary_builders import summarize as run

from ctxd.daemon.summary import Summary


def users(*texts: str) -> list[dict[str, Any]]:
    return [{"id": 1 + i, "role": "user", "content": t} for i, t in enumerate(texts)]


def items(summary: Summary, section: str) -> list[tuple[str, list[int]]]:
    return [(i.text, list(i.sources)) for i in summary.sections.get(section, [])]


def texts(summary: Summary, section: str) -> list[str]:
    return [i.text for i in summary.sections.get(section, [])]


# ------------------------------------------------------------------ mangled items


def test_an_inline_numbered_list_is_cut_before_its_numbers() -> None:
    summary = run(users(
        "请你检查当前分支的所有改动，具体可以看 ./ai/intent/20260112-price.md文档； "
        "具体步骤： 1. 获取当前分支区别于master所有diff改动 2. 根据intent文档做一次全面的review",
        "1. gildore arena 2. hackathon judges/grant reviewers 3. win a grant+ get intros",
        "Do NOT: 1. add heavy libraries 2. add 3D engines",
        "We ship version 2. Then we tag it.",
    ))
    assert texts(summary, "goals") == [
        # no item carries the next one's number, none is a bare "1."
        "请你检查当前分支的所有改动，具体可以看 ./ai/intent/20260112-price.md文档； 具体步骤： "
        "获取当前分支区别于master所有diff改动 根据intent文档做一次全面的review",
        "gildore arena hackathon judges/grant reviewers win a grant+ get intros",
        # no run of numbers: "2." ends a sentence
        "We ship version 2. Then we tag it.",
    ]
    assert texts(summary, "constraints") == [
        "Do NOT: add heavy libraries", "Do NOT: add 3D engines",
    ]


_JSON = (
    '[{"project": "repos", "first_ts": "2026-01-26T03:50:48.757Z", "last_ts": '
    '"2026-01-26T03:56:53.121Z", "msg_count": 52, "topics": ["<command-message>setup'
    '</command-message>\\n<command-name>/setup</command-name>\\n<command-args>blocklet dev '
    '有什么参数</command-args>", "我现在还有一个问题，能用idd'
    '分析排查吗"]}, {"project": "master", "first_ts": "2026-01-26T03:16:30.989Z", '
    '"msg_count": 33, "topics": ["有这个参数吗ABT_LOG_TO_FILE"]}]'
)
_REPORT = (
    "工作总结 - 2026-01-26\n概览\n今日有 4 个会话文件被修改。\n\n会话数据\n" + _JSON
    + "\n自动生成于 2026-01-26 14:46 Claude CLI 不可用，仅生成基础数据"
)


def test_a_pasted_report_sent_three_times_is_one_goal_and_no_rule() -> None:
    summary = run(users(
        "这是今天生成的报告：" + _REPORT,
        "[Request interrupted by user]",
        "这是今天生成的报告 " + _REPORT,
        _REPORT,
    ))
    # the JSON (and what a tag cut out of it left, `", "我现在…`) is evidence, no item;
    # the report's prose sets nothing; the three sends are one goal citing all three
    assert items(summary, "goals") == [(
        "这是今天生成的报告：工作总结 - 2026-01-26 概览 今日有 4 个会话文件被修改。 会话数据 "
        "自动生成于 2026-01-26 14:46 Claude CLI 不可用，仅生成基础数据",
        [1, 3, 4],
    )]
    assert texts(summary, "constraints") == []


def test_requests_sharing_one_sentence_stay_apart() -> None:
    summary = run(users(
        "Context: the nightly job failed. Check the logs. Fix the parser.",
        "Context: the nightly job failed. Check the config. Rerun the export.",
    ))
    assert texts(summary, "goals") == [
        "Context: the nightly job failed. Check the logs. Fix the parser.",
        "Context: the nightly job failed. Check the config. Rerun the export.",
    ]


# ------------------------------------------------- requests and pasted text, no rule


def test_requests_remarks_and_lint_output_are_no_constraints() -> None:
    summary = run(users(
        "请你检查当前分支的所有改动，我们把框架整体做了调整，具体可以看 "
        "./ai/intent/20260112-dynamic-price.md文档；",
        "hmmm, i don't really have any on the top of my head right now",
        "error 'unusedVar' is defined but never used no-unused-vars",
        "I don't want you to touch vendor/.",
        "不要改动 vendor 目录。",
    ))
    assert texts(summary, "constraints") == [
        "I don't want you to touch vendor/.", "不要改动 vendor 目录。",
    ]
    assert texts(summary, "goals") == [
        "请你检查当前分支的所有改动，我们把框架整体做了调整，具体可以看 "
        "./ai/intent/20260112-dynamic-price.md文档；",
        "hmmm, i don't really have any on the top of my head right now",
    ]


# -------------------------------------------------------------------- boilerplate


def test_image_placeholders_and_skill_texts_stay_out_of_the_summary() -> None:
    skill = (
        "Base directory for this skill: ~/.claude/skills/work-session\n\n# Work session\n"
        "**用户不需要记住**：\n- 不要手动运行 workend。\n- Never edit the log by hand.\n"
    )
    tagged = {"id": 3, "role": "user", "content": "# Roast\n- Don't sandwich praise.",
              "metadata": {"meta": True}}
    summary = run([
        *users(
            "这是今天的报告 [image image/png, ~77997 bytes, sha256:9739f3de32c87724, "
            "session-logs.jsonl line 271]",
            skill,
        ),
        tagged,
        {"id": 4, "role": "user", "content": "[image image/png, ~147360 bytes, sha256:"
         "0a1b2c3d4e5f6a7b, session-logs.jsonl line 300]"},
    ])
    assert texts(summary, "goals") == ["这是今天的报告"]
    assert texts(summary, "constraints") == []


# ---------------------------------------------------------------------- artifacts


def test_a_pull_brings_no_artifact_of_the_agent_and_a_push_does() -> None:
    summary = run([
        user(1, "拉一下最新代码，然后推送 feat/x"),
        assistant(2, None, call("c1", "Bash", command="git pull")),
        result(3, "c1", "From github.com:acme/app\n   e33d0e7..bd68183  main       -> "
               "origin/main\n * [new branch]      feat/esm-migrate -> "
               "origin/feat/esm-migrate\nUpdating e33d0e7..bd68183\nFast-forward"),
        assistant(4, None, call("c2", "Bash", command="git push -u origin feat/x")),
        result(5, "c2", "To github.com:acme/app.git\n * [new branch]      feat/x -> feat/x\n"),
    ])
    assert texts(summary, "artifacts") == ["branch feat/x"]


def test_a_heredoc_file_of_a_multi_line_command_is_written_whatever_ls_lists() -> None:
    script = (
        "mkdir -p ~/logs/intents\n\n# 创建 README 说明\n"
        "cat > ~/logs/intents/README.md << 'EOF'\n# Intent Documents\n\n示例：\n"
        "- `2026-01-21-auto-renewal.md`\nEOF\n\necho \"Created\"\nls -la ~/logs/"
    )
    summary = run([
        user(1, "Create the intents directory with a README."),
        assistant(2, None, call("c1", "Bash", command=script)),
        # a directory named "errors" in a listing, at 17:41, is no failure
        result(3, "c1", "Created\ntotal 8\ndrwxr-xr-x   4 me  staff   128 Jan 19 17:41 "
               "errors\ndrwxr-xr-x   3 me  staff    96 Jan 21 15:36 intents"),
    ])
    assert texts(summary, "artifacts") == ["wrote ~/logs/intents/README.md"]
    assert texts(summary, "errors") == []


# ------------------------------------------------------------ force without modals


def test_force_without_a_modal_verb_is_a_rule_and_a_guess_is_not() -> None:
    summary = run(users(
        "Strict mode is on — no `any` types, ever.",
        "Prefer `type` over `interface` unless declaration merging is needed.",
        "**Push to remote** - This is mandatory.",
        "There is no test for this yet.",
        "Which do you prefer?",
        "summary里的格式应该用旧的",
        "不需要加注释。",
        "这个应该没问题",
    ))
    assert texts(summary, "constraints") == [
        "Strict mode is on — no `any` types, ever.",
        "Prefer `type` over `interface` unless declaration merging is needed.",
        "**Push to remote** - This is mandatory.",
        "summary里的格式应该用旧的",
        "不需要加注释。",
    ]
    assert texts(summary, "goals") == [
        "There is no test for this yet.", "Which do you prefer?", "这个应该没问题",
    ]


# ------------------------------------------------------ corrections without cue words


def test_a_no_reply_and_a_counter_proposal_correct_the_choice() -> None:
    summary = run([
        user(1, "报价有效期的文案怎么写？"),
        assistant(2, "我会把文案写成「报价固化 5 分钟」。"),
        user(3, "什么叫固化，叫锁定不是更好吗"),
        user(4, "整理方式用新的按项目分组吧？"),
        assistant(5, "好的，我会改成按项目整理。"),
        user(6, "不，我希望用旧的，根据月份来整理；而且，summary里的格式应该用旧的"),
        user(7, "Wouldn't it be better to call it lock?"),
        # a bare "不，" and a question that proposes nothing change no value
        user(8, "不，"),
        user(9, "为什么不是按周？"),
    ])
    assert [(i.text, i.status) for i in summary.sections["constraints"]] == [
        ("什么叫固化，叫锁定不是更好吗", "current"),
        ("不，我希望用旧的，根据月份来整理；", "current"),
        ("而且，summary里的格式应该用旧的", "current"),
        ("Wouldn't it be better to call it lock?", "current"),
    ]
    assert texts(summary, "goals") == [
        "报价有效期的文案怎么写？", "整理方式用新的按项目分组吧？", "为什么不是按周？",
    ]


def test_a_no_reply_that_sets_a_new_value_replaces_the_old_one() -> None:
    summary = run(users("导出批次大小 500。", "不，导出批次大小 2000。"))
    assert [(i.text, i.status) for i in summary.sections["constraints"]] == [
        ("导出批次大小 500。", "superseded"), ("不，导出批次大小 2000。", "current"),
    ]


def test_slash_command_arguments_are_the_request_and_a_closing_do_not_no_rule() -> None:
    summary = run(users(
        "<command-message>reflect</command-message>\n<command-name>/reflect</command-name>\n"
        "<command-args>我希望强化反思这个skill，反思的内容都应该提交到github</command-args>",
        "<command-name>/clear</command-name>",
        "humans miss entries and let emotions win, agents do not",
    ))
    assert texts(summary, "constraints") == [
        "我希望强化反思这个skill，反思的内容都应该提交到github"
    ]
    assert texts(summary, "goals") == ["humans miss entries and let emotions win, agents do not"]


def test_the_arguments_of_a_setting_command_are_no_request() -> None:
    """`/model claude-opus-4-6-thinking` picks a model: its argument is no goal; a
    command of the person's own (`/orchestrator …`) still carries their request."""
    summary = run(users(
        "<command-name>/model</command-name>\n<command-message>model</command-message>\n"
        "<command-args>claude-opus-4-6-thinking</command-args>",
        "<command-name>/orchestrator</command-name>\n"
        "<command-message>orchestrator</command-message>\n"
        "<command-args>update the release notes</command-args>",
    ))
    assert texts(summary, "goals") == ["update the release notes"]

def test_a_terminal_wrapped_paste_and_an_unnumbered_first_item_are_read_whole() -> None:
    wrapped = (
        "❯ 请你检查当前分支的所有改动，具体可以看                    \n"
        "  ./ai/intent/price.md文档； 具体步骤： 1. 获取所有diff改动 2.      \n"
        "  根据intent文档做一次全面的review 3.                         \n"
        "  测试需要覆盖：代码优雅度、原功能测试   "
    )
    summary = run(users(
        wrapped,
        "yes, there is a live demo, number of agents - 2, backtests   2. perp markets .. "
        "not done yet 3. hmmm, i don't really have any on the top of my head right now",
        "I read page 2. You read page 3. Fine.",
        "更新\"报价锁定5分钟\"文案，符合 Final Freeze 方案",
        "use the <idea> and suggest me some great ideas",
        "Use port 8080.",
    ))
    # the prompt line copied from a terminal is evidence; no piece of its list is an item
    assert texts(summary, "goals") == [
        "yes, there is a live demo, number of agents - 2, backtests perp markets .. "
        "hmmm, i don't really have any on the top of my head right now",
        "I read page 2. You read page 3. Fine.",
        "更新\"报价锁定5分钟\"文案，符合 Final Freeze 方案",
        "use the <idea> and suggest me some great ideas",
    ]
    assert texts(summary, "open_items") == ["not done yet"]
    assert texts(summary, "constraints") == ["Use port 8080."]
