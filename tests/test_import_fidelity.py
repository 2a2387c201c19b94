"""`ctxd import` on real transcripts: files found by content whatever their names, the
transcripts' own times, titles from the first real request, one file name in two
folders.

The transcripts are the public ones under bench/data/transcripts (see SOURCES.md),
copied into temporary folders under other names; a real daemon stores them.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import DaemonProcess
from import_real import (
    CC,
    CODEX,
    archive,
    copy_at_rest,
    import_json,
    records,
    run_import,
    sessions_by_path,
    shape,
    unix,
)

from ctxd.clients.client import Client
from ctxd.protocol.errors import CtxdError, ErrorCode


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("fidelity")).start()
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> Iterator[Client]:
    with daemon.client() as c:
        yield c


# finding transcripts


def test_codex_rollouts_are_found_whatever_their_names(daemon: DaemonProcess, client: Client,
                                                       tmp_path: Path) -> None:
    odd = tmp_path / "odd"
    renamed = {
        odd / "x" / "export-one.jsonl": CODEX / "rollout-raze.jsonl",
        odd / "y" / "deep" / "2026.jsonl": CODEX / "rollout-privacy-x402.jsonl",
        # the older, unwrapped format
        odd / "old-format.jsonl": CODEX / "rollout-2025-09-10-session-viewer-taskmaster.jsonl",
    }
    for dst, src in renamed.items():
        copy_at_rest(src, dst)
    copy_at_rest(CC / "viewer-init.jsonl", odd / "claude.jsonl")
    (odd / "notes.jsonl").write_text('{"a": 1}\n{"b": 2}\n')
    report = import_json(daemon, "codex", str(odd))
    assert (report["files"], report["found"], report["lookedAt"], report["otherFormat"]) == (
        3, 3, 5, 1)
    # the same transcripts under the names Codex gives them import to the same messages
    ref = tmp_path / "ref"
    for src in renamed.values():
        copy_at_rest(src, ref / src.name)
    import_json(daemon, "codex", str(ref))
    by_path = sessions_by_path(client)
    for dst, src in renamed.items():
        mine, theirs = by_path[str(dst.resolve())], by_path[str((ref / src.name).resolve())]
        assert mine["sessionId"] != theirs["sessionId"]
        got = archive(client, mine["sessionId"])
        assert got and shape(got) == shape(archive(client, theirs["sessionId"]))
        assert mine["title"] == theirs["title"] and mine["createdAt"] == theirs["createdAt"]
    # the Claude Code importer takes only the Claude Code transcript of that folder
    report = import_json(daemon, "claude-code", str(odd))
    assert (report["files"], report["otherFormat"]) == (1, 3)
    assert str((odd / "claude.jsonl").resolve()) in sessions_by_path(client)


def test_a_folder_with_nothing_importable_says_so(daemon: DaemonProcess, tmp_path: Path) -> None:
    folder = tmp_path / "only-claude"
    copy_at_rest(CC / "reliability-hello-world-script.jsonl", folder / "a.jsonl")
    (folder / "data.jsonl").write_text('{"a": 1}\n')
    r = run_import(daemon, "codex", str(folder))
    assert r.returncode == 1
    assert (f"no Codex transcript under {folder} (2 files looked at; 1 of them are Claude "
            "Code transcripts: import them with `ctxd import claude-code`)") in r.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run_import(daemon, "claude-code", str(empty))
    assert r.returncode == 1 and f"no Claude Code transcript under {empty} (0 files" in r.stderr
    # a file named on the command line that is the other agent's is refused, and said why
    r = run_import(daemon, "codex", str(folder / "a.jsonl"))
    assert r.returncode == 2
    assert (f"{folder / 'a.jsonl'}: a Claude Code transcript, not a Codex one; import it "
            "with `ctxd import claude-code`") in r.stdout


def test_follow_reports_a_file_of_the_other_agent_once(daemon: DaemonProcess,
                                                      tmp_path: Path) -> None:
    path = copy_at_rest(CC / "reliability-hello-world-script.jsonl", tmp_path / "cc.jsonl")
    cmd = [sys.executable, "-m", "ctxd.clients.cli", "import", "codex", str(path),
           "--follow", "--interval", "0.1", "--json",
           "--connection-file", str(daemon.connection_file)]
    # started as a script's background job is: with SIGINT ignored, which it must undo
    proc = subprocess.Popen(cmd, env=daemon.env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        first = proc.stdout.readline()  # the first round's report
        # later rounds look at the file again (every 0.1 s)
        time.sleep(2.0)
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=10)
    reports = [json.loads(ln) for ln in (first + out).splitlines() if ln.startswith("{")]
    notes = [n for r in reports for n in r["notes"]]
    assert notes == [f"{path}: a Claude Code transcript, not a Codex one; import it with "
                     "`ctxd import claude-code`"]


# times


def test_messages_and_sessions_carry_the_transcripts_times(daemon: DaemonProcess,
                                                           client: Client,
                                                           tmp_path: Path) -> None:
    cc = copy_at_rest(CC / "privacy-x402.jsonl", tmp_path / "t" / "cc-times.jsonl")
    cx = copy_at_rest(CODEX / "rollout-privacy-x402.jsonl", tmp_path / "t" / "cx-times.jsonl")
    before = client.create_session(title="made now")["sessionId"]
    import_json(daemon, "claude-code", str(cc))
    import_json(daemon, "codex", str(cx))
    by_path = sessions_by_path(client)
    listed = {}
    for path in (cc, cx):
        session = by_path[str(path.resolve())]
        lines = records(path)
        msgs = archive(client, session["sessionId"])
        assert len(msgs) > 10
        # each message has the time of the transcript line it came from
        for m in msgs:
            line = lines[m["metadata"]["line"] - 1]
            assert m["createdAt"] == pytest.approx(unix(line["timestamp"]), abs=1e-3), m
        # the archive's order is still the order of the transcript (append order)
        assert [m["metadata"]["line"] for m in msgs] == sorted(m["metadata"]["line"] for m in msgs)
        assert [m["id"] for m in msgs] == sorted(m["id"] for m in msgs)
        # a rollout's header names its start, a moment before its first line was written
        times = [unix(r["timestamp"]) for r in lines if isinstance(r.get("timestamp"), str)]
        times += [unix(r["payload"]["timestamp"]) for r in lines
                  if r.get("type") == "session_meta"]
        assert min(times) <= session["createdAt"] <= msgs[0]["createdAt"]
        assert session["createdAt"] < time.time() - 86400
        listed[path] = session
        # since/until read the transcript's times: a word of its first user message is
        # found in its time span and not before it
        words = [m for m in msgs if m["role"] == "user" and isinstance(m["content"], str)
                 and re.search(r"[A-Za-z]{6,}", m["content"])]
        word = max(re.findall(r"[A-Za-z]{6,}", words[0]["content"]), key=len)
        sid = session["sessionId"]
        span = client.search(word, session_id=sid, since=msgs[0]["createdAt"] - 1,
                             until=msgs[-1]["createdAt"] + 1, limit=100)
        assert words[0]["id"] in [h["messageId"] for h in span["hits"]]
        assert all(msgs[0]["createdAt"] - 1 <= h["createdAt"] <= msgs[-1]["createdAt"] + 1
                   for h in span["hits"])
        earlier = client.search(word, session_id=sid, until=msgs[0]["createdAt"] - 1)
        assert earlier["hits"] == []
    # lastActivityAt is the transcript's last message; the list is newest first by the
    # sessions' own start, so the session made now comes before both
    page = client.list_sessions(limit=200)["sessions"]
    order = [s["sessionId"] for s in page]
    for session in listed.values():
        entry = next(s for s in page if s["sessionId"] == session["sessionId"])
        msgs = archive(client, session["sessionId"])
        assert entry["lastActivityAt"] == msgs[-1]["createdAt"]
        assert order.index(before) < order.index(session["sessionId"])
    newer, older = sorted(listed.values(), key=lambda s: -s["createdAt"])
    assert order.index(newer["sessionId"]) < order.index(older["sessionId"])


def test_repaired_messages_keep_their_times(daemon: DaemonProcess, client: Client,
                                           tmp_path: Path) -> None:
    # this session was continued from an older transcript: results of calls made there
    # cannot be linked, and are kept as text ("repaired")
    path = copy_at_rest(CC / "fundwise.jsonl", tmp_path / "repair" / "fundwise-times.jsonl")
    report = import_json(daemon, "claude-code", str(path))
    assert report["repaired"]
    lines = records(path)
    msgs = archive(client, sessions_by_path(client)[str(path.resolve())]["sessionId"])
    repaired = [m for m in msgs if m["metadata"].get("repaired")]
    assert len(repaired) == sum(report["repaired"].values())
    for m in repaired:
        assert m["createdAt"] == pytest.approx(
            unix(lines[m["metadata"]["line"] - 1]["timestamp"]), abs=1e-3)


def test_a_message_time_is_validated_and_kept_from_the_model(client: Client) -> None:
    sid = client.create_session(title="times")["sessionId"]
    client.append(sid, [{"role": "user", "content": "hello", "createdAt": 1_500_000_000}])
    for bad in ("yesterday", True, -5, time.time() + 3600):
        with pytest.raises(CtxdError) as exc:
            client.append(sid, [{"role": "user", "content": "x"},
                                {"role": "user", "content": "later", "createdAt": bad}])
        assert exc.value.code == ErrorCode.INVALID_MESSAGE
        assert exc.value.data == {"index": 1, "field": "createdAt"}
    msgs = archive(client, sid)
    assert [(m["content"], m["createdAt"]) for m in msgs] == [("hello", 1_500_000_000)]
    # the model's input has no archive time in it
    context = client.context_get(sid)
    assert context["messages"] and all("createdAt" not in m for m in context["messages"])
    with pytest.raises(CtxdError) as exc:
        client.create_session(title="future", created_at=time.time() + 3600)
    assert exc.value.code == ErrorCode.INVALID_PARAMS
    old = client.create_session(title="past", created_at=1_400_000_000)
    assert old["createdAt"] == 1_400_000_000


# titles


def _with_lines_before_first_request(src: Path, dst: Path, contents: list[str]) -> str:
    """A copy of a Claude Code transcript with user lines of `contents` before its first
    request; returns that request's first line."""
    lines = records(src)
    first = next(i for i, r in enumerate(lines) if r.get("type") == "user"
                 and isinstance(r["message"]["content"], str))
    extra = [dict(lines[first], uuid=f"boiler-{k}", message={"role": "user", "content": c})
             for k, c in enumerate(contents)]
    out = lines[:first] + extra + lines[first:]
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in out))
    return lines[first]["message"]["content"].strip().splitlines()[0]


