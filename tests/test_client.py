"""The Python client on all three wires, against the daemon's transports and a test handler."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxd.clients.client import (
    AsyncClient,
    Client,
    DaemonNotRunning,
    connect,
    connect_async,
    find_daemon,
)
from ctxd.daemon.servers.base import Connection, EventHub
from ctxd.daemon.servers.jsonrpc import start_tcp_server, start_websocket_server
from ctxd.daemon.servers.zmq_server import ZmqServer
from ctxd.protocol import auth
from ctxd.protocol.connection import connection_file_for, write_connection_file
from ctxd.protocol.errors import (
    InternalError,
    MethodNotFound,
    PayloadTooLarge,
    SessionNotFound,
    Unauthorized,
)

TOKEN = "client-test-token"
WIRES = ["zmq", "jsonrpc", "websocket"]


class Handler:
    """Authenticates like the daemon (initialize on stream wires, token check on ZeroMQ)."""

    def __init__(self, hub: EventHub) -> None:
        self.hub = hub

    async def handle(self, conn: Connection, method: str, params: Any) -> Any:
        if method == "initialize":
            nonce = params.get("nonce")
            if not conn.authenticated and not (
                self.check_token(params.get("token"))
                or auth.check_client_proof(TOKEN, nonce, params.get("proof"))
            ):
                raise Unauthorized("wrong token")
            conn.authenticated = True
            conn.client_name = params.get("clientName")
            result = {"serverName": "ctxd", "protocolVersion": "1.0"}
            if nonce is not None:
                result["nonceMac"] = auth.daemon_proof(TOKEN, nonce)
            return result
        if not conn.authenticated:
            raise Unauthorized("send initialize first")
        if method == "echo":
            return params
        if method == "fail":
            sid = params.get("sessionId")
            raise SessionNotFound(f"no session {sid!r}", {"sessionId": sid})
        if method == "boom":
            raise RuntimeError("hidden")
        if method == "nope":
            raise MethodNotFound("unknown method 'nope'")
        if method == "slow":
            await asyncio.sleep(params["seconds"])
            return {"slept": params["seconds"]}
        if method == "emit":
            self.hub.publish(params["sessionId"], "test/event", params)
            return {}
        if method == "session/subscribe":
            if params["sessionId"] == "missing":
                raise SessionNotFound("no session 'missing'")
            conn.subscriptions.add(params["sessionId"])
            return {}
        if method == "session/unsubscribe":
            conn.subscriptions.discard(params["sessionId"])
            return {}
        # everything else reflects what arrived, to check the convenience methods
        return {"method": method, "params": params}

    def check_token(self, token: Any) -> bool:
        return token == TOKEN

    def connection_opened(self, conn: Connection) -> None:
        pass

    def connection_closed(self, conn: Connection) -> None:
        pass


class Daemon:
    """All three wires on one event loop thread, sharing one hub and handler."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.hub = EventHub()
        self.handler = Handler(self.hub)
        self.zmq, self.tcp, self.ws = self.run(self._start())
        self.info = {
            "pid": os.getpid(),
            "jsonrpc_tcp": self.tcp.endpoint,
            "websocket": self.ws.endpoint,
            "zmq_router": self.zmq.router_endpoint,
            "zmq_pub": self.zmq.pub_endpoint,
            "token": TOKEN,
            "data_dir": "/nonexistent",
            "version": "test",
        }

    async def _start(self) -> tuple[Any, Any, Any]:
        zmq_server = ZmqServer(
            self.handler, self.hub, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", curve_token=TOKEN
        )
        await zmq_server.start()
        tcp = await start_tcp_server(self.handler, self.hub)
        ws = await start_websocket_server(self.handler, self.hub)
        return zmq_server, tcp, ws

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        for server in (self.zmq, self.tcp, self.ws):
            self.run(server.close(grace=0.5))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    d = Daemon()
    yield d
    d.stop()


@pytest.fixture
def conn_file(daemon: Daemon, tmp_path: Path) -> Path:
    path = tmp_path / "daemon.json"
    write_connection_file(path, daemon.info)
    return path


