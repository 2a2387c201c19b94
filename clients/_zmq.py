"""Client side of the ZeroMQ wire: a DEALER for requests, a SUB for session events.

Slow joiners: a SUB subscription takes effect only once it has reached the daemon's
publisher, so events published right after `setsockopt(SUBSCRIBE)` can be missed. The
daemon publishes on an XPUB socket and answers every subscription to a `probe/<nonce>`
topic with one `$/probe` message on that topic. Subscriptions travel in order on the
SUB socket's connection, so `subscribe()` subscribes to the session's topic, then to a
fresh probe topic, and returns once the probe arrives: by then the session subscription
is in effect (this also covers a SUB socket still connecting). No sleeping, no guessing.

Trust: the token goes out only once `daemon_verified` is set, i.e. once the daemon has
answered `initialize` with a correct `nonceMac` (the client sends that `initialize` with
a proof of the token instead). Over TCP both sockets are CURVE clients with keys derived
from the token, so the handshake fails with anything but the daemon holding that token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio

from ctxd.protocol.auth import secure_client_socket
from ctxd.protocol.codec import DEFAULT_MAX_FRAME, packb, unpackb
from ctxd.protocol.envelope import (  # noqa: F401 (the topics are part of this module's API)
    PROBE_METHOD,
    PROBE_PREFIX,
    SESSION_PREFIX,
    session_topic,
)
from ctxd.protocol.errors import PayloadTooLarge, Unauthorized

log = logging.getLogger("ctxd.client")

_HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)

ReplySink = Callable[[dict[str, Any]], None]
NotificationSink = Callable[[str, dict[str, Any]], None]


class ZmqTransport:
    """Requests go out on a DEALER with an empty delimiter frame (the REQ framing, which
    proxies also understand); the daemon replies with the same envelope.

    `IMMEDIATE` keeps the DEALER from queueing requests for a daemon it is not connected
    to: a send then waits, and the client reports the daemon as unreachable instead of
    waiting for a reply that can never come.
    """

    wire = "zmq"

    def __init__(
        self,
        router_endpoint: str,
        pub_endpoint: str,
        token: str,
        *,
        on_reply: ReplySink,
        on_notification: NotificationSink,
        connect_timeout: float = 5.0,
        max_message_size: int = DEFAULT_MAX_FRAME,
        hwm: int = 10_000,
    ) -> None:
        self.router_endpoint = router_endpoint
        self.pub_endpoint = pub_endpoint
        self.endpoint = router_endpoint
        self._token = token
        self._on_reply = on_reply
        self._on_notification = on_notification
        self.connect_timeout = connect_timeout
        self.max_message_size = max_message_size
        self._hwm = hwm
        self._ctx: zmq.asyncio.Context | None = None
        self._dealer: zmq.asyncio.Socket | None = None
        self._sub: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._topics: set[bytes] = set()
        self._probes: dict[bytes, asyncio.Future[None]] = {}
        self._waiting_sends = 0
        # set by the client once the daemon proved it knows the token
        self.daemon_verified = False

    async def open(self) -> None:
        for endpoint in (self.router_endpoint, self.pub_endpoint):
            # For ipc a missing socket file is a certain "not running": say so at once.
            if endpoint.startswith("ipc://") and not endpoint.startswith("ipc://@"):
                path = endpoint[len("ipc://") :]
                if not os.path.exists(path):
                    raise ConnectionRefusedError(f"no ZeroMQ socket at {path}")
        ctx = zmq.asyncio.Context()
        dealer = ctx.socket(zmq.DEALER)
        sub = ctx.socket(zmq.SUB)
        self._ctx, self._dealer, self._sub = ctx, dealer, sub
        try:
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.setsockopt(zmq.IMMEDIATE, 1)
            dealer.setsockopt(zmq.SNDHWM, self._hwm)
            dealer.setsockopt(zmq.RCVHWM, self._hwm)
            sub.setsockopt(zmq.LINGER, 0)
            # Events are dropped by the publisher when this queue is full; keep it roomy.
            sub.setsockopt(zmq.RCVHWM, 100_000)
            curve = self.router_endpoint.startswith("tcp://")
            if curve:
                # the daemon admits only CURVE peers holding the token's key, and proves
                # its own key: nothing passes before both sides know the token
                for sock in (dealer, sub):
                    secure_client_socket(sock, self._token)
            await self._connect(dealer, curve)
            sub.connect(self.pub_endpoint)
        except BaseException:
            await self.close()
            raise
        self._tasks = [
            asyncio.create_task(self._read_replies(dealer), name="ctxd-zmq-replies"),
            asyncio.create_task(self._read_events(sub), name="ctxd-zmq-events"),
        ]

    async def _connect(self, dealer: zmq.asyncio.Socket, curve: bool) -> None:
        """Connect and wait for the handshake; with IMMEDIATE, POLLOUT means it completed.

        Over CURVE a failed handshake (a wrong token, or a server without the token's key)
        is told apart from no answer at all through the socket monitor."""
        monitor = dealer.get_monitor_socket(_HANDSHAKE_FAILED) if curve else None
        try:
            dealer.connect(self.router_endpoint)
            poller = zmq.asyncio.Poller()
            poller.register(dealer, zmq.POLLOUT)
            if monitor is not None:
                poller.register(monitor, zmq.POLLIN)
            ready = dict(await poller.poll(int(self.connect_timeout * 1000)))
            if monitor is not None and monitor in ready:
                raise Unauthorized(
                    f"the CURVE handshake with {self.router_endpoint} failed: the token does "
                    "not match the daemon listening there (or what listens is no ctxd "
                    "daemon); read the token from the daemon's connection file"
                )
            if dealer not in ready:
                raise ConnectionRefusedError(
                    f"no answer from {self.router_endpoint} within {self.connect_timeout:g}s"
                )
        finally:
            if monitor is not None:
                with contextlib.suppress(zmq.ZMQError):
                    dealer.disable_monitor()
                monitor.close(linger=0)

    async def send(self, req_id: int, method: str, params: Any) -> None:
        dealer = self._dealer
        if dealer is None:
            raise ConnectionError("the ZeroMQ transport is closed")
        msg = {"id": req_id, "method": method, "params": params}
        if self.daemon_verified:
            msg["token"] = self._token
        elif method != "initialize":
            raise ConnectionError("the daemon has not proven it knows the token yet")
        payload = packb(msg)
        if len(payload) > self.max_message_size:
            raise PayloadTooLarge(
                f"request of {len(payload)} bytes exceeds the limit of "
                f"{self.max_message_size}; send smaller batches"
            )
        frames = [b"", payload]
        if not self._waiting_sends:
            # With no send queued ahead, a non-blocking send completes on the spot.
            fut = dealer.send_multipart(frames, flags=zmq.NOBLOCK)
            exc = fut.exception() if fut.done() else None
            if exc is None:
                return
            if not isinstance(exc, zmq.Again):
                raise ConnectionError(f"cannot send to {self.router_endpoint}: {exc}")
        # Not connected (IMMEDIATE), or the queue is full: wait, but not for long.
        self._waiting_sends += 1
        try:
            async with asyncio.timeout(self.connect_timeout):
                await dealer.send_multipart(frames)
        except TimeoutError:
            raise ConnectionError(
                f"no connection to the daemon at {self.router_endpoint} for "
                f"{self.connect_timeout:g}s; is it running?"
            ) from None
        finally:
            self._waiting_sends -= 1

    async def subscribe(self, session_id: str, timeout: float) -> bool:
        """Subscribe to the session's events; True once the subscription is in effect."""
        sub = self._sub
        if sub is None:
            raise ConnectionError("the ZeroMQ transport is closed")
        topic = session_topic(session_id)
        if topic not in self._topics:
            sub.subscribe(topic)
            self._topics.add(topic)
        probe = PROBE_PREFIX + secrets.token_hex(8).encode()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._probes[probe] = waiter
        sub.subscribe(probe)
        try:
            await asyncio.wait_for(waiter, timeout)
            return True
        except TimeoutError:
            log.warning(
                "no subscription probe from %s within %gs; events of session %s sent "
                "right now may be missed",
                self.pub_endpoint,
                timeout,
                session_id,
            )
            return False
        finally:
            self._probes.pop(probe, None)
            if self._sub is not None:
                self._sub.unsubscribe(probe)

    async def unsubscribe(self, session_id: str) -> None:
        topic = session_topic(session_id)
        if topic in self._topics and self._sub is not None:
            self._sub.unsubscribe(topic)
            self._topics.discard(topic)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        for waiter in self._probes.values():
            if not waiter.done():
                waiter.cancel()
        for sock in (self._dealer, self._sub):
            if sock is not None:
                sock.close(linger=0)
        self._dealer = self._sub = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    async def _read_replies(self, dealer: zmq.asyncio.Socket) -> None:
        while True:
            frames = await dealer.recv_multipart()
            try:
                msg = unpackb(frames[-1], self.max_message_size)
            except Exception as exc:
                log.warning("undecodable reply from %s: %s", self.router_endpoint, exc)
                continue
            if isinstance(msg, dict):
                self._on_reply(msg)
            else:
                log.warning("reply from %s is not a map; ignored", self.router_endpoint)

    async def _read_events(self, sub: zmq.asyncio.Socket) -> None:
        while True:
            frames = await sub.recv_multipart()
            if len(frames) != 2:
                continue
            topic, payload = frames
            try:
                msg = unpackb(payload, self.max_message_size)
            except Exception as exc:
                log.warning("undecodable event on %r: %s", topic, exc)
                continue
            if not isinstance(msg, dict):
                continue
            if topic.startswith(PROBE_PREFIX):
                waiter = self._probes.get(topic)
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
                continue
            # ZeroMQ matches topic prefixes: "session/a" also receives "session/ab".
            if topic not in self._topics:
                continue
            method = msg.get("method")
            params = msg.get("params")
            if isinstance(method, str):
                self._on_notification(method, params if isinstance(params, dict) else {})
