"""Trust between clients and the daemon, as a local adversary without the token attacks it.

Each test reproduces one attack with real daemon processes and real sockets: ZeroMQ
peers without the token (TCP), connection files and data dirs another user planted or
can write to, a server that took over a dead daemon's port, sockets and connection
files two daemons would share, a ZeroMQ client that leaves with a run open, and
`ctxd stdio` losing its daemon with requests in flight. Another user is simulated with
`os.chown` to `nobody` (the suite runs as root in CI) or with a planted file's mode.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
from helpers import DaemonProcess, tool_turn

from ctxd.clients.client import DaemonNotAuthentic, DaemonNotRunning, connect
from ctxd.protocol import auth
from ctxd.protocol.codec import FrameReader, dumps_json, frame
from ctxd.protocol.connection import split_endpoint, write_connection_file
from ctxd.protocol.errors import RunActive

TIMEOUT = 10.0


def chown(path: Path, user: str) -> None:
    """Give `path` to `user`: as root directly, otherwise through `sudo -n` (CI has it).
    Without either the test fails: it cannot plant another user's file."""
    if os.geteuid() == 0:
        os.chown(path, pwd.getpwnam(user).pw_uid, -1)
    else:
        subprocess.run(["sudo", "-n", "chown", user, str(path)], check=True, timeout=30)


def give_to_nobody(path: Path) -> None:
    chown(path, "nobody")


def take_back(path: Path) -> None:
    """So the test's temporary files can be removed afterwards."""
    chown(path, pwd.getpwuid(os.geteuid()).pw_name)


def stdio_proxy(conn_file: Path) -> list[str]:
    code = (
        "import sys\nfrom pathlib import Path\n"
        "from ctxd.clients.stdio_proxy import run_stdio_proxy\n"
        f"sys.exit(run_stdio_proxy(Path({str(conn_file)!r}), None))\n"
    )
    return [sys.executable, "-c", code]


def rpc(i: Any, method: str, params: dict[str, Any] | None = None) -> bytes:
    return frame(dumps_json({"jsonrpc": "2.0", "id": i, "method": method,
                             "params": params or {}}))


class FakeServer:
    """A TCP server that does not know the token: it records every byte it is sent and
    answers each request as a daemon would, `nonceMac` included (a wrong one)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.received = bytearray()
        self.connections = 0
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn: socket.socket) -> None:
        reader = FrameReader()
        conn.settimeout(5.0)
        try:
            while data := conn.recv(65536):
                self.received += data
                for body in reader.feed(data):
                    msg = json.loads(body)
                    result = {"serverName": "ctxd", "protocolVersion": "1.0",
                              "nonceMac": "0" * 64}
                    conn.sendall(frame(dumps_json({"jsonrpc": "2.0", "id": msg.get("id"),
                                                   "result": result})))
        except (OSError, ValueError):
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self._stop = True
        self.sock.close()


def planted_info(port: int, token: str = "the-dead-daemons-token-" + "x" * 20) -> dict[str, Any]:
    return {"pid": os.getpid(), "jsonrpc_tcp": f"127.0.0.1:{port}",
            "websocket": f"ws://127.0.0.1:{port}", "zmq_router": f"tcp://127.0.0.1:{port}",
            "zmq_pub": f"tcp://127.0.0.1:{port}", "token": token, "data_dir": "/nowhere",
            "version": "0.1.0"}


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    server = FakeServer()
    yield server
    server.close()


def run_daemon(root: Path, *extra: str, env: dict[str, str] | None = None,
               connection_file: Path | None = None,
               data_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run `ctxd serve` expecting it to refuse to start; return its exit and output."""
    d = DaemonProcess(root, *extra, env=env)
    cmd = d.command()
    if connection_file is not None:
        cmd[cmd.index("--connection-file") + 1] = str(connection_file)
    if data_dir is not None:
        cmd[cmd.index("--data-dir") + 1] = str(data_dir)
    return subprocess.run(cmd, env=d.env, capture_output=True, text=True, timeout=30)


# 7. ZeroMQ over TCP: nothing delivered to or accepted from a peer without the token


