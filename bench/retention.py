"""Summary quality under repeated compaction: how many planted facts survive.

Long synthetic agent sessions (seeded; English or Chinese; tool calls, parallel calls,
approvals) carry planted facts: user constraints, corrections of earlier constraints,
file paths, decisions and numbers. Each session is driven chunk by chunk (append a
chunk of turns, compact, repeat), so every fact goes through many compactions (and,
for a summarizer subject to the drift bound, re-derivations from the archive). At the
end it measures, per summarizer and language:

- kept in context: the fact's key string is in the model input (`context_messages`:
  system messages, pins + summary, exact tail), for facts that are still current;
- recoverable: `search_past_messages` with the fact's key words returns the planted
  message among its top 5;
- superseded wrongly current: a value a later correction replaced is still in the
  context on a line not marked "[superseded]".

Only facts whose message has left the verbatim tail are counted (the last chunks of
each session plant nothing, so normally that is every fact).

    python bench/retention.py            # small: a few sessions per language
    python bench/retention.py --full     # more and longer sessions

The LLM summarizer is measured as well when `CTXD_OPENAI_BASE_URL` and
`CTXD_OPENAI_MODEL` are set and the daemon provides
`ctxd.daemon.summarizers.make_summarizer`; otherwise the report says why it was skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import json
import os
import platform
import random
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxd.daemon.config import Config, load_config
from ctxd.daemon.engine import Engine
from ctxd.daemon.recall import call_tool
from ctxd.protocol.errors import CtxdError

# Run as a script, the repository root is not on sys.path; `bench.retention_kinds` needs it.
if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import retention_kinds  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_SEED = 20240611

# current facts: they should stay visible; "superseded" ones should not look current
CURRENT_KINDS = ("constraint", "correction", "path", "decision", "number")
KINDS = (*CURRENT_KINDS, "superseded")
KIND_LABELS = {
    "constraint": "user constraint",
    "correction": "correction (new value)",
    "path": "file path",
    "decision": "decision",
    "number": "number",
    "superseded": "superseded (old value)",
}


@dataclass(frozen=True)
class Sizes:
    name: str
    sessions: int  # per language, built-in summarizer
    llm_sessions: int  # per language, LLM summarizer (every compaction is a model call)
    chunks: int  # one compaction after each
    turns_per_chunk: int
    facts_per_chunk: int
    quiet_chunks: int  # trailing chunks without facts, so every fact leaves the tail


SMALL = Sizes(
    "small",
    sessions=4,
    llm_sessions=1,
    chunks=12,
    turns_per_chunk=6,
    facts_per_chunk=3,
    quiet_chunks=2,
)
FULL = Sizes(
    "full",
    sessions=10,
    llm_sessions=3,
    chunks=30,
    turns_per_chunk=8,
    facts_per_chunk=3,
    quiet_chunks=2,
)


# --------------------------------------------------------------------------- facts


@dataclass
class Fact:
    kind: str
    key: str  # exact text looked for in the context
    query: str  # key words given to search_past_messages
    topic: str  # the same without the value (port, number, region...) the agent looks for
    chunk: int = -1
    message_id: int | None = None


@dataclass(frozen=True)
class Template:
    kind: str
    where: str  # "user", "final" (assistant answer), "call" (tool argument), "result"
    text: str
    key: str
    query: str

    def make(self, slots: dict[str, Any]) -> tuple[Fact, str]:
        query = self.query.format(**slots)
        topic = " ".join(_VALUE_SLOT.sub("", self.query).split()).format(**slots)
        fact = Fact(self.kind, self.key.format(**slots), query, topic or query)
        return fact, self.text.format(**slots)


# An agent searching its past knows what it is looking for ("the billing port"), not the
# value it lost; these slots hold such values.
_VALUE_SLOT = re.compile(r"\{(?:a|b|t1|t2|r1|r2|n|region|region2|ver|choice|tool|lib)\}")


T = Template

EN_SINGLE = (
    T(
        "constraint",
        "user",
        "Never deploy {svc} on Fridays.",
        "Never deploy {svc} on Fridays",
        "deploy {svc} Fridays",
    ),
    T(
        "constraint",
        "user",
        "Do not modify the {table} table directly.",
        "Do not modify the {table} table directly",
        "modify {table} table",
    ),
    T(
        "constraint",
        "user",
        "Always run {tool} before committing to {svc}.",
        "Always run {tool} before committing to {svc}",
        "{tool} committing {svc}",
    ),
    T(
        "constraint",
        "user",
        "Never log the {secret} of {svc} in plain text.",
        "Never log the {secret} of {svc} in plain text",
        "log {secret} {svc}",
    ),
    T(
        "constraint",
        "user",
        "All {svc} timestamps must be stored in UTC.",
        "All {svc} timestamps must be stored in UTC",
        "{svc} timestamps UTC",
    ),
    T(
        "constraint",
        "user",
        "Use {lib} for HTTP calls in {svc}, not {lib2}.",
        "Use {lib} for HTTP calls in {svc}",
        "{lib} HTTP {svc}",
    ),
    T(
        "decision",
        "final",
        "We'll use {choice} for the {svc} {thing}.",
        "We'll use {choice} for the {svc} {thing}",
        "{choice} {svc} {thing}",
    ),
    T(
        "decision",
        "final",
        "I decided to replace {old} with {choice} in the {svc} worker.",
        "replace {old} with {choice} in the {svc} worker",
        "replace {old} {choice} {svc}",
    ),
    T("path", "call", "", "{path}", "{path}"),
    T(
        "number",
        "user",
        "For the record, the {svc} p99 latency budget is {n} ms.",
        "{svc} p99 latency budget is {n} ms",
        "{svc} p99 latency budget {n}",
    ),
    T(
        "number",
        "user",
        "The {svc} nightly batch processes about {n} records.",
        "{svc} nightly batch processes about {n} records",
        "{svc} nightly batch {n}",
    ),
    T(
        "number",
        "result",
        "{svc} load test: {n} requests/s sustained over 10 minutes",
        "{svc} load test: {n} requests/s",
        "{svc} load test {n}",
    ),
)

EN_PAIRS = (
    (
        T(
            "superseded",
            "user",
            "Use port {a} for the {svc} service.",
            "Use port {a} for the {svc} service",
            "port {a} {svc}",
        ),
        T(
            "correction",
            "user",
            "Actually, use port {b} instead of {a} for the {svc} service.",
            "use port {b} instead of {a}",
            "port {b} {svc}",
        ),
    ),
    (
        T(
            "superseded",
            "user",
            "Set the {svc} request timeout to {t1} seconds.",
            "Set the {svc} request timeout to {t1} seconds",
            "{svc} timeout {t1}",
        ),
        T(
            "correction",
            "user",
            "No, change the {svc} request timeout to {t2} seconds.",
            "change the {svc} request timeout to {t2} seconds",
            "{svc} timeout {t2}",
        ),
    ),
    (
        T(
            "superseded",
            "user",
            "The {svc} data must stay in the {region} region.",
            "The {svc} data must stay in the {region} region",
            "{svc} data {region}",
        ),
        T(
            "correction",
            "user",
            "I meant the {region2} region for the {svc} data, not {region}.",
            "I meant the {region2} region for the {svc} data",
            "{svc} data {region2}",
        ),
    ),
    (
        T(
            "superseded",
            "user",
            "The {svc} client must retry {r1} times.",
            "The {svc} client must retry {r1} times",
            "{svc} retry {r1}",
        ),
        T(
            "correction",
            "user",
            "Scratch that: the {svc} client should retry {r2} times.",
            "the {svc} client should retry {r2} times",
            "{svc} retry {r2}",
        ),
    ),
)

ZH_SINGLE = (
    T("constraint", "user", "{svc}周五禁止部署。", "{svc}周五禁止部署", "{svc} 周五 部署"),
    T("constraint", "user", "不要直接修改{table}表。", "不要直接修改{table}表", "修改 {table}表"),
    T(
        "constraint",
        "user",
        "{svc}必须使用 Python {ver}。",
        "{svc}必须使用 Python {ver}",
        "{svc} Python {ver}",
    ),
    T(
        "constraint",
        "user",
        "提交{svc}的代码之前一定要先跑 {tool}。",
        "提交{svc}的代码之前一定要先跑 {tool}",
        "{svc} {tool} 提交",
    ),
    T(
        "constraint",
        "user",
        "{svc}的时间戳必须统一存成 UTC。",
        "{svc}的时间戳必须统一存成 UTC",
        "{svc} 时间戳 UTC",
    ),
    T(
        "constraint",
        "user",
        "不能在日志里明文打印{svc}的{secret}。",
        "不能在日志里明文打印{svc}的{secret}",
        "日志 {svc} {secret}",
    ),
    T(
        "decision",
        "final",
        "我们决定采用 {choice} 作为{svc}的{thing}。",
        "我们决定采用 {choice} 作为{svc}的{thing}",
        "{choice} {svc} {thing}",
    ),
    T(
        "decision",
        "final",
        "我们将改用 {choice} 来替换{svc}里的 {old}。",
        "我们将改用 {choice} 来替换{svc}里的 {old}",
        "{choice} {svc} {old}",
    ),
    T("path", "call", "", "{path}", "{path}"),
    T(
        "number",
        "user",
        "备注一下，{svc}的 p99 延迟预算是 {n} 毫秒。",
        "{svc}的 p99 延迟预算是 {n} 毫秒",
        "{svc} 延迟 预算 {n}",
    ),
    T(
        "number",
        "user",
        "{svc}每晚的批处理大约有 {n} 条记录。",
        "{svc}每晚的批处理大约有 {n} 条记录",
        "{svc} 批处理 {n}",
    ),
    T(
        "number",
        "result",
        "{svc} 压测结果：每秒 {n} 个请求，持续 10 分钟",
        "{svc} 压测结果：每秒 {n} 个请求",
        "{svc} 压测 {n}",
    ),
)

ZH_PAIRS = (
    (
        T(
            "superseded",
            "user",
            "{svc}服务必须使用端口 {a}。",
            "{svc}服务必须使用端口 {a}",
            "{svc} 端口 {a}",
        ),
        T(
            "correction",
            "user",
            "不对，{svc}服务改成端口 {b}。",
            "{svc}服务改成端口 {b}",
            "{svc} 端口 {b}",
        ),
    ),
    (
        T(
            "superseded",
            "user",
            "{svc}的请求超时设为 {t1} 秒。",
            "{svc}的请求超时设为 {t1} 秒",
            "{svc} 超时 {t1}",
        ),
        T(
            "correction",
            "user",
            "搞错了，{svc}的请求超时应该是 {t2} 秒。",
            "{svc}的请求超时应该是 {t2} 秒",
            "{svc} 超时 {t2}",
        ),
    ),
    (
        T(
            "superseded",
            "user",
            "{svc}的数据必须放在 {region} 区域。",
            "{svc}的数据必须放在 {region} 区域",
            "{svc} 数据 {region}",
        ),
        T(
            "correction",
            "user",
            "{svc}的数据不是放 {region}，而是放 {region2} 区域。",
            "而是放 {region2} 区域",
            "{svc} 数据 {region2}",
        ),
    ),
    (
        T(
            "superseded",
            "user",
            "{svc}客户端必须重试 {r1} 次。",
            "{svc}客户端必须重试 {r1} 次",
            "{svc} 重试 {r1}",
        ),
        T(
            "correction",
            "user",
            "应该是重试 {r2} 次，{svc}客户端改成这样。",
            "应该是重试 {r2} 次，{svc}客户端",
            "{svc} 重试 {r2}",
        ),
    ),
)

SERVICES = {
    "en": (
        "billing ledger search checkout inventory gateway notifications reporting "
        "scheduler payments media analytics recommendations fraud shipping catalog "
        "pricing onboarding"
    ).split(),
    "zh": (
        "计费 账本 搜索 结算 库存 网关 通知 报表 调度 支付 媒体 分析 推荐 风控 物流 "
        "商品目录 定价 开户"
    ).split(),
}
SLUGS = SERVICES["en"]
TABLES = {
    "en": "invoices users audit_log orders refunds sessions payouts coupons".split(),
    "zh": "发票 用户 审计日志 订单 退款 会话 打款 优惠券".split(),
}
THINGS = {
    "en": ["cache", "job queue", "event bus", "wire format", "read replica", "search index"],
    "zh": ["缓存", "任务队列", "事件总线", "传输格式", "只读副本", "搜索索引"],
}
SECRETS = {
    "en": ["API key", "session token", "password hash", "card number"],
    "zh": ["API 密钥", "会话令牌", "密码哈希", "银行卡号"],
}
CHOICES = "Redis PostgreSQL SQLite Kafka RabbitMQ gRPC protobuf msgpack Celery DuckDB".split()
OLD_TECH = "Memcached MySQL ZeroMQ Thrift pickle cron MongoDB Beanstalkd".split()
TOOLS = "ruff mypy black pytest eslint bandit".split()
LIBS = "httpx requests aiohttp urllib3".split()
REGIONS = "eu-west-1 eu-central-1 us-east-2 us-west-1 ap-south-1 ap-northeast-1".split()
PATH_DIRS = (
    "services/{slug}/config",
    "deploy/k8s/{slug}",
    "migrations/{slug}",
    "services/{slug}/handlers",
    "infra/terraform/{slug}",
)
PATH_FILES = (
    "{slug}_{n}.yaml",
    "settings_{n}.toml",
    "v{n}_add_index.sql",
    "retry_policy_{n}.py",
    "main_{n}.tf",
)


def fact_slots(rng: random.Random, lang: str) -> dict[str, Any]:
    a, b = rng.sample(range(3000, 9999), 2)
    t1, t2 = rng.sample(range(5, 120), 2)
    r1, r2 = rng.sample(range(2, 12), 2)
    region, region2 = rng.sample(REGIONS, 2)
    lib, lib2 = rng.sample(LIBS, 2)
    slug = rng.choice(SLUGS)
    n = rng.randint(120, 98_000)
    path = (
        rng.choice(PATH_DIRS).format(slug=slug)
        + "/"
        + rng.choice(PATH_FILES).format(slug=slug, n=rng.randint(10, 999))
    )
    return {
        "svc": rng.choice(SERVICES[lang]),
        "table": rng.choice(TABLES[lang]),
        "tool": rng.choice(TOOLS),
        "secret": rng.choice(SECRETS[lang]),
        "lib": lib,
        "lib2": lib2,
        "choice": rng.choice(CHOICES),
        "old": rng.choice(OLD_TECH),
        "thing": rng.choice(THINGS[lang]),
        "ver": rng.choice(["3.10", "3.11", "3.12", "3.13"]),
        "a": a,
        "b": b,
        "t1": t1,
        "t2": t2,
        "r1": r1,
        "r2": r2,
        "region": region,
        "region2": region2,
        "n": n,
        "path": path,
    }


# -------------------------------------------------------------------------- filler

EN_NOUNS = (
    "parser cache handler serializer migration fixture config loader retry policy "
    "queue consumer router middleware validator encoder index schema"
).split()
EN_VERBS = "refactor check fix rename simplify update review profile document test".split()
EN_ADJS = "empty stale flaky slow nested missing duplicate invalid".split()
EN_USER = (
    "Please {v} the {n} in {p}.",
    "Can you look at why {p} fails when the {n} is {a}?",
    "Make sure the {n} still works after the change.",
    "The {n} seems {a} again; {v} it please.",
    "Next, {v} the {n} and update the tests.",
    "Don't forget to {v} the {n} in {p}.",
    "What does the {n} in {p} do with {a} input?",
    "Now {v} the {n2} too, it has the same problem.",
)
EN_STEP = (
    "Let me read {p} first.",
    "I'll check the {n} and the tests together.",
    "Looking at the {n} callers.",
    None,
    None,
)
EN_FINAL = (
    "Done: {p} now handles the {a} {n} correctly.",
    "I updated the {n} in {p}; the tests pass.",
    "The {n} was {a} because the {n2} skipped it. Fixed in {p}.",
    "I'll keep the {n} as it is and {v} the {n2} instead.",
    "Let's revisit the {n} later; the {n2} is fine for now.",
    "TODO: {v} the {n} in {p} once the {n2} change lands.",
    "All green. The {n} change is in {p}.",
)
ZH_NOUNS = (
    "解析器 缓存 处理器 序列化器 迁移 测试夹具 配置 加载器 重试策略 队列 中间件 校验器 索引".split()
)
ZH_VERBS = "重构 检查 修复 重命名 简化 更新 审查 分析 测试".split()
ZH_ADJS = "空的 过期的 不稳定的 很慢的 嵌套的 缺失的 重复的 无效的".split()
ZH_USER = (
    "请{v}一下{p}里的{n}。",
    "为什么{p}在{n}是{a}时会失败？",
    "改完之后确认{n}还能正常工作。",
    "{n}好像又是{a}，帮我{v}一下。",
    "接下来{v}{n}，再更新测试。",
    "别忘了{v}{p}里的{n}。",
    "{p}里的{n}遇到{a}输入会怎样？",
    "顺便把{n2}也{v}一下，它有同样的问题。",
)
ZH_STEP = ("我先看一下{p}。", "我同时检查{n}和测试。", "看看{n}的调用方。", None, None)
ZH_FINAL = (
    "好了，{p}里的{a}{n}现在处理正确了。",
    "已经更新了{p}里的{n}，测试通过。",
    "{n}出问题是因为{n2}跳过了它，已在{p}里修复。",
    "我会先保留{n}，改为{v}{n2}。",
    "{n}以后再看，{n2}目前没问题。",
    "待办：{n2}合入之后再{v}{p}里的{n}。",
    "全部通过，{n}的改动在{p}。",
)
FILLER_DIRS = "src/app src/app/core src/app/api tests tests/unit scripts docs tools".split()
FILLER_STEMS = (
    "engine store models views utils parser cache queue worker routes "
    "settings helpers cli client server"
).split()
FILLER_EXTS = (".py", ".py", ".py", ".md", ".toml", ".json")
GATED_COMMANDS = (
    "make deploy ENV=staging",
    "kubectl rollout restart deploy/api",
    "rm -rf build/ dist/",
    "git push --force-with-lease origin main",
    "terraform apply -auto-approve",
)
DENY_REASONS = ("not during business hours", "wait for the review first", "wrong environment")


@dataclass
class Call:
    name: str
    args: dict[str, Any]
    result: str
    gated: bool = False
    facts: list[Fact] = field(default_factory=list)  # planted in the arguments
    result_facts: list[Fact] = field(default_factory=list)  # planted in the result


@dataclass
class Step:
    text: str | None
    calls: list[Call]


@dataclass
class Turn:
    user: str
    steps: list[Step]
    final: str
    user_facts: list[Fact] = field(default_factory=list)
    final_facts: list[Fact] = field(default_factory=list)


class SessionWriter:
    """Seeded filler turns in one language, with facts planted where asked."""

    def __init__(self, rng: random.Random, lang: str) -> None:
        self.rng = rng
        self.lang = lang
        self.en = lang == "en"

    def _words(self) -> dict[str, str]:
        rng = self.rng
        nouns = EN_NOUNS if self.en else ZH_NOUNS
        n, n2 = rng.sample(nouns, 2)
        path = f"{rng.choice(FILLER_DIRS)}/{rng.choice(FILLER_STEMS)}{rng.choice(FILLER_EXTS)}"
        return {
            "n": n,
            "n2": n2,
            "v": rng.choice(EN_VERBS if self.en else ZH_VERBS),
            "a": rng.choice(EN_ADJS if self.en else ZH_ADJS),
            "p": path,
        }

    def _say(self, templates: Sequence[str | None]) -> str | None:
        t = self.rng.choice(templates)
        return None if t is None else t.format(**self._words())

    def _filler_call(self) -> Call:
        rng = self.rng
        w = self._words()
        kind = rng.random()
        if kind < 0.4:
            code = "\n".join(
                f"def {rng.choice(FILLER_STEMS)}_{i}(value):\n    return value"
                for i in range(rng.randint(3, 14))
            )
            return Call("read_file", {"path": w["p"]}, code)
        if kind < 0.55:
            hits = "\n".join(
                f"{w['p']}:{rng.randint(1, 400)}: {w['n']} = {w['n2']}()" for _ in range(4)
            )
            return Call("grep", {"pattern": w["n"], "path": w["p"].rsplit("/", 1)[0]}, hits)
        if kind < 0.85:
            if rng.random() < 0.2:
                out = (
                    f"FAILED tests/test_{rng.choice(FILLER_STEMS)}.py::test_{w['n']} - "
                    f"AssertionError: expected {rng.randint(1, 9)}, got {rng.randint(10, 99)}"
                    f"\n1 failed, {rng.randint(20, 200)} passed"
                )
            else:
                out = f"{rng.randint(20, 300)} passed in {rng.uniform(0.3, 9):.2f}s"
            return Call("run_shell", {"command": f"pytest -q {w['p']}"}, out)
        if kind < 0.95:
            body = f"# {w['n']}\nVALUE = {rng.randint(1, 99)}\n"
            return Call("write_file", {"path": w["p"], "content": body}, "ok")
        listing = "\n".join(
            f"{rng.choice(FILLER_STEMS)}{rng.choice(FILLER_EXTS)}" for _ in range(6)
        )
        return Call("list_dir", {"path": w["p"].rsplit("/", 1)[0]}, listing)

    def turn(self, plants: Sequence[tuple[Template, dict[str, Any]]]) -> Turn:
        rng = self.rng
        steps: list[Step] = []
        for _ in range(rng.choice((1, 1, 2, 2, 3))):
            calls = [self._filler_call() for _ in range(rng.choice((1, 1, 1, 2, 3)))]
            steps.append(Step(self._say(EN_STEP if self.en else ZH_STEP), calls))
        if rng.random() < 0.25:
            # a gated command the user has to approve (or deny) before it runs
            cmd = rng.choice(GATED_COMMANDS)
            steps[-1].calls.append(Call("run_shell", {"command": cmd}, "exit 0", gated=True))
        user = self._say(EN_USER if self.en else ZH_USER) or ""
        final = self._say(EN_FINAL if self.en else ZH_FINAL) or ""
        turn = Turn(user, steps, final)
        for template, slots in plants:
            fact, text = template.make(slots)
            if template.where == "user":
                # the fact opens the message, the request follows, as users write them
                sep = " " if self.en else ""
                turn.user = f"{text}{sep}{turn.user}"
                turn.user_facts.append(fact)
            elif template.where == "final":
                sep = " " if self.en else ""
                turn.final = f"{turn.final}{sep}{text}"
                turn.final_facts.append(fact)
            elif template.where == "call":
                name = rng.choice(("read_file", "write_file"))
                args: dict[str, Any] = {"path": fact.key}
                if name == "write_file":
                    args["content"] = "# generated\n"
                call = Call(name, args, "ok" if name == "write_file" else "key: value\n")
                call.facts.append(fact)
                # alongside filler calls: a parallel call
                steps[0].calls.insert(rng.randint(0, len(steps[0].calls)), call)
            else:  # result
                call = Call("run_shell", {"command": "make loadtest"}, f"{text}\nexit 0")
                call.result_facts.append(fact)
                steps[-1].calls.append(call)
        return turn


# --------------------------------------------------------------------------- plan


def plan_session(
    rng: random.Random, lang: str, sizes: Sizes
) -> list[list[list[tuple[Template, dict[str, Any]]]]]:
    """plan[chunk][turn] = the facts planted in that turn (template and slot values)."""
    singles = EN_SINGLE if lang == "en" else ZH_SINGLE
    pairs = EN_PAIRS if lang == "en" else ZH_PAIRS
    last_fact_chunk = sizes.chunks - sizes.quiet_chunks - 1
    plan: list[list[list[tuple[Template, dict[str, Any]]]]] = [
        [[] for _ in range(sizes.turns_per_chunk)] for _ in range(sizes.chunks)
    ]
    used: set[str] = set()

    def fresh(templates: Sequence[Template]) -> dict[str, Any] | None:
        # distinct keys, so a hit or a match is this fact's and no other's; None when
        # this template's values are used up (long sessions), to pick another
        for _ in range(50):
            slots = fact_slots(rng, lang)
            keys = [t.key.format(**slots) for t in templates]
            if not any(k in used or any(k in u or u in k for u in used) for k in keys):
                used.update(keys)
                return slots
        return None

    def place(chunk: int, template: Template, slots: dict[str, Any], after: int = -1) -> int:
        turn = rng.randint(after + 1, sizes.turns_per_chunk - 1)
        plan[chunk][turn].append((template, slots))
        return turn

    last_turn = sizes.turns_per_chunk - 1
    for chunk in range(last_fact_chunk + 1):
        for _ in range(sizes.facts_per_chunk):
            pair = rng.random() < 0.3 and chunk < last_fact_chunk
            for _ in range(100):
                chosen = rng.choice(pairs) if pair else (rng.choice(singles),)
                slots = fresh(chosen)
                if slots is not None:
                    break
            else:
                raise RuntimeError("cannot find distinct fact values; widen the pools")
            if len(chosen) == 2:
                old, new = chosen
                turn = place(chunk, old, slots)
                # the correction comes in a later turn of the same chunk or up to three
                # chunks later
                later = min(last_fact_chunk, chunk + rng.randint(0, 3))
                if later == chunk and turn == last_turn:
                    later += 1
                place(later, new, slots, turn if later == chunk else -1)
            else:
                place(chunk, chosen[0], slots)
    return plan


# -------------------------------------------------------------------------- driving


@dataclass
class SessionResult:
    facts: list[Fact]
    eligible: list[Fact]  # facts that left the verbatim tail
    kept: dict[int, bool]
    recovered: dict[int, bool]
    recovered_by_topic: dict[int, bool]
    wrongly_current: dict[int, bool]
    marked_superseded: dict[int, bool]
    compactions: int
    effective: int
    failed: int
    rederived: int
    summary_tokens: int
    messages: int


class Driver:
    def __init__(self, engine: Engine, writer: SessionWriter, rng: random.Random) -> None:
        self.engine = engine
        self.writer = writer
        self.rng = rng
        self.calls = 0

    def _append(self, sid: str, run_id: str, msgs: list[dict[str, Any]]) -> list[int]:
        return list(self.engine.append(sid, msgs, run_id=run_id)["messageIds"])

    def play(self, sid: str, chunk: int, turn: Turn) -> list[Fact]:
        e = self.engine
        planted: list[Fact] = []
        run_id = e.start_run(sid)["runId"]
        [uid] = self._append(sid, run_id, [{"role": "user", "content": turn.user}])
        for f in turn.user_facts:
            f.message_id, f.chunk = uid, chunk
            planted.append(f)
        for step in turn.steps:
            ids: list[str] = []
            tool_calls = []
            for call in step.calls:
                self.calls += 1
                cid = f"call_{self.calls}"
                ids.append(cid)
                tool_calls.append(
                    {
                        "id": cid,
                        "type": "function",
                        "function": {
                            "name": call.name,
                            "arguments": json.dumps(call.args, ensure_ascii=False),
                        },
                    }
                )
            [aid] = self._append(
                sid, run_id, [{"role": "assistant", "content": step.text, "tool_calls": tool_calls}]
            )
            for call, cid in zip(step.calls, ids, strict=True):
                for f in call.facts:
                    f.message_id, f.chunk = aid, chunk
                    planted.append(f)
                if call.gated:
                    approval = e.request_approval(sid, run_id, cid, call.name, call.args)
                    if self.rng.random() < 0.8:
                        e.resolve_approval(approval["approvalId"], "approved")
                    else:
                        reason = self.rng.choice(DENY_REASONS)
                        e.resolve_approval(approval["approvalId"], "denied", reason)
                        call.result = f"Denied by the user: {reason}"
            results = [
                {"role": "tool", "tool_call_id": cid, "content": call.result}
                for call, cid in zip(step.calls, ids, strict=True)
            ]
            rids = self._append(sid, run_id, results)
            for call, rid in zip(step.calls, rids, strict=True):
                for f in call.result_facts:
                    f.message_id, f.chunk = rid, chunk
                    planted.append(f)
        [fid] = self._append(sid, run_id, [{"role": "assistant", "content": turn.final}])
        for f in turn.final_facts:
            f.message_id, f.chunk = fid, chunk
            planted.append(f)
        e.finish_run(run_id, "completed")
        return planted


def context_text(engine: Engine, sid: str) -> str:
    """What the model reads: every message's text, tool calls with their arguments."""
    parts: list[str] = []
    for m in engine.context_messages(sid):
        content = m.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(p.get("text", "") for p in content if isinstance(p, dict))
        for call in m.get("tool_calls") or ():
            fn = call["function"]
            parts.append(f"{fn['name']} {fn.get('arguments', '')}")
    return "\n".join(parts)


