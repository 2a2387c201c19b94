"""`ctxd hook claude-code|codex` as the agents run it: a real `ctxd` process per call, a
real daemon, real transcripts (bench/data/transcripts) written as an agent writes them."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from ctxd.clients.client import connect
from tests.helpers import DaemonProcess

DATA = Path(__file__).resolve().parent.parent / "bench" / "data" / "transcripts"
# as the console script runs it, with this very interpreter
CTXD = [sys.executable, "-m", "ctxd.clients.cli"]


class Agent:
    """An agent's side: its transcript, written line by line, and its hook calls."""

    def __init__(self, root: Path, source: Path) -> None:
        self.session = str(uuid.uuid4())
        self.lines = source.read_bytes().splitlines(keepends=True)
        self.written = 0
        self.transcript = root / "projects" / "-work-demo" / f"{self.session}.jsonl"
        self.transcript.parent.mkdir(parents=True, exist_ok=True)
        self.transcript.write_bytes(b"")
        self.root = root

    def write(self, upto: int | None = None) -> None:
        upto = len(self.lines) if upto is None else upto
        with open(self.transcript, "ab") as f:
            f.writelines(self.lines[self.written:upto])
        self.written = upto

    def hook(self, place: tuple[Path, Path], event: str, **fields: Any
             ) -> subprocess.CompletedProcess[str]:
        data_dir, connection_file = place
        body = {"hook_event_name": event, "session_id": self.session,
                "transcript_path": str(self.transcript), "cwd": "/work/demo", **fields}
        return subprocess.run(
            [*CTXD, "hook", "claude-code", "--data-dir", str(data_dir),
             "--connection-file", str(connection_file)],
            input=json.dumps(body), capture_output=True, text=True, timeout=120)


def _daemon(tmp_path: Path) -> DaemonProcess:
    root = tmp_path / "ctxd"
    root.mkdir(exist_ok=True)
    return DaemonProcess(root).start()


def _messages(daemon: DaemonProcess, sid: str) -> list[dict[str, Any]]:
    with connect(connection_file=daemon.connection_file, wire="jsonrpc") as c:
        out: list[dict[str, Any]] = []
        after = None
        while True:
            page = c.read(sid, after_id=after, limit=200)
            out += page["messages"]
            if not page["messages"] or len(page["messages"]) < 200:
                return out
            after = page["messages"][-1]["id"]


def test_hook_imports_as_the_transcript_grows_and_never_twice(tmp_path: Path) -> None:
    daemon = _daemon(tmp_path)
    try:
        agent = Agent(tmp_path, DATA / "claude-code" / "reliability-python-to-rust-port.jsonl")
        place = (daemon.data_dir, daemon.connection_file)
        sid = f"claude-code-{agent.session}"
        agent.write(40)
        done = agent.hook(place, "PostToolUse", tool_name="Bash")
        assert done.returncode == 0 and done.stdout == "", done.stderr
        first = _messages(daemon, sid)
        assert first and first[0]["role"] == "user"
        agent.write()
        assert agent.hook(place, "Stop").returncode == 0
        whole = _messages(daemon, sid)
        assert len(whole) > len(first)
        assert [m["id"] for m in whole[:len(first)]] == [m["id"] for m in first]
        # the same events again (an agent repeats hooks; a queue replays them): nothing new
        assert agent.hook(place, "Stop").returncode == 0
        assert agent.hook(place, "SessionEnd", reason="exit").returncode == 0
        assert len(_messages(daemon, sid)) == len(whole)
        # the same as `ctxd import` of the finished file gives, in another session
        other = tmp_path / "copy" / f"{uuid.uuid4()}.jsonl"
        other.parent.mkdir()
        shutil.copy(agent.transcript, other)
        imported = subprocess.run([*CTXD, "import", "claude-code", str(other), "--connection-file",
                                   str(daemon.connection_file)], capture_output=True,
                                  text=True, timeout=120)
        assert imported.returncode == 0, imported.stderr
        again = _messages(daemon, f"claude-code-{other.stem}")
        assert [(m["role"], m["content"]) for m in again] == [
            (m["role"], m["content"]) for m in whole]
    finally:
        daemon.stop()


