"""Markdown tables for `bench/retention_real.py`: per transcript and in total, per policy."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from bench.retention_real_extract import (
    CORRECTION_CUE,
    FORCE,
    Item,
    has_force,
)
from bench.retention_real_lines import (
    BOILERPLATE,
    CORRECTION,
    SummaryLine,
    in_section,
    marks_superseded,
    not_a_correction,
    superseded_parts,
)

if TYPE_CHECKING:
    from bench.retention_real import Replay

SAMPLE = 30
SMALL_SPAN = 5_000  # replaced tokens: a span this small is where a fixed-size summary hurts


def _pct(hits: int, n: int) -> str:
    return f"{100 * hits / n:.0f}% of {n}" if n else "—"


def _share(items: Iterable[Item], age: int | None, final_from: int | None = None) -> str:
    """Present at `age` compactions after leaving the tail; or, with `final_from`, at the
    end of the replay among those that left it at least that many compactions before."""
    hits = n = 0
    for it in items:
        if final_from is not None:
            if it.final is None or it.final_age < final_from:
                continue
            ok = it.final
        else:
            if age not in it.seen:
                continue
            ok = it.seen[age]
        n += 1
        hits += ok
    return _pct(hits, n)


def _share_ages(items: Iterable[Item], ages: Sequence[int]) -> str:
    checks = [ok for it in items for a, ok in it.seen.items() if a in ages]
    return _pct(sum(checks), len(checks))


def _table(head: Sequence[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _groups(replays: list[Replay]) -> dict[str, list[Replay]]:
    by: dict[str, list[Replay]] = {}
    for r in replays:
        by.setdefault(r.policy, []).append(r)
    return by


def _compaction_row(name: str, rs: list[Replay]) -> list[str]:
    attempts = [a for r in rs for a in r.attempts]
    ratios = [a.summary / a.replaced for a in attempts if a.replaced > 0]
    grew = sum(a.after >= a.before for a in attempts)
    refused = sum(not a.effective for a in attempts)
    ms = [a.ms for a in attempts]
    ratio = (f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})"
             if ratios else "—")
    spans = [a.replaced for a in attempts]
    small = [a.summary / a.replaced for a in attempts if 0 < a.replaced < SMALL_SPAN]
    small_cell = f"{statistics.median(small):.2f} ({len(small)})" if small else "— (0)"
    return [
        name,
        str(sum(r.messages for r in rs)),
        str(sum(r.turns for r in rs)),
        str(sum(r.compactions for r in rs)),
        str(len(attempts)),
        str(refused),
        str(grew),
        ratio,
        f"{statistics.median(spans):,.0f}" if spans else "—",
        small_cell,
        f"{statistics.mean(ms) / 1000:.2f}" if ms else "—",
    ]


def _rules_row(name: str, rs: list[Replay]) -> list[str]:
    items = [it for r in rs for it in r.items]
    rules = [it for it in items if it.kind.startswith("rule")]
    pre = [it for it in rules if it.kind == "rule/preamble"]
    return [
        name,
        f"{len(rules)} ({len(pre)} preamble)",
        _share(rules, 1),
        _share(rules, 3),
        _share(rules, None, final_from=5),
        _share(pre, None, final_from=1) if pre else "—",
    ]


def _files_row(name: str, rs: list[Replay]) -> list[str]:
    items = [it for r in rs for it in r.items]
    files = [it for it in items if it.kind == "file"]
    ids = [it for it in items if it.kind.startswith("id")]
    return [
        name,
        str(len(files)),
        _share(files, 1),
        _share(files, 2),
        _share(files, None, final_from=3),
        str(len(ids)),
        _share_ages(ids, (1, 2, 3)),
    ]


def _summary_row(name: str, rs: list[Replay]) -> list[str]:
    lines = [ln for r in rs for ln, _ in r.lines.values()]
    cons = [ln for ln in lines if in_section(ln, "constraints")]
    no_rule = [ln for ln in cons if not has_force(ln.text) and not CORRECTION.search(ln.raw)]
    no_force = [ln for ln in no_rule
                if not FORCE.search(ln.text) and not CORRECTION_CUE.search(ln.text)]
    goals = [ln for ln in lines if in_section(ln, "goals")]
    sup = [(ln, sec) for r in rs for ln, sec in r.lines.values() if marks_superseded(ln, r.source)]
    auto_no = sum(not_a_correction(*_parts(r, ln, sec)) is not None
                  for r in rs for ln, sec in r.lines.values()
                  if marks_superseded(ln, r.source))
    boiler = sum(bool(BOILERPLATE.search(ln.text)) for ln in lines)
    boiler_goals = sum(bool(BOILERPLATE.search(ln.text)) for ln in goals)
    return [
        name,
        str(len(lines)),
        str(len(cons)),
        _pct(len(no_rule), len(cons)),
        _pct(len(no_force), len(cons)),
        str(len(sup)),
        _pct(auto_no, len(sup)),
        _pct(boiler, len(lines)),
        _pct(boiler_goals, len(goals)),
    ]


def _per_policy(title: str, head: list[str], row, replays: list[Replay],
                extra: Callable[[list[Replay]], list[list[str]]] | None = None) -> list[str]:
    out = [f"### {title}", ""]
    for policy, rs in _groups(replays).items():
        rows = [row(r.transcript, [r]) for r in rs] + [row("**all**", rs)]
        rows += extra(rs) if extra else []
        out += [f"Policy {policy}:", ""] + _table(head, rows) + [""]
    return out


def _rules_by_cue(rs: list[Replay]) -> list[list[str]]:
    """The total again, for rules with a deontic cue and for preamble lines without."""
    out = []
    for label, keep in (("**all: with a deontic cue**", True),
                        ("**all: preamble lines without a cue**", False)):
        sub = [dataclasses.replace(r, items=[
            it for it in r.items if it.kind.startswith("rule")
            and has_force(it.key) == keep]) for r in rs]
        out.append(_rules_row(label, sub))
    return out


def _sample(replays: list[Replay]) -> list[str]:
    seen: set[str] = set()
    rows: list[list[str]] = []
    for r in replays:
        for ln, sec in r.lines.values():
            if not marks_superseded(ln, r.source) or ln.raw in seen or len(rows) >= SAMPLE:
                continue
            seen.add(ln.raw)
            old, new = _parts(r, ln, sec)
            verdict = not_a_correction(old, new) or "maybe a correction"
            cell = [r.transcript, ln.section, _cut(ln.raw), _cut(old), _cut(new), verdict]
            rows.append([c.replace("|", "\\|").replace("\n", " ") for c in cell])
    if not rows:
        return ["No summary item was marked as superseded.", ""]
    return _table(["transcript", "section", "line", "old statement", "new statement",
                   "automatic verdict"],
                  rows) + [""]


def _parts(r: Replay, ln: SummaryLine, sec: list[SummaryLine]) -> tuple[str, str]:
    """Old and new statement: from the summary's structure when the replay saw it, else
    from the text."""
    return r.pairs.get(ln.raw) or superseded_parts(ln, sec)


def _cut(s: str, n: int = 160) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def render(replays: list[Replay], skipped: list[str]) -> str:
    out: list[str] = []
    out += _per_policy(
        "Compactions",
        ["transcript", "messages", "turns", "compactions", "attempts", "refused",
         "grew the input", "summary / replaced tokens, median (range)",
         "replaced tokens, median", "ratio when under 5k replaced (n)", "s / attempt"],
        _compaction_row, replays)
    out += [
        "An attempt *grew the input* when its proposed model input had at least as many "
        "tokens as before (the engine refuses such a compaction, so a refused attempt "
        "leaves the context as it was). *Replaced* = the old pins + summary message plus "
        "the tail messages that left.", ""]
    out += _per_policy(
        "User rules in the model input",
        ["transcript", "rules", "1 compaction after leaving the tail", "3 after",
         "at the end, 5+ after", "preamble lines at the end"],
        _rules_row, replays, _rules_by_cue)
    out += [
        "A rule is a sentence of a user message with deontic force (must, never, always, "
        "only, do not / don't, make sure, should not; 必须, 不要, 禁止, 务必, 只能, 不得; not "
        "\"read-only\" nor \"I never said\"; outside a question also mandatory, prefer, "
        "\"no X\" opening a sentence or clause, 不需要, 别, 应该 but not 应该是) or a "
        "line of an AGENTS.md / CLAUDE.md preamble sent as a user message; present = found "
        "in the model input (system messages, pins + summary, tail) after whitespace "
        "normalisation and case folding. Each distinct rule counts once, at its last "
        "statement, and only once that message has left the tail.", ""]
    out += _per_policy(
        "Agent-edited files and tool-produced ids in the model input",
        ["transcript", "files", "1 after", "2 after", "at the end, 3+ after", "tool ids",
         "within 3 compactions"],
        _files_row, replays)
    out += _per_policy(
        "Summary items (distinct over all compactions)",
        ["transcript", "items", "constraint items", "constraint items with no rule",
         "no force nor correction cue", "superseded-marked",
         "of which no correction (automatic)", "boilerplate items",
         "boilerplate Goals items"],
        _summary_row, replays)
    out += [
        "*No rule*: no deontic cue and no correction mark. *No force nor correction "
        "cue*: of those, the items with none of the summarizer's other cues either "
        "(avoid, ensure, no longer, shouldn't, 不能, 不准, 一定要, 确保...; a correction's "
        "\"no, …\", \"instead\", \"actually\", 不对, 改成...). *Superseded-marked*: "
        "`[superseded]`, `(was …)` or ` → `. Automatic estimate of *no correction*: the "
        "old and new text are identical, differ only in numbers (a numbered series), or "
        "either is pasted output. *Boilerplate*: transcript markup (environment context, "
        "command tags, task notifications, system reminders, IDE context, continuation "
        "preambles, user_instructions, image and redaction placeholders).", ""]
    out += ["### Superseded items, a sample to judge", ""] + _sample(replays)
    notes = sorted({n for r in replays for n in r.notes})
    if skipped or notes:
        out += ["### Transcripts skipped, importer notes", ""]
        out += [f"- skipped: {s}" for s in skipped] + [f"- {n}" for n in notes] + [""]
    return "\n".join(out)


def totals(replays: list[Replay]) -> str:
    """The totals of each table, one row per policy (for bench/retention.py's report)."""
    groups = _groups(replays)
    out = [
        "### Real conversations",
        "",
        f"{len({r.transcript for r in replays})} public Claude Code and Codex transcripts "
        "(bench/data/transcripts) replayed turn by turn through runs with auto-compaction "
        "by `bench/retention_real.py`; totals per policy here, per transcript and the "
        "superseded sample in `bench/results/retention_real.md`.",
        "",
    ]
    sections = (
        (["policy", "messages", "turns", "compactions", "attempts", "refused",
          "grew the input", "summary / replaced tokens, median (range)",
          "replaced tokens, median", "ratio when under 5k replaced (n)", "s / attempt"],
         _compaction_row),
        (["policy", "rules", "1 compaction after leaving the tail", "3 after",
          "at the end, 5+ after", "preamble lines at the end"], _rules_row),
        (["policy", "files", "1 after", "2 after", "at the end, 3+ after", "tool ids",
          "within 3 compactions"], _files_row),
        (["policy", "items", "constraint items", "constraint items with no rule",
          "no force nor correction cue", "superseded-marked",
         "of which no correction (automatic)", "boilerplate items",
          "boilerplate Goals items"], _summary_row),
    )
    for head, row in sections:
        out += _table(head, [row(policy, rs) for policy, rs in groups.items()]) + [""]
    return "\n".join(out)
