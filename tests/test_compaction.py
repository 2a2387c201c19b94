"""Compaction: pair-safe tail boundaries, effectiveness, approvals, incremental summaries,
concurrency with appends, pins, rebuild."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from helpers import agent_turn, make_config, tool_turn
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxd.daemon.compaction.rules import tail_boundary, valid_boundaries
from ctxd.daemon.engine import Engine
from ctxd.daemon.summarizers.builtin import BuiltinSummarizer
from ctxd.daemon.summary import Summary, SummaryRequest
from ctxd.protocol.errors import ApprovalPending, SummarizerFailed

# random sessions for the boundary properties


@st.composite
def sessions(draw: Any) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    n_turns = draw(st.integers(1, 25))
    call = 0
    for _ in range(n_turns):
        kind = draw(st.sampled_from(["user", "assistant", "tools", "tools", "system"]))
        if kind in ("user", "assistant", "system"):
            msgs.append({"role": kind, "content": "x"})
            continue
        width = draw(st.integers(1, 4))
        ids = [f"c{call + k}" for k in range(width)]
        call += width
        msgs.append({"role": "assistant", "content": None,
                     "tool_calls": [{"id": i, "type": "function",
                                     "function": {"name": "f", "arguments": "{}"}} for i in ids]})
        answered = draw(st.lists(st.sampled_from(ids), unique=True))
        for i in answered:
            msgs.append({"role": "tool", "tool_call_id": i, "content": "r"})
    return msgs


def _check_boundary(msgs: list[dict[str, Any]], b: int) -> None:
    assert 0 < b < len(msgs)
    prefix, tail = msgs[:b], msgs[b:]
    assert tail[0]["role"] != "tool"
    prefix_calls = {c["id"] for m in prefix for c in m.get("tool_calls") or ()}
    tail_results = {m["tool_call_id"] for m in tail if m["role"] == "tool"}
    # no call leaves the context while its result stays
    assert not (prefix_calls & tail_results)
    # a call whose result may still come (nothing but tool messages after it) stays
    last_non_tool = max(i for i, m in enumerate(msgs) if m["role"] != "tool")
    for i, m in enumerate(prefix):
        answered = {x["tool_call_id"] for x in msgs if x["role"] == "tool"}
        for c in m.get("tool_calls") or ():
            if c["id"] not in answered:
                assert last_non_tool > i, "summarized a call still awaiting its result"


@settings(max_examples=300, deadline=None)
@given(sessions(), st.integers(1, 30), st.booleans())
def test_tail_boundary_never_splits_tool_pairs(msgs: list[dict[str, Any]], keep: int,
                                               force: bool) -> None:
    for b in valid_boundaries(msgs):
        _check_boundary(msgs, b)
    b = tail_boundary(msgs, keep=keep, force=force)
    if b is None:
        return
    _check_boundary(msgs, b)
    if force:
        # the latest user message stays when a boundary before it moves at least half
        # of what force mode aims to move; else it may leave (issue: a manual compaction
        # of a long tool chain after one request must be possible)
        users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
        target = len(msgs) - min(keep, max(1, len(msgs) // 2))
        before = [i for i in valid_boundaries(msgs) if users and i <= users[-1]]
        if before and before[-1] >= target // 2:
            assert b <= users[-1], "force mode summarized the latest user message"


def test_parallel_calls_stay_with_all_their_results() -> None:
    msgs = [{"role": "user", "content": "go"}]
    msgs.append({"role": "assistant", "content": None, "tool_calls": [
        {"id": f"p{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        for i in range(3)]})
    msgs += [{"role": "tool", "tool_call_id": f"p{i}", "content": "r"} for i in range(3)]
    msgs.append({"role": "assistant", "content": "done"})
    assert valid_boundaries(msgs) == [1, 5]


# engine-level compaction


def _fill(engine: Engine, sid: str, turns: int, start: int = 0) -> None:
    for i in range(start, start + turns):
        engine.append(sid, agent_turn(i))


def _recount(engine: Engine, sid: str) -> tuple[int, int]:
    """Messages and tokens of the rendered context, recounted from scratch."""
    msgs = engine.context_messages(sid)
    return len(msgs), sum(engine.tokens.count_message(m) for m in msgs)


def test_auto_limits_and_compaction_keep_about_the_tail(engine: Engine) -> None:
    sid = engine.create_session().session_id
    engine.append(sid, [{"role": "system", "content": "You are a careful agent."}])
    _fill(engine, sid, 20)  # 81 messages
    assert engine.status(sid).active_messages == 81
    assert engine.auto_compaction_due(sid)
    result = asyncio.run(engine.compact(sid, trigger="auto"))
    assert result.effective is True
    status = engine.status(sid)
    # system + summary message + a tail of about 24
    assert 20 <= status.active_messages - 2 <= 28
    assert status.compaction_count == 1 and status.last_compacted_at is not None
    assert (status.active_messages, status.estimated_tokens) == _recount(engine, sid)
    ctx = engine.context_messages(sid)
    assert ctx[0]["content"] == "You are a careful agent."
    assert ctx[1]["role"] == "system" and "Summary of earlier messages" in ctx[1]["content"]
    assert ctx[2]["role"] != "tool"
    assert not engine.auto_compaction_due(sid)


def test_not_effective_compaction_changes_nothing(engine: Engine) -> None:
    sid = engine.create_session().session_id
    # one assistant message with parallel calls, then their results: every boundary
    # would split a call from its result, so nothing can leave (a user message and a
    # long tool chain used to be refused too; force mode now summarizes the request
    # when nothing before it can leave)
    calls = [{"id": f"p{i}", "type": "function",
              "function": {"name": "read_file", "arguments": "{}"}} for i in range(5)]
    engine.append(sid, [{"role": "assistant", "content": None, "tool_calls": calls}])
    engine.append(sid, [{"role": "tool", "tool_call_id": f"p{i}", "content": "ok"}
                        for i in range(5)])
    before = engine.status(sid)
    ctx_before = engine.context_messages(sid)
    result = asyncio.run(engine.compact(sid, force=True))
    assert result.effective is False and result.compaction_id is None
    assert result.reason
    after = engine.status(sid)
    assert after.version == before.version
    assert after.compaction_count == 0
    assert engine.context_messages(sid) == ctx_before
    log = engine.compaction_log(sid)
    assert len(log) == 1 and log[0].effective is False and log[0].committed is False


def test_force_compaction_works_on_short_contexts(engine: Engine) -> None:
    sid = engine.create_session().session_id
    _fill(engine, sid, 3)  # 12 messages, far below the limits
    assert not engine.auto_compaction_due(sid)
    result = asyncio.run(engine.compact(sid, force=True, instructions="focus on mod1"))
    assert result.effective is True
    assert result.after.messages < result.before.messages
    assert result.after.tokens < result.before.tokens
    ctx = engine.context_messages(sid)
    assert any(m["role"] == "user" and m["content"] == "step 2: look at src/mod2.py"
               for m in ctx), "the latest user message must stay"


def test_pending_approval_blocks_compaction_and_user_messages(engine: Engine) -> None:
    sid = engine.create_session().session_id
    _fill(engine, sid, 21)
    run = engine.start_run(sid)
    call, result = tool_turn(99)
    engine.append(sid, [call], run_id=run.run_id)
    approval = engine.request_approval(sid, run.run_id, "call_99", "read_file")
    with pytest.raises(ApprovalPending):
        asyncio.run(engine.compact(sid, force=True))
    with pytest.raises(ApprovalPending):
        engine.append(sid, [{"role": "user", "content": "hurry"}])
    with pytest.raises(ApprovalPending):
        engine.append(sid, [result])
    assert not engine.auto_compaction_due(sid)
    engine.resolve_approval(approval.approval_id, "approved")
    engine.append(sid, [result], run_id=run.run_id)
    assert engine.finish_run(run.run_id, "completed").auto_compaction_scheduled is True


def test_failed_run_schedules_nothing(engine: Engine) -> None:
    sid = engine.create_session().session_id
    run = engine.start_run(sid)
    for i in range(21):
        engine.append(sid, agent_turn(i), run_id=run.run_id)
    assert engine.finish_run(run.run_id, "failed").auto_compaction_scheduled is False


def test_incremental_summary_keeps_earlier_items_and_pointers(engine: Engine) -> None:
    sid = engine.create_session().session_id
    engine.append(sid, [{"role": "user", "content": "You must never edit migrations/."}])
    _fill(engine, sid, 25)
    first = asyncio.run(engine.compact(sid))
    assert first.effective
    s1 = engine.context_state(sid).summary
    constraint = [i for _, i in s1.items() if "never edit migrations" in i.text]
    assert constraint and constraint[0].sources == [1]
    _fill(engine, sid, 25, start=100)
    second = asyncio.run(engine.compact(sid))
    assert second.effective
    # the second compaction only summarized what left the context since the first
    assert second.summarized_from > first.summarized_to
    s2 = engine.context_state(sid).summary
    kept = [i for _, i in s2.items() if "never edit migrations" in i.text]
    assert kept and kept[0].sources == [1]
    assert s2.compaction_ids == [first.compaction_id, second.compaction_id]
    assert s2.covers_from == 1 and s2.covers_to == second.summarized_to
    assert engine.status(sid).compaction_count == 2


class SlowSummarizer:
    """A summarizer that takes its time, as a model endpoint does."""

    name = "slow-builtin"

    def __init__(self) -> None:
        self.inner = BuiltinSummarizer()
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def summarize(self, request: SummaryRequest) -> Summary:
        self.started.set()
        await self.release.wait()
        return await self.inner.summarize(request)


def test_appends_during_a_slow_compaction_are_kept_exactly(tmp_path: Path) -> None:
    slow = SlowSummarizer()
    engine = Engine(make_config(tmp_path), summarizer=slow)
    sid = engine.create_session().session_id
    _fill(engine, sid, 21)

    async def scenario() -> dict[str, Any]:
        task = asyncio.create_task(engine.compact(sid))
        await slow.started.wait()
        late_ids = []
        for i in range(200, 205):
            late_ids += engine.append(sid, agent_turn(i)).message_ids
        slow.release.set()
        result = await task
        return {"result": result, "late": late_ids}

    out = asyncio.run(scenario())
    result = out["result"]
    assert result.effective
    archive = engine.read_archive(sid, limit=5000).messages
    boundary = next(m["id"] for m in archive if m["id"] > result.summarized_to)
    expected_tail = [m for m in archive if m["id"] >= boundary]
    ctx = engine.context_messages(sid)
    assert ctx[0]["role"] == "system"  # the summary message
    tail = ctx[1:]
    assert len(tail) == len(expected_tail)
    assert [m.get("content") for m in tail] == [m.get("content") for m in expected_tail]
    assert {m["id"] for m in expected_tail} >= set(out["late"])
    assert (engine.status(sid).active_messages,
            engine.status(sid).estimated_tokens) == _recount(engine, sid)
    engine.close()


class BrokenSummarizer:
    name = "broken"

    async def summarize(self, request: SummaryRequest) -> Summary:
        raise RuntimeError("endpoint unreachable")


class LyingSummarizer:
    """Cites a message that was never given to it."""

    name = "lying"

    async def summarize(self, request: SummaryRequest) -> Summary:
        s = await BuiltinSummarizer().summarize(request)
        s.sections.setdefault("decisions", []).append(
            type(s.items()[0][1])(text="made up", sources=[10**9]))
        return s


@pytest.mark.parametrize("summarizer", [BrokenSummarizer(), LyingSummarizer()])
def test_a_failed_or_invalid_summary_leaves_the_context_untouched(tmp_path: Path,
                                                                  summarizer: Any) -> None:
    engine = Engine(make_config(tmp_path), summarizer=summarizer)
    sid = engine.create_session().session_id
    _fill(engine, sid, 21)
    before = engine.context_messages(sid)
    with pytest.raises(SummarizerFailed):
        asyncio.run(engine.compact(sid))
    assert engine.context_messages(sid) == before
    log = engine.compaction_log(sid)
    assert log[0].error and not log[0].committed
    engine.close()


def test_pins_render_first_and_survive_rebuild(engine: Engine) -> None:
    sid = engine.create_session().session_id
    engine.append(sid, [{"role": "system", "content": "sys"}])
    pin = engine.add_pin(sid, "Deploy only from the release branch.")
    _fill(engine, sid, 22)
    asyncio.run(engine.compact(sid))
    ctx = engine.context_messages(sid)
    assert ctx[0]["content"] == "sys"
    assert "Pinned" in ctx[1]["content"]
    assert ctx[1]["content"].index("release branch") < ctx[1]["content"].index("Summary of")
    rebuilt = asyncio.run(engine.rebuild(sid))
    assert rebuilt.compaction_id
    assert "release branch" in engine.context_messages(sid)[1]["content"]
    assert (engine.status(sid).active_messages,
            engine.status(sid).estimated_tokens) == _recount(engine, sid)
    engine.remove_pin(sid, pin.pin_id)
    assert "release branch" not in engine.context_messages(sid)[1]["content"]
    assert (engine.status(sid).active_messages,
            engine.status(sid).estimated_tokens) == _recount(engine, sid)


def test_rebuild_rederives_from_the_archive(engine: Engine) -> None:
    sid = engine.create_session().session_id
    _fill(engine, sid, 30)
    asyncio.run(engine.compact(sid))
    _fill(engine, sid, 10, start=50)
    asyncio.run(engine.compact(sid, force=True))
    result = asyncio.run(engine.rebuild(sid))
    assert result.compaction_id and result.summarized_from == 1
    summary = engine.context_state(sid).summary
    assert summary.compaction_ids == [result.compaction_id]
    assert json.dumps(summary.to_dict())  # serializable


def test_contexts_persist_across_reopen(tmp_path: Path) -> None:
    e = Engine(make_config(tmp_path))
    sid = e.create_session().session_id
    _fill(e, sid, 25)
    asyncio.run(e.compact(sid))
    ctx, status = e.context_messages(sid), e.status(sid)
    e.close()
    e2 = Engine(make_config(tmp_path))
    assert e2.context_messages(sid) == ctx
    assert e2.status(sid) == status
    e2.close()
