"""Searches that cannot freeze the daemon, and plain searches that say how they matched.

A large archive is built once with the engine in-process (tens of thousands of
messages, each with 40 of 64 common words, none with the word `zebracorn`), then real
daemon processes serve it: the heaviest query allowed (64 terms, one absent, so the
ranked any-word fallback runs over every message) keeps SQLite busy long enough to
show that other clients are answered meanwhile, and a short budget stops it.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import DaemonProcess, tool_turn

from ctxd.daemon.config import Config
from ctxd.daemon.engine import Engine
from ctxd.protocol.errors import CtxdError, ErrorCode
from ctxd.protocol.methods import QUERY_TERMS_MAX
from ctxd.protocol.types import Compaction

MESSAGES = 50_000
WORDS = [f"common{i}" for i in range(QUERY_TERMS_MAX)]
BROAD = " ".join(WORDS[: QUERY_TERMS_MAX - 1]) + " zebracorn"


@pytest.fixture(scope="module")
def big_archive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    root = tmp_path_factory.mktemp("bigsearch")
    engine = Engine(Config(data_dir=root / "data"))
    sid = engine.create_session(session_id="big").session_id
    rnd = random.Random(9)
    for start in range(0, MESSAGES, 5000):
        engine.append(sid, [
            {"role": "user", "content": " ".join(rnd.sample(WORDS, 40)) + f" orders {start + i}"}
            for i in range(5000)])
    engine.append(sid, [{"role": "user", "content": "zebracorn orders arrived"}])
    engine.close()
    yield root, sid


def daemon_on(root: Path, name: str, **config: Any) -> DaemonProcess:
    """A daemon on the big archive's data dir, with these config keys."""
    path = root / f"{name}.toml"
    path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in config.items()))
    d = DaemonProcess(root, "--config", str(path))
    return d.start()


def _answered_while(slow: Any, other: Any, sid: str) -> tuple[dict[str, Any], int]:
    """Run `slow()` on a thread while `other` asks context/status again and again: its
    result (`{"reply": ...}`, checked for an error) and how many statuses were answered
    before it finished."""
    done = threading.Event()
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["reply"] = slow()
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            result["error"] = exc
        finally:
            done.set()

    thread = threading.Thread(target=run)
    thread.start()
    answered_meanwhile = 0
    while not done.is_set():
        other.call("context/status", {"sessionId": sid})
        if not done.is_set():
            answered_meanwhile += 1
    thread.join()
    assert "error" not in result, result.get("error")
    return result, answered_meanwhile


def test_other_clients_are_served_while_a_broad_search_runs(
        big_archive: tuple[Path, str]) -> None:
    root, sid = big_archive
    daemon = daemon_on(root, "patient", search_budget_seconds=300.0)
    try:
        searcher = daemon.client("jsonrpc", timeout=300)
        other = daemon.client("websocket", timeout=300)
        result, answered_meanwhile = _answered_while(
            lambda: searcher.call("archive/search", {"query": BROAD, "limit": 5}), other, sid
        )
        # the search really was broad: no message has every word, so it fell back
        assert result["reply"]["matched"] == "any"
        assert len(result["reply"]["hits"]) == 5
        # on the event loop the search held every request until it finished
        assert answered_meanwhile >= 3, answered_meanwhile
        searcher.close()
        other.close()
    finally:
        assert daemon.stop() == 0


def test_a_search_over_its_budget_is_stopped_with_a_typed_error(
        big_archive: tuple[Path, str]) -> None:
    root, sid = big_archive
    daemon = daemon_on(root, "hasty", search_budget_seconds=0.01)
    try:
        with daemon.client("zmq", timeout=120) as c:
            for method, params in (
                ("archive/search", {"query": BROAD}),
                ("tools/call", {"sessionId": sid, "name": "search_past_messages",
                                "arguments": {"query": BROAD, "scope": "all"}}),
            ):
                with pytest.raises(CtxdError) as info:
                    c.call(method, params)
                assert info.value.code == ErrorCode.SEARCH_TOO_BROAD, info.value
                assert "too broad" in info.value.message
                assert info.value.data["budgetSeconds"] == 0.01
            # a projection recalls nothing rather than failing
            got = c.call("context/get", {"sessionId": sid, "budgetTokens": 500, "query": BROAD})
            assert got["recalledIds"] == []
            # the daemon goes on serving, narrow searches included
            hits = c.call("archive/search", {"query": "arrived", "sessionId": sid})["hits"]
            assert [h["snippet"] for h in hits] == ["zebracorn orders **arrived**"]
    finally:
        assert daemon.stop() == 0


def test_query_terms_are_capped_on_every_entry_point(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path).start()
    try:
        with daemon.client("jsonrpc") as c:
            sid = c.call("session/create", {})["sessionId"]
            c.call("messages/append", {"sessionId": sid, "messages": [
                {"role": "user", "content": "w1 w2 w3"}]})
            many = " ".join(f"w{i}" for i in range(5000))
            allowed = " ".join(f"w{i}" for i in range(1, QUERY_TERMS_MAX + 1))
            calls = [
                ("archive/search", {"query": many[:4096]}),
                ("archive/search", {"query": many[:4096], "advanced": True}),
                ("archive/search", {"query": "压" * 200}),
                ("tools/call", {"sessionId": sid, "name": "search_past_messages",
                                "arguments": {"query": many}}),
                ("tools/call", {"sessionId": sid, "name": "search_past_messages",
                                "arguments": {"query": many[:4096], "scope": "all"}}),
            ]
            for method, params in calls:
                started = time.monotonic()
                with pytest.raises(CtxdError) as info:
                    c.call(method, params)
                assert info.value.code == ErrorCode.INVALID_PARAMS, (method, info.value)
                assert "at most" in info.value.message
                assert time.monotonic() - started < 30
            # at the cap a search runs; a long recall query is cut to the cap
            assert c.call("archive/search", {"query": allowed})["matched"] == "any"
            got = c.call("context/get", {"sessionId": sid, "budgetTokens": 500,
                                         "query": many[:4096]})
            assert got["messages"][-1]["content"] == "w1 w2 w3"
    finally:
        assert daemon.stop() == 0


