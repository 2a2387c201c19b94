"""Denial of service without the token, against a real daemon process on loopback:
descriptor floods, batches and big frames before login, squatters that never log in or
read, HTTP requests on the JSON-RPC port, and the limits on batches and replies.

Counts are small and bounded: the descriptor flood runs the daemon with a low
RLIMIT_NOFILE (set in the child before exec) so that a few hundred sockets exhaust it.
"""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import zmq
from helpers import DaemonProcess
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect as ws_connect

from ctxd.protocol.codec import FrameReader, frame
from ctxd.protocol.connection import split_endpoint

TIMEOUT = 10.0
UNAUTHORIZED = -32001
INVALID_REQUEST = -32600
PARSE_ERROR = -32700
PAYLOAD_TOO_LARGE = -32015


def start(root: Path, *extra: str, preexec_fn: Any = None, **config: Any) -> DaemonProcess:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "ctxd.toml"
    path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in config.items()))
    return DaemonProcess(root, "--config", str(path), *extra, preexec_fn=preexec_fn).start()


class Tcp:
    def __init__(self, info: dict[str, Any], rcvbuf: int | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(TIMEOUT)
        self.sock.connect(split_endpoint(info["jsonrpc_tcp"]))
        self.reader = FrameReader(max_frame=1 << 30)
        self.pending: list[bytes] = []
        self.n = 0

    def send(self, msg: Any) -> None:
        self.sock.sendall(frame(json.dumps(msg).encode()))

    def recv(self) -> Any:
        while not self.pending:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("closed by the daemon")
            self.pending += self.reader.feed(data)
        return json.loads(self.pending.pop(0))

    def call(self, method: str, params: Any) -> dict[str, Any]:
        self.n += 1
        self.send({"jsonrpc": "2.0", "id": self.n, "method": method, "params": params})
        reply = self.recv()
        assert reply.get("id") == self.n, reply
        return reply

    def login(self, token: str) -> None:
        assert self.call("initialize", {"token": token})["result"]["serverName"] == "ctxd"

    def replies_until_closed(self, timeout: float = TIMEOUT) -> tuple[list[Any], bool]:
        """Every reply until the daemon closes the connection, and whether it did."""
        self.sock.settimeout(timeout)
        out = [json.loads(b) for b in self.pending]
        try:
            while data := self.sock.recv(1 << 20):
                out += [json.loads(b) for b in self.reader.feed(data)]
        except ConnectionResetError:
            return out, True
        except TimeoutError:
            return out, False
        return out, True

    def close(self) -> None:
        self.sock.close()


def error_code(reply: dict[str, Any]) -> int | None:
    return reply.get("error", {}).get("code")


def alive(daemon: DaemonProcess) -> None:
    assert daemon.proc is not None and daemon.proc.poll() is None, daemon.log_path.read_text()
    with daemon.client("zmq", timeout=TIMEOUT) as c:
        assert c.call("tools/list", {})["tools"]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = start(tmp_path_factory.mktemp("attacks"), max_request_bytes=1 << 20,
              max_message_bytes=64 * 1024)
    try:
        yield d
        alive(d)
    finally:
        assert d.stop() == 0


# before login: one request, `initialize`, and nothing else


def test_a_batch_before_login_gets_one_error_and_the_connection_closes(
    daemon: DaemonProcess,
) -> None:
    info = daemon.info()
    # 600 unknown-method requests: once answered one by one, now refused whole
    batch = [{"jsonrpc": "2.0", "id": i, "method": f"x/{i}", "params": {}} for i in range(600)]
    conn = Tcp(info)
    conn.send(batch)
    replies, closed = conn.replies_until_closed()
    conn.close()
    assert closed
    assert [(r["id"], error_code(r)) for r in replies] == [(None, INVALID_REQUEST)], replies[:3]
    with ws_connect(info["websocket"], open_timeout=TIMEOUT) as ws:
        ws.send(json.dumps(batch))
        assert error_code(json.loads(ws.recv(TIMEOUT))) == INVALID_REQUEST
        with pytest.raises(ConnectionClosed):
            ws.recv(TIMEOUT)
    alive(daemon)


@pytest.mark.parametrize("first", [
    {"jsonrpc": "2.0", "id": 1, "method": "session/list", "params": {}},
    {"jsonrpc": "2.0", "method": "initialize", "params": {"token": "x"}},  # a notification
    {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"token": "wrong"}},
], ids=["other-method", "initialize-notification", "wrong-token"])
def test_only_one_message_is_read_before_login(daemon: DaemonProcess, first: Any) -> None:
    info = daemon.info()
    conn = Tcp(info)
    # pipelined after the first: the right token comes too late, it is never read
    conn.sock.sendall(frame(json.dumps(first).encode()) + frame(json.dumps(
        {"jsonrpc": "2.0", "id": 2, "method": "initialize",
         "params": {"token": info["token"]}}).encode()))
    replies, closed = conn.replies_until_closed()
    conn.close()
    assert closed
    assert [error_code(r) for r in replies] == [UNAUTHORIZED], replies
    # the list of methods is for clients only
    assert "session/list" not in json.dumps(replies) or first["method"] == "session/list"