def test_zmq_tcp_peers_without_the_token_get_no_events_and_no_replies(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path, "--zmq-transport", "tcp").start()
    ctx: zmq.Context[Any] = zmq.Context()
    info = d.info()
    try:
        eavesdroppers = []
        for keys in ("none", "wrong-token"):
            sub = ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            if keys == "wrong-token":
                auth.secure_client_socket(sub, "not-the-token")
            sub.subscribe(b"")
            sub.connect(info["zmq_pub"])
            eavesdroppers.append(sub)
        # a request carrying the right token, from a socket that did not do the handshake
        raw = ctx.socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(info["zmq_router"])
        raw.send_multipart([b"", msgpack.packb({"id": 1, "method": "session/create",
                                                "params": {"title": "raw"},
                                                "token": info["token"]})])
        with d.client("zmq") as c:
            sid = c.call("session/create", {"title": "private"})["sessionId"]
            events = iter(c.notifications(timeout=TIMEOUT))
            c.subscribe(sid)
            run_id = c.call("run/start", {"sessionId": sid})["runId"]
            call, _ = tool_turn(1, path="/home/secret")
            c.call("messages/append", {"sessionId": sid, "runId": run_id, "messages": [call]})
            c.call("approval/request", {"sessionId": sid, "runId": run_id,
                                        "toolCallId": "call_1", "toolName": "read_file",
                                        "arguments": {"path": "/home/secret"}})
            # the token holder gets the events ...
            seen = [m for m, _ in (next(events) for _ in range(3))]  # start, append, approval
            assert "approval/didRequest" in seen
            time.sleep(0.5)
            # ... the others get nothing, and the raw request was never served
            delivered = sum(1 for s in eavesdroppers if s.poll(200))
            assert delivered == 0
            assert raw.poll(200) == 0
            titles = [s["title"] for s in c.call("session/list", {})["sessions"]]
            assert titles == ["private"]
    finally:
        ctx.destroy(linger=0)
        assert d.stop() == 0


def test_zmq_tcp_connections_that_never_handshake_are_closed(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path, "--zmq-transport", "tcp").start()
    socks = []
    try:
        info = d.info()
        for key in ("zmq_router", "zmq_pub"):
            host, port = split_endpoint(info[key])
            for _ in range(25):
                s = socket.create_connection((host, int(port)), timeout=TIMEOUT)
                socks.append(s)
        # the daemon drops each one at its handshake deadline (5 s)
        deadline = time.monotonic() + 15
        closed = 0
        for s in socks:
            s.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                while s.recv(4096):
                    pass
                closed += 1
            except (TimeoutError, ConnectionResetError):
                closed += isinstance(sys.exc_info()[1], ConnectionResetError)
        assert closed == len(socks)
        with d.client("zmq") as c:
            assert c.call("tools/list", {})["tools"]
    finally:
        for s in socks:
            s.close()
        assert d.stop() == 0


# 8. clients trust a connection file only if it and its directory are the user's alone


@pytest.mark.parametrize("attack", ["file-owned-by-other", "file-0666", "dir-0777",
                                    "dir-owned-by-other"])
def test_clients_refuse_a_connection_file_others_could_plant(
    tmp_path: Path, fake: FakeServer, attack: str
) -> None:
    folder = tmp_path / "shared"
    folder.mkdir(mode=0o700)
    conn_file = folder / "ctxd.json"
    write_connection_file(conn_file, planted_info(fake.port))
    if attack == "file-owned-by-other":
        give_to_nobody(conn_file)
    elif attack == "file-0666":
        os.chmod(conn_file, 0o666)
    elif attack == "dir-0777":
        os.chmod(folder, 0o777)
    else:
        give_to_nobody(folder)
    try:
        for wire in ("jsonrpc", "zmq"):
            with pytest.raises(DaemonNotRunning) as refused:
                connect(connection_file=conn_file, wire=wire)  # type: ignore[arg-type]
            assert "refusing" in str(refused.value)
        proc = subprocess.run(stdio_proxy(conn_file), input=rpc(1, "initialize"),
                              capture_output=True, timeout=30)
    finally:
        if attack.endswith("owned-by-other"):
            take_back(folder if attack.startswith("dir") else conn_file)
    assert proc.returncode == 1 and b"refusing" in proc.stderr
    assert proc.stdout == b""
    assert fake.connections == 0 and bytes(fake.received) == b""


