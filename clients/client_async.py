"""The asyncio client (`AsyncClient`): one connection over one wire, replies matched to
concurrent awaits by request id. See `client.py`."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ctxd.clients._jsonrpc import TcpTransport, WebSocketTransport
from ctxd.clients._zmq import ZmqTransport
from ctxd.clients.client_common import (
    _END,
    _WIRE_KEYS,
    CLIENT_NAME,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_TIMEOUT,
    SUBSCRIBE_SETTLE_TIMEOUT,
    DaemonNotAuthentic,
    DaemonNotRunning,
    NotificationCallback,
    Wire,
    _Callbacks,
    _check_wire,
    find_daemon,
    log,
)
from ctxd.clients.client_methods import _Methods
from ctxd.protocol import auth
from ctxd.protocol.codec import DEFAULT_MAX_FRAME
from ctxd.protocol.errors import InternalError, error_from_dict


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


class AsyncClient(_Methods[Awaitable[Any]], _Callbacks):
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
                await self.heartbeat(timeout=period)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a lost daemon is reported by the calls that fail
                if self.closed:
                    return
                log.debug("heartbeat failed: %s", exc)

    def _make_transport(self) -> ZmqTransport | TcpTransport | WebSocketTransport:
        key = _WIRE_KEYS[self.wire]
        endpoint = self.info.get(key)
        if self.wire == "jsonrpc" and self.info.get("jsonrpc_unix"):
            # the same wire on a socket only this user can open: no other local user
            # can hold its logins up (TCP's quota before login is shared with them)
            endpoint = self.info["jsonrpc_unix"]
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
        result = await super().subscribe(session_id)
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
        return await super().unsubscribe(session_id)

    @property
    def subscriptions(self) -> frozenset[str]:
        return frozenset(self._subscribed)

    def notifications(self, maxsize: int = 10_000) -> NotificationStream:
        """`async for method, params in client.notifications()`; registered on this call."""
        stream = NotificationStream(self, maxsize)
        if self._closed:
            stream._put(_END)
        else:
            self._streams.add(stream)
        return stream

    def _on_notification(self, method: str, params: dict[str, Any]) -> None:
        self._run_callbacks(method, params)
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