def test_titles_come_from_the_first_real_request(daemon: DaemonProcess, client: Client,
                                                 tmp_path: Path) -> None:
    folder = tmp_path / "titles"
    request = _with_lines_before_first_request(
        CC / "reliability-hello-world-script.jsonl", folder / "boiler.jsonl", [
            "<command-name>/clear</command-name>\n<command-message>clear</command-message>\n"
            "<command-args></command-args>",
            "<local-command-stdout></local-command-stdout>",
            "Caveat: The messages below were generated by the user while running local "
            "commands. DO NOT respond to these messages or otherwise consider them in your "
            "response unless the user explicitly asks you to.",
            "This session is being continued from a previous conversation that ran out of "
            "context. The conversation is summarized below:\nAnalysis: ...",
        ])
    copy_at_rest(CC / "solsmile.jsonl", folder / "solsmile.jsonl")
    copy_at_rest(CC / "viewer-orchestrator-claude-md-ja.jsonl", folder / "orchestrator.jsonl")
    copy_at_rest(CC / "bhavana.jsonl", folder / "bhavana.jsonl")
    import_json(daemon, "claude-code", str(folder))
    by_path = sessions_by_path(client)

    def title(name: str) -> str:
        return by_path[str((folder / name).resolve())]["title"]

    assert title("boiler.jsonl") == request
    # solsmile opens with a /model command: the title is the request after it
    texts = [r["message"]["content"] if isinstance(r["message"]["content"], str) else
             "\n".join(b.get("text", "") for b in r["message"]["content"]
                       if b.get("type") == "text")
             for r in records(CC / "solsmile.jsonl")
             if r.get("type") == "user" and not r.get("isMeta")]
    first_prose = next(t for t in texts if t.strip() and not t.lstrip().startswith("<"))
    assert title("solsmile.jsonl") == first_prose.strip().splitlines()[0]
    # the orchestrator session's only request is a slash command's arguments
    command = records(CC / "viewer-orchestrator-claude-md-ja.jsonl")
    text = next(r["message"]["content"] for r in command if r.get("type") == "user")
    args = re.search(r"<command-args>(.*?)</command-args>", text, re.DOTALL).group(1).strip()
    assert title("orchestrator.jsonl") == f"/orchestrator {args}"
    ai_title = next(r["aiTitle"] for r in records(CC / "bhavana.jsonl")
                    if r.get("type") == "ai-title")
    assert by_path[str((folder / "bhavana.jsonl").resolve())]["metadata"]["aiTitle"] == ai_title
    for name in ("boiler.jsonl", "solsmile.jsonl", "orchestrator.jsonl", "bhavana.jsonl"):
        assert not title(name).startswith(("<", "Caveat", "This session is being continued"))


