"""The JSON-RPC wires over real loopback sockets: TCP, WebSocket and the stdio proxy.

The servers run in an event loop on a background thread; the tests are plain blocking
clients, as editors and agents are.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine, Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect as ws_connect

from ctxd.daemon.servers.base import Connection, EventHub
from ctxd.daemon.servers.jsonrpc import (
    JsonRpcTcpServer,
    JsonRpcWebSocketServer,
    WireLimits,
    start_tcp_server,
    start_websocket_server,
)
from ctxd.protocol import auth, types
from ctxd.protocol.codec import FrameReader, dumps_json, frame
from ctxd.protocol.connection import write_connection_file
from ctxd.protocol.errors import SessionNotFound, Unauthorized

CHINESE = "上下文压缩：保留最近的对话"
FILE_TOKEN = "secret-from-file"
TIMEOUT = 5.0


class EchoHandler:
    """A small but real RequestHandler."""

    def __init__(self, hub: EventHub) -> None:
        self.hub = hub
        self.opened: list[Connection] = []
        self.closed: list[Connection] = []
        self.notes: list[tuple[str, Any]] = []
        self.appends: list[int] = []
        self.running = 0
        self.max_running = 0

    async def handle(self, conn: Connection, method: str, params: Any) -> Any:
        if method == "echo":
            return params
        if method == "whoami":
            return {"id": conn.id, "wire": conn.wire}
        if method == "sleep":
            self.running += 1
            self.max_running = max(self.max_running, self.running)
            try:
                await asyncio.sleep(params["s"])
            finally:
                self.running -= 1
            return {"slept": params["s"]}
        if method == "append":
            # synchronous part first, as the engine does: arrival order is append order
            self.appends.append(params["n"])
            await asyncio.sleep(0.001 * (params["n"] % 3))
            return params["n"]
        if method == "missing":
            raise SessionNotFound(
                f"no session {params['session_id']}; list sessions with session.list",
                {"session_id": params["session_id"]},
            )
        if method == "boom":
            raise RuntimeError("engine bug")
        if method == "unencodable":
            return {"x": object()}
        if method == "subscribe":
            conn.subscriptions.add(params["session_id"])
            return True
        if method == "flood":
            pad = "x" * params["size"]
            for i in range(params["count"]):
                event = {"sessionId": params["session_id"], "i": i, "pad": pad}
                self.hub.publish(params["session_id"], "session/event", event)
            return params["count"]
        if method == "notify_me":
            self.hub.notify_connection(conn, "session/hello", {"text": CHINESE})
            return "sent"
        if method == "initialize":
            if isinstance(params, dict) and "nonce" in params:
                # mutual authentication, as the daemon does it (the `ctxd stdio` handshake)
                if not auth.check_client_proof(FILE_TOKEN, params["nonce"], params.get("proof")):
                    raise Unauthorized("wrong proof")
                return {"nonceMac": auth.daemon_proof(FILE_TOKEN, params["nonce"])}
            return {"token": params.get("token") if isinstance(params, dict) else None}
        if method.startswith("note/"):
            self.notes.append((method, params))
            return None
        raise SessionNotFound(f"unknown method {method}")

    def check_token(self, token: Any) -> bool:
        return token == "secret"

    def connection_opened(self, conn: Connection) -> None:
        self.opened.append(conn)

    def connection_closed(self, conn: Connection) -> None:
        self.closed.append(conn)


class Env:
    """An event loop on a thread, with a hub, a handler, and the servers started on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.hub = EventHub()
        self.handler = EchoHandler(self.hub)
        self.servers: list[JsonRpcTcpServer | JsonRpcWebSocketServer] = []

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(TIMEOUT * 2)

    def tcp(self, **limits: Any) -> JsonRpcTcpServer:
        server = self.run(start_tcp_server(self.handler, self.hub, "127.0.0.1", 0,
                                           WireLimits(**limits)))
        self.servers.append(server)
        return server

    def ws(self, allowed_origins: Iterable[str] = (), **limits: Any) -> JsonRpcWebSocketServer:
        server = self.run(start_websocket_server(self.handler, self.hub, "127.0.0.1", 0,
                                                 WireLimits(**limits),
                                                 allowed_origins=allowed_origins))
        self.servers.append(server)
        return server

    def hub_connections(self) -> set[Connection]:
        return set(self.hub._connections)

    def close(self) -> None:
        for server in self.servers:
            self.run(server.close(grace=0.5))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(TIMEOUT)
        self.loop.close()


@pytest.fixture
def env() -> Iterator[Env]:
    e = Env()
    try:
        yield e
    finally:
        e.close()


def wait_until(pred: Any, timeout: float = TIMEOUT) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return bool(pred())


