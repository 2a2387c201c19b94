"""`ctxd mcp` against clients that hold what they open: an idle-connection flood at a low
descriptor limit (no token needed), MCP sessions past the cap and the idle time, and a
stdio line longer than the limit. A real daemon and real `ctxd mcp` processes on
loopback; counts and times are small and bounded."""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import DaemonProcess
from mcp_types.version import LATEST_HANDSHAKE_VERSION

# the child's descriptor limit, soft and hard alike (so raising the soft one cannot help)
NOFILE = 256
FLOOD = 400


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("mcp-limits")).start()
    try:
        with d.client() as c:
            sid = c.create_session(title="limits")["sessionId"]
            c.append(sid, [{"role": "user", "content": "the deploy key rotates on Fridays"}])
        yield d
    finally:
        d.stop()


def mcp_http(d: DaemonProcess, tmp: Path, *extra: str, preexec_fn: Any = None
             ) -> tuple[subprocess.Popen[bytes], Path, dict[str, Any]]:
    """A `ctxd mcp --http` process, its stderr file and what it announced."""
    err = tmp / f"mcp-{time.monotonic_ns()}.err"
    with open(err, "wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ctxd.clients.cli", "mcp", "--connection-file",
             str(d.connection_file), "--http", *extra],
            env=d.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=f,
            preexec_fn=preexec_fn)
    deadline = time.monotonic() + 60
    while True:
        first = err.read_text(errors="replace").split("\n", 1)[0]
        if first.startswith("ctxd mcp: {") and first.endswith("}"):
            return proc, err, json.loads(first.removeprefix("ctxd mcp: "))
        assert proc.poll() is None, err.read_text(errors="replace")
        assert time.monotonic() < deadline, "ctxd mcp did not announce its URL"
        time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def post(url: str, token: str, body: dict[str, Any], session: str | None = None
         ) -> tuple[int, str | None]:
    """(HTTP status, the mcp-session-id header) of one JSON-RPC request."""
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}",
               "Accept": "application/json, text/event-stream"}
    if session is not None:
        headers["mcp-session-id"] = session
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            r.read()
            return int(r.status), r.headers.get("mcp-session-id")
    except urllib.error.HTTPError as exc:
        return int(exc.code), None


def initialize(url: str, token: str) -> tuple[int, str | None]:
    return post(url, token, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": LATEST_HANDSHAKE_VERSION, "capabilities": {},
        "clientInfo": {"name": "test", "version": "0"}}})


def ping(url: str, token: str, session: str) -> int:
    return post(url, token, {"jsonrpc": "2.0", "id": 2, "method": "ping"}, session)[0]


def low_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


def test_http_outlives_an_idle_connection_flood_at_a_low_descriptor_limit(
    daemon: DaemonProcess, tmp_path: Path,
) -> None:
    proc, err, info = mcp_http(daemon, tmp_path, preexec_fn=low_nofile)
    host, port = info["url"].split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    flood: list[socket.socket] = []
    try:
        # more idle connections than the process has descriptors, none with the token
        for _ in range(FLOOD):
            try:
                flood.append(socket.create_connection((host, int(port)), timeout=5))
            except OSError:
                break
        assert len(flood) == FLOOD
        time.sleep(2)  # the flood is accepted (or refused) meanwhile
        assert proc.poll() is None, err.read_text(errors="replace")[-2000:]
        # the token holder still gets in while the flood holds on
        status, session = initialize(info["url"], info["token"])
        assert status == 200 and session, status
        assert ping(info["url"], info["token"], session) == 200
        assert proc.poll() is None
    finally:
        for s in flood:
            s.close()
    try:
        # and after it
        status, session = initialize(info["url"], info["token"])
        assert status == 200 and session
        assert proc.poll() is None, err.read_text(errors="replace")[-2000:]
    finally:
        stop(proc)


def test_http_sessions_past_the_cap_or_idle_are_closed(
    daemon: DaemonProcess, tmp_path: Path,
) -> None:
    proc, err, info = mcp_http(daemon, tmp_path, "--max-sessions", "3",
                               "--session-idle-seconds", "2")
    url, token = info["url"], info["token"]
    try:
        sessions = []
        for _ in range(5):
            status, session = initialize(url, token)
            assert status == 200 and session
            sessions.append(session)
        # the two least recently used were closed for the newer ones
        assert [ping(url, token, s) for s in sessions] == [404, 404, 200, 200, 200]
        log = err.read_text(errors="replace")
        assert all(f"closed the least recently used MCP session {s}" in log
                   for s in sessions[:2]), log[-2000:]
        time.sleep(4)  # past the idle time of every one
        assert [ping(url, token, s) for s in sessions[2:]] == [404, 404, 404]
        status, session = initialize(url, token)
        assert status == 200 and session and ping(url, token, session) == 200
        assert proc.poll() is None
    finally:
        stop(proc)


def test_stdio_refuses_a_line_above_the_limit_and_serves_the_next(
    daemon: DaemonProcess,
) -> None:
    limit = 64 * 1024
    proc = subprocess.Popen(
        [sys.executable, "-m", "ctxd.clients.cli", "mcp", "--connection-file",
         str(daemon.connection_file), "--max-line-bytes", str(limit)],
        env=daemon.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL)
    assert proc.stdin is not None and proc.stdout is not None

    def send(obj: Any) -> None:
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(obj).encode() + b"\n")
        proc.stdin.flush()

    def reply() -> dict[str, Any]:
        assert proc.stdout is not None
        return json.loads(proc.stdout.readline())  # type: ignore[no-any-return]

    try:
        send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": LATEST_HANDSHAKE_VERSION, "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"}}})
        assert reply()["id"] == 1
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        # 1 MiB of one request: refused, never held whole
        send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "pin_invariant", "arguments": {"text": "x" * (1 << 20)}}})
        refused = reply()
        assert refused["id"] is None and refused["error"]["code"] == -32600, refused
        assert str(limit) in refused["error"]["message"]
        send({"jsonrpc": "2.0", "id": 3, "method": "tools/list"})
        listed = reply()
        assert listed["id"] == 3 and listed["result"]["tools"], listed
        assert proc.poll() is None
    finally:
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        proc.stdout.close()
