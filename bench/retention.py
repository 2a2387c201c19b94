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

The report ends with the kinds-of-facts measures of `bench/retention_kinds.py` (latest
value wins, hedges kept, the agent's own files and tool ids, pointer share, summary
size), before (bench/results/retention-kinds-before.md) and at this revision, then the
totals of `bench/retention_real.py`: real public transcripts replayed through runs.

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
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from ctxd.daemon.config import Config, load_config
from ctxd.daemon.engine import Engine
from ctxd.daemon.recall import call_tool
from ctxd.protocol.errors import CtxdError

# Run as a script, the repository root is not on sys.path; the `bench` modules need it.
if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import retention_kinds, retention_real, retention_real_report  # noqa: E402
from bench.retention_facts import (  # noqa: E402
    FULL,
    KIND_LABELS,
    KINDS,
    SMALL,
    Fact,
    Sizes,
)
from bench.retention_writer import (  # noqa: E402
    DENY_REASONS,
    SessionWriter,
    Turn,
    plan_session,
)

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_SEED = 20240611


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
        return list(self.engine.append(sid, msgs, run_id=run_id).message_ids)

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
                        e.resolve_approval(approval.approval_id, "approved")
                    else:
                        reason = self.rng.choice(DENY_REASONS)
                        e.resolve_approval(approval.approval_id, "denied", reason)
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
    return any(h.message_id == message_id for h in hits.data["hits"])


async def run_session(
    engine: Engine, lang: str, sizes: Sizes, rng: random.Random, title: str
) -> SessionResult:
    sid = engine.create_session(title=title).session_id
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
            result = msgspec.to_builtins(await engine.compact(sid))
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
        "*Current marked superseded* (and the few current facts not kept) counts each "
        "planted fact on its own, but the generator may later plant another value for the "
        "same setting or choice (\"Scratch that: the media client should retry 3 times\" "
        "after the pair that set it to 2; \"Use requests for HTTP calls in catalog\" after "
        "aiohttp; \"We'll use DuckDB for the payments search index\" after Celery). The "
        "summary supersedes by subject and value, so the earlier one is marked superseded "
        "(and, being history, is the first to go under the budget), as it should be; those "
        "are the cases these columns show."
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
        real = retention_real_report.totals(
            (await retention_real.measure(sorted(retention_real.DATA.glob("*/*.jsonl")),
                                          lambda s: None))[0])
        print(real, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return report(blocks, notes, sizes, args.seed) + kinds_section(kinds) + "\n" + real


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