class TcpClient:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        self.reader = FrameReader()
        self.bodies: list[bytes] = []

    def send(self, msg: Any) -> None:
        self.sock.sendall(frame(dumps_json(msg)))

    def request(self, id_: Any, method: str, params: Any = None) -> None:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": id_, "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)

    def recv_body(self) -> bytes:
        while not self.bodies:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("server closed the connection")
            self.bodies.extend(self.reader.feed(data))
        return self.bodies.pop(0)

    def recv(self) -> Any:
        return json.loads(self.recv_body())

    def call(self, id_: Any, method: str, params: Any = None) -> Any:
        self.request(id_, method, params)
        return self.recv()

    def at_eof(self) -> bool:
        """True once the server has closed (after any pending replies were read)."""
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return True
                self.bodies.extend(self.reader.feed(data))
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()


# TCP


def test_tcp_round_trip_sends_raw_utf8(env: Env) -> None:
    server = env.tcp()
    assert server.endpoint == f"127.0.0.1:{server.port}"
    c = TcpClient(server.port)
    c.request(7, "echo", {"text": CHINESE, "n": [1, 2.5, None, True]})
    body = c.recv_body()
    assert CHINESE.encode("utf-8") in body
    assert b"\\u" not in body
    assert json.loads(body) == {
        "jsonrpc": "2.0",
        "id": 7,
        "result": {"text": CHINESE, "n": [1, 2.5, None, True]},
    }
    who = c.call("x", "whoami")["result"]
    assert who["wire"] == "jsonrpc-tcp"
    assert any(conn.id == who["id"] for conn in env.hub_connections())
    assert [conn.id for conn in env.handler.opened] == [who["id"]]
    c.close()
    assert wait_until(lambda: [conn.id for conn in env.handler.closed] == [who["id"]])
    assert wait_until(lambda: not env.hub_connections())


def test_tcp_two_clients_get_their_own_replies(env: Env) -> None:
    server = env.tcp()
    a, b = TcpClient(server.port), TcpClient(server.port)
    # same ids on both connections: each must get its own answer, not the other's
    a.request(1, "sleep", {"s": 0.3})
    b.request(1, "echo", {"who": "b"})
    assert b.recv() == {"jsonrpc": "2.0", "id": 1, "result": {"who": "b"}}
    assert a.recv() == {"jsonrpc": "2.0", "id": 1, "result": {"slept": 0.3}}
    for i in range(20):
        a.request(i, "echo", {"who": "a", "i": i})
        b.request(i, "echo", {"who": "b", "i": i})
    assert [a.recv()["result"] for _ in range(20)] == [{"who": "a", "i": i} for i in range(20)]
    assert [b.recv()["result"] for _ in range(20)] == [{"who": "b", "i": i} for i in range(20)]
    a.close()
    assert wait_until(lambda: len(env.handler.closed) == 1)
    # the server keeps serving after one client leaves (the pygls#219 regression)
    assert b.call(2, "echo", {"still": "here"})["result"] == {"still": "here"}
    c = TcpClient(server.port)
    assert c.call(3, "echo", {"new": True})["result"] == {"new": True}


def test_tcp_slow_request_does_not_block_the_next_and_order_is_kept(env: Env) -> None:
    server = env.tcp()
    c = TcpClient(server.port)
    c.request(1, "sleep", {"s": 0.5})
    c.request(2, "echo", {"fast": True})
    t0 = time.monotonic()
    assert c.recv()["id"] == 2
    assert time.monotonic() - t0 < 0.4
    assert c.recv()["id"] == 1
    # pipelined appends reach the handler's synchronous part in arrival order
    c.sock.sendall(
        b"".join(
            frame(dumps_json({"jsonrpc": "2.0", "id": n, "method": "append", "params": {"n": n}}))
            for n in range(200)
        )
    )
    replies = sorted(c.recv()["result"] for _ in range(200))
    assert replies == list(range(200))
    assert env.handler.appends == list(range(200))


def test_tcp_running_requests_per_connection_are_bounded(env: Env) -> None:
    server = env.tcp(max_inflight=4)
    c = TcpClient(server.port)
    c.sock.sendall(
        b"".join(
            frame(dumps_json({"jsonrpc": "2.0", "id": i, "method": "sleep", "params": {"s": 0.05}}))
            for i in range(12)
        )
    )
    assert sorted(c.recv()["id"] for _ in range(12)) == list(range(12))
    assert env.handler.max_running == 4  # reading paused at the bound, resumed below it