# 9. mutual authentication: a server that took over a stale file's port learns nothing


def test_a_server_without_the_token_gets_neither_token_nor_requests(
    tmp_path: Path, fake: FakeServer
) -> None:
    conn_file = tmp_path / "run" / "ctxd.json"
    info = planted_info(fake.port)
    write_connection_file(conn_file, info)
    with pytest.raises(DaemonNotAuthentic):
        connect(connection_file=conn_file, wire="jsonrpc")
    # the editor's bridge: its initialize and its private request never leave
    editor = rpc(1, "initialize", {"clientName": "editor"}) + rpc(
        2, "messages/append", {"sessionId": "s", "messages": [
            {"role": "user", "content": "my private message"}]})
    proc = subprocess.run(stdio_proxy(conn_file), input=editor, capture_output=True,
                          timeout=30)
    assert proc.returncode == 1, proc.stderr
    assert b"not that daemon" in proc.stderr
    assert proc.stdout == b""
    got = bytes(fake.received)
    assert info["token"].encode() not in got
    assert b"my private message" not in got and b"editor" not in got
    bodies = [json.loads(b) for b in FrameReader().feed(got)]
    assert [b["method"] for b in bodies] == ["initialize", "initialize"]  # client, stdio
    assert all(set(b["params"]) == {"nonce", "proof", "clientName"} for b in bodies)


def test_a_zmq_server_without_the_token_gets_no_token(tmp_path: Path) -> None:
    ctx: zmq.Context[Any] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    path = tmp_path / "fake-router.sock"
    router.bind(f"ipc://{path}")
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"ipc://{tmp_path / 'fake-pub.sock'}")
    received: list[dict[str, Any]] = []

    def serve() -> None:
        while router.poll(3000):
            frames = router.recv_multipart()
            msg = msgpack.unpackb(frames[-1])
            received.append(msg)
            reply = {"id": msg["id"], "result": {"serverName": "ctxd", "nonceMac": "0" * 64,
                                                 "capabilities": {}}}
            router.send_multipart([*frames[:-1], msgpack.packb(reply)])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    conn_file = tmp_path / "run" / "ctxd.json"
    info = {**planted_info(1), "zmq_router": f"ipc://{path}",
            "zmq_pub": f"ipc://{tmp_path / 'fake-pub.sock'}"}
    write_connection_file(conn_file, info)
    try:
        with pytest.raises(DaemonNotAuthentic):
            connect(connection_file=conn_file, wire="zmq")
        thread.join(10)
        assert [m["method"] for m in received] == ["initialize"]
        assert "token" not in received[0] and info["token"] not in json.dumps(received)
    finally:
        ctx.destroy(linger=0)


def test_the_daemon_proves_the_token_and_old_clients_still_work(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path).start()
    try:
        info = d.info()
        token = info["token"]
        host, port = split_endpoint(info["jsonrpc_tcp"])

        def initialize(params: dict[str, Any]) -> dict[str, Any]:
            with socket.create_connection((host, int(port)), timeout=TIMEOUT) as s:
                s.sendall(rpc(1, "initialize", params))
                reader, bodies = FrameReader(), []
                while not bodies:
                    bodies = reader.feed(s.recv(65536))
                return json.loads(bodies[0])  # type: ignore[no-any-return]

        nonce = auth.new_nonce()
        ok = initialize({"nonce": nonce, "proof": auth.client_proof(token, nonce)})
        assert auth.check_daemon_proof(token, nonce, ok["result"]["nonceMac"])
        bad = initialize({"nonce": nonce, "proof": auth.client_proof("guess", nonce)})
        assert bad["error"]["code"] == -32001
        old = initialize({"token": token, "clientName": "old editor"})
        assert old["result"]["serverName"] == "ctxd" and "nonceMac" not in old["result"]
        with d.client("zmq") as c, d.client("websocket") as w:
            assert c.server_info and w.server_info  # both checked the daemon's proof
    finally:
        assert d.stop() == 0


# 10. a data dir, database or lock file of another user is refused