def test_codex_titles_skip_ide_context_and_agents_md(daemon: DaemonProcess, client: Client,
                                                     tmp_path: Path) -> None:
    folder = tmp_path / "codex-titles"
    lines = records(CODEX / "rollout-privacy-x402.jsonl")
    first = next(i for i, r in enumerate(lines) if r.get("type") == "response_item"
                 and r["payload"].get("type") == "message" and r["payload"]["role"] == "user")

    def user(text: str) -> dict[str, Any]:
        return dict(lines[first], payload={"type": "message", "role": "user",
                                           "content": [{"type": "input_text", "text": text}]})

    out = lines[:first] + [
        user("# AGENTS.md instructions for /repo\n\n<INSTRUCTIONS>\n- Never push to main.\n"
             "</INSTRUCTIONS>"),
        user("<environment_context>\n  <cwd>/repo</cwd>\n</environment_context>"),
        user("# Context from my IDE setup:\n\n## Active file: loader.py\n\n## Open tabs:\n"
             "- loader.py: src/loader.py\n\n## My request for Codex:\nRename the config "
             "loader and keep its old name as an alias\n"),
    ] + lines[first:]
    folder.mkdir()
    (folder / "ide.jsonl").write_text("".join(json.dumps(r) + "\n" for r in out))
    copy_at_rest(CODEX / "rollout-2025-09-10-session-viewer-taskmaster.jsonl",
                 folder / "taskmaster.jsonl")
    import_json(daemon, "codex", str(folder))
    by_path = sessions_by_path(client)
    assert by_path[str((folder / "ide.jsonl").resolve())]["title"] == (
        "Rename the config loader and keep its old name as an alias")
    # this older rollout sends AGENTS.md as its first user message
    taskmaster = by_path[str((folder / "taskmaster.jsonl").resolve())]
    user_texts = [
        "\n".join(p.get("text", "") for p in r.get("content") or ())
        for r in records(CODEX / "rollout-2025-09-10-session-viewer-taskmaster.jsonl")
        if r.get("type") == "message" and r.get("role") == "user"]
    assert "AGENTS.md" in user_texts[0] and "AGENTS.md" not in taskmaster["title"]
    assert any(taskmaster["title"] in t.splitlines() for t in user_texts[1:])


