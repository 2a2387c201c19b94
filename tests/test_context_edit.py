"""context/clear and context/pop: the active context changes, the archive never does."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from helpers import DaemonProcess, agent_turn, make_config, tool_turn

from ctxd.daemon import context_edit
from ctxd.daemon.engine import Engine
from ctxd.protocol.errors import ApprovalPending, InvalidMessage, InvalidParams, SessionNotFound


def _tail_roles(engine: Engine, sid: str) -> list[str]:
    return [m["role"] for m in engine.get_context(sid).messages]


def test_pop_takes_newest_and_keeps_the_archive(engine: Engine) -> None:
    sid = engine.create_session().session_id
    engine.append(sid, [{"role": "system", "content": "be brief"}, *agent_turn(1)])
    before = engine.status(sid)
    out = context_edit.pop(engine, sid, 1)
    assert [m["content"] for m in out.messages] == ["done with step 1"]
    ctx = engine.get_context(sid)
    assert ctx.messages[-1]["role"] == "tool"
    assert out.status.active_messages == before.active_messages - 1
    assert out.status.estimated_tokens < before.estimated_tokens
    assert out.status.version == before.version + 1
    assert engine.archive_count(sid) == 5  # nothing deleted
    hits = engine.search("done with step", session_id=sid)
    assert hits and not hits[0].in_active_context


def test_pop_of_a_tool_result_takes_its_call_too(engine: Engine) -> None:
    sid = engine.create_session().session_id
    engine.append(sid, [{"role": "user", "content": "go"}])
    call = tool_turn(1)[0]
    call["tool_calls"].append(
        {"id": "call_b", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    )
    engine.append(
        sid, [call, tool_turn(1)[1], {"role": "tool", "tool_call_id": "call_b", "content": "x"}]
    )
    out = context_edit.pop(engine, sid, 1)
    assert [m["role"] for m in out.messages] == ["assistant", "tool", "tool"]
    assert _tail_roles(engine, sid) == ["user"]
    # a popped call that had no result yet cannot be answered into the context
    engine.append(sid, [tool_turn(9)[0]])
    context_edit.pop(engine, sid, 1)
    with pytest.raises(InvalidMessage, match="popped"):
        engine.append(sid, [tool_turn(9)[1]])
    engine.append(sid, agent_turn(2))
    assert _tail_roles(engine, sid) == ["user", "user", "assistant", "tool", "assistant"]
    assert engine.status(sid).active_messages == 5


def test_pop_on_empty_tail_and_bad_input(engine: Engine, tmp_path: Path) -> None:
    sid = engine.create_session().session_id
    assert context_edit.pop(engine, sid, 3).messages == []
    with pytest.raises(SessionNotFound):
        context_edit.pop(engine, "nope", 1)
    with pytest.raises(SessionNotFound):
        context_edit.clear(engine, "nope")


def test_clear_starts_fresh_and_compaction_respects_it(tmp_path: Path) -> None:
    engine = Engine(make_config(tmp_path / "data", max_active_messages=12, keep_messages=4))
    try:
        sid = engine.create_session().session_id
        engine.append(sid, [{"role": "system", "content": "old rules"}])
        for i in range(6):
            engine.append(sid, agent_turn(i))
        engine.compact_sync(sid, force=True)
        engine.add_pin(sid, "keep the pin")
        out = context_edit.clear(engine, sid)
        assert out.before.messages > 4
        ctx = engine.get_context(sid)
        # only the pins remain, in the one pins/summary message
        assert len(ctx.messages) == 1 and "keep the pin" in ctx.messages[0]["content"]
        assert "old rules" not in ctx.messages[0]["content"]
        assert engine.archive_count(sid) == 25
        engine.append(sid, [{"role": "system", "content": "new rules"}])
        for i in range(10, 16):
            engine.append(sid, agent_turn(i))
        rebuilt = asyncio.run(engine.rebuild(sid))
        assert rebuilt.summarized_from > 25  # nothing from before the clear
        text = " ".join(str(m["content"]) for m in engine.get_context(sid).messages)
        assert "new rules" in text and "old rules" not in text and "step 0:" not in text
        assert engine.search("step 0", session_id=sid)  # the archive still finds it
    finally:
        engine.close()


def test_clear_refuses_while_an_approval_is_pending(engine: Engine) -> None:
    sid = engine.create_session().session_id
    run = engine.start_run(sid).run_id
    engine.append(sid, [{"role": "user", "content": "go"}, tool_turn(1)[0]], run_id=run)
    engine.request_approval(sid, run, "call_1", "read_file")
    with pytest.raises(ApprovalPending):
        context_edit.clear(engine, sid)
    with pytest.raises(ApprovalPending):
        context_edit.pop(engine, sid, 1)
    assert _tail_roles(engine, sid) == ["user", "assistant"]


def test_compaction_after_pop_keeps_counts_exact(tmp_path: Path) -> None:
    engine = Engine(make_config(tmp_path / "data", max_active_messages=12, keep_messages=4))
    try:
        sid = engine.create_session().session_id
        for i in range(6):
            engine.append(sid, agent_turn(i))
        context_edit.pop(engine, sid, 1)
        engine.append(sid, agent_turn(7))
        context_edit.pop(engine, sid, 1)
        engine.compact_sync(sid, force=True)
        ctx = engine.get_context(sid)
        st = engine.status(sid)
        assert st.active_messages == len(ctx.messages)
        assert "done with step 7" not in str(ctx.messages)
        assert engine.context_state(sid).dropped_ids  # the last pop is still in the tail
    finally:
        engine.close()


def test_over_the_wire_with_metadata(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path).start()
    try:
        with daemon.client() as c:
            sid = c.create_session()["sessionId"]
            c.append(
                sid,
                [
                    {"role": "user", "content": "hi", "metadata": {"k": [1]}},
                    {"role": "assistant", "content": "hello"},
                ],
            )
            plain = c.context_get(sid)
            assert "metadata" not in plain["messages"][0]
            full = c.context_get(sid, include_metadata=True)
            assert full["messages"][0]["metadata"] == {"k": [1]}
            assert full["messageIds"] == plain["messageIds"] and None not in full["messageIds"]
            popped = c.context_pop(sid)
            assert popped["messages"][0]["content"] == "hello"
            assert [m["content"] for m in c.context_get(sid)["messages"]] == ["hi"]
            with pytest.raises(InvalidParams):
                c.context_pop(sid, count=0)
            cleared = c.context_clear(sid)
            assert cleared["status"]["activeMessages"] == 0
            assert c.context_get(sid)["messages"] == []
            assert c.context_status(sid)["archiveMessages"] == 2
    finally:
        daemon.stop()
