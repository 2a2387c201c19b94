"""Planted facts of the retention benchmark: kinds, templates (English and Chinese),
the value pools and the session sizes."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

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
