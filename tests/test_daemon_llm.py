"""The daemon with an OpenAI-compatible summarizer, served by a loopback fake endpoint."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
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


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli(d: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "ctxd.clients.cli", *args,
           "--data-dir", str(d.data_dir), "--connection-file", str(d.connection_file)]
    return subprocess.run(cmd, env=d.env, capture_output=True, text=True, timeout=60)


def test_a_closed_port_is_said_at_start_and_compaction_falls_back(tmp_path: Path) -> None:
    port = _closed_port()
    config = tmp_path / "ctxd.toml"
    # no fallback key: the built-in summarizer is the default fallback
    config.write_text(
        'summarizer = "openai"\n[openai]\n'
        f'base_url = "http://127.0.0.1:{port}/v1"\nmodel = "gemma3"\ntimeout_seconds = 5\n'
    )
    d = DaemonProcess(tmp_path, "--config", str(config)).start()
    try:
        deadline = time.monotonic() + 30
        while "summarizer endpoint" not in d.log_path.read_text(errors="replace"):
            assert time.monotonic() < deadline, d.log_path.read_text(errors="replace")
            time.sleep(0.1)
        said = d.log_path.read_text(errors="replace")
        assert f"127.0.0.1:{port}" in said and 'fallback = "builtin"' in said
        with d.client("jsonrpc") as c:
            sid = c.call("session/create", {})["sessionId"]
            _fill(c, sid, 10)
            assert c.call("context/compact", {"sessionId": sid, "force": True})["effective"]
            explained = c.call("context/explain", {"sessionId": sid})
            assert explained["provenance"]["summarizer"].startswith("builtin (fallback:")
            assert explained["brokenPointers"] == 0
            status = c.call("context/status", {"sessionId": sid})
            assert status["summarizer"] == "openai:gemma3 (fallback builtin)"
            assert "request failed" in status["summarizerLastFailure"]
        shown = _cli(d, "status", "--json")
        assert shown.returncode == 0, shown.stderr
        doc = json.loads(shown.stdout)
        assert doc["summarizer"] == "openai:gemma3 (fallback builtin)"
        assert "request failed" in doc["summarizerLastFailure"]["message"]
        text = _cli(d, "status")
        assert "openai:gemma3 (fallback builtin)" in text.stdout
        assert "last failure" in text.stdout and "request failed" in text.stdout
        configured = _cli(d, "config", "--config", str(config))
        assert configured.returncode == 0
        assert json.loads(configured.stdout)["openai"]["fallback"] == "builtin"
        assert "warning: summarizer: openai:gemma3" in configured.stderr
        assert "unreachable" in configured.stderr
    finally:
        d.stop()
