"""ZeroMQ wire pieces shared by the server: the peer connection, envelopes, sends."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import zmq

from ctxd.daemon.servers.base import Connection
from ctxd.protocol.codec import packb
from ctxd.protocol.envelope import error_reply
from ctxd.protocol.errors import CtxdError

log = logging.getLogger("ctxd.servers.zmq")


class ZmqConnection(Connection):
    """The daemon's view of one ROUTER peer (one client socket)."""

    wire = "zmq"
    pushes_events = False

    def __init__(self, identity: bytes) -> None:
        super().__init__(peer=f"zmq:{identity.hex()}")
        self.identity = identity
        self.last_seen = time.monotonic()
        self.inflight = 0

    def send_notification(self, method: str, params: dict[str, Any]) -> None:
        # Session events already reach ZeroMQ subscribers through the PUB socket (the
        # server is an EventHub sink and subscribers filter by topic); sending them again
        # per connection would deliver every event twice. A ROUTER cannot push to REQ
        # peers either, so there is no per-peer channel to use here.
        log.debug("%r: per-connection notification %s not sent over ZeroMQ", self, method)


def split_envelope(frames: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    """Routing frames (identities, then the empty delimiter if any) and the body.

    REQ sends `[identity, b"", body]`, a DEALER `[identity, body]` or `[identity, b"",
    body]`; a proxy may add identities. Replying with the same envelope suits them all.
    """
    for i in range(1, len(frames)):
        if not frames[i]:
            return frames[: i + 1], frames[i + 1 :]
    return frames[:1], frames[1:]


def send_now(sock: zmq.Socket[Any], frames: list[bytes], pump: SocketPump | None = None) -> None:
    """Send without waiting; raises `zmq.Again` when the queue is full.

    Every send here is non-blocking, so a reply never waits behind another and a slow
    peer cannot hold up replies to anyone else. ZeroMQ signals readiness on an
    edge-triggered fd, and a send can consume the edge of a message that arrived
    meanwhile: `pump` (the reader of the same socket) looks for input again afterwards.
    """
    try:
        sock.send_multipart(frames, flags=zmq.NOBLOCK)
    finally:
        if pump is not None:
            pump.recheck()


class SocketPump:
    """Reads a plain ZeroMQ socket on the event loop: no futures, no task per message.

    The loop watches the socket's fd; when it fires, up to `batch` messages are taken
    with non-blocking receives and handed to `on_message` one by one, then the loop
    serves everything else before the next batch (so one busy peer cannot starve the
    rest of the daemon). `pause()` stops reading (the peers' queues then fill up to the
    high-water mark), `resume()` starts again.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: zmq.Socket[Any],
        on_message: Callable[[list[bytes]], None],
        name: str,
        batch: int = 64,
    ) -> None:
        self._loop = loop
        self._sock = sock
        self._fd = sock.getsockopt(zmq.FD)
        self._on_message = on_message
        self._name = name
        self._batch = batch
        self._watching = False
        self._paused = False
        self._scheduled = False
        self._draining = False
        self._closed = False

    def start(self) -> None:
        self._watch()
        self.recheck()  # messages may have arrived before the fd was watched

    def _watch(self) -> None:
        if not self._watching and not self._closed:
            self._loop.add_reader(self._fd, self._drain)
            self._watching = True

    def _unwatch(self) -> None:
        if self._watching:
            self._loop.remove_reader(self._fd)
            self._watching = False

    def pause(self) -> None:
        # the fd stays readable while input waits: unwatched, or the loop would spin
        self._paused = True
        self._unwatch()

    def resume(self) -> None:
        if self._paused:
            self._paused = False
            self._watch()
            self.recheck()

    def recheck(self) -> None:
        """After a send or a pause: read again soon if input is waiting."""
        if self._scheduled or self._draining or self._paused or self._closed:
            return  # while draining, the next receive looks anyway
        try:
            ready = self._sock.getsockopt(zmq.EVENTS) & zmq.POLLIN
        except zmq.ZMQError:
            return
        if ready:
            self._scheduled = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._scheduled = False
        self._draining = True
        try:
            self._drain_batch()
        finally:
            self._draining = False

    def _drain_batch(self) -> None:
        sock = self._sock
        for _ in range(self._batch):
            if self._paused or self._closed:
                return
            try:
                # asking is several times cheaper than the exception of an empty receive,
                # and leaves the fd's edge as a receive would
                if not sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    return
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError as exc:
                if exc.errno in (zmq.ETERM, zmq.ENOTSOCK):
                    self.close()
                    return
                log.warning("%s receive failed: %s", self._name, exc)
                continue
            try:
                self._on_message(frames)
            except Exception:  # one bad message must never stop the server
                log.exception("unexpected failure handling a message on %s", self._name)
        # a full batch: more may be waiting, and the fd will not say so again
        if not self._scheduled and not self._paused and not self._closed:
            self._scheduled = True
            self._loop.call_soon(self._drain)

    def close(self) -> None:
        self._unwatch()
        self._closed = True


def error_payload(req_id: Any, err: CtxdError) -> bytes:
    try:
        return packb(error_reply(req_id, err, "zmq"))
    except Exception:
        # `data` held something msgpack cannot encode: keep the code and message.
        return packb(error_reply(req_id, err, "zmq", bare=True))


def endpoint_of(sock: zmq.Socket[Any]) -> str:
    raw = sock.getsockopt(zmq.LAST_ENDPOINT)
    return raw.decode() if isinstance(raw, bytes) else str(raw)
