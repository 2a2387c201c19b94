"""The Python client of the ctxd daemon, for every wire it serves.

    from ctxd.clients.client import connect, connect_async

    with connect(wire="zmq") as client:              # or "jsonrpc", "websocket"
        sid = client.create_session(title="demo")["sessionId"]
        client.on_notification(lambda method, params: print(method, params))
        client.subscribe(sid)
        client.append(sid, [{"role": "user", "content": "hello"}])
        messages = client.context_get(sid)["messages"]

    async with await connect_async(wire="websocket") as client:
        await client.subscribe(sid)
        async for method, params in client.notifications():
            ...

The daemon is found through its connection file (`connection_file_for(data_dir)`), which
names the endpoints and the token; a file or directory another user owns or may write to
is refused. On every wire the client first sends `initialize` with a nonce and a proof of
the token (never the token itself), and checks the daemon's `nonceMac` before sending
anything else (`ctxd.protocol.auth`): a process that took over a stale file's endpoint
gets nothing (`DaemonNotAuthentic`). Then, on ZeroMQ, the token travels in every request,
and a `heartbeat` keeps the lease of the client's runs (ZeroMQ has no disconnect signal).

`call()` returns the `result` of the reply, raises the typed `CtxdError` subclass for an
error reply (`SessionNotFound`, `InvalidParams`, ...), `ConnectionError` when the daemon
cannot be reached or the connection is lost (`DaemonNotRunning` when it is not there at
all), and `TimeoutError` when no reply comes in time.

On ZeroMQ, `subscribe()` returns only once the SUB socket's subscription is in effect at
the daemon (a subscription probe, see `_zmq`), so no event sent afterwards is missed.

`AsyncClient` matches replies to concurrent awaits by request id. `Client` runs an
`AsyncClient` on its own I/O thread, so any number of threads may call it at once;
notification callbacks of a `Client` run on that I/O thread. On ZeroMQ and JSON-RPC TCP
a `Client` also keeps a direct line (`_lane`): a call finding it free is sent and
answered on the calling thread itself, without the two thread switches of the I/O thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from ctxd.clients._jsonrpc import TcpTransport, WebSocketTransport
from ctxd.clients._lane import VIA_IO_THREAD, NotSent, TcpLane, ZmqLane
from ctxd.clients._zmq import ZmqTransport
from ctxd.protocol import auth
from ctxd.protocol.codec import DEFAULT_MAX_FRAME
from ctxd.protocol.connection import (
    connection_file_for,
    daemon_gone,
    default_data_dir,
    read_connection_file,
)
from ctxd.protocol.errors import InternalError, error_from_dict

__all__ = [
    "AsyncClient",
    "Client",
    "DaemonNotAuthentic",
    "DaemonNotRunning",
    "NotificationCallback",
    "Wire",
    "connect",
    "connect_async",
    "find_daemon",
]

log = logging.getLogger("ctxd.client")

Wire = Literal["zmq", "jsonrpc", "websocket"]
WIRES: tuple[str, ...] = ("zmq", "jsonrpc", "websocket")
NotificationCallback = Callable[[str, dict[str, Any]], None]

DEFAULT_TIMEOUT = 60.0
DEFAULT_CONNECT_TIMEOUT = 5.0
# A compaction waits for a summarizer (often a model call): give it far longer.
COMPACT_TIMEOUT = 900.0
# How long `subscribe` waits for the ZeroMQ subscription probe (see `_zmq`).
SUBSCRIBE_SETTLE_TIMEOUT = 5.0
CLIENT_NAME = "ctxd-python"

_WIRE_KEYS = {"zmq": "zmq_router", "jsonrpc": "jsonrpc_tcp", "websocket": "websocket"}
_END: Any = object()
R = TypeVar("R")


class DaemonNotRunning(ConnectionError):
    """No daemon answers: no connection file, a dead pid, or nothing at its endpoint."""


# discovery


def find_daemon(
    connection_file: str | os.PathLike[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Locate and read the connection file; raise `DaemonNotRunning` with the reason."""
    if connection_file is not None:
        path = Path(connection_file)
    else:
        path = connection_file_for(Path(data_dir) if data_dir else default_data_dir())
    where = f"data dir {data_dir}" if data_dir and connection_file is None else str(path)
    try:
        info = read_connection_file(path)
    except FileNotFoundError:
        raise DaemonNotRunning(
            f"no ctxd daemon: connection file {path} does not exist; start one with "
            f"'ctxd serve' (for {where}) or pass the right connection_file/data_dir"
        ) from None
    except (OSError, ValueError) as exc:
        raise DaemonNotRunning(f"cannot read the connection file {path}: {exc}") from None
    if daemon_gone(info):
        raise DaemonNotRunning(
            f"the daemon of {path} (pid {info['pid']}) is not running; the file is stale. "
            "Start it again with 'ctxd serve'"
        )
    return path, info


