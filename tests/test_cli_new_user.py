"""What a new user following the docs ran into: each case against a real daemon process and
the real `ctxd` command (a subprocess), or the real MCP SDK client."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from helpers import DaemonProcess
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from ctxd import __version__

CLI = [sys.executable, "-m", "ctxd.clients.cli"]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("newuser")).start()
    try:
        yield d
    finally:
        d.stop()


def ctxd(d: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=d.env, capture_output=True, text=True,
                          timeout=60)


def test_search_takes_unquoted_words(daemon: DaemonProcess) -> None:
    with daemon.client() as c:
        sid = c.create_session(title="words")["sessionId"]
        c.append(sid, [{"role": "user", "content": "the zebracorn deploy failed at noon"},
                       {"role": "user", "content": "a zebracorn without the other word"}])
    got = ctxd(daemon, "search", "zebracorn", "deploy", "--json",
               "--connection-file", str(daemon.connection_file))
    assert got.returncode == 0, got.stderr
    hits = json.loads(got.stdout)["hits"]
    # both words, in any order, as one query: only the message holding both
    assert [h["sessionId"] for h in hits] == [sid]
    assert "deploy" in json.dumps(hits[0])


def test_global_options_before_the_command(daemon: DaemonProcess, tmp_path: Path) -> None:
    got = ctxd(daemon, "--connection-file", str(daemon.connection_file), "--wire", "jsonrpc",
               "--json", "status")
    assert got.returncode == 0, got.stderr
    status = json.loads(got.stdout)
    assert status["running"] is True and status["pid"] == daemon.info()["pid"]
    config = tmp_path / "c.toml"
    config.write_text("[compaction]\nkeep_messages = 7\nmax_active_messages = 30\n")
    got = ctxd(daemon, "--config", str(config), "config")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["compaction"]["keep_messages"] == 7
    # given after the command too, the later one wins
    other = tmp_path / "d.toml"
    other.write_text("[compaction]\nkeep_messages = 9\nmax_active_messages = 30\n")
    got = ctxd(daemon, "--config", str(config), "config", "--config", str(other))
    assert json.loads(got.stdout)["compaction"]["keep_messages"] == 9


def test_watch_stops_on_sigint_even_when_started_with_it_ignored(
        daemon: DaemonProcess) -> None:
    with daemon.client() as c:
        sid = c.create_session(title="watched")["sessionId"]

    def ignore_sigint() -> None:  # what a non-interactive shell does to a background job
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = subprocess.Popen(
        [*CLI, "watch", sid, "--connection-file", str(daemon.connection_file)],
        env=daemon.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=ignore_sigint)
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline().startswith(f"watching {sid}")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_the_store_is_named_by_status_and_the_connection_file(daemon: DaemonProcess) -> None:
    info = daemon.info()
    kind, _, path = info["store"].partition(" ")
    assert kind == "sqlite"
    assert Path(path).resolve() == (daemon.data_dir / "ctxd.db").resolve()
    got = ctxd(daemon, "status", "--connection-file", str(daemon.connection_file))
    assert got.returncode == 0, got.stderr
    assert "store" in got.stdout and "ctxd.db" in got.stdout
    got = ctxd(daemon, "status", "--json", "--connection-file", str(daemon.connection_file))
    assert json.loads(got.stdout)["store"] == info["store"]


def test_serve_banner_names_the_store(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path).start()
    try:
        deadline = time.monotonic() + 10
        while "store:" not in d.log_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        banner = d.log_path.read_text()
        line = next(x for x in banner.splitlines() if x.strip().startswith("store:"))
        assert line.split()[1:] == d.info()["store"].split()
    finally:
        d.stop()


def test_pinning_the_same_text_twice_keeps_one_pin(daemon: DaemonProcess) -> None:
    with daemon.client() as c:
        sid = c.create_session(title="pins")["sessionId"]
        first = c.add_pin(sid, "Never run migrations on Mondays")["pin"]
        again = c.add_pin(sid, "  Never run migrations on Mondays ")["pin"]
        other = c.add_pin(sid, "Never run migrations on Fridays")["pin"]
        assert again["pinId"] == first["pinId"]
        assert other["pinId"] != first["pinId"]
        assert [p["text"] for p in c.call("context/pins/list", {"sessionId": sid})["pins"]] \
            == ["Never run migrations on Mondays", "Never run migrations on Fridays"]


def test_mcp_server_info_names_its_version(daemon: DaemonProcess, tmp_path: Path) -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=[*CLI[1:], "mcp", "--connection-file", str(daemon.connection_file)],
        env=dict(daemon.env), cwd=str(tmp_path))

    async def main() -> str:
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            with anyio.fail_after(30):
                result = await s.initialize()
            return result.server_info.version

    assert anyio.run(main) == __version__


def test_a_newline_in_a_session_id_is_shown_not_obeyed(daemon: DaemonProcess) -> None:
    with daemon.client() as c:
        sid = c.create_session("two\nlines\tid", title="t")["sessionId"]
        c.append(sid, [{"role": "user", "content": "quillwort marker"}])
    listed = ctxd(daemon, "sessions", "--connection-file", str(daemon.connection_file))
    assert listed.returncode == 0, listed.stderr
    row = [line for line in listed.stdout.splitlines() if "two" in line]
    assert len(row) == 1 and row[0].startswith("two\\nlines\\tid ")
    found = ctxd(daemon, "search", "quillwort", "--connection-file",
                 str(daemon.connection_file))
    assert found.returncode == 0, found.stderr
    head = found.stdout.splitlines()[0]
    assert "two\\nlines\\tid" in head and "lines" not in found.stdout.splitlines()[1]
