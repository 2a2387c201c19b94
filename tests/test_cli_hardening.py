"""The CLI as a new user meets it: `stop`, `explain`, `--json` anywhere, errors in the
CLI's own words, the whole summary in `show`, quiet when piped into `head`, text from
agents made harmless for the terminal, help for everything. The CLI runs as a
subprocess against a real daemon process."""

from __future__ import annotations

import argparse
import fnmatch
import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import DaemonProcess, agent_turn

from ctxd.clients.cli import build_parser

TIMEOUT = 60
EVIL_ID = "evil\x1b[2J\x1b]0;pwned\x07id"
EVIL_TITLE = "invoice \u202egpj.exe\u202c \x9b31m red"


def cli(d: DaemonProcess, *args: str, flags: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "ctxd.clients.cli", *args]
    if flags:
        cmd += ["--connection-file", str(d.connection_file)]
    return subprocess.run(cmd, env=d.env, capture_output=True, text=True, timeout=TIMEOUT,
                          encoding="utf-8")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("cli-hardening")).start()
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def compacted(daemon: DaemonProcess) -> str:
    """A session with a summary: 30 agent turns, compacted."""
    with daemon.client() as c:
        sid = c.call("session/create", {"title": "compacted"})["sessionId"]
        for i in range(30):
            c.call("messages/append", {"sessionId": sid, "messages": agent_turn(i)})
        c.call("context/pins/add", {"sessionId": sid, "text": "Never touch prod."})
        c.call("context/compact", {"sessionId": sid, "force": True})
    return str(sid)


def test_json_before_or_after_the_command(daemon: DaemonProcess, compacted: str) -> None:
    before = cli(daemon, "--json", "sessions")
    after = cli(daemon, "sessions", "--json")
    assert before.returncode == after.returncode == 0, before.stderr + after.stderr
    assert json.loads(before.stdout) == json.loads(after.stdout)
    assert any(s["sessionId"] == compacted for s in json.loads(before.stdout)["sessions"])
    shown = cli(daemon, "--json", "show", compacted)
    assert json.loads(shown.stdout)["session"]["sessionId"] == compacted


def test_errors_name_cli_commands_not_protocol_methods(daemon: DaemonProcess,
                                                       compacted: str) -> None:
    missing = cli(daemon, "show", "no-such-session")
    assert missing.returncode == 2
    assert "`ctxd sessions`" in missing.stderr, missing.stderr
    unpinned = cli(daemon, "pins", "rm", compacted, "pin_nope")
    assert unpinned.returncode == 2
    assert f"`ctxd pins list {compacted}`" in unpinned.stderr, unpinned.stderr
    for r in (missing, unpinned):
        assert "session/" not in r.stderr and "context/" not in r.stderr, r.stderr


def test_show_prints_the_whole_summary(daemon: DaemonProcess, compacted: str) -> None:
    with daemon.client() as c:
        summary = c.call("context/get", {"sessionId": compacted})["messages"][0]["content"]
    r = cli(daemon, "show", compacted)
    assert r.returncode == 0, r.stderr
    lines = [line.strip() for line in summary.splitlines() if line.strip()]
    assert len(lines) > 20
    for line in lines:
        assert line in r.stdout, line