def test_a_websocket_refused_before_login_is_closed_cleanly_while_the_client_sends(
    daemon: DaemonProcess,
) -> None:
    # after the refusal the daemon reads and drops what the client pipelined behind it:
    # once, it stopped reading, never saw the client's close frame behind that input, and
    # the close ended in a reset after its timeout that could take the error reply with it
    info = daemon.info()
    pipelined = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "x", "params": {"p": "y" * 2000}})
    for _ in range(3):
        with ws_connect(info["websocket"], open_timeout=TIMEOUT, max_size=None) as ws:
            ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "session/list"}))
            try:
                for _ in range(300):
                    ws.send(pipelined)
            except ConnectionClosed:
                pass  # the daemon closed while these were still going out
            replies: list[Any] = []
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    replies.append(json.loads(ws.recv(TIMEOUT)))
            assert [error_code(r) for r in replies] == [UNAUTHORIZED], replies
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000
    alive(daemon)


def test_a_big_frame_before_login_is_refused_from_its_header(daemon: DaemonProcess) -> None:
    info = daemon.info()
    conn = Tcp(info)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                       "params": {"token": "x" * 500_000}}).encode()
    conn.sock.sendall(b"Content-Length: %d\r\n\r\n" % len(body))  # the body never follows
    replies, closed = conn.replies_until_closed()
    conn.close()
    assert closed and [error_code(r) for r in replies] == [PAYLOAD_TOO_LARGE], replies
    # the same frame after login is within max_request_bytes (1 MiB): read whole
    conn = Tcp(info)
    conn.login(info["token"])
    conn.sock.sendall(frame(body.replace(b'"id": 1', b'"id": 2')))
    reply = conn.recv()
    assert reply["id"] == 2 and error_code(reply) != PAYLOAD_TOO_LARGE, reply
    conn.close()
    with ws_connect(info["websocket"], open_timeout=TIMEOUT, max_size=None) as ws:
        with pytest.raises(ConnectionClosed) as closed_ws:
            ws.send(body.decode())
            ws.recv(TIMEOUT)
        assert closed_ws.value.rcvd is not None and closed_ws.value.rcvd.code == 1009


def test_a_big_frame_sent_whole_before_login_gets_its_error_not_a_reset(
    daemon: DaemonProcess,
) -> None:
    # refused from its header while the body is still coming: the daemon reads and drops
    # the rest before it closes, or the kernel resets the connection and the reset can
    # destroy the error before the client reads it
    info = daemon.info()
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                       "params": {"token": "x" * 4_000_000}}).encode()
    for _ in range(3):
        conn = Tcp(info)
        conn.sock.sendall(frame(body))  # a reset would fail this send or the reads below
        replies: list[Any] = []
        while data := conn.sock.recv(1 << 20):
            replies += [json.loads(b) for b in conn.reader.feed(data)]
        conn.close()
        assert [error_code(r) for r in replies] == [PAYLOAD_TOO_LARGE], replies
    alive(daemon)