def _check_wire(wire: str) -> None:
    if wire not in WIRES:
        raise ValueError(f"unknown wire {wire!r}; use one of {', '.join(WIRES)}")


def _drop_none(**params: Any) -> dict[str, Any]:
    return {k: v for k, v in params.items() if v is not None}


class DaemonNotAuthentic(ConnectionError):
    """Whatever answered at the connection file's endpoint could not prove it knows the
    token: not the daemon that wrote the file. Nothing but a proof of the token was sent."""


# typed convenience calls, shared by both clients


class _Methods(Generic[R]):
    """Thin wrappers over `call`: R is `Any` for `Client`, `Awaitable[Any]` for `AsyncClient`."""

    def call(
        self, method: str, params: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> R:
        raise NotImplementedError

    def create_session(
        self,
        session_id: str | None = None,
        title: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> R:
        return self.call(
            "session/create", _drop_none(sessionId=session_id, title=title, metadata=metadata)
        )

    def list_sessions(
        self, limit: int | None = None, cursor: str | None = None, title: str | None = None
    ) -> R:
        return self.call("session/list", _drop_none(limit=limit, cursor=cursor, title=title))

    def get_session(self, session_id: str) -> R:
        return self.call("session/get", {"sessionId": session_id})

    def append(
        self,
        session_id: str,
        messages: list[dict[str, Any]],
        run_id: str | None = None,
        client_batch_id: str | None = None,
        return_context: bool | None = None,
    ) -> R:
        """With `return_context`, the result's `context` is the model context after the
        append (as from `context_get`): one round trip instead of two."""
        return self.call(
            "messages/append",
            _drop_none(
                sessionId=session_id,
                messages=messages,
                runId=run_id,
                clientBatchId=client_batch_id,
                returnContext=return_context,
            ),
        )

    def read(
        self,
        session_id: str,
        after_id: int | None = None,
        limit: int | None = None,
        before_id: int | None = None,
        max_bytes: int | None = None,
    ) -> R:
        return self.call(
            "archive/read",
            _drop_none(
                sessionId=session_id,
                afterId=after_id,
                limit=limit,
                beforeId=before_id,
                maxBytes=max_bytes,
            ),
        )

    def search(
        self,
        query: str,
        session_id: str | None = None,
        role: str | None = None,
        limit: int | None = None,
        offset: int | None = None,
        **extra: Any,
    ) -> R:
        """`extra`: further `archive/search` params by wire name (`newestFirst`, `since`...)."""
        return self.call(
            "archive/search",
            _drop_none(
                query=query, sessionId=session_id, role=role, limit=limit, offset=offset, **extra
            ),
        )

    def context_get(
        self,
        session_id: str,
        format: str | None = None,
        include_metadata: bool | None = None,
        budget_tokens: int | None = None,
        query: str | None = None,
    ) -> R:
        return self.call(
            "context/get",
            _drop_none(
                sessionId=session_id,
                format=format,
                includeMetadata=include_metadata,
                budgetTokens=budget_tokens,
                query=query,
            ),
        )

    def context_clear(self, session_id: str) -> R:
        return self.call("context/clear", {"sessionId": session_id})

    def context_pop(self, session_id: str, count: int | None = None) -> R:
        return self.call("context/pop", _drop_none(sessionId=session_id, count=count))

    def context_status(self, session_id: str) -> R:
        return self.call("context/status", {"sessionId": session_id})

    def compact(
        self,
        session_id: str,
        force: bool | None = None,
        instructions: str | None = None,
        timeout: float = COMPACT_TIMEOUT,
    ) -> R:
        return self.call(
            "context/compact",
            _drop_none(sessionId=session_id, force=force, instructions=instructions),
            timeout=timeout,
        )

    def rebuild(
        self, session_id: str, timeout: float = COMPACT_TIMEOUT, dry_run: bool | None = None
    ) -> R:
        return self.call(
            "context/rebuild", _drop_none(sessionId=session_id, dryRun=dry_run), timeout=timeout
        )

    def explain(self, session_id: str) -> R:
        return self.call("context/explain", {"sessionId": session_id})

    def compactions(self, session_id: str, limit: int | None = None) -> R:
        return self.call("context/compactions", _drop_none(sessionId=session_id, limit=limit))

    def add_pin(self, session_id: str, text: str) -> R:
        return self.call("context/pins/add", {"sessionId": session_id, "text": text})

    def list_pins(self, session_id: str) -> R:
        return self.call("context/pins/list", {"sessionId": session_id})

    def remove_pin(self, session_id: str, pin_id: str) -> R:
        return self.call("context/pins/remove", {"sessionId": session_id, "pinId": pin_id})

    def start_run(self, session_id: str) -> R:
        return self.call("run/start", {"sessionId": session_id})

    def finish_run(
        self,
        run_id: str,
        outcome: str,
        messages: list[dict[str, Any]] | None = None,
        client_batch_id: str | None = None,
        return_context: bool | None = None,
    ) -> R:
        """`messages`: the run's last messages, appended within the run before it finishes
        (the result's `append`); `return_context`: the model context afterwards (the
        result's `context`). All in the same round trip."""
        return self.call(
            "run/finish",
            _drop_none(
                runId=run_id,
                outcome=outcome,
                messages=messages,
                clientBatchId=client_batch_id,
                returnContext=return_context,
            ),
        )

    def request_approval(
        self,
        session_id: str,
        run_id: str,
        tool_call_id: str,
        tool_name: str | None = None,
        arguments: Any = None,
    ) -> R:
        return self.call(
            "approval/request",
            _drop_none(
                sessionId=session_id,
                runId=run_id,
                toolCallId=tool_call_id,
                toolName=tool_name,
                arguments=arguments,
            ),
        )

    def resolve_approval(self, approval_id: str, decision: str, reason: str | None = None) -> R:
        return self.call(
            "approval/resolve",
            _drop_none(approvalId=approval_id, decision=decision, reason=reason),
        )

    def list_approvals(self, session_id: str, status: str | None = None) -> R:
        return self.call("approval/list", _drop_none(sessionId=session_id, status=status))

    def heartbeat(self) -> R:
        """Renew the lease of this client's runs (ZeroMQ); sent by the client on its own."""
        return self.call("heartbeat", {})

    def shutdown(self) -> R:
        """Ask the daemon to stop; it answers first."""
        return self.call("shutdown", {})

    def list_tools(self) -> R:
        return self.call("tools/list", {})

    def call_tool(self, session_id: str, name: str, arguments: dict[str, Any]) -> R:
        return self.call(
            "tools/call", {"sessionId": session_id, "name": name, "arguments": arguments}
        )


# asyncio client


class NotificationStream:
    """An async iterator of `(method, params)`; ends when the client closes.

    Buffers up to `maxsize` notifications; beyond that the oldest are dropped (counted in
    `dropped`) so a consumer that falls behind cannot grow memory without bound.
    """

    def __init__(self, client: AsyncClient, maxsize: int) -> None:
        self._client = client
        self._queue: asyncio.Queue[Any] = asyncio.Queue(maxsize)
        self.dropped = 0
        self._ended = False

    def _put(self, item: Any) -> None:
        if self._ended:
            return
        if item is _END:
            self._ended = True
        while True:
            try:
                self._queue.put_nowait(item)
                return
            except asyncio.QueueFull:
                self._queue.get_nowait()
                self.dropped += 1

    def __aiter__(self) -> NotificationStream:
        return self

    async def __anext__(self) -> tuple[str, dict[str, Any]]:
        item = await self._queue.get()
        if item is _END:
            self._queue.put_nowait(_END)  # later calls end too
            raise StopAsyncIteration
        return item  # type: ignore[no-any-return]

    async def next(self, timeout: float | None = None) -> tuple[str, dict[str, Any]]:
        """The next notification; `TimeoutError` if none comes within `timeout`."""
        async with asyncio.timeout(timeout):
            return await self.__anext__()

    def aclose_nowait(self) -> None:
        self._client._streams.discard(self)
        self._put(_END)

    async def aclose(self) -> None:
        self.aclose_nowait()

    async def __aenter__(self) -> NotificationStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.aclose_nowait()


class AsyncClient(_Methods[Awaitable[Any]]):
    """A client for one daemon over one wire, used from one asyncio event loop.

    `info` is the connection file's content (see `find_daemon`); `AsyncClient.connect()`
    or `connect_async()` find it and open the connection in one step.
    """

    def __init__(
        self,
        info: Mapping[str, Any],
        wire: Wire = "zmq",
        *,
        timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        client_name: str = CLIENT_NAME,
        max_message_size: int = DEFAULT_MAX_FRAME,
        source: str | None = None,
    ) -> None:
        _check_wire(wire)
        self.wire: Wire = wire
        self.info = dict(info)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.client_name = client_name
        self.max_message_size = max_message_size
        self.source = source or "the given connection info"
        self.server_info: dict[str, Any] | None = None
        self._ids = itertools.count(1)
        self._pending: dict[Any, asyncio.Future[Any]] = {}
        self._callbacks: list[NotificationCallback] = []
        self._streams: weakref.WeakSet[NotificationStream] = weakref.WeakSet()
        self._subscribed: set[str] = set()
        # run once when the client closes or loses its connection
        self._end_hooks: list[Callable[[], None]] = []
        self._transport: ZmqTransport | TcpTransport | WebSocketTransport | None = None
        self._lost: ConnectionError | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._opened = False
        self._closed = False

    # lifecycle

    @classmethod
    async def connect(
        cls,
        connection_file: str | os.PathLike[str] | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        wire: Wire = "zmq",
        timeout: float = DEFAULT_TIMEOUT,
        **options: Any,
    ) -> AsyncClient:
        """Find the daemon through its connection file and open a connection to it."""
        _check_wire(wire)
        path, info = find_daemon(connection_file, data_dir)
        client = cls(info, wire, timeout=timeout, source=str(path), **options)
        await client.open()
        return client

    async def open(self) -> None:
        """Connect, and on the JSON-RPC wires prove the token with `initialize`."""
        if self._opened:
            return
        if self._closed:
            raise ConnectionError("this client was closed; create a new one")
        self._opened = True
        transport = self._make_transport()
        try:
            await transport.open()
        except ConnectionError as exc:
            self._closed = True
            raise DaemonNotRunning(
                f"cannot reach the ctxd daemon over {self.wire} ({exc}); is it running? "
                f"(endpoints from {self.source})"
            ) from None
        self._transport = transport
        try:
            await self._authenticate(transport)
        except BaseException:
            await self.close()
            raise
        if isinstance(transport, ZmqTransport):
            lease = (self.server_info or {}).get("capabilities", {}).get("runLeaseSeconds")
            if isinstance(lease, int | float) and lease > 0:
                self._heartbeat = asyncio.create_task(
                    self._send_heartbeats(float(lease)), name="ctxd-heartbeat"
                )

    async def _authenticate(
        self, transport: ZmqTransport | TcpTransport | WebSocketTransport
    ) -> None:
        """Mutual authentication (see `ctxd.protocol.auth`): prove the token without sending
        it, and have the daemon prove it before anything else is sent."""
        token = str(self.info.get("token", ""))
        nonce = auth.new_nonce()
        params = {
            "nonce": nonce,
            "proof": auth.client_proof(token, nonce),
            "clientName": self.client_name,
        }
        info = await self.call("initialize", params, timeout=max(self.connect_timeout, 1.0))
        mac = info.get("nonceMac") if isinstance(info, dict) else None
        if not auth.check_daemon_proof(token, nonce, mac):
            raise DaemonNotAuthentic(
                f"the server at {transport.endpoint} did not prove it knows the token of "
                f"{self.source}: it is not that daemon (a stale connection file whose "
                "endpoint another process took over?); nothing was sent to it"
            )
        self.server_info = info
        if isinstance(transport, ZmqTransport):
            transport.daemon_verified = True

    async def _send_heartbeats(self, lease: float) -> None:
        # any request renews the lease; a heartbeat covers a client that is only waiting
        period = max(0.05, lease / 3)
        while True:
            await asyncio.sleep(period)
            try:
                await self.call("heartbeat", {}, timeout=period)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a lost daemon is reported by the calls that fail
                if self.closed:
                    return
                log.debug("heartbeat failed: %s", exc)

    def _make_transport(self) -> ZmqTransport | TcpTransport | WebSocketTransport:
        key = _WIRE_KEYS[self.wire]
        endpoint = self.info.get(key)
        if not endpoint:
            raise DaemonNotRunning(
                f"the daemon does not serve the {self.wire} wire: no '{key}' in {self.source}"
            )
        common = {"connect_timeout": self.connect_timeout}
        if self.wire == "zmq":
            pub = self.info.get("zmq_pub")
            if not pub:
                raise DaemonNotRunning(f"no 'zmq_pub' endpoint in {self.source}")
            return ZmqTransport(
                str(endpoint),
                str(pub),
                str(self.info.get("token", "")),
                on_reply=self._on_reply,
                on_notification=self._on_notification,
                max_message_size=self.max_message_size,
                **common,
            )
        cls = TcpTransport if self.wire == "jsonrpc" else WebSocketTransport
        return cls(
            str(endpoint),
            on_message=self._on_message,
            on_lost=self._on_lost,
            max_frame=self.max_message_size,
            **common,
        )

    async def close(self) -> None:
        if self._closed and self._transport is None:
            return
        self._closed = True
        heartbeat, self._heartbeat = self._heartbeat, None
        if heartbeat is not None and heartbeat is not asyncio.current_task():
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await heartbeat
        transport, self._transport = self._transport, None
        if transport is not None:
            await transport.close()
        self._fail_pending(ConnectionError("the client was closed"))
        self._end_streams()

    async def __aenter__(self) -> AsyncClient:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        """True once closed or once the connection was lost."""
        return self._closed or self._lost is not None

    # requests

    async def call(
        self, method: str, params: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> Any:
        """Send one request and return its result (see the module docstring for errors)."""
        transport = self._transport
        if self._lost is not None:
            raise ConnectionError(str(self._lost))
        if transport is None:
            if not self._opened:
                raise ConnectionError("the client is not open; use connect() or await open()")
            raise ConnectionError("the client was closed")
        limit = self.timeout if timeout is None else timeout
        req_id = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[req_id] = fut
        sent = False
        try:
            async with asyncio.timeout(limit):
                await transport.send(req_id, method, {} if params is None else params)
                sent = True
                return await fut
        except TimeoutError:
            # Only ZeroMQ can hold a request back unsent (no connection to hand it to); a
            # stream wire has written it and merely waits for the socket to drain.
            if not sent and transport.wire == "zmq":
                raise ConnectionError(
                    f"cannot reach the ctxd daemon at {transport.endpoint} to send {method} "
                    f"(waited {limit:g}s); is it running?"
                ) from None
            raise TimeoutError(
                f"no reply to {method} from {transport.endpoint} within {limit:g}s; "
                "the daemon may be overloaded or gone"
            ) from None
        except asyncio.CancelledError:
            # Closing the client closes its sockets, which cancels a send still waiting
            # on them; that is the client going away, not the caller cancelling.
            task = asyncio.current_task()
            if self.closed and task is not None and not task.cancelling():
                raise ConnectionError(f"the client was closed before {method} completed") from None
            raise
        finally:
            self._pending.pop(req_id, None)

    def _on_reply(self, msg: dict[str, Any]) -> None:
        fut = self._pending.pop(msg.get("id"), None)
        if fut is None or fut.done():
            if "error" in msg and msg.get("id") is None:
                log.warning("error from the daemon for no request: %s", msg["error"])
            else:
                log.debug("reply to unknown or abandoned request %r", msg.get("id"))
            return
        err = msg.get("error")
        if err is not None:
            fut.set_exception(
                error_from_dict(err)
                if isinstance(err, dict)
                else InternalError(f"malformed error from the daemon: {err!r}")
            )
        else:
            fut.set_result(msg.get("result"))

    def _on_message(self, msg: Any) -> None:
        """A decoded JSON-RPC message: a reply, a notification, or a batch of them."""
        if isinstance(msg, list):
            for item in msg:
                self._on_message(item)
            return
        if not isinstance(msg, dict):
            log.warning("ignoring a non-object message from the daemon")
            return
        method = msg.get("method")
        if isinstance(method, str):
            if "id" in msg:
                log.warning("ignoring request %s from the daemon", method)
                return
            params = msg.get("params")
            self._on_notification(method, params if isinstance(params, dict) else {})
        else:
            self._on_reply(msg)

    def _on_lost(self, exc: BaseException) -> None:
        if self._closed:
            return
        lost = (
            exc
            if isinstance(exc, ConnectionError)
            else ConnectionError(f"connection to the ctxd daemon lost: {exc}")
        )
        log.warning("%s", lost)
        self._lost = lost
        self._fail_pending(lost)
        self._end_streams()

    def _fail_pending(self, exc: ConnectionError) -> None:
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(ConnectionError(str(exc)))

    # notifications

    async def subscribe(self, session_id: str) -> Any:
        """Receive the session's notifications from now on.

        On ZeroMQ this also subscribes the SUB socket and returns only once that
        subscription is in effect at the daemon (see `_zmq`).
        """
        result = await self.call("session/subscribe", {"sessionId": session_id})
        transport = self._transport
        if isinstance(transport, ZmqTransport):
            await transport.subscribe(session_id, SUBSCRIBE_SETTLE_TIMEOUT)
        self._subscribed.add(session_id)
        return result

    async def unsubscribe(self, session_id: str) -> Any:
        transport = self._transport
        if isinstance(transport, ZmqTransport):
            await transport.unsubscribe(session_id)
        self._subscribed.discard(session_id)
        return await self.call("session/unsubscribe", {"sessionId": session_id})

    @property
    def subscriptions(self) -> frozenset[str]:
        return frozenset(self._subscribed)

    def on_notification(self, callback: NotificationCallback) -> Callable[[], None]:
        """Call `callback(method, params)` for every notification; returns a remover."""
        # replaced, never mutated: delivery iterates a snapshot without locking
        self._callbacks = [*self._callbacks, callback]

        def remove() -> None:
            self._callbacks = [cb for cb in self._callbacks if cb is not callback]

        return remove

    def notifications(self, maxsize: int = 10_000) -> NotificationStream:
        """`async for method, params in client.notifications()`; registered on this call."""
        stream = NotificationStream(self, maxsize)
        if self._closed:
            stream._put(_END)
        else:
            self._streams.add(stream)
        return stream

    def _on_notification(self, method: str, params: dict[str, Any]) -> None:
        for callback in self._callbacks:
            try:
                callback(method, params)
            except Exception:
                log.exception("notification callback %r failed on %s", callback, method)
        for stream in list(self._streams):
            stream._put((method, params))

    def _end_streams(self) -> None:
        for stream in list(self._streams):
            stream._put(_END)
        self._streams = weakref.WeakSet()
        hooks, self._end_hooks = self._end_hooks, []
        for hook in hooks:
            hook()


async def connect_async(
    connection_file: str | os.PathLike[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    wire: Wire = "zmq",
    timeout: float = DEFAULT_TIMEOUT,
    **options: Any,
) -> AsyncClient:
    """`AsyncClient.connect`: find the daemon, connect, authenticate."""
    return await AsyncClient.connect(connection_file, data_dir, wire, timeout, **options)


# blocking client


class _IoThread:
    """An event loop on a daemon thread, running the coroutines of one `Client`."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(
        self,
        coro: Coroutine[Any, Any, R],
        timeout: float | None,
        track: set[concurrent.futures.Future[Any]] | None = None,
    ) -> R:
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        if track is not None:
            track.add(fut)
            fut.add_done_callback(track.discard)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            if fut.done():
                raise  # the call's own TimeoutError (the same class since Python 3.11)
            fut.cancel()
            raise TimeoutError(
                f"the client's I/O thread did not answer within {timeout}s"
            ) from None

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5.0)
        if not self._thread.is_alive():
            self.loop.close()


class SyncNotificationStream(Iterator[tuple[str, dict[str, Any]]]):
    """A blocking iterator of `(method, params)`.

    Ends when the client closes, or when no notification arrives within `timeout`
    seconds (when a timeout is given). Drops the oldest beyond `maxsize`.
    """

    def __init__(self, client: Client, timeout: float | None, maxsize: int) -> None:
        self._queue: queue.Queue[Any] = queue.Queue()
        self._maxsize = maxsize
        self._timeout = timeout
        self.dropped = 0
        self._remove = client._add_stream(self)

    def _put(self, item: Any) -> None:
        # runs on the I/O thread only, so size check and drop cannot race another producer
        while item is not _END and self._queue.qsize() >= self._maxsize:
            try:
                self._queue.get_nowait()
                self.dropped += 1
            except queue.Empty:
                break
        self._queue.put(item)

    def __next__(self) -> tuple[str, dict[str, Any]]:
        try:
            item = self._queue.get(timeout=self._timeout)
        except queue.Empty:
            raise StopIteration from None
        if item is _END:
            self._queue.put(_END)
            raise StopIteration
        return item  # type: ignore[no-any-return]

    def close(self) -> None:
        self._remove()
        self._queue.put(_END)

    def __enter__(self) -> SyncNotificationStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Client(_Methods[Any]):
    """A blocking client, safe to share between threads.

    It runs an `AsyncClient` on a private I/O thread; every call is handed to that
    thread and replies are matched by id, so concurrent calls from many threads are
    in flight at once. Notification callbacks run on the I/O thread: keep them short,
    and do not make calls from inside them (that would wait on the thread running it).
    """

    def __init__(
        self,
        info: Mapping[str, Any],
        wire: Wire = "zmq",
        *,
        timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        client_name: str = CLIENT_NAME,
        max_message_size: int = DEFAULT_MAX_FRAME,
        source: str | None = None,
    ) -> None:
        _check_wire(wire)
        self.wire: Wire = wire
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._options: dict[str, Any] = {
            "timeout": timeout,
            "connect_timeout": connect_timeout,
            "client_name": client_name,
            "max_message_size": max_message_size,
            "source": source,
        }
        self._info = dict(info)
        self._io: _IoThread | None = None
        self._async: AsyncClient | None = None
        self._lock = threading.Lock()
        # calls handed to the I/O thread and not finished yet
        self._inflight: set[concurrent.futures.Future[Any]] = set()
        # replaced, never mutated: the I/O thread iterates snapshots without locking
        self._callbacks: list[NotificationCallback] = []
        self._streams: list[SyncNotificationStream] = []
        # the calling threads' direct line (see `_lane`), made on the first call
        self._lane: ZmqLane | TcpLane | None = None
        self._lane_wanted = wire in ("zmq", "jsonrpc")
        self._lane_beat: concurrent.futures.Future[None] | None = None

    @classmethod
    def connect(
        cls,
        connection_file: str | os.PathLike[str] | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        wire: Wire = "zmq",
        timeout: float = DEFAULT_TIMEOUT,
        **options: Any,
    ) -> Client:
        """Find the daemon through its connection file and open a connection to it."""
        _check_wire(wire)
        path, info = find_daemon(connection_file, data_dir)
        client = cls(info, wire, timeout=timeout, source=str(path), **options)
        client.open()
        return client

    def open(self) -> None:
        with self._lock:
            if self._io is not None:
                return
            io = _IoThread(f"ctxd-client-{self.wire}")
            try:
                self._async = io.run(self._make_async(), None)
            except BaseException:
                io.stop()
                raise
            self._io = io

    async def _make_async(self) -> AsyncClient:
        client = AsyncClient(self._info, self.wire, **self._options)
        client.on_notification(self._deliver)
        client._end_hooks.append(self._end_streams)
        await client.open()
        return client

    def close(self) -> None:
        with self._lock:
            io, client = self._io, self._async
            if io is None or client is None:
                return
            self._io = None
            self._close_lane()
            try:
                io.run(client.close(), 10.0)
                # Closing failed every waiting call; let them hand their ConnectionError to
                # their threads before the loop stops, or those threads would wait forever.
                concurrent.futures.wait(set(self._inflight), timeout=5.0)
            except Exception:
                log.debug("error while closing the client", exc_info=True)
            finally:
                io.stop()
        self._end_streams()

    def __enter__(self) -> Client:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._async is None or self._async.closed

    @property
    def server_info(self) -> dict[str, Any] | None:
        return self._async.server_info if self._async is not None else None

    def _run(self, coro: Coroutine[Any, Any, R], timeout: float | None) -> R:
        io, client = self._io, self._async
        if io is None or client is None or client.closed:
            coro.close()
            if client is not None and client._lost is not None:
                raise ConnectionError(str(client._lost))
            if client is not None:
                raise ConnectionError("the client was closed")
            raise ConnectionError("the client is not open; use connect() or open()")
        if threading.get_ident() == io.ident:
            coro.close()
            raise RuntimeError(
                "a Client cannot make calls from a notification callback (it runs on the "
                "client's I/O thread); hand the work to another thread"
            )
        # the call has its own deadline; this one only guards against a stuck I/O thread
        return io.run(coro, None if timeout is None else timeout + 5.0, self._inflight)

    def call(
        self, method: str, params: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> Any:
        """Send one request and return its result (see the module docstring for errors)."""
        limit = self.timeout if timeout is None else timeout
        client = self._async
        if client is None:
            raise ConnectionError("the client is not open; use connect() or open()")
        io = self._io
        if (
            method not in VIA_IO_THREAD
            and io is not None
            and not client.closed
            and threading.get_ident() != io.ident
        ):
            lane = self._lane or self._open_lane(client, io)
            # a lane another thread is using: this call goes through the I/O thread
            if lane is not None and lane.lock.acquire(blocking=False):
                try:
                    if lane.lost is not None:
                        raise ConnectionError(str(lane.lost))
                    if not lane.closing:
                        return lane.call(method, {} if params is None else params, limit)
                except NotSent:
                    pass  # not connected: the I/O thread waits for the connection
                finally:
                    lane.lock.release()
        return self._run(client.call(method, params, timeout=limit), limit)

    def _open_lane(self, client: AsyncClient, io: _IoThread) -> ZmqLane | TcpLane | None:
        if not self._lane_wanted or not self._lock.acquire(blocking=False):
            return None
        try:
            if self._lane is not None or self._io is not io:
                return self._lane
            self._lane_wanted = False  # one attempt: without a lane, calls still work
            transport = client._transport
            token = str(self._info.get("token", ""))
            try:
                if isinstance(transport, ZmqTransport) and transport._ctx is not None:
                    lane: ZmqLane | TcpLane = ZmqLane(
                        transport._ctx, transport.router_endpoint, token,
                        connect_timeout=self.connect_timeout,
                        max_message_size=client.max_message_size,
                    )
                    lease = (client.server_info or {}).get("capabilities", {}).get(
                        "runLeaseSeconds"
                    )
                    if isinstance(lease, int | float) and lease > 0:
                        self._lane_beat = asyncio.run_coroutine_threadsafe(
                            _lane_heartbeats(lane, float(lease)), io.loop
                        )
                elif isinstance(transport, TcpTransport):
                    lane = TcpLane(
                        transport.endpoint, token, connect_timeout=self.connect_timeout,
                        max_frame=client.max_message_size,
                    )
                else:
                    return None
            except Exception as exc:
                log.debug("no direct line to the daemon (%s); calls use the I/O thread", exc)
                return None
            self._lane = lane
            return lane
        finally:
            self._lock.release()

    def _close_lane(self) -> None:
        lane, self._lane = self._lane, None
        if self._lane_beat is not None:
            self._lane_beat.cancel()
            self._lane_beat = None
        if lane is None:
            return
        lane.closing = True
        # a call on it sees `closing` within a slice of its wait and lets go
        got = lane.lock.acquire(timeout=5.0)
        try:
            lane.close()
        finally:
            if got:
                lane.lock.release()

    def subscribe(self, session_id: str) -> Any:
        """Receive the session's notifications; on ZeroMQ returns once they flow."""
        client = self._async
        if client is None:
            raise ConnectionError("the client is not open; use connect() or open()")
        return self._run(client.subscribe(session_id), self.timeout + SUBSCRIBE_SETTLE_TIMEOUT)

    def unsubscribe(self, session_id: str) -> Any:
        client = self._async
        if client is None:
            raise ConnectionError("the client is not open; use connect() or open()")
        return self._run(client.unsubscribe(session_id), self.timeout)

    def on_notification(self, callback: NotificationCallback) -> Callable[[], None]:
        """Call `callback(method, params)` on the I/O thread for every notification.

        May be registered before `open()`; returns a function that removes it.
        """
        self._callbacks = [*self._callbacks, callback]

        def remove() -> None:
            self._callbacks = [cb for cb in self._callbacks if cb is not callback]

        return remove

    def notifications(
        self, timeout: float | None = None, maxsize: int = 10_000
    ) -> SyncNotificationStream:
        """A blocking iterator of notifications, registered on this call."""
        return SyncNotificationStream(self, timeout, maxsize)

    def _add_stream(self, stream: SyncNotificationStream) -> Callable[[], None]:
        self._streams = [*self._streams, stream]
        if self._async is not None and self._async.closed:
            stream._put(_END)

        def remove() -> None:
            self._streams = [s for s in self._streams if s is not stream]

        return remove

    def _deliver(self, method: str, params: dict[str, Any]) -> None:
        for callback in self._callbacks:
            try:
                callback(method, params)
            except Exception:
                log.exception("notification callback %r failed on %s", callback, method)
        for stream in self._streams:
            stream._put((method, params))

    def _end_streams(self) -> None:
        for stream in self._streams:
            stream._put(_END)


async def _lane_heartbeats(lane: ZmqLane, lease: float) -> None:
    # runs opened through the lane belong to its socket: keep their lease like the main one
    period = max(0.05, lease / 3)
    while True:
        await asyncio.sleep(period)
        if time.monotonic() - lane.last_used >= period:
            await asyncio.to_thread(lane.heartbeat, period)


def connect(
    connection_file: str | os.PathLike[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    wire: Wire = "zmq",
    timeout: float = DEFAULT_TIMEOUT,
    **options: Any,
) -> Client:
    """`Client.connect`: find the daemon, connect, authenticate; returns a blocking client."""
    return Client.connect(connection_file, data_dir, wire, timeout, **options)
