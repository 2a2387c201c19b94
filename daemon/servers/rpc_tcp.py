"""JSON-RPC over TCP with Content-Length framing (as LSP): one `TcpConnection` per client."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
from collections import deque

from ctxd.daemon.servers.admission import Acceptor, bind_listener
from ctxd.daemon.servers.base import EventHub, RequestHandler
from ctxd.daemon.servers.rpc_core import (
    JsonRpcConnection,
    log,
)
from ctxd.daemon.servers.rpc_state import (
    BARE_LIMITS,
    DEFAULT_CLOSE_GRACE,
    ServerCore,
    WireLimits,
    peer_name,
    too_many_connections,
)
from ctxd.protocol.codec import FrameReader, dumps_json, error_response, frame
from ctxd.protocol.connection import format_hostport
from ctxd.protocol.errors import CtxdError

# how long a closing connection keeps reading (and dropping) what the client still sends
LINGER_SECONDS = 2.0
# "GET / HTTP/1.1", "POST http://host:port/ HTTP/1.1", "OPTIONS * HTTP/1.1": a method
# token in capitals, then a space. A frame header starts with a name and a colon.
_HTTP_METHOD = re.compile(rb"[A-Z]{1,16} ")
_CAPITALS = re.compile(rb"[A-Z]*")


class TcpConnection(JsonRpcConnection, asyncio.Protocol):
    """A JSON-RPC client over TCP with Content-Length framing."""

    wire = "jsonrpc-tcp"

    def __init__(self, core: ServerCore) -> None:
        JsonRpcConnection.__init__(self, core, "")
        self._transport: asyncio.Transport | None = None
        max_frame = core.preauth_max_frame if core.require_login else core.max_frame
        self._reader = FrameReader(max_frame)
        self._eof = False
        # the first bytes, until they tell whether this is an HTTP request
        self._sniff: bytes | None = b""
        # frames already read while too many requests run: started once some finish
        self._backlog: deque[bytes] = deque()
        # set while closing: input is drained until the client closes or this fires
        self._linger: asyncio.TimerHandle | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self.peer = peer_name(transport.get_extra_info("peername"))
        core = self._core
        core.gate.enter(self, self.abort)
        if core.closing or core.full():
            log.warning(
                "refusing %s: %d connections open (limit %d)",
                self.peer,
                len(core.clients),
                core.max_connections,
            )
            err = too_many_connections(core.max_connections)
            transport.write(frame(dumps_json(error_response(None, err))))
            self.closed = True
            transport.close()
            return
        self._open()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        if self._sniff is not None and self._is_http(data):
            # a browser's cross-site request: it gets nothing it could parse
            log.info("closing %r: an HTTP request on the JSON-RPC TCP port", self)
            self.abort()
            return
        limit = 1 if self._core.require_login and not self.authenticated else None
        try:
            bodies = self._reader.feed(data, max_bodies=limit)
        except CtxdError as err:
            # the stream cannot be resynchronised after a broken header: answer, then close
            log.warning("closing %r: %s", self, err.message)
            self._send_error(None, err)
            self.close()
            return
        self._backlog.extend(bodies)
        self._drain_backlog()

    def _is_http(self, data: bytes) -> bool:
        assert self._sniff is not None
        head = self._sniff + data[:32]
        if _HTTP_METHOD.match(head):
            return True
        if _CAPITALS.match(head).end() < min(len(head), 17):  # type: ignore[union-attr]
            self._sniff = None  # decided: not a request line
        else:
            self._sniff = head
        return False

    def _logged_in(self) -> None:
        # the stranger's frame limit no longer applies: parse what came after initialize
        self._reader.max_frame = self._core.max_frame
        try:
            self._backlog.extend(self._reader.feed(b""))
        except CtxdError as err:
            log.warning("closing %r: %s", self, err.message)
            self._send_error(None, err)
            self.close()

    def _drain_backlog(self) -> None:
        backlog = self._backlog
        while backlog and not self._input_paused and not self.closed:
            self.handle_message(backlog.popleft())

    def eof_received(self) -> bool:
        # the client half-closed: finish running requests and deliver their replies
        self._eof = True
        if self._inflight == 0 or self._linger is not None:
            return False
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            log.debug("%r lost: %s", self, exc)
        if self._linger is not None:
            self._linger.cancel()
        self._cleanup()

    # transport hooks

    def _pending_output(self) -> int:
        assert self._transport is not None
        return self._transport.get_write_buffer_size()

    def _write_message(self, body: bytes) -> None:
        assert self._transport is not None
        # one write per message: header and body in a single segment
        self._transport.write(frame(body))

    def _abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _pause_input(self) -> None:
        if self._transport is not None and not self._eof:
            self._transport.pause_reading()

    def _resume_input(self) -> None:
        self._drain_backlog()
        if self._input_paused:
            return  # the backlog filled the running requests up again
        if self._transport is not None and not self._eof and not self._transport.is_closing():
            self._transport.resume_reading()

    def _idle(self) -> None:
        if self._eof and self._transport is not None:
            self.close()

    def close(self) -> None:
        """Close after flushing what is already queued.

        The client may still be sending (a frame refused from its header, requests
        pipelined behind a refused one): a socket closed with unread input makes the
        kernel reset the connection, and the reset can destroy the error reply before
        the client reads it. So the output is followed by an end of stream, and what
        still comes in is read and dropped until the client closes too, for at most
        `LINGER_SECONDS`.
        """
        if self.closed and self._linger is not None:
            return
        self.closed = True
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if self._eof or not transport.can_write_eof():
            transport.close()
            return
        # a connection on its way out no longer holds a place in the quota before login
        self._core.gate.leave(self._gate_key)
        transport.write_eof()
        transport.resume_reading()
        self._linger = asyncio.get_running_loop().call_later(LINGER_SECONDS, transport.close)


class JsonRpcTcpServer:
    """A listening JSON-RPC TCP server; `endpoint` is what the connection file names."""

    wire = "jsonrpc-tcp"

    def __init__(
        self, server: asyncio.Server, acceptor: Acceptor, core: ServerCore, host: str
    ) -> None:
        self._server = server
        self._acceptor = acceptor
        self._core = core
        self.host = host
        name = server.sockets[0].getsockname()
        self.port: int = name[1] if isinstance(name, tuple) else 0
        # a Unix socket's endpoint is its path (removed again at close)
        self.unix_path: str | None = None if isinstance(name, tuple) else str(name)
        self.endpoint = self.unix_path or format_hostport(host, self.port)

    @property
    def connections(self) -> set[JsonRpcConnection]:
        return set(self._core.connections)

    async def close(self, grace: float = DEFAULT_CLOSE_GRACE) -> None:
        """Stop accepting, close every connection, let running requests finish briefly."""
        self._core.closing = True
        await self._acceptor.stop()
        self._server.close()
        for conn in list(self._core.connections):
            conn.close()
        await self._core.drain_tasks(grace)
        for conn in list(self._core.connections):
            conn._abort()
        await self._server.wait_closed()
        if self.unix_path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.unix_path)


async def start_tcp_server(
    handler: RequestHandler,
    hub: EventHub,
    host: str = "127.0.0.1",
    port: int = 0,
    limits: WireLimits = BARE_LIMITS,
) -> JsonRpcTcpServer:
    """Listen for Content-Length framed JSON-RPC on `host:port` (0 picks a free port)."""
    core = ServerCore(handler, hub, limits)
    loop = asyncio.get_running_loop()
    listener = bind_listener(host, port)
    # asyncio's server owns the socket (and closes it); the acceptor decides when to accept
    server = await loop.create_server(
        lambda: TcpConnection(core), sock=listener, start_serving=False
    )
    acceptor = Acceptor(listener, core.gate, lambda: TcpConnection(core), "JSON-RPC TCP")
    acceptor.start()
    out = JsonRpcTcpServer(server, acceptor, core, host)
    log.info("JSON-RPC over TCP on %s", out.endpoint)
    return out


async def start_unix_server(
    handler: RequestHandler, hub: EventHub, path: str, limits: WireLimits = BARE_LIMITS
) -> JsonRpcTcpServer:
    """The same framed JSON-RPC on a Unix socket (mode 0600, in the daemon's private
    runtime dir). Only this user can connect to it, so other local users can neither
    squat its login quota nor slow its logins; `ctxd stdio` prefers it. The same limits
    as the TCP wire, with a quota of its own."""
    core = ServerCore(handler, hub, limits)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen(128)
        listener.setblocking(False)
    except BaseException:
        listener.close()
        raise
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: TcpConnection(core), sock=listener, start_serving=False
    )
    acceptor = Acceptor(listener, core.gate, lambda: TcpConnection(core), "JSON-RPC Unix socket")
    acceptor.start()
    out = JsonRpcTcpServer(server, acceptor, core, "")
    log.info("JSON-RPC on the Unix socket %s", path)
    return out
