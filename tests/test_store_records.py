"""What a store returns for sessions, runs, approvals, pins and search hits: the records of
stores/records.py, and the protocol Structs daemon/views.py makes of them for replies and
events. tests/test_store_postgres.py runs these on PostgreSQL too."""

from __future__ import annotations

import json
import time
from typing import Any

import msgspec
import pytest

from ctxd.daemon.approval_events import EVENT_ARGUMENTS_CHARS
from ctxd.daemon.corrections import mark_superseded
from ctxd.daemon.engine import Engine
from ctxd.daemon.stores.records import (
    ApprovalRecord,
    PinRecord,
    RunRecord,
    SearchHitRecord,
    SessionRecord,
)
from ctxd.daemon.views import (
    approval_struct,
    pin_struct,
    run_struct,
    search_hit_struct,
    session_struct,
)
from ctxd.protocol.types import Approval, ApprovalEvent, RunDidFinish, RunDidStart, SearchHit


def _call(cid: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": cid, "type": "function", "function": {"name": "sh", "arguments": "{}"}}]}


def _events(engine: Engine) -> list[tuple[str, Any]]:
    seen: list[tuple[str, Any]] = []
    engine.add_listener(lambda sid, method, params: seen.append((method, params)))
    return seen


def test_sessions_come_back_as_records_newest_first(engine: Engine) -> None:
    now = time.time()
    engine.create_session("ses-old", title="Alpha one", metadata={"k": [1, "二"]},
                          created_at=now - 100)
    engine.create_session("ses-new", created_at=now - 50)
    archive = engine.store.archive
    old = archive.get_session("ses-old")
    assert old == SessionRecord("ses-old", "Alpha one", {"k": [1, "二"]}, now - 100)
    # no metadata given: an empty one, as session/get has always said
    assert archive.get_session("ses-new") == SessionRecord("ses-new", None, {}, now - 50)
    assert archive.get_session("ses-missing") is None
    assert [s.id for s in archive.list_sessions(10, None)] == ["ses-new", "ses-old"]
    assert archive.list_sessions(10, (now - 50, "ses-new")) == [old]
    assert archive.list_sessions(10, None, "alpha") == [old]
    with pytest.raises(AttributeError):  # records are immutable
        old.title = "changed"  # type: ignore[misc]
    # the reply's session is the record's Struct, camelCase on the wire in its order
    assert engine.get_session("ses-old").session == session_struct(old)
    assert list(msgspec.json.decode(msgspec.json.encode(session_struct(old)))) == [
        "sessionId", "title", "metadata", "createdAt"]


def test_runs_come_back_as_records_and_their_events_carry_the_reply(engine: Engine) -> None:
    sid = engine.create_session().session_id
    seen = _events(engine)
    run = engine.start_run(sid)
    runs = engine.store.runs
    stored = runs.get(run.run_id)
    assert stored == RunRecord(run.run_id, sid, "open", run.started_at, None)
    assert runs.open_run(sid) == stored
    assert run_struct(stored) == run
    assert seen[-1] == ("run/didStart", RunDidStart(session_id=sid, run_id=run.run_id, run=run))
    done = engine.finish_run(run.run_id, "failed")
    finished = runs.get(run.run_id)
    assert finished is not None and finished.status == "failed"
    assert finished.finished_at is not None and finished.finished_at >= finished.started_at
    assert runs.open_run(sid) is None
    assert done.run == run_struct(finished)
    assert seen[-1] == ("run/didFinish", RunDidFinish(session_id=sid, run=done.run,
                                                      auto_compaction_scheduled=False))
    assert runs.get("run_missing") is None


def test_approvals_come_back_as_records_and_events_cut_only_their_copy(engine: Engine) -> None:
    sid = engine.create_session().session_id
    run_id = engine.start_run(sid).run_id
    engine.append(sid, [_call("c1"), _call("c2")], run_id=run_id)
    seen = _events(engine)
    long_args = {"text": "x" * (EVENT_ARGUMENTS_CHARS + 10)}
    asked = engine.request_approval(sid, run_id, "c1", "sh", long_args)
    bare = engine.request_approval(sid, run_id, "c2")
    runs = engine.store.runs
    stored = runs.get_approval(asked.approval_id)
    assert stored == ApprovalRecord(asked.approval_id, sid, run_id, "c1", "sh", long_args,
                                    "pending", None, asked.created_at, None)
    assert runs.get_approval(bare.approval_id).arguments is None  # type: ignore[union-attr]
    assert runs.list_approvals(sid, "pending") == [stored, runs.get_approval(bare.approval_id)]
    assert asked == approval_struct(stored)
    # the event's copy is cut and says so; the reply and approval/list keep the whole
    method, event = seen[0]
    assert method == "approval/didRequest" and isinstance(event, ApprovalEvent)
    assert event.approval.arguments == json.dumps(long_args)[:EVENT_ARGUMENTS_CHARS] + "…"
    assert event.approval.arguments_truncated is True
    assert asked.arguments == long_args and asked.arguments_truncated is msgspec.UNSET
    assert seen[1] == ("approval/didRequest",
                       ApprovalEvent(session_id=sid, approval=approval_struct(
                           runs.get_approval(bare.approval_id))))  # type: ignore[arg-type]
    resolved = engine.resolve_approval(asked.approval_id, "denied", "too broad")
    after = runs.get_approval(asked.approval_id)
    assert after is not None and (after.status, after.reason) == ("denied", "too broad")
    assert after.resolved_at is not None and after.resolved_at >= after.created_at
    assert resolved == approval_struct(after)
    assert runs.list_approvals(sid, "pending") == [runs.get_approval(bare.approval_id)]
    assert engine.list_approvals(sid) == [approval_struct(a) for a in runs.list_approvals(sid)]
    assert all(isinstance(a, Approval) for a in engine.list_approvals(sid))
    assert runs.get_approval("apr_missing") is None


def test_pins_come_back_as_records(engine: Engine) -> None:
    sid = engine.create_session().session_id
    first = engine.add_pin(sid, "Never push to main.")
    second = engine.add_pin(sid, "Deploy from release branches.")
    assert engine.add_pin(sid, "  Never push to main. ") == first  # pinned already
    pins = engine.store.pins
    assert pins.list(sid) == [
        PinRecord(first.pin_id, sid, "Never push to main.", first.created_at),
        PinRecord(second.pin_id, sid, "Deploy from release branches.", second.created_at),
    ]
    assert engine.pins(sid) == [pin_struct(p) for p in pins.list(sid)]
    assert list(msgspec.json.decode(msgspec.json.encode(first))) == [
        "pinId", "text", "createdAt"]
    assert engine.remove_pin(sid, first.pin_id) == first
    assert pins.list(sid) == [PinRecord(second.pin_id, sid, second.text, second.created_at)]
    with engine.store.transaction(sid):
        assert pins.remove(sid, first.pin_id) is None


def test_search_hits_come_back_as_records_and_the_engine_adds_what_it_knows(
    engine: Engine,
) -> None:
    sid = engine.create_session().session_id
    old, new = engine.append(sid, [
        {"role": "user", "content": "Use port 8080 for the dev server."},
        {"role": "user", "content": "No, use port 9090 for the dev server."},
    ]).message_ids
    records, matched = engine.store.archive.search("port", session_id=sid)
    assert matched == "all"
    assert sorted(r.message_id for r in records) == [old, new]
    for r in records:
        assert isinstance(r, SearchHitRecord) and r.session_id == sid and r.role == "user"
        assert "**port**" in r.snippet and isinstance(r.score, float)
    with pytest.raises(AttributeError):  # records are immutable
        records[0].snippet = "changed"  # type: ignore[misc]
    ordinal = {old: 1, new: 2}
    hits = engine.search("port", session_id=sid)
    assert hits == [search_hit_struct(r, True, ordinal[r.message_id]) for r in records]
    assert all(isinstance(h, SearchHit) and h.superseded_by is msgspec.UNSET for h in hits)
    wire = ["messageId", "sessionId", "role", "snippet", "createdAt", "score",
            "inActiveContext", "ordinal"]
    # no supersession: the member is absent, not null
    assert [list(msgspec.json.decode(msgspec.json.encode(h))) for h in hits] == [wire, wire]
    # a supersession marks the older hit, last on the wire, and puts the newer above it
    older_first = sorted(hits, key=lambda h: h.message_id)
    marked = mark_superseded(lambda s: {old: new} if s == sid else {}, older_first)
    assert [(h.message_id, h.superseded_by) for h in marked] == [
        (new, msgspec.UNSET), (old, new)]
    assert list(msgspec.json.decode(msgspec.json.encode(marked[1]))) == [*wire, "supersededBy"]
