"""The archive: append-only batches, validation, idempotency, token counts, backfill."""

from __future__ import annotations

import json
from pathlib import Path

import apsw
import pytest
from helpers import agent_turn, make_config, tool_turn

from ctxd.daemon.engine import Engine
from ctxd.daemon.stores.sqlite.archive_fts import SqliteArchive
from ctxd.daemon.stores.sqlite.schema import open_database
from ctxd.daemon.tokens import TokenCounter
from ctxd.protocol.errors import (
    Conflict,
    InvalidMessage,
    PayloadTooLarge,
    SessionNotFound,
)


def test_append_assigns_increasing_ids_across_sessions(engine: Engine) -> None:
    a = engine.create_session(title="a").session_id
    b = engine.create_session(title="b").session_id
    r1 = engine.append(a, [{"role": "user", "content": "one"}])
    r2 = engine.append(b, [{"role": "user", "content": "two"}, {"role": "assistant",
                                                                  "content": "three"}])
    r3 = engine.append(a, [{"role": "user", "content": "four"}])
    ids = r1.message_ids + r2.message_ids + r3.message_ids
    assert ids == sorted(ids) and len(set(ids)) == 4
    assert r1.batch_id < r2.batch_id < r3.batch_id
    msgs = engine.read_archive(a).messages
    assert [m["content"] for m in msgs] == ["one", "four"]
    assert all({"id", "batchId", "createdAt", "tokens"} <= m.keys() for m in msgs)


def test_unknown_session_is_a_typed_error(engine: Engine) -> None:
    with pytest.raises(SessionNotFound):
        engine.append("nope", [{"role": "user", "content": "x"}])


def test_triggers_refuse_rewriting_history(engine: Engine, tmp_path: Path) -> None:
    sid = engine.create_session().session_id
    engine.append(sid, [{"role": "user", "content": "keep me"}])
    raw = apsw.Connection(str(engine.config.db_path))
    raw.set_busy_timeout(5000)
    with pytest.raises(apsw.ConstraintError):
        raw.execute("UPDATE messages SET body = '{}'")
    with pytest.raises(apsw.ConstraintError):
        raw.execute("DELETE FROM messages")
    with pytest.raises(apsw.ConstraintError):
        raw.execute("DELETE FROM batches")
    raw.close()
    assert engine.read_archive(sid).messages[0]["content"] == "keep me"


@pytest.mark.parametrize(
    ("batch", "index", "field"),
    [
        ([{"role": "robot", "content": "x"}], 0, "role"),
        ([{"role": "user", "content": 5}], 0, "content"),
        ([{"role": "user", "content": None}], 0, "content"),
        ([{"role": "user", "content": [{"type": "text", "text": 3}]}], 0, "content"),
        ([{"role": "user", "content": "ok"}, {"role": "tool", "tool_call_id": "zz",
                                               "content": "r"}], 1, None),
        ([{"role": "tool", "content": "r"}], 0, "tool_call_id"),
        ([{"role": "user", "content": "x", "tool_calls": []}], 0, "tool_calls"),
        (["not a dict"], 0, None),
        ([{"role": "assistant", "content": None, "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": {}}}]}],
         0, "tool_calls"),
    ],
)
def test_a_bad_batch_writes_nothing(engine: Engine, batch: list, index: int,
                                    field: str | None) -> None:
    sid = engine.create_session().session_id
    engine.append(sid, [{"role": "user", "content": "before"}])
    with pytest.raises(InvalidMessage) as exc:
        engine.append(sid, [{"role": "user", "content": "fine"}] + batch)
    assert exc.value.data["index"] == index + 1
    assert f"message {index + 1}" in exc.value.message
    if field:
        assert exc.value.data["field"] == field
    assert engine.status(sid).archive_messages == 1
    assert engine.status(sid).active_messages == 1


def test_duplicate_tool_call_ids_are_refused(engine: Engine) -> None:
    sid = engine.create_session().session_id
    engine.append(sid, tool_turn(1))
    with pytest.raises(InvalidMessage, match="already used"):
        engine.append(sid, tool_turn(1))
    two_in_one = tool_turn(2)[:1]
    two_in_one[0]["tool_calls"] = two_in_one[0]["tool_calls"] * 2
    with pytest.raises(InvalidMessage, match="already used"):
        engine.append(sid, two_in_one)
    with pytest.raises(InvalidMessage, match="already has a result"):
        engine.append(sid, [tool_turn(1)[1]])
    assert engine.status(sid).archive_messages == 2


def test_tool_result_may_answer_a_call_from_an_earlier_batch(engine: Engine) -> None:
    sid = engine.create_session().session_id
    call, result = tool_turn(7)
    engine.append(sid, [call])
    engine.append(sid, [result])
    assert engine.status(sid).archive_messages == 2


