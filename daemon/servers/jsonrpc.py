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

What remains is a few hundred lines on `asyncio.Protocol` (TCP, `rpc_tcp.py`) and the
`websockets` library (WebSocket, `rpc_websocket.py`), sharing `rpc_core.py`, using
`protocol.codec.FrameReader` and `dumps_json`. It is faster
than the pygls path as well (see bench/bench_wire_jsonrpc.py).

Behaviour shared by both wires
------------------------------
* Each request is served as soon as its frame is parsed, in arrival order: a method whose
  handler is synchronous (most are: `handle_now`) is answered on the spot, without a
  task; the others run as their own task, and a client's next requests wait for that
  task to start. So per-client order of appends is kept while a slow request does not
  block the next one.
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
  transport's buffer. A session event to be queued while more than three quarters of
  `max_queue_bytes` is still unsent is dropped and counted per session instead, and so
  is every later one until the output is down to a quarter (checked on a timer that
  backs off to once a second); then the client gets one `session/didMissEvents`
  (`{sessionId, missed}`) per session, before any later event of it, and re-reads. A
  subscriber that pauses thus keeps its connection. When a reply is to be queued while
  more than `max_queue_bytes` is unsent, the client has stopped reading: it is dropped
  with a log line (on WebSocket with close code 1013, so it reconnects and catches up).
  Pending output is thus bounded by `max_queue_bytes` plus one message.
* A batch holds at most `max_batch` requests (more: one -32600, nothing runs); a reply
  above `max_reply_bytes` is replaced by a -32015 error naming the limit.
* With `require_login` (the daemon's setting) a connection must log in first: the one
  message read before that must be a single `initialize` request (in a frame of at most
  64 KiB); anything else, or a failed `initialize`, gets one error and the connection is
  closed. A connection that has not logged in within `login_timeout` is dropped,
  whether or not it reads its output. Connections before login have their own quota
  (`max_unauthenticated`, the WebSocket handshake included): while it is full the wire
  stops accepting. `max_connections` counts logged-in clients only. See `admission.py`.
* At most `max_inflight` requests per connection run at once; beyond that the connection
  stops reading until some finish, so a client cannot create tasks without limit.
* A connection the daemon closes keeps being read, and what comes in is dropped, until
  the client closes too (TCP: at most 2 s after an end of stream; WebSocket: the close
  handshake's timeout): a socket closed with unread input is reset by the kernel, and
  the reset can destroy the last reply before the client reads it.
* A client that leaves does not cancel its running requests (a compaction finishes and
  is recorded); their replies are discarded. `close()` of a server waits up to
  `grace` seconds for running requests, then cancels them.

TCP specifics: a broken header gets -32700 and a frame above `max_frame` gets -32015,
then the connection is closed (the stream cannot be resynchronised). A connection whose
first bytes are an HTTP request line (a browser's cross-site request) is closed without
an answer. A frame header is at most 8 KiB. A half-close from
the client (EOF) lets running requests finish and deliver their replies before closing.

WebSocket specifics: one JSON message per frame (text; binary frames holding UTF-8 JSON
are accepted too), replies are text frames. A frame above `max_frame` closes the
connection with code 1009 (done by `websockets`). A request whose `Origin` header is
present and not allowed is refused with HTTP 403 during the handshake (more than one
Origin header: HTTP 400); clients without an Origin header (non-browser) are allowed.
No response carries `Access-Control-Allow-Origin`.
"""

from __future__ import annotations

from ctxd.daemon.servers.rpc_core import JsonRpcConnection
from ctxd.daemon.servers.rpc_state import (
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_INFLIGHT,
    DEFAULT_MAX_QUEUE_BYTES,
    DEFAULT_MAX_UNAUTHENTICATED,
    PREAUTH_MAX_FRAME,
    WireLimits,
)
from ctxd.daemon.servers.rpc_tcp import JsonRpcTcpServer, TcpConnection, start_tcp_server
from ctxd.daemon.servers.rpc_websocket import (
    SLOW_CONSUMER_CLOSE,
    JsonRpcWebSocketServer,
    WebSocketConnection,
    start_websocket_server,
)

__all__ = [
    "DEFAULT_MAX_BATCH",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_INFLIGHT",
    "DEFAULT_MAX_QUEUE_BYTES",
    "DEFAULT_MAX_UNAUTHENTICATED",
    "PREAUTH_MAX_FRAME",
    "SLOW_CONSUMER_CLOSE",
    "JsonRpcConnection",
    "JsonRpcTcpServer",
    "JsonRpcWebSocketServer",
    "TcpConnection",
    "WebSocketConnection",
    "WireLimits",
    "start_tcp_server",
    "start_websocket_server",
]
