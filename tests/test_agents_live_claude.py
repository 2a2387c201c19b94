"""The real Claude Code CLI (pinned in tests/agents/package.json) set up by `ctxd install
claude-code`, driven with `claude -p` against a scripted model on loopback: its session
lands in ctxd while it runs, the pins reach the model at session start, the agent's call
of `search_past_messages` finds an earlier session, its own `/compact` is marked in the
archive where the context was cut, and uninstalling puts the config back byte for byte."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from ctxd.clients.client import connect
from ctxd.protocol.errors import CtxdError
from tests.agents_cli import agent_env, claude_binary
from tests.harness.scripted_model import BASH_COMMAND, FINAL_TEXT, ScriptedModel
from tests.helpers import DaemonProcess

PIN = "Never push to the release branch without a signed tag (rule 4417)."
EARLIER = "The staging cluster is called quokka-harbour and runs on port 7731."
USER_SETTINGS = '{\n    "enableAllProjectMcpServers": true\n}\n'  # the user's own, kept


def _ctxd(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ctxd.clients.cli", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=120)


def _archive(daemon: DaemonProcess, sid: str) -> list[dict[str, Any]]:
    with connect(connection_file=daemon.connection_file, wire="jsonrpc") as c:
        return c.read(sid, limit=500)["messages"]


def _wait_for(daemon: DaemonProcess, sid: str, ready: Any,
              within: float = 60.0) -> list[dict[str, Any]]:
    """The session's archive once `ready(archive)` holds (or as it is after `within`)."""
    deadline = time.monotonic() + within
    while True:
        try:
            archive = _archive(daemon, sid)
        except CtxdError:
            archive = []
        if ready(archive) or time.monotonic() > deadline:
            return archive
        time.sleep(0.05)


