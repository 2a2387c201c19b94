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

from ctxd.clients.cli.commands.output import text_width

TIMEOUT = 60
TITLES = ["short", "请把上下文压缩一下，保留最近的对话 " * 3, "a long title " * 12, ""]
# an imported transcript's id: 48 characters
LONG_ID = "claude-code-7f1c2a9e-4b1d-4c53-9a11-2f7a0c6e9b10"
LONG_ID_TITLE = "refactor the importer for long transcripts"
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
        c.call("session/create", {"sessionId": LONG_ID, "title": LONG_ID_TITLE})
        c.call("messages/append", {"sessionId": LONG_ID, "messages": [
            {"role": "user", "content": "import this"}]})
    return ids


def shown_id(line: str, sid: str) -> bool:
    """Whether the row's first cell is `sid`, whole or shortened in the middle with `…`
    (its head and tail kept)."""
    cell = line.split()[0]
    if cell == sid:
        return True
    head, mark, tail = cell.partition("…")
    return bool(mark) and len(head) >= 8 and len(tail) >= 8 and sid.startswith(head) \
        and sid.endswith(tail) and len(cell) < len(sid)


def row_of(lines: list[str], sid: str) -> str:
    found = [line for line in lines[1:] if shown_id(line, sid)]
    assert len(found) == 1, (sid, lines)
    return found[0]


def title_cells(lines: list[str]) -> int:
    """Cells the TITLE column gets: from its header to the next header, less the gap."""
    return lines[0].index("CREATED") - lines[0].index("TITLE") - 2


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
    # ACTIVE counts the generated message that carries the pins: one more than archived
    pinned = next(s["status"] for s in listed if s["sessionId"] == sessions[-1])
    assert pinned["activeMessages"] == pinned["archiveMessages"] + 1
    assert not any(line.startswith("ACTIVE:") for line in lines)
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
    # the rows, then what ACTIVE counts (a pipe leaves that line out, see above)
    assert len(lines) == 2 + len(listed)
    assert lines.pop() == ("ACTIVE: messages the model reads, the one carrying pins and "
                           "summary included")
    assert all(text_width(line) <= 100 for line in lines), lines
    rows = {s["sessionId"]: row_of(lines, s["sessionId"]) for s in listed}
    for s in listed:
        line, st = rows[s["sessionId"]], s["status"]
        assert f"  {when(s['createdAt'])}  " in line
        assert line.split()[-4:] == [str(st["archiveMessages"]), str(st["activeMessages"]),
                                     str(st["estimatedTokens"]), str(st["compactionCount"])]
    # short ids stay whole; only the 48-character one gives up its middle
    assert all(rows[sid].split()[0] == sid for sid in sessions)
    assert "…" in rows[LONG_ID].split()[0]
    cut = rows[sessions[2]]
    assert "a long title" in cut and "…" in cut and TITLES[2].strip() not in cut
    assert "请把上" in rows[sessions[1]] and "…" in rows[sessions[1]]
    assert TITLES[0] in rows[sessions[0]]
    # NO_COLOR: the same table without escape sequences
    plain = cli_tty(daemon, "sessions", "--all", columns=100, NO_COLOR="1")
    assert "\x1b" not in plain and plain.splitlines()[:-1] == lines


def test_a_long_id_gives_up_its_middle_only_as_far_as_the_title_needs(
        daemon: DaemonProcess, sessions: list[str]) -> None:
    listed = json.loads(cli(daemon, "--json", "sessions", "--all").stdout)["sessions"]
    assert LONG_ID in {s["sessionId"] for s in listed}
    widest_title = max(text_width(one_line(s["title"])) for s in listed)
    for columns in (100, 130, 200):
        out = cli_tty(daemon, "sessions", "--all", columns=columns, NO_COLOR="1")
        lines = out.splitlines()[:-1]  # the last says what ACTIVE counts
        assert len(lines) == 1 + len(listed)
        assert all(text_width(line) <= columns for line in lines), (columns, lines)
        row = row_of(lines, LONG_ID)
        id_cell = row.split()[0]
        id_cells = lines[0].index("TITLE") - 2
        if id_cell == LONG_ID:
            # room enough: nothing of the id is cut
            assert title_cells(lines) >= 24
            assert columns == 200
            continue
        assert columns < 200
        # never below 24 cells (the daemon's own ids stay whole); head and tail kept so
        # it stays recognisable
        assert text_width(id_cell) == id_cells >= 24
        assert id_cell.startswith("claude-code-") and LONG_ID.endswith(id_cell[-8:])
        assert all(row_of(lines, sid).split()[0] == sid for sid in sessions)
        if columns == 100:
            # the id is as short as it goes, and the title has the rest of the width:
            # more than the 8 cells it had when the id was whole
            assert id_cells == 24
            assert title_cells(lines) > 8
            assert LONG_ID_TITLE[:title_cells(lines) - 1] in row
        else:
            # cut just enough for the title's 24 cells, no more
            assert title_cells(lines) == 24 < widest_title
            assert 24 < id_cells < len(LONG_ID)
    # a pipe still prints the whole id
    assert LONG_ID in cli(daemon, "sessions", "--all").stdout.split()


def one_line(text: str) -> str:
    return " ".join(text.split())