# one file name in two folders


def test_one_codex_file_name_in_two_folders_stays_two_sessions(
        daemon: DaemonProcess, client: Client, tmp_path: Path) -> None:
    a = copy_at_rest(CODEX / "rollout-raze.jsonl", tmp_path / "a" / "rollout-same.jsonl")
    b = copy_at_rest(CODEX / "rollout-privacy-x402.jsonl", tmp_path / "b" / "rollout-same.jsonl")
    import_json(daemon, "codex", str(tmp_path))
    again = import_json(daemon, "codex", str(tmp_path))
    assert again["messages"] == 0  # each finds its own session again
    by_path = sessions_by_path(client)
    sa, sb = by_path[str(a.resolve())], by_path[str(b.resolve())]
    assert sa["sessionId"] != sb["sessionId"]
    for path, session in ((a, sa), (b, sb)):
        # each session holds its own file's conversation: its lines, its working folder
        lines = records(path)
        msgs = archive(client, session["sessionId"])
        assert msgs[-1]["createdAt"] == pytest.approx(
            unix(lines[msgs[-1]["metadata"]["line"] - 1]["timestamp"]), abs=1e-3)
        assert max(m["metadata"]["line"] for m in msgs) <= len(lines)
        assert session["metadata"]["cwd"] == lines[0]["payload"]["cwd"]
    assert sa["metadata"]["cwd"] != sb["metadata"]["cwd"]


