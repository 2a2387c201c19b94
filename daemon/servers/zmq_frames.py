"""ZeroMQ wire pieces shared by the server: the peer connection, envelopes, sends."""

from __future__ import annotations

import logging
import time
from typing import Any

import zmq
import zmq.asyncio

from ctxd.daemon.servers.base import Connection
from ctxd.protocol.codec import packb
from ctxd.protocol.envelope import error_reply
from ctxd.protocol.errors import CtxdError

log = logging.getLogger("ctxd.servers.zmq")


class ZmqConnection(Connection):
    """The daemon's view of one ROUTER peer (one client socket)."""

    wire = "zmq"

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


def send_now(sock: zmq.asyncio.Socket, frames: list[bytes]) -> None:
    """Send without waiting; raises `zmq.Again` when the queue is full.

    Goes through the asyncio socket rather than a plain shadow of it: ZeroMQ signals
    readiness on an edge-triggered fd, and a send can consume the edge of a message that
    arrived meanwhile. The asyncio socket re-checks for input after each send; a bare send
    would leave the pending receive asleep until the next message came in.
    A reply never waits for another in the socket's FIFO of blocked sends, because every
    send here is non-blocking, so a slow peer cannot hold up replies to anyone else.
    """
    fut = sock.send_multipart(frames, flags=zmq.NOBLOCK)
    if not fut.done():  # only if a blocking send were queued ahead of it
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        return
    exc = fut.exception()
    if exc is not None:
        raise exc


def error_payload(req_id: Any, err: CtxdError) -> bytes:
    try:
        return packb(error_reply(req_id, err, "zmq"))
    except Exception:
        # `data` held something msgpack cannot encode: keep the code and message.
        return packb(error_reply(req_id, err, "zmq", bare=True))


def endpoint_of(sock: zmq.asyncio.Socket) -> str:
    raw = sock.getsockopt(zmq.LAST_ENDPOINT)
    return raw.decode() if isinstance(raw, bytes) else str(raw)
