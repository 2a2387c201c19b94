"""Full-text search over the archive, English and Chinese, and the recall tool."""

from __future__ import annotations

import asyncio
import time

import pytest
from helpers import agent_turn, tool_turn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxd.daemon import recall
from ctxd.daemon.engine import Engine
from ctxd.protocol.errors import CtxdError, InvalidParams, NotFound
from ctxd.protocol.types import SearchHit


@pytest.fixture
def sid(engine: Engine) -> str:
    s = engine.create_session().session_id
    engine.append(s, [
        {"role": "user", "content": "我们需要讨论上下文压缩策略，以及数据库迁移。"},
        {"role": "assistant", "content": "The compaction strategy keeps a tail of recent "
                                         "messages and summarizes the rest."},
        *tool_turn(1, path="config/settings.toml", result="port = 8080\nhost = 'localhost'"),
        {"role": "user", "content": "Never touch the production database."},
    ])
    return s


def _ids(hits: list[SearchHit]) -> list[int]:
    return [h.message_id for h in hits]


def test_two_character_chinese_word_inside_a_longer_run(engine: Engine, sid: str) -> None:
    hits = engine.search("压缩", session_id=sid)
    assert _ids(hits) == [1]
    assert "**压缩**" in hits[0].snippet and "\u200b" not in hits[0].snippet
    assert _ids(engine.search("压缩策略", session_id=sid)) == [1]  # a phrase
    assert _ids(engine.search("数据库迁移", session_id=sid)) == [1]
    assert engine.search("压策", session_id=sid) == []  # not adjacent: no match


def test_english_words_phrases_tool_calls_and_results(engine: Engine, sid: str) -> None:
    assert _ids(engine.search("compaction strategy", session_id=sid)) == [2]
    assert _ids(engine.search("settings.toml", session_id=sid)) == [3]  # tool arguments
    assert _ids(engine.search("read_file", session_id=sid)) == [3]  # tool name
    assert _ids(engine.search("8080", session_id=sid)) == [4]  # tool result
    assert _ids(engine.search("production", session_id=sid, role="user")) == [5]
    assert engine.search("production", session_id=sid, role="assistant") == []


@pytest.mark.parametrize("query", [
    '"unbalanced', "a*", "-x", "col:val", "NEAR(a b)", "a AND", "((", ")", "OR", "NOT",
    "^", "'", '""', "*", ":", "{a b}", "\\", "压缩 OR", "",
])
def test_plain_queries_never_raise(engine: Engine, sid: str, query: str) -> None:
    assert isinstance(engine.search(query, session_id=sid), list)


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=40))
def test_random_text_never_raises(engine: Engine, sid: str, query: str) -> None:
    engine.search(query, session_id=sid)


def test_advanced_mode_passes_syntax_and_types_its_errors(engine: Engine, sid: str) -> None:
    hits = engine.search("production OR compaction", session_id=sid, advanced=True)
    assert sorted(_ids(hits)) == [2, 5]
    assert _ids(engine.search("prod*", session_id=sid, advanced=True)) == [5]
    with pytest.raises(InvalidParams, match="FTS5"):
        engine.search('"unbalanced', session_id=sid, advanced=True)
    with pytest.raises(CtxdError):
        engine.search("a AND", session_id=sid, advanced=True)


def test_filters_paging_and_newest_first(engine: Engine) -> None:
    a = engine.create_session().session_id
    b = engine.create_session().session_id
    for i in range(6):
        engine.append(a, [{"role": "user", "content": f"deploy number {i}"}])
    engine.append(b, [{"role": "user", "content": "deploy elsewhere"}])
    everywhere = engine.search("deploy", limit=50)
    assert len(everywhere) == 7 and {h.session_id for h in everywhere} == {a, b}
    page1 = engine.search("deploy", session_id=a, limit=4, newest_first=True)
    page2 = engine.search("deploy", session_id=a, limit=4, offset=4, newest_first=True)
    ids = _ids(page1) + _ids(page2)
    assert ids == sorted(ids, reverse=True) and len(ids) == 6
    future = time.time() + 3600
    assert engine.search("deploy", session_id=a, since=future) == []
    assert len(engine.search("deploy", session_id=a, until=future)) == 6


def test_hits_say_whether_they_are_still_in_context(engine: Engine) -> None:
    s = engine.create_session().session_id
    engine.append(s, [{"role": "user", "content": "remember the zebra protocol"}])
    for i in range(25):
        engine.append(s, agent_turn(i))
    assert engine.search("zebra", session_id=s)[0].in_active_context is True
    assert asyncio.run(engine.compact(s)).effective
    assert engine.search("zebra", session_id=s)[0].in_active_context is False


def test_search_tool_schema_and_executor(engine: Engine, sid: str) -> None:
    fn = recall.SEARCH_TOOL_SCHEMA["function"]
    assert fn["name"] == "search_past_messages"
    assert set(fn["parameters"]["properties"]) == {"query", "scope", "limit", "role"}
    assert fn["parameters"]["required"] == ["query"]
    out = recall.call_tool(engine, sid, "search_past_messages", {"query": "压缩"})
    assert "[msg 1 · user" in out.content and "压缩" in out.content
    assert _ids(out.data["hits"]) == [1]
    # the model's JSON string arguments are accepted as they come
    out = recall.call_tool(engine, sid, "search_past_messages",
                           '{"query": "production", "limit": 1}')
    assert _ids(out.data["hits"]) == [5]
    none = recall.call_tool(engine, sid, "search_past_messages", {"query": "unicorn"})
    assert none.data["hits"] == [] and "No earlier messages" in none.content
    other = engine.create_session().session_id
    scoped = recall.call_tool(engine, other, "search_past_messages", {"query": "压缩"})
    assert scoped.data["hits"] == []
    everywhere = recall.call_tool(engine, other, "search_past_messages",
                                  {"query": "压缩", "scope": "all"})
    assert _ids(everywhere.data["hits"]) == [1] and sid in everywhere.content
    for bad in ({"query": ""}, {"query": "x", "limit": 0}, {"query": "x", "scope": "x"},
                {"query": "x", "extra": 1}, "{not json", [1]):
        with pytest.raises(InvalidParams):
            recall.call_tool(engine, sid, "search_past_messages", bad)
    with pytest.raises(NotFound):
        recall.call_tool(engine, sid, "no_such_tool", {})


def test_explain_resolves_every_summary_pointer(engine: Engine) -> None:
    s = engine.create_session().session_id
    engine.append(s, [{"role": "user", "content": "You must keep the API stable."}])
    for i in range(25):
        engine.append(s, agent_turn(i))
    asyncio.run(engine.compact(s))
    out = recall.explain(engine, s)
    assert out.items and out.broken_pointers == 0
    sources = [src for item in out.items for src in item["sources"]]
    assert all("role" in src and "snippet" in src for src in sources)
    assert any("API stable" in src["snippet"] for src in sources)
    assert out.provenance["coversFrom"] == 1
