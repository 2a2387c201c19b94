"""Kinds of facts under many compactions: latest values, hedges, the agent's own artifacts.

A generator of its own (seeded; English or Chinese) writes long agent sessions that
stress what a summary tends to lose:

- settings (subject -> value) restated again and again in varied words: cue-word
  corrections, plain updates without any correction wording, "X, not Y", long Chinese
  sentences; after each compaction the latest value must be current and no earlier
  value may look current (a line marked `[superseded]` or a `(was X…)` note does not);
- hedged conclusions (a trailing hedge clause in a long sentence, a hedge in the next
  sentence, an inline hedge word): where the summary shows the statement, its hedge
  (or an `unconfirmed` / `推测` marker) must be on the same line;
- the agent's own artifacts: files its tools created, edited, moved or deleted, and the
  commit hashes, branches, PR numbers, job and run ids its tools returned, among many
  paths merely mentioned by tool output (test runner listings, pyproject.toml...);
- hard constraints, which must all stay.

It also measures the share of the summary's tokens spent on source pointers, and the
largest summary seen (it must stay within its budget).

    python bench/retention_kinds.py             # prints the table
    python bench/retention.py                   # includes it in bench/results/retention.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from ctxd.daemon.compaction.rules import SUMMARY_HEADER
from ctxd.daemon.config import Config
from ctxd.daemon.engine import Engine

CHUNKS = 24  # compactions per session
TURNS = 5  # agent turns per chunk

SUBJECTS = {
    "en": [("batch size", "records"), ("due window", "days"), ("request timeout", "seconds"),
           ("retry limit", "attempts"), ("page size", "rows"), ("cache TTL", "minutes")],
    "zh": [("批处理大小", "条"), ("到期窗口", "天"), ("请求超时", "秒"), ("重试上限", "次"),
           ("分页大小", "行"), ("缓存过期时间", "分钟")],
}
FIRST = {
    "en": ["Set the {svc} {subj} to {v} {unit}.", "For {svc}, use a {subj} of {v} {unit}.",
           "The {svc} {subj} is {v} {unit}."],
    "zh": ["{svc}的{subj}设为 {v} {unit}。", "{svc}的{subj}是 {v} {unit}。",
           "考虑到上游系统在月末结算期间的负载峰值以及我们和财务团队上周达成的一致意见，"
           "{svc}的{subj}先定为 {v} {unit}，后面再根据监控数据调整。"],
}
UPDATE = {
    "en": ["Correction: make the {svc} {subj} {v} {unit}, not {old}.",
           "Raise the {svc} {subj} to {v} {unit}.",
           "Actually, the {svc} {subj} should be {v} {unit}.",
           "Let's go with {v} {unit} for the {svc} {subj}.",
           "Change the {svc} {subj} to {v} {unit}.",
           "{svc} {subj}: {v} {unit} from now on.",
           "After looking at last week's dashboards with the on-call team, lower the {svc} "
           "{subj} to {v} {unit} so the nightly jobs finish before the backups start."],
    "zh": ["{svc}的{subj}改到 {v} {unit}。", "不对，{svc}的{subj}应该是 {v} {unit}。",
           "{svc}的{subj}调整为 {v} {unit}，不是 {old}。",
           "经过和运维团队的讨论并结合最近两周的线上监控数据，我们认为{svc}的{subj}需要从原来的"
           " {old} 调整到 {v} {unit}才能满足峰值需求。",
           "{svc}的{subj}用 {v} {unit}吧。", "以后{svc}的{subj}按 {v} {unit}来。"],
}
HEDGED = {
    "en": [
        ("The {svc} timeouts come from the {thing} holding connections open during the "
         "nightly export of the reporting tables, which saturates the shared pool after about "
         "{n} concurrent requests from the batch workers and the API replicas together, "
         "although this may not hold at production scale.",
         "{svc} timeouts come from the {thing}"),
        ("The {svc} memory growth is caused by the {thing}. I haven't confirmed that.",
         "{svc} memory growth is caused by the {thing}"),
        ("We'll move the {svc} exports to the {thing}. I haven't confirmed that it is faster.",
         "move the {svc} exports to the {thing}"),
        ("The {svc} workers must stay on the {thing}. This is unconfirmed so far.",
         "{svc} workers must stay on the {thing}"),
        ("The {svc} slowdown is probably due to the {thing}.", "{svc} slowdown"),
        ("I think the {svc} duplicate events come from the {thing} retrying.",
         "{svc} duplicate events come from the {thing}"),
        ("We'll switch the {svc} reports to the {thing}, though the gain may not hold at "
         "production scale.", "switch the {svc} reports to the {thing}"),
        ("The {svc} outage must be blamed on the {thing} until we know more, "
         "but that is only a guess.", "{svc} outage must be blamed on the {thing}"),
    ],
    "zh": [
        ("{svc}的内存增长是{thing}导致的。不过这只是推测。", "{svc}的内存增长是{thing}导致的"),
        ("{svc}超时的原因是{thing}在夜间导出报表数据的时候一直占用着数据库连接，批处理任务和接口副本加起来"
         "大约 {n} 个并发请求之后共享连接池就满了，之后所有新的请求都只能排队等待直到超时为止，"
         "但这个结论在生产规模下不一定成立。", "{svc}超时的原因"),
        ("我们决定把{svc}的导出迁到{thing}。不过这只是推测，还没验证。",
         "把{svc}的导出迁到{thing}"),
        ("{svc}的工作进程必须留在{thing}上。这一点尚未确认。", "{svc}的工作进程必须留在{thing}上"),
        ("{svc}变慢可能是{thing}引起的。", "{svc}变慢"),
        ("{svc}重复事件的来源是{thing}的重试。我还没有验证过。", "{svc}重复事件的来源是{thing}"),
        ("我们决定把{svc}的报表切到{thing}，不过收益在生产规模下可能不成立。",
         "把{svc}的报表切到{thing}"),
        ("{svc}的故障必须先归因到{thing}，不过这只是推测。", "{svc}的故障必须先归因到{thing}"),
    ],
}
CONSTRAINTS = {
    "en": ["Never push {svc} changes directly to main.", "Do not drop the {svc} audit table.",
           "Always run the {svc} migrations in a transaction."],
    "zh": ["{svc}的改动禁止直接推到 main。", "不要删除{svc}的审计表。",
           "{svc}的迁移必须在事务里执行。"],
}
SERVICES = {
    "en": "billing ledger search checkout inventory gateway payments shipping".split(),
    "zh": "计费 账本 搜索 结算 库存 网关 支付 物流".split(),
}
THINGS = {"en": ["connection pool", "event bus", "read replica", "job queue"],
          "zh": ["连接池", "事件总线", "只读副本", "任务队列"]}
FILLER = {
    "en": ["Please tidy the {n} module.", "Can you check why the {n} tests are slow?",
           "Next, update the {n} docs.", "Look at the {n} handler again."],
    "zh": ["请整理一下{n}模块。", "看看{n}的测试为什么慢。", "接下来更新{n}的文档。",
           "再看一下{n}处理器。"],
}
NOUNS = {"en": "parser cache router encoder schema loader".split(),
         "zh": "解析器 缓存 路由 编码器 模式 加载器".split()}
DAYS = {"en": "Monday Tuesday Wednesday Thursday Friday".split(),
        "zh": "周一上午 周二上午 周三下午 周四上午 周五下午".split()}
HEDGE = re.compile(
    r"unconfirmed|probably|\bmay\b|\bmight\b|likely|possibly|perhaps|not confirmed|"
    r"haven't confirmed|have not confirmed|i think|\bseems?\b|unverified|not hold|"
    r"only a guess|推测|尚未确认|还没验证|可能|也许|未确认|不确定|大概|不一定|似乎|估计|"
    r"没有验证|未验证",
    re.IGNORECASE,
)
POINTER = re.compile(r" ?\[(?:msg [^\]]*|#[^\]]*)\]| #\d+(?:[-,]\d+)*$", re.MULTILINE)
OLD_NOTE = re.compile(r"\((?:was|原为)[^)]*\)")


@dataclass
class Setting:
    svc: str
    subj: str
    unit: str
    values: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)  # message id of each statement


@dataclass
class Tally:
    checks: dict[str, int] = field(default_factory=dict)
    hits: dict[str, int] = field(default_factory=dict)
    pointer_tokens: int = 0
    summary_tokens: int = 0
    max_summary: int = 0
    compactions: int = 0
    messages: int = 0
    # per committed compaction: new summary message tokens / (old one + messages that left)
    ratios: list[float] = field(default_factory=list)
    small_ratios: list[float] = field(default_factory=list)  # spans under 5,000 tokens
    grew: int = 0  # compactions whose model input was bigger after than before

    def add(self, name: str, ok: bool) -> None:
        self.checks[name] = self.checks.get(name, 0) + 1
        self.hits[name] = self.hits.get(name, 0) + int(ok)


class Session:
    def __init__(self, engine: Engine, lang: str, rng: random.Random) -> None:
        self.e, self.lang, self.rng = engine, lang, rng
        self.en = lang == "en"
        self.sid = engine.create_session(title=f"kinds-{lang}").session_id
        self.calls = 0
        self.used_values: set[str] = set()
        self.settings: list[Setting] = []
        self.hedged: list[tuple[str, int]] = []  # key, message id
        self.constraints: list[tuple[str, int]] = []
        self.files: list[tuple[str, int, int]] = []  # path, message id, chunk
        self.ids: list[tuple[str, int, int]] = []  # tool-produced id, message id, chunk

    def _value(self) -> str:
        while True:
            v = str(self.rng.randint(11, 99_999))
            if v not in self.used_values:
                self.used_values.add(v)
                return v

    def _user_text(self, chunk: int) -> str:
        rng, lang = self.rng, self.lang
        parts: list[str] = []
        roll = rng.random()
        svc = rng.choice(SERVICES[lang])
        if roll < 0.55:
            fresh = [s for s in self.settings if len(s.values) < 8]
            if len(self.settings) < 4 or not fresh or rng.random() < 0.15:
                subj, unit = rng.choice(SUBJECTS[lang])
                if any(s.svc == svc and s.subj == subj for s in self.settings):
                    return rng.choice(FILLER[lang]).format(n=rng.choice(NOUNS[lang]))
                s = Setting(svc, subj, unit)
                s.values.append(self._value())
                self.settings.append(s)
                parts.append(rng.choice(FIRST[lang]).format(
                    svc=svc, subj=subj, v=s.values[-1], unit=unit))
            else:
                s = rng.choice(fresh)
                old = s.values[-1]
                s.values.append(self._value())
                parts.append(rng.choice(UPDATE[lang]).format(
                    svc=s.svc, subj=s.subj, v=s.values[-1], unit=s.unit, old=old))
            self._pending = s
        elif roll < 0.7:
            text, key = rng.choice(HEDGED[lang])
            slots = {"svc": svc, "thing": rng.choice(THINGS[lang]), "n": rng.randint(100, 999)}
            parts.append(text.format(**slots))
            self._hedge = key.format(**slots)
        elif roll < 0.8 and len(self.constraints) < 6:
            text = rng.choice(CONSTRAINTS[lang]).format(svc=svc)
            self.constraints.append((text.rstrip("。."), -1))
            parts.append(text)
        sep = " " if self.en else ""
        parts.append(rng.choice(FILLER[lang]).format(n=rng.choice(NOUNS[lang])))
        return sep.join(parts)

    def _call(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        return {"id": f"call_{self.calls}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}

    def _own_calls(self, chunk: int) -> list[tuple[dict[str, Any], str, list[str], list[str]]]:
        """(call, result, files it wrote, ids it produced)"""
        rng = self.rng
        svc = rng.choice(SERVICES["en"])
        n = rng.randint(100, 99_999)
        out = []
        kind = rng.random()
        path = f"services/{svc}/{rng.choice(['handlers', 'jobs', 'models'])}/{svc}_{n}.py"
        if kind < 0.35:
            out.append((self._call("write_file", {"path": path, "content": "x = 1\n"}),
                        "ok", [path], []))
        elif kind < 0.55:
            out.append((self._call("edit_file", {"path": path, "old": "a", "new": "b"}),
                        "1 replacement", [path], []))
        elif kind < 0.65:
            dst = path.replace(".py", "_v2.py")
            out.append((self._call("move_file", {"source": path, "destination": dst}),
                        "moved", [dst], []))
        elif kind < 0.8:
            sha = f"{rng.getrandbits(28):07x}"
            out.append((self._call("run_shell", {"command": f"git commit -am 'fix {svc}'"}),
                        f"[main {sha}] fix {svc}\n 2 files changed, 9 insertions(+)", [], [sha]))
        elif kind < 0.9:
            pr = str(rng.randint(100, 9999))
            out.append((self._call("run_shell", {"command": "gh pr create --fill"}),
                        f"https://github.com/acme/{svc}/pull/{pr}", [], [f"pull/{pr}"]))
        else:
            job = str(rng.randint(10**7, 10**8))
            out.append((self._call("run_shell", {"command": "ci trigger"}),
                        f"Triggered CI pipeline: job {job} queued", [], [job]))
        return out

    def _noise_call(self) -> tuple[dict[str, Any], str]:
        rng = self.rng
        n = rng.choice(NOUNS["en"])
        listing = "\n".join(
            f"tests/unit/test_{rng.choice(NOUNS['en'])}_{i}.py::test_{n} PASSED"
            for i in range(rng.randint(3, 8)))
        if rng.random() < 0.5:
            return (self._call("run_shell", {"command": "pytest -q"}),
                    f"{listing}\nconfigfile: pyproject.toml\n12 passed")
        return (self._call("read_file", {"path": f"src/app/{n}.py"}),
                f"import os\nfrom app import settings  # see docs/{n}.md and setup.cfg\n")

    def _append(self, msgs: list[dict[str, Any]]) -> list[int]:
        return list(self.e.append(self.sid, msgs).message_ids)

    def turn(self, chunk: int) -> None:
        rng, lang = self.rng, self.lang
        self._pending = None
        self._hedge: str | None = None
        [uid] = self._append([{"role": "user", "content": self._user_text(chunk)}])
        if self._pending is not None:
            self._pending.ids.append(uid)
        if self._hedge is not None:
            self.hedged.append((self._hedge, uid))
        if self.constraints and self.constraints[-1][1] == -1:
            self.constraints[-1] = (self.constraints[-1][0], uid)
        calls: list[tuple[dict[str, Any], str]] = [self._noise_call()]
        own = self._own_calls(chunk) if rng.random() < 0.8 else []
        calls += [(c, r) for c, r, _, _ in own]
        [aid] = self._append([{"role": "assistant", "content": None,
                               "tool_calls": [c for c, _ in calls]}])
        rids = self._append([{"role": "tool", "tool_call_id": c["id"], "content": r}
                             for c, r in calls])
        for _, _, files, ids in own:
            self.files += [(p, aid, chunk) for p in files]
            self.ids += [(i, rids[-1], chunk) for i in ids]
        final = rng.choice(["Done.", "Updated the code; tests pass."] if self.en
                           else ["好了。", "代码已更新，测试通过。"])
        if rng.random() < 0.3:
            text, key = rng.choice(HEDGED[lang])
            slots = {"svc": rng.choice(SERVICES[lang]), "thing": rng.choice(THINGS[lang]),
                     "n": rng.randint(100, 999)}
            final = text.format(**slots)
            [fid] = self._append([{"role": "assistant", "content": final}])
            self.hedged.append((key.format(**slots), fid))
        else:
            self._append([{"role": "assistant", "content": final}])

    def check(self, chunk: int, tally: Tally) -> None:
        e = self.e
        st = e.context_state(self.sid)
        tail = st.tail_start_id if st.tail_start_id is not None else 1 << 62
        msgs = e.context_messages(self.sid)
        summary = next((m["content"] for m in msgs if m["role"] == "system"
                        and str(m.get("content", "")).startswith(SUMMARY_HEADER)), "")
        everything = "\n".join(str(m.get("content") or "") for m in msgs)
        count = e.tokens.count_text
        s_tokens = count(summary) if summary else 0
        tally.compactions += 1
        tally.summary_tokens += s_tokens
        tally.max_summary = max(tally.max_summary, st.summary_tokens)
        if summary:
            tally.pointer_tokens += s_tokens - count(POINTER.sub("", summary))
        lines = [ln for ln in summary.splitlines() if ln.startswith("- ")]
        current = [OLD_NOTE.sub("", ln) for ln in lines if "[superseded]" not in ln]
        for s in self.settings:
            if not s.ids or s.ids[-1] >= tail:
                continue
            latest = s.values[-1]
            tok = re.compile(rf"(?<![\d.]){latest}(?!\d)")
            ok = any(tok.search(ln) for ln in current) or any(
                tok.search(ln) for ln in everything.splitlines() if "[superseded]" not in ln
                and not ln.startswith("- "))
            # an earlier value on a line of its own, not "45 days, not 30" next to the latest
            for old in s.values[:-1]:
                old_tok = re.compile(rf"(?<![\d.]){old}(?!\d)")
                if any(old_tok.search(ln) and s.svc in ln and not tok.search(ln) for ln in current):
                    ok = False
            tally.add("latest value wins", ok)
        for key, mid in self.hedged:
            if mid >= tail:
                continue
            shown = [ln for ln in lines if key in ln]
            if shown:
                tally.add("hedged shown without hedge", not all(HEDGE.search(ln) for ln in shown))
            if chunk == CHUNKS - 1:
                tally.add("hedged kept with hedge (end)",
                          any(HEDGE.search(ln) for ln in shown))
        for key, mid in self.constraints:
            if 0 <= mid < tail:
                tally.add("hard constraints kept", key in everything)
        recent = chunk - 2
        for path, mid, c in self.files:
            if c >= recent and mid < tail:
                tally.add("own files (last 3 compactions)", path in everything)
        for ident, mid, c in self.ids:
            if c >= recent and mid < tail:
                tally.add("tool ids (last 3 compactions)", ident in everything)


def size(engine: Engine, sid: str, old: int, result: dict[str, Any], tally: Tally) -> None:
    """The summary's size against what it replaced: the old summary message and the
    messages that left the context."""
    if result["after"]["tokens"] > result["before"]["tokens"]:
        tally.grew += 1
    if not result.get("compactionId") or result.get("summarizedFrom") is None:
        return
    lo, hi = result["summarizedFrom"], result["summarizedTo"]
    read = engine.read_archive(sid, after_id=lo - 1, before_id=hi + 1, limit=10_000)
    left = sum(m["tokens"] for m in read.messages)
    new = engine.context_state(sid).summary_tokens
    ratio = new / max(old + left, 1)
    tally.ratios.append(ratio)
    if left < 5000:
        tally.small_ratios.append(ratio)


def _quantiles(values: list[float]) -> str:
    if not values:
        return "—"
    v = sorted(values)
    return (f"median {v[len(v) // 2]:.2f}, max {v[-1]:.2f} ({len(v)})")


async def run(lang: str, sessions: int, seed: int, root: Path) -> Tally:
    tally = Tally()
    engine = Engine(Config(data_dir=root / f"kinds-{lang}"))
    try:
        for i in range(sessions):
            s = Session(engine, lang, random.Random(f"{seed}/kinds/{lang}/{i}"))
            engine.append(s.sid, [{"role": "system", "content": "You are a coding agent."}])
            for chunk in range(CHUNKS):
                for _ in range(TURNS):
                    s.turn(chunk)
                old = engine.context_state(s.sid).summary_tokens
                result = msgspec.to_builtins(await engine.compact(s.sid))
                size(engine, s.sid, old, result, tally)
                s.check(chunk, tally)
            tally.messages += engine.archive.message_count(s.sid)
    finally:
        engine.close()
    return tally


ROWS = (
    ("latest value wins", "≥95%", False),
    ("hedged shown without hedge", "≤2%", False),
    ("own files (last 3 compactions)", "≥95%", False),
    ("tool ids (last 3 compactions)", "≥90%", False),
    ("hard constraints kept", "100%", False),
    ("hedged kept with hedge (end)", "≥90%", False),
)


def render(tallies: dict[str, Tally], budget: int) -> str:
    langs = list(tallies)
    head = "| Measure | Target | " + " | ".join(langs) + " |"
    out = [head, "|---|---|" + "---|" * len(langs)]
    for name, target, _ in ROWS:
        cells = []
        for lang in langs:
            t = tallies[lang]
            n = t.checks.get(name, 0)
            cells.append(f"{100 * t.hits.get(name, 0) / n:.1f}% of {n}" if n else "—")
        out.append(f"| {name} | {target} | " + " | ".join(cells) + " |")
    cells = [f"{100 * t.pointer_tokens / max(t.summary_tokens, 1):.1f}%" for t in tallies.values()]
    out.append("| pointer tokens / summary tokens | ≤10% | " + " | ".join(cells) + " |")
    cells = [f"{t.max_summary:,}" for t in tallies.values()]
    out.append(f"| largest pins + summary (tokens) | ≤{budget:,} | " + " | ".join(cells) + " |")
    cells = [_quantiles(t.ratios) for t in tallies.values()]
    out.append("| summary / what it replaced, per compaction | <1 | " + " | ".join(cells) + " |")
    cells = [_quantiles(t.small_ratios) for t in tallies.values()]
    out.append("| the same, spans under 5,000 tokens | <1 | " + " | ".join(cells) + " |")
    cells = [str(t.grew) for t in tallies.values()]
    out.append("| compactions that made the context bigger | 0 | " + " | ".join(cells) + " |")
    return "\n".join(out)


async def measure(sessions: int, seed: int) -> tuple[str, str]:
    root = Path(tempfile.mkdtemp(prefix="ctxd-kinds-"))
    started = time.monotonic()
    try:
        tallies = {lang: await run(lang, sessions, seed, root) for lang in ("en", "zh")}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    t = tallies["en"]
    note = (
        f"{sessions} sessions per language, {CHUNKS} compactions each ({TURNS} agent turns "
        f"between compactions), {t.messages:,} + {tallies['zh'].messages:,} messages; "
        f"checked after every compaction; {time.monotonic() - started:.1f} s."
    )
    return note, render(tallies, Config().compaction.summary_budget_tokens)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=2)
    ap.add_argument("--seed", type=int, default=20240611)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    note, text = asyncio.run(measure(args.sessions, args.seed))
    print(note + "\n\n" + text)
    if args.out:
        args.out.write_text(note + "\n\n" + text + "\n")


if __name__ == "__main__":
    main()
