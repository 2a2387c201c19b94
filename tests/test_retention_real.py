"""A real public transcript replayed end to end: the guarantees that hold whatever the
summarizer's quality.

The transcript (bench/data/transcripts/claude-code/posthog-impact-dashboard-zh.jsonl, an
interactive Claude Code session in English and Chinese with task notifications and a
continued conversation) is read with ctxd's own importer into a real SQLite file, then
replayed turn by turn through runs with auto-compaction under a small policy (max 40
active messages, keep 12), as `bench/retention_real.py` does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from bench.retention_real import Replay, replay
from bench.retention_real_extract import (
    edited_files,
    load,
    norm,
    tool_ids,
    user_rules,
)
from bench.retention_real_lines import (
    BOILERPLATE,
    SummaryLine,
    in_section,
    marks_superseded,
    summary_lines,
)
from ctxd.daemon.config import CompactionPolicy
from ctxd.daemon.engine import Engine

TRANSCRIPT = (Path(__file__).resolve().parent.parent / "bench" / "data" / "transcripts"
              / "claude-code" / "posthog-impact-dashboard-zh.jsonl")


@dataclasses.dataclass
class Seen:
    replay: Replay
    archive_ids: set[int]
    sources: list[tuple[str, str, list[int]]]  # section, item text, sources
    compaction_count: int


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> Seen:
    root = tmp_path_factory.mktemp("retention-real")
    transcript = load(TRANSCRIPT, root / "import")
    assert len(transcript.messages) > 100
    policy = dataclasses.replace(CompactionPolicy(), max_active_messages=40, keep_messages=12)
    found: dict[str, Any] = {}

    def at_end(engine: Engine, sid: str) -> None:
        ids: set[int] = set()
        after = 0
        while True:
            page = engine.read_archive(sid, after_id=after, limit=500)
            ids |= {m["id"] for m in page.messages}
            if page.next_after_id is None:
                break
            after = page.next_after_id
        st = engine.context_state(sid)
        found["ids"] = ids
        found["sources"] = [(name, item.text, list(item.sources))
                            for name, item in st.summary.items()]
        found["count"] = st.compaction_count

    r = asyncio.run(replay(transcript, "small", policy, root / "replay", at_end))
    return Seen(r, found["ids"], found["sources"], found["count"])


def test_the_replay_compacts_several_times(seen: Seen) -> None:
    assert seen.compaction_count >= 3
    assert seen.replay.compactions == seen.compaction_count
    assert seen.sources, "the final context has a summary"


def test_every_summary_item_cites_archived_messages_of_the_session(seen: Seen) -> None:
    for section, text, sources in seen.sources:
        assert sources, f"{section} item {text[:60]!r} cites nothing"
        unknown = [s for s in sources if s not in seen.archive_ids]
        assert not unknown, f"{section} item {text[:60]!r} cites {unknown[:5]}"


def test_no_committed_compaction_made_the_model_input_bigger(seen: Seen) -> None:
    committed = [a for a in seen.replay.attempts if a.effective]
    assert len(committed) == seen.compaction_count
    for a in committed:
        assert a.after < a.before, f"{a.before} -> {a.after} tokens"


def test_no_compaction_attempt_proposed_a_bigger_model_input(seen: Seen) -> None:
    """The summary a compaction proposes is smaller than what it replaces, refused
    attempts included (issue 19: a compaction never makes the model input bigger)."""
    assert seen.replay.attempts
    for a in seen.replay.attempts:
        assert a.after < a.before, f"proposed {a.after} tokens against {a.before}"
        assert a.summary < a.replaced, f"summary {a.summary} tokens for {a.replaced} replaced"


def test_goals_hold_no_transcript_markup_target_of_issue_19(seen: Seen) -> None:
    """Transcript markup (task notifications, continuation preambles, command tags...)
    stays in the archive only. At main 220cd79 this fails: task notifications of this
    transcript become Goals items; the summarizer work of issue 19 is to fix it."""
    goals = [ln for ln, _ in seen.replay.lines.values() if in_section(ln, "goals")]
    assert goals, "the summaries had goals"
    markup = [ln.raw for ln in goals if BOILERPLATE.search(ln.text)]
    assert not markup, f"{len(markup)} of {len(goals)} Goals items are markup: {markup[:3]}"


def test_joined_guesses_quoting_an_arrow_are_no_correction() -> None:
    """bench/retention_real.py counts the summarizer's correction marks; an arrow the
    transcript wrote, inside one of two guesses joined on a line, is none of them."""
    source = norm(
        "Intake → Plan → Deliver workflow with measurable hypotheses and acceptance "
        "criteria. it doesnt add the correct file tree, it seems to be hard coded with "
        "this cwd. The export batch is 500 rows."
    )
    joined = ("- [unconfirmed] Intake → Plan → Deliver workflow with measurable hypotheses "
              "and acceptance criteria. #37; it doesnt add the correct file tree, it seems "
              "to be h… #52")
    cut = "- [unconfirmed] Intake → Plan → Deliver workflow with measura… #37"
    real = "- The export batch is 500 rows → 2000 rows. #60"
    was = "- The export batch is 2000 rows. (was 500 rows) #60"
    both = "- [unconfirmed] Intake → Plan → Deliver workflow. #37; batch 500 → 2000 #61"

    def line(raw: str, section: str = "Open items") -> SummaryLine:
        return next(iter(summary_lines(f"Summary of earlier messages\n## {section}\n{raw}")))

    assert not marks_superseded(line(joined), source)
    assert not marks_superseded(line(cut), source)
    assert marks_superseded(line(real, "Constraints and user corrections"), source)
    assert marks_superseded(line(was, "Constraints and user corrections"), source)
    assert marks_superseded(line(both), source)


# ------------------------------------------------------- what the count itself reads


def _call(cid: str, name: str, args: str) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def test_the_count_reads_heredocs_pulls_and_unanswered_calls_right() -> None:
    script = ("mkdir -p docs\ncat > docs/README.md << 'EOF'\nre.split(r\"[|>]?\\s*\\n\", s)\n"
              "EOF\necho done > build.log")
    msgs = [
        {"role": "assistant", "content": None, "tool_calls": [
            _call("c1", "Bash", json.dumps({"command": script})),
            _call("c2", "Edit", json.dumps({"file_path": "src/never_ran.ts"})),
            _call("c3", "Bash", json.dumps({"command": "git pull && git push"})),
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
        {"role": "tool", "tool_call_id": "c3", "content":
         "   e33d0e7..bd68183  main -> origin/main\n * [new branch]      feat/esm -> "
         "origin/feat/esm\nTo github.com:a/b.git\n   bd68183..c0ffee1  main -> main\n"},
    ]
    # the heredoc's body is data; the Edit that never got a result changed nothing
    assert [it.key for it in edited_files(msgs, "")] == ["docs/README.md", "build.log"]
    # what the pull brought in is the remote's; the push's head is the call's
    assert [it.key for it in tool_ids(msgs)] == ["c0ffee1"]


def test_the_count_takes_more_cue_words_for_rules_and_no_skill_text() -> None:
    msgs = [
        {"role": "user", "content": "Strict mode is on — no `any` types, ever. "
         "Prefer `type` over `interface`. There is no test for it yet. Which do you prefer?"},
        {"role": "user", "content": "不，我希望用旧的；summary里的格式应该用旧的。"
         "这个应该是缓存的问题。别用新的模板。不需要加注释。"},
        {"role": "user", "content": "Base directory for this skill: ~/.claude/skills/x\n"
         "- Never edit the log by hand."},
        {"role": "user", "content": "- You must keep it short.", "metadata": {"meta": True}},
    ]
    assert [it.key for it in user_rules(msgs)] == [
        "strict mode is on — no `any` types, ever", "prefer `type` over `interface`",
        "summary里的格式应该用旧的", "别用新的模板", "不需要加注释",
    ]