def test_tcp_typed_and_internal_errors(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    server = env.tcp()
    c = TcpClient(server.port)
    err = c.call(1, "missing", {"session_id": "s-42"})
    assert err["id"] == 1 and "result" not in err
    assert err["error"]["code"] == -32010
    assert err["error"]["data"] == {"session_id": "s-42"}
    assert "s-42" in err["error"]["message"]
    with caplog.at_level(logging.ERROR, logger="ctxd.servers.jsonrpc"):
        err = c.call(2, "boom")
        assert err["error"]["code"] == -32603
        assert "RuntimeError" in err["error"]["message"]
        assert "engine bug" not in err["error"]["message"]
        assert any("boom" in r.getMessage() and r.exc_info for r in caplog.records)
        err = c.call(3, "unencodable")
        assert err["id"] == 3 and err["error"]["code"] == -32603
    assert c.call(4, "echo", {"ok": 1})["result"] == {"ok": 1}


def test_tcp_client_notifications_get_no_reply(env: Env) -> None:
    server = env.tcp()
    c = TcpClient(server.port)
    c.send({"jsonrpc": "2.0", "method": "note/progress", "params": {"p": CHINESE}})
    c.send({"jsonrpc": "2.0", "method": "boom"})  # a failing notification: still silent
    assert c.call(1, "echo", {"after": True}) == {
        "jsonrpc": "2.0",
        "id": 1,
        "result": {"after": True},
    }
    assert env.handler.notes == [("note/progress", {"p": CHINESE})]
    c.sock.settimeout(0.2)
    assert not c.at_eof() and c.bodies == []


def test_tcp_server_notification_reaches_the_client(env: Env) -> None:
    server = env.tcp()
    c = TcpClient(server.port)
    c.request(1, "notify_me")
    first = c.recv_body()
    assert CHINESE.encode() in first
    assert json.loads(first) == {
        "jsonrpc": "2.0",
        "method": "session/hello",
        "params": {"text": CHINESE},
    }
    assert c.recv() == {"jsonrpc": "2.0", "id": 1, "result": "sent"}
    # published events reach subscribers only
    other = TcpClient(server.port)
    assert c.call(2, "subscribe", {"session_id": "s1"})["result"] is True
    assert other.call(1, "flood", {"session_id": "s1", "count": 2, "size": 3})["result"] == 2
    events = [c.recv() for _ in range(2)]
    assert [e["params"]["i"] for e in events] == [0, 1]
    other.sock.settimeout(0.2)
    assert not other.at_eof() and other.bodies == []


def test_tcp_invalid_messages_keep_the_connection(env: Env) -> None:
    server = env.tcp()
    c = TcpClient(server.port)
    c.sock.sendall(frame(b'{"jsonrpc": "2.0", "id": 1, "method": '))
    err = c.recv()
    assert err["id"] is None and err["error"]["code"] == -32700
    c.sock.sendall(frame(b"\xff\xfe not utf-8"))
    assert c.recv()["error"]["code"] == -32700
    c.sock.sendall(frame(b'"just a string"'))
    err = c.recv()
    assert err["id"] is None and err["error"]["code"] == -32600
    c.send({"jsonrpc": "2.0", "id": 9, "params": {}})
    err = c.recv()
    assert err["id"] == 9 and err["error"]["code"] == -32600
    c.send({"jsonrpc": "2.0", "id": 10, "method": "echo", "params": 5})
    assert c.recv()["error"]["code"] == -32600
    assert c.call(11, "echo", {"ok": True})["result"] == {"ok": True}


def test_tcp_batches(env: Env) -> None:
    server = env.tcp()
    c = TcpClient(server.port)
    c.send(
        [
            {"jsonrpc": "2.0", "id": 1, "method": "sleep", "params": {"s": 0.05}},
            {"jsonrpc": "2.0", "method": "note/in-batch", "params": {}},
            {"jsonrpc": "2.0", "id": 2, "method": "missing", "params": {"session_id": "z"}},
            42,
            {"jsonrpc": "2.0", "id": 3, "method": "echo", "params": {"k": CHINESE}},
        ]
    )
    replies = c.recv()
    assert isinstance(replies, list)
    assert [r["id"] for r in replies] == [1, 2, None, 3]
    assert replies[0]["result"] == {"slept": 0.05}
    assert replies[1]["error"]["code"] == -32010
    assert replies[2]["error"]["code"] == -32600
    assert replies[3]["result"] == {"k": CHINESE}
    assert ("note/in-batch", {}) in env.handler.notes
    c.send([])
    err = c.recv()
    assert isinstance(err, dict) and err["error"]["code"] == -32600
    # a batch of notifications only gets no reply at all
    c.send([{"jsonrpc": "2.0", "method": "note/a"}, {"jsonrpc": "2.0", "method": "note/b"}])
    assert c.call(5, "echo", {})["id"] == 5


@pytest.mark.parametrize(
    "garbage",
    [
        b"Content-Length: abc\r\n\r\n{}",
        b"\x00\xffGARBAGE\x13\x37\r\n\r\n",
        b"Content-Type: application/json\r\n\r\n{}",
    ],
    ids=["bad-length", "binary-garbage", "no-length"],
)
def test_tcp_broken_header_gets_parse_error_then_close(env: Env, garbage: bytes) -> None:
    server = env.tcp()
    bystander = TcpClient(server.port)
    c = TcpClient(server.port)
    c.sock.sendall(garbage)
    err = c.recv()
    assert err["id"] is None and err["error"]["code"] == -32700
    assert c.at_eof()
    assert bystander.call(1, "echo", {"fine": True})["result"] == {"fine": True}


def test_tcp_oversized_frame_is_refused_then_closed(env: Env) -> None:
    server = env.tcp(max_frame=1024)
    bystander = TcpClient(server.port)
    c = TcpClient(server.port)
    assert c.call(1, "echo", {"pad": "x" * 900})["id"] == 1  # just under the limit
    c.sock.sendall(b"Content-Length: 5000\r\n\r\n" + b" " * 100)
    err = c.recv()
    assert err["error"]["code"] == -32015
    assert "1024" in err["error"]["message"]
    assert c.at_eof()
    assert bystander.call(2, "echo", {"fine": True})["result"] == {"fine": True}


def test_tcp_half_close_still_delivers_replies(env: Env) -> None:
    server = env.tcp()
    c = TcpClient(server.port)
    c.request(1, "sleep", {"s": 0.2})
    c.request(2, "echo", {"b": 2})
    c.sock.shutdown(socket.SHUT_WR)
    assert sorted(c.recv()["id"] for _ in range(2)) == [1, 2]
    assert c.at_eof()
    assert wait_until(lambda: len(env.handler.closed) == 1)


def _slow_tcp_subscriber(env: Env, port: int, session_id: str) -> tuple[socket.socket, Any]:
    """A raw client with a tiny receive buffer, subscribed to `session_id`."""
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.settimeout(TIMEOUT)
    slow.connect(("127.0.0.1", port))
    sub = {"jsonrpc": "2.0", "id": 1, "method": "subscribe", "params": {"session_id": session_id}}
    slow.sendall(frame(dumps_json(sub)))
    assert wait_until(lambda: any(session_id in c.subscriptions for c in env.hub_connections()))
    return slow, next(c for c in env.hub_connections() if session_id in c.subscriptions)


def _read_until_missed(next_message: Any) -> tuple[list[int], dict[str, Any]]:
    """Read a subscriber's messages up to its `session/didMissEvents`: the event numbers
    received before it, and the notice's params."""
    seen: list[int] = []
    while True:
        msg = next_message()
        if msg.get("method") == "session/event":
            seen.append(msg["params"]["i"])
        elif msg.get("method") == "session/didMissEvents":
            # what the protocol's types declare
            msgspec.convert(msg["params"], types.NOTIFICATIONS["session/didMissEvents"])
            return seen, msg["params"]


def test_tcp_subscriber_that_stops_reading_is_told_what_it_missed(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    server = env.tcp(max_queue_bytes=256 * 1024)
    slow, slow_conn = _slow_tcp_subscriber(env, server.port, "hot")
    fast = TcpClient(server.port)
    with caplog.at_level(logging.INFO, logger="ctxd.servers.jsonrpc"):
        # 2000 events of 16 KiB: far beyond what the kernel and the queue may hold
        res = fast.call(1, "flood", {"session_id": "hot", "count": 2000, "size": 16384})
        assert res["result"] == 2000
        assert any("dropping its events" in r.getMessage() for r in caplog.records)
    assert fast.call(2, "echo", {"alive": True})["result"] == {"alive": True}
    assert slow_conn not in env.handler.closed
    # it reads again: the events queued before the backlog, in order, then the notice
    reader = TcpClient.__new__(TcpClient)
    reader.sock, reader.reader, reader.bodies = slow, FrameReader(), []
    assert reader.recv() == {"jsonrpc": "2.0", "id": 1, "result": True}
    seen, notice = _read_until_missed(reader.recv)
    assert seen == list(range(len(seen))) and 0 < len(seen) < 2000
    assert notice == {"sessionId": "hot", "missed": 2000 - len(seen)}
    # the connection carries on: later events arrive as usual
    assert fast.call(3, "flood", {"session_id": "hot", "count": 3, "size": 10})["result"] == 3
    assert [reader.recv()["params"]["i"] for _ in range(3)] == [0, 1, 2]
    assert reader.call(4, "echo", {"back": 1})["result"] == {"back": 1}
    assert slow_conn not in env.handler.closed
    slow.close()


def test_tcp_client_that_stops_reading_replies_is_dropped(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    server = env.tcp(max_queue_bytes=256 * 1024)
    slow, slow_conn = _slow_tcp_subscriber(env, server.port, "quiet")
    request = frame(dumps_json(
        {"jsonrpc": "2.0", "id": 2, "method": "echo", "params": {"pad": "y" * 65536}}
    ))
    with caplog.at_level(logging.WARNING, logger="ctxd.servers.jsonrpc"):
        # at most 32 MiB of replies; the limit is passed long before
        for _ in range(500):
            if slow_conn in env.handler.closed:
                break
            try:
                slow.sendall(request)
            except OSError:
                break
        assert wait_until(lambda: slow_conn in env.handler.closed)
        assert slow_conn not in env.hub_connections()
        assert any("dropping" in r.getMessage() for r in caplog.records)
    fast = TcpClient(server.port)
    assert fast.call(1, "echo", {"alive": True})["result"] == {"alive": True}
    slow.close()


def test_tcp_connection_limit(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    server = env.tcp(max_connections=2)
    a, b = TcpClient(server.port), TcpClient(server.port)
    assert a.call(1, "echo", {})["id"] == 1 and b.call(1, "echo", {})["id"] == 1
    with caplog.at_level(logging.WARNING, logger="ctxd.servers.jsonrpc"):
        c = TcpClient(server.port)
        err = c.recv()
        assert err["error"]["code"] == -32603
        assert err["error"]["data"]["reason"] == "too_many_connections"
        assert c.at_eof()
        assert any("limit 2" in r.getMessage() for r in caplog.records)
    assert len(env.handler.opened) == 2
    a.close()
    assert wait_until(lambda: len(env.handler.closed) == 1)
    d = TcpClient(server.port)
    assert d.call(5, "echo", {"in": True})["result"] == {"in": True}


def test_tcp_server_close_closes_clients(env: Env) -> None:
    server = env.tcp()
    c = TcpClient(server.port)
    assert c.call(1, "echo", {})["id"] == 1
    env.run(server.close(grace=0.5))
    env.servers.remove(server)
    assert c.at_eof()
    assert wait_until(lambda: len(env.handler.closed) == 1)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1)


# WebSocket


def _ws_recv(ws: Any) -> Any:
    return json.loads(ws.recv(timeout=TIMEOUT))


def test_ws_round_trip_and_unescaped_text(env: Env) -> None:
    server = env.ws()
    assert server.endpoint == f"ws://127.0.0.1:{server.port}"
    with ws_connect(server.endpoint) as ws:
        ws.send(dumps_json({"jsonrpc": "2.0", "id": 1, "method": "echo", "params": {"t": CHINESE}}))
        raw = ws.recv(timeout=TIMEOUT)
        assert isinstance(raw, str)  # a text frame
        assert CHINESE in raw and "\\u" not in raw
        assert json.loads(raw) == {"jsonrpc": "2.0", "id": 1, "result": {"t": CHINESE}}
        ws.send(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "whoami"}))
        who = _ws_recv(ws)["result"]
        assert who["wire"] == "websocket"
        err_req = {"jsonrpc": "2.0", "id": 3, "method": "missing", "params": {"session_id": "q"}}
        ws.send(json.dumps(err_req))
        err = _ws_recv(ws)["error"]
        assert err["code"] == -32010 and err["data"] == {"session_id": "q"}
    assert wait_until(lambda: [c.id for c in env.handler.closed] == [who["id"]])
    assert wait_until(lambda: not env.hub_connections())


def test_ws_two_clients_and_one_leaves(env: Env) -> None:
    server = env.ws()
    with ws_connect(server.endpoint) as a, ws_connect(server.endpoint) as b:
        a.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "sleep", "params": {"s": 0.3}}))
        b.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "echo", "params": {"who": "b"}}))
        assert _ws_recv(b) == {"jsonrpc": "2.0", "id": 1, "result": {"who": "b"}}
        assert _ws_recv(a) == {"jsonrpc": "2.0", "id": 1, "result": {"slept": 0.3}}
        a.close()
        assert wait_until(lambda: len(env.handler.closed) == 1)
        b.send(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "echo", "params": {"x": 1}}))
        assert _ws_recv(b)["result"] == {"x": 1}


