"""`ctxd import claude-code|codex`: transcripts into sessions, against a real daemon.

The fixtures under tests/fixtures/transcripts are written from the published formats:
tool use, failing tool results, compaction summaries, sidechains and subagent files,
multi-part content with images, Chinese and emoji, corrupt lines and unknown line types.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import DaemonProcess
from transcript_gen import claude_code_lines, write_claude_code

from ctxd.clients.client import Client
from ctxd.protocol.connection import read_connection_file

FIXTURES = Path(__file__).parent / "fixtures" / "transcripts"
CC_DIR = FIXTURES / "claude-code"
CODEX_DIR = FIXTURES / "codex"
CC_MAIN = "claude-code-7f1c2a9e-4b1d-4c53-9a11-2f7a0c6e9b10"
CODEX_SID = "codex-2025-10-29T00-59-38-0199a213-81c0-7800-8aa1-bbab2a035a53"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("import")).start()
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> Iterator[Client]:
    with daemon.client() as c:
        yield c


def ctxd_import(d: DaemonProcess, *args: str) -> dict[str, Any]:
    r = subprocess.run(
        [sys.executable, "-m", "ctxd.clients.cli", "import", *args, "--json",
         "--connection-file", str(d.connection_file)],
        env=d.env, capture_output=True, text=True, timeout=120, encoding="utf-8")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def archive(c: Client, sid: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    after = 0
    while True:
        page = c.read(sid, after_id=after, limit=5000)
        out += page["messages"]
        if page["nextAfterId"] is None:
            return out
        after = page["nextAfterId"]


@pytest.fixture(scope="module")
def claude_report(daemon: DaemonProcess) -> dict[str, Any]:
    return ctxd_import(daemon, "claude-code", str(CC_DIR), "--verbose")


@pytest.fixture(scope="module")
def codex_report(daemon: DaemonProcess) -> dict[str, Any]:
    return ctxd_import(daemon, "codex", str(CODEX_DIR))


def test_claude_code_messages_in_openai_shape(claude_report: dict[str, Any],
                                              client: Client) -> None:
    assert claude_report["sessionsCreated"] == 3
    session = client.get_session(CC_MAIN)["session"]
    assert session["title"] == "Fix checkout total rounding"  # from the summary line
    meta = session["metadata"]
    assert meta["cwd"] == "/home/dev/shop" and meta["source"] == "claude-code"
    assert meta["startedAt"] > 1.7e9 and meta["gitBranch"] == "main"
    msgs = archive(client, CC_MAIN)
    roles = [m["role"] for m in msgs]
    assert roles[:3] == ["user", "assistant", "tool"]
    assert "结账测试失败了" in msgs[0]["content"]
    # thinking, text and tool_use lines of one API message are one assistant message
    first = msgs[1]
    assert first["content"] == "Let me run the tests first."
    assert first["metadata"]["reasoning"] == "The checkout total probably rounds twice."
    call = first["tool_calls"][0]
    assert call["id"] == "toolu_01" and call["function"]["name"] == "Bash"
    assert json.loads(call["function"]["arguments"])["command"].startswith("pytest")
    # a failing tool result keeps its link and is marked
    assert msgs[2]["tool_call_id"] == "toolu_01" and msgs[2]["metadata"]["isError"] is True
    assert "1 failed" in msgs[2]["content"]
    # parallel calls on two lines become one message; both results follow, linked
    parallel = msgs[3]
    assert [c["id"] for c in parallel["tool_calls"]] == ["toolu_02", "toolu_03"]
    assert [(m["role"], m["tool_call_id"]) for m in msgs[4:6]] == [
        ("tool", "toolu_02"), ("tool", "toolu_03")]
    assert "round(sum(" in msgs[4]["content"]
    # compaction summary kept and marked; image referenced, not inlined
    summary = [m for m in msgs if (m.get("metadata") or {}).get("compactSummary")]
    assert len(summary) == 1 and "continued from a previous conversation" in summary[0]["content"]
    image_msg = next(m for m in msgs if "receipt 🧾" in str(m["content"]))
    assert "[image image/png" in image_msg["content"] and "iVBOR" not in image_msg["content"]
    assert msgs[-1]["content"].startswith("已修复 ✅")
    # the sidechain lines are not in the main session
    assert not any("sidechain answer" in str(m["content"]) for m in msgs)


def test_claude_code_sidechains_and_subagents_are_their_own_sessions(
        claude_report: dict[str, Any], client: Client) -> None:
    side = client.get_session(f"{CC_MAIN}-sidechain")["session"]
    assert side["metadata"]["sidechain"] is True
    assert side["metadata"]["parentSessionId"] == CC_MAIN
    assert [m["role"] for m in archive(client, f"{CC_MAIN}-sidechain")] == ["user", "assistant"]
    agent = client.get_session("claude-code-agent-a1b2c3d4")["session"]
    assert agent["metadata"]["agentId"] == "a1b2c3d4"
    assert agent["metadata"]["parentSessionId"] == CC_MAIN
    msgs = archive(client, "claude-code-agent-a1b2c3d4")
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant"]


def test_claude_code_report_counts_what_was_not_mapped(claude_report: dict[str, Any]) -> None:
    assert claude_report["unmappable"] == {"corrupt JSON": 1,
                                           "unknown line type 'future-thing'": 1}
    assert claude_report["skipped"] == {"summary": 1, "file-history-snapshot": 1,
                                        "system:compact_boundary": 1,
                                        "content block server_tool_use": 1}
    details = "\n".join(claude_report["details"])
    assert ".jsonl:15: corrupt JSON" in details and ".jsonl:20: unknown line type" in details
    assert "content block server_tool_use (1), skipped" in details
    # lines after the corrupt one were imported: the file did not stop there
    assert claude_report["messages"] == 11 + 2 + 4


def test_codex_rollout(codex_report: dict[str, Any], client: Client) -> None:
    session = client.get_session(CODEX_SID)["session"]
    assert session["metadata"]["cwd"] == "/home/dev/tool"
    assert session["metadata"]["sourceSessionId"] == "0199a213-81c0-7800-8aa1-bbab2a035a53"
    assert session["title"].startswith("Rename the config loader")
    msgs = archive(client, CODEX_SID)
    assert msgs[0]["role"] == "system" and msgs[0]["metadata"]["originalRole"] == "developer"
    assert msgs[1]["metadata"]["context"] is True  # <environment_context>
    calls = {c["id"]: (m, c) for m in msgs for c in m.get("tool_calls") or ()}
    assert set(calls) == {"call_A1", "call_L1", "call_P1", "call_A2"}
    m, c = calls["call_A1"]
    assert json.loads(c["function"]["arguments"])["command"] == ["rg", "load_config"]
    assert "grep for load_config" in m["metadata"]["reasoning"]
    assert calls["call_L1"][1]["function"]["name"] == "local_shell"
    assert "*** Begin Patch" in calls["call_P1"][1]["function"]["arguments"]
    results = {m["tool_call_id"]: m for m in msgs if m["role"] == "tool"}
    assert set(results) == set(calls)
    assert results["call_A2"]["metadata"]["isError"] is True
    assert "ImportError" in results["call_A2"]["content"]
    # every result comes after its call
    pos = {id(m): i for i, m in enumerate(msgs)}
    assert all(pos[id(results[k])] > pos[id(calls[k][0])] for k in calls)
    assert any((m.get("metadata") or {}).get("compactSummary") for m in msgs)
    img = next(m for m in msgs if "📎" in str(m["content"]))
    assert "[image image/png" in img["content"] and "base64" not in img["content"]
    assert codex_report["unmappable"] == {"corrupt JSON": 1,
                                          "unknown line type 'future_item'": 1}
    assert codex_report["skipped"]["event_msg:token_count"] == 1
    # Codex's undo snapshot of the working tree: known bookkeeping
    assert codex_report["skipped"]["response_item:ghost_snapshot"] == 1


def test_reimport_adds_nothing(claude_report: dict[str, Any], codex_report: dict[str, Any],
                               daemon: DaemonProcess, client: Client) -> None:
    before = {s: len(archive(client, s)) for s in (CC_MAIN, CODEX_SID)}
    again = ctxd_import(daemon, "claude-code", str(CC_DIR))
    assert again["messages"] == 0 and again["sessionsCreated"] == 0
    assert ctxd_import(daemon, "codex", str(CODEX_DIR))["messages"] == 0
    assert {s: len(archive(client, s)) for s in before} == before


def test_search_finds_imported_text_in_chinese(claude_report: dict[str, Any],
                                               codex_report: dict[str, Any],
                                               client: Client) -> None:
    hits = client.search("结账测试")["hits"]
    assert any(h["sessionId"] == CC_MAIN for h in hits)
    hits = client.search("重命名")["hits"]
    assert any(h["sessionId"] == CODEX_SID for h in hits)
    found = client.call_tool(CC_MAIN, "search_past_messages",
                             {"query": "数据库", "scope": "all"})
    assert "sidechain" in found["content"]


def test_grown_file_adds_only_new_lines(daemon: DaemonProcess, client: Client,
                                        tmp_path: Path) -> None:
    lines = list(claude_code_lines("grow0001-aaaa", 30))
    path = tmp_path / "grow0001-aaaa.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines[:47]) + "\n")
        f.write(lines[47][:40])  # a writer in the middle of a line
    first = ctxd_import(daemon, "claude-code", str(path))
    sid = "claude-code-grow0001-aaaa"
    n1 = len(archive(client, sid))
    assert first["messages"] == n1 > 0
    with open(path, "a", encoding="utf-8") as f:
        f.write(lines[47][40:] + "\n" + "\n".join(lines[48:]) + "\n")
    second = ctxd_import(daemon, "claude-code", str(path))
    msgs = archive(client, sid)
    assert second["messages"] == len(msgs) - n1 > 0
    # the same messages as a single import of the whole file, none twice
    whole = tmp_path / "grow0002-aaaa.jsonl"
    whole.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ctxd_import(daemon, "claude-code", str(whole))
    one = archive(client, "claude-code-grow0002-aaaa")
    assert [m["role"] for m in msgs] == [m["role"] for m in one]
    assert [str(m["content"]) for m in msgs] == [str(m["content"]) for m in one]
    ids = [c["id"] for m in msgs for c in m.get("tool_calls") or ()]
    assert len(ids) == len(set(ids)) == 30


def test_drop_reasoning_and_mark_sidechains(daemon: DaemonProcess, client: Client,
                                            tmp_path: Path) -> None:
    src = next(CC_DIR.rglob("7f1c*.jsonl"))
    path = tmp_path / "copy0001.jsonl"
    shutil.copy(src, path)
    ctxd_import(daemon, "claude-code", str(path), "--drop-reasoning", "--sidechains", "mark")
    msgs = archive(client, "claude-code-copy0001")
    assert not any("reasoning" in (m.get("metadata") or {}) for m in msgs)
    marked = [m for m in msgs if (m.get("metadata") or {}).get("sidechain")]
    assert [m["role"] for m in marked] == ["user", "assistant"]


def test_killed_import_leaves_no_half_batch(daemon: DaemonProcess, client: Client,
                                            tmp_path: Path) -> None:
    folder = tmp_path / "big"
    expected = sum(write_claude_code(folder / f"crash{i:04d}-aaaa.jsonl", f"crash{i:04d}-aaaa",
                                     400) for i in range(3))
    cmd = [sys.executable, "-m", "ctxd.clients.cli", "import", "claude-code", str(folder),
           "--connection-file", str(daemon.connection_file)]
    proc = subprocess.Popen(cmd, env=daemon.env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    sids = [f"claude-code-crash{i:04d}-aaaa" for i in range(3)]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        done = sum(client.context_status(s)["archiveMessages"]
                   for s in sids if _exists(client, s))
        if done > 0:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    partial = sum(len(archive(client, s)) for s in sids if _exists(client, s))
    assert partial % 4 == 0 or partial < expected  # whatever landed, landed whole
    ctxd_import(daemon, "claude-code", str(folder))
    for s in sids:
        msgs = archive(client, s)
        assert len(msgs) == 400 * 4
        ids = [c["id"] for m in msgs for c in m.get("tool_calls") or ()]
        assert len(ids) == len(set(ids)) == 400
    assert sum(len(archive(client, s)) for s in sids) == expected


def _exists(client: Client, sid: str) -> bool:
    try:
        client.get_session(sid)
        return True
    except Exception:
        return False


def test_imported_sessions_compact_like_any_other(daemon: DaemonProcess, client: Client,
                                                  tmp_path: Path) -> None:
    path = tmp_path / "compact1-aaaa.jsonl"
    write_claude_code(path, "compact1-aaaa", 60)
    ctxd_import(daemon, "claude-code", str(path))
    sid = "claude-code-compact1-aaaa"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        st = client.context_status(sid)
        if st["compactionCount"] >= 1 and not st["compacting"]:
            break
        time.sleep(0.1)
    assert st["compactionCount"] >= 1, st
    assert st["activeMessages"] < st["archiveMessages"] == 240


def test_follow_imports_as_the_agent_writes(daemon: DaemonProcess, client: Client,
                                            tmp_path: Path) -> None:
    folder = tmp_path / "live"
    folder.mkdir()
    cmd = [sys.executable, "-m", "ctxd.clients.cli", "import", "claude-code", str(folder),
           "--follow", "--interval", "0.1", "--connection-file", str(daemon.connection_file)]
    proc = subprocess.Popen(cmd, env=daemon.env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    sid = "claude-code-follow01-aaaa"
    try:
        lines = list(claude_code_lines("follow01-aaaa", 6))
        path = folder / "follow01-aaaa.jsonl"
        for k in (10, 20, 30):  # three writes, the last ends the file
            with open(path, "a", encoding="utf-8") as f:
                f.write("".join(ln + "\n" for ln in lines[k - 10:k]))
            expected = k // 5 * 4
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if _exists(client, sid) and len(archive(client, sid)) >= expected:
                    break
                time.sleep(0.05)
            assert len(archive(client, sid)) == expected
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        assert proc.stderr is not None
        proc.stderr.close()


def test_missing_path_is_a_clear_error(daemon: DaemonProcess, tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "ctxd.clients.cli", "import", "codex", str(tmp_path / "nope"),
         "--connection-file", str(daemon.connection_file)],
        env={**os.environ, **daemon.env}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "does not exist" in r.stderr


def test_messages_other_clients_add_do_not_confuse_the_resume_point(
        daemon: DaemonProcess, client: Client, tmp_path: Path) -> None:
    lines = list(claude_code_lines("shared01-aaaa", 10))
    path = tmp_path / "shared01-aaaa.jsonl"
    path.write_text("\n".join(lines[:25]) + "\n", encoding="utf-8")
    ctxd_import(daemon, "claude-code", str(path))
    sid = "claude-code-shared01-aaaa"
    # an agent goes on in the imported session through another client
    client.append(sid, [{"role": "user", "content": "a note from another client"}])
    with open(path, "a", encoding="utf-8") as f:
        f.write("\n".join(lines[25:]) + "\n")
    again = ctxd_import(daemon, "claude-code", str(path))
    assert again["messages"] == 20 and again["notes"] == []
    msgs = archive(client, sid)
    assert len(msgs) == 41
    ids = [c["id"] for m in msgs for c in m.get("tool_calls") or ()]
    assert len(ids) == len(set(ids)) == 10
    # a session of that name that no import wrote is left alone
    client.create_session("claude-code-foreign1-aaaa")
    client.append("claude-code-foreign1-aaaa", [{"role": "user", "content": "mine"}])
    foreign = tmp_path / "foreign1-aaaa.jsonl"
    foreign.write_text("\n".join(lines) + "\n", encoding="utf-8")
    report = ctxd_import(daemon, "claude-code", str(foreign))
    assert report["messages"] == 0 and "left alone" in report["notes"][0]
    assert len(archive(client, "claude-code-foreign1-aaaa")) == 1


def test_default_locations(daemon: DaemonProcess, client: Client, tmp_path: Path) -> None:
    home = tmp_path / "home"
    shutil.copytree(CC_DIR / "-home-dev-shop", home / ".claude" / "projects" / "-p")
    shutil.copytree(CODEX_DIR, home / "codex-home" / "sessions")
    # the copies are new files for ctxd: rename them so their sessions are new too
    for f in (home / ".claude" / "projects" / "-p").iterdir():
        f.rename(f.with_name("home-" + f.name))
    for f in (home / "codex-home").rglob("rollout-*.jsonl"):
        f.rename(f.with_name(f.name.replace("rollout-", "rollout-home-")))
    env = {**daemon.env, "HOME": str(home), "CODEX_HOME": str(home / "codex-home")}
    env.pop("CLAUDE_CONFIG_DIR", None)
    for fmt, expected in (("claude-code", 17), ("codex", 15)):
        r = subprocess.run(
            [sys.executable, "-m", "ctxd.clients.cli", "import", fmt, "--json",
             "--connection-file", str(daemon.connection_file)],
            env=env, capture_output=True, text=True, timeout=120, encoding="utf-8")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["messages"] == expected
    assert client.get_session("claude-code-home-agent-a1b2c3d4")["status"]["archiveMessages"] == 4


def test_codex_call_waits_for_its_output(daemon: DaemonProcess, client: Client,
                                         tmp_path: Path) -> None:
    from transcript_gen import codex_lines

    lines = list(codex_lines("wait0001", 5))
    path = tmp_path / "rollout-wait0001.jsonl"
    path.write_text("\n".join(lines[:7]) + "\n", encoding="utf-8")  # ends on a call
    first = ctxd_import(daemon, "codex", str(path))
    assert first["deferred"] == 1 and first["messages"] == 5
    with open(path, "a", encoding="utf-8") as f:
        f.write("\n".join(lines[7:]) + "\n")
    ctxd_import(daemon, "codex", str(path))
    msgs = archive(client, "codex-wait0001")
    assert len(msgs) == 20 and not any((m.get("metadata") or {}).get("repaired") for m in msgs)


def test_follow_survives_a_daemon_restart(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    d = DaemonProcess(tmp_path / "d").start()
    folder = tmp_path / "live"
    folder.mkdir()
    lines = list(claude_code_lines("restart1-aaaa", 4))
    path = folder / "restart1-aaaa.jsonl"
    path.write_text("".join(ln + "\n" for ln in lines[:10]), encoding="utf-8")
    sid = "claude-code-restart1-aaaa"
    cmd = [sys.executable, "-m", "ctxd.clients.cli", "import", "claude-code", str(folder),
           "--follow", "--interval", "0.1", "--connection-file", str(d.connection_file),
           "--data-dir", str(d.data_dir)]
    proc = subprocess.Popen(cmd, env=d.env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        def count(want: int) -> int:
            deadline = time.monotonic() + 30
            n = -1
            while time.monotonic() < deadline:
                try:
                    with Client.connect(str(d.connection_file), None, "jsonrpc") as c:
                        n = len(archive(c, sid)) if _exists(c, sid) else 0
                except ConnectionError:
                    n = -1
                if n >= want:
                    return n
                time.sleep(0.1)
            return n

        assert count(8) == 8
        d.stop()  # the daemon goes away; the importer starts it again on its data dir
        with open(path, "a", encoding="utf-8") as f:
            f.write("".join(ln + "\n" for ln in lines[10:]))
        assert count(16) == 16
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if d.connection_file.exists():  # the daemon the importer started
            pid = read_connection_file(d.connection_file).pid
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.05)


def _hostile_lines(base: dict[str, Any]) -> list[str]:
    """A line nested past the JSON parser's recursion limit, a lone surrogate escape
    (valid JSON no UTF-8 text can hold), then an ordinary line that must still arrive."""
    deep = dict(base, uuid="deep", message={"role": "user", "content": "deep"})
    nested = json.dumps(deep)[:-1] + ', "junk": ' + "[" * 100_000 + "]" * 100_000 + "}"
    lone = json.dumps(dict(base, uuid="lone", message={
        "role": "user", "content": "lone \ud800 surrogate marker"}))
    after = json.dumps(dict(base, uuid="after", message={
        "role": "user", "content": "the line after the hostile ones"}))
    return [nested, lone, after]


def test_hostile_json_lines_are_skipped_or_repaired_and_the_run_goes_on(
        daemon: DaemonProcess, client: Client, tmp_path: Path) -> None:
    source = (CC_DIR / "-home-dev-shop" / "7f1c2a9e-4b1d-4c53-9a11-2f7a0c6e9b10.jsonl")
    base = json.loads(source.read_text(encoding="utf-8").splitlines()[1])
    folder = tmp_path / "hostile"
    folder.mkdir()
    (folder / "a-hostile.jsonl").write_text("\n".join(_hostile_lines(base)) + "\n")
    # a later file of the same run must be imported too
    shutil.copy(source, folder / "b-later.jsonl")
    report = ctxd_import(daemon, "claude-code", str(folder), "--verbose")
    assert report["files"] == 2
    texts = [m["content"] for m in archive(client, "claude-code-a-hostile")]
    assert texts == ["lone \ufffd surrogate marker", "the line after the hostile ones"]
    assert archive(client, "claude-code-b-later")
    assert [d for d in report["details"] if "a-hostile.jsonl" in d] == [
        f"{folder / 'a-hostile.jsonl'}:1: corrupt JSON: nested too deeply"]


def test_one_file_name_in_two_project_folders_stays_two_sessions(
        daemon: DaemonProcess, client: Client, tmp_path: Path) -> None:
    source = (CC_DIR / "-home-dev-shop" / "7f1c2a9e-4b1d-4c53-9a11-2f7a0c6e9b10.jsonl")
    base = json.loads(source.read_text(encoding="utf-8").splitlines()[1])
    name = "0b7e7c1e-2f55-4e43-9d0c-5d1f2a3b4c5d.jsonl"
    texts = {"alpha": "the alpha project's only request", "beta": "the beta project's request"}
    for project, text in texts.items():
        folder = tmp_path / "projects" / f"-home-dev-{project}"
        folder.mkdir(parents=True)
        line = dict(base, uuid=f"{project}-1", message={"role": "user", "content": text})
        (folder / name).write_text(json.dumps(line) + "\n")
    first = ctxd_import(daemon, "claude-code", str(tmp_path / "projects"))
    assert first["sessionsCreated"] == 2 and first["messages"] == 2
    again = ctxd_import(daemon, "claude-code", str(tmp_path / "projects"))
    assert again["messages"] == 0 and again["sessionsCreated"] == 0
    found = {}
    for project, text in texts.items():
        hits = client.search(text, limit=5)["hits"]
        sids = {h["sessionId"] for h in hits if h["sessionId"].startswith("claude-code-0b7e")}
        assert len(sids) == 1, hits
        found[project] = sids.pop()
        assert [m["content"] for m in archive(client, found[project])] == [text]
    assert found["alpha"] != found["beta"]


def _user_lines(base: dict[str, Any], tag: str, n: int) -> list[str]:
    """`n` transcript lines of the user speaking, each one message with a distinct text."""
    return [json.dumps(dict(base, uuid=f"{tag}-{i}", message={
        "role": "user", "content": f"{tag} request number {i}"})) for i in range(n)]


def _base_line() -> dict[str, Any]:
    source = (CC_DIR / "-home-dev-shop" / "7f1c2a9e-4b1d-4c53-9a11-2f7a0c6e9b10.jsonl")
    base: dict[str, Any] = json.loads(source.read_text(encoding="utf-8").splitlines()[1])
    return base


def test_rotated_file_is_a_new_session_and_a_truncated_one_is_reported(
        daemon: DaemonProcess, client: Client, tmp_path: Path) -> None:
    base = _base_line()
    path = tmp_path / "rot00001-aaaa.jsonl"
    old = _user_lines(base, "old", 5)
    path.write_text("".join(ln + "\n" for ln in old), encoding="utf-8")
    first = ctxd_import(daemon, "claude-code", str(path))
    sid = "claude-code-rot00001-aaaa"
    assert first["messages"] == 5
    # rotated: a new, longer transcript at the same path (read from the old offset it
    # would lose its first lines and start mid-line)
    path.rename(tmp_path / "rot00001-aaaa.jsonl.1")
    new = _user_lines(base, "new", 12)
    path.write_text("".join(ln + "\n" for ln in new), encoding="utf-8")
    second = ctxd_import(daemon, "claude-code", str(path))
    assert second["messages"] == 12
    assert [m["content"] for m in archive(client, sid)] == [
        f"old request number {i}" for i in range(5)]
    noted = [n for n in second["notes"] if "new transcript" in n]
    assert len(noted) == 1, second["notes"]
    rotated = noted[0].rsplit("session ", 1)[1]
    assert rotated.startswith(sid + "-r") and rotated != sid
    assert [m["content"] for m in archive(client, rotated)] == [
        f"new request number {i}" for i in range(12)]
    # the new file grows: its new lines go on in its own session, once
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(ln + "\n" for ln in _user_lines(base, "more", 2)))
    third = ctxd_import(daemon, "claude-code", str(path))
    assert third["messages"] == 2 and third["sessionsCreated"] == 0
    assert len(archive(client, rotated)) == 14 and len(archive(client, sid)) == 5
    # truncated: same first line, shorter than what was imported: reported, left alone
    path.write_text("".join(ln + "\n" for ln in new[:3]), encoding="utf-8")
    fourth = ctxd_import(daemon, "claude-code", str(path))
    assert fourth["messages"] == 0 and fourth["files"] == 0
    assert any("truncated" in n and str(path) in n for n in fourth["notes"]), fourth
    assert len(archive(client, rotated)) == 14 and len(archive(client, sid)) == 5


def test_line_over_the_limit_is_skipped_and_reported(
        daemon: DaemonProcess, client: Client, tmp_path: Path) -> None:
    base = _base_line()
    before, after = _user_lines(base, "short", 2)
    huge = json.dumps(dict(base, uuid="huge", message={"role": "user", "content": "x" * 300_000}))
    path = tmp_path / "long0001-aaaa.jsonl"
    path.write_text(f"{before}\n{huge}\n{after}\n", encoding="utf-8")
    report = ctxd_import(daemon, "claude-code", str(path), "--max-line-bytes", "100000",
                         "--verbose")
    assert report["unmappable"] == {"line too long": 1}
    assert report["lines"] == 3 and report["messages"] == 2
    assert [m["content"] for m in archive(client, "claude-code-long0001-aaaa")] == [
        "short request number 0", "short request number 1"]
    assert [d for d in report["details"] if "too long" in d] == [
        f"{path}:2: line too long: {len(huge) + 1} bytes, over the limit of 100000; not read"]
    # under the default limit the same line is imported (cut to the archive's text limit)
    copy = tmp_path / "long0002-aaaa.jsonl"
    shutil.copy(path, copy)
    whole = ctxd_import(daemon, "claude-code", str(copy))
    assert whole["unmappable"] == {} and whole["messages"] == 3


def test_unfinished_line_is_parsed_again_only_when_the_file_grows(
        daemon: DaemonProcess, client: Client, tmp_path: Path) -> None:
    base = _base_line()
    folder = tmp_path / "tail"
    folder.mkdir()
    path = folder / "tail0001-aaaa.jsonl"
    done = _user_lines(base, "done", 3)
    last = json.dumps(dict(base, uuid="last", message={
        "role": "user", "content": "the line a writer finishes late"}))
    path.write_text("".join(ln + "\n" for ln in done) + last[:30], encoding="utf-8")
    sid = "claude-code-tail0001-aaaa"
    cmd = [sys.executable, "-m", "ctxd.clients.cli", "import", "claude-code", str(folder),
           "--follow", "--interval", "0.1", "--verbose", "--json",
           "--connection-file", str(daemon.connection_file)]
    proc = subprocess.Popen(cmd, env=daemon.env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, encoding="utf-8")

    def wait_for(n: int) -> list[dict[str, Any]]:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if _exists(client, sid) and len(archive(client, sid)) >= n:
                break
            time.sleep(0.05)
        return archive(client, sid)

    try:
        assert len(wait_for(3)) == 3
        # the file is touched but does not grow, over a couple of seconds: every touch
        # makes the watcher look at it again, and the unfinished line must not be re-read
        stamp = time.time()
        for k in range(1, 9):
            os.utime(path, (stamp + k, stamp + k))
            time.sleep(0.25)
        # it grows but is still unfinished: read once more
        with open(path, "a", encoding="utf-8") as f:
            f.write(last[30:40])
        time.sleep(0.6)
        with open(path, "a", encoding="utf-8") as f:
            f.write(last[40:] + "\n")
        msgs = wait_for(4)
        assert [m["content"] for m in msgs] == [f"done request number {i}" for i in range(3)] + [
            "the line a writer finishes late"]
        time.sleep(0.5)
        assert len(archive(client, sid)) == 4
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate(timeout=5)
    reports = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
    assert sum(r["messages"] for r in reports) == 4
    # parsed and found unfinished twice: once at first sight, once after it grew
    assert sum(r["unfinished"] for r in reports) == 2, reports
    details = [d for r in reports for d in r.get("details", []) if "not finished" in d]
    assert len(details) == 2 and all(f"{path}:4:" in d for d in details)


def test_follow_imports_a_rotated_file_into_its_own_session(
        daemon: DaemonProcess, client: Client, tmp_path: Path) -> None:
    base = _base_line()
    folder = tmp_path / "rotating"
    folder.mkdir()
    path = folder / "rot00002-aaaa.jsonl"
    sid = "claude-code-rot00002-aaaa"
    cmd = [sys.executable, "-m", "ctxd.clients.cli", "import", "claude-code", str(folder),
           "--follow", "--interval", "0.1", "--json",
           "--connection-file", str(daemon.connection_file)]
    proc = subprocess.Popen(cmd, env=daemon.env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, encoding="utf-8")

    def wait_for(session: str, n: int) -> int:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if _exists(client, session) and len(archive(client, session)) >= n:
                break
            time.sleep(0.05)
        return len(archive(client, session)) if _exists(client, session) else 0

    try:
        path.write_text("".join(ln + "\n" for ln in _user_lines(base, "first", 3)))
        assert wait_for(sid, 3) == 3
        path.rename(folder / "rot00002-aaaa.jsonl.1")
        new = _user_lines(base, "second", 8)
        path.write_text("".join(ln + "\n" for ln in new[:5]))
        # its session: the old id, "-r" and the hash of its first line
        rotated = [f"{sid}-r{hashlib.sha1(new[0].encode()).hexdigest()[:8]}"]
        assert wait_for(rotated[0], 5) == 5
        with open(path, "a", encoding="utf-8") as f:
            f.write("".join(ln + "\n" for ln in new[5:]))
        assert wait_for(rotated[0], 8) == 8
        assert [m["content"] for m in archive(client, rotated[0])] == [
            f"second request number {i}" for i in range(8)]
        assert [m["content"] for m in archive(client, sid)] == [
            f"first request number {i}" for i in range(3)]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate(timeout=5)
    notes = [n for ln in out.splitlines() if ln.startswith("{")
             for n in json.loads(ln)["notes"]]
    assert [n for n in notes if "new transcript" in n] == [
        f"{path}: a new transcript at this path (its first line differs from the one "
        f"imported into {sid}); imported into session {rotated[0]}"]
