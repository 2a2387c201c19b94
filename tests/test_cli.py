"""The `ctxd` inspection commands against a real daemon process.

One daemon serves the whole module; each test makes its own session when it changes
state, so the tests do not depend on their order. The CLI runs as a subprocess, as a
person or a script runs it, except where a test needs to shrink a module constant.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_for_connection_file

from ctxd.clients.cli import main
from ctxd.clients.cli.commands import running
from ctxd.clients.cli.commands import watch as watch_command
from ctxd.clients.client import Client, connect
from ctxd.protocol.connection import read_connection_file

STARTUP_TIMEOUT = 20.0
CLI_TIMEOUT = 30.0
CHINESE = "请把上下文压缩一下，保留最近的对话"


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    data_dir: Path
    connection_file: Path
    env: dict[str, str]
    tmp: Path

    @property
    def flags(self) -> list[str]:
        return ["--connection-file", str(self.connection_file)]

    def client(self) -> Client:
        return connect(self.connection_file)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("cli")
    data_dir, conn = tmp / "data", tmp / "conn.json"
    env = {**os.environ, "CTXD_RUNTIME_DIR": str(tmp / "run")}
    # a stray CTXD_DATA_DIR or config of the developer's shell must not leak in
    for key in ("CTXD_DATA_DIR", "CTXD_CONFIG", "CTXD_CONNECTION_FILE"):
        env.pop(key, None)
    # the CLI must flush by itself: an unbuffered interpreter would hide a missing flush
    env.pop("PYTHONUNBUFFERED", None)
    log = open(tmp / "daemon.log", "wb")  # closed at teardown
    proc = subprocess.Popen(
        [sys.executable, "-m", "ctxd.daemon", "serve", "--data-dir", str(data_dir),
         "--connection-file", str(conn)],
        env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_connection_file(conn, proc, tmp / "daemon.log", STARTUP_TIMEOUT)
    except (RuntimeError, TimeoutError) as exc:
        proc.kill()
        log.close()
        pytest.fail(f"the daemon did not start: {exc}")
    try:
        yield Daemon(proc, data_dir, conn, env, tmp)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


def cli(d: Daemon, *args: str, flags: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "ctxd.clients.cli", *args, *(d.flags if flags else [])]
    return subprocess.run(cmd, env=d.env, capture_output=True, text=True, timeout=CLI_TIMEOUT,
                          encoding="utf-8")


def cli_json(d: Daemon, *args: str) -> Any:
    r = cli(d, *args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def tool_turn(i: int) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"step {i}: read src/mod{i}.py and summarize it\nthanks"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{i}", "type": "function",
             "function": {"name": "read_file", "arguments": json.dumps({"path": f"mod{i}.py"})}}
        ]},
        {"role": "tool", "tool_call_id": f"call_{i}", "content": f"def f{i}(x):\n    return x"},
        {"role": "assistant", "content": f"mod{i}.py defines f{i}, which returns its input"},
    ]


def make_session(d: Daemon, turns: int = 8, title: str = "CLI 测试 session") -> dict[str, Any]:
    """A session with a system prompt, English and Chinese turns, tool calls and results."""
    with d.client() as c:
        sid = c.create_session(title=title)["sessionId"]
        ids = c.append(sid, [{"role": "system", "content": "You are a careful agent."}])[
            "messageIds"]
        ids += c.append(sid, [{"role": "user", "content": CHINESE},
                              {"role": "assistant", "content": "好的，我会保留最近的对话。"}])[
            "messageIds"]
        for i in range(turns):
            ids += c.append(sid, tool_turn(i))["messageIds"]
    return {"sessionId": sid, "ids": ids, "title": title}


@pytest.fixture(scope="module")
def session(daemon: Daemon) -> dict[str, Any]:
    """A session no test changes."""
    return make_session(daemon)


# status


def test_status_reports_the_daemon_and_never_the_token(daemon: Daemon,
                                                       session: dict[str, Any]) -> None:
    token = read_connection_file(daemon.connection_file).token
    with daemon.client() as c:
        expected = len(c.list_sessions(limit=1000)["sessions"])
    out = cli_json(daemon, "status")
    assert out["running"] is True
    assert out["pid"] == daemon.proc.pid
    assert Path(out["dataDir"]) == daemon.data_dir.resolve()
    assert out["sessions"] == expected >= 1
    assert out["endpoints"]["zmq_router"].startswith("ipc://")
    human = cli(daemon, "status")
    assert human.returncode == 0, human.stderr
    assert f"pid {daemon.proc.pid}" in human.stdout
    assert token not in human.stdout and token not in json.dumps(out)


def test_status_without_a_daemon_exits_1(daemon: Daemon) -> None:
    empty = daemon.tmp / "no-daemon-here"
    r = cli(daemon, "status", "--data-dir", str(empty), flags=False)
    assert r.returncode == 1
    assert r.stdout == ""
    assert f"no ctxd daemon for {empty.resolve()}; start one with `ctxd serve`" in r.stderr
    assert r.stderr.startswith("ctxd: ")


# sessions and show


def test_sessions_json_lists_the_session_with_its_counts(daemon: Daemon,
                                                         session: dict[str, Any]) -> None:
    out = cli_json(daemon, "sessions")
    by_id = {s["sessionId"]: s for s in out["sessions"]}
    s = by_id[session["sessionId"]]
    assert s["title"] == session["title"]
    assert s["status"]["archiveMessages"] == len(session["ids"])
    assert s["status"]["activeMessages"] == len(session["ids"])


def test_sessions_pages_with_all(daemon: Daemon, session: dict[str, Any]) -> None:
    make_session(daemon, turns=0, title="second")
    with daemon.client() as c:
        total = len(c.list_sessions(limit=1000)["sessions"])
    assert total >= 2
    one = cli_json(daemon, "sessions", "--limit", "1")
    assert len(one["sessions"]) == 1 and one["nextCursor"]
    every = cli_json(daemon, "sessions", "--limit", "1", "--all")
    assert len(every["sessions"]) == total and every["nextCursor"] is None
    human = cli(daemon, "sessions", "--limit", "1")
    assert "--all" in human.stdout


def test_sessions_over_the_json_rpc_wires(daemon: Daemon, session: dict[str, Any]) -> None:
    for wire in ("jsonrpc", "websocket"):
        out = cli_json(daemon, "sessions", "--wire", wire)
        assert session["sessionId"] in {s["sessionId"] for s in out["sessions"]}, wire


def test_show_json_counts_match_the_archive_and_context(daemon: Daemon,
                                                        session: dict[str, Any]) -> None:
    sid, ids = session["sessionId"], session["ids"]
    out = cli_json(daemon, "show", sid, "--limit", "5")
    with daemon.client() as c:
        ctx = c.context_get(sid)
        archived = c.read(sid, limit=5000)["messages"]
    assert out["archive"]["messages"] == len(ids)
    assert out["archive"]["tokens"] == sum(m["tokens"] for m in archived)
    assert [m["id"] for m in out["archive"]["last"]] == ids[-5:]
    assert out["context"]["messages"] == len(ctx["messages"]) == ctx["status"]["activeMessages"]
    assert out["context"]["estimatedTokens"] == ctx["status"]["estimatedTokens"]
    # nothing compacted yet: every archived message is in context, in order
    assert out["inContextIds"] == ids
    assert [i["archiveId"] for i in out["context"]["items"]] == ids
    assert all(m["inContext"] for m in out["archive"]["last"])


def test_show_human_has_both_sides_and_tool_calls(daemon: Daemon,
                                                  session: dict[str, Any]) -> None:
    r = cli(daemon, "show", session["sessionId"], "--limit", "3")
    assert r.returncode == 0, r.stderr
    assert "ARCHIVE" in r.stdout and "ACTIVE CONTEXT" in r.stdout
    assert 'read_file({"path": "mod7.py"})' in r.stdout
    assert f"user: {CHINESE}" in r.stdout
    last = session["ids"][-1]
    # the message's place in the session (#N, as the summary cites it), then its archive id
    ordinal = f"#{len(session['ids'])}"
    assert f"{ordinal:<6}msg {last:<6}* assistant: mod7.py defines f7" in r.stdout


def test_show_puts_a_cut_calls_file_path_first_and_whole(daemon: Daemon) -> None:
    """Agents often write the file path after a long argument (an edit's old text); a cut
    call must still say which file it touched."""
    path = "src/ctxd/daemon/compaction_commit.py"
    deep = "/home/developer/projects/customer-portal/backend/services/billing/invoices.py"
    old = "def commit(self, session_id: str) -> None:\n    pass\n" * 4
    calls = [
        ("Edit", {"old_string": old, "new_string": "def commit(self) -> None: ...",
                  "file_path": path}),
        ("Write", {"content": "x = 1\n" * 40, "file_path": deep}),
        ("Bash", {"description": "run one test file",
                  "command": "cd /home/dev/project && python -m pytest -q "
                             "tests/test_numbering.py -x -p no:cacheprovider"}),
    ]
    with daemon.client() as c:
        sid = c.create_session(title="paths")["sessionId"]
        c.append(sid, [{"role": "user", "content": "fix the commit"}] + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{name}", "type": "function",
                 "function": {"name": name, "arguments": json.dumps(args)}}]}
            for name, args in calls])
    r = cli(daemon, "show", sid)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert all(len(line) <= 100 for line in lines), lines  # a pipe: 100 columns
    shown = {name: [line for line in lines if f"{name}(" in line] for name, _ in calls}
    # once in the active context, once in the archive's last messages
    assert all(len(found) == 2 for found in shown.values()), r.stdout
    for line in shown["Edit"]:
        assert f'Edit({{"file_path": {json.dumps(path)}, "old_' in line
        assert line.endswith("…)") and '"new_string"' not in line  # the rest is still cut
    for line in shown["Write"]:
        # too long for the line: its end, the file name, is what stays
        kept = line.split('Write({"file_path": "…', 1)[1].split('"', 1)[0]
        assert deep.endswith(kept) and kept.endswith("/billing/invoices.py"), line
        assert line.endswith('", …)')  # the rest gave its cells to the path first
    for line in shown["Bash"]:
        # the command is cut around the file it names, which is whole
        assert 'Bash({"command": "' in line and " tests/test_numbering.py …" in line
        assert "no:cacheprovider" not in line
    # the same arguments, short enough, are shown as they are
    with daemon.client() as c:
        short = c.create_session(title="short")["sessionId"]
        c.append(short, [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_r", "type": "function", "function": {
                "name": "Read", "arguments": json.dumps({"limit": 5, "file_path": "a.py"})}}]}])
    r = cli(daemon, "show", short)
    assert r.returncode == 0, r.stderr
    assert 'Read({"limit": 5, "file_path": "a.py"})' in r.stdout


def test_show_says_the_pins_message_is_one_of_the_active_ones(daemon: Daemon) -> None:
    """`activeMessages` counts the generated message carrying pins and summary: `show`
    says how many of the active messages came from the archive."""
    made = make_session(daemon, turns=2)
    sid, archived = made["sessionId"], len(made["ids"])
    r = cli(daemon, "show", sid)
    assert r.returncode == 0, r.stderr
    # no pins, no summary: every active message is an archived one, said plainly
    assert f"ACTIVE CONTEXT  {archived} messages, ~" in r.stdout
    assert "pins/summary" not in r.stdout.split("SUMMARY")[0]
    assert cli(daemon, "pins", "add", sid, "keep the API stable").returncode == 0
    with daemon.client() as c:
        active = c.context_status(sid)["activeMessages"]
    assert active == archived + 1  # the protocol's count includes the pins message
    r = cli(daemon, "show", sid)
    assert r.returncode == 0, r.stderr
    assert (f"ACTIVE CONTEXT  {active} messages ({archived} from the archive + "
            "pins/summary), ~") in r.stdout
    shown = cli_json(daemon, "show", sid)["context"]
    assert shown["messages"] == active and shown["fromArchive"] == archived
    assert shown["hasSummary"] is True


def test_sessions_help_says_what_active_counts(daemon: Daemon) -> None:
    r = cli(daemon, "sessions", "--help", flags=False)
    assert r.returncode == 0, r.stderr
    assert "pins and the summary" in " ".join(r.stdout.split())


# search


def test_search_finds_the_chinese_message(daemon: Daemon, session: dict[str, Any]) -> None:
    sid = session["sessionId"]
    out = cli_json(daemon, "search", "压缩", "--session", sid)
    chinese_id = session["ids"][1]
    hit = next(h for h in out["hits"] if h["messageId"] == chinese_id)
    assert hit["sessionId"] == sid and hit["role"] == "user"
    assert "**压缩**" in hit["snippet"]
    assert hit["inActiveContext"] is True
    # not a terminal: the match markers stay as they are
    human = cli(daemon, "search", "压缩", "--session", sid)
    assert hit["ordinal"] == 2  # after the system prompt
    assert f"#2  msg {chinese_id}  {sid}" in human.stdout and "**压缩**" in human.stdout
    assert "\x1b[" not in human.stdout
    tools = cli_json(daemon, "search", "returns", "--session", sid, "--role", "tool")
    assert tools["hits"] == []


# compaction


def test_compact_force_then_show_reflects_it(daemon: Daemon) -> None:
    s = make_session(daemon, turns=10)
    sid, ids = s["sessionId"], s["ids"]
    out = cli_json(daemon, "compact", sid, "--force")
    assert out["effective"] is True
    assert out["before"]["messages"] == len(ids)
    assert out["after"]["messages"] < out["before"]["messages"]
    assert out["after"]["tokens"] < out["before"]["tokens"]
    shown = cli_json(daemon, "show", sid)
    assert shown["context"]["messages"] == out["after"]["messages"]
    assert shown["context"]["estimatedTokens"] == out["after"]["tokens"]
    assert shown["context"]["hasSummary"] is True
    assert shown["archive"]["messages"] == len(ids)
    in_ctx = set(shown["inContextIds"])
    summarized = set(range(out["summarizedFrom"], out["summarizedTo"] + 1)) & set(ids)
    assert summarized and not summarized & in_ctx
    assert ids[0] in in_ctx and ids[-1] in in_ctx  # the system prompt and the tail stay
    assert shown["status"]["compactionCount"] == 1


def test_compact_human_output_and_not_effective(daemon: Daemon) -> None:
    s = make_session(daemon, turns=10)
    r = cli(daemon, "compact", s["sessionId"], "--force")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("compaction: effective, ")
    assert f"{len(s['ids'])} → " in r.stdout
    tiny = make_session(daemon, turns=0)
    r = cli(daemon, "compact", tiny["sessionId"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("compaction: not effective, 3 → 3 messages")
    assert "reason: " in r.stdout


def test_rebuild_reports_before_and_after(daemon: Daemon) -> None:
    s = make_session(daemon, turns=2)
    out = cli_json(daemon, "rebuild", s["sessionId"])
    assert out["before"]["messages"] == len(s["ids"])
    assert set(out) >= {"effective", "before", "after"}
    r = cli(daemon, "rebuild", s["sessionId"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("rebuild: ")


def test_typed_errors_exit_2(daemon: Daemon) -> None:
    r = cli(daemon, "show", "no-such-session")
    assert r.returncode == 2
    assert r.stderr.startswith("ctxd: ") and "no-such-session" in r.stderr
    # a tool call waiting for approval blocks compaction (APPROVAL_PENDING)
    s = make_session(daemon, turns=0)
    sid = s["sessionId"]
    with daemon.client() as c:
        run = c.start_run(sid)["runId"]
        c.append(sid, tool_turn(99)[:2], run_id=run)
        c.request_approval(sid, run, "call_99", "read_file", {"path": "mod99.py"})
        r = cli(daemon, "compact", sid, "--force")
        c.finish_run(run, "cancelled")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith("ctxd: ") and r.stdout == ""


# pins


def test_pins_add_list_rm(daemon: Daemon) -> None:
    sid = make_session(daemon, turns=0)["sessionId"]
    added = cli_json(daemon, "pins", "add", sid, "keep the API stable")
    pin_id = added["pin"]["pinId"]
    assert added["pin"]["text"] == "keep the API stable"
    listed = cli_json(daemon, "pins", "list", sid)
    assert [p["pinId"] for p in listed["pins"]] == [pin_id]
    human = cli(daemon, "pins", "list", sid)
    assert pin_id in human.stdout and "keep the API stable" in human.stdout
    r = cli(daemon, "pins", "rm", sid, pin_id)
    assert r.returncode == 0, r.stderr
    assert cli_json(daemon, "pins", "list", sid)["pins"] == []
    again = cli(daemon, "pins", "remove", sid, pin_id)  # the alias, on a pin now gone
    assert again.returncode == 2 and pin_id in again.stderr
    second = cli_json(daemon, "pins", "add", sid, "second")["pin"]["pinId"]
    assert cli(daemon, "pins", "remove", sid, second).returncode == 0
    assert cli_json(daemon, "pins", "list", sid)["pins"] == []


# export


def test_export_writes_one_json_line_per_message_in_id_order(daemon: Daemon,
                                                             session: dict[str, Any]) -> None:
    sid, ids = session["sessionId"], session["ids"]
    r = cli(daemon, "export", sid)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    records = [json.loads(line) for line in lines]
    assert [m["id"] for m in records] == ids
    with daemon.client() as c:
        archived = c.read(sid, limit=5000)["messages"]
    assert records == archived
    for m in records:
        assert {"id", "batchId", "createdAt", "tokens", "role"} <= set(m)
    assert CHINESE in r.stdout  # readable UTF-8, not \\u escapes


def test_export_pages_through_the_archive_to_a_file(
        daemon: Daemon, session: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # small pages, so the export must follow nextAfterId several times
    monkeypatch.setattr(running, "READ_PAGE", 3)
    monkeypatch.setenv("CTXD_RUNTIME_DIR", daemon.env["CTXD_RUNTIME_DIR"])
    calls: list[int | None] = []
    real_read = Client.read

    def counting_read(self: Client, session_id: str, after_id: int | None = None,
                      limit: int | None = None) -> Any:
        calls.append(after_id)
        return real_read(self, session_id, after_id=after_id, limit=limit)

    monkeypatch.setattr(Client, "read", counting_read)
    target = daemon.tmp / "export.jsonl"
    rc = main(["export", session["sessionId"], "--output", str(target), *daemon.flags])
    assert rc == 0
    lines = target.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["id"] for line in lines] == session["ids"]
    assert len(calls) >= len(session["ids"]) // 3
    assert calls == sorted(calls)
    assert capsys.readouterr().out == ""  # the data went to the file only
    assert not list(daemon.tmp.glob(".export.jsonl.*"))  # no temporary file left


def test_export_unknown_session_creates_no_file(daemon: Daemon) -> None:
    target = daemon.tmp / "nothing.jsonl"
    r = cli(daemon, "export", "no-such-session", "--output", str(target))
    assert r.returncode == 2
    assert not target.exists()


# watch


def _lines(stream: Any) -> queue.Queue[str]:
    q: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in iter(stream.readline, ""):
            q.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return q


@pytest.mark.parametrize("wire", ["zmq", "websocket"])
def test_watch_prints_appends_live_and_stops_on_ctrl_c(daemon: Daemon, wire: str) -> None:
    sid = f"watched-{wire}"
    with daemon.client() as c:
        c.create_session(sid)
        # ZeroMQ topics match by prefix: this session's events reach a watcher of `sid` too
        c.create_session(sid + "-other")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ctxd.clients.cli", "watch", sid, "--json", "--wire", wire,
         *daemon.flags],
        env=daemon.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        encoding="utf-8")
    try:
        out, err = _lines(proc.stdout), _lines(proc.stderr)
        ready = err.get(timeout=10)
        assert ready.startswith(f"watching {sid}"), ready
        with daemon.client() as c:
            c.append(sid + "-other", [{"role": "user", "content": "not watched"}])
            appended = c.append(sid, [{"role": "user", "content": "live 实时"}])
        event = None
        deadline = time.monotonic() + 5
        while event is None or event["method"] != "session/didAppend":
            event = json.loads(out.get(timeout=max(0.1, deadline - time.monotonic())))
        assert event["params"]["sessionId"] == sid
        assert event["params"]["messageIds"] == appended["messageIds"]
        assert event["params"]["batchId"] == appended["batchId"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_watch_human_line(daemon: Daemon) -> None:
    assert watch_command.event_text("session/didAppend", {
        "sessionId": "s", "batchId": 7, "messageIds": [4, 5, 6], "runId": None,
    }).split() == ["append", "batch", "7:", "3", "messages", "msg", "4–6"]
    assert "26 → 14 messages" in watch_command.event_text("context/didCompact", {
        "trigger": "manual", "before": {"messages": 26, "tokens": 9},
        "after": {"messages": 14, "tokens": 5}})
    missed = watch_command.event_text("session/didMissEvents", {"sessionId": "s", "missed": 397})
    assert missed.startswith("missed     397 events") and "ctxd show" in missed