def test_a_pipelined_request_after_initialize_is_served(daemon: DaemonProcess) -> None:
    info = daemon.info()
    conn = Tcp(info)
    conn.sock.sendall(b"".join(frame(json.dumps(m).encode()) for m in [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"token": info["token"]}},
        {"jsonrpc": "2.0", "id": 2, "method": "session/list", "params": {}},
    ]))
    assert conn.recv()["result"]["serverName"] == "ctxd"
    assert "sessions" in conn.recv()["result"]
    conn.close()


# after login: bounded batches and replies


def test_batches_and_replies_are_bounded(daemon: DaemonProcess) -> None:
    info = daemon.info()
    conn = Tcp(info)
    conn.login(info["token"])
    too_many = [{"jsonrpc": "2.0", "id": i, "method": "tools/list"} for i in range(257)]
    conn.send(too_many)
    reply = conn.recv()
    assert error_code(reply) == INVALID_REQUEST and reply["error"]["data"]["limit"] == 256
    # a large one is counted before it is decoded, with the same answer
    conn.send([{"jsonrpc": "2.0", "id": i, "method": "tools/list"} for i in range(15_000)])
    reply = conn.recv()
    assert error_code(reply) == INVALID_REQUEST and reply["error"]["data"]["limit"] == 256
    # 20 reads of 16 x 60 KB messages: about 19 MB of reply, far above the 1 MiB limit
    sid = conn.call("session/create", {})["result"]["sessionId"]
    big = {"role": "user", "content": "z" * 60_000}
    assert "result" in conn.call("messages/append", {"sessionId": sid, "messages": [big] * 16})
    conn.send([{"jsonrpc": "2.0", "id": i, "method": "archive/read",
                "params": {"sessionId": sid, "limit": 16}} for i in range(20)])
    replies = conn.recv()
    assert isinstance(replies, list) and len(replies) == 20
    size = len(json.dumps(replies, separators=(",", ":")).encode())
    assert size <= (1 << 20) + 4096, size
    codes = [error_code(r) for r in replies]
    assert codes[0] is None and codes[-1] == PAYLOAD_TOO_LARGE, codes
    over = next(r for r in replies if error_code(r) == PAYLOAD_TOO_LARGE)
    assert over["error"]["data"]["limit"] == 1 << 20
    conn.close()


# HTTP on the JSON-RPC port, and the WebSocket handshake


def test_header_limit_holds_when_the_header_comes_in_one_read(daemon: DaemonProcess) -> None:
    conn = Tcp(daemon.info())
    conn.login(daemon.info()["token"])
    header = b"Content-Length: 2\r\nX-Pad: " + b"a" * 9000 + b"\r\n\r\n{}"
    conn.sock.sendall(header)  # one segment: the whole header, then its end
    replies, closed = conn.replies_until_closed()
    conn.close()
    assert closed and [error_code(r) for r in replies] == [PARSE_ERROR], replies


def test_two_origin_headers_are_a_bad_request(daemon: DaemonProcess) -> None:
    _, port = split_endpoint(daemon.info()["websocket"])
    request = (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
               b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
               b"Sec-WebSocket-Version: 13\r\nOrigin: http://127.0.0.1:%d\r\n"
               b"Origin: http://evil.example\r\n\r\n" % port)
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as s:
        s.sendall(request)
        head = s.recv(4096)
    assert head.startswith(b"HTTP/1.1 400"), head[:80]


# squatters and descriptor floods


def test_squatters_that_never_read_are_dropped_at_the_login_deadline(tmp_path: Path) -> None:
    # once, 256 connections that sent requests without the token and never read their
    # replies outlived the deadline (a close waited for their output) and held every slot
    d = start(tmp_path, max_connections=4, max_unauthenticated_connections=4,
              auth_timeout_seconds=1.0)
    info = d.info()
    try:
        client = Tcp(info)
        client.login(info["token"])
        squatters = []
        for _ in range(4):
            s = Tcp(info, rcvbuf=2048)
            # pre-login requests that produce output, none of it read
            s.sock.sendall(b"".join(frame(json.dumps(
                {"jsonrpc": "2.0", "id": i, "method": "session/list"}).encode())
                for i in range(200)))
            squatters.append(s)
        # the client that logged in before is served while squatters fill their quota
        assert "sessions" in client.call("session/list", {})["result"]
        # a new client waits in the backlog at most until the deadline frees a place
        late = Tcp(info)
        late.login(info["token"])
        assert "sessions" in late.call("session/list", {})["result"]
        for s in squatters:
            _, closed = s.replies_until_closed(timeout=5.0)
            assert closed, "a squatter outlived the login deadline"
            s.close()
        late.close()
        client.close()
    finally:
        assert d.stop() == 0


