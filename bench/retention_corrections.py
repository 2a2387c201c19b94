"""Corrections under many compactions, in wordings the summarizer's tests do not use.

A generator of its own (seeded; English or Chinese) writes sessions where settings change
value again and again (bare "subject value" lines, plain updates, cue-word corrections,
"not X but Y", statements that leave the subject out: "make it 2000"), owners and
meeting days change, and similar subjects with different values sit side by side
("upload retries" / "download retries"). Between them come things shaped like a
correction that are none: a numbered series of tasks, the same statement repeated,
pasted log lines with `key=value`, placeholders, screenshots, stack frames and tool
output. After every compaction:

- latest value wins: for each subject whose latest statement has left the tail, a line
  of the model input that is not marked superseded names the subject and the latest
  value, and no such line gives it an earlier value (a "(was X)" note does not count);
- invented corrections: supersessions (`Summary.supersessions`) whose two statements
  are not the same planted subject with another value, and "(was …)" notes on items of
  no planted change;
- merged items: one summary item citing statements of two different subjects;
- repeats marked: a repeated statement found superseded by its repeat.

    python bench/retention_corrections.py --sessions 2
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxd.daemon.compaction.rules import SUMMARY_HEADER
from ctxd.daemon.config import Config
from ctxd.daemon.engine import Engine

CHUNKS = 16
TURNS = 5

# (key word that must be on the line, subject, unit); the pairs are similar subjects
NUMERIC = {
    "en": [("export", "export batch", "rows"), ("pool", "connection pool limit", ""),
           ("upload", "upload retries", ""), ("download", "download retries", ""),
           ("session", "session timeout", "minutes"), ("thumbnail", "thumbnail cache TTL",
                                                        "hours")],
    "zh": [("导出", "导出批次", "条"), ("连接池", "连接池上限", "个"),
           ("上传", "上传重试次数", "次"), ("下载", "下载重试次数", "次"),
           ("会话", "会话超时", "分钟"), ("缩略图", "缩略图缓存时长", "小时")],
}
DAYS = {
    "en": [("standup", "the team standup"), ("freeze", "the release freeze")],
    "zh": [("周会", "周会"), ("冻结", "发布冻结")],
}
DAY_VALUES = {"en": "Monday Tuesday Wednesday Thursday Friday".split(),
              "zh": "周一 周二 周三 周四 周五".split()}
OWNERS = {"en": [("migration", "schema migration"), ("rollout", "canary rollout")],
          "zh": [("迁移", "数据库迁移"), ("灰度", "灰度发布")]}
PEOPLE = {"en": "Priya Marco Lena Tomas Aiko".split(),
          "zh": "熊猫团队 老虎团队 老王 小李 数据组".split()}

FIRST = {
    "en": ["{subj} {v} {unit}.", "We'll keep the {subj} at {v} {unit}.",
           "The {subj} is {v} {unit} for now.", "Please set the {subj} to {v} {unit}."],
    "zh": ["{subj} {v}{unit}。", "{subj}先定为 {v}{unit}。", "{subj}设成 {v}{unit}。",
           "{subj}是 {v}{unit}。"],
}
PLAIN = {
    "en": ["{subj} {v} {unit}.", "Bump the {subj} to {v} {unit}.",
           "The {subj} should now be {v} {unit}.", "Let's go with {v} {unit} for the {subj}.",
           "{subj}: {v} {unit}."],
    "zh": ["{subj} {v}{unit}。", "{subj}调到 {v}{unit}。", "{subj}提高到 {v}{unit}。",
           "以后{subj}按 {v}{unit}。"],
}
CUED = {
    "en": ["Actually, make the {subj} {v} {unit}.", "Change the {subj} to {v} {unit} instead.",
           "Sorry, I meant {v} {unit} for the {subj}.",
           "No wait, the {subj} needs to be {v} {unit}, not {old}."],
    "zh": ["不对，{subj}改成 {v}{unit}。", "{subj}不是 {old}，而是 {v}{unit}。",
           "{subj}改为 {v}{unit}。", "{subj}换成 {v}{unit}吧。"],
}
ELIDED = {"en": ["Make it {v} {unit}.", "No, {v}."], "zh": ["改成 {v}{unit}。", "改为 {v}{unit}。"]}
DAY_FIRST = {"en": ["{subj} is on {day}.", "We hold {subj} on {day}."],
             "zh": ["{subj}定在{day}。", "{subj}{day}开。"]}
DAY_NEXT = {"en": ["Move {subj} to {day}.", "{Subj} on {day} instead.",
                   "Actually {subj} is on {day} now."],
            "zh": ["{subj}改到{day}。", "{subj}不是{old}，改成{day}。", "{subj}挪到{day}吧。"]}
OWNER_FIRST = {"en": ["{who} owns the {work}."], "zh": ["{who}负责{work}。"]}
OWNER_NEXT = {"en": ["Actually {who} owns the {work} now.", "{who} will handle the {work}."],
              "zh": ["{work}改由{who}负责。", "{work}交给{who}负责。"]}

NOISE = {
    "en": ["Step {n}: please review module m{n}.py.", "turn {n}: look at worker number {n}.",
           "Here's the log:\nINFO pool size={x} ready\nDEBUG conn={y} timeout={z}",
           "[Pasted text #{n} +{x} lines] len={y}",
           "[Image #{n}] screenshot at 10.{n}.{x}.png width={y}",
           'File "/srv/app.py", line {x}, in handler', "Thanks, next the docs."],
    "zh": ["第 {n} 步：请检查 m{n} 模块。", "第 {n} 轮：看一下 {n} 号工作进程。",
           "日志如下：\nINFO pool size={x} ready\nDEBUG conn={y} timeout={z}",
           "[Pasted text #{n} +{x} lines] len={y}", "[Image #{n}] 截图 width={y}",
           'File "/srv/app.py", line {x}, in handler', "好的，接下来更新文档。"],
}
OLD_NOTE = re.compile(r"\((?:was|原为)[^)]*\)")
# a statement naming the value it replaces: "not 5", "不是 100，而是 4"
NEGATED = re.compile(r"(?:\bnot|\binstead of|\brather than|不是)\s*[\w:]+", re.IGNORECASE)
DONE = "Done. " + "I went through the module and left the behaviour as it was. " * 6


@dataclass
class Subject:
    key: str
    name: str
    unit: str
    kind: str  # "number", "day", "owner"
    values: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)


@dataclass
class Tally:
    checks: int = 0
    wins: int = 0
    supersessions: int = 0
    invented: int = 0
    invented_was: int = 0
    merged: int = 0
    repeats: int = 0
    repeats_marked: int = 0
    examples: list[str] = field(default_factory=list)


class Session:
    def __init__(self, engine: Engine, lang: str, rng: random.Random) -> None:
        self.e, self.lang, self.rng = engine, lang, rng
        self.sid = engine.create_session(title=f"corrections-{lang}").session_id
        self.subjects: list[Subject] = []
        for key, name, unit in NUMERIC[lang]:
            self.subjects.append(Subject(key, name, unit, "number"))
        for key, name in DAYS[lang]:
            self.subjects.append(Subject(key, name, "", "day"))
        for key, name in OWNERS[lang]:
            self.subjects.append(Subject(key, name, "", "owner"))
        self.of_message: dict[int, tuple[str, str]] = {}  # message id -> (subject, value)
        self.repeated: list[tuple[int, int]] = []  # (earlier id, repeat id)
        self.last: Subject | None = None
        self.n = 0
        self._text_of: dict[int, str] = {}
        self.invented: set[tuple[int, int]] = set()
        self.invented_was: set[str] = set()
        self.merged: set[str] = set()
        self.repeats_marked: set[int] = set()

    def _new_value(self, s: Subject) -> str:
        if s.kind == "day":
            pool = [d for d in DAY_VALUES[self.lang] if d not in s.values[-1:]]
        elif s.kind == "owner":
            pool = [p for p in PEOPLE[self.lang] if p not in s.values[-1:]]
        else:
            pool = [str(self.rng.choice([2, 3, 4, 5, 8, 10, 12, 20, 30, 50, 100, 200, 500,
                                         1000, 2000, 5000])) for _ in range(4)]
            pool = [p for p in pool if p not in s.values[-1:]] or ["7777"]
        return self.rng.choice(pool)

    def _statement(self) -> tuple[str, Subject | None, str | None]:
        rng, lang = self.rng, self.lang
        roll = rng.random()
        if roll < 0.1 and self.of_message:
            # the latest statement of a subject, again word for word
            s = rng.choice([s for s in self.subjects if s.ids])
            return "\0repeat", s, s.values[-1]
        if roll < 0.6:
            s = rng.choice(self.subjects)
            old = s.values[-1] if s.values else None
            v = self._new_value(s)
            cap = s.name[:1].upper() + s.name[1:]
            if s.kind == "number":
                if old is None:
                    tpl = rng.choice(FIRST[lang])
                elif self.last is s and rng.random() < 0.4:
                    tpl = rng.choice(ELIDED[lang])
                else:
                    tpl = rng.choice(PLAIN[lang] + CUED[lang])
                text = tpl.format(subj=s.name, v=v, unit=s.unit, old=old)
            elif s.kind == "day":
                tpl = rng.choice(DAY_FIRST[lang] if old is None else DAY_NEXT[lang])
                text = tpl.format(subj=s.name, Subj=cap, day=v, old=old)
            else:
                tpl = rng.choice(OWNER_FIRST[lang] if old is None else OWNER_NEXT[lang])
                text = tpl.format(who=v, work=s.name)
            return re.sub(r"\s+([.。])", r"\1", text.replace("  ", " ")), s, v
        self.n += 1
        n = self.n
        text = rng.choice(NOISE[lang]).format(n=n, x=rng.randint(10, 999),
                                              y=rng.randint(10, 999), z=rng.randint(10, 99))
        return text, None, None

    def turn(self) -> None:
        text, s, v = self._statement()
        repeat_of = None
        if text == "\0repeat" and s is not None:
            repeat_of = s.ids[-1]
            text = self._text_of[repeat_of]
        [uid] = self.e.append(self.sid, [{"role": "user", "content": text}]).message_ids
        self._text_of[uid] = text
        if s is not None and v is not None:
            if repeat_of is None:
                s.values.append(v)
            else:
                self.repeated.append((repeat_of, uid))
            s.ids.append(uid)
            self.of_message[uid] = (s.key, v)
        self.last = s
        call = {"id": f"c{uid}", "type": "function",
                "function": {"name": "run_shell", "arguments": '{"command": "cat app.cfg"}'}}
        self.e.append(self.sid, [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{uid}",
             "content": f"workers={self.rng.randint(2, 64)}\nbatch={self.rng.randint(10, 9999)}"},
            {"role": "assistant", "content": DONE},
        ])

    def check(self, tally: Tally) -> None:
        st = self.e.context_state(self.sid)
        tail = st.tail_start_id if st.tail_start_id is not None else 1 << 62
        summary_text = next((str(m["content"]) for m in self.e.context_messages(self.sid)
                             if m["role"] == "system"
                             and str(m.get("content", "")).startswith(SUMMARY_HEADER)), "")
        lines = [ln for ln in summary_text.splitlines() if ln.startswith("- ")]
        current = [NEGATED.sub("", OLD_NOTE.sub("", ln)) for ln in lines
                   if "[superseded]" not in ln]
        for s in self.subjects:
            if not s.ids or s.ids[-1] >= tail:
                continue
            tally.checks += 1
            latest = s.values[-1]
            tok = _token(latest)
            # an elided statement ("make it 2000") names no subject: its value must
            # stand on a current line, and the subject's own lines must not contradict it
            mine = [ln for ln in current if s.key.casefold() in ln.casefold()]
            has_latest = any(tok.search(ln) for ln in current if ln in mine or not _keyed(
                ln, self.subjects))
            stale = [v for v in set(s.values[:-1]) - {latest}
                     if any(_token(v).search(ln) for ln in mine)]
            ok = has_latest and not stale
            tally.wins += ok
            if not ok and len(tally.examples) < 12:
                tally.examples.append(f"{self.lang} {s.name}: latest {latest}, stale {stale}, "
                                      f"lines {[ln[:90] for ln in mine][:3]}")
        summary = st.summary
        for old, new in summary.supersessions.items():
            a, b = self.of_message.get(old), self.of_message.get(new)
            if a is None or b is None or a[0] != b[0] or a[1] == b[1]:
                self.invented.add((old, new))
        for _, item in summary.items():
            subjects = {self.of_message[m][0] for m in item.sources if m in self.of_message}
            if len(subjects) > 1:
                self.merged.add(item.text)
            if item.was and item.status == "current" and not subjects:
                self.invented_was.add(item.text)
        for old, new in self.repeated:
            if new < tail and summary.supersessions.get(old) == new:
                self.repeats_marked.add(new)

    def finish(self, tally: Tally) -> None:
        tally.supersessions = len(self.e.context_state(self.sid).summary.supersessions)
        tally.invented = len(self.invented)
        tally.invented_was = len(self.invented_was)
        tally.merged = len(self.merged)
        tally.repeats = len(self.repeated)
        tally.repeats_marked = len(self.repeats_marked)
        for old, new in sorted(self.invented)[:4]:
            tally.examples.append(f"{self.lang} invented: {self._text_of.get(old)!r} "
                                  f"-> {self._text_of.get(new)!r}")
        tally.examples += [f"{self.lang} merged: {t[:100]!r}" for t in sorted(self.merged)[:4]]


def _token(value: str) -> re.Pattern[str]:
    # ASCII boundaries: Chinese writes values against the characters around them
    return re.compile(rf"(?<![A-Za-z0-9.#]){re.escape(value)}(?![A-Za-z0-9]|\.\d)",
                      re.IGNORECASE)


def _keyed(line: str, subjects: list[Subject]) -> bool:
    low = line.casefold()
    return any(s.key.casefold() in low for s in subjects)


def run_session(lang: str, seed: int, root: Path) -> Tally:
    rng = random.Random(seed)
    cfg = Config(data_dir=root / f"{lang}-{seed}")
    cfg.compaction.keep_messages = 8
    engine = Engine(cfg)
    tally = Tally()
    try:
        session = Session(engine, lang, rng)
        for _ in range(CHUNKS):
            for _ in range(TURNS):
                session.turn()
            asyncio.run(engine.compact(session.sid, force=True))
            session.check(tally)
        session.finish(tally)
    finally:
        engine.close()
    return tally


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=3, help="sessions per language")
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--examples", action="store_true", help="print failing checks")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ctxd-corrections-"))
    started = time.perf_counter()
    totals: dict[str, Tally] = {}
    try:
        for lang in ("en", "zh"):
            total = Tally()
            for k in range(args.sessions):
                t = run_session(lang, args.seed * 100 + k, root)
                for name in ("checks", "wins", "supersessions", "invented", "invented_was",
                             "merged", "repeats", "repeats_marked"):
                    setattr(total, name, getattr(total, name) + getattr(t, name))
                total.examples += t.examples
            totals[lang] = total
    finally:
        shutil.rmtree(root, ignore_errors=True)
    took = time.perf_counter() - started
    print(f"{args.sessions} sessions per language, {CHUNKS} compactions each, "
          f"{TURNS} user turns between them; checked after every compaction; {took:.1f} s.\n")
    print("| Measure | Target | en | zh |\n|---|---|---|---|")

    def pct(t: Tally) -> str:
        return f"{100 * t.wins / t.checks:.1f}% of {t.checks}" if t.checks else "—"

    rows: list[tuple[str, str, Any]] = [
        ("latest value wins", "≥95%", pct),
        ("supersessions at the end", "", lambda t: t.supersessions),
        ("invented corrections (pairs)", "0", lambda t: t.invented),
        ("(was …) on no planted change", "0", lambda t: t.invented_was),
        ("items merging two subjects", "0", lambda t: t.merged),
        ("repeats marked superseded by their repeat", "0",
         lambda t: f"{t.repeats_marked} of {t.repeats}"),
    ]
    for label, target, fn in rows:
        print(f"| {label} | {target} | {fn(totals['en'])} | {fn(totals['zh'])} |")
    if args.examples:
        for t in totals.values():
            for ex in t.examples:
                print("-", ex)


if __name__ == "__main__":
    main()