def test_plain_search_matches_all_words_and_marks_the_fallback(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path).start()
    try:
        with daemon.client("zmq") as c:
            sid = c.call("session/create", {})["sessionId"]
            c.call("messages/append", {"sessionId": sid, "messages": [
                {"role": "user", "content": "the orders were shipped"},
                {"role": "user", "content": "zebracorn orders are late"},
                {"role": "user", "content": "more orders today"},
            ]})
            both = c.call("archive/search", {"query": "zebracorn orders", "sessionId": sid})
            assert both["matched"] == "all"
            assert [h["snippet"] for h in both["hits"]] == [
                "**zebracorn** **orders** are late"]
            loose = c.call("archive/search", {"query": "zebracorn shipped", "sessionId": sid})
            assert loose["matched"] == "any"
            assert len(loose["hits"]) == 2
            # the fallback pages like any other search
            page2 = c.call("archive/search", {"query": "zebracorn shipped", "sessionId": sid,
                                              "limit": 1, "offset": 1})
            assert page2["matched"] == "any" and len(page2["hits"]) == 1
            none = c.call("archive/search", {"query": "unicorn", "sessionId": sid})
            assert none == {"hits": [], "matched": "all"}
            tool = c.call("tools/call", {"sessionId": sid, "name": "search_past_messages",
                                         "arguments": {"query": "zebracorn shipped"}})
            assert tool["data"]["matched"] == "any"
            assert tool["content"].startswith("No message has all the words")
    finally:
        assert daemon.stop() == 0


def test_a_huge_message_full_of_hits_is_searched_or_stopped_not_ground_through(
        tmp_path: Path) -> None:
    # A 3 MB tool output holding the query word 40,000 times: FTS5's snippet() over it
    # ran for 251 s inside one SQLite call that the 2 s budget could not stop. Here the
    # word comes 180,000 times (snippet() took 30 s at a sixth of this size, and grows
    # faster than the square of the hits): answered, or stopped with the typed error,
    # within the client's timeout, or the test fails.
    daemon = DaemonProcess(tmp_path).start()
    try:
        with daemon.client("zmq", timeout=120) as c:
            sid = c.call("session/create", {})["sessionId"]
            output = "\n".join(
                f"line {i}: error timeout timeout timeout timeout while reading block {i}"
                for i in range(45_000))
            assert len(output) > 2_700_000
            c.call("messages/append", {"sessionId": sid, "messages": tool_turn(1, result=output)})
            calls = [
                ("archive/search", {"query": "timeout"}),
                ("archive/search", {"query": "timeout disk", "sessionId": sid}),
                ("archive/search", {"query": "NEAR(timeout block, 3)", "advanced": True}),
                ("tools/call", {"sessionId": sid, "name": "search_past_messages",
                                "arguments": {"query": "timeout", "scope": "all"}}),
            ]
            for method, params in calls:
                try:
                    got = c.call(method, params)
                except CtxdError as exc:  # stopped by the budget: a typed error, not minutes
                    assert exc.code == ErrorCode.SEARCH_TOO_BROAD, (method, exc)
                    continue
                if method == "tools/call":
                    assert "timeout" in got["content"], got["content"][:500]
                    assert len(got["content"]) < 5000
                    continue
                [hit] = got["hits"]
                assert "**timeout** while reading" in hit["snippet"], hit["snippet"]
                assert hit["snippet"].endswith("…")
                assert len(hit["snippet"]) < 1000
            got = c.call("context/get", {"sessionId": sid, "budgetTokens": 500,
                                         "query": "timeout"})
            assert "messages" in got
            # the daemon goes on serving
            assert c.call("context/status", {"sessionId": sid})["sessionId"] == sid
    finally:
        assert daemon.stop() == 0


def test_other_clients_are_served_while_archive_sizes_are_counted(
        big_archive: tuple[Path, str]) -> None:
    # The first context/compactions call on a session counts the archive's size at each
    # compaction: a scan of every message, once done on the event loop, which held every
    # other request meanwhile.
    root, sid = big_archive
    engine = Engine(Config(data_dir=root / "data"))
    with engine.store.transaction():
        for i in range(3):
            engine.store.compactions.record(sid, Compaction(
                compaction_id=f"cmp_sizes{i}", trigger="manual", started_at=time.time() + i,
                duration_ms=5.0, before_messages=100, before_tokens=900, after_messages=10,
                after_tokens=90, effective=True, committed=True, summarized_from=1,
                summarized_to=90, summarizer="builtin", error=None, archive_messages=None,
                archive_tokens=None))
    engine.close()
    daemon = daemon_on(root, "sizes")
    try:
        counter = daemon.client("jsonrpc", timeout=120)
        other = daemon.client("websocket", timeout=120)
        result, answered_meanwhile = _answered_while(
            lambda: counter.call("context/compactions", {"sessionId": sid}), other, sid
        )
        rows = [r for r in result["reply"]["compactions"]
                if r["compactionId"].startswith("cmp_sizes")]
        assert len(rows) == 3
        assert {r["archiveMessages"] for r in rows} == {MESSAGES + 1}
        # on the event loop the count held every request until it finished
        assert answered_meanwhile >= 3, answered_meanwhile
        counter.close()
        other.close()
    finally:
        assert daemon.stop() == 0