def test_explain_lists_each_summary_item_with_its_sources(daemon: DaemonProcess,
                                                          compacted: str) -> None:
    with daemon.client() as c:
        expected = c.call("context/explain", {"sessionId": compacted})
    as_json = cli(daemon, "explain", compacted, "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == expected
    text = cli(daemon, "explain", compacted)
    assert text.returncode == 0, text.stderr
    assert f"{len(expected['items'])} summary items, 0 broken pointers" in text.stdout
    assert "Never touch prod." in text.stdout
    for item in expected["items"][:5]:
        assert item["text"].split()[0] in text.stdout
        for src in item["sources"]:
            assert f"#{src['ordinal']}  msg {src['id']}  {src['role']}" in text.stdout
    assert cli(daemon, "explain", "no-such-session").returncode == 2


def test_compact_without_force_says_the_context_is_under_its_limit(
        daemon: DaemonProcess) -> None:
    with daemon.client() as c:
        sid = c.call("session/create", {})["sessionId"]
        c.call("messages/append", {"sessionId": sid, "messages": agent_turn(0)})
    r = cli(daemon, "compact", sid)
    assert r.returncode == 0, r.stderr
    assert "under its limit (4 of 80 messages" in r.stdout, r.stdout
    assert "--force" in r.stdout
    assert "splitting" not in r.stdout


def test_text_from_agents_is_neutralized(daemon: DaemonProcess) -> None:
    with daemon.client() as c:
        c.call("session/create", {"sessionId": EVIL_ID, "title": EVIL_TITLE})
        c.call("messages/append", {"sessionId": EVIL_ID, "messages": [
            {"role": "user", "content": "zebra \x1b[31mred\x1b[0m \u2066hidden\u2069 \x08\x08"}]})
    outputs = [
        cli(daemon, "sessions"),
        cli(daemon, "show", EVIL_ID),
        cli(daemon, "search", "zebra"),
        cli(daemon, "pins", "list", EVIL_ID),
        cli(daemon, "show", "x\x1b[2Jy"),  # an error message quoting the id
    ]
    for r in outputs:
        for stream in (r.stdout, r.stderr):
            for bad in ("\x1b", "\x07", "\x08", "\x9b", "\u202e", "\u2066"):
                assert bad not in stream, (bad, stream)
    assert "evil\\x1b[2J" in outputs[0].stdout  # visible, not obeyed
    assert "\\u202egpj.exe\\u202c" in outputs[1].stdout
    assert "\\x1b[31mred" in outputs[2].stdout
    # JSON keeps the values exact (escaped as JSON escapes them) and still harmless
    r = cli(daemon, "--json", "sessions")
    for bad in ("\x1b", "\x9b", "\u202e"):
        assert bad not in r.stdout
    ids = {s["sessionId"]: s["title"] for s in json.loads(r.stdout)["sessions"]}
    assert ids[EVIL_ID] == EVIL_TITLE


def test_no_broken_pipe_message_when_the_reader_stops(daemon: DaemonProcess) -> None:
    with daemon.client() as c:
        sid = c.call("session/create", {})["sessionId"]
        # more than a pipe holds, so the CLI is still writing when the reader leaves
        c.call("messages/append", {"sessionId": sid, "messages": [
            {"role": "user", "content": f"{i} " + "lorem ipsum " * 1000} for i in range(60)]})
    for args in (["export", sid], ["--json", "show", sid, "--limit", "60"]):
        proc = subprocess.Popen(
            [sys.executable, "-m", "ctxd.clients.cli", *args, "--connection-file",
             str(daemon.connection_file)],
            env=daemon.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline()
        proc.stdout.close()  # as `| head -1` does
        err = proc.stderr.read().decode()
        assert proc.wait(TIMEOUT) == 0, err
        assert err == "", err


def test_stop_stops_the_daemon(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path).start()
    try:
        pid = d.info()["pid"]
        r = cli(d, "stop")
        assert r.returncode == 0, r.stderr
        assert f"pid {pid}" in r.stdout
        assert d.proc is not None and d.proc.wait(TIMEOUT) == 0
        assert not d.connection_file.exists()
        again = cli(d, "stop", "--json")
        assert again.returncode == 1
        assert "no ctxd daemon" in again.stderr
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()


def _walk(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, str, Any]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                if name in helps or any(name in (sub.prog.split() or [])
                                        for _ in [0]):
                    yield f"{path} {name}", "(command)", helps.get(name) or sub.description
                yield from _walk(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction | argparse._VersionAction):
            yield path, "/".join(action.option_strings) or action.dest, action.help


def test_every_command_and_option_has_help() -> None:
    missing = [f"{where}: {what}" for where, what, text in _walk(build_parser(), "ctxd")
               if not (text or "").strip()]
    assert not missing, "no help text for:\n" + "\n".join(missing)


def test_the_readme_says_where_the_daemon_logs() -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "daemon.log" in readme
    assert "ctxd stop" in readme and "ctxd explain" in readme


def test_the_docs_name_modules_that_exist() -> None:
    """Every `.py` file and `ctxd.` module the README, bench/README.md and docs/ name
    exists: a module moved or split must take the docs' words with it."""
    root = Path(__file__).resolve().parents[1]
    files = [str(p.relative_to(root)) for p in root.rglob("*.py")
             if not {".git", "build"} & set(p.parts) and "egg-info" not in str(p)]
    docs = [root / "README.md", root / "bench" / "README.md", *sorted((root / "docs").glob("*.md"))]
    missing = []
    for doc in docs:
        text = doc.read_text()
        # a quoted example ("please check module m74.py") names no file of ours
        named = re.sub(r'"[^"]{0,400}"', "", text)
        for name in sorted(set(re.findall(r"(?<![\w.-])[\w/*]+\.py\b", named))):
            if not any(fnmatch.fnmatch(f, name) or fnmatch.fnmatch(f, "*/" + name) for f in files):
                missing.append(f"{doc.relative_to(root)}: {name}")
        modules = re.findall(r"\bctxd\.(?:daemon|protocol|clients)(?:\.\w+)*", text)
        for module in sorted(set(modules)):
            if importlib.util.find_spec(module) is None:
                missing.append(f"{doc.relative_to(root)}: {module}")
    assert not missing, "named in the docs but not in the tree:\n" + "\n".join(missing)
