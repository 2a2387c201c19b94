"""Step projection, drift control, rebuild previews and the auto-compaction pause."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from helpers import agent_turn, make_config, tool_turn

from ctxd.daemon.engine import Engine
from ctxd.daemon.projection import RECALL_HEADER
from ctxd.daemon.summarizers.builtin import BuiltinSummarizer
from ctxd.daemon.summary import Summary, SummaryRequest
from ctxd.protocol.errors import SummarizerFailed
from ctxd.protocol.types import CompactResult


def _session(engine: Engine, turns: int) -> str:
    sid = engine.create_session().session_id
    engine.append(sid, [{"role": "system", "content": "You are an agent."}])
    engine.append(sid, [{"role": "user", "content": "The deploy password rotates on "
                                                    "Fridays; remember the walrus."}])
    for i in range(turns):
        engine.append(sid, agent_turn(i))
    return sid


def test_budget_projection_keeps_pairs_and_says_what_it_left_out(engine: Engine) -> None:
    sid = _session(engine, 8)
    stored = engine.context_messages(sid)
    version = engine.status(sid).version
    full = sum(engine.tokens.count_message(m) for m in stored)
    out = engine.get_context(sid, budget_tokens=full // 2)
    msgs = out.messages
    assert msgs[0]["content"] == "You are an agent."
    assert out.estimated_tokens <= full // 2
    assert out.estimated_tokens == sum(engine.tokens.count_message(m) for m in msgs)
    tail = msgs[1:]
    assert tail and tail[0]["role"] != "tool"
    calls = {c["id"] for m in tail for c in m.get("tool_calls") or ()}
    assert all(m["tool_call_id"] in calls for m in tail if m["role"] == "tool")
    # the kept tail is a suffix of the stored context, and the rest is reported
    assert stored[-len(tail):] == tail
    assert out.truncated.messages == len(stored) - len(msgs)
    # the stored context is untouched
    assert engine.context_messages(sid) == stored
    assert engine.status(sid).version == version
    roomy = engine.get_context(sid, budget_tokens=full * 2)
    assert roomy.truncated is None and roomy.messages == stored


def test_query_recalls_what_left_the_context(engine: Engine) -> None:
    sid = _session(engine, 25)
    asyncio.run(engine.compact(sid))
    assert not engine.search("walrus", session_id=sid)[0].in_active_context
    out = engine.get_context(sid, budget_tokens=4000, query="walrus")
    recall = [m for m in out.messages if m["content"] and RECALL_HEADER in m["content"]]
    assert len(recall) == 1 and "remember the walrus" in recall[0]["content"]
    assert out.recalled_ids == [2]
    assert out.estimated_tokens <= 4000
    # nothing relevant outside the context: no recall message
    out = engine.get_context(sid, query="zzzunmatched")
    assert out.recalled_ids == [] and not any(
        RECALL_HEADER in (m["content"] or "") for m in out.messages)


class ModelLikeSummarizer(BuiltinSummarizer):
    """A summarizer whose errors could compound, as a model's can."""

    name = "model-like"
    drifts = True


def _compact_rounds(engine: Engine, sid: str, rounds: int) -> list[CompactResult]:
    results = []
    for round_ in range(rounds):
        for i in range(6):
            engine.append(sid, agent_turn(100 * (round_ + 1) + i))
        results.append(asyncio.run(engine.compact(sid, force=True)))
    assert all(r.effective for r in results)
    return results


def test_drift_bound_rederives_from_the_archive(tmp_path: Path) -> None:
    engine = Engine(make_config(tmp_path, rederive_after=2), summarizer=ModelLikeSummarizer())
    sid = _session(engine, 4)
    results = _compact_rounds(engine, sid, 4)
    assert [r.rederived for r in results] == [False, False, True, False]
    summary = engine.context_state(sid).summary
    # the re-derived summary starts again from the first archived message after the
    # system prompt, and its provenance restarts at that compaction
    assert summary.covers_from == 2
    assert summary.compaction_ids == [results[2].compaction_id, results[3].compaction_id]
    assert summary.depth == 1
    engine.close()


def test_the_extractive_builtin_summarizer_is_never_rederived(tmp_path: Path) -> None:
    engine = Engine(make_config(tmp_path, rederive_after=2))
    sid = _session(engine, 4)
    results = _compact_rounds(engine, sid, 4)
    assert [r.rederived for r in results] == [False] * 4
    assert engine.context_state(sid).summary.depth == 4
    engine.close()


def test_rebuild_dry_run_previews_without_committing(engine: Engine) -> None:
    sid = _session(engine, 25)
    asyncio.run(engine.compact(sid))
    engine.append(sid, agent_turn(99))
    before_ctx = engine.context_messages(sid)
    before = engine.status(sid)
    preview = asyncio.run(engine.rebuild(sid, dry_run=True))
    assert preview.dry_run is True and preview.compaction_id is None
    assert engine.context_messages(sid) == before_ctx
    assert engine.status(sid).version == before.version
    assert preview.diff["messages"] == preview.after.messages - before.active_messages
    assert preview.diff["tokens"] == preview.after.tokens - before.estimated_tokens
    assert len(preview.messages) == preview.after.messages
    committed = asyncio.run(engine.rebuild(sid))
    assert engine.context_messages(sid) == preview.messages
    assert committed.after == preview.after


class FailingSummarizer:
    name = "failing"

    def __init__(self) -> None:
        self.fail = True

    async def summarize(self, request: SummaryRequest) -> Summary:
        if self.fail:
            raise RuntimeError("model endpoint returned HTTP 500")
        from ctxd.daemon.summarizers.builtin import BuiltinSummarizer

        return await BuiltinSummarizer().summarize(request)


def test_three_auto_failures_pause_until_a_manual_success(tmp_path: Path) -> None:
    summarizer = FailingSummarizer()
    engine = Engine(make_config(tmp_path), summarizer=summarizer)
    sid = _session(engine, 21)
    for _ in range(3):
        assert engine.auto_compaction_due(sid)
        with pytest.raises(SummarizerFailed):
            asyncio.run(engine.compact(sid, trigger="auto"))
    assert engine.status(sid).auto_compaction_paused is True
    assert not engine.auto_compaction_due(sid)
    log = engine.compaction_log(sid)
    assert len(log) == 3 and all("HTTP 500" in (row.error or "") for row in log)
    summarizer.fail = False
    assert asyncio.run(engine.compact(sid)).effective
    assert engine.status(sid).auto_compaction_paused is False
    engine.close()


def test_pending_tool_call_at_the_end_is_never_summarized(engine: Engine) -> None:
    sid = _session(engine, 21)
    call, _ = tool_turn(777)
    engine.append(sid, [call])
    assert asyncio.run(engine.compact(sid, force=True)).effective
    ctx = engine.context_messages(sid)
    assert any(c["id"] == "call_777" for m in ctx for c in m.get("tool_calls") or ())
