"""What is not a constraint, in the shapes the real transcripts showed: a spec or a
review pasted in as a long message (its settings describe the work), a quoted line,
"to ensure" saying what for, a long statement that happens to hold a number. Small
hand-written sessions in English and Chinese, asserting on the exact items."""

from __future__ import annotations

from typing import Any

from summary_builders import summarize as run

from ctxd.daemon.summary import Summary


def users(*texts: str) -> list[dict[str, Any]]:
    return [{"id": 1 + i, "role": "user", "content": t} for i, t in enumerate(texts)]


def texts(summary: Summary, section: str) -> list[str]:
    return [i.text for i in summary.sections.get(section, [])]


SPEC_EN = "\n".join([
    "Build the prediction market contract from this spec.",
    "## Contract",
    "- Store in markets[marketId]",
    "- Set market.status = PROPOSED",
    "- Set FEE_RECIPIENT = deployer.address",
    "- chainId: 420420417",
    "- refetchInterval: 10000 (10s)",
    "- Use skeleton cards matching the shape of MarketCard",
    "- Never deploy to mainnet from this branch.",
    "## Frontend",
    "- Markets grid: 3 columns desktop, 1 mobile",
    "- Question textarea (max 280 chars, live counter below)",
    "- Updates every 60 seconds",
])

REVIEW_ZH = "\n".join([
    "1. 窗口結束時存活率有個反向問題",
    "不是太弱，而是對所有人都太強，survival rate 可能普遍接近 100%。",
    "對 PR 開出時間做 exposure normalization：第 5 天的 PR 有 85 天暴露。",
    "2. 無語意 PR 過濾要小心誤殺",
    "只用 typo / 空白 / comment 當排除條件還行。",
    "更穩健的做法是用 AST-level diff 當補充條件。",
    "3. 敘述的風險",
    "所有 Top 5 看起來都會像 mission-critical 員工。",
    "沒 evidence 的句子不准生成。",
    "4. 外部 issue",
    "一個 maintainer 一週回了 30 個 user issue。",
    "5. Bot 排除",
    "GitHub API 有 user.type 欄位。",
])


def test_a_long_spec_or_review_sets_nothing_only_its_rules_are_constraints() -> None:
    summary = run(users(SPEC_EN, REVIEW_ZH))
    assert texts(summary, "constraints") == [
        "Never deploy to mainnet from this branch.",
        "沒 evidence 的句子不准生成。",
    ]
    # the spec is a request: its opening is the goal
    assert texts(summary, "goals")[0].startswith(
        "Build the prediction market contract from this spec.")


def test_the_same_lines_alone_are_still_settings() -> None:
    summary = run(users(
        "Set FEE_RECIPIENT = deployer.address",
        "Use skeleton cards matching the shape of MarketCard.",
        "refetchInterval: 10000",
        "连接池上限 100。",
    ))
    assert texts(summary, "constraints") == [
        "Set FEE_RECIPIENT = deployer.address",
        "Use skeleton cards matching the shape of MarketCard.",
        "refetchInterval: 10000",
        "连接池上限 100。",
    ]


def test_quoted_lines_are_someone_elses_words() -> None:
    summary = run(users(
        "refine this message for the pitch:\n"
        "> Platforms charge 10-30% flat on your income.\n"
        "> Never pay setup fees again.",
        "帮我改一下这段文案：\n> 连接池上限 100。\n> 平台只收 2% 手续费。",
    ))
    assert texts(summary, "constraints") == []
    assert texts(summary, "goals") == [
        "refine this message for the pitch: Platforms charge 10-30% flat on your income. "
        "Never pay setup fees again.",
        "帮我改一下这段文案： 连接池上限 100。 平台只收 2% 手续费。",
    ]


def test_to_ensure_and_to_avoid_say_what_for() -> None:
    summary = run(users(
        "Read references/dev-environment-setup.md to ensure the dev environment is ready.",
        "先阅读部署文档，以确保环境就绪。",
        "Make sure the migrations run before the tests.",
        "确保迁移先于测试运行。",
        "Reuse the existing command presets to avoid reinventing workflows.",
        "Avoid heavy animations.",
    ))
    assert texts(summary, "constraints") == [
        "Make sure the migrations run before the tests.",
        "确保迁移先于测试运行。",
        "Avoid heavy animations.",
    ]
    assert texts(summary, "goals") == [
        "Read references/dev-environment-setup.md to ensure the dev environment is ready.",
        "先阅读部署文档，以确保环境就绪。",
        "Reuse the existing command presets to avoid reinventing workflows.",
    ]


def test_a_long_statement_with_a_number_sets_nothing() -> None:
    summary = run(users(
        "Most Indonesians can't invest in property because the minimum is 10,000 dollars.",
        "很多创作者离开这个平台是因为平台对他们的全部收入收取了大约百分之三十的费用。",
        "export batch 500 rows.",
        "The export batch needs to be 2000 rows, not 500.",
    ))
    assert [(i.text, i.status) for i in summary.sections["constraints"]] == [
        ("export batch 500 rows.", "superseded"),
        ("The export batch needs to be 2000 rows, not 500.", "current"),
    ]