def _low_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


def test_a_descriptor_flood_does_not_take_the_daemon_down(tmp_path: Path) -> None:
    # once, ~1,300 half-finished WebSocket handshakes at a 1024 limit used every
    # descriptor and the next ZeroMQ connect aborted the process inside libzmq
    d = start(tmp_path, preexec_fn=_low_nofile)
    info = d.info()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    flood: list[socket.socket] = []
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        ws_port = split_endpoint(info["websocket"])[1]
        tcp_addr = split_endpoint(info["jsonrpc_tcp"])
        for i in range(600):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", ws_port) if i % 2 else tcp_addr)
            flood.append(s)
        time.sleep(0.5)
        for s in flood[1::2]:
            try:
                s.send(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finished
            except OSError:
                pass
        # ZeroMQ still connects and serves while the flood holds its sockets
        for _ in range(3):
            with d.client("zmq", timeout=TIMEOUT) as c:
                assert c.call("tools/list", {})["tools"]
        dealers = []
        for _ in range(20):  # each a new ZeroMQ connection to the daemon
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(info["zmq_router"])
            dealers.append(sock)
        time.sleep(0.5)
        assert d.proc is not None and d.proc.poll() is None, d.log_path.read_text()[-2000:]
        for sock in dealers:
            sock.close(0)
        for s in flood:
            s.close()
        flood.clear()
        # the wires accept again once the flood is gone
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                conn = Tcp(info)
                conn.login(info["token"])
                conn.close()
                break
            except (ConnectionError, OSError):
                assert time.monotonic() < deadline, "the JSON-RPC wire never recovered"
                time.sleep(0.2)
        with ExitStack() as stack:
            ws = stack.enter_context(ws_connect(info["websocket"], open_timeout=TIMEOUT))
            ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                "params": {"token": info["token"]}}))
            assert json.loads(ws.recv(TIMEOUT))["result"]["serverName"] == "ctxd"
        alive(d)
        assert d.connection_file.exists()
    finally:
        for s in flood:
            s.close()
        ctx.destroy(linger=0)
        if d.proc is not None and d.proc.poll() is None:
            assert d.stop() == 0


def test_too_many_handshakes_wait_instead_of_failing(tmp_path: Path) -> None:
    # the quota before login is small and separate: a full quota delays a new client
    # until the deadline frees a place, it does not refuse it
    d = start(tmp_path, max_unauthenticated_connections=2, auth_timeout_seconds=1.0)
    info = d.info()
    try:
        idle = [socket.create_connection(split_endpoint(info["websocket"]), timeout=TIMEOUT)
                for _ in range(2)]
        t0 = time.monotonic()
        try:
            with ws_connect(info["websocket"], open_timeout=TIMEOUT) as ws:
                ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                    "params": {"token": info["token"]}}))
                assert json.loads(ws.recv(TIMEOUT))["result"]["serverName"] == "ctxd"
        except InvalidStatus as exc:  # pragma: no cover - a refusal is the failure
            raise AssertionError(f"refused: {exc}") from exc
        assert time.monotonic() - t0 < TIMEOUT
        for s in idle:
            s.close()
    finally:
        assert d.stop() == 0


# large messages