@pytest.mark.parametrize("planted", ["data-dir", "database", "lock-file", "data-dir-0777"])
def test_the_daemon_refuses_files_another_user_owns(tmp_path: Path, planted: str) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    target = data
    if planted == "database":
        target = data / "ctxd.db"
        target.write_bytes(b"")
        os.chmod(target, 0o666)
    elif planted == "lock-file":
        target = data / "daemon.lock"
        target.write_bytes(b"")
    if planted == "data-dir-0777":
        os.chmod(data, 0o777)
    else:
        give_to_nobody(target)
    before = stat.S_IMODE(target.stat().st_mode)
    try:
        proc = run_daemon(tmp_path)
    finally:
        if planted != "data-dir-0777":
            take_back(target)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ctxd: "), proc.stderr
    assert str(target) in lines[0] and "refusing" in lines[0]
    assert "Traceback" not in proc.stderr
    # nothing was changed, nothing announced
    assert stat.S_IMODE(target.stat().st_mode) == before
    assert not (data / "ctxd.db-wal").exists()
    assert not (tmp_path / "run" / "ctxd.json").exists()


# 11. sockets and connection files are never shared between daemons


def test_two_daemons_whose_connection_files_share_a_name_stay_apart(tmp_path: Path) -> None:
    run = tmp_path / "run"
    a = DaemonProcess(tmp_path / "a", env={"CTXD_RUNTIME_DIR": str(run)})
    b = DaemonProcess(tmp_path / "b", env={"CTXD_RUNTIME_DIR": str(run)})
    for d, folder in ((a, "x"), (b, "y")):
        d.root.mkdir()
        d.connection_file = tmp_path / folder / "conn.json"
    a.start()
    b.start()
    try:
        ia, ib = a.info(), b.info()
        assert ia["zmq_router"] != ib["zmq_router"] and ia["zmq_pub"] != ib["zmq_pub"]
        with a.client("zmq") as ca, b.client("zmq") as cb:
            ca.call("session/create", {"sessionId": "only-in-a"})
            assert [s["sessionId"] for s in cb.call("session/list", {})["sessions"]] == []
            assert [s["sessionId"] for s in ca.call("session/list", {})["sessions"]] == [
                "only-in-a"]
    finally:
        assert a.stop() == 0
        assert b.stop() == 0


def test_a_second_daemon_on_the_same_connection_file_is_refused(tmp_path: Path) -> None:
    a = DaemonProcess(tmp_path).start()
    try:
        before = a.connection_file.read_text()
        proc = run_daemon(tmp_path / "other", connection_file=a.connection_file,
                          env={"CTXD_RUNTIME_DIR": str(a.runtime_dir)})
        assert proc.returncode == 2, proc.stderr
        assert "uses the connection file" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
        assert a.connection_file.read_text() == before
        with a.client("zmq") as c:
            assert c.call("tools/list", {})["tools"]
    finally:
        assert a.stop() == 0


