"""Hedged facts under a tight budget and the ids tools produced, small hand-written
sessions in English and Chinese: every Chinese hedge cue binds to its own clause, a
long restated setting gives up its reasons before any guess is lost, Chinese guesses
on one line cost no full stop, and a `git log` listing is one exact line of evidence.
"""

from __future__ import annotations

from typing import Any

import pytest
from summary_builders import assistant, call, result, user
from summary_builders import summarize as run

from ctxd.daemon.summarizers.builtin import BuiltinSummarizer
from ctxd.daemon.summarizers.guesses import join_guesses, split_guesses
from ctxd.daemon.summarizers.settings import setting_of
from ctxd.daemon.summarizers.short_settings import compact_setting
from ctxd.daemon.summary import Summary, SummaryItem, SummaryRequest


def items(summary: Summary) -> list[tuple[str, str, bool]]:
    return [(name, i.text, i.unconfirmed) for name, i in summary.items()]


def with_ordinals(
    messages: list[dict[str, Any]], previous: Summary | None = None, budget: int = 4000
) -> Summary:
    ids = [m["id"] for m in messages]
    if previous is not None:
        ids += [s for _, item in previous.items() for s in item.sources]
    request = SummaryRequest(
        session_id="s", previous=previous or Summary(), messages=messages, pins=[],
        instructions=None, budget_tokens=budget, count_tokens=lambda text: len(text) // 3,
        ordinals={i: i for i in ids},
    )
    return BuiltinSummarizer().summarize_sync(request)


# ------------------------------------------------------------------ hedge cues

CUES = ["可能", "也许", "好像", "似乎", "不确定", "还没确认", "我猜", "大概", "估计", "应该是",
        "未确认", "待确认"]


@pytest.mark.parametrize("cue", CUES)
def test_each_chinese_hedge_cue_after_a_comma_marks_its_own_clause_not_the_rule(
    cue: str,
) -> None:
    summary = run([user(1, f"不要修改 vendor 目录，{cue}缓存已经过期了。")])
    assert items(summary) == [
        ("constraints", "不要修改 vendor 目录", False),
        (_guess_section(cue), f"{cue}缓存已经过期了。", True),
    ]


def _guess_section(cue: str) -> str:
    # "应该是…" also reads as a setting ("应该是 30 秒"): hedged, it is a guess filed
    # with the rules, fitted and marked as the other guesses are
    return "constraints" if cue == "应该是" else "open_items"


@pytest.mark.parametrize("cue", CUES)
def test_each_chinese_hedge_cue_opening_the_next_sentence_is_a_guess_of_its_own(
    cue: str,
) -> None:
    summary = run([user(1, f"不要修改 vendor 目录。{cue}缓存已经过期了。")])
    assert items(summary) == [
        ("constraints", "不要修改 vendor 目录。", False),
        (_guess_section(cue), f"{cue}缓存已经过期了。", True),
    ]


@pytest.mark.parametrize("cue", ["不确定", "还没确认", "未确认", "待确认"])
def test_a_trailing_chinese_hedge_marks_the_guess_and_leaves_its_text(cue: str) -> None:
    summary = run([user(1, f"不要修改 vendor 目录。缓存已经过期了，{cue}。")])
    assert items(summary) == [
        ("constraints", "不要修改 vendor 目录。", False),
        ("open_items", "缓存已经过期了。", True),
    ]


def test_should_be_before_a_value_or_in_a_correction_is_firm() -> None:
    summary = run([
        user(1, "库存的批处理大小是 500 条。"),
        user(2, "不对，库存的批处理大小应该是 33555 条。"),
        user(3, "复盘会应该是周二上午。"),
        user(4, "结算的负责人应该是张三。"),
    ])
    assert [(n, t, u) for n, t, u in items(summary) if n == "constraints"] == [
        ("constraints", "库存的批处理大小是 500 条。", False),
        ("constraints", "不对，库存的批处理大小应该是 33555 条。", False),
        ("constraints", "复盘会应该是周二上午。", False),
        ("constraints", "结算的负责人应该是张三。", False),
    ]
    assert summary.sections["constraints"][0].status == "superseded"


def test_a_sentence_naming_its_own_subject_after_this_is_a_guess_not_a_hedge() -> None:
    summary = run([
        assistant(1, "支付的内存增长是事件总线导致的。这一点尚未确认。"),
        assistant(2, "这个超时可能是连接池导致的。"),
        user(3, "Do not push to main. Not sure the cache is stale."),
    ])
    assert items(summary) == [
        ("constraints", "Do not push to main.", False),
        ("open_items", "支付的内存增长是事件总线导致的。", True),
        ("open_items", "这个超时可能是连接池导致的。", True),
        ("open_items", "Not sure the cache is stale.", True),
    ]


# ------------------------------------------------------------- long settings

LONG = ("经过和运维团队的讨论并结合最近两周的线上监控数据，我们认为库存的缓存过期时间需要从原来的"
        " 12205 调整到 88121 分钟才能满足峰值需求。")


