"""The real Codex CLI (pinned in tests/agents/package.json) set up by `ctxd install codex`,
driven with `codex exec` against a scripted Responses API endpoint on loopback: its hooks
bring the rollout into ctxd while the session runs, its SessionStart hook hands the note
on ctxd to the model, the agent's call of ctxd's `search_past_messages` finds an earlier
session, nothing is stored twice though several hooks (and notify) import the same
rollout, a pin set in ctxd reaches the agent when the session resumes, and uninstalling
puts config.toml back byte for byte."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from ctxd.clients.client import connect
from tests.agents_cli import agent_env, codex_binary
from tests.harness.scripted_model import FINAL_TEXT, ScriptedModel
from tests.helpers import DaemonProcess

EARLIER = "The staging cluster is called quokka-harbour and runs on port 7731."
PROMPT = "Say hi in the shell, then look up the staging cluster."
PIN = "Never push to the release branch without a signed tag (rule 4417)."


def _users_config(base_url: str) -> str:
    """The user's own config: a model provider on loopback; MCP servers get time to start
    before the first request (a real user's start while they type)."""
    return (f'model = "scripted-model"\nmodel_provider = "scripted"\n'
            f"mcp_optional_startup_grace_ms = 60000\n\n"
            f"[model_providers.scripted]\nname = \"scripted\"\n"
            f'base_url = "{base_url}/v1"\nwire_api = "responses"\n'
            f'env_key = "SCRIPTED_API_KEY"\n')


def _ctxd(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ctxd.clients.cli", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=120)


def _codex_sessions(daemon: DaemonProcess) -> dict[str, list[dict[str, Any]]]:
    with connect(connection_file=daemon.connection_file, wire="jsonrpc") as c:
        return {s["sessionId"]: c.read(s["sessionId"], limit=500)["messages"]
                for s in c.list_sessions()["sessions"] if s["sessionId"].startswith("codex-")}


def test_codex_session_lands_live_with_note_and_search(tmp_path: Path) -> None:
    codex = codex_binary()
    (tmp_path / "ctxd").mkdir()
    daemon = DaemonProcess(tmp_path / "ctxd").start()
    try:
        home = tmp_path / "home"
        project = tmp_path / "project"
        project.mkdir()
        (home / ".codex").mkdir(parents=True)
        with connect(connection_file=daemon.connection_file) as c:
            earlier = c.create_session(title="an earlier session")["sessionId"]
            c.append(earlier, [{"role": "user", "content": EARLIER}])
        seen: dict[str, Any] = {}

        def check(step: str, body: dict[str, Any]) -> None:
            # Codex waits for this answer: what ctxd holds now was sent during the run
            seen[step] = _codex_sessions(daemon)
            seen[step + ":request"] = body

        with ScriptedModel("quokka harbour", check) as model:
            config = home / ".codex" / "config.toml"
            users = _users_config(model.base_url)
            config.write_text(users)
            env = agent_env(home, SCRIPTED_API_KEY="not-a-key",
                            CTXD_RUNTIME_DIR=str(daemon.runtime_dir))
            where = ["--data-dir", str(daemon.data_dir), "--connection-file",
                     str(daemon.connection_file)]
            done = _ctxd("install", "codex", *where, cwd=project, env=env)
            assert done.returncode == 0, done.stderr
            # the hooks ctxd wrote were reviewed here, so this automated run trusts them
            run = subprocess.run(
                [str(codex), "exec", "--skip-git-repo-check",
                 "--dangerously-bypass-approvals-and-sandbox",
                 "--dangerously-bypass-hook-trust", PROMPT],
                cwd=project, env=env, capture_output=True, text=True, timeout=300,
                stdin=subprocess.DEVNULL)
        assert run.returncode == 0, run.stderr[-3000:]
        assert FINAL_TEXT in run.stdout
        assert model.errors == []
        assert model.steps == ["bash", "search", "final"]

        # the note on ctxd (SessionStart's additionalContext) was in the first request
        first = json.dumps(seen["bash:request"])
        assert "ctxd archives this conversation" in first and "search_past_messages" in first

        # while the session ran: the prompt before the second request, the shell call and
        # its output before the third
        (sid,) = seen["search"]
        assert PROMPT in [m["content"] for m in seen["search"][sid] if m["role"] == "user"]
        calls = [t["function"] for m in seen["final"][sid] for t in m.get("tool_calls") or ()]
        assert any("echo hi" in f["arguments"] for f in calls)
        assert any(m["role"] == "tool" and "hi" in m["content"] for m in seen["final"][sid])

        # the search went through ctxd's MCP server and found the earlier session
        outputs = [i for i in seen["final:request"]["input"]
                   if i.get("type") == "function_call_output" and i["call_id"] == "call_search"]
        assert len(outputs) == 1
        found = json.dumps(outputs[0]["output"])
        assert "runs on port 7731" in found and earlier in found

        # the whole session, to the final answer, once, though notify and Stop both ran
        after = _codex_sessions(daemon)
        assert list(after) == [sid]
        archive = after[sid]
        assert archive[-1]["role"] == "assistant" and archive[-1]["content"] == FINAL_TEXT
        keys = [(m["metadata"].get("line"), m["role"], m["content"]) for m in archive]
        assert len(keys) == len(set(keys))

        # a rule pinned in ctxd reaches the agent when its session resumes (SessionStart)
        with connect(connection_file=daemon.connection_file) as c:
            c.add_pin(sid, PIN)
        resumed: list[dict[str, Any]] = []
        with ScriptedModel("unused", lambda step, body: resumed.append(body)) as model:
            # the endpoint moved: the user edits their own line, ctxd's blocks stay
            old, users = users, _users_config(model.base_url)
            config.write_text(config.read_text().replace(old, users))
            run = subprocess.run(
                [str(codex), "exec", "--skip-git-repo-check",
                 "--dangerously-bypass-approvals-and-sandbox",
                 "--dangerously-bypass-hook-trust", "resume", "--last", "Anything else?"],
                cwd=project, env=env, capture_output=True, text=True, timeout=300,
                stdin=subprocess.DEVNULL)
        assert run.returncode == 0, run.stderr[-3000:]
        assert resumed and PIN in json.dumps(resumed[0])

        done = _ctxd("install", "codex", "--uninstall", *where, cwd=project, env=env)
        assert done.returncode == 0, done.stderr
        assert config.read_text() == users
    finally:
        daemon.stop()
