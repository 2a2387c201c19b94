"""The ZeroMQ wire: msgpack requests on a ROUTER socket, session events on a PUB socket.

Requests are msgpack maps `{id, method, params, token}`; replies are `{id, result}` or
`{id, error: {code, message, data}}`, sent back with the routing envelope the request
came with, so REQ clients (empty delimiter frame) and DEALER clients (with or without a
delimiter) both work. ZeroMQ has no handshake, so every request carries the token.

Events go out on the PUB socket (`zmq_events`). Requests are read from a plain socket
on the event loop (`SocketPump`): a request whose handler answers synchronously (most
do) is answered on the spot, without a task or a future; the others run as tasks.

Over TCP (`curve_token`), both sockets are CURVE servers and a ZAP handler admits only
peers holding the client key derived from the token (`ctxd.protocol.auth`): a peer that
cannot complete the handshake never gets a request in or an event out, and one that does
not finish it within `handshake_timeout` seconds is disconnected. Over ipc the socket
files sit in the daemon's private runtime dir.

`initialize` is accepted without the token in the envelope when its params carry a
`proof` of the token: that is how a client checks the daemon (`nonceMac`) before it
sends the token or anything else.

Runs opened over ZeroMQ have a lease: a peer with open runs that sends nothing (no
request, no `heartbeat`) for `run_lease` seconds is dropped and its runs are interrupted
(`zmq_peers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import time
from typing import Any

import zmq
import zmq.asyncio

from ctxd.daemon.servers.base import EventHub, RequestHandler, now_or_later
from ctxd.daemon.servers.zmq_auth import ZapHandler
from ctxd.daemon.servers.zmq_events import EventPublisher, topic_session
from ctxd.daemon.servers.zmq_frames import (
    SocketPump,
    ZmqConnection,
    endpoint_of,
    error_payload,
    send_now,
    split_envelope,
)
from ctxd.daemon.servers.zmq_peers import PeerTable
from ctxd.protocol.auth import curve_server_keys
from ctxd.protocol.codec import DEFAULT_MAX_FRAME, unpackb
from ctxd.protocol.envelope import (  # noqa: F401 (the topics are part of this module's API)
    PROBE_METHOD,
    PROBE_PREFIX,
    SESSION_PREFIX,
    check_request,
    session_topic,
)
from ctxd.protocol.errors import (
    CtxdError,
    InternalError,
    InvalidRequest,
    Unauthorized,
)
from ctxd.protocol.large import pack_reply

log = logging.getLogger("ctxd.servers.zmq")

# Room for the envelope and the request's own keys on top of the payload limit.
_ENVELOPE_SLACK = 64 * 1024


# how long a clean close waits for queued replies to leave (then drops them)
REPLY_LINGER_SECONDS = 2.0

class ZmqServer:
    """Serves a `RequestHandler` over ZeroMQ and publishes `EventHub` events.

    `router_endpoint` / `pub_endpoint` are what to bind (`ipc://...` in the runtime dir
    by default, `tcp://127.0.0.1:0` for an ephemeral port); after `start()` the same
    attributes hold the endpoints actually bound (`LAST_ENDPOINT`).

    Bounds: `hwm` messages queued per peer each way on the ROUTER, `pub_hwm` events per
    subscriber. ZeroMQ counts messages, not bytes: a subscriber that stops reading can make
    the daemon hold `pub_hwm` times the event size (hence the modest default; lowering
    SNDHWM on open pipes is no remedy, as libzmq's lazy read accounting then stalls healthy
    pipes for good). `max_message_size` bytes per request
    (larger ones get -32015; far larger ones make libzmq drop the peer's connection),
    `max_inflight` requests running at once (then reading pauses and the peers' queues
    fill). A reply a peer does not take within `send_timeout` seconds is dropped; a peer
    silent for `idle_timeout` seconds with nothing running is forgotten
    (`connection_closed`). `stats` counts what was dropped.
    """

    def __init__(
        self,
        handler: RequestHandler,
        hub: EventHub,
        router_endpoint: str,
        pub_endpoint: str,
        *,
        context: zmq.asyncio.Context | None = None,
        hwm: int = 1000,
        pub_hwm: int = 1000,
        max_message_size: int = DEFAULT_MAX_FRAME,
        max_inflight: int = 1024,
        idle_timeout: float = 3600.0,
        send_timeout: float = 10.0,
        curve_token: str | None = None,
        run_lease: float = 30.0,
        handshake_timeout: float = 5.0,
    ) -> None:
        self.handler = handler
        self.hub = hub
        self.router_endpoint = router_endpoint
        self.pub_endpoint = pub_endpoint
        self.hwm = hwm
        self.pub_hwm = pub_hwm
        self.max_message_size = max_message_size
        self.max_inflight = max_inflight
        self.idle_timeout = idle_timeout
        self.send_timeout = send_timeout
        self.run_lease = run_lease
        self.handshake_timeout = handshake_timeout
        self._curve_token = curve_token
        self._zap: ZapHandler | None = None
        self._own_context = context is None
        self._ctx: zmq.asyncio.Context | None = context
        self._router: zmq.Socket[Any] | None = None
        self._pub: zmq.Socket[Any] | None = None
        self._pump: SocketPump | None = None
        self._events: EventPublisher | None = None
        self._bg: list[asyncio.Task[None]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        # requests running as tasks; at max_inflight reading pauses
        self._running = 0
        self._ipc_paths: list[str] = []
        self._sink_added = False
        self._closed = False
        self.stats: dict[str, int] = {
            "requests": 0,
            "errors": 0,
            "events_published": 0,
            "events_dropped": 0,
            "replies_dropped": 0,
            "peers_reaped": 0,
            "runs_lease_expired": 0,
            "zap_allowed": 0,
            "zap_denied": 0,
        }
        self._peers = PeerTable(handler, hub, self.stats)

    # lifecycle

    async def start(self) -> None:
        if self._router is not None:
            raise RuntimeError("ZmqServer already started")
        loop = asyncio.get_running_loop()
        if self._ctx is None:
            self._ctx = zmq.asyncio.Context()
        ctx = self._ctx
        if self._curve_token is not None:
            self._zap = ZapHandler(ctx, self._curve_token, self.stats)
        # plain sockets, read by a SocketPump: zmq.asyncio's futures cost more than the
        # request itself
        router: zmq.Socket[Any] = zmq.Socket(ctx, zmq.ROUTER)
        pub: zmq.Socket[Any] = zmq.Socket(ctx, zmq.XPUB)
        try:
            for sock in (router, pub):
                # a peer that does not complete the handshake in time is disconnected
                sock.setsockopt(zmq.HANDSHAKE_IVL, int(self.handshake_timeout * 1000))
                if self._curve_token is not None:
                    public, secret = curve_server_keys(self._curve_token)
                    sock.curve_server = True
                    sock.curve_publickey = public
                    sock.curve_secretkey = secret
                    sock.zap_domain = b"ctxd"
            # Without ROUTER_MANDATORY a reply to a vanished peer is silently dropped;
            # with it we get EHOSTUNREACH and can forget the peer.
            router.setsockopt(zmq.ROUTER_MANDATORY, 1)
            router.setsockopt(zmq.SNDHWM, self.hwm)
            router.setsockopt(zmq.RCVHWM, self.hwm)
            # libzmq drops the peer's connection on a larger message: the size check in
            # `unpackb` would come too late to protect memory.
            router.setsockopt(zmq.MAXMSGSIZE, self.max_message_size + _ENVELOPE_SLACK)
            router.setsockopt(zmq.LINGER, 0)
            pub.setsockopt(zmq.SNDHWM, self.pub_hwm)
            pub.setsockopt(zmq.LINGER, 0)
            # Subscription messages are small; refuse anything big on the XPUB side.
            pub.setsockopt(zmq.MAXMSGSIZE, 64 * 1024)
            router.bind(self.router_endpoint)
            pub.bind(self.pub_endpoint)
        except BaseException:
            router.close(linger=0)
            pub.close(linger=0)
            if self._zap is not None:
                self._zap.close()
                self._zap = None
            raise
        self._router, self._pub = router, pub
        self.router_endpoint = endpoint_of(router)
        self.pub_endpoint = endpoint_of(pub)
        self._ipc_paths = [
            ep[len("ipc://") :]
            for ep in (self.router_endpoint, self.pub_endpoint)
            if ep.startswith("ipc://") and not ep.startswith("ipc://@")
        ]
        self._events = EventPublisher(loop, pub, self.stats)
        self._events.on_topic = self._topic_changed
        self._pump = SocketPump(loop, router, self._accept, "ROUTER")
        if not self._sink_added:
            self.hub.add_sink(self.publish)
            self.hub.add_watcher(self.watches, self.watches_everything)
            self._sink_added = True
        self._pump.start()
        self._events.start()
        self._bg = [asyncio.create_task(
            self._peers.reap(self.idle_timeout, self.run_lease), name="zmq-reaper"
        )]
        if self._zap is not None:
            self._bg.append(asyncio.create_task(self._zap.serve(), name="zmq-zap"))
        log.info("ZeroMQ wire on %s (events on %s)", self.router_endpoint, self.pub_endpoint)

    async def close(self, grace: float = 1.0) -> None:
        """Stop reading, give in-flight requests `grace` seconds to answer, then close."""
        if self._closed:
            return
        self._closed = True
        if self._pump is not None:
            self._pump.close()
        if self._events is not None:
            self._events.close()
        for task in self._bg:
            task.cancel()
        for task in self._bg:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._bg = []
        if self._tasks:
            _done, pending = await asyncio.wait(set(self._tasks), timeout=grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=grace)
        for conn in list(self._peers.peers.values()):
            # A ZeroMQ client outlives the daemon (its socket reconnects to the next one),
            # so its runs stay open: the next daemon leases them until it comes back.
            conn.open_runs.clear()
            self._peers.drop(conn, "daemon closing")
        # Replies already queued (the one to `shutdown` among them) still go out to a peer
        # that reads them, for at most REPLY_LINGER_SECONDS; events are best effort.
        if self._router is not None:
            self._router.close(linger=int(REPLY_LINGER_SECONDS * 1000))
        if self._pub is not None:
            self._pub.close(linger=0)
        if self._zap is not None:
            self._zap.close()
        self._router = self._pub = self._zap = None
        self._pump = self._events = None
        if self._own_context and self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        # libzmq leaves the socket file behind; remove it so the next daemon's
        # connection file is the only thing pointing at this runtime dir.
        for path in self._ipc_paths:
            with contextlib.suppress(OSError):
                os.unlink(path)

    async def __aenter__(self) -> ZmqServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def connections(self) -> list[ZmqConnection]:
        return list(self._peers.peers.values())

    # events

    def publish(self, session_id: str, method: str, params: dict[str, Any]) -> None:
        """Send one event to the session's subscribers; never blocks (drops at the HWM)."""
        events = self._events
        if self._closed or events is None:
            return
        events.publish(session_id, method, params)

    def watches(self, session_id: str) -> bool:
        """Whether a ZeroMQ subscriber would receive the session's events now."""
        events = self._events
        return not self._closed and events is not None and events.watches(session_id)

    def watches_everything(self) -> bool:
        """Whether a ZeroMQ subscriber takes the events of many sessions (a prefix)."""
        events = self._events
        return not self._closed and events is not None and events.watches_everything()

    def _topic_changed(self, topic: bytes) -> None:
        self.hub.watch_changed(topic_session(topic))

    # requests

    def _accept(self, frames: list[bytes]) -> None:
        """Check one request and answer it, at once when its handler is synchronous.

        Otherwise it runs as a task; tasks start in the order they were created, and a
        peer's requests wait behind its requests still waiting for their task, so the
        handler sees each client's requests in the order they were sent.
        """
        if len(frames) < 2:
            return  # only an identity: nothing to answer
        envelope, body = split_envelope(frames)
        identity = frames[0]
        self.stats["requests"] += 1
        if len(body) != 1:
            self._reply_error(
                envelope,
                None,
                InvalidRequest(f"expected one msgpack frame after the envelope, got {len(body)}"),
            )
            return
        try:
            msg = unpackb(body[0], self.max_message_size)
        except CtxdError as err:
            self._reply_error(envelope, None, err)
            return
        try:
            req_id, method, params, _ = check_request(msg, "zmq")
        except CtxdError as err:
            self._reply_error(envelope, msg.get("id") if isinstance(msg, dict) else None, err)
            return
        token_ok = self._token_ok(msg.get("token"))
        if method == "initialize" and not token_ok:
            # Mutual authentication: the client proves the token in the params and waits
            # for the daemon's proof before sending the token. Answered on a connection of
            # its own; the peer is registered only once it sends the token.
            self._serve(ZmqConnection(identity), envelope, req_id, method, params)
            return
        conn = self._peers.get(identity)
        if not token_ok:
            if conn is not None:
                conn.authenticated = False
            self._reply_error(
                envelope,
                req_id,
                Unauthorized(
                    "missing or wrong token; read it from the daemon's connection file "
                    "and send it as 'token' in every request"
                ),
            )
            return
        if conn is None:
            # Peers that never authenticated never reach the handler, so a stream of
            # random identities cannot fill the connection table.
            conn = self._peers.open(identity)
        conn.authenticated = True
        conn.last_seen = time.monotonic()
        self._serve(conn, envelope, req_id, method, params)

    def _serve(
        self, conn: ZmqConnection, envelope: list[bytes], req_id: Any, method: str, params: Any
    ) -> None:
        try:
            result = now_or_later(self.handler, conn, method, params)
            if inspect.isawaitable(result):
                self._start_task(conn, envelope, req_id, method, result)
                return
            reply = pack_reply(req_id, result)
        except Exception as exc:
            reply = self._failure(conn, req_id, method, exc)
        conn.last_seen = time.monotonic()
        if not self._try_send(envelope, reply):
            self._start_send(envelope, reply)

    def _failure(self, conn: ZmqConnection, req_id: Any, method: str, exc: Exception) -> bytes:
        self.stats["errors"] += 1
        if isinstance(exc, CtxdError):
            return error_payload(req_id, exc)
        log.error("%s failed for %r", method, conn, exc_info=exc)
        return error_payload(
            req_id,
            InternalError(f"internal error in {method}: {type(exc).__name__}; see the daemon log"),
        )

    def _start_task(
        self,
        conn: ZmqConnection,
        envelope: list[bytes],
        req_id: Any,
        method: str,
        work: Any,
    ) -> None:
        # Until this task starts, the peer's next requests queue behind it (`work` may
        # not have begun: a coroutine of an async handler, or of `handle` itself).
        conn.inflight += 1
        conn.queued += 1
        self._running += 1
        if self._running >= self.max_inflight and self._pump is not None:
            # bounded: beyond this, back-pressure through the peers' RCVHWM
            self._pump.pause()
        started: list[bool] = []
        task = asyncio.create_task(self._run(conn, envelope, req_id, method, work, started))
        self._tasks.add(task)

        def done(task: asyncio.Task[None]) -> None:
            self._tasks.discard(task)
            if not started:  # cancelled before its first step
                conn.queued -= 1
                if inspect.iscoroutine(work):
                    work.close()
            conn.inflight -= 1
            self._running -= 1
            if self._running < self.max_inflight and self._pump is not None:
                self._pump.resume()

        task.add_done_callback(done)

    def _token_ok(self, token: Any) -> bool:
        if token is None:
            return False
        try:
            return bool(self.handler.check_token(token))
        except Exception:
            log.debug("token check raised", exc_info=True)
            return False

    async def _run(
        self,
        conn: ZmqConnection,
        envelope: list[bytes],
        req_id: Any,
        method: str,
        work: Any,
        started: list[bool],
    ) -> None:
        started.append(True)
        conn.queued -= 1
        try:
            result = await work
            reply = pack_reply(req_id, result)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            reply = self._failure(conn, req_id, method, exc)
        conn.last_seen = time.monotonic()
        await self._send_reply(envelope, reply)

    def _reply_error(self, envelope: list[bytes], req_id: Any, err: CtxdError) -> None:
        self.stats["errors"] += 1
        reply = error_payload(req_id, err)
        if not self._try_send(envelope, reply):
            self._start_send(envelope, reply)

    def _start_send(self, envelope: list[bytes], reply: bytes) -> None:
        task = asyncio.create_task(self._send_reply(envelope, reply))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _try_send(self, envelope: list[bytes], reply: bytes) -> bool:
        """Send now if possible. False: the peer's queue is full, try again later."""
        sock = self._router
        if sock is None:
            return True  # closing: nothing more to do
        try:
            send_now(sock, [*envelope, reply], self._pump)
            return True
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            self.stats["replies_dropped"] += 1
            if exc.errno == zmq.EHOSTUNREACH:
                conn = self._peers.get(envelope[0])
                if conn is not None:
                    self._peers.drop(conn, "unreachable")
            else:
                log.warning("reply not sent: %s", exc)
            return True

    async def _send_reply(self, envelope: list[bytes], reply: bytes) -> None:
        # A peer that stops reading fills its queue; wait for it a while without holding
        # up replies to anyone else, then give up on this one.
        deadline = time.monotonic() + self.send_timeout
        delay = 0.001
        while not self._try_send(envelope, reply):
            if time.monotonic() >= deadline:
                self.stats["replies_dropped"] += 1
                log.warning("peer %s is not reading replies; dropped one", envelope[0].hex())
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.1)
