"""The CLI's tables (`sessions`, `pins list`, `status`) against a real daemon process.

In a pipe a table is for scripts: every row on one line, every cell whole (however long
the title), no escape sequences. On a terminal (a real pseudo-terminal here) it fits the
width: only the flexible column is cut, with `…`; ids and counts stay whole.
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from helpers import DaemonProcess

from ctxd.clients.cli_commands.output import text_width

TIMEOUT = 60
TITLES = ["short", "请把上下文压缩一下，保留最近的对话 " * 3, "a long title " * 12, ""]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def cli(d: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "ctxd.clients.cli", *args, "--connection-file",
           str(d.connection_file)]
    return subprocess.run(cmd, env=d.env, capture_output=True, text=True, timeout=TIMEOUT,
                          encoding="utf-8")


def cli_tty(d: DaemonProcess, *args: str, columns: int, **env: str) -> str:
    """The command's output on a pseudo-terminal `columns` wide."""
    main, child = pty.openpty()
    cmd = [sys.executable, "-m", "ctxd.clients.cli", *args, "--connection-file",
           str(d.connection_file)]
    proc = subprocess.Popen(cmd, env={**d.env, "COLUMNS": str(columns), "TERM": "xterm",
                                      **env},
                            stdin=subprocess.DEVNULL, stdout=child, stderr=child)
    os.close(child)
    data = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the child closed its side: all output is read
            break
        if not chunk:
            break
        data += chunk
    os.close(main)
    assert proc.wait(TIMEOUT) == 0, data
    return data.decode("utf-8").replace("\r\n", "\n")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("cli-tables")).start()
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def sessions(daemon: DaemonProcess) -> list[str]:
    """Sessions with short, wide-character, long and empty titles; the last has pins."""
    ids = []
    with daemon.client() as c:
        for n, title in enumerate(TITLES):
            sid = c.call("session/create", {"title": title})["sessionId"]
            c.call("messages/append", {"sessionId": sid, "messages": [
                {"role": "user", "content": f"message {i}"} for i in range(n + 1)]})
            ids.append(sid)
        for text in ("keep the API stable " * 8, "short pin"):
            c.call("context/pins/add", {"sessionId": ids[-1], "text": text})
    return ids


def when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def test_sessions_table_in_a_pipe_prints_every_field_of_every_row_whole(
        daemon: DaemonProcess, sessions: list[str]) -> None:
    listed = json.loads(cli(daemon, "--json", "sessions", "--all").stdout)["sessions"]
    r = cli(daemon, "sessions", "--all")
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["ID", "TITLE", "CREATED", "ARCHIVE", "ACTIVE", "TOKENS",
                                "COMPACTIONS"]
    assert len(lines) == 1 + len(listed)
    rows = {line.split()[0]: line for line in lines[1:]}
    assert set(rows) == {s["sessionId"] for s in listed} >= set(sessions)
    for s in listed:
        line, st = rows[s["sessionId"]], s["status"]
        title = s["title"].strip()
        assert title in line  # never cut in a pipe, however long
        assert f"  {when(s['createdAt'])}  " in line
        assert line.split()[-4:] == [str(st["archiveMessages"]), str(st["activeMessages"]),
                                     str(st["estimatedTokens"]), str(st["compactionCount"])]
    # the columns line up: each starts at the same place in every line
    start = lines[0].index("CREATED")
    assert all(text_width(line[:line.index(when(s["createdAt"]))]) == start
               for s in listed for line in [rows[s["sessionId"]]])


def test_pins_table_prints_each_pin_whole(daemon: DaemonProcess, sessions: list[str]) -> None:
    pins = json.loads(cli(daemon, "--json", "pins", "list", sessions[-1]).stdout)["pins"]
    assert len(pins) == 2
    r = cli(daemon, "pins", "list", sessions[-1])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["PIN", "CREATED", "TEXT"] and len(lines) == 3
    for pin, line in zip(pins, lines[1:], strict=True):
        assert line == f"{pin['pinId']}  {when(pin['createdAt'])}  {pin['text'].strip()}"


def test_status_lists_each_endpoint_whole(daemon: DaemonProcess, sessions: list[str]) -> None:
    info = daemon.info()
    r = cli(daemon, "status")
    assert r.returncode == 0, r.stderr
    for key in ("zmq_router", "zmq_pub", "jsonrpc_tcp", "websocket"):
        if info.get(key):
            name = key.replace("_", " ")
            assert re.search(rf"^  {name} +{re.escape(str(info[key]))}$", r.stdout, re.M), key


def test_on_a_terminal_the_table_fits_and_cuts_only_the_title(
        daemon: DaemonProcess, sessions: list[str]) -> None:
    listed = json.loads(cli(daemon, "--json", "sessions", "--all").stdout)["sessions"]
    out = cli_tty(daemon, "sessions", "--all", columns=100)
    assert "\x1b[1m" in out  # the header is bold on a terminal
    lines = [ANSI.sub("", line) for line in out.splitlines()]
    assert len(lines) == 1 + len(listed)
    assert all(text_width(line) <= 100 for line in lines), lines
    rows = {line.split()[0]: line for line in lines[1:]}
    for s in listed:
        line, st = rows[s["sessionId"]], s["status"]
        assert f"  {when(s['createdAt'])}  " in line
        assert line.split()[-4:] == [str(st["archiveMessages"]), str(st["activeMessages"]),
                                     str(st["estimatedTokens"]), str(st["compactionCount"])]
    cut = rows[sessions[2]]
    assert "a long title" in cut and "…" in cut and TITLES[2].strip() not in cut
    assert "请把上" in rows[sessions[1]] and "…" in rows[sessions[1]]
    assert TITLES[0] in rows[sessions[0]]
    # NO_COLOR: the same table without escape sequences
    plain = cli_tty(daemon, "sessions", "--all", columns=100, NO_COLOR="1")
    assert "\x1b" not in plain and plain.splitlines() == lines