def found(engine: Engine, sid: str, query: str, message_id: int | None) -> bool:
    """Whether `search_past_messages` lists the message among its top 5 for `query`."""
    hits = call_tool(engine, sid, "search_past_messages", {"query": query, "limit": 5})
    return any(h["messageId"] == message_id for h in hits["data"]["hits"])


async def run_session(
    engine: Engine, lang: str, sizes: Sizes, rng: random.Random, title: str
) -> SessionResult:
    sid = engine.create_session(title=title)["sessionId"]
    writer = SessionWriter(rng, lang)
    driver = Driver(engine, writer, rng)
    prompt = (
        "You are a coding agent working in the user's repository."
        if lang == "en"
        else "你是在用户代码仓库里工作的编程助手。"
    )
    engine.append(sid, [{"role": "system", "content": prompt}])
    facts: list[Fact] = []
    compactions = effective = failed = rederived = 0
    for chunk, turns in enumerate(plan_session(rng, lang, sizes)):
        for plants in turns:
            facts += driver.play(sid, chunk, writer.turn(plants))
        compactions += 1
        try:
            result = await engine.compact(sid)
        except CtxdError as exc:
            failed += 1
            print(f"  compaction {chunk + 1} of {title} failed: {exc.message}", file=sys.stderr)
            continue
        effective += bool(result["effective"])
        rederived += bool(result.get("rederived"))

    st = engine.context_state(sid)
    tail_start = st.tail_start_id if st.tail_start_id is not None else 1 << 62
    eligible = [f for f in facts if f.message_id is not None and f.message_id < tail_start]
    text = context_text(engine, sid)
    lines = text.splitlines()
    kept: dict[int, bool] = {}
    recovered: dict[int, bool] = {}
    by_topic: dict[int, bool] = {}
    wrongly: dict[int, bool] = {}
    marked: dict[int, bool] = {}
    for f in eligible:
        k = id(f)
        holding = [line for line in lines if f.key in line]
        kept[k] = bool(holding)
        current_lines = [line for line in holding if "[superseded]" not in line]
        if f.kind == "superseded":
            wrongly[k] = bool(current_lines)
        else:
            marked[k] = bool(holding) and not current_lines
        recovered[k] = found(engine, sid, f.query, f.message_id)
        by_topic[k] = found(engine, sid, f.topic, f.message_id)
    return SessionResult(
        facts=facts,
        eligible=eligible,
        kept=kept,
        recovered=recovered,
        recovered_by_topic=by_topic,
        wrongly_current=wrongly,
        marked_superseded=marked,
        compactions=compactions,
        effective=effective,
        failed=failed,
        rederived=rederived,
        summary_tokens=st.summary_tokens,
        messages=engine.archive.message_count(sid),
    )