def test_ws_invalid_json_and_oversized_frame(env: Env) -> None:
    server = env.ws(max_frame=2048)
    with ws_connect(server.endpoint) as bystander, ws_connect(server.endpoint) as ws:
        ws.send("{not json")
        err = _ws_recv(ws)
        assert err["id"] is None and err["error"]["code"] == -32700
        ws.send("[]")
        assert _ws_recv(ws)["error"]["code"] == -32600
        ws.send(json.dumps({"jsonrpc": "2.0", "id": 5, "method": "echo", "params": {"a": 1}}))
        assert _ws_recv(ws)["result"] == {"a": 1}
        ws.send(json.dumps({"jsonrpc": "2.0", "id": 6, "method": "echo", "params": "x" * 5000}))
        with pytest.raises(ConnectionClosed) as info:
            ws.recv(timeout=TIMEOUT)
        assert info.value.rcvd is not None and info.value.rcvd.code == 1009
        bystander.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "echo", "params": {}}))
        assert _ws_recv(bystander)["id"] == 1


def _raw_handshake(port: int, origin: str | None) -> tuple[socket.socket, bytes]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        "GET / HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
    ]
    if origin is not None:
        lines.append(f"Origin: {origin}")
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        data = sock.recv(4096)
        if not data:
            break
        head += data
    return sock, head


