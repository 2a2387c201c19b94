"""A seeded generator of realistic agent chat histories, for benchmarks.

The messages are OpenAI-shaped and come in the order an agent produces them: a system
prompt, then runs of a user request, model steps with single or parallel tool calls
(each call followed by its `tool` result), and a final answer. About a third of the
natural-language text is Chinese. Tool results are mostly small (JSON, short command
output) with a long tail of file contents and logs up to tens of KB.

Text is assembled from pools of sentences and code lines built once per generator from
word lists, so a message costs a handful of random choices: producing 100k messages
takes a small fraction of the time needed to archive them.

Marker words let search benchmarks ask queries with known selectivity:
`RARE_WORD` appears a handful of times per 20,000 messages, `COMMON_WORD` in a large share,
`ZH_WORD` is a common 2-character Chinese word and `ZH_PHRASE` a 7-character phrase
that occurs only as a fixed collocation.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

Message = dict[str, Any]

RARE_WORD = "quokka"
COMMON_WORD = "file"
ZH_WORD = "压缩"
ZH_PHRASE = "上下文压缩策略"

# per text message (user, assistant): chance of carrying the rare marker
_RARE_RATE = 1 / 5000

# ----------------------------------------------------------------------- word lists

_EN_NOUNS = (
    "file config database migration test error context summary session archive index "
    "query table column schema function module class method parser token buffer cache "
    "request response socket client server daemon worker queue batch transaction lock "
    "timeout retry build package dependency version branch commit patch diff log trace "
    "exception handler callback event listener loop thread process pipeline endpoint "
    "payload header field record row value key option flag argument path directory "
    "script command shell output input stream encoder decoder benchmark metric latency "
    "throughput memory disk network policy budget limit window message history prompt"
).split()
_EN_VERBS = (
    "check update fix add remove rename refactor move read write parse load save run "
    "test build deploy compact index search merge split validate measure profile debug "
    "revert cache retry skip rewrite document review inspect compare"
).split()
_EN_ADJS = (
    "new old broken slow fast large small empty missing duplicate stale flaky invalid "
    "nested optional default current previous async incremental temporary final"
).split()
_EN_TEMPLATES = (
    "Please {v} the {a} {n} in {p}.",
    "The {n} {v}s the {n2} before the {a} {n3} is written.",
    "I think the {a} {n} is why the {n2} fails.",
    "Can you {v} the {n} and {v2} the {n2} afterwards?",
    "Let me {v} the {n} first, then {v2} the {a} {n2}.",
    "The {n} in {p} is {a}; we should {v} it.",
    "After the change, the {n} no longer needs the {a} {n2}.",
    "I'll {v} the {n2} so the {n} stays {a}.",
    "Running the {n} shows {k} {a} {n2} entries.",
    "We must not {v} the {n} while a {n2} is open.",
    "The {a} {n} takes {k} ms per {n2} on this machine.",
    "Next, {v} {p} and {v2} every {n} that uses it.",
    "Looks like the {n} {v}s twice when the {n2} is {a}.",
    "Done: the {n} now {v}s the {a} {n2} correctly.",
)
_ZH_NOUNS = (
    "上下文 压缩 策略 数据库 迁移 配置 文件 错误 测试 索引 查询 会话 摘要 归档 消息 "
    "模型 工具 调用 结果 日志 缓存 事务 连接 客户端 服务器 进程 线程 队列 批次 参数 "
    "路径 目录 脚本 命令 输出 输入 版本 分支 提交 依赖 接口 字段 记录 性能 内存 磁盘 "
    "网络 预算 限制 窗口 历史 提示词 令牌 分词器 全文检索"
).split()
_ZH_VERBS = (
    "检查 更新 修复 添加 删除 重命名 重构 移动 读取 写入 解析 加载 保存 运行 测试 "
    "构建 部署 压缩 搜索 合并 拆分 验证 测量 调试 回滚 重试 跳过 重写 审查 比较"
).split()
_ZH_ADJS = (
    "新的 旧的 损坏的 缓慢的 大的 小的 空的 缺失的 重复的 过期的 无效的 默认的 当前的"
).split()
_ZH_TEMPLATES = (
    "请{v}一下{p}里的{n}。",
    "这个{n}在{n2}之前需要先{v}。",
    "我觉得{a}{n}是{n2}失败的原因。",
    "先{v}{n}，然后再{v2}{a}{n2}。",
    "{p}中的{n}是{a}，我们应该{v}它。",
    "修改之后，{n}不再需要{a}{n2}了。",
    "运行{n}后发现有{k}条{a}{n2}。",
    "在{n2}打开的时候不要{v}{n}。",
    "这台机器上每个{n2}的{n}大约需要{k}毫秒。",
    "接下来{v}{p}，并{v2}所有用到它的{n}。",
    "好的，{n}现在可以正确地{v}{a}{n2}了。",
    "{n}的{n2}出现了错误：{a}{n3}。",
)
_DIRS = (
    "src/ctxd/daemon src/ctxd/protocol src/ctxd/clients tests docs scripts bench "
    "config migrations web/static web/src/components tools/ci 文档 配置"
).split()
_STEMS = (
    "engine archive schema config fts tokens runs recall summary compaction context_store "
    "dispatch app server client codec errors utils main index handlers models views "
    "settings cache queue worker parser 迁移说明 配置说明 压缩策略"
).split()
_EXTS = ".py .py .py .py .md .toml .json .ts .sql .yaml .txt".split()
_COMMANDS = (
    "pytest -q",
    "pytest tests/test_engine.py -x",
    "ruff check .",
    "git status",
    "git diff --stat",
    "python -m ctxd.daemon --check",
    "ls -la",
    "cat pyproject.toml",
    "make build",
    "npm run test",
    "sqlite3 data.db .schema",
    "grep -rn TODO src",
)
# the phrase marker's only context, drawn for a small share of Chinese sentences
_ZH_PHRASE_TEMPLATE = "关于" + ZH_PHRASE + "，{n}应该在{n2}之后{v}。"
_ZH_PHRASE_SHARE = 0.01
_CODE_TEMPLATES = (
    "def {v}_{n}(self, {n2}: str) -> None:",
    "    return self._{n}.{v}({n2})",
    "    {n} = {n2}.get({k!r})",
    "    if not {n}:",
    "        raise ValueError(f'{a} {n}: {{{n2}!r}}')",
    "class {N}{N2}:",
    '    """{V} the {a} {n} before the {n2}."""',
    "    for {n} in self.{n2}s:",
    "        self.{n}_count += {k}",
    "import {n}",
    "from .{n} import {N}{N2}",
    "    # {v} the {n2} here: the {n} may be {a}",
    "    with self.conn:",
    "        self.conn.execute('INSERT INTO {n}s VALUES (?, ?)', ({n2}, {k}))",
    "    # 这里先{zv}{zn}，避免{za}{zn2}",
    "",
    "",
)
_LOG_TEMPLATES = (
    "INFO {n}: {v} {k} {n2}s in {k2} ms",
    "DEBUG {n}.{n2} {a} value={k}",
    "WARNING {n} is {a}, retrying {n2} ({k}/5)",
    "ERROR {N}Error: {a} {n} in {p}:{k}",
    "PASSED tests/test_{n}.py::test_{v}_{n2}",
    "FAILED tests/test_{n}.py::test_{v}_{n2} - AssertionError: {k} != {k2}",
    '  File "{p}", line {k}, in {v}_{n}',
    "错误：{zn}{zv}失败，{zn2}是{za}",
    "{k2} passed, {k} warnings in {k}.{k2}s",
)
_TOOLS = (
    ("read_file", 25),
    ("run_command", 25),
    ("search_code", 15),
    ("edit_file", 15),
    ("list_dir", 10),
    ("write_file", 5),
    ("web_fetch", 5),
)


class _Pools:
    """Sentences, code and log lines drawn once per generator from the word lists."""

    def __init__(self, rng: random.Random) -> None:
        self.paths = [
            f"{rng.choice(_DIRS)}/{rng.choice(_STEMS)}{rng.choice(_EXTS)}" for _ in range(400)
        ]
        self.en = [self._fill(rng, rng.choice(_EN_TEMPLATES)) for _ in range(3000)]
        self.zh = [
            self._fill(
                rng,
                _ZH_PHRASE_TEMPLATE
                if rng.random() < _ZH_PHRASE_SHARE
                else rng.choice(_ZH_TEMPLATES),
            )
            for _ in range(3000)
        ]
        self.code = [self._fill(rng, rng.choice(_CODE_TEMPLATES)) for _ in range(3000)]
        self.log = [self._fill(rng, rng.choice(_LOG_TEMPLATES)) for _ in range(2000)]

    def _fill(self, rng: random.Random, template: str) -> str:
        # Chinese sentence templates take Chinese words; code and log templates take
        # English identifiers plus a few Chinese comment words ({z...}).
        zh = any("\u4e00" <= ch <= "\u9fff" for ch in template) and "{z" not in template
        n, n2, n3 = rng.sample(_ZH_NOUNS if zh else _EN_NOUNS, 3)
        verbs = _ZH_VERBS if zh else _EN_VERBS
        return template.format(
            n=n,
            n2=n2,
            n3=n3,
            N=n.capitalize(),
            N2=n2.capitalize(),
            v=rng.choice(verbs),
            V=rng.choice(verbs).capitalize(),
            v2=rng.choice(verbs),
            a=rng.choice(_ZH_ADJS if zh else _EN_ADJS),
            k=rng.randint(1, 999),
            k2=rng.randint(1, 9999),
            p=rng.choice(self.paths),
            zn=rng.choice(_ZH_NOUNS),
            zn2=rng.choice(_ZH_NOUNS),
            zv=rng.choice(_ZH_VERBS),
            za=rng.choice(_ZH_ADJS),
        )


class _Generator:
    def __init__(self, seed: int, zh_share: float) -> None:
        self.rng = random.Random(seed)
        self.zh_share = zh_share
        self.pools = _Pools(self.rng)
        # ids unique within the session: a seeded prefix plus a counter
        self.id_prefix = f"call_{self.rng.getrandbits(40):010x}"
        self.calls = 0
        self.tool_names = [name for name, _ in _TOOLS]
        self.tool_weights = [w for _, w in _TOOLS]

    # text

    def prose(self, sentences: int, zh: bool | None = None) -> str:
        if zh is None:
            zh = self.rng.random() < self.zh_share
        pool = self.pools.zh if zh else self.pools.en
        parts = self.rng.choices(pool, k=sentences)
        if self.rng.random() < _RARE_RATE * 2:  # two text messages per run on average
            parts.insert(self.rng.randrange(len(parts) + 1), f"Remember the {RARE_WORD} case.")
        return ("" if zh else " ").join(parts)

    def lines(self, pool: list[str], mu: float, sigma: float, cap: int) -> str:
        # log-normal line counts: mostly short output, a long tail of big files and logs
        k = max(1, min(cap, int(self.rng.lognormvariate(mu, sigma))))
        return "\n".join(self.rng.choices(pool, k=k))

    def path(self) -> str:
        return self.rng.choice(self.pools.paths)

    # messages

    def system(self) -> Message:
        return {"role": "system", "content": self.prose(40, zh=False)}

    def user(self) -> Message:
        text = self.prose(self.rng.randint(1, 4))
        if self.rng.random() < 0.15:
            text += "\n\n```\n" + self.lines(self.pools.log, 1.5, 0.8, 40) + "\n```"
        return {"role": "user", "content": text}

    def answer(self) -> Message:
        text = self.prose(self.rng.randint(2, 8))
        if self.rng.random() < 0.25:
            text += "\n\n```python\n" + self.lines(self.pools.code, 2.0, 0.7, 80) + "\n```"
        return {"role": "assistant", "content": text}

    def call(self) -> tuple[dict[str, Any], Message]:
        """One tool call and the result the tool returns for it."""
        self.calls += 1
        cid = f"{self.id_prefix}{self.calls:07d}"
        name = self.rng.choices(self.tool_names, self.tool_weights)[0]
        args, result = getattr(self, "_" + name)()
        call = {
            "id": cid,
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
        }
        return call, {"role": "tool", "tool_call_id": cid, "content": result}

    def _read_file(self) -> tuple[dict[str, Any], str]:
        path = self.path()
        # median ~40 lines (~1.3 KB), a few hundred lines at the tail (tens of KB)
        return {"path": path}, self.lines(self.pools.code, 3.7, 1.1, 1000)

    def _run_command(self) -> tuple[dict[str, Any], str]:
        cmd = self.rng.choice(_COMMANDS)
        out = self.lines(self.pools.log, 1.6, 1.4, 1200)
        code = 1 if "ERROR" in out or "FAILED" in out else 0
        return {"command": cmd, "timeout": 120}, f"$ {cmd}\n{out}\n[exit code {code}]"

    def _search_code(self) -> tuple[dict[str, Any], str]:
        query = self.rng.choice(_EN_NOUNS)
        hits = [
            {"path": self.path(), "line": self.rng.randint(1, 900), "text": line.strip()}
            for line in self.rng.choices(self.pools.code, k=self.rng.randint(0, 12))
        ]
        return {"query": query}, json.dumps({"matches": hits}, ensure_ascii=False)

    def _edit_file(self) -> tuple[dict[str, Any], str]:
        path = self.path()
        old = self.lines(self.pools.code, 1.0, 0.6, 20)
        new = self.lines(self.pools.code, 1.2, 0.6, 30)
        result = {"ok": True, "path": path, "replacements": 1}
        return {"path": path, "old": old, "new": new}, json.dumps(result)

    def _list_dir(self) -> tuple[dict[str, Any], str]:
        entries = sorted({p.rsplit("/", 1)[1] for p in self.rng.sample(self.pools.paths, 15)})
        return {"path": self.rng.choice(_DIRS)}, json.dumps(entries, ensure_ascii=False)

    def _write_file(self) -> tuple[dict[str, Any], str]:
        path = self.path()
        content = self.lines(self.pools.code, 2.5, 0.9, 300)
        result = {"ok": True, "path": path, "bytes": len(content.encode())}
        return {"path": path, "content": content}, json.dumps(result)

    def _web_fetch(self) -> tuple[dict[str, Any], str]:
        url = f"https://docs.example.org/{self.rng.choice(_EN_NOUNS)}/{self.rng.randint(1, 99)}"
        return {"url": url}, self.prose(self.rng.randint(5, 60))

    def step(self) -> list[Message]:
        """One model step that calls tools: the assistant message, then every result."""
        n_calls = 1 if self.rng.random() < 0.75 else self.rng.randint(2, 4)
        pairs = [self.call() for _ in range(n_calls)]
        content = self.prose(1) if self.rng.random() < 0.4 else None
        calls = [c for c, _ in pairs]
        msg: Message = {"role": "assistant", "content": content, "tool_calls": calls}
        return [msg, *(r for _, r in pairs)]

    def filler(self, n: int) -> list[Message]:
        """Exactly n plain text messages, to end a history at a requested length."""
        return [self.user() if i % 2 == 0 else self.answer() for i in range(n)]

    def runs(self) -> Iterator[list[Message]]:
        """Turns forever: a user request, 0-8 tool steps, a final answer, repeated."""
        yield [self.system(), self.user()]
        while True:
            for _ in range(min(8, int(self.rng.expovariate(1 / 2.5)))):
                yield self.step()
            yield [self.answer()]
            yield [self.user()]


def turns(n_messages: int, seed: int = 0, zh_share: float = 0.33) -> Iterator[list[Message]]:
    """A history of exactly n_messages, one agent turn (one append) at a time.

    A turn is what an agent appends after one model call: the assistant message with
    the results of its tool calls, a final answer, or a new user message (the first
    turn also carries the system prompt). Every tool result follows its call; the last
    turn is shortened to plain text messages when a full one would overshoot.
    """
    gen = _Generator(seed, zh_share)
    left = n_messages
    for turn in gen.runs():
        if left <= 0:
            return
        if len(turn) > left:
            turn = turn[:1] if turn[0]["role"] == "system" else gen.filler(left)
        left -= len(turn)
        yield turn


def generate_session(n_messages: int, seed: int = 0, zh_share: float = 0.33) -> Iterator[Message]:
    """The same history as `turns`, one message at a time."""
    for turn in turns(n_messages, seed, zh_share):
        yield from turn
