"""JSON-RPC 2.0 wires of the daemon: TCP (Content-Length framing, as LSP) and WebSocket.

Both wires are transports only: each decoded request goes to
`RequestHandler.handle(conn, method, params)` and the result (or the `CtxdError` it
raised) goes back to the same client. Many clients are served at once, each with its
own request stream and its own bounded writer.

Why this layer is written on asyncio directly instead of on pygls
-----------------------------------------------------------------
pygls 2 was the intended JSON-RPC layer, but its machinery stands in the way of what the
daemon needs, and replacing the parts that matter leaves nothing of it in use:

* A pygls server owns one writer; a second TCP client takes it over and the server exits
  when a client leaves. One `JsonRPCProtocol` per connection avoids that, but then pygls
  only contributes message dispatch.
* Dispatch goes through a `FeatureManager` registry of named methods, while the daemon
  has one `handle(conn, method, params)` entry point that needs the connection object.
* Incoming params are structured by cattrs into a namedtuple class built per object
  (about 115 us each, and non-identifier keys are renamed); the engine wants plain dicts.
* Output is `json.dumps` with ASCII escaping (Chinese text costs six bytes per character)
  and `Content-Length` is computed on the str, which is only right because of the escaping.
* There is no bound on buffered output: a client that stops reading makes the daemon
  buffer without limit.
* Exceptions become `JsonRpcInternalError` with a traceback unless they are pygls's own
  exception types; our typed errors with codes and `data` would need a translation layer
  on both sides.

What remains is a few hundred lines on `asyncio.Protocol` (TCP) and the `websockets`
library (WebSocket), using `protocol.codec.FrameReader` and `dumps_json`. It is faster
than the pygls path as well (see bench/bench_wire_jsonrpc.py).

Behaviour shared by both wires
------------------------------
* Each request runs as its own task, created in arrival order as soon as its frame is
  parsed: the handler does its synchronous work before its first await, so per-client
  order of appends is kept while a slow request does not block the next one.
* Notifications from the client go to the handler as well and get no reply.
* Batches (a JSON array) are supported: every element runs as its own task, the replies
  come back as one array in request order; an empty array gets a single -32600 error;
  an all-notification batch gets no reply.
* Messages shaped like responses (`result`/`error` without `method`) are ignored with a
  log line: the daemon sends no requests, and answering a response with an error could
  be mistaken by the client for the reply to one of its own requests.
* Invalid JSON gets -32700 with id null; a non-object or an object without a string
  `method` gets -32600. The connection stays open when frame boundaries are intact.
* Output (replies and server notifications) never blocks: it is written into the
  transport's buffer. When a message is to be queued while more than `max_queue_bytes`
  of earlier output is still unsent, the client has stopped reading: it is dropped with
  a log line. Pending output is thus bounded by `max_queue_bytes` plus one message.
* At most `max_inflight` requests per connection run at once; beyond that the connection
  stops reading until some finish, so a client cannot create tasks without limit.
* A client that leaves does not cancel its running requests (a compaction finishes and
  is recorded); their replies are discarded. `close()` of a server waits up to
  `grace` seconds for running requests, then cancels them.

TCP specifics: a broken header gets -32700 and a frame above `max_frame` gets -32015,
then the connection is closed (the stream cannot be resynchronised). A half-close from
the client (EOF) lets running requests finish and deliver their replies before closing.

WebSocket specifics: one JSON message per frame (text; binary frames holding UTF-8 JSON
are accepted too), replies are text frames. A frame above `max_frame` closes the
connection with code 1009 (done by `websockets`). A request whose `Origin` header is
present and not allowed is refused with HTTP 403 during the handshake; clients without
an Origin header (non-browser) are allowed. No response carries
`Access-Control-Allow-Origin`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Iterable
from http import HTTPStatus
from typing import Any

from websockets.asyncio.server import Server as WsServer
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from ...protocol.codec import (
    DEFAULT_MAX_FRAME,
    FrameReader,
    check_request,
    dumps_json,
    error_response,
    frame,
    loads_json,
    notification,
    response,
)
from ...protocol.errors import CtxdError, InternalError, InvalidRequest
from .base import Connection, EventHub, RequestHandler
from .web import PageServer

log = logging.getLogger("ctxd.servers.jsonrpc")

DEFAULT_MAX_QUEUE_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_CONNECTIONS = 1024
DEFAULT_MAX_INFLIGHT = 1024
DEFAULT_CLOSE_GRACE = 5.0
_CLOSE_FLUSH_TIMEOUT = 5.0

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_INFLIGHT",
    "DEFAULT_MAX_QUEUE_BYTES",
    "JsonRpcConnection",
    "JsonRpcTcpServer",
    "JsonRpcWebSocketServer",
    "TcpConnection",
    "WebSocketConnection",
    "start_tcp_server",
    "start_websocket_server",
]


def _format_hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _peer_name(addr: Any) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        return _format_hostport(str(addr[0]), int(addr[1]))
    return str(addr or "")


def _too_many_connections(limit: int) -> CtxdError:
    return InternalError(
        f"the daemon serves at most {limit} connections; close idle clients and retry",
        {"reason": "too_many_connections", "limit": limit},
    )


class _ServerCore:
    """State shared by all connections of one listening server."""

    def __init__(
        self,
        handler: RequestHandler,
        hub: EventHub,
        *,
        max_frame: int,
        max_queue_bytes: int,
        max_connections: int,
        max_inflight: int,
    ) -> None:
        self.handler = handler
        self.hub = hub
        self.max_frame = max_frame
        self.max_queue_bytes = max_queue_bytes
        self.max_connections = max_connections
        self.max_inflight = max(1, max_inflight)
        self.connections: set[JsonRpcConnection] = set()
        # every running request task of every connection, so close() can wait for them
        self.tasks: set[asyncio.Task[Any]] = set()
        self.closing = False

    def full(self) -> bool:
        return len(self.connections) >= self.max_connections

    async def drain_tasks(self, grace: float) -> None:
        """Wait up to `grace` seconds for running requests, then cancel the rest."""
        if not self.tasks:
            return
        pending = set(self.tasks)
        _done, still = await asyncio.wait(pending, timeout=grace)
        for task in still:
            task.cancel()
        if still:
            log.warning("cancelled %d request(s) still running at shutdown", len(still))
            await asyncio.wait(still, timeout=1.0)


class JsonRpcConnection(Connection):
    """One JSON-RPC client: decodes messages, runs requests as tasks, writes replies.

    Subclasses provide the byte transport: `_pending_output`, `_write_message`,
    `_abort`, and the flow-control hooks `_pause_input`/`_resume_input`.
    """

    def __init__(self, core: _ServerCore, peer: str) -> None:
        super().__init__(peer)
        self._core = core
        self._inflight = 0
        self._input_paused = False
        self._cleaned_up = False
        self._opened = False

    # transport hooks

    def _pending_output(self) -> int:
        raise NotImplementedError

    def _write_message(self, body: bytes) -> None:
        raise NotImplementedError

    def _abort(self) -> None:
        raise NotImplementedError

    def _pause_input(self) -> None:
        pass

    def _resume_input(self) -> None:
        pass

    def _idle(self) -> None:
        """Called when the last running request finished."""

    # lifecycle

    def _open(self) -> bool:
        core = self._core
        core.connections.add(self)
        core.hub.add_connection(self)
        self._opened = True
        try:
            core.handler.connection_opened(self)
        except Exception:
            log.exception("connection_opened failed for %r; closing it", self)
            self.close()
            return False
        log.debug("opened %r", self)
        return True

    def _cleanup(self) -> None:
        """Runs exactly once when the connection is gone, whatever the reason."""
        if self._cleaned_up:
            return
        self._cleaned_up = True
        self.closed = True
        core = self._core
        core.connections.discard(self)
        if not self._opened:
            return
        try:
            core.handler.connection_closed(self)
        except Exception:
            log.exception("connection_closed failed for %r", self)
        finally:
            core.hub.remove_connection(self)
        log.debug("closed %r", self)

    # output

    def send_notification(self, method: str, params: dict[str, Any]) -> None:
        self._send(dumps_json(notification(method, params)))

    def _send(self, body: bytes) -> None:
        """Queue one message without blocking; drop the client if it stopped reading."""
        if self.closed:
            return
        pending = self._pending_output()
        if pending > self._core.max_queue_bytes:
            log.warning(
                "dropping %r: %d bytes of output unread (limit %d); the client stopped reading",
                self,
                pending,
                self._core.max_queue_bytes,
            )
            self.closed = True
            self._abort()
            return
        self._write_message(body)

    def _send_error(self, id_: Any, err: CtxdError) -> None:
        self._send(dumps_json(error_response(id_, err)))

    # input

    def handle_message(self, body: bytes | str) -> None:
        """Decode one JSON-RPC message (object or batch) and start its request task(s)."""
        if self.closed:
            return
        try:
            msg = loads_json(body)
        except CtxdError as err:
            self._send_error(None, err)
            return
        if isinstance(msg, dict):
            if "method" not in msg and ("result" in msg or "error" in msg):
                log.info("ignoring a response-shaped message from %r", self)
                return
            try:
                id_, method, params, is_notification = check_request(msg)
            except CtxdError as err:
                self._send_error(msg.get("id"), err)
                return
            self._start(id_, method, params, is_notification)
        elif isinstance(msg, list):
            self._start_batch(msg)
        else:
            self._send_error(None, InvalidRequest("a JSON-RPC request must be an object"))

    def _track(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._core.tasks.add(task)
        self._inflight += 1
        if self._inflight >= self._core.max_inflight and not self._input_paused:
            self._input_paused = True
            self._pause_input()
        return task

    def _untrack(self) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._core.tasks.discard(task)
        self._inflight -= 1
        if self._input_paused and self._inflight <= self._core.max_inflight // 2:
            self._input_paused = False
            self._resume_input()
        if self._inflight == 0:
            self._idle()

    def _start(self, id_: Any, method: str, params: Any, is_notification: bool) -> None:
        # created right away, in arrival order: see the module docstring
        self._track(self._run(id_, method, params, is_notification))

    async def _run(self, id_: Any, method: str, params: Any, is_notification: bool) -> None:
        try:
            reply = await self._call(id_, method, params, is_notification)
            if reply is not None:
                self._send(self._encode(reply))
        finally:
            # after the reply is queued: finishing the last request may close the connection
            self._untrack()

    def _start_batch(self, items: list[Any]) -> None:
        if not items:
            self._send_error(None, InvalidRequest("an empty batch is not a valid request"))
            return
        entries: list[Any] = []
        for item in items:
            try:
                id_, method, params, is_notification = check_request(item)
            except CtxdError as err:
                item_id = item.get("id") if isinstance(item, dict) else None
                entries.append(error_response(item_id, err))
                continue
            entries.append(self._track(self._call_untrack(id_, method, params, is_notification)))
        # the batch reply counts as running work too, so a half-close waits for it
        self._track(self._finish_batch(entries))

    async def _call_untrack(
        self, id_: Any, method: str, params: Any, is_notification: bool
    ) -> dict[str, Any] | None:
        try:
            return await self._call(id_, method, params, is_notification)
        finally:
            self._untrack()

    async def _finish_batch(self, entries: list[Any]) -> None:
        try:
            parts: list[bytes] = []
            for entry in entries:
                if isinstance(entry, asyncio.Task):
                    entry = await entry
                if entry is not None:
                    parts.append(self._encode(entry))
            if parts:
                self._send(b"[" + b",".join(parts) + b"]")
        finally:
            self._untrack()

    async def _call(
        self, id_: Any, method: str, params: Any, is_notification: bool
    ) -> dict[str, Any] | None:
        """Run one request through the handler; return its reply (None for a notification)."""
        try:
            result = await self._core.handler.handle(self, method, params)
        except CtxdError as err:
            if is_notification:
                log.info("notification %s from %r failed: %r", method, self, err)
                return None
            return error_response(id_, err)
        except Exception as exc:
            log.exception("%s from %r failed", method, self)
            return None if is_notification else error_response(id_, _internal(exc))
        return None if is_notification else response(id_, result)

    def _encode(self, reply: dict[str, Any]) -> bytes:
        try:
            return dumps_json(reply)
        except (TypeError, ValueError) as exc:
            # a handler returned something JSON cannot carry: the client still gets an answer
            log.exception("cannot encode the reply to %r for %r", reply.get("id"), self)
            return dumps_json(error_response(reply.get("id"), _internal(exc)))


def _internal(exc: BaseException) -> CtxdError:
    return InternalError(
        f"internal error ({type(exc).__name__}); the daemon log has the details",
        {"type": type(exc).__name__},
    )


# TCP


class TcpConnection(JsonRpcConnection, asyncio.Protocol):
    """A JSON-RPC client over TCP with Content-Length framing."""

    wire = "jsonrpc-tcp"

    def __init__(self, core: _ServerCore) -> None:
        JsonRpcConnection.__init__(self, core, "")
        self._transport: asyncio.Transport | None = None
        self._reader = FrameReader(core.max_frame)
        self._eof = False
        # frames already read while too many requests run: started once some finish
        self._backlog: deque[bytes] = deque()

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self.peer = _peer_name(transport.get_extra_info("peername"))
        core = self._core
        if core.closing or core.full():
            log.warning(
                "refusing %s: %d connections open (limit %d)",
                self.peer,
                len(core.connections),
                core.max_connections,
            )
            err = _too_many_connections(core.max_connections)
            transport.write(frame(dumps_json(error_response(None, err))))
            self.closed = True
            transport.close()
            return
        self._open()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            bodies = self._reader.feed(data)
        except CtxdError as err:
            # the stream cannot be resynchronised after a broken header: answer, then close
            log.warning("closing %r: %s", self, err.message)
            self._send_error(None, err)
            self.close()
            return
        self._backlog.extend(bodies)
        self._drain_backlog()

    def _drain_backlog(self) -> None:
        backlog = self._backlog
        while backlog and not self._input_paused and not self.closed:
            self.handle_message(backlog.popleft())

    def eof_received(self) -> bool:
        # the client half-closed: finish running requests and deliver their replies
        self._eof = True
        if self._inflight == 0:
            return False
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            log.debug("%r lost: %s", self, exc)
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
        """Close after flushing what is already queued."""
        self.closed = True
        if self._transport is not None:
            self._transport.close()


class JsonRpcTcpServer:
    """A listening JSON-RPC TCP server; `endpoint` is what the connection file names."""

    wire = "jsonrpc-tcp"

    def __init__(self, server: asyncio.Server, core: _ServerCore, host: str) -> None:
        self._server = server
        self._core = core
        self.host = host
        self.port: int = server.sockets[0].getsockname()[1]
        self.endpoint = _format_hostport(host, self.port)

    @property
    def connections(self) -> set[JsonRpcConnection]:
        return set(self._core.connections)

    async def close(self, grace: float = DEFAULT_CLOSE_GRACE) -> None:
        """Stop accepting, close every connection, let running requests finish briefly."""
        self._core.closing = True
        self._server.close()
        for conn in list(self._core.connections):
            conn.close()
        await self._core.drain_tasks(grace)
        for conn in list(self._core.connections):
            conn._abort()
        await self._server.wait_closed()


async def start_tcp_server(
    handler: RequestHandler,
    hub: EventHub,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    max_frame: int = DEFAULT_MAX_FRAME,
    max_queue_bytes: int = DEFAULT_MAX_QUEUE_BYTES,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    max_inflight: int = DEFAULT_MAX_INFLIGHT,
) -> JsonRpcTcpServer:
    """Listen for Content-Length framed JSON-RPC on `host:port` (0 picks a free port)."""
    core = _ServerCore(
        handler,
        hub,
        max_frame=max_frame,
        max_queue_bytes=max_queue_bytes,
        max_connections=max_connections,
        max_inflight=max_inflight,
    )
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: TcpConnection(core), host, port)
    out = JsonRpcTcpServer(server, core, host)
    log.info("JSON-RPC over TCP on %s", out.endpoint)
    return out


# WebSocket


class WebSocketConnection(JsonRpcConnection):
    """A JSON-RPC client over WebSocket: one message per frame.

    `websockets` applies flow control inside `send()`, which may wait; replies and
    notifications therefore go through a small queue drained by one writer task, and
    the queue plus the transport buffer is what `max_queue_bytes` bounds.
    """

    wire = "websocket"

    def __init__(self, core: _ServerCore, ws: ServerConnection) -> None:
        super().__init__(core, _peer_name(ws.remote_address))
        self._ws = ws
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
            pass
        except Exception:
            log.exception("writer of %r failed; closing it", self)
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

    def __init__(self, core: _ServerCore, host: str, extra_origins: Iterable[str]) -> None:
        self._core = core
        self.host = host
        self.port = 0
        self.endpoint = ""
        self._server: WsServer | None = None
        self._extra_origins = list(extra_origins)
        self.allowed_origins: frozenset[str] = frozenset()
        # the web page (web.py): answers plain GETs and vets browsers before the checks below
        self.pages: PageServer | None = None

    def _bound(self, server: WsServer) -> None:
        self._server = server
        self.port = server.sockets[0].getsockname()[1]
        self.endpoint = "ws://" + _format_hostport(self.host, self.port)
        own = {f"http://127.0.0.1:{self.port}", f"http://localhost:{self.port}"}
        self.allowed_origins = frozenset(own | set(self._extra_origins))

    @property
    def connections(self) -> set[JsonRpcConnection]:
        return set(self._core.connections)

    def _process_request(self, ws: ServerConnection, request: Request) -> Response | None:
        if self.pages is not None and (page := self.pages.process_request(ws, request)):
            return page
        origin = request.headers.get("Origin")
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
                len(core.connections),
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
            conn.authenticated = True  # the page's cookie stands for the token
        if core.closing or core.full():
            # handshakes racing past the check in _process_request
            log.warning("refusing %r: connection limit %d", conn, core.max_connections)
            err = _too_many_connections(core.max_connections)
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
                    break
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
    *,
    allowed_origins: Iterable[str] = (),
    max_frame: int = DEFAULT_MAX_FRAME,
    max_queue_bytes: int = DEFAULT_MAX_QUEUE_BYTES,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    max_inflight: int = DEFAULT_MAX_INFLIGHT,
) -> JsonRpcWebSocketServer:
    """Listen for JSON-RPC over WebSocket on `host:port` (0 picks a free port).

    Browser pages are allowed only from `http://127.0.0.1:PORT` and
    `http://localhost:PORT` of this server plus `allowed_origins` (exact strings).
    """
    core = _ServerCore(
        handler,
        hub,
        max_frame=max_frame,
        max_queue_bytes=max_queue_bytes,
        max_connections=max_connections,
        max_inflight=max_inflight,
    )
    out = JsonRpcWebSocketServer(core, host, allowed_origins)
    server = await serve(
        out._serve,
        host,
        port,
        process_request=out._process_request,
        process_response=out._process_response,
        max_size=max_frame,
        # JSON compresses well, but deflate costs CPU on every message and opens
        # compression side channels; loopback clients gain nothing from it
        compression=None,
    )
    out._bound(server)
    log.info("JSON-RPC over WebSocket on %s", out.endpoint)
    return out