def test_oversized_message_is_refused(tmp_path: Path) -> None:
    e = Engine(make_config(tmp_path, max_message_bytes=1000))
    sid = e.create_session().session_id
    with pytest.raises(PayloadTooLarge) as exc:
        e.append(sid, [{"role": "user", "content": "ok"},
                       {"role": "user", "content": "x" * 2000}])
    assert exc.value.data["index"] == 1
    assert e.status(sid).archive_messages == 0
    e.close()


def test_client_batch_id_makes_appends_idempotent(engine: Engine) -> None:
    sid = engine.create_session().session_id
    batch = agent_turn(1)
    first = engine.append(sid, batch, client_batch_id="b-1")
    again = engine.append(sid, batch, client_batch_id="b-1")
    assert again.message_ids == first.message_ids
    assert again.batch_id == first.batch_id
    assert engine.status(sid).archive_messages == len(batch)
    with pytest.raises(Conflict):
        engine.append(sid, agent_turn(2), client_batch_id="b-1")
    assert engine.status(sid).archive_messages == len(batch)


def test_tokens_are_counted_once_and_special_tokens_are_text(engine: Engine) -> None:
    sid = engine.create_session().session_id
    msg = {"role": "user", "content": "quote <|endoftext|> verbatim, 上下文压缩"}
    engine.append(sid, [msg])
    stored = engine.read_archive(sid).messages[0]
    counter = TokenCounter("cl100k_base")
    assert stored["tokens"] == counter.count_message(msg)
    assert stored["tokens"] > 10
    assert engine.status(sid).estimated_tokens == stored["tokens"]


def test_unknown_fields_and_metadata_are_kept_in_the_archive(engine: Engine) -> None:
    sid = engine.create_session().session_id
    engine.append(sid, [{"role": "assistant", "content": "x", "reasoning_content": "why",
                         "metadata": {"ui": 1}}])
    stored = engine.read_archive(sid).messages[0]
    assert stored["reasoning_content"] == "why" and stored["metadata"] == {"ui": 1}
    model = engine.context_messages(sid)[0]
    assert "metadata" not in model and model["reasoning_content"] == "why"


def test_archive_survives_reopening(tmp_path: Path) -> None:
    e = Engine(make_config(tmp_path))
    sid = e.create_session().session_id
    ids = e.append(sid, agent_turn(1)).message_ids
    e.close()
    e2 = Engine(make_config(tmp_path))
    assert [m["id"] for m in e2.read_archive(sid).messages] == ids
    assert e2.status(sid).active_messages == len(ids)
    e2.close()


def test_sessions_archived_before_contexts_existed_are_backfilled_once(tmp_path: Path) -> None:
    # a database at schema version 1 has the archive but no conversation_context table
    conn = open_database(tmp_path / "ctxd.db", target_version=1)
    store = SqliteArchive(conn)
    counter = TokenCounter()
    msgs = [{"role": "system", "content": "You are terse."}] + agent_turn(1) + agent_turn(2)
    with conn:
        store.create_session("old", "legacy", None)
        rows = [(m, json.dumps(m), counter.count_message(m)) for m in msgs]
        store.append("old", rows, digest="d", run_id=None, client_batch_id=None)
    conn.close()

    e = Engine(make_config(tmp_path))
    status = e.status("old")
    assert status.archive_messages == len(msgs)
    assert status.active_messages == len(msgs)
    assert status.estimated_tokens == sum(counter.count_message(m) for m in msgs)
    ctx = e.context_messages("old")
    assert ctx[0] == {"role": "system", "content": "You are terse."}
    assert [m.get("content") for m in ctx] == [m.get("content") for m in msgs]
    version = e.status("old").version
    e.close()
    # the backfill is stored: a reopen reads the row instead of deriving it again
    raw = apsw.Connection(str(tmp_path / "ctxd.db"))
    assert raw.execute("SELECT count(*) FROM conversation_context WHERE session_id='old'"
                       ).fetchone()[0] == 1
    raw.close()
    e2 = Engine(make_config(tmp_path))
    assert e2.status("old").version == version
    e2.close()


def test_read_pages_backwards_with_before_id(engine: Engine) -> None:
    a = engine.create_session().session_id
    b = engine.create_session().session_id
    ids = []
    for i in range(7):
        ids += engine.append(a, [{"role": "user", "content": f"a{i}"}]).message_ids
        engine.append(b, [{"role": "user", "content": f"b{i}"}])
    page = engine.read_archive(a, limit=3, before_id=ids[5])
    assert [m["content"] for m in page.messages] == ["a2", "a3", "a4"]
    assert page.next_before_id == ids[2] and page.next_after_id is None
    older = engine.read_archive(a, limit=3, before_id=page.next_before_id)
    assert [m["content"] for m in older.messages] == ["a0", "a1"]
    assert older.next_before_id is None
    # afterId and beforeId together bound a window
    window = engine.read_archive(a, after_id=ids[1], limit=10, before_id=ids[4])
    assert [m["id"] for m in window.messages] == ids[2:4]
    # the latest messages: beforeId past the end
    assert engine.read_archive(a, limit=1, before_id=10**9).messages[0]["content"] == "a6"