def _ws_client_frame(payload: bytes) -> bytes:
    # client frames must be masked; a zero mask leaves the payload as is
    n = len(payload)
    if n < 126:
        header = struct.pack("!BB", 0x81, 0x80 | n)
    elif n < 65536:
        header = struct.pack("!BBH", 0x81, 0x80 | 126, n)
    else:
        header = struct.pack("!BBQ", 0x81, 0x80 | 127, n)
    return header + b"\x00\x00\x00\x00" + payload


def test_ws_origin_policy(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    server = env.ws(allowed_origins=["https://console.example.org"])
    with caplog.at_level(logging.WARNING, logger="ctxd.servers.jsonrpc"):
        with pytest.raises(InvalidStatus) as info:
            ws_connect(server.endpoint, origin="http://evil.example")  # type: ignore[arg-type]
        assert info.value.response.status_code == 403
        assert any("evil.example" in r.getMessage() for r in caplog.records)
    # the same port on another host name is still foreign
    with pytest.raises(InvalidStatus):
        ws_connect(server.endpoint, origin=f"http://192.168.1.5:{server.port}")  # type: ignore[arg-type]
    assert env.handler.opened == []
    for origin in (
        None,
        f"http://127.0.0.1:{server.port}",
        f"http://localhost:{server.port}",
        "https://console.example.org",
    ):
        with ws_connect(server.endpoint, origin=origin) as ws:  # type: ignore[arg-type]
            ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "echo", "params": {}}))
            assert _ws_recv(ws)["id"] == 1
    # no response, accepted or refused, lets a browser read it cross-origin
    for origin, status in ((None, b" 101 "), ("http://evil.example", b" 403 ")):
        sock, head = _raw_handshake(server.port, origin)
        assert status in head.split(b"\r\n")[0]
        assert b"access-control-allow-origin" not in head.lower()
        sock.close()