def settled(c: Client, sid: str) -> int:
    """The session's message count once it has not changed for a second."""
    last, since = -1, time.monotonic()
    deadline = since + 60
    while time.monotonic() < deadline:
        n = len(archive(c, sid))
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since > 1.0:
            return n
        time.sleep(0.1)
    raise AssertionError(f"{sid} kept changing")


def _extra_line(fmt: str, path: Path, text: str, iso: str) -> dict[str, Any]:
    """One more user request in the file's own format, as its agent would write it."""
    if fmt == "claude-code":
        base = next(r for r in records(path) if r.get("type") == "user")
        return dict(base, uuid="follow-extra", timestamp=iso,
                    message={"role": "user", "content": text})
    return {"timestamp": iso, "type": "response_item", "payload": {
        "type": "message", "role": "user",
        "content": [{"type": "input_text", "text": text}]}}


@pytest.mark.parametrize(("fmt", "src_a", "src_b", "name"), [
    ("claude-code", CC / "reliability-hello-world-script.jsonl",
     CC / "reliability-stop-hook-reflection.jsonl", "same.jsonl"),
    ("codex", CODEX / "rollout-privacy-x402.jsonl", CODEX / "rollout-raze.jsonl",
     "rollout-same.jsonl"),
])
def test_follow_keeps_one_file_name_in_two_folders_apart(
        daemon: DaemonProcess, client: Client, tmp_path: Path, fmt: str, src_a: Path,
        src_b: Path, name: str) -> None:
    root = tmp_path / "projects"
    a = copy_at_rest(src_a, root / "-a" / name)
    b = copy_at_rest(src_b, root / "-b" / name)
    cmd = [sys.executable, "-m", "ctxd.clients.cli", "import", fmt, str(root),
           "--follow", "--interval", "0.2", "--json",
           "--connection-file", str(daemon.connection_file)]
    proc = subprocess.Popen(cmd, env=daemon.env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)

    def wait(pred: Any) -> Any:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = pred()
            if found:
                return found
            time.sleep(0.1)
        raise AssertionError("not imported in time")

    try:
        both = wait(lambda: (lambda m: m if str(a.resolve()) in m and str(b.resolve()) in m
                             else None)(sessions_by_path(client)))
        sa, sb = both[str(a.resolve())]["sessionId"], both[str(b.resolve())]["sessionId"]
        assert sa != sb
        # the whole of each file (the counts stop moving), then one more request
        # written to folder b's file
        count_a, count_b = settled(client, sa), settled(client, sb)
        iso = "2026-04-01T07:00:00.000Z"
        with open(b, "a", encoding="utf-8") as f:
            f.write(json.dumps(_extra_line(fmt, b, "one more request, in folder b", iso)) + "\n")
        wait(lambda: any(m.get("content") == "one more request, in folder b"
                         for m in archive(client, sb)))
        got = [m for m in archive(client, sb)
               if m.get("content") == "one more request, in folder b"]
        assert len(got) == 1 and got[0]["createdAt"] == unix(iso)
        assert len(archive(client, sb)) >= count_b + 1
        time.sleep(0.5)
        assert len(archive(client, sa)) == count_a
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
