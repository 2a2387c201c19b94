"""Seeded agent sessions for the retention benchmark: filler turns in one language,
and the plan of which facts go where."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.retention_facts import (
    EN_PAIRS,
    EN_SINGLE,
    ZH_PAIRS,
    ZH_SINGLE,
    Fact,
    Sizes,
    Template,
    fact_slots,
)

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