def _close_code(sock: socket.socket, timeout: float = TIMEOUT) -> int | None:
    """Read server frames (unmasked) until a close frame; its code (None at EOF)."""
    buf = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        while len(buf) >= 2:
            opcode, n = buf[0] & 0x0F, buf[1] & 0x7F
            start = 2
            if n == 126:
                if len(buf) < 4:
                    break
                n, start = struct.unpack("!H", buf[2:4])[0], 4
            elif n == 127:
                if len(buf) < 10:
                    break
                n, start = struct.unpack("!Q", buf[2:10])[0], 10
            if len(buf) < start + n:
                break
            if opcode == 0x8:
                return int(struct.unpack("!H", buf[start:start + 2])[0])
            buf = buf[start + n:]
        try:
            data = sock.recv(1 << 20)
        except ConnectionResetError:
            return None
        if not data:
            return None
        buf += data
    raise AssertionError("no close frame")


def _slow_ws_subscriber(
    env: Env, port: int, session_id: str, small_buffer: bool = True
) -> tuple[socket.socket, Any]:
    slow, head = _raw_handshake(port, None)
    assert b" 101 " in head.split(b"\r\n")[0]
    if small_buffer:
        # the kernel holds little for it, so the daemon's own queue fills
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sub = {"jsonrpc": "2.0", "id": 1, "method": "subscribe", "params": {"session_id": session_id}}
    slow.sendall(_ws_client_frame(dumps_json(sub)))
    assert wait_until(lambda: any(session_id in c.subscriptions for c in env.hub_connections()))
    return slow, next(c for c in env.hub_connections() if session_id in c.subscriptions)


