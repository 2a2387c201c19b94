"""JSON-RPC over WebSocket (one message per frame), on the `websockets` library.

The library's `serve()` accepts whenever the socket is readable; the daemon needs its
own accept loop (`admission.Acceptor`) so that a full quota of connections that have
not logged in stops accepting. So the library's server is created without serving
(`start_serving=False`) and the connection factory it gave asyncio is handed to the
acceptor: the library still does the handshake and the framing.

HTTP requests arrive in `JsonRpcWebSocketServer._process_request`: more than one
Origin header is a bad request, then the web page (`web.py`) answers plain GETs and
vets browsers, then the origin check and the connection quota.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import Iterable
from http import HTTPStatus

from websockets.asyncio.server import Server as WsServer
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.http11 import Request, Response

from ctxd.daemon.servers.admission import Acceptor, bind_listener
from ctxd.daemon.servers.base import EventHub, RequestHandler
from ctxd.daemon.servers.rpc_core import (
    JsonRpcConnection,
    log,
)
from ctxd.daemon.servers.rpc_state import (
    _CLOSE_FLUSH_TIMEOUT,
    BARE_LIMITS,
    DEFAULT_CLOSE_GRACE,
    ServerCore,
    WireLimits,
    peer_name,
    too_many_connections,
)
from ctxd.daemon.servers.web import PageServer
from ctxd.protocol.codec import dumps_json, error_response
from ctxd.protocol.connection import format_hostport

# the opening handshake must be done by then (by the login deadline when there is one;
# that deadline starts again after the handshake)
HANDSHAKE_TIMEOUT = 5.0
# a subscriber that stops reading is closed with this code: "try again later", so the
# client reconnects and catches up from the archive instead of missing events silently
SLOW_CONSUMER_CLOSE = CloseCode.TRY_AGAIN_LATER
SLOW_CONSUMER_REASON = "output backlog: reconnect and catch up with archive/read"
# how long the close frame waits behind the unread output for a stalled client to
# resume reading (the output is bounded by max_queue_bytes)
SLOW_CONSUMER_GRACE = 60.0


class _Transport(ServerConnection):
    """A TCP connection of the WebSocket wire, from accept to close: it holds a place
    in the quota of connections before login, the handshake included."""

    core: ServerCore

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.core.gate.enter(self, transport.abort)  # type: ignore[attr-defined]
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.core.gate.leave(self)
        super().connection_lost(exc)


class WebSocketConnection(JsonRpcConnection):
    """A JSON-RPC client over WebSocket: one message per frame.

    `websockets` applies flow control inside `send()`, which may wait; replies and
    notifications therefore go through a small queue drained by one writer task, and
    the queue plus the transport buffer is what `max_queue_bytes` bounds.
    """

    wire = "websocket"

    def __init__(self, core: ServerCore, ws: ServerConnection) -> None:
        super().__init__(core, peer_name(ws.remote_address))
        self._ws = ws
        self._gate_key = ws
        self._out: deque[bytes] = deque()
        self._out_bytes = 0
        self._wake = asyncio.Event()
        self._capacity = asyncio.Event()
        self._capacity.set()
        self._writer_task: asyncio.Task[None] | None = None

    def start_writer(self) -> None:
        self._writer_task = asyncio.get_running_loop().create_task(self._writer())

    async def _writer(self) -> None:
        ws = self._ws
        out = self._out
        try:
            while True:
                while not out:
                    self._wake.clear()
                    await self._wake.wait()
                data = out.popleft()
                self._out_bytes -= len(data)
                await ws.send(data, text=True)
        except ConnectionClosed:
            self.closed = True
        except Exception:
            log.exception("writer of %r failed; closing it", self)
            self._abort()

    def _send(self, body: bytes) -> None:
        if self.closed:
            return
        if self._pending_output() > self._core.max_queue_bytes:
            self._overflow()
            return
        self._write_message(body)

    def _overflow(self) -> None:
        """The client stopped reading: drop what is queued and close with a code that
        says why (the close frame follows what the kernel already holds for it)."""
        log.warning(
            "closing %r: %d bytes of output unread (limit %d); the client stopped reading",
            self, self._pending_output(), self._core.max_queue_bytes,
        )
        self.closed = True
        self._out.clear()
        self._out_bytes = 0
        if self._writer_task is not None:
            self._writer_task.cancel()
        self._cleanup()  # no more events for it; its slot is free
        self._ws.close_timeout = SLOW_CONSUMER_GRACE
        asyncio.get_running_loop().create_task(
            self._close_now(SLOW_CONSUMER_CLOSE, SLOW_CONSUMER_REASON)
        )

    async def _close_now(self, code: int, reason: str) -> None:
        try:
            # bounded by the connection's close_timeout, then the transport is aborted
            await self._ws.close(code, reason)
        except Exception:
            self._abort()

    def _pending_output(self) -> int:
        transport = self._ws.transport
        return self._out_bytes + (transport.get_write_buffer_size() if transport else 0)

    def _write_message(self, body: bytes) -> None:
        self._out.append(body)
        self._out_bytes += len(body)
        self._wake.set()

    def _abort(self) -> None:
        self.closed = True
        self._out.clear()
        self._out_bytes = 0
        if self._ws.transport is not None:
            self._ws.transport.abort()

    def _pause_input(self) -> None:
        self._capacity.clear()

    def _resume_input(self) -> None:
        self._capacity.set()

    def _logged_in(self) -> None:
        # frames before login carry `initialize` only; now the configured limit applies
        self._ws.protocol.max_message_size = self._core.max_frame

    async def wait_capacity(self) -> None:
        await self._capacity.wait()

    def close(self) -> None:
        """Close with a normal close frame after the queued output is sent."""
        if self.closed:
            return
        self.closed = True
        asyncio.get_running_loop().create_task(self._close_after_flush())

    async def _close_after_flush(self) -> None:
        # a client that does not read gets a bounded wait, not a stuck close
        deadline = asyncio.get_running_loop().time() + _CLOSE_FLUSH_TIMEOUT
        try:
            while self._out and self._writer_task is not None and not self._writer_task.done():
                if asyncio.get_running_loop().time() > deadline:
                    self._abort()
                    return
                await asyncio.sleep(0.01)
            await self._ws.close()
        except Exception:
            self._abort()

    def finish(self) -> None:
        if self._writer_task is not None:
            self._writer_task.cancel()
        self._cleanup()


class JsonRpcWebSocketServer:
    """A listening JSON-RPC WebSocket server; `endpoint` is `ws://host:port`."""

    wire = "websocket"

    def __init__(self, core: ServerCore, host: str, extra_origins: Iterable[str]) -> None:
        self._core = core
        self.host = host
        self.port = 0
        self.endpoint = ""
        self._server: WsServer | None = None
        self._acceptor: Acceptor | None = None
        self._extra_origins = list(extra_origins)
        self.allowed_origins: frozenset[str] = frozenset()
        # the web page (web.py): answers plain GETs and vets browsers before the checks below
        self.pages: PageServer | None = None

    def _bound(self, server: WsServer, listener: socket.socket) -> None:
        self._server = server
        self.port = listener.getsockname()[1]
        self.endpoint = "ws://" + format_hostport(self.host, self.port)
        own = {f"http://127.0.0.1:{self.port}", f"http://localhost:{self.port}"}
        self.allowed_origins = frozenset(own | set(self._extra_origins))

    @property
    def connections(self) -> set[JsonRpcConnection]:
        return set(self._core.connections)

    # HTTP: what happens before the WebSocket exists

    def _process_request(self, ws: ServerConnection, request: Request) -> Response | None:
        origins = request.headers.get_all("Origin")
        if len(origins) > 1:
            log.warning("refusing WebSocket from %s: %d Origin headers", ws.remote_address,
                        len(origins))
            return ws.respond(HTTPStatus.BAD_REQUEST, "more than one Origin header\n")
        if self.pages is not None and (page := self.pages.process_request(ws, request)):
            return page
        origin = origins[0] if origins else None
        if origin is not None and origin not in self.allowed_origins:
            # a browser page from another site must not reach the daemon
            log.warning(
                "refusing WebSocket from %s: Origin %r not allowed", ws.remote_address, origin
            )
            return ws.respond(HTTPStatus.FORBIDDEN, "Origin not allowed\n")
        core = self._core
        if core.closing or core.full():
            log.warning(
                "refusing WebSocket from %s: %d connections open (limit %d)",
                ws.remote_address,
                len(core.clients),
                core.max_connections,
            )
            return ws.respond(HTTPStatus.SERVICE_UNAVAILABLE, "too many connections\n")
        return None

    @staticmethod
    def _process_response(
        ws: ServerConnection, request: Request, resp: Response
    ) -> Response | None:
        # never let a browser read responses cross-origin, whoever adds the header
        if "Access-Control-Allow-Origin" in resp.headers:
            del resp.headers["Access-Control-Allow-Origin"]
        return None

    async def _serve(self, ws: ServerConnection) -> None:
        core = self._core
        conn = WebSocketConnection(core, ws)
        if self.pages is not None and ws.request is not None and self.pages.is_page(ws.request):
            # the page logs in with its page key in `initialize`, like any client: nothing
            # a browser sends by itself (a cookie) stands for the token
            conn.page_origin = True
        if core.closing or core.full():
            # handshakes racing past the check in _process_request
            log.warning("refusing %r: connection limit %d", conn, core.max_connections)
            err = too_many_connections(core.max_connections)
            try:
                await ws.send(dumps_json(error_response(None, err)), text=True)
                await ws.close(1013, "too many connections")
            except ConnectionClosed:
                pass
            return
        conn.start_writer()
        try:
            if not conn._open():
                return
            async for message in ws:
                if conn.closed:
                    # closing: what the client still sends is read and dropped, or the
                    # library stops reading at its queue limit and never sees the client's
                    # close frame behind it (the close then waits out its timeout and
                    # ends in a reset); the library's close timeout bounds this
                    continue
                conn.handle_message(message)
                if conn._input_paused:
                    await conn.wait_capacity()
        except ConnectionClosed as exc:
            log.debug("%r closed: %s", conn, exc)
        except Exception:
            log.exception("%r failed; closing it", conn)
        finally:
            conn.finish()

    async def close(self, grace: float = DEFAULT_CLOSE_GRACE) -> None:
        """Stop accepting, close every connection, let running requests finish briefly."""
        self._core.closing = True
        if self._acceptor is not None:
            await self._acceptor.stop()
        if self._server is not None:
            self._server.close(close_connections=True)
        await self._core.drain_tasks(grace)
        if self._server is not None:
            await self._server.wait_closed()


async def start_websocket_server(
    handler: RequestHandler,
    hub: EventHub,
    host: str = "127.0.0.1",
    port: int = 0,
    limits: WireLimits = BARE_LIMITS,
    *,
    allowed_origins: Iterable[str] = (),
) -> JsonRpcWebSocketServer:
    """Listen for JSON-RPC over WebSocket on `host:port` (0 picks a free port).

    Browser pages are allowed only from `http://127.0.0.1:PORT` and
    `http://localhost:PORT` of this server plus `allowed_origins` (exact strings).
    Compression is off: deflate costs CPU on every message and opens compression side
    channels, and loopback clients gain nothing from it.
    """
    core = ServerCore(handler, hub, limits)
    out = JsonRpcWebSocketServer(core, host, allowed_origins)
    listener = bind_listener(host, port)
    # the library builds the connections and runs the handshake; it never accepts by
    # itself (start_serving=False): the acceptor takes connections while the quota allows
    server = await serve(
        out._serve,
        sock=listener,
        start_serving=False,
        process_request=out._process_request,
        process_response=out._process_response,
        server_header=None,
        # by the login deadline when there is one (it starts again after the handshake)
        open_timeout=limits.login_timeout or HANDSHAKE_TIMEOUT,
        close_timeout=_CLOSE_FLUSH_TIMEOUT,
        max_size=core.preauth_max_frame if limits.require_login else limits.max_frame,
        compression=None,
        create_connection=type("Transport", (_Transport,), {"core": core}),
    )
    # the handshake refuses upgrades while the server "is not serving"
    server.is_serving = lambda: not core.closing  # type: ignore[method-assign]
    out._bound(server, listener)
    # asyncio.Server keeps the factory it was created with; the acceptor calls it
    factory = server.server._protocol_factory  # type: ignore[attr-defined]
    acceptor = Acceptor(listener, core.gate, factory, "WebSocket")
    out._acceptor = acceptor
    acceptor.start()
    log.info("JSON-RPC over WebSocket on %s", out.endpoint)
    return out