def test_a_long_chinese_setting_has_a_short_form_of_subject_and_value() -> None:
    short = compact_setting(LONG, setting_of(LONG, True))
    assert short == "库存的缓存过期时间：88121 分钟 (was 12205)"
    first = ("考虑到上游系统在月末结算期间的负载峰值以及我们和财务团队上周达成的一致意见，"
             "支付的到期窗口先定为 65612 天，后面再根据监控数据调整。")
    assert compact_setting(first, setting_of(first, True)) == "支付的到期窗口：65612 天"
    # short already, or a rule with deontic force: no short form
    plain = "物流的缓存过期时间调整为 69878 分钟，不是 66076。"
    assert compact_setting(plain, setting_of(plain, True)) is None
    rule = "数据库迁移必须在周五之前完成，熊猫团队负责审核，这是和财务团队上周达成的一致意见。"
    assert compact_setting(rule, setting_of(rule, True)) is None
    # another setting in the same sentence is more than a reason: kept whole
    two = ("经过和运维团队的讨论并结合最近两周的线上监控数据，库存的批处理大小需要调整到 800 条，"
           "熊猫团队负责审核。")
    assert compact_setting(two, setting_of(two, True)) is None


def test_under_the_budget_a_long_setting_gives_up_its_reasons_before_a_guess() -> None:
    messages = [user(1, LONG), user(2, "不要删除账本的审计表。")]
    guesses = [f"{svc}的内存增长可能是{thing}导致的。" for svc in ("支付", "搜索", "网关")
               for thing in ("连接池", "事件总线")]
    messages += [assistant(10 + i, g) for i, g in enumerate(guesses)]
    roomy = with_ordinals(messages)
    assert roomy.sections["constraints"][0].text == LONG
    need = len(roomy.render()) // 3
    # too small for the whole sentence, roomy enough for the short form and every guess
    tight = with_ordinals(messages, budget=need - 4)
    constraints = [i.text for i in tight.sections["constraints"]]
    assert constraints == ["库存的缓存过期时间：88121 分钟 (was 12205)", "不要删除账本的审计表。"]
    kept = [text for text, _ in split_guesses(tight.sections["open_items"][0], tight.ordinals)]
    assert kept == [g.removesuffix("。") for g in guesses]
    # the next compaction reads the short form back as the same setting: a later
    # value replaces it
    later = with_ordinals([user(30, "库存的缓存过期时间改到 500 分钟。")], previous=tight)
    by_text = {i.text: i.status for i in later.sections["constraints"]}
    assert by_text["库存的缓存过期时间：88121 分钟 (was 12205)"] == "superseded"
    assert by_text["库存的缓存过期时间改到 500 分钟。"] == "current"


# ------------------------------------------------------------- joined guesses


def test_chinese_guesses_on_a_line_drop_their_full_stop_and_come_apart_again() -> None:
    ordinals = {11: 3, 12: 5, 20: 9, 21: 12}
    lines = join_guesses([
        SummaryItem("搜索变慢可能是任务队列引起的。", [11], unconfirmed=True),
        # stated twice: both messages come with it, its pointer names the last
        SummaryItem("支付的内存增长是事件总线导致的。", [12, 20], unconfirmed=True),
        SummaryItem("网关重复事件的来源可能是连接池的重试。", [21], unconfirmed=True),
        SummaryItem("The slowdown is probably the pool.", [21], unconfirmed=True),
    ], ordinals)
    assert [i.line(ordinals) for i in lines] == [
        "- [推测] 搜索变慢可能是任务队列引起的 #3;支付的内存增长是事件总线导致的 #9;"
        "网关重复事件的来源可能是连接池的重试 #12",
        "- [unconfirmed] The slowdown is probably the pool. #12",
    ]
    assert split_guesses(lines[0], ordinals) == [
        ("搜索变慢可能是任务队列引起的", [11]),
        ("支付的内存增长是事件总线导致的", [12, 20]),
        ("网关重复事件的来源可能是连接池的重试", [21]),
    ]
    # without the ordinals the sources cannot be told apart: the line stays whole
    assert split_guesses(lines[0]) == [(lines[0].text, [11, 12, 20, 21])]


# ------------------------------------------------------------------ tool ids


def artifacts(summary: Summary) -> list[str]:
    return [i.text for i in summary.sections.get("artifacts", [])]


def test_a_git_log_listing_is_one_line_with_every_commit_exact_newest_first() -> None:
    shas = [f"{n:07x}" for n in range(0xA100000, 0xA100000 + 20)]
    listing = "\n".join(f"{sha} fix(ui): change number {n} of the dashboard cards"
                        for n, sha in enumerate(shas))
    summary = run([
        user(1, "看一下最近的提交。"),
        assistant(2, None, call("l1", "shell_command", command="git log --oneline -20")),
        result(3, "l1", listing),
    ])
    [line] = artifacts(summary)
    assert line.startswith(f"git log: {shas[0]} fix(ui): ")
    assert [part.split()[0] for part in line.removeprefix("git log: ").split("; ")] == shas
    assert len(line) <= 720
    # a later listing replaces it
    again = run([
        assistant(4, None, call("l2", "shell_command", command="git log --oneline -2")),
        result(5, "l2", "b000001 newest\nb000000 older"),
    ], previous=summary)
    assert artifacts(again) == ["git log: b000001 newest; b000000 older"]


def test_a_commit_made_by_a_call_whose_push_failed_is_kept() -> None:
    summary = run([
        assistant(1, None, call("c1", "Bash", command="git commit -am 'final' && git push")),
        result(2, "c1", "Exit code 1\n[main c83eea1] Final SUBMISSION.md\n 1 file changed\n"
                        "To https://github.com/acme/dash.git\n ! [rejected] main -> main "
                        "(fetch first)\nerror: failed to push some refs"),
    ])
    assert artifacts(summary) == ["commit c83eea1"]
    assert any("failed to push" in i.text for i in summary.sections["errors"])