def test_daemon_down_queues_privately_and_the_next_call_catches_up(tmp_path: Path) -> None:
    (tmp_path / "ctxd").mkdir()
    daemon = DaemonProcess(tmp_path / "ctxd")  # not started yet
    place = (daemon.data_dir, daemon.connection_file)
    agent = Agent(tmp_path, DATA / "claude-code" / "viewer-orchestrator-claude-md-ja.jsonl")
    agent.write(20)
    for event, extra in (("SessionStart", {"source": "startup"}), ("PostToolUse", {}),
                         ("PreCompact", {"trigger": "auto"})):
        done = agent.hook(place, event, **extra)
        # never in the agent's way: success, nothing for its context, a word on stderr
        assert done.returncode == 0 and done.stdout == "", done.stderr
        assert "no daemon" in done.stderr
    queue = daemon.data_dir / "hook-queue"
    assert stat.S_IMODE(queue.stat().st_mode) == 0o700
    entries = sorted(queue.iterdir())
    assert len(entries) == 3
    for e in entries:
        assert stat.S_IMODE(e.stat().st_mode) == 0o600
        assert e.stat().st_uid == os.getuid()
    assert [json.loads(e.read_text())["event"] for e in entries] == [
        "SessionStart", "PostToolUse", "PreCompact"]

    daemon.start()
    try:
        agent.write()
        done = agent.hook(place, "UserPromptSubmit", prompt="go on")
        assert done.returncode == 0, done.stderr
        assert list(queue.iterdir()) == []
        archive = _messages(daemon, f"claude-code-{agent.session}")
        marks = [m for m in archive if "agentCompaction" in (m.get("metadata") or {})]
        assert len(marks) == 1
        assert marks[0]["metadata"]["agentCompaction"]["trigger"] == "auto"
        assert marks[0]["metadata"]["agentCompaction"]["recordedLate"] is True
        # everything the transcript holds, once, though three queued events named it
        lines = [(m["metadata"]["line"], m["role"], m["content"]) for m in archive
                 if m is not marks[0]]
        assert len(lines) == len(set(lines))
        assert max(n for n, _, _ in lines) > 20  # what was written after the outage too
        assert agent.hook(place, "Stop").returncode == 0
        assert len(_messages(daemon, f"claude-code-{agent.session}")) == len(archive)
    finally:
        daemon.stop()


def test_precompact_marks_the_cut_and_import_goes_on_behind_it(tmp_path: Path) -> None:
    daemon = _daemon(tmp_path)
    try:
        place = (daemon.data_dir, daemon.connection_file)
        agent = Agent(tmp_path, DATA / "claude-code" / "reliability-coverage-test-fix.jsonl")
        sid = f"claude-code-{agent.session}"
        agent.write(20)
        done = agent.hook(place, "PreCompact", trigger="manual",
                          custom_instructions="keep the failing test names")
        assert done.returncode == 0, done.stderr
        before = _messages(daemon, sid)
        mark = before[-1]
        assert mark["metadata"]["agentCompaction"] == {
            "agent": "claude-code", "trigger": "manual",
            "instructions": "keep the failing test names"}
        assert "compacted its context here (manual)" in mark["content"]
        agent.write()
        assert agent.hook(place, "Stop").returncode == 0
        after = _messages(daemon, sid)
        assert after[:len(before)] == before
        assert len(after) > len(before)
        assert all("agentCompaction" not in (m.get("metadata") or {})
                   for m in after[len(before):])
    finally:
        daemon.stop()


def test_session_start_gives_pins_and_a_prompt_only_when_they_change(tmp_path: Path) -> None:
    daemon = _daemon(tmp_path)
    try:
        place = (daemon.data_dir, daemon.connection_file)
        agent = Agent(tmp_path, DATA / "claude-code" / "reliability-hello-world-script.jsonl")
        sid = f"claude-code-{agent.session}"
        agent.write()
        start = agent.hook(place, "SessionStart", source="startup")
        assert start.returncode == 0, start.stderr
        out = json.loads(start.stdout)["hookSpecificOutput"]
        assert out["hookEventName"] == "SessionStart"
        assert "search_past_messages" in out["additionalContext"]
        assert sid in out["additionalContext"]
        assert agent.hook(place, "UserPromptSubmit", prompt="next").stdout == ""
        with connect(connection_file=daemon.connection_file) as c:
            c.add_pin(sid, "Answers in French only.")
        changed = agent.hook(place, "UserPromptSubmit", prompt="next")
        note = json.loads(changed.stdout)["hookSpecificOutput"]
        assert note["hookEventName"] == "UserPromptSubmit"
        assert "- Answers in French only." in note["additionalContext"]
        assert agent.hook(place, "UserPromptSubmit", prompt="again").stdout == ""
        # a fresh context (the agent compacted its own) gets the pins again
        again = agent.hook(place, "SessionStart", source="compact")
        assert "Answers in French only." in json.loads(again.stdout)[
            "hookSpecificOutput"]["additionalContext"]
    finally:
        daemon.stop()


def test_bad_input_is_a_clear_error_and_changes_nothing(tmp_path: Path) -> None:
    daemon = _daemon(tmp_path)
    try:
        args = [*CTXD, "hook", "claude-code", "--data-dir", str(daemon.data_dir),
                "--connection-file", str(daemon.connection_file)]
        for body in ("not json", "[1, 2]", json.dumps({"session_id": "x"})):
            done = subprocess.run(args, input=body, capture_output=True, text=True, timeout=60)
            # 1: a non-blocking error for Claude Code (2 would block the agent's turn)
            assert done.returncode == 1
            assert done.stderr.startswith("ctxd hook: unusable input:")
        assert not (daemon.data_dir / "hook-queue").exists()
        with connect(connection_file=daemon.connection_file) as c:
            assert c.list_sessions()["sessions"] == []
            assert c.heartbeat() is not None
    finally:
        daemon.stop()