# ------------------------------------------------------------------------ reporting


def pct(num: int, den: int) -> str:
    return f"{100 * num / den:.0f}%" if den else "—"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


@dataclass
class Block:
    summarizer: str
    lang: str
    results: list[SessionResult]
    seconds: float

    def facts(self, pick: Callable[[Fact], bool]) -> list[tuple[SessionResult, Fact]]:
        return [(r, f) for r in self.results for f in r.eligible if pick(f)]

    def row(self, label: str, pick: Callable[[Fact], bool]) -> list[str]:
        chosen = self.facts(pick)
        current = [(r, f) for r, f in chosen if f.kind != "superseded"]
        old = [(r, f) for r, f in chosen if f.kind == "superseded"]
        return [
            label,
            str(len(chosen)),
            pct(sum(r.kept[id(f)] for r, f in current), len(current)),
            pct(sum(r.recovered[id(f)] for r, f in chosen), len(chosen)),
            pct(sum(r.recovered_by_topic[id(f)] for r, f in chosen), len(chosen)),
            pct(sum(r.wrongly_current[id(f)] for r, f in old), len(old)),
            pct(sum(r.marked_superseded[id(f)] for r, f in current), len(current)),
        ]

    def render(self) -> str:
        headers = [
            "Facts",
            "Planted",
            "Kept in context",
            "Recoverable (top 5)",
            "Recoverable, topic words only",
            "Superseded wrongly current",
            "Current marked superseded",
        ]
        rows = [self.row(KIND_LABELS[k], lambda f, k=k: f.kind == k) for k in KINDS]
        total = self.row("**all**", lambda f: True)
        rows.append([f"**{c}**" if i else c for i, c in enumerate(total)])
        sessions = len(self.results)
        msgs = sum(r.messages for r in self.results)
        comp = sum(r.compactions for r in self.results)
        eff = sum(r.effective for r in self.results)
        failed = sum(r.failed for r in self.results)
        reder = sum(r.rederived for r in self.results)
        planted = sum(len(r.facts) for r in self.results)
        left = sum(len(r.eligible) for r in self.results)
        tokens = sorted(r.summary_tokens for r in self.results)
        lang = "English" if self.lang == "en" else "Chinese"
        note = (
            f"{sessions} sessions, {msgs:,} messages, {comp} compactions ({eff} effective, "
            f"{reder} re-derived from the archive, {failed} failed); "
            f"{left} of {planted} planted facts had left the tail and are counted; "
            f"pins + summary at the end {tokens[0]:,}–{tokens[-1]:,} tokens; "
            f"{self.seconds:.1f} s."
        )
        return f"### {self.summarizer}, {lang}\n\n{note}\n\n{table(headers, rows)}\n"

    def age_row(self) -> list[str]:
        cells = [f"{self.summarizer}, {self.lang}"]
        for lo, hi in AGE_BUCKETS:
            chosen = [
                (r, f)
                for r, f in self.facts(lambda f: f.kind != "superseded")
                if lo <= r.compactions - f.chunk <= hi
            ]
            kept = sum(r.kept[id(f)] for r, f in chosen)
            cells.append(f"{pct(kept, len(chosen))} ({len(chosen)})" if chosen else "—")
        return cells


