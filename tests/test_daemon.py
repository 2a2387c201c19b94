"""The real daemon as a subprocess, real sockets, real clients on every wire."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import DaemonProcess, agent_turn, tool_turn, wait_for

from ctxd.protocol.codec import FrameReader, dumps_json, frame, loads_json
from ctxd.protocol.connection import split_endpoint
from ctxd.protocol.errors import (
    ApprovalPending,
    Conflict,
    RunActive,
    SessionNotFound,
    Unauthorized,
)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path).start()
    yield d
    d.stop()


def test_connection_file_is_private_and_complete(daemon: DaemonProcess) -> None:
    info = daemon.info()
    assert set(info) >= {"pid", "jsonrpc_tcp", "websocket", "zmq_router", "zmq_pub", "token",
                         "data_dir", "version"}
    assert info["jsonrpc_tcp"].startswith("127.0.0.1:")
    assert info["websocket"].startswith("ws://127.0.0.1:")
    assert stat.S_IMODE(daemon.connection_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(daemon.runtime_dir.stat().st_mode) == 0o700
    assert info["pid"] == daemon.proc.pid  # type: ignore[union-attr]


def test_one_daemon_per_data_dir(daemon: DaemonProcess, tmp_path: Path) -> None:
    second = DaemonProcess(tmp_path)
    second.connection_file = tmp_path / "other.json"
    out = subprocess.run(second.command(), env=second.env, capture_output=True, timeout=30)
    assert out.returncode != 0
    assert f"pid {daemon.proc.pid}" in out.stderr.decode()  # type: ignore[union-attr]
    assert not second.connection_file.exists()
    with daemon.client() as c:  # the first one is unaffected
        assert c.call("session/list", {})["sessions"] == []


def test_sigterm_removes_the_connection_file(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path).start()
    assert d.stop() == 0
    assert not d.connection_file.exists()


def _raw_tcp(info: dict[str, Any], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    host, port = split_endpoint(info["jsonrpc_tcp"])
    with socket.create_connection((host, int(port)), timeout=10) as s:
        reader = FrameReader()
        replies: list[dict[str, Any]] = []
        for msg in messages:
            s.sendall(frame(dumps_json(msg)))
            while True:
                bodies = reader.feed(s.recv(65536))
                if bodies:
                    replies += [loads_json(b) for b in bodies]
                    break
        return replies


def test_nothing_but_initialize_before_the_token(daemon: DaemonProcess) -> None:
    info = daemon.info()
    # before login one request is read: anything but initialize (or a wrong token) gets
    # one error and the connection is closed
    for first in ({"jsonrpc": "2.0", "id": 1, "method": "session/list", "params": {}},
                  {"jsonrpc": "2.0", "id": 2, "method": "initialize",
                   "params": {"token": "wrong"}}):
        r = _raw_tcp(info, [first])
        assert r[0]["error"]["code"] == -32001
    r = _raw_tcp(info, [
        {"jsonrpc": "2.0", "id": 3, "method": "initialize", "params": {"token": info["token"]}},
        {"jsonrpc": "2.0", "id": 4, "method": "session/list", "params": {}},
    ])
    assert r[0]["result"]["serverName"] == "ctxd"
    assert r[1]["result"]["sessions"] == []

    import msgpack
    import zmq

    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(info["zmq_router"])
    dealer.send(msgpack.packb({"id": 1, "method": "session/list", "params": {},
                               "token": "wrong"}))
    assert dealer.poll(10_000)
    reply = msgpack.unpackb(dealer.recv_multipart()[-1])
    assert reply["error"]["code"] == -32001
    dealer.close(0)
    ctx.term()


def test_two_wires_share_a_session_and_see_each_others_events(daemon: DaemonProcess) -> None:
    with daemon.client("jsonrpc") as rpc, daemon.client("zmq") as zc, \
            daemon.client("websocket") as ws:
        sid = rpc.call("session/create", {"title": "shared"})["sessionId"]
        rpc.subscribe(sid)
        zc.subscribe(sid)
        ws.subscribe(sid)
        rpc_events = rpc.notifications(timeout=0.5)
        zmq_events = zc.notifications(timeout=0.5)
        ws_events = ws.notifications(timeout=0.5)

        ids = zc.call("messages/append", {"sessionId": sid, "messages": [
            {"role": "user", "content": "来自 ZeroMQ 的消息"}]})["messageIds"]
        got = wait_for(rpc_events, "session/didAppend")
        assert got["sessionId"] == sid and got["messageIds"] == ids
        assert wait_for(ws_events, "session/didAppend")["messageIds"] == ids

        ids2 = rpc.call("messages/append", {"sessionId": sid, "messages": [
            {"role": "assistant", "content": "from JSON-RPC"}]})["messageIds"]
        assert wait_for(zmq_events, "session/didAppend",
                        where=lambda p: p["messageIds"] == ids2)["sessionId"] == sid

        # every client reads the same archive and context
        for c in (rpc, zc, ws):
            msgs = c.call("context/get", {"sessionId": sid})["messages"]
            assert [m["content"] for m in msgs] == ["来自 ZeroMQ 的消息", "from JSON-RPC"]


def test_approval_flow_first_answer_wins(daemon: DaemonProcess) -> None:
    with daemon.client("jsonrpc") as a, daemon.client("zmq") as b:
        sid = a.call("session/create", {})["sessionId"]
        b.subscribe(sid)
        events = b.notifications(timeout=0.5)
        run_id = a.call("run/start", {"sessionId": sid})["runId"]
        with pytest.raises(RunActive):
            b.call("run/start", {"sessionId": sid})
        call, result = tool_turn(1, path="/etc/hosts")
        a.call("messages/append", {"sessionId": sid, "runId": run_id,
                                   "messages": [{"role": "user", "content": "edit hosts"},
                                                call]})
        approval_id = a.call("approval/request", {
            "sessionId": sid, "runId": run_id, "toolCallId": "call_1",
            "toolName": "read_file", "arguments": {"path": "/etc/hosts"}})["approvalId"]
        assert wait_for(events, "approval/didRequest")["approval"]["approvalId"] == approval_id
        assert b.call("context/status", {"sessionId": sid})["pendingApprovals"] == 1
        with pytest.raises(ApprovalPending):
            b.call("context/compact", {"sessionId": sid, "force": True})
        with pytest.raises(ApprovalPending):
            b.call("messages/append", {"sessionId": sid,
                                       "messages": [{"role": "user", "content": "?"}]})
        with pytest.raises(ApprovalPending):
            a.call("messages/append", {"sessionId": sid, "messages": [result]})
        first = b.call("approval/resolve", {"approvalId": approval_id, "decision": "approved"})
        assert first["status"] == "approved"
        with pytest.raises(Conflict):
            a.call("approval/resolve", {"approvalId": approval_id, "decision": "denied"})
        resolved = wait_for(events, "approval/didResolve")
        assert resolved["approval"]["status"] == "approved"
        a.call("messages/append", {"sessionId": sid, "runId": run_id, "messages": [result]})
        assert a.call("approval/list", {"sessionId": sid, "status": "pending"}) == {
            "approvals": []}
        finished = a.call("run/finish", {"runId": run_id, "outcome": "completed"})
        assert finished["run"]["status"] == "completed"


def _fill_run(c: Any, sid: str, turns: int) -> str:
    run_id = c.call("run/start", {"sessionId": sid})["runId"]
    for i in range(turns):
        c.call("messages/append", {"sessionId": sid, "runId": run_id,
                                   "messages": agent_turn(i)})
    return run_id


def test_auto_compaction_after_completed_run_not_after_failed(daemon: DaemonProcess) -> None:
    with daemon.client("zmq") as c:
        ok = c.call("session/create", {})["sessionId"]
        bad = c.call("session/create", {})["sessionId"]
        c.subscribe(ok)
        events = c.notifications(timeout=0.5)
        run = _fill_run(c, ok, 22)
        assert c.call("context/status", {"sessionId": ok})["activeMessages"] == 88
        fin = c.call("run/finish", {"runId": run, "outcome": "completed"})
        assert fin["autoCompactionScheduled"] is True
        done = wait_for(events, "context/didCompact")
        assert done["effective"] is True and done["trigger"] == "auto"
        status = c.call("context/status", {"sessionId": ok})
        assert status["compactionCount"] == 1 and status["activeMessages"] < 40
        assert status["archiveMessages"] == 88

        run = _fill_run(c, bad, 22)
        fin = c.call("run/finish", {"runId": run, "outcome": "failed"})
        assert fin["autoCompactionScheduled"] is False
        time.sleep(0.5)
        status = c.call("context/status", {"sessionId": bad})
        assert status["compactionCount"] == 0 and status["activeMessages"] == 88


def test_a_client_that_dies_mid_run_does_not_lock_the_session(daemon: DaemonProcess) -> None:
    with daemon.client("zmq") as c:
        sid = c.call("session/create", {})["sessionId"]
    script = (
        "import sys, os\n"
        "from ctxd.clients.client import connect\n"
        f"c = connect(connection_file={str(daemon.connection_file)!r}, wire='jsonrpc')\n"
        f"print(c.call('run/start', {{'sessionId': {sid!r}}})['runId'], flush=True)\n"
        "os._exit(0)\n"  # dies without run/finish or a clean close
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=30,
                         env=daemon.env)
    run_id = out.stdout.decode().strip()
    assert run_id.startswith("run_"), out.stderr.decode()
    with daemon.client("zmq") as c:
        deadline = time.monotonic() + 10
        while c.call("context/status", {"sessionId": sid})["activeRunId"] is not None:
            assert time.monotonic() < deadline, "the dead client's run stayed open"
            time.sleep(0.05)
        assert c.call("run/start", {"sessionId": sid})["runId"] != run_id


def test_restart_keeps_runs_approvals_and_contexts(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path).start()
    with d.client("zmq") as c:
        sid = c.call("session/create", {"title": "durable"})["sessionId"]
        c.call("context/pins/add", {"sessionId": sid, "text": "Only use Python 3.11."})
        for i in range(22):
            c.call("messages/append", {"sessionId": sid, "messages": agent_turn(i)})
        c.call("context/compact", {"sessionId": sid})
        run_id = c.call("run/start", {"sessionId": sid})["runId"]
        call, _ = tool_turn(500)
        c.call("messages/append", {"sessionId": sid, "runId": run_id, "messages": [call]})
        approval_id = c.call("approval/request", {"sessionId": sid, "runId": run_id,
                                                  "toolCallId": "call_500"})["approvalId"]
        ctx = c.call("context/get", {"sessionId": sid})["messages"]
        status = c.call("context/status", {"sessionId": sid})
    d.kill()  # no clean shutdown
    d.start()
    with d.client("jsonrpc") as c:
        assert c.call("context/get", {"sessionId": sid})["messages"] == ctx
        after = c.call("context/status", {"sessionId": sid})
        for key in ("activeMessages", "estimatedTokens", "archiveMessages", "compactionCount",
                    "pendingApprovals", "activeRunId"):
            assert after[key] == status[key], key
        pending = c.call("approval/list", {"sessionId": sid, "status": "pending"})["approvals"]
        assert [a["approvalId"] for a in pending] == [approval_id]
        assert c.call("context/pins/list", {"sessionId": sid})["pins"][0]["text"] == (
            "Only use Python 3.11.")
        # a run opened before the restart by a client that is gone does not lock the session
        c.call("approval/resolve", {"approvalId": approval_id, "decision": "denied"})
        assert c.call("run/start", {"sessionId": sid})["runId"] != run_id
    d.stop()


def test_typed_errors_and_bad_params_keep_the_daemon_serving(daemon: DaemonProcess) -> None:
    with daemon.client("jsonrpc") as c:
        with pytest.raises(SessionNotFound):
            c.call("context/status", {"sessionId": "missing"})
        for method, params, code in [
            ("messages/append", {"sessionId": 5, "messages": []}, -32602),
            ("nope/nope", {}, -32601),
            ("context/status", {"sessionId": "x", "typo": 1}, -32602),
        ]:
            with pytest.raises(Exception) as exc:
                c.call(method, params)
            assert getattr(exc.value, "code", None) == code, (method, exc.value)
        sid = c.call("session/create", {})["sessionId"]
        with pytest.raises(Exception) as exc:
            c.call("messages/append", {"sessionId": sid, "messages": [{"role": "bot"}]})
        assert exc.value.code == -32014 and exc.value.data["index"] == 0  # type: ignore[attr-defined]
        assert c.call("context/status", {"sessionId": sid})["archiveMessages"] == 0
        c.call("messages/append", {"sessionId": sid, "messages": [
            {"role": "user", "content": "still serving"}]})


def test_unauthorized_typed_on_the_client(daemon: DaemonProcess, tmp_path: Path) -> None:
    info = daemon.info()
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps({**info, "token": "not-the-token"}))
    os.chmod(forged, 0o600)
    from ctxd.clients.client import connect

    with pytest.raises(Unauthorized):
        with connect(connection_file=forged, wire="zmq") as c:
            c.call("session/list", {})


def test_stdio_bridge_for_editors(daemon: DaemonProcess) -> None:
    with daemon.client("zmq") as c:
        sid = c.call("session/create", {})["sessionId"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "ctxd.clients.cli", "stdio", "--connection-file",
         str(daemon.connection_file)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        env=daemon.env)
    assert proc.stdin and proc.stdout
    reader = FrameReader()

    def send(msg: dict[str, Any]) -> None:
        proc.stdin.write(frame(dumps_json(msg)))  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]

    def recv() -> dict[str, Any]:
        while True:
            bodies = reader.feed(os.read(proc.stdout.fileno(), 65536))  # type: ignore[union-attr]
            if bodies:
                assert len(bodies) == 1
                return loads_json(bodies[0])

    try:
        # the editor does not know the token: the bridge supplies it
        send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"clientName": "editor"}})
        assert recv()["result"]["serverName"] == "ctxd"
        send({"jsonrpc": "2.0", "id": 2, "method": "session/subscribe",
              "params": {"sessionId": sid}})
        assert recv()["result"] == {}
        with daemon.client("zmq") as c:
            c.call("messages/append", {"sessionId": sid, "messages": [
                {"role": "user", "content": "编辑器也能看到"}]})
        event = recv()
        assert event["method"] == "session/didAppend" and event["params"]["sessionId"] == sid
    finally:
        proc.stdin.close()
        assert proc.wait(10) == 0
        proc.stdout.close()
