"""The ZeroMQ wire with real sockets: framing, auth, garbage, errors, events, concurrency."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
from helpers import DaemonProcess

from ctxd.daemon.servers.base import Connection, EventHub
from ctxd.daemon.servers.zmq_server import PROBE_METHOD, ZmqServer
from ctxd.protocol.codec import packb, unpackb
from ctxd.protocol.errors import MethodNotFound, SessionNotFound

TOKEN = "s3cret-token"


class EchoHandler:
    """A small real RequestHandler: enough methods to exercise the transport."""

    def __init__(self, hub: EventHub) -> None:
        self.hub = hub
        self.calls: list[tuple[str, Any]] = []
        self.opened: list[Connection] = []
        self.closed: list[Connection] = []

    async def handle(self, conn: Connection, method: str, params: Any) -> Any:
        # recorded before the first await: this is the order the handler sees requests in
        self.calls.append((method, params))
        if method == "echo":
            return params
        if method == "whoami":
            return {"id": conn.id, "wire": conn.wire, "authenticated": conn.authenticated}
        if method == "fail":
            sid = params.get("sessionId")
            raise SessionNotFound(f"no session {sid!r}; create it first", {"sessionId": sid})
        if method == "boom":
            raise RuntimeError("secret internal detail")
        if method == "slow":
            await asyncio.sleep(params["seconds"])
            return {"slept": params["seconds"]}
        if method == "emit":
            self.hub.publish(params["sessionId"], "test/event", params)
            return {}
        if method == "unencodable":
            return {1, 2, 3}  # msgpack has no sets
        raise MethodNotFound(f"unknown method {method!r}")

    def check_token(self, token: Any) -> bool:
        return token == TOKEN

    def connection_opened(self, conn: Connection) -> None:
        self.opened.append(conn)

    def connection_closed(self, conn: Connection) -> None:
        self.closed.append(conn)


class Running:
    """A ZmqServer on its own event loop thread, as in the daemon."""

    def __init__(self, router: str, pub: str, **options: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.hub = EventHub()
        self.handler = EchoHandler(self.hub)
        self.server = ZmqServer(self.handler, self.hub, router, pub, **options)
        self.run(self.server.start())

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.run(self.server.close(grace=0.5))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def short_dir() -> Iterator[str]:
    # ipc paths are limited to ~107 bytes; pytest's tmp_path can be long
    path = tempfile.mkdtemp(prefix="ctxd-zmq-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _endpoints(kind: str, directory: str) -> tuple[str, str]:
    if kind == "tcp":
        return "tcp://127.0.0.1:0", "tcp://127.0.0.1:0"
    return f"ipc://{directory}/router.sock", f"ipc://{directory}/pub.sock"


@pytest.fixture(params=["tcp", "ipc"])
def srv(request: pytest.FixtureRequest, short_dir: str) -> Iterator[Running]:
    running = Running(*_endpoints(request.param, short_dir))
    yield running
    running.stop()


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)


def _socket(ctx: zmq.Context[Any], kind: int, endpoint: str) -> zmq.Socket[bytes]:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def _recv(sock: zmq.Socket[bytes], timeout: float = 3.0) -> list[bytes]:
    assert sock.poll(int(timeout * 1000)), "no reply in time"
    return sock.recv_multipart()


def _rpc(sock: zmq.Socket[bytes], msg: Any, *, delimiter: bool = True) -> dict[str, Any]:
    """One request on a DEALER (or REQ, which adds the delimiter itself)."""
    body = msg if isinstance(msg, bytes) else packb(msg)
    if sock.type == zmq.REQ:
        sock.send(body)
    else:
        sock.send_multipart([b"", body] if delimiter else [body])
    frames = _recv(sock)
    if sock.type == zmq.DEALER:
        assert frames[:-1] == ([b""] if delimiter else []), "reply envelope differs from request"
    reply = unpackb(frames[-1])
    assert isinstance(reply, dict)
    return reply


def _req(method: str, params: Any = None, id_: Any = 1, token: Any = TOKEN) -> dict[str, Any]:
    msg: dict[str, Any] = {"id": id_, "method": method, "params": params or {}}
    if token is not None:
        msg["token"] = token
    return msg


def test_bound_endpoints_are_reported(srv: Running) -> None:
    for ep in (srv.server.router_endpoint, srv.server.pub_endpoint):
        assert ep.startswith(("tcp://127.0.0.1:", "ipc://"))
        assert not ep.endswith(":0")


def test_ipc_socket_files_removed_on_close(short_dir: str) -> None:
    running = Running(*_endpoints("ipc", short_dir))
    assert os.path.exists(f"{short_dir}/router.sock")
    running.stop()
    assert not os.path.exists(f"{short_dir}/router.sock")
    assert not os.path.exists(f"{short_dir}/pub.sock")


@pytest.mark.parametrize("delimiter", [True, False])
def test_dealer_round_trip(srv: Running, ctx: zmq.Context[Any], delimiter: bool) -> None:
    dealer = _socket(ctx, zmq.DEALER, srv.server.router_endpoint)
    params = {"text": "你好, world", "n": [1, 2.5, None], "raw": b"\x00\xff"}
    reply = _rpc(dealer, _req("echo", params, id_="req-1"), delimiter=delimiter)
    assert reply == {"id": "req-1", "result": params}


def test_req_socket_round_trip(srv: Running, ctx: zmq.Context[Any]) -> None:
    req = _socket(ctx, zmq.REQ, srv.server.router_endpoint)
    for i in range(3):
        assert _rpc(req, _req("echo", {"i": i}, id_=i)) == {"id": i, "result": {"i": i}}
    # REQ must get an answer even to garbage, or the socket would be stuck
    assert _rpc(req, b"\xc1")["error"]["code"] == -32700
    assert _rpc(req, _req("echo", {"ok": True}))["result"] == {"ok": True}


def test_one_connection_per_peer(srv: Running, ctx: zmq.Context[Any]) -> None:
    a = _socket(ctx, zmq.DEALER, srv.server.router_endpoint)
    b = _socket(ctx, zmq.DEALER, srv.server.router_endpoint)
    ida = _rpc(a, _req("whoami"))["result"]
    assert _rpc(a, _req("whoami"))["result"] == ida
    idb = _rpc(b, _req("whoami"))["result"]
    assert ida["id"] != idb["id"]
    assert ida["wire"] == "zmq" and ida["authenticated"] is True
    assert len(srv.handler.opened) == 2
    assert {c.id for c in srv.server.connections} == {ida["id"], idb["id"]}


@pytest.mark.parametrize("token", [None, "wrong", 12345, ""])
def test_missing_or_wrong_token_is_refused(srv: Running, ctx: zmq.Context[Any], token: Any) -> None:
    dealer = _socket(ctx, zmq.DEALER, srv.server.router_endpoint)
    reply = _rpc(dealer, _req("echo", {"x": 1}, id_=7, token=token))
    assert reply["id"] == 7
    assert reply["error"]["code"] == -32001
    assert "token" in reply["error"]["message"]
    assert srv.handler.calls == [], "the handler must not see unauthenticated requests"
    assert srv.handler.opened == []


def test_authentication_is_per_request(srv: Running, ctx: zmq.Context[Any]) -> None:
    dealer = _socket(ctx, zmq.DEALER, srv.server.router_endpoint)
    assert _rpc(dealer, _req("whoami"))["result"]["authenticated"] is True
    (conn,) = srv.server.connections
    assert _rpc(dealer, _req("whoami", token="nope"))["error"]["code"] == -32001
    assert conn.authenticated is False
    assert _rpc(dealer, _req("whoami"))["result"]["authenticated"] is True


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"\xc1not msgpack", -32700),
        (b"", -32700),
        (packb([1, 2, 3]), -32600),
        (packb("just a string"), -32600),
        (packb({"id": 1, "token": TOKEN}), -32600),
        (packb({"id": 1, "method": 42, "token": TOKEN}), -32600),
        (packb({"id": 1, "method": "", "token": TOKEN}), -32600),
        (packb({"id": 1, "method": "echo", "params": "str", "token": TOKEN}), -32600),
        (packb({"id": 1, "method": "nope", "token": TOKEN}), -32601),
    ],
)
def test_garbage_gets_typed_errors_and_serving_goes_on(
    srv: Running, ctx: zmq.Context[Any], body: bytes, code: int
) -> None:
    dealer = _socket(ctx, zmq.DEALER, srv.server.router_endpoint)
    dealer.send_multipart([b"", body])
    reply = unpackb(_recv(dealer)[-1])
    assert reply["error"]["code"] == code
    assert reply["error"]["message"]
    assert _rpc(dealer, _req("echo", {"still": "alive"}))["result"] == {"still": "alive"}


def test_extra_frames_are_refused(srv: Running, ctx: zmq.Context[Any]) -> None:
    dealer = _socket(ctx, zmq.DEALER, srv.server.router_endpoint)
    dealer.send_multipart([b"", packb(_req("echo")), b"extra"])
    assert unpackb(_recv(dealer)[-1])["error"]["code"] == -32600
    assert "echo" not in [m for m, _ in srv.handler.calls]


def test_handler_errors(srv: Running, ctx: zmq.Context[Any]) -> None:
    dealer = _socket(ctx, zmq.DEALER, srv.server.router_endpoint)
    err = _rpc(dealer, _req("fail", {"sessionId": "s-9"}, id_=3))["error"]
    assert err == {
        "code": -32010,
        "message": "no session 's-9'; create it first",
        "data": {"sessionId": "s-9"},
    }
    err = _rpc(dealer, _req("boom", id_=4))["error"]
    assert err["code"] == -32603
    assert "secret internal detail" not in err["message"]
    assert _rpc(dealer, _req("unencodable", id_=5))["error"]["code"] == -32603
    assert _rpc(dealer, _req("echo", {"a": 1}, id_=6)) == {"id": 6, "result": {"a": 1}}


def test_slow_request_does_not_block_other_clients(srv: Running, ctx: zmq.Context[Any]) -> None:
    slow = _socket(ctx, zmq.DEALER, srv.server.router_endpoint)
    fast = _socket(ctx, zmq.DEALER, srv.server.router_endpoint)
    slow.send_multipart([b"", packb(_req("slow", {"seconds": 1.0}, id_="slow"))])
    time.sleep(0.05)
    start = time.monotonic()
    assert _rpc(fast, _req("echo", {"q": 1}, id_="fast"))["result"] == {"q": 1}
    assert time.monotonic() - start < 0.5
    assert unpackb(_recv(slow)[-1]) == {"id": "slow", "result": {"slept": 1.0}}


def test_replies_from_one_client_may_come_out_of_order(srv: Running, ctx: zmq.Context[Any]) -> None:
    dealer = _socket(ctx, zmq.DEALER, srv.server.router_endpoint)
    dealer.send_multipart([b"", packb(_req("slow", {"seconds": 0.3}, id_=1))])
    dealer.send_multipart([b"", packb(_req("echo", {}, id_=2))])
    first = unpackb(_recv(dealer)[-1])
    second = unpackb(_recv(dealer)[-1])
    assert [first["id"], second["id"]] == [2, 1]


def test_requests_reach_the_handler_in_arrival_order(srv: Running, ctx: zmq.Context[Any]) -> None:
    dealer = _socket(ctx, zmq.DEALER, srv.server.router_endpoint)
    n = 300
    for i in range(n):
        dealer.send_multipart([b"", packb(_req("echo", {"i": i}, id_=i))])
    ids = sorted(unpackb(_recv(dealer)[-1])["id"] for _ in range(n))
    assert ids == list(range(n))
    assert [p["i"] for m, p in srv.handler.calls if m == "echo"] == list(range(n))


def _wait_for_subscription(srv: Running, sub: zmq.Socket[bytes], session_id: str) -> None:
    """Slow joiner: publish probe events until one arrives, then drain them."""
    deadline = time.monotonic() + 5
    while True:
        srv.server.publish(session_id, "test/probe", {})  # from this thread, on purpose
        if sub.poll(50):
            break
        assert time.monotonic() < deadline, "subscription never took effect"
    while sub.poll(100):
        sub.recv_multipart()


def test_events_reach_subscribers_by_topic(srv: Running, ctx: zmq.Context[Any]) -> None:
    sub = _socket(ctx, zmq.SUB, srv.server.pub_endpoint)
    sub.subscribe(b"session/s1")
    _wait_for_subscription(srv, sub, "s1")
    dealer = _socket(ctx, zmq.DEALER, srv.server.router_endpoint)
    assert _rpc(dealer, _req("emit", {"sessionId": "s2", "n": 0}))["result"] == {}
    assert _rpc(dealer, _req("emit", {"sessionId": "s1", "n": 1}))["result"] == {}
    topic, payload = _recv(sub)
    assert topic == b"session/s1"
    assert msgpack.unpackb(payload) == {
        "method": "test/event",
        "params": {"sessionId": "s1", "n": 1},
    }
    assert not sub.poll(100), "an event of another session leaked through"
    assert srv.server.stats["events_published"] >= 2


def test_subscription_probe_is_answered(srv: Running, ctx: zmq.Context[Any]) -> None:
    sub = _socket(ctx, zmq.SUB, srv.server.pub_endpoint)
    sub.subscribe(b"session/s1")
    sub.subscribe(b"probe/abc123")
    topic, payload = _recv(sub)
    assert topic == b"probe/abc123"
    assert unpackb(payload) == {"method": PROBE_METHOD, "params": {"topic": "probe/abc123"}}
    # once the probe is back, the earlier subscription is in effect: no retry needed
    srv.server.publish("s1", "test/event", {"n": 1})
    topic, payload = _recv(sub, timeout=1.0)
    assert topic == b"session/s1"


def test_unencodable_event_is_dropped_and_counted(srv: Running) -> None:
    srv.server.publish("s1", "test/event", {"bad": {1, 2}})  # hops onto the server's loop
    deadline = time.monotonic() + 2
    while srv.server.stats["events_dropped"] != 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_idle_peers_are_dropped(short_dir: str, ctx: zmq.Context[Any]) -> None:
    running = Running("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", idle_timeout=0.3)
    try:
        dealer = _socket(ctx, zmq.DEALER, running.server.router_endpoint)
        first = _rpc(dealer, _req("whoami"))["result"]["id"]
        deadline = time.monotonic() + 3
        while not running.handler.closed:
            assert time.monotonic() < deadline, "idle peer was never dropped"
            time.sleep(0.05)
        assert [c.id for c in running.handler.closed] == [first]
        assert running.server.connections == []
        # the same peer coming back gets a fresh connection
        assert _rpc(dealer, _req("whoami"))["result"]["id"] != first
    finally:
        running.stop()


def test_vanished_peer_is_dropped_when_its_reply_is_unroutable(
    srv: Running, ctx: zmq.Context[Any]
) -> None:
    dealer = _socket(ctx, zmq.DEALER, srv.server.router_endpoint)
    assert _rpc(dealer, _req("whoami"))["result"]
    dealer.send_multipart([b"", packb(_req("slow", {"seconds": 0.4}))])
    time.sleep(0.05)
    dealer.close(linger=0)
    deadline = time.monotonic() + 3
    while not srv.handler.closed:
        assert time.monotonic() < deadline, "unreachable peer was never dropped"
        time.sleep(0.05)
    assert srv.server.stats["replies_dropped"] == 1
    assert srv.server.connections == []


def test_message_size_limits(ctx: zmq.Context[Any]) -> None:
    running = Running("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", max_message_size=10_000)
    try:
        dealer = _socket(ctx, zmq.DEALER, running.server.router_endpoint)
        # above the payload limit but within the socket's slack: a typed error
        reply = _rpc(dealer, _req("echo", {"blob": "x" * 20_000}))
        assert reply["error"]["code"] == -32015
        # far above: libzmq drops the connection before anything is buffered
        dealer.send_multipart([b"", packb(_req("echo", {"blob": "x" * 500_000}))])
        assert not dealer.poll(300)
        other = _socket(ctx, zmq.DEALER, running.server.router_endpoint)
        assert _rpc(other, _req("echo", {"small": 1}))["result"] == {"small": 1}
    finally:
        running.stop()


def test_close_lets_running_requests_answer(ctx: zmq.Context[Any]) -> None:
    running = Running("tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
    dealer = _socket(ctx, zmq.DEALER, running.server.router_endpoint)
    dealer.send_multipart([b"", packb(_req("slow", {"seconds": 0.2}, id_="last"))])
    time.sleep(0.05)
    running.stop()
    assert unpackb(_recv(dealer)[-1]) == {"id": "last", "result": {"slept": 0.2}}
    assert len(running.handler.closed) == 1


READS = 4


def _refuses_connections(ipc_path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(ipc_path)
    except OSError:
        return True
    finally:
        probe.close()
    return False


def test_replies_queued_at_shutdown_still_reach_a_slow_reader(
        tmp_path: Path, ctx: zmq.Context[Any]) -> None:
    # The daemon closed its ROUTER with linger 0: a reply still queued when it shut down
    # (here 3 MB page reads, then the reply to `shutdown` behind them) was thrown away.
    daemon = DaemonProcess(tmp_path).start()
    info = daemon.info()
    with daemon.client("zmq") as c:
        sid = c.call("session/create", {})["sessionId"]
        c.call("messages/append", {"sessionId": sid, "messages": [
            {"role": "user", "content": "word " * 600_000}]})
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    # take in as little as it can before the test reads: the rest waits in the daemon
    dealer.setsockopt(zmq.RCVHWM, 1)
    dealer.setsockopt(zmq.RCVBUF, 64 * 1024)
    dealer.connect(info["zmq_router"])
    token = info["token"]
    for i in range(1, READS + 1):
        dealer.send_multipart([b"", packb({"id": i, "method": "archive/read", "token": token,
                                           "params": {"sessionId": sid}})])
    dealer.send_multipart([b"", packb({"id": "bye", "method": "shutdown", "token": token,
                                       "params": {}})])
    # read nothing until the daemon has closed its ROUTER (it takes no new connections)
    router_path = info["zmq_router"][len("ipc://"):]
    deadline = time.monotonic() + 60
    while not _refuses_connections(router_path):
        assert time.monotonic() < deadline, "the daemon did not shut down"
        time.sleep(0.02)
    replies = [unpackb(_recv(dealer, timeout=30)[-1]) for _ in range(READS + 1)]
    assert [r["id"] for r in replies] == [*range(1, READS + 1), "bye"]
    for r in replies[:-1]:
        assert len(r["result"]["messages"][0]["content"]) == 3_000_000
    assert replies[-1]["result"] == {}
    assert daemon.proc is not None and daemon.proc.wait(30) == 0