def test_codex_notify_finds_the_rollout_by_thread_id(tmp_path: Path) -> None:
    daemon = _daemon(tmp_path)
    try:
        name = "rollout-2025-11-17T15-30-28-019a93b9-f380-7600-98ff-940e6b99603c.jsonl"
        home = tmp_path / "codex-home"
        day = home / "sessions" / "2025" / "11" / "17"
        day.mkdir(parents=True)
        shutil.copy(DATA / "codex" / name, day / name)
        payload = {"type": "agent-turn-complete",
                   "thread-id": "019a93b9-f380-7600-98ff-940e6b99603c", "turn-id": "1",
                   "cwd": "/work/demo", "input-messages": ["hi"],
                   "last-assistant-message": "done"}
        env = {**os.environ, "CODEX_HOME": str(home)}
        args = [*CTXD, "hook", "codex", "--data-dir", str(daemon.data_dir),
                "--connection-file", str(daemon.connection_file), json.dumps(payload)]
        done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        sid = "codex-2025-11-17T15-30-28-019a93b9-f380-7600-98ff-940e6b99603c"
        first = _messages(daemon, sid)
        assert len(first) > 5
        again = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
        assert again.returncode == 0
        assert len(_messages(daemon, sid)) == len(first)
    finally:
        daemon.stop()


def test_concurrent_hook_calls_store_each_message_once(tmp_path: Path) -> None:
    daemon = _daemon(tmp_path)
    try:
        place = (daemon.data_dir, daemon.connection_file)
        agent = Agent(tmp_path, DATA / "claude-code" / "privacy-x402.jsonl")
        agent.write()
        body = json.dumps({"hook_event_name": "PostToolUse", "session_id": agent.session,
                           "transcript_path": str(agent.transcript), "cwd": "/work/demo"})
        args = [*CTXD, "hook", "claude-code", "--data-dir", str(place[0]),
                "--connection-file", str(place[1])]
        # parallel tool calls: Claude Code starts their PostToolUse hooks at once
        procs = [subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(5)]
        for p in procs:
            out, err = p.communicate(body, timeout=120)
            assert p.returncode == 0, err
        archive = _messages(daemon, f"claude-code-{agent.session}")
        keys = [(m["metadata"]["line"], m["role"], m["content"]) for m in archive]
        assert keys and len(keys) == len(set(keys))
        other = tmp_path / "copy" / f"{uuid.uuid4()}.jsonl"
        other.parent.mkdir()
        shutil.copy(agent.transcript, other)
        subprocess.run([*CTXD, "import", "claude-code", str(other), "--connection-file",
                        str(daemon.connection_file)], check=True, capture_output=True,
                       timeout=120)
        assert len(_messages(daemon, f"claude-code-{other.stem}")) == len(archive)
    finally:
        daemon.stop()


def test_a_foreign_or_broken_queue_entry_is_dropped_not_replayed_forever(tmp_path: Path) -> None:
    daemon = _daemon(tmp_path)
    try:
        queue = daemon.data_dir / "hook-queue"
        queue.mkdir(mode=0o700)
        for name, body in (("00000000000000000001-1.json", "{not json"),
                           ("00000000000000000002-1.json", json.dumps(
                               {"agent": "nobody", "event": "Stop"})),
                           ("00000000000000000003-1.json", json.dumps([1]))):
            (queue / name).write_text(body)
            (queue / name).chmod(0o600)
        agent = Agent(tmp_path, DATA / "claude-code" / "reliability-hello-world-script.jsonl")
        agent.write()
        done = agent.hook((daemon.data_dir, daemon.connection_file), "Stop")
        assert done.returncode == 0, done.stderr
        assert "unknown agent 'nobody'" in done.stderr
        assert list(queue.iterdir()) == []
        assert _messages(daemon, f"claude-code-{agent.session}")
    finally:
        daemon.stop()


def test_a_fresh_context_while_the_daemon_is_down_gets_the_last_pins(tmp_path: Path) -> None:
    daemon = _daemon(tmp_path)
    place = (daemon.data_dir, daemon.connection_file)
    agent = Agent(tmp_path, DATA / "claude-code" / "reliability-hello-world-script.jsonl")
    agent.write()
    try:
        with connect(connection_file=daemon.connection_file) as c:
            c.create_session(f"claude-code-{agent.session}")
            c.add_pin(f"claude-code-{agent.session}", "Keep every migration reversible.")
        start = agent.hook(place, "SessionStart", source="startup")
        assert "Keep every migration reversible." in start.stdout
    finally:
        daemon.stop()
    # the agent compacts its own context while ctxd is down (restarting, upgrading)
    again = agent.hook(place, "SessionStart", source="compact")
    assert again.returncode == 0, again.stderr
    note = json.loads(again.stdout)["hookSpecificOutput"]["additionalContext"]
    assert "- Keep every migration reversible." in note
    assert "could not be reached" in note
    # a session never seen gets nothing: there is nothing true to say about it
    other = Agent(tmp_path / "other", DATA / "claude-code" / "viewer-init.jsonl")
    assert other.hook(place, "SessionStart", source="startup").stdout == ""