class _RawWsReader:
    """Reads a raw socket's server text frames (unmasked, unfragmented) as JSON."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def recv(self) -> Any:
        while True:
            if len(self.buf) >= 2:
                opcode, n = self.buf[0] & 0x0F, self.buf[1] & 0x7F
                start = {126: 4, 127: 10}.get(n, 2)
                if n == 126 and len(self.buf) >= 4:
                    n = struct.unpack("!H", self.buf[2:4])[0]
                elif n == 127 and len(self.buf) >= 10:
                    n = struct.unpack("!Q", self.buf[2:10])[0]
                if len(self.buf) >= start and len(self.buf) >= start + n:
                    assert opcode == 0x1, f"frame opcode {opcode}"
                    body, self.buf = self.buf[start:start + n], self.buf[start + n:]
                    return json.loads(body)
            data = self.sock.recv(1 << 20)
            if not data:
                raise EOFError("server closed the connection")
            self.buf += data


def test_ws_subscriber_that_stops_reading_is_told_what_it_missed(env: Env) -> None:
    server = env.ws(max_queue_bytes=256 * 1024)
    slow, slow_conn = _slow_ws_subscriber(env, server.port, "hot")
    with ws_connect(server.endpoint) as fast:
        flood = {"session_id": "hot", "count": 2000, "size": 16384}
        fast.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "flood", "params": flood}))
        assert _ws_recv(fast)["result"] == 2000
        fast.send(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "echo", "params": {"ok": 1}}))
        assert _ws_recv(fast)["result"] == {"ok": 1}
        assert slow_conn not in env.handler.closed
        # once it reads again: the events queued before the backlog, in order, then the
        # notice with the number dropped, and the connection carries on
        reader = _RawWsReader(slow)
        assert reader.recv() == {"jsonrpc": "2.0", "id": 1, "result": True}
        seen, notice = _read_until_missed(reader.recv)
        assert seen == list(range(len(seen))) and 0 < len(seen) < 2000
        assert notice == {"sessionId": "hot", "missed": 2000 - len(seen)}
        flood = {"session_id": "hot", "count": 3, "size": 10}
        fast.send(json.dumps({"jsonrpc": "2.0", "id": 3, "method": "flood", "params": flood}))
        assert _ws_recv(fast)["result"] == 3
    assert [reader.recv()["params"]["i"] for _ in range(3)] == [0, 1, 2]
    echo = {"jsonrpc": "2.0", "id": 4, "method": "echo", "params": {"back": 1}}
    slow.sendall(_ws_client_frame(dumps_json(echo)))
    assert reader.recv()["result"] == {"back": 1}
    assert slow_conn not in env.handler.closed
    slow.close()


def test_ws_client_that_stops_reading_replies_is_dropped(env: Env) -> None:
    server = env.ws(max_queue_bytes=256 * 1024)
    # a default receive buffer: a tiny one would make reading back megabytes of replies
    # crawl (a tiny window), and the close frame comes after them
    slow, slow_conn = _slow_ws_subscriber(env, server.port, "quiet", small_buffer=False)
    echo = {"jsonrpc": "2.0", "id": 2, "method": "echo", "params": {"pad": "y" * 65536}}
    request = _ws_client_frame(dumps_json(echo))
    # at most 32 MiB of replies; the limit is passed long before
    for _ in range(500):
        if slow_conn in env.handler.closed:
            break
        try:
            slow.sendall(request)
        except OSError:
            break
    assert wait_until(lambda: slow_conn in env.handler.closed)
    with ws_connect(server.endpoint) as fast:
        fast.send(json.dumps({"jsonrpc": "2.0", "id": 3, "method": "echo", "params": {"ok": 1}}))
        assert _ws_recv(fast)["result"] == {"ok": 1}
    # once it reads again, after what was already sent, a close frame says why: 1013
    # ("try again later"), so the client reconnects and catches up
    assert _close_code(slow) == 1013
    slow.close()


def test_ws_connection_limit(env: Env) -> None:
    server = env.ws(max_connections=1)
    with ws_connect(server.endpoint) as first:
        with pytest.raises(InvalidStatus) as info:
            ws_connect(server.endpoint)
        assert info.value.response.status_code == 503
        first.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "echo", "params": {}}))
        assert _ws_recv(first)["id"] == 1
    assert wait_until(lambda: len(env.handler.closed) == 1)
    with ws_connect(server.endpoint) as again:
        again.send(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "echo", "params": {}}))
        assert _ws_recv(again)["id"] == 2


# stdio proxy


def _proxy_cmd(conn_file: Path, start_script: str = "None") -> list[str]:
    code = (
        "import sys, threading, time\n"
        "from pathlib import Path\n"
        "from ctxd.clients.stdio_proxy import run_stdio_proxy\n"
        f"start = {start_script}\n"
        f"sys.exit(run_stdio_proxy(Path({str(conn_file)!r}), start))\n"
    )
    return [sys.executable, "-c", code]


def _conn_info(port: int) -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "jsonrpc_tcp": f"127.0.0.1:{port}",
        "websocket": "ws://127.0.0.1:1",
        "zmq_router": "tcp://127.0.0.1:2",
        "zmq_pub": "tcp://127.0.0.1:3",
        "token": FILE_TOKEN,
        "data_dir": "/nonexistent",
        "version": "0.1.0",
    }


def _frames(data: bytes) -> list[Any]:
    bodies = FrameReader().feed(data)
    return [json.loads(b) for b in bodies]


def test_stdio_proxy_forwards_and_injects_token(env: Env, tmp_path: Path) -> None:
    server = env.tcp()
    conn_file = tmp_path / "run" / "daemon.json"
    write_connection_file(conn_file, _conn_info(server.port))
    editor_input = b"".join(
        [
            frame(dumps_json({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})),
            frame(
                dumps_json(
                    {
                        "jsonrpc": "2.0",
                        "id": 2,
                        "method": "initialize",
                        "params": {"token": "editor-token"},
                    }
                )
            ),
            # an extra header line and odd spacing: forwarded as is
            b"Content-Type: application/vscode-jsonrpc; charset=utf-8\r\n"
            + frame(
                dumps_json({"jsonrpc": "2.0", "id": 3, "method": "echo", "params": {"t": CHINESE}})
            ),
            frame(b'{"jsonrpc":"2.0","id":4,"method":"sleep","params":{"s":0.2}}'),
        ]
    )
    proc = subprocess.run(
        _proxy_cmd(conn_file), input=editor_input, capture_output=True, timeout=20
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert CHINESE.encode() in proc.stdout
    replies = {m["id"]: m for m in _frames(proc.stdout)}
    assert replies[1]["result"] == {"token": "secret-from-file"}
    assert replies[2]["result"] == {"token": "editor-token"}
    assert replies[3]["result"] == {"t": CHINESE}
    assert replies[4]["result"] == {"slept": 0.2}  # delivered although stdin closed first
    # byte-exact copy of the daemon's output
    assert frame(dumps_json({"jsonrpc": "2.0", "id": 3, "result": {"t": CHINESE}})) in proc.stdout


def test_stdio_proxy_starts_the_daemon_when_needed(env: Env, tmp_path: Path) -> None:
    server = env.tcp()
    conn_file = tmp_path / "daemon.json"
    info_json = json.dumps(_conn_info(server.port))
    marker = tmp_path / "started"
    # stands in for spawning 'ctxd serve': the file appears a little later
    start = (
        f"lambda: (Path({str(marker)!r}).write_text('yes'), threading.Timer(0.5, lambda: "
        f"Path({str(conn_file)!r}).write_text({info_json!r})).start())"
    )
    req = frame(dumps_json({"jsonrpc": "2.0", "id": 1, "method": "initialize"}))
    proc = subprocess.run(_proxy_cmd(conn_file, start), input=req, capture_output=True, timeout=20)
    assert proc.returncode == 0, proc.stderr.decode()
    assert marker.read_text() == "yes"
    assert _frames(proc.stdout) == [
        {"jsonrpc": "2.0", "id": 1, "result": {"token": "secret-from-file"}}
    ]


def test_stdio_proxy_reports_an_unreachable_daemon(tmp_path: Path) -> None:
    conn_file = tmp_path / "missing.json"
    proc = subprocess.run(_proxy_cmd(conn_file), input=b"", capture_output=True, timeout=20)
    assert proc.returncode != 0
    assert b"ctxd stdio" in proc.stderr and b"ctxd serve" in proc.stderr
    assert proc.stdout == b""
    # a file naming a port nobody listens on, from a daemon that is gone
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    write_connection_file(conn_file, _conn_info(port))
    proc = subprocess.run(_proxy_cmd(conn_file), input=b"", capture_output=True, timeout=20)
    assert proc.returncode != 0
    assert b"ctxd stdio" in proc.stderr


def test_stdio_proxy_exits_nonzero_when_the_daemon_goes_away(env: Env, tmp_path: Path) -> None:
    server = env.tcp()
    conn_file = tmp_path / "daemon.json"
    write_connection_file(conn_file, _conn_info(server.port))
    proc = subprocess.Popen(
        _proxy_cmd(conn_file),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdin is not None
        proc.stdin.write(
            frame(dumps_json({"jsonrpc": "2.0", "id": 1, "method": "echo", "params": {}}))
        )
        proc.stdin.flush()
        assert proc.stdout is not None and proc.stderr is not None
        # the reply arrives through the proxy while the daemon is up
        reader, got = FrameReader(), []
        deadline = time.monotonic() + TIMEOUT
        while not got and time.monotonic() < deadline:
            if select.select([proc.stdout], [], [], 0.1)[0]:
                got = reader.feed(os.read(proc.stdout.fileno(), 65536))
        assert [json.loads(b) for b in got] == [{"jsonrpc": "2.0", "id": 1, "result": {}}]
        env.run(server.close(grace=0.5))
        env.servers.remove(server)
        # stdin stays open: the proxy must notice on its own that the daemon is gone
        assert proc.wait(timeout=20) == 1
        assert b"daemon closed the connection" in proc.stderr.read()
        proc.stdin.close()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
