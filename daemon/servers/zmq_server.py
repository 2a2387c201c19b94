"""The ZeroMQ wire: msgpack requests on a ROUTER socket, session events on a PUB socket.

Requests are msgpack maps `{id, method, params, token}`; replies are `{id, result}` or
`{id, error: {code, message, data}}`, sent back with the routing envelope the request
came with, so REQ clients (empty delimiter frame) and DEALER clients (with or without a
delimiter) both work. ZeroMQ has no handshake, so every request carries the token.

Events go out on the PUB socket as `[b"session/<id>", msgpack {method, params}]`.
The PUB side is an XPUB socket so the daemon sees subscriptions: when a subscriber
subscribes to a topic starting with `probe/`, the server answers with one `$/probe`
message on that topic. Subscriptions travel in order on one connection, so once a
subscriber receives its probe, every subscription it made before is in effect: this is
how clients wait out ZeroMQ's slow-joiner problem without sleeping.

Over TCP (`curve_token`), both sockets are CURVE servers and a ZAP handler admits only
peers holding the client key derived from the token (`ctxd.protocol.auth`): a peer that
cannot complete the handshake never gets a request in or an event out, and one that does
not finish it within `handshake_timeout` seconds is disconnected. Over ipc the socket
files sit in the daemon's private runtime dir.

`initialize` is accepted without the token in the envelope when its params carry a
`proof` of the token: that is how a client checks the daemon (`nonceMac`) before it
sends the token or anything else.

Runs opened over ZeroMQ have a lease: a peer with open runs that sends nothing (no
request, no `heartbeat`) for `run_lease` seconds is dropped and its runs are interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from typing import Any

import zmq
import zmq.asyncio

from ctxd.daemon.servers.base import EventHub, RequestHandler
from ctxd.daemon.servers.zmq_auth import ZapHandler
from ctxd.daemon.servers.zmq_frames import (
    ZmqConnection,
    endpoint_of,
    error_payload,
    send_now,
    split_envelope,
)
from ctxd.protocol.auth import curve_server_keys
from ctxd.protocol.codec import DEFAULT_MAX_FRAME, packb, unpackb
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
        self._router: zmq.asyncio.Socket | None = None
        self._pub: zmq.asyncio.Socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._bg: list[asyncio.Task[None]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._slots: asyncio.Semaphore | None = None
        self._peers: dict[bytes, ZmqConnection] = {}
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

    # lifecycle

    async def start(self) -> None:
        if self._router is not None:
            raise RuntimeError("ZmqServer already started")
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        if self._ctx is None:
            self._ctx = zmq.asyncio.Context()
        ctx = self._ctx
        if self._curve_token is not None:
            self._zap = ZapHandler(ctx, self._curve_token, self.stats)
        router = ctx.socket(zmq.ROUTER)
        pub = ctx.socket(zmq.XPUB)
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
        self._slots = asyncio.Semaphore(self.max_inflight)
        if not self._sink_added:
            self.hub.add_sink(self.publish)
            self._sink_added = True
        self._bg = [
            asyncio.create_task(self._serve_requests(), name="zmq-router"),
            asyncio.create_task(self._serve_subscriptions(), name="zmq-xpub"),
            asyncio.create_task(self._reap_idle_peers(), name="zmq-reaper"),
        ]
        if self._zap is not None:
            self._bg.append(asyncio.create_task(self._zap.serve(), name="zmq-zap"))
        log.info("ZeroMQ wire on %s (events on %s)", self.router_endpoint, self.pub_endpoint)

    async def close(self, grace: float = 1.0) -> None:
        """Stop reading, give in-flight requests `grace` seconds to answer, then close."""
        if self._closed:
            return
        self._closed = True
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
        for conn in list(self._peers.values()):
            # A ZeroMQ client outlives the daemon (its socket reconnects to the next one),
            # so its runs stay open: the next daemon leases them until it comes back.
            conn.open_runs.clear()
            self._drop_peer(conn, "daemon closing")
        # Replies already queued (the one to `shutdown` among them) still go out to a peer
        # that reads them, for at most REPLY_LINGER_SECONDS; events are best effort.
        if self._router is not None:
            self._router.close(linger=int(REPLY_LINGER_SECONDS * 1000))
        if self._pub is not None:
            self._pub.close(linger=0)
        if self._zap is not None:
            self._zap.close()
        self._router = self._pub = self._zap = None
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
        return list(self._peers.values())

    # events

    def publish(self, session_id: str, method: str, params: dict[str, Any]) -> None:
        """Send one event to the session's subscribers; never blocks (drops at the HWM)."""
        if self._closed or self._pub is None:
            return
        if threading.get_ident() != self._loop_thread:
            # ZeroMQ sockets are not thread-safe: hop onto the loop that owns them.
            assert self._loop is not None
            try:
                self._loop.call_soon_threadsafe(self.publish, session_id, method, params)
            except RuntimeError:  # the loop is already closed: the server is gone
                self.stats["events_dropped"] += 1
            return
        try:
            payload = packb({"method": method, "params": params})
        except Exception:
            log.exception("event %s for session %s cannot be encoded", method, session_id)
            self.stats["events_dropped"] += 1
            return
        try:
            send_now(self._pub, [session_topic(session_id), payload])
        except zmq.Again:
            self.stats["events_dropped"] += 1
            log.warning("event queue full: dropped %s for session %s", method, session_id)
        except zmq.ZMQError as exc:
            self.stats["events_dropped"] += 1
            log.warning("could not publish %s: %s", method, exc)
        else:
            self.stats["events_published"] += 1

    async def _serve_subscriptions(self) -> None:
        """Answer `probe/...` subscriptions so subscribers know theirs are in effect."""
        assert self._pub is not None
        pub = self._pub
        while True:
            try:
                frames = await pub.recv_multipart()
            except zmq.ZMQError as exc:
                if exc.errno in (zmq.ETERM, zmq.ENOTSOCK):
                    return
                log.warning("XPUB receive failed: %s", exc)
                continue
            msg = frames[0] if frames else b""
            if len(msg) < 2 or msg[0] != 1 or not msg[1:].startswith(PROBE_PREFIX):
                continue
            topic = msg[1:]
            payload = packb({"method": PROBE_METHOD, "params": {"topic": topic.decode("latin-1")}})
            with contextlib.suppress(zmq.ZMQError):
                send_now(pub, [topic, payload])

    # requests

    async def _serve_requests(self) -> None:
        assert self._router is not None and self._slots is not None
        router = self._router
        while True:
            try:
                frames = await router.recv_multipart()
            except zmq.ZMQError as exc:
                if exc.errno in (zmq.ETERM, zmq.ENOTSOCK):
                    return
                log.warning("ROUTER receive failed: %s", exc)
                continue
            try:
                await self._accept(frames)
            except Exception:  # one bad message must never stop the server
                log.exception("unexpected failure handling a ZeroMQ message")

    async def _accept(self, frames: list[bytes]) -> None:
        """Validate one request synchronously, then run it as its own task.

        Tasks are created in arrival order and asyncio starts them in that order, so the
        handler's synchronous part sees each client's requests in the order they were sent.
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
        conn = self._peers.get(identity)
        if method == "initialize" and not self._token_ok(msg.get("token")):
            # Mutual authentication: the client proves the token in the params and waits
            # for the daemon's proof before sending the token. Answered on a connection of
            # its own; the peer is registered only once it sends the token.
            probe = ZmqConnection(identity)
            probe.inflight += 1
            await self._slots.acquire()
            self._start_task(self._run(probe, envelope, req_id, method, params))
            return
        if not self._token_ok(msg.get("token")):
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
            conn = self._open_peer(identity)
        conn.authenticated = True
        conn.last_seen = time.monotonic()
        conn.inflight += 1
        await self._slots.acquire()  # bounded: beyond this, back-pressure via RCVHWM
        self._start_task(self._run(conn, envelope, req_id, method, params))

    def _start_task(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _token_ok(self, token: Any) -> bool:
        if token is None:
            return False
        try:
            return bool(self.handler.check_token(token))
        except Exception:
            log.debug("token check raised", exc_info=True)
            return False

    async def _run(
        self, conn: ZmqConnection, envelope: list[bytes], req_id: Any, method: str, params: Any
    ) -> None:
        try:
            try:
                result = await self.handler.handle(conn, method, params)
                reply = packb({"id": req_id, "result": result})
            except CtxdError as err:
                self.stats["errors"] += 1
                reply = error_payload(req_id, err)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.stats["errors"] += 1
                log.exception("%s failed for %r", method, conn)
                reply = error_payload(
                    req_id,
                    InternalError(
                        f"internal error in {method}: {type(exc).__name__}; see the daemon log",
                    ),
                )
            conn.last_seen = time.monotonic()
            await self._send_reply(envelope, reply)
        finally:
            conn.inflight -= 1
            assert self._slots is not None
            self._slots.release()

    def _reply_error(self, envelope: list[bytes], req_id: Any, err: CtxdError) -> None:
        self.stats["errors"] += 1
        reply = error_payload(req_id, err)
        if not self._try_send(envelope, reply):
            task = asyncio.create_task(self._send_reply(envelope, reply))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _try_send(self, envelope: list[bytes], reply: bytes) -> bool:
        """Send now if possible. False: the peer's queue is full, try again later."""
        sock = self._router
        if sock is None:
            return True  # closing: nothing more to do
        try:
            send_now(sock, [*envelope, reply])
            return True
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            self.stats["replies_dropped"] += 1
            if exc.errno == zmq.EHOSTUNREACH:
                conn = self._peers.get(envelope[0])
                if conn is not None:
                    self._drop_peer(conn, "unreachable")
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

    # peers

    def _open_peer(self, identity: bytes) -> ZmqConnection:
        conn = ZmqConnection(identity)
        self._peers[identity] = conn
        self.hub.add_connection(conn)
        try:
            self.handler.connection_opened(conn)
        except Exception:
            log.exception("connection_opened failed for %r", conn)
        log.debug("new peer %r", conn)
        return conn

    def _drop_peer(self, conn: ZmqConnection, why: str) -> None:
        if self._peers.get(conn.identity) is conn:
            del self._peers[conn.identity]
        if conn.closed:
            return
        log.debug("dropping %r: %s", conn, why)
        conn.close()
        self.hub.remove_connection(conn)
        try:
            self.handler.connection_closed(conn)
        except Exception:
            log.exception("connection_closed failed for %r", conn)

    async def _reap_idle_peers(self) -> None:
        # ZeroMQ never says when a peer goes away, so peers silent for `idle_timeout`
        # (and with nothing in flight) are treated as gone; peers holding runs must show
        # they are alive within the shorter `run_lease`, or their runs are interrupted.
        period = max(0.05, min(self.idle_timeout / 4, self.run_lease / 4, 30.0))
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for conn in list(self._peers.values()):
                if conn.inflight:
                    continue
                if conn.open_runs and conn.last_seen < now - self.run_lease:
                    self.stats["runs_lease_expired"] += 1
                    self._drop_peer(
                        conn, f"silent for more than the run lease of {self.run_lease:g}s"
                    )
                elif conn.last_seen < now - self.idle_timeout:
                    self.stats["peers_reaped"] += 1
                    self._drop_peer(conn, f"idle for more than {self.idle_timeout:g}s")
