"""Whether any client of a daemon watches a session (`EventHub.watched`, which decides
whether another daemon's event is read and relayed): the subscriptions of every wire,
followed through real sockets and the real client."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from ctxd.clients.client import connect
from ctxd.daemon.config import Config
from ctxd.daemon.dispatch import Dispatcher
from ctxd.daemon.engine import Engine
from ctxd.daemon.servers.base import EventHub
from ctxd.daemon.servers.jsonrpc import start_tcp_server, start_websocket_server
from ctxd.daemon.servers.zmq_server import ZmqServer
from ctxd.protocol.connection import write_connection_file
from ctxd.protocol.envelope import PROBE_PREFIX, SESSION_PREFIX, session_topic

TOKEN = "watch-token"


class Served:
    """The daemon's parts on an event loop thread, as `ctxd serve` wires them: an engine
    on a SQLite file, one hub, every wire, a connection file for the client."""

    def __init__(self, root: Path, short_dir: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.engine = Engine(Config(data_dir=root / "data"))
        self.hub = EventHub()
        self.engine.add_listener(self.hub.publish)
        self.dispatcher = Dispatcher(self.engine, self.hub, TOKEN, wires=["jsonrpc-tcp", "zmq"])
        self.tcp = self.run(start_tcp_server(self.dispatcher, self.hub, "127.0.0.1", 0))
        self.ws = self.run(start_websocket_server(self.dispatcher, self.hub, "127.0.0.1", 0))
        self.zmq = ZmqServer(self.dispatcher, self.hub, f"ipc://{short_dir}/router.sock",
                             f"ipc://{short_dir}/pub.sock")
        self.run(self.zmq.start())
        self.connection_file = root / "ctxd.json"
        write_connection_file(self.connection_file, {
            "pid": os.getpid(), "jsonrpc_tcp": self.tcp.endpoint, "websocket": self.ws.endpoint,
            "zmq_router": self.zmq.router_endpoint, "zmq_pub": self.zmq.pub_endpoint,
            "token": TOKEN, "data_dir": str(root / "data"),
        })

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def watched(self, session_id: str) -> bool:
        """Asked on the loop, as the relay asks it: the wires change it there."""
        async def ask() -> bool:
            return self.hub.watched(session_id)
        return bool(self.run(ask()))

    def client(self, wire: str) -> Any:
        return connect(connection_file=self.connection_file, wire=wire)  # type: ignore[arg-type]

    def close(self) -> None:
        for server in (self.tcp, self.ws, self.zmq):
            self.run(server.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
        self.engine.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    # ipc paths are limited to ~107 bytes; pytest's tmp_path can be long
    short_dir = tempfile.mkdtemp(prefix="ctxd-watch-", dir="/tmp")
    s = Served(tmp_path, short_dir)
    try:
        yield s
    finally:
        s.close()
        shutil.rmtree(short_dir, ignore_errors=True)


def until(pred: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Waits for a change that travels on its own (a SUB's unsubscription, a closed
    socket); the assertion is on the outcome."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.parametrize("wire", ["jsonrpc", "websocket", "zmq"])
def test_a_session_is_watched_while_a_client_subscribes(served: Served, wire: str) -> None:
    with served.client(wire) as one, served.client(wire) as two:
        sid = one.create_session()["sessionId"]
        other = one.create_session()["sessionId"]
        assert not served.watched(sid)
        one.subscribe(sid)  # returns once the subscription is in effect, on every wire
        assert served.watched(sid) and not served.watched(other)
        two.subscribe(sid)
        one.unsubscribe(sid)
        # one of two subscribers left: still watched (ZeroMQ's unsubscription may still
        # be on its way: it must not end the other's)
        two.subscribe(other)
        assert served.watched(other) and served.watched(sid)
        two.unsubscribe(sid)
        assert until(lambda: not served.watched(sid))
        assert served.watched(other)
    # the client is gone without unsubscribing
    assert until(lambda: not served.watched(other))


def _probe(sub: zmq.Socket[bytes]) -> None:
    """Every (un)subscription sent before this one is in effect at the daemon once the
    probe's answer arrives (they travel in order on the SUB's connection)."""
    topic = PROBE_PREFIX + os.urandom(8).hex().encode()
    sub.subscribe(topic)
    deadline = time.monotonic() + 10
    while True:
        assert sub.poll(int(max(0.0, deadline - time.monotonic()) * 1000)), "no probe answer"
        if sub.recv_multipart()[0] == topic:
            break
    sub.unsubscribe(topic)


def test_zeromq_prefix_subscriptions_watch_the_sessions_they_match(served: Served) -> None:
    """A SUB socket filters by prefix: `session/` (or nothing) is every session; a
    session's topic is only its own, not that of a session whose id it begins."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.connect(served.zmq.pub_endpoint)
        sub.subscribe(session_topic("ses_a1"))
        _probe(sub)
        assert served.watched("ses_a1")
        assert not served.watched("ses_a") and not served.watched("ses_b")
        sub.subscribe(SESSION_PREFIX)
        _probe(sub)
        assert served.watched("ses_b")
        sub.unsubscribe(SESSION_PREFIX)
        _probe(sub)
        assert not served.watched("ses_b") and served.watched("ses_a1")
        sub.subscribe(b"")
        _probe(sub)
        assert served.watched("ses_b")
        sub.close()
        assert until(lambda: not served.watched("ses_b") and not served.watched("ses_a1"))
    finally:
        ctx.destroy(linger=0)
