"""The blocking client (`Client`): an `AsyncClient` on a private I/O thread, and a direct
line for the calling thread (`_lane`). See `client.py`."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import queue
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping
from typing import Any

from ctxd.clients._jsonrpc import TcpTransport
from ctxd.clients._lane import VIA_IO_THREAD, NotSent, TcpLane, ZmqLane
from ctxd.clients._zmq import ZmqTransport
from ctxd.clients.client_async import AsyncClient
from ctxd.clients.client_common import (
    _END,
    CLIENT_NAME,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_TIMEOUT,
    SUBSCRIBE_SETTLE_TIMEOUT,
    NotificationCallback,
    R,
    Wire,
    _Callbacks,
    _check_wire,
    find_daemon,
    log,
)
from ctxd.clients.client_methods import _Methods
from ctxd.protocol.codec import DEFAULT_MAX_FRAME


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


class Client(_Methods[Any], _Callbacks):
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
        self._run_callbacks(method, params)
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