AGE_BUCKETS = ((1, 3), (4, 6), (7, 10), (11, 20), (21, 1 << 30))


def age_table(blocks: Sequence[Block]) -> str:
    headers = ["Summarizer, language"] + [
        f"{lo}–{hi}" if hi < 1 << 20 else f"{lo}+" for lo, hi in AGE_BUCKETS
    ]
    return table(headers, [b.age_row() for b in blocks])


# ----------------------------------------------------------------------------- main


def llm_summarizer(data_dir: Path) -> tuple[Any, Config] | str:
    """The configured LLM summarizer, or the reason it is not measured."""
    if not (os.environ.get("CTXD_OPENAI_BASE_URL") and os.environ.get("CTXD_OPENAI_MODEL")):
        return "not measured: set CTXD_OPENAI_BASE_URL and CTXD_OPENAI_MODEL to an endpoint"
    try:
        from ctxd.daemon.summarizers import make_summarizer
    except ImportError:
        return "not measured: this version has no ctxd.daemon.summarizers.make_summarizer"
    try:
        cfg = load_config(overrides={"data_dir": str(data_dir), "summarizer": "openai"})
        return make_summarizer(cfg), cfg
    except ValueError as exc:
        return f"not measured: its configuration is refused: {exc}"


async def measure(
    name: str,
    lang: str,
    sessions: int,
    sizes: Sizes,
    seed: int,
    root: Path,
    summarizer: Any = None,
    config: Config | None = None,
) -> Block:
    data_dir = root / f"{name}-{lang}"
    cfg = config or Config(data_dir=data_dir)
    cfg.data_dir = data_dir
    engine = Engine(cfg, summarizer=summarizer)
    started = time.monotonic()
    results = []
    try:
        for i in range(sessions):
            # the same seed per (language, session) for every summarizer: same sessions
            rng = random.Random(f"{seed}/{lang}/{i}")
            results.append(await run_session(engine, lang, sizes, rng, f"{lang}-{i}"))
    finally:
        engine.close()
    return Block(name, lang, results, time.monotonic() - started)


