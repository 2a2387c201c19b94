"""The daemon with an OpenAI-compatible summarizer, served by a loopback fake endpoint."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_llm import FakeLLM
from helpers import DaemonProcess, agent_turn, wait_for

from ctxd.protocol.errors import SummarizerFailed


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with FakeLLM("good") as server:
        yield server


def _daemon(tmp_path: Path, llm: FakeLLM, fallback: str = "") -> DaemonProcess:
    config = tmp_path / "ctxd.toml"
    config.write_text(
        'summarizer = "openai"\n'
        "[openai]\n"
        f'base_url = "{llm.base_url}"\n'
        'model = "fake-model"\n'
        "timeout_seconds = 5\n"
        f'fallback = "{fallback}"\n'
    )
    return DaemonProcess(tmp_path, "--config", str(config)).start()


def _fill(c: object, sid: str, turns: int, start: int = 0) -> None:
    for i in range(start, start + turns):
        c.call("messages/append", {"sessionId": sid, "messages": agent_turn(i)})  # type: ignore[attr-defined]


def test_compaction_through_the_model_and_its_failures(tmp_path: Path, llm: FakeLLM) -> None:
    d = _daemon(tmp_path, llm)
    try:
        with d.client("zmq") as c:
            sid = c.call("session/create", {})["sessionId"]
            c.subscribe(sid)
            events = c.notifications(timeout=0.5)
            _fill(c, sid, 10)
            result = c.call("context/compact", {"sessionId": sid, "force": True,
                                                "instructions": "focus on mod3"})
            assert result["effective"] is True
            assert llm.requests and "focus on mod3" in llm.requests[-1].prompt
            explained = c.call("context/explain", {"sessionId": sid})
            assert explained["items"] and explained["brokenPointers"] == 0
            # the model wrote beside the built-in extractor; the log says who wrote what
            written_by = explained["provenance"]["summarizer"]
            assert written_by.startswith("openai:fake-model + builtin {")
            assert {item.get("origin") for item in explained["items"]} <= {
                "extractor", "model", "model+extractor"}
            logged = c.call("context/compactions", {"sessionId": sid})["compactions"][0]
            assert logged["summarizer"] == written_by
            status = c.call("context/status", {"sessionId": sid})
            assert status["summarizer"] == "openai:fake-model"
            assert status["summarizerLastFailure"] is None

            # the endpoint fails: -32016 with the reason, the context is untouched
            llm.default = "http500"
            _fill(c, sid, 3, start=100)
            before = c.call("context/get", {"sessionId": sid})["messages"]
            with pytest.raises(SummarizerFailed) as exc:
                c.call("context/compact", {"sessionId": sid, "force": True})
            assert "500" in exc.value.message
            failed = wait_for(events, "context/compactionFailed")
            assert failed["sessionId"] == sid and failed["error"]["code"] == -32016
            assert c.call("context/get", {"sessionId": sid})["messages"] == before
            status = c.call("context/status", {"sessionId": sid})
            assert "HTTP 500" in status["summarizerLastFailure"]
            assert status["summarizerLastFailureAt"] > 0
    finally:
        d.stop()


def test_fallback_keeps_compaction_working(tmp_path: Path, llm: FakeLLM) -> None:
    llm.default = "malformed"
    d = _daemon(tmp_path, llm, fallback="builtin")
    try:
        with d.client("jsonrpc") as c:
            sid = c.call("session/create", {})["sessionId"]
            _fill(c, sid, 10)
            result = c.call("context/compact", {"sessionId": sid, "force": True})
            assert result["effective"] is True
            provenance = c.call("context/explain", {"sessionId": sid})["provenance"]
            assert provenance["summarizer"].startswith("builtin (fallback:")
    finally:
        d.stop()


def test_auto_compaction_pauses_after_three_failures(tmp_path: Path, llm: FakeLLM) -> None:
    llm.default = "http500"
    d = _daemon(tmp_path, llm)
    try:
        with d.client("zmq") as c:
            sid = c.call("session/create", {})["sessionId"]
            c.subscribe(sid)
            events = c.notifications(timeout=0.5)
            # appends outside a run are checked for auto-compaction after each append;
            # a failed attempt waits for the context to grow before the next one
            turn = 0
            for _ in range(3):
                while True:
                    c.call("messages/append", {"sessionId": sid,
                                               "messages": agent_turn(1000 + turn)})
                    turn += 1
                    try:
                        wait_for(events, "context/compactionFailed", timeout=0.3)
                        break
                    except AssertionError:
                        assert turn < 200, "auto-compaction never ran"
            status = c.call("context/status", {"sessionId": sid})
            assert status["autoCompactionPaused"] is True
            llm.default = "good"
            assert c.call("context/compact", {"sessionId": sid})["effective"] is True
            assert c.call("context/status", {"sessionId": sid})["autoCompactionPaused"] is False
    finally:
        d.stop()