def _words(n_chars: int, seed: int) -> str:
    import random

    rng = random.Random(seed)
    vocab = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9)))
             for _ in range(4000)]
    text = " ".join(rng.choices(vocab, k=n_chars // 5 + 1))
    return text[:n_chars]


def test_a_large_append_does_not_stop_other_clients(tmp_path: Path) -> None:
    # once, one request with eight 7.5 MB messages held the event loop for 18 s: every
    # other client waited. Now its batch is checked and counted beside the loop.
    d = start(tmp_path)
    info = d.info()
    try:
        big, other = Tcp(info), Tcp(info)
        big.login(info["token"])
        other.login(info["token"])
        sid = big.call("session/create", {})["result"]["sessionId"]
        text = _words(6_000_000, 1)
        messages = [{"role": "user", "content": text[i:] + text[:i]} for i in range(4)]
        big.send({"jsonrpc": "2.0", "id": "big", "method": "messages/append",
                  "params": {"sessionId": sid, "messages": messages}})
        # pipelined on the same connection: must still be archived after the big batch
        big.send({"jsonrpc": "2.0", "id": "small", "method": "messages/append",
                  "params": {"sessionId": sid, "messages": [{"role": "user", "content": "after"}]}})
        time.sleep(0.3)  # the big frame has arrived; the daemon is working on it
        other.send({"jsonrpc": "2.0", "id": "quick", "method": "tools/list", "params": {}})
        # the other client is answered while the big batch is still being worked on
        other.sock.settimeout(60)
        assert other.recv()["id"] == "quick"
        big.sock.setblocking(False)
        try:
            early = big.sock.recv(1 << 16)
        except BlockingIOError:
            early = b""
        assert early == b"", "the big append finished before the other client was served"
        big.sock.setblocking(True)
        big.sock.settimeout(120)
        first, second = big.recv(), big.recv()
        assert (first["id"], second["id"]) == ("big", "small"), (first, second)
        assert max(first["result"]["messageIds"]) < min(second["result"]["messageIds"])
        read = other.call("archive/read", {"sessionId": sid,
                                           "afterId": max(first["result"]["messageIds"])})
        assert [m["content"] for m in read["result"]["messages"]] == ["after"]
        big.close()
        other.close()
    finally:
        assert d.stop() == 0


def test_a_full_quota_gives_its_places_to_new_connections(tmp_path: Path) -> None:
    # with a 30 s login deadline, silent squatters would hold both places for 30 s; while
    # the quota is full, the ones in it for a second are dropped instead
    d = start(tmp_path, max_unauthenticated_connections=2, auth_timeout_seconds=30.0)
    info = d.info()
    try:
        idle = [socket.create_connection(split_endpoint(info["jsonrpc_tcp"]), timeout=TIMEOUT)
                for _ in range(2)]
        time.sleep(0.2)
        late = Tcp(info)
        late.login(info["token"])  # within TIMEOUT, far below the 30 s deadline
        for s in idle:
            s.settimeout(TIMEOUT)
            try:
                assert s.recv(1) == b""
            except ConnectionResetError:
                pass
            s.close()
        late.close()
    finally:
        assert d.stop() == 0


def test_squatters_on_tcp_do_not_reach_ctxd_stdio(tmp_path: Path) -> None:
    # another local user can hold every place the TCP wire keeps for clients that have not
    # logged in yet; `ctxd stdio` comes in through the daemon's Unix socket, which only
    # its own user can open, so it logs in at once however many wait on TCP
    d = start(tmp_path, max_unauthenticated_connections=2, auth_timeout_seconds=30.0)
    info = d.info()
    assert Path(info["jsonrpc_unix"]).stat().st_mode & 0o777 == 0o600
    squatters: list[socket.socket] = []
    try:
        for _ in range(40):  # far more than the quota: the rest wait in the backlog
            squatters.append(socket.create_connection(split_endpoint(info["jsonrpc_tcp"]),
                                                      timeout=TIMEOUT))
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                           "params": {"clientName": "t"}}).encode()
        listed = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "session/list",
                             "params": {}}).encode()
        for _ in range(3):
            proc = subprocess.run(
                [sys.executable, "-m", "ctxd.clients.cli", "stdio", "--connection-file",
                 str(d.connection_file)],
                input=frame(body) + frame(listed), capture_output=True, env=d.env,
                timeout=TIMEOUT * 2)
            reader = FrameReader()
            replies = reader.feed(proc.stdout)
            by_id = {json.loads(r)["id"]: json.loads(r) for r in replies}
            assert "result" in by_id[1], proc.stdout[:400]
            assert "sessions" in by_id[2]["result"], proc.stdout[:400]
        # the Python client on the jsonrpc wire takes the same socket
        with d.client(wire="jsonrpc", connect_timeout=TIMEOUT) as c:
            assert "sessions" in c.call("session/list", {})
    finally:
        for s in squatters:
            s.close()
        assert d.stop() == 0