def test_claude_code_session_lands_live_with_pins_and_search(tmp_path: Path) -> None:
    claude = claude_binary()
    (tmp_path / "ctxd").mkdir()
    daemon = DaemonProcess(tmp_path / "ctxd").start()
    try:
        home = tmp_path / "home"
        project = tmp_path / "project"
        (project / ".claude").mkdir(parents=True)
        home.mkdir()
        settings = project / ".claude" / "settings.json"
        settings.write_text(USER_SETTINGS)
        session = str(uuid.uuid4())
        sid = f"claude-code-{session}"
        with connect(connection_file=daemon.connection_file) as c:
            earlier = c.create_session(title="an earlier session")["sessionId"]
            c.append(earlier, [{"role": "user", "content": EARLIER}])
            # the user pinned a rule for this session (web page, CLI or editor) beforehand
            c.create_session(sid, title="pinned ahead")
            c.add_pin(sid, PIN)
        env = agent_env(home, ANTHROPIC_API_KEY="sk-test-not-a-key",
                        CTXD_RUNTIME_DIR=str(daemon.runtime_dir))
        where = ["--data-dir", str(daemon.data_dir), "--connection-file",
                 str(daemon.connection_file)]
        done = _ctxd("install", "claude-code", "--scope", "project", *where,
                     cwd=project, env=env)
        assert done.returncode == 0, done.stderr
        assert json.loads((project / ".mcp.json").read_text())["mcpServers"]["ctxd"]

        seen: dict[str, list[dict[str, Any]]] = {}
        # what must be in ctxd before each answer: the prompt before the second request,
        # the shell call and its output before the third (the capture hooks run in the
        # background, so the check waits for them, while the agent waits for the answer)
        expected = {"bash": lambda a: True,
                    "search": lambda a: any(m["role"] == "user" for m in a),
                    "final": lambda a: any(m["role"] == "tool" for m in a)}

        def check(step: str, body: dict[str, Any]) -> None:
            seen[step + ":request"] = [body]
            seen[step] = _wait_for(daemon, sid, expected[step])

        with ScriptedModel("quokka harbour", check) as model:
            env["ANTHROPIC_BASE_URL"] = model.base_url
            run = subprocess.run(
                [str(claude), "-p", "Say hi in the shell, then look up the staging cluster.",
                 "--session-id", session, "--model", "claude-sonnet-4-5",
                 "--allowedTools", f"Bash({BASH_COMMAND.split()[0]}:*)",
                 "mcp__ctxd__search_past_messages", "--output-format", "json"],
                cwd=project, env=env, capture_output=True, text=True, timeout=300,
                stdin=subprocess.DEVNULL)
        assert run.returncode == 0, run.stderr[-2000:] + run.stdout[-2000:]
        assert json.loads(run.stdout)["result"] == FINAL_TEXT
        assert model.errors == []
        assert model.steps == ["bash", "search", "final"]

        # pins and the note on search_past_messages were in the very first request
        first = json.dumps(seen["bash:request"][0])
        assert PIN in first
        assert "search_past_messages" in first

        # while the session ran: the prompt was in ctxd before the second request, the
        # shell call and its output before the third
        assert [m["content"] for m in seen["search"] if m["role"] == "user"] == [
            "Say hi in the shell, then look up the staging cluster."]
        calls = [t["function"] for m in seen["final"] for t in m.get("tool_calls") or ()]
        assert any(f["name"] == "Bash" and BASH_COMMAND in f["arguments"] for f in calls)
        assert any(m["role"] == "tool" and m["content"].strip() == "hi" for m in seen["final"])

        # the search ran in ctxd and found the earlier session
        results = [b for m in seen["final:request"][0]["messages"]
                   if isinstance(m["content"], list) for b in m["content"]
                   if b.get("type") == "tool_result" and b.get("tool_use_id") == "toolu_search"]
        assert len(results) == 1
        found = json.dumps(results[0]["content"])
        assert "runs on port 7731" in found and earlier in found

        # and the whole session, to the final answer, once the agent stopped
        archive = _wait_for(daemon, sid, lambda a: a and a[-1]["content"] == FINAL_TEXT)
        assert archive[-1]["role"] == "assistant" and archive[-1]["content"] == FINAL_TEXT
        assert sum(1 for m in archive if m["role"] == "tool") == 2
        # running the hooks again stores nothing twice
        count = len(archive)
        again = _ctxd("hook", "claude-code", *where, cwd=project, env=env)
        assert again.returncode != 0  # no input: a clear error, nothing stored
        transcript = next((home / ".claude" / "projects").rglob(f"{session}.jsonl"))
        event = json.dumps({"hook_event_name": "Stop", "session_id": session,
                            "transcript_path": str(transcript), "cwd": str(project)})
        rerun = subprocess.run([sys.executable, "-m", "ctxd.clients.cli", "hook",
                                "claude-code", *where], input=event,
                               env=env, capture_output=True, text=True, timeout=60)
        assert rerun.returncode == 0, rerun.stderr
        assert len(_archive(daemon, sid)) == count

        # the agent's own compaction (/compact) is marked where the context was cut,
        # before the summary Claude Code wrote for the compacted context
        with ScriptedModel("unused") as model:
            env["ANTHROPIC_BASE_URL"] = model.base_url
            compact = subprocess.run(
                [str(claude), "-p", "/compact keep the shell output", "--resume", session,
                 "--model", "claude-sonnet-4-5"], cwd=project, env=env, capture_output=True,
                text=True, timeout=300, stdin=subprocess.DEVNULL)
        assert compact.returncode == 0, compact.stderr[-2000:]
        archive = _wait_for(daemon, sid, lambda a: any(
            (m.get("metadata") or {}).get("compactSummary") for m in a))
        marks = [i for i, m in enumerate(archive)
                 if "agentCompaction" in (m.get("metadata") or {})]
        assert len(marks) == 1 and marks[0] == count
        assert archive[count]["metadata"]["agentCompaction"] == {
            "agent": "claude-code", "trigger": "manual", "instructions": "keep the shell output"}
        assert archive[count + 1]["metadata"].get("compactSummary") is True

        done = _ctxd("install", "claude-code", "--scope", "project", "--uninstall", *where,
                     cwd=project, env=env)
        assert done.returncode == 0, done.stderr
        assert settings.read_text() == USER_SETTINGS
        assert not (project / ".mcp.json").exists()
    finally:
        daemon.stop()
