"""Retention on real conversations: public Claude Code and Codex transcripts replayed.

Each transcript under bench/data/transcripts (see SOURCES.md there) is read with ctxd's
own importer, then replayed into an Engine on a temporary SQLite file turn by turn:
every user message opens a run (run/start), the agent's messages and tool results are
appended in it step by step, and run/finish lets auto-compaction fire as the daemon
does it (the daemon's own AutoCompactor). Two policies: the defaults, and a small one
(max 40 active messages, keep 12) so that short transcripts compact several times.

Measured per transcript and in total:

- per compaction attempt: summary tokens / replaced tokens (the old pins + summary
  message and the tail messages that left), and how many attempts would have made the
  model input bigger (refused as not effective, or committed);
- user rules (deontic sentences of user messages, EN and ZH, and the lines of an
  AGENTS.md / CLAUDE.md preamble sent as a user message) present in the model input
  (context/get: system, pins + summary, tail; verbatim after whitespace normalisation)
  1 and 3 compactions after their message left the tail, and at the end for those that
  left it 5 or more compactions before;
- files the agent's tools wrote (Edit/Write/MultiEdit, Codex apply_patch headers, shell
  redirections) present 1, 2 and 3+ compactions after leaving the tail;
- ids tools produced (commit hashes from git output, PR URLs, CI run/job ids) present
  within 3 compactions of leaving the tail;
- summary items (distinct over all compactions): the share of items of the constraints
  section holding no rule (no deontic cue and no correction mark), the items marked as
  superseded (with a sample of up to 30 for a person to judge and an automatic estimate
  of those that are no correction: identical text, a numbered series, pasted output),
  and the share of items that are transcript markup (boilerplate), overall and in Goals;
- seconds per compaction attempt.

    python bench/retention_real.py                 # writes bench/results/retention_real.md
    python bench/retention_real.py --quick         # two transcripts
    OTHER_CHECKOUT/.venv/bin/python bench/retention_real.py --out /tmp/x.md   # another revision
    python bench/retention_real.py --data bench/data/heldout --tiny \
        --out bench/results/retention_real_heldout.md   # transcripts never tuned on

`ctxd` is imported from whatever environment runs the script (so another checkout's
venv measures that checkout); `bench` and the transcripts come from this folder.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

import ctxd
from ctxd.daemon.config import CompactionPolicy, Config
from ctxd.daemon.engine import Engine
from ctxd.daemon.scheduler import AutoCompactor

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.retention_real_extract import (  # noqa: E402
    Item,
    Transcript,
    edited_files,
    load,
    model_input_text,
    norm,
    text_of,
    tool_ids,
    user_rules,
)
from bench.retention_real_lines import (  # noqa: E402
    SummaryLine,
    summary_lines,
    supersession_pairs,
)
from bench.retention_real_report import render  # noqa: E402

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "transcripts"
RESULTS = HERE / "results"
QUICK = ("claude-code/reliability-python-to-rust-port", "codex/rollout-raze")
# ages (compactions since the item's message left the tail) checked while replaying
WANT = {"rule": (1, 3), "file": (1, 2), "id": (1, 2, 3)}
SUMMARY_START = "Context carried over from earlier"


def policies(tiny: bool = False) -> dict[str, CompactionPolicy]:
    """The default policy and a small one; with `tiny`, a third that compacts a short
    transcript often enough for rules to be 5 compactions old (max 16 / keep 6)."""
    default = CompactionPolicy()
    small = dataclasses.replace(default, max_active_messages=40, keep_messages=12)
    out = {
        f"default (max {default.max_active_messages} / keep {default.keep_messages})": default,
        "small (max 40 / keep 12)": small,
    }
    if tiny:
        out["tiny (max 16 / keep 6)"] = dataclasses.replace(
            default, max_active_messages=16, keep_messages=6)
    return out


@dataclass
class Attempt:
    effective: bool
    before: int
    after: int
    replaced: int
    summary: int
    ms: float


@dataclass
class Replay:
    transcript: str
    policy: str
    messages: int = 0
    turns: int = 0
    attempts: list[Attempt] = field(default_factory=list)
    compactions: int = 0
    items: list[Item] = field(default_factory=list)
    # distinct summary lines seen over the replay, and the section they were in then
    lines: dict[str, tuple[SummaryLine, list[SummaryLine]]] = field(default_factory=dict)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    # summary line -> (old statement, new statement) for lines showing a replaced value
    pairs: dict[str, tuple[str, str]] = field(default_factory=dict)
    # the transcript's messages, normalised (to tell its own arrows from the summary's)
    source: str = ""


def turns_of(msgs: list[dict[str, Any]]) -> list[list[list[int]]]:
    """Turns (a user message and what follows until the next one), each a list of
    steps: a message and the tool results right after it (indexes into `msgs`)."""
    out: list[list[list[int]]] = []
    for i, m in enumerate(msgs):
        if m["role"] == "user" or not out:
            out.append([])
        if m["role"] == "tool" and out[-1]:
            out[-1][-1].append(i)
        else:
            out[-1].append([i])
    return out


class Checker:
    """Looks at the model input after every effective compaction (called from the
    engine's progress events, so each compaction of a burst is seen)."""

    def __init__(self, engine: Engine, sid: str, r: Replay) -> None:
        self.e, self.sid, self.r = engine, sid, r
        self.begins: dict[str, tuple[int, dict[int, int]]] = {}
        self.departing = 0  # items[:departing] have left the tail
        self.failure: BaseException | None = None

    def __call__(self, session_id: str, method: str, params: Any) -> None:
        if session_id != self.sid or method != "$/progress":
            return
        params = msgspec.to_builtins(params)  # the engine's event Struct, in its wire form
        kind = params["value"].get("kind")
        try:
            st = self.e.context_state(self.sid)
            if kind == "begin":
                tail = self.e.tail_messages(self.sid, st)
                self.begins[params["token"]] = (st.summary_tokens,
                                                {m["id"]: m["tokens"] for m in tail})
            elif kind == "end" and st.compaction_count > self.r.compactions:
                self.r.compactions = st.compaction_count
                self.check(st.tail_start_id)
        except BaseException as exc:  # the engine only logs listener errors
            self.failure = self.failure or exc

    def check(self, tail_start: int | None) -> None:
        k = self.r.compactions
        items = self.r.items
        limit = tail_start if tail_start is not None else 1 << 62
        while (self.departing < len(items) and 0 <= items[self.departing].msg_id < limit):
            items[self.departing].departed = k
            self.departing += 1
        msgs = self.e.context_messages(self.sid)
        text = model_input_text(msgs)
        ntext = norm(text)
        for it in items[: self.departing]:
            age = k - (it.departed or k) + 1
            if age in WANT[it.kind.split("/")[0]]:
                it.seen[age] = present(it, text, ntext)
        summary = next((str(m.get("content")) for m in msgs if m["role"] == "system"
                        and str(m.get("content", "")).startswith(SUMMARY_START)), "")
        lines = summary_lines(summary)
        new = [ln for ln in lines if ln.raw not in self.r.lines]
        for ln in new:
            self.r.lines[ln.raw] = (ln, [x for x in lines if x.section == ln.section])
        pairs = supersession_pairs(self.e.context_state(self.sid).summary, self.archived_text)
        for text, old, replacing in pairs:
            key = norm(text)
            for ln in new:
                if key and key in norm(ln.raw):
                    self.r.pairs.setdefault(ln.raw, (old, replacing))

    def archived_text(self, message_id: int) -> str:
        return text_of(self.e.archive.get_many([message_id]).get(message_id) or {})

    def finish(self) -> None:
        msgs = self.e.context_messages(self.sid)
        text = model_input_text(msgs)
        ntext = norm(text)
        k = self.r.compactions
        for it in self.r.items[: self.departing]:
            it.final_age = k - (it.departed or k) + 1
            it.final = present(it, text, ntext)


def present(it: Item, text: str, ntext: str) -> bool:
    if it.kind.startswith("rule"):
        return it.key in ntext
    keys = (it.key, *it.alts)
    return any(k in text or k.replace("\\", "/") in text for k in keys)


async def replay(t: Transcript, policy_name: str, policy: CompactionPolicy, root: Path,
                 at_end: Callable[[Engine, str], None] | None = None) -> Replay:
    """`at_end(engine, session_id)` looks at the replayed session before the engine
    closes."""
    r = Replay(t.name, policy_name, messages=len(t.messages))
    msgs = t.messages
    r.source = norm(model_input_text(msgs))
    r.items = sorted(user_rules(msgs) + edited_files(msgs, t.cwd) + tool_ids(msgs),
                     key=lambda it: it.msg_index)
    by_index: dict[int, list[Item]] = {}
    for it in r.items:
        by_index.setdefault(it.msg_index, []).append(it)
    engine = Engine(Config(data_dir=root, compaction=policy))
    auto = AutoCompactor(engine)
    started = time.perf_counter()
    try:
        sid = engine.create_session(title=t.name).session_id
        checker = Checker(engine, sid, r)
        engine.add_listener(checker)
        turns = turns_of(msgs)
        r.turns = len(turns)
        for turn in turns:
            run = engine.start_run(sid)
            for step in turn:
                ids = engine.append(sid, [msgs[i] for i in step], run_id=run.run_id)
                for i, mid in zip(step, ids.message_ids, strict=True):
                    for it in by_index.get(i, ()):
                        it.msg_id = mid
            done = engine.finish_run(run.run_id, "completed")
            if done.auto_compaction_scheduled:
                auto.maybe_schedule(sid, due=True)
                await asyncio.gather(*auto.running())
            if checker.failure is not None:
                raise checker.failure
        checker.finish()
        r.attempts = attempts(engine, sid, checker.begins)
        if at_end is not None:
            at_end(engine, sid)
    finally:
        r.seconds = time.perf_counter() - started
        engine.close()
    return r


def attempts(engine: Engine, sid: str, begins: dict[str, tuple[int, dict[int, int]]]
             ) -> list[Attempt]:
    out: list[Attempt] = []
    log = engine.compaction_log(sid, limit=100_000)
    for entry in reversed(log):
        e = msgspec.to_builtins(entry)  # its wire form: camelCase keys
        began = begins.get(e["compactionId"])
        if began is None or e.get("afterTokens") is None or e.get("error"):
            continue
        old_summary, tail = began
        upto = e.get("summarizedTo")
        left = sum(n for i, n in tail.items() if upto is not None and i <= upto)
        replaced = old_summary + left
        new_summary = e["afterTokens"] - (e["beforeTokens"] - replaced)
        out.append(Attempt(bool(e["effective"]), e["beforeTokens"], e["afterTokens"],
                           replaced, new_summary, float(e["durationMs"])))
    return out


def revision(path: Path) -> str:
    try:
        rev = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain",
                                "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (rev or "unknown") + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine() -> str:
    return (f"{platform.platform()}, Python {platform.python_version()}, "
            f"{os.cpu_count()} CPUs")


async def measure(paths: list[Path], say: Callable[[str], None], tiny: bool = False
                  ) -> tuple[list[Replay], list[str]]:
    root = Path(tempfile.mkdtemp(prefix="ctxd-retention-real-"))
    out: list[Replay] = []
    skipped: list[str] = []
    try:
        for n, path in enumerate(paths):
            try:
                t = load(path, root / f"import-{n}")
            except Exception as exc:  # an importer crash is reported, not fatal
                skipped.append(f"{path.parent.name}/{path.stem}: the importer failed: "
                               f"{type(exc).__name__}: {exc}")
                continue
            if len(t.messages) < 4:
                skipped.append(f"{t.name}: only {len(t.messages)} messages imported")
                continue
            for p, (name, policy) in enumerate(policies(tiny).items()):
                try:
                    r = await replay(t, name, policy, root / f"replay-{n}-{p}")
                except Exception as exc:  # reported; the other transcripts still run
                    skipped.append(f"{t.name} [{name}]: the replay failed: "
                                   f"{type(exc).__name__}: {exc}")
                    say(skipped[-1])
                    continue
                r.notes = [f"{t.name}: {note}" for note in t.notes]
                say(f"{t.name} [{name}]: {r.messages} messages, {r.turns} turns, "
                    f"{r.compactions} compactions, {r.seconds:.1f} s")
                out.append(r)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out, skipped


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="two transcripts only")
    ap.add_argument("--only", action="append", default=[],
                    help="transcripts whose name contains this (repeatable)")
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--tiny", action="store_true",
                    help="a third policy, max 16 / keep 6, for short transcripts")
    ap.add_argument("--out", type=Path, help="write the report here (default: "
                    "bench/results/retention_real.md, not with --quick or --only)")
    args = ap.parse_args()
    paths = sorted(args.data.glob("*/*.jsonl"))
    wanted = list(QUICK) if args.quick else args.only
    if wanted:
        paths = [p for p in paths if any(w in f"{p.parent.name}/{p.stem}" for w in wanted)]
    started = time.perf_counter()
    replays, skipped = asyncio.run(
        measure(paths, lambda s: print(s, flush=True), args.tiny))
    ctxd_dir = Path(ctxd.__file__).resolve().parent
    # transcripts of another folder (bench/data/heldout: never used to tune the summarizer)
    held = "" if args.data.resolve() == DATA.resolve() else f" ({args.data.name})"
    head = (
        f"# Retention on real conversations{held}\n\n"
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; ctxd at "
        f"{revision(ctxd_dir)}; bench at {revision(HERE)}; {machine()}; "
        f"{time.perf_counter() - started:.0f} s in all.\n"
    )
    text = head + "\n" + render(replays, skipped)
    print("\n" + text)
    out = args.out or (None if wanted else RESULTS / "retention_real.md")
    if out is not None:
        out.write_text(text)
        print(f"written to {out}")


if __name__ == "__main__":
    main()