async def main_async(args: argparse.Namespace) -> str:
    sizes = FULL if args.full else SMALL
    if args.sessions:
        sizes = dataclasses.replace(sizes, sessions=args.sessions)
    root = Path(tempfile.mkdtemp(prefix="ctxd-retention-"))
    blocks: list[Block] = []
    notes: list[str] = [
        "*Current marked superseded* counts each planted pair on its own, but the generator "
        "may later plant another value for the same setting (\"Scratch that: the media "
        "client should retry 3 times\" after the pair that set it to 2). The summary "
        "supersedes by subject and value, so such a correction is marked superseded by the "
        "later one, as it should be; those are the cases this column shows."
    ]
    try:
        for lang in ("en", "zh"):
            blocks.append(await measure("builtin", lang, sizes.sessions, sizes, args.seed, root))
            print(blocks[-1].render(), flush=True)
        llm = llm_summarizer(root / "llm")
        if isinstance(llm, str):
            notes.append(f"LLM summarizer {llm}.")
            print(f"LLM summarizer {llm}.", flush=True)
        else:
            summarizer, cfg = llm
            label = f"llm ({cfg.openai.model})"
            for lang in ("en", "zh"):
                block = await measure(
                    label, lang, sizes.llm_sessions, sizes, args.seed, root, summarizer, cfg
                )
                blocks.append(block)
                print(block.render(), flush=True)
        kinds = await retention_kinds.measure(args.kinds_sessions, args.seed)
        print(kinds[1], flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return report(blocks, notes, sizes, args.seed) + kinds_section(kinds)


def kinds_section(after: tuple[str, str]) -> str:
    """The kinds-of-facts measures (bench/retention_kinds.py), before and after."""
    before = RESULTS / "retention-kinds-before.md"
    parts = [
        "",
        "### Kinds of facts: latest values, hedges, the agent's own artifacts",
        "",
        "From `bench/retention_kinds.py` (its own generator): settings restated in varied "
        "words (cue-word corrections, plain updates, \"X, not Y\", long Chinese sentences), "
        "hedged conclusions (a trailing hedge cut by the length limit, a hedge in the next "
        "sentence), files the agent's tools wrote and the commit hashes, PR numbers and job "
        "ids they returned among paths merely mentioned, hard constraints. Checked after "
        "every compaction.",
        "",
    ]
    if before.exists():
        parts += ["**Before**: " + before.read_text().strip(), ""]
    parts += ["**After** (this revision): " + after[0], "", after[1], ""]
    return "\n".join(parts)


def report(blocks: Sequence[Block], notes: Sequence[str], sizes: Sizes, seed: int) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    per_session = sizes.chunks * sizes.turns_per_chunk
    cmd = "python bench/retention.py" + (" --full" if sizes.name == "full" else "")
    parts = [
        f"# Summary retention ({sizes.name})",
        "",
        f"Date: {now}. Seed: {seed}. Python {platform.python_version()}, "
        f"{platform.platform()}. Run with `{cmd} --seed {seed}`.",
        "",
        f"Each session: {sizes.chunks} chunks of {sizes.turns_per_chunk} agent turns "
        f"({per_session} turns: user request, one to three model steps with single or "
        "parallel tool calls, a quarter of turns with an approved or denied gated command, "
        f"a final answer), about {sizes.facts_per_chunk} planted facts per chunk except the "
        f"last {sizes.quiet_chunks}, and a compaction (default policy: keep about 24 "
        "messages, summary budget 2,000 tokens; a summarizer that can drift re-derives "
        "from the archive after 8 incremental compactions) after every chunk. Measured "
        "after the last compaction.",
        "",
        "- **Kept in context**: the fact's exact key string is in the model input "
        "(`Engine.context_messages`: system messages, pins + summary, tail), for current "
        "facts (all but superseded values).",
        "- **Recoverable (top 5)**: `search_past_messages` with the fact's key words "
        "returns the planted message among its 5 hits. *Topic words only*: the same "
        "query without the value the agent has lost (`port billing` rather than "
        "`port 8080 billing`), so the planted message competes with its look-alikes "
        "(the correction of the same setting, other services' values).",
        "- **Superseded wrongly current**: an old value a later correction replaced is "
        "in the context on a line without `[superseded]`.",
        "- **Current marked superseded**: a current fact appears only on lines marked "
        "`[superseded]` (an unrelated correction took it along).",
        "",
        "Matching is by exact string, which suits an extractive summary; a model that "
        "keeps a fact in other words counts as having lost it.",
        "",
    ]
    parts += [b.render() for b in blocks]
    parts += [
        "### Kept in context by age",
        "",
        "Share of current facts kept, by the number of compactions since the fact's chunk "
        "(facts counted in parentheses).",
        "",
        age_table(blocks),
        "",
    ]
    if notes:
        parts += ["### Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", action="store_true", help="more and longer sessions")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--sessions", type=int, help="sessions per language (built-in)")
    ap.add_argument(
        "--kinds-sessions", type=int, default=2, help="sessions per language, kinds of facts"
    )
    ap.add_argument("--out", type=Path, default=RESULTS / "retention.md")
    args = ap.parse_args()
    text = asyncio.run(main_async(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