def test_a_live_socket_is_never_bound_over(tmp_path: Path) -> None:
    from ctxd.daemon.ownership import ipc_endpoints

    d = DaemonProcess(tmp_path)
    d.runtime_dir.mkdir(mode=0o700)
    router, _ = ipc_endpoints(d.runtime_dir, d.connection_file)
    path = router.removeprefix("ipc://")
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(path)
    other.listen(1)
    try:
        proc = run_daemon(tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert "refusing to take it over" in proc.stderr
        assert os.path.exists(path)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.connect(path)  # still the other process's socket
    finally:
        other.close()
    # a socket file left by a dead process is no obstacle
    d.start()
    assert d.stop() == 0


def test_a_shared_directory_for_the_connection_file_is_refused_not_chmod(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    proc = run_daemon(tmp_path, connection_file=shared / "ctxd.json")
    assert proc.returncode == 2, proc.stderr
    assert "writable by other users" in proc.stderr
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    assert list(shared.iterdir()) == []


# 12. a ZeroMQ client that leaves does not hold its run forever


def test_a_zmq_run_whose_client_left_is_interrupted_after_its_lease(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path, env={"CTXD_RUN_LEASE_SECONDS": "1"}).start()
    try:
        with d.client("zmq") as keeper:
            s1 = keeper.call("session/create", {})["sessionId"]
            s2 = keeper.call("session/create", {})["sessionId"]
            kept = keeper.call("run/start", {"sessionId": s1})["runId"]
            # another process opens a run over ZeroMQ and dies without run/finish
            code = (
                "import os, sys\nfrom ctxd.clients.client import connect\n"
                f"c = connect(connection_file={str(d.connection_file)!r}, wire='zmq')\n"
                f"print(c.call('run/start', {{'sessionId': {s2!r}}})['runId'], flush=True)\n"
                "os.kill(os.getpid(), 9)\n"
            )
            leaver = subprocess.run([sys.executable, "-c", code], capture_output=True,
                                    text=True, timeout=30)
            left = leaver.stdout.strip()
            assert left.startswith("run"), leaver.stderr
            with pytest.raises(RunActive):
                keeper.call("run/start", {"sessionId": s2})
            deadline = time.monotonic() + TIMEOUT
            while True:
                try:
                    new = keeper.call("run/start", {"sessionId": s2})["runId"]
                    break
                except RunActive:
                    assert time.monotonic() < deadline, "the run of the gone client stays open"
                    time.sleep(0.2)
            assert new != left
            # the keeper sent nothing for three leases, but its heartbeats kept its run
            time.sleep(3)
            assert keeper.call("context/status", {"sessionId": s1})["activeRunId"] == kept
            assert keeper.call("run/finish", {"runId": kept, "outcome": "completed"})
    finally:
        assert d.stop() == 0


def test_runs_left_open_by_a_crash_are_released_unless_their_client_comes_back(
    tmp_path: Path,
) -> None:
    d = DaemonProcess(tmp_path, env={"CTXD_RUN_LEASE_SECONDS": "1"}).start()
    with d.client("jsonrpc") as c:
        back, gone = (c.call("session/create", {})["sessionId"] for _ in range(2))
        run_back = c.call("run/start", {"sessionId": back})["runId"]
        run_gone = c.call("run/start", {"sessionId": gone})["runId"]
        d.kill()  # the daemon dies with both runs open
    d.start()
    try:
        with d.client("jsonrpc") as c:
            # one client comes back for its run at once; the other never does
            c.call("messages/append", {"sessionId": back, "runId": run_back,
                                       "messages": [{"role": "user", "content": "still here"}]})
            deadline = time.monotonic() + TIMEOUT
            while c.call("context/status", {"sessionId": gone})["activeRunId"] is not None:
                assert time.monotonic() < deadline, "the dead client's run stays open"
                time.sleep(0.1)
            assert c.call("run/start", {"sessionId": gone})["runId"] != run_gone
            time.sleep(1.5)
            assert c.call("context/status", {"sessionId": back})["activeRunId"] == run_back
            assert c.call("run/finish", {"runId": run_back, "outcome": "completed"})
    finally:
        assert d.stop() == 0


# 20. ctxd stdio answers the requests in flight when the daemon dies


def test_stdio_answers_requests_in_flight_when_the_daemon_dies(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path).start()
    assert d.proc is not None
    proc = subprocess.Popen(stdio_proxy(d.connection_file), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(rpc(1, "initialize", {"clientName": "editor"}))
        proc.stdin.flush()
        reader, got = FrameReader(), []
        while not got:
            got = reader.feed(os.read(proc.stdout.fileno(), 65536))
        assert json.loads(got[0])["id"] == 1
        d.proc.send_signal(signal.SIGSTOP)  # the daemon hangs, then dies
        for i in (2, 3, "x"):
            proc.stdin.write(rpc(i, "session/list"))
        proc.stdin.flush()
        time.sleep(0.3)
        d.proc.kill()
        d.proc.wait(10)
        assert proc.wait(timeout=20) == 1
        replies = [json.loads(b) for b in reader.feed(proc.stdout.read())]
        assert sorted(str(r["id"]) for r in replies) == ["2", "3", "x"]
        assert all(r["error"]["code"] == -32603 for r in replies)
        assert b"ctxd stdio: " in (proc.stderr.read() or b"")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        shutil.rmtree(tmp_path / "run", ignore_errors=True)
