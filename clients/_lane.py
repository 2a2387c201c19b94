"""A blocking `Client`'s direct line to the daemon: one call at a time, on the caller's thread.

Handing a call to the client's I/O thread costs two thread switches and several event
loop turns, more than the daemon spends on most requests. So a `Client` also keeps a
lane: a socket of its own (a DEALER on ZeroMQ, a logged-in TCP connection on JSON-RPC)
that a calling thread uses directly when no other thread holds it, sending and waiting
for the reply itself. Calls made while the lane is busy, subscriptions (their events
come to the I/O thread's connection) and everything on the WebSocket wire still go
through the I/O thread.

A lane only ever has one request in flight; a reply with another id is the late answer
to a call that timed out, and is skipped. Waits are cut into short slices so that
closing the client ends a wait within `_SLICE` seconds.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time
from typing import Any

import zmq

from ctxd.clients._jsonrpc import _encode
from ctxd.protocol import auth
from ctxd.protocol.codec import FrameReader, frame, loads_json, packb, unpackb
from ctxd.protocol.connection import split_endpoint
from ctxd.protocol.errors import InternalError, PayloadTooLarge, error_from_dict

# the longest a lane waits without looking whether the client is closing
_SLICE = 0.1
# methods that change what the connection is sent: they belong to the I/O thread's one
VIA_IO_THREAD = frozenset({"initialize", "session/subscribe", "session/unsubscribe"})


class NotSent(Exception):
    """The lane could not take the request (not connected); nothing went out."""


class Lane:
    """What both wires' lanes share: the lock, the ids, the reply, closing."""

    endpoint: str

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._ids = itertools.count(1)
        self.closing = False
        # set once the connection is gone: every later call fails the same way
        self.lost: ConnectionError | None = None
        self.last_used = time.monotonic()

    def call(self, method: str, params: Any, timeout: float) -> Any:
        """Send one request and wait for its reply; the caller holds `lock`."""
        req_id = next(self._ids)
        deadline = time.monotonic() + timeout
        self._send(req_id, method, params)
        self.last_used = time.monotonic()
        while True:
            if self.closing:
                raise ConnectionError("the client was closed")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"no reply to {method} from {self.endpoint} within {timeout:g}s; "
                    "the daemon may be overloaded or gone"
                )
            msg = self._receive(min(left, _SLICE))
            if not isinstance(msg, dict) or msg.get("id") != req_id:
                continue  # nothing yet, or a late reply to a call that timed out
            self.last_used = time.monotonic()
            err = msg.get("error")
            if err is not None:
                raise (
                    error_from_dict(err)
                    if isinstance(err, dict)
                    else InternalError(f"malformed error from the daemon: {err!r}")
                )
            return msg.get("result")

    def _send(self, req_id: int, method: str, params: Any) -> None:
        raise NotImplementedError

    def _receive(self, wait: float) -> Any:
        """One decoded message, or None when none came within `wait` seconds."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class ZmqLane(Lane):
    """A DEALER of its own; the token travels in every request, as on the main socket."""

    def __init__(
        self,
        ctx: zmq.Context[Any],
        endpoint: str,
        token: str,
        *,
        connect_timeout: float,
        max_message_size: int,
    ) -> None:
        super().__init__()
        self.endpoint = endpoint
        self._token = token
        self.max_message_size = max_message_size
        sock: zmq.Socket[Any] = zmq.Socket(ctx, zmq.DEALER)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.IMMEDIATE, 1)
            if endpoint.startswith("tcp://"):
                auth.secure_client_socket(sock, token)
            sock.connect(endpoint)
            # with IMMEDIATE, writable means connected (and over CURVE, handshaken)
            if not sock.poll(int(connect_timeout * 1000), zmq.POLLOUT):
                raise ConnectionError(f"no answer from {endpoint}")
        except BaseException:
            sock.close(linger=0)
            raise
        self._sock = sock
        self._poll = [(sock, zmq.POLLIN)]

    def _send(self, req_id: int, method: str, params: Any) -> None:
        payload = packb({"id": req_id, "method": method, "params": params, "token": self._token})
        if len(payload) > self.max_message_size:
            raise PayloadTooLarge(
                f"request of {len(payload)} bytes exceeds the limit of "
                f"{self.max_message_size}; send smaller batches"
            )
        try:
            self._sock.send_multipart([b"", payload], flags=zmq.NOBLOCK)
        except zmq.Again:
            raise NotSent from None  # no connection (IMMEDIATE): the I/O thread waits for one

    def _receive(self, wait: float) -> Any:
        if not zmq.zmq_poll(self._poll, int(wait * 1000) or 1):
            return None
        frames = self._sock.recv_multipart(zmq.NOBLOCK)
        try:
            return unpackb(frames[-1], self.max_message_size)
        except Exception:
            return None

    def heartbeat(self, timeout: float) -> None:
        """Renew the lease of runs opened through the lane, unless a call is on it."""
        if not self.lock.acquire(blocking=False):
            return  # a call in flight renews it
        try:
            if not self.closing and self.lost is None:
                self.call("heartbeat", {}, timeout)
        except Exception:  # a lost daemon is reported by the calls that fail
            pass
        finally:
            self.lock.release()

    def close(self) -> None:
        self._sock.close(linger=0)


class TcpLane(Lane):
    """A JSON-RPC TCP connection of its own, logged in as the main one is (a proof of
    the token, the daemon's proof checked before anything else is sent)."""

    def __init__(
        self, address: str, token: str, *, connect_timeout: float, max_frame: int
    ) -> None:
        super().__init__()
        self.endpoint = address
        self.max_frame = max_frame
        self._reader = FrameReader(max_frame)
        self._pending: list[bytes] = []
        if address.startswith("/"):  # the daemon's JSON-RPC Unix socket
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(connect_timeout)
            try:
                sock.connect(address)
            except BaseException:
                sock.close()
                raise
        else:
            host, port = split_endpoint(address)
            sock = socket.create_connection((host, port), timeout=connect_timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self._sock = sock
            nonce = auth.new_nonce()
            params = {"nonce": nonce, "proof": auth.client_proof(token, nonce),
                      "clientName": "ctxd-python-lane"}
            info = self.call("initialize", params, max(connect_timeout, 1.0))
            mac = info.get("nonceMac") if isinstance(info, dict) else None
            if not auth.check_daemon_proof(token, nonce, mac):
                raise ConnectionError(f"{address} did not prove it knows the token")
            sock.settimeout(_SLICE)
        except BaseException:
            sock.close()
            raise

    def _send(self, req_id: int, method: str, params: Any) -> None:
        body = frame(_encode(req_id, method, params, self.max_frame))
        try:
            self._sock.sendall(body)
        except OSError as exc:
            self.lost = ConnectionError(f"the daemon at {self.endpoint} closed the connection")
            raise self.lost from exc

    def _receive(self, wait: float) -> Any:
        while not self._pending:
            try:
                data = self._sock.recv(256 * 1024)
            except (TimeoutError, BlockingIOError):
                return None
            except OSError as exc:
                self.lost = ConnectionError(
                    f"the daemon at {self.endpoint} closed the connection ({exc})"
                )
                raise self.lost from None
            if not data:
                self.lost = ConnectionError(
                    f"the daemon at {self.endpoint} closed the connection"
                )
                raise self.lost
            self._pending.extend(self._reader.feed(data))
        body = self._pending.pop(0)
        try:
            return loads_json(body)
        except Exception:
            return None

    def close(self) -> None:
        self._sock.close()