@pytest.fixture(params=WIRES)
def wire(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def client(conn_file: Path, wire: str) -> Iterator[Client]:
    with connect(connection_file=conn_file, wire=wire, timeout=5) as c:  # type: ignore[arg-type]
        yield c


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _eventually(cond: Any, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


# discovery and connecting


def test_connect_through_connection_file(client: Client, wire: str) -> None:
    assert client.call("echo", {"text": "héllo 你好"}) == {"text": "héllo 你好"}
    assert client.call("echo") == {}
    # every wire starts with the mutual authentication handshake
    assert client.server_info is not None
    assert client.server_info["serverName"] == "ctxd"
    assert len(client.server_info["nonceMac"]) == 64


def test_connect_through_data_dir(
    daemon: Daemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CTXD_RUNTIME_DIR", str(tmp_path / "run"))
    data_dir = tmp_path / "data"
    write_connection_file(connection_file_for(data_dir), daemon.info)
    with connect(data_dir=data_dir, wire="jsonrpc") as c:
        assert c.call("echo", {"a": 1}) == {"a": 1}
    # and with neither argument: the default data dir, here from the environment
    monkeypatch.setenv("CTXD_DATA_DIR", str(data_dir))
    path, info = find_daemon()
    assert path == connection_file_for(data_dir)
    assert info["token"] == TOKEN
    with connect(wire="zmq") as c:
        assert c.call("echo", {"b": 2}) == {"b": 2}


def test_missing_connection_file(tmp_path: Path) -> None:
    with pytest.raises(DaemonNotRunning, match="does not exist.*ctxd serve"):
        connect(connection_file=tmp_path / "nope.json")


def test_stale_connection_file(daemon: Daemon, tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    path = tmp_path / "stale.json"
    write_connection_file(path, {**daemon.info, "pid": proc.pid})
    with pytest.raises(DaemonNotRunning, match=f"pid {proc.pid}.*not running"):
        connect(connection_file=path)


@pytest.mark.parametrize("wire", WIRES)
def test_nothing_listening(daemon: Daemon, tmp_path: Path, wire: str) -> None:
    port = _free_port()
    info = {
        **daemon.info,
        "jsonrpc_tcp": f"127.0.0.1:{port}",
        "websocket": f"ws://127.0.0.1:{port}",
        "zmq_router": f"tcp://127.0.0.1:{port}",
        "zmq_pub": f"tcp://127.0.0.1:{port}",
    }
    path = tmp_path / "dead.json"
    write_connection_file(path, info)
    start = time.monotonic()
    with pytest.raises(DaemonNotRunning, match="is it running"):
        connect(connection_file=path, wire=wire, connect_timeout=0.5)  # type: ignore[arg-type]
    assert time.monotonic() - start < 3


def test_missing_ipc_socket(daemon: Daemon, tmp_path: Path) -> None:
    info = {**daemon.info, "zmq_router": f"ipc://{tmp_path}/r.sock"}
    with pytest.raises(DaemonNotRunning, match="no ZeroMQ socket"):
        Client(info, "zmq").open()


def test_wire_not_served(daemon: Daemon) -> None:
    with pytest.raises(DaemonNotRunning, match="does not serve the websocket wire"):
        Client({**daemon.info, "websocket": None}, "websocket").open()
    with pytest.raises(ValueError, match="unknown wire"):
        Client(daemon.info, "grpc")  # type: ignore[arg-type]


@pytest.mark.parametrize("wire", WIRES)
def test_wrong_token(daemon: Daemon, wire: str) -> None:
    info = {**daemon.info, "token": "wrong"}
    # on ZeroMQ over TCP the daemon refuses the CURVE key derived from a wrong token
    with pytest.raises(Unauthorized):
        Client(info, wire).open()  # type: ignore[arg-type]


# calls and errors


def test_typed_errors(client: Client) -> None:
    with pytest.raises(SessionNotFound) as info:
        client.call("fail", {"sessionId": "s-1"})
    assert info.value.data == {"sessionId": "s-1"}
    assert info.value.message == "no session 's-1'"
    with pytest.raises(MethodNotFound):
        client.call("nope")
    with pytest.raises(InternalError) as internal:
        client.call("boom")
    assert "hidden" not in str(internal.value)
    assert client.call("echo", {"after": "errors"}) == {"after": "errors"}


def test_convenience_methods_send_protocol_names(client: Client) -> None:
    assert client.create_session(title="t") == {
        "method": "session/create",
        "params": {"title": "t"},
    }
    assert client.append("s", [{"role": "user", "content": "hi"}], client_batch_id="b1") == {
        "method": "messages/append",
        "params": {
            "sessionId": "s",
            "messages": [{"role": "user", "content": "hi"}],
            "clientBatchId": "b1",
        },
    }
    assert client.search("needle", session_id="s", limit=5, newestFirst=True)["params"] == {
        "query": "needle",
        "sessionId": "s",
        "limit": 5,
        "newestFirst": True,
    }
    assert client.compact("s", force=True)["params"] == {"sessionId": "s", "force": True}
    assert client.context_get("s")["method"] == "context/get"
    assert client.remove_pin("s", "p1")["params"] == {"sessionId": "s", "pinId": "p1"}
    assert client.finish_run("r1", "completed")["params"] == {
        "runId": "r1",
        "outcome": "completed",
    }
    assert client.list_tools() == {"method": "tools/list", "params": {}}


def test_threads_share_one_client(client: Client) -> None:
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for i in range(40):
                if i % 10 == 0:
                    assert client.call("slow", {"seconds": 0.01}) == {"slept": 0.01}
                payload = {"thread": t, "i": i, "pad": "x" * (i * 37)}
                assert client.call("echo", payload) == payload
        except BaseException as exc:  # reported in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert errors == []


def test_timeout_then_late_reply_is_ignored(client: Client) -> None:
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="no reply to slow"):
        client.call("slow", {"seconds": 0.5}, timeout=0.1)
    assert time.monotonic() - start < 0.4
    time.sleep(0.6)  # the late reply arrives and must not confuse the next call
    assert client.call("echo", {"next": True}) == {"next": True}


def test_payload_limit_is_checked_before_sending(daemon: Daemon, wire: str) -> None:
    with Client(daemon.info, wire, max_message_size=1000) as c:  # type: ignore[arg-type]
        with pytest.raises(PayloadTooLarge):
            c.call("echo", {"blob": "x" * 2000})
        assert c.call("echo", {"small": 1}) == {"small": 1}


def test_closed_client(daemon: Daemon, wire: str) -> None:
    c = Client(daemon.info, wire)  # type: ignore[arg-type]
    with pytest.raises(ConnectionError, match="not open"):
        c.call("echo")
    c.open()
    c.close()
    c.close()  # idempotent
    with pytest.raises(ConnectionError):
        c.call("echo")


def test_async_replies_matched_by_id(daemon: Daemon, wire: str) -> None:
    async def main() -> None:
        async with AsyncClient(daemon.info, wire) as c:  # type: ignore[arg-type]
            done: list[str] = []

            async def tagged(name: str, method: str, params: dict[str, Any]) -> Any:
                result = await c.call(method, params)
                done.append(name)
                return result

            results = await asyncio.gather(
                tagged("slow", "slow", {"seconds": 0.3}),
                *(tagged(f"fast{i}", "echo", {"i": i}) for i in range(50)),
            )
            assert results[0] == {"slept": 0.3}
            assert results[1:] == [{"i": i} for i in range(50)]
            assert done[-1] == "slow"  # answered last, yet matched to the right await

    asyncio.run(main())


def test_connection_lost_fails_pending_calls() -> None:
    daemon = Daemon()
    try:
        with Client(daemon.info, "jsonrpc", timeout=5) as c:
            errors: list[BaseException] = []

            def pending() -> None:
                try:
                    c.call("slow", {"seconds": 3})
                except BaseException as exc:
                    errors.append(exc)

            stream = c.notifications(timeout=5)
            th = threading.Thread(target=pending)
            th.start()
            time.sleep(0.2)
            daemon.run(daemon.tcp.close(grace=0))
            th.join(5)
            assert len(errors) == 1 and isinstance(errors[0], ConnectionError)
            assert not isinstance(errors[0], TimeoutError)
            with pytest.raises(ConnectionError, match="closed the connection"):
                c.call("echo")
            assert list(stream) == []  # the iterator ends instead of waiting
            assert c.closed
    finally:
        daemon.stop()


def test_zmq_daemon_gone_fails_fast() -> None:
    daemon = Daemon()
    try:
        with Client(daemon.info, "zmq", timeout=30, connect_timeout=0.5) as c:
            assert c.call("echo", {"up": True}) == {"up": True}
            daemon.run(daemon.zmq.close(grace=0))
            time.sleep(0.2)  # let the connection drop
            start = time.monotonic()
            with pytest.raises(ConnectionError, match="is it running"):
                c.call("echo")
            assert time.monotonic() - start < 3, "should not wait out the 30 s call timeout"
    finally:
        daemon.stop()


@pytest.mark.parametrize("waiting_for", ["reply", "send"])
def test_close_fails_waiting_calls_with_connection_error(waiting_for: str) -> None:
    daemon = Daemon()
    try:
        c = Client(daemon.info, "zmq", timeout=30, connect_timeout=30)
        c.open()
        if waiting_for == "send":
            # daemon gone: the request waits for a connection to hand it to
            daemon.run(daemon.zmq.close(grace=0))
            time.sleep(0.2)
        raised: list[BaseException] = []

        def call() -> None:
            try:
                c.call("slow", {"seconds": 5})
            except BaseException as exc:
                raised.append(exc)

        threads = [threading.Thread(target=call) for _ in range(3)]
        for th in threads:
            th.start()
        time.sleep(0.3)
        c.close()
        for th in threads:
            th.join(5)
        assert len(raised) == 3
        assert all(type(exc) is ConnectionError for exc in raised), raised
    finally:
        daemon.stop()


# notifications


def test_notifications_to_callback_and_iterator(client: Client, wire: str) -> None:
    got: list[tuple[str, dict[str, Any]]] = []
    remove = client.on_notification(lambda m, p: got.append((m, p)))
    stream = client.notifications(timeout=3)
    # many fresh subscriptions, each used at once: on ZeroMQ every one must already be in
    # effect when subscribe() returns (slow joiners)
    for i in range(15):
        sid = f"{wire}-s{i}"
        assert client.subscribe(sid) == {}
        client.call("emit", {"sessionId": sid, "i": i})
    expected = [("test/event", {"sessionId": f"{wire}-s{i}", "i": i}) for i in range(15)]
    assert [next(stream) for _ in range(15)] == expected
    _eventually(lambda: len(got) == 15)
    assert got == expected
    remove()
    client.call("emit", {"sessionId": f"{wire}-s0", "i": 99})
    assert next(stream) == ("test/event", {"sessionId": f"{wire}-s0", "i": 99})
    assert len(got) == 15
    stream.close()


def test_callback_registered_before_open(daemon: Daemon, wire: str) -> None:
    c = Client(daemon.info, wire)  # type: ignore[arg-type]
    got: list[str] = []
    c.on_notification(lambda m, p: got.append(p["sessionId"]))
    stream = c.notifications(timeout=3)
    with c:
        c.subscribe("early")
        c.call("emit", {"sessionId": "early"})
        assert next(stream)[1] == {"sessionId": "early"}
        _eventually(lambda: got == ["early"])


def test_unsubscribe_stops_events(client: Client, wire: str) -> None:
    stream = client.notifications(timeout=0.3)
    client.subscribe(f"{wire}-u")
    client.unsubscribe(f"{wire}-u")
    client.call("emit", {"sessionId": f"{wire}-u"})
    assert list(stream) == []


def test_subscribe_unknown_session(client: Client) -> None:
    with pytest.raises(SessionNotFound):
        client.subscribe("missing")


def test_zmq_topics_are_matched_exactly(daemon: Daemon) -> None:
    with Client(daemon.info, "zmq") as client:
        stream = client.notifications(timeout=0.5)
        client.subscribe("ab")
        client.call("emit", {"sessionId": "abc"})  # "session/ab" is a prefix of "session/abc"
        client.call("emit", {"sessionId": "ab"})
        assert list(stream) == [("test/event", {"sessionId": "ab"})]


def test_callback_cannot_call_back(client: Client) -> None:
    seen: list[BaseException] = []

    def callback(method: str, params: dict[str, Any]) -> None:
        try:
            client.call("echo")
        except RuntimeError as exc:
            seen.append(exc)

    client.on_notification(callback)
    client.subscribe("cb")
    client.call("emit", {"sessionId": "cb"})
    _eventually(lambda: len(seen) == 1)
    assert "notification callback" in str(seen[0])


def test_async_notification_iterator(daemon: Daemon, conn_file: Path, wire: str) -> None:
    async def main() -> None:
        c = await connect_async(connection_file=conn_file, wire=wire)  # type: ignore[arg-type]
        async with c:
            callback_got: list[str] = []
            c.on_notification(lambda m, p: callback_got.append(p["sessionId"]))
            await c.subscribe("a1")
            stream = c.notifications()
            for i in range(3):
                await c.call("emit", {"sessionId": "a1", "i": i})
            received = []
            async for method, params in stream:
                received.append((method, params["i"]))
                if len(received) == 3:
                    break
            assert received == [("test/event", 0), ("test/event", 1), ("test/event", 2)]
            assert callback_got == ["a1"] * 3
            assert c.subscriptions == frozenset({"a1"})
            ending = c.notifications()
        # closing the client ends every iterator
        assert [item async for item in ending] == []

    asyncio.run(asyncio.wait_for(main(), 20))


def test_async_iterator_bounded(daemon: Daemon) -> None:
    async def main() -> None:
        async with AsyncClient(daemon.info, "jsonrpc") as c:
            stream = c.notifications(maxsize=2)
            await c.subscribe("b1")
            for i in range(5):
                await c.call("emit", {"sessionId": "b1", "i": i})
            assert [(await stream.next(1))[1]["i"] for _ in range(2)] == [3, 4]
            assert stream.dropped == 3

    asyncio.run(asyncio.wait_for(main(), 20))
