"""What the web page reads besides the old methods: archive/read backwards, the session
list's title filter and last activity, and the compaction history with archive sizes."""

from __future__ import annotations

import msgspec
from helpers import agent_turn

from ctxd.daemon.engine import Engine
from ctxd.protocol.methods import validate_params

# what the page passes as beforeId for the newest page: JavaScript's largest exact integer
MAX_SAFE_INTEGER = 2**53 - 1


def fill(engine: Engine, title: str, n: int) -> str:
    sid = engine.create_session(title=title).session_id
    for i in range(n):
        engine.append(sid, [{"role": "user", "content": f"message {i}"}])
    return sid


def test_archive_read_pages_backwards_to_the_start(engine: Engine) -> None:
    sid = fill(engine, "a", 25)
    other = fill(engine, "b", 5)  # interleaved ids of another session never show up
    for i in range(3):
        engine.append(sid, [{"role": "user", "content": f"late {i}"}])
    everything = engine.read_archive(sid, 0, 5000).messages
    assert len(everything) == 28
    pages = []
    before: int | None = MAX_SAFE_INTEGER
    while before is not None:
        page = engine.read_archive(sid, 0, 10, before_id=before)
        assert page.next_after_id is None
        ids = [m["id"] for m in page.messages]
        assert ids == sorted(ids) and all(i < before for i in ids)
        pages.append(page.messages)
        before = page.next_before_id
        if before is not None:
            assert before == ids[0]
    assert [len(p) for p in pages] == [10, 10, 8]
    assert [m for p in reversed(pages) for m in p] == everything
    # a window between two ids, the newest of it first
    lo, hi = everything[3]["id"], everything[20]["id"]
    page = engine.read_archive(sid, lo, 5, before_id=hi)
    assert [m["id"] for m in page.messages] == [m["id"] for m in everything[15:20]]
    assert page.next_before_id == everything[15]["id"]
    page = engine.read_archive(sid, lo, 100, before_id=hi)
    assert page.messages == everything[4:20] and page.next_before_id is None
    assert msgspec.to_builtins(engine.read_archive(sid, 0, 10, before_id=everything[0]["id"])) == {
        "messages": [], "nextAfterId": None, "nextBeforeId": None}
    assert engine.read_archive(other, 0, 10, before_id=MAX_SAFE_INTEGER).next_before_id is None


def test_session_list_filters_by_title_and_reports_last_activity(engine: Engine) -> None:
    titles = ["Refactor the parser", "refactor docs", "100% coverage", "a_b c", "数据库迁移", None]
    sids = [engine.create_session(title=t).session_id for t in titles]
    engine.append(sids[1], [{"role": "user", "content": "hi"}])

    def found(title: str) -> list[str | None]:
        return [s.title for s in engine.list_sessions(50, None, title).sessions]

    assert found("REFACTOR") == ["refactor docs", "Refactor the parser"]
    assert found("%") == ["100% coverage"]  # LIKE wildcards match themselves
    assert found("_") == ["a_b c"]
    assert found("迁移") == ["数据库迁移"]
    assert found("nothing like it") == []
    page = engine.list_sessions(1, None, "refactor")
    assert len(page.sessions) == 1 and page.next_cursor
    rest = engine.list_sessions(5, page.next_cursor, "refactor")
    assert [s.title for s in rest.sessions] == ["Refactor the parser"]
    rows = {s.session_id: s for s in engine.list_sessions(50).sessions}
    appended = engine.read_archive(sids[1], 0, 1).messages[0]["createdAt"]
    assert rows[sids[1]].last_activity_at == appended
    assert rows[sids[0]].last_activity_at == rows[sids[0]].created_at


def test_compaction_history_carries_archive_sizes(engine: Engine) -> None:
    sid = engine.create_session(title="h").session_id
    for i in range(20):
        engine.append(sid, agent_turn(i))
    first = engine.compact_sync(sid, force=True)
    assert first.effective
    size_then = engine.archive_count(sid)
    tokens_then = sum(m["tokens"] for m in engine.read_archive(sid, 0, 5000).messages)
    # counted now, then continued from this checkpoint for the next compaction
    assert [(r.archive_messages, r.archive_tokens)
            for r in engine.compaction_history(sid)] == [(size_then, tokens_then)]
    for i in range(20, 30):
        engine.append(sid, agent_turn(i))
    engine.compact_sync(sid, force=True)
    rows = engine.compaction_history(sid, 10)
    assert len(rows) == 2 and rows[0].started_at >= rows[1].started_at
    assert (rows[1].archive_messages, rows[1].archive_tokens) == (size_then, tokens_then)
    assert rows[0].archive_messages == engine.archive_count(sid)
    everything = engine.read_archive(sid, 0, 5000).messages
    assert rows[0].archive_tokens == sum(m["tokens"] for m in everything)
    # a fresh engine (no cache) counts the same
    fresh = Engine(engine.config)
    try:
        assert fresh.compaction_history(sid, 10) == rows
    finally:
        fresh.close()
    assert rows[1].before_messages > (rows[1].after_messages or 0)
    assert validate_params("context/compactions", {"sessionId": sid}).limit == 50
