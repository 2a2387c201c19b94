"""Client side of the JSON-RPC wires: TCP with Content-Length framing, and WebSocket.

Both deliver every decoded message to `on_message`: replies (with `id`) and
notifications (with `method`, no `id`) are told apart by the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from ctxd.protocol.codec import (
    DEFAULT_MAX_FRAME,
    FrameReader,
    dumps_json,
    frame,
    loads_json,
    request,
)
from ctxd.protocol.connection import split_endpoint
from ctxd.protocol.errors import PayloadTooLarge

log = logging.getLogger("ctxd.client")

MessageSink = Callable[[Any], None]
LostSink = Callable[[BaseException], None]

# Above this much unsent output, a sender waits for the socket to drain.
_DRAIN_ABOVE = 256 * 1024


def _encode(req_id: int, method: str, params: Any, max_frame: int) -> bytes:
    body = dumps_json(request(req_id, method, params))
    if len(body) > max_frame:
        raise PayloadTooLarge(
            f"request of {len(body)} bytes exceeds the limit of {max_frame}; send smaller batches"
        )
    return body


class TcpTransport:
    wire = "jsonrpc"

    def __init__(
        self,
        address: str,
        *,
        on_message: MessageSink,
        on_lost: LostSink,
        connect_timeout: float = 5.0,
        max_frame: int = DEFAULT_MAX_FRAME,
    ) -> None:
        self.endpoint = address
        self._on_message = on_message
        self._on_lost = on_lost
        self.connect_timeout = connect_timeout
        self.max_frame = max_frame
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        # an absolute path is the daemon's JSON-RPC Unix socket (`jsonrpc_unix`)
        if self.endpoint.startswith("/"):
            opening = asyncio.open_unix_connection(self.endpoint)
        else:
            host, port = split_endpoint(self.endpoint)
            opening = asyncio.open_connection(host, port)
        try:
            self._reader, self._writer = await asyncio.wait_for(opening, self.connect_timeout)
        except TimeoutError:
            raise ConnectionRefusedError(
                f"no answer from {self.endpoint} within {self.connect_timeout:g}s"
            ) from None
        except OSError as exc:
            raise ConnectionRefusedError(
                f"cannot connect to {self.endpoint}: {exc.strerror or exc}"
            ) from None
        self._task = asyncio.create_task(self._read_loop(self._reader), name="ctxd-tcp-reader")

    async def send(self, req_id: int, method: str, params: Any) -> None:
        writer = self._writer
        if writer is None or writer.is_closing():
            raise ConnectionError(f"the connection to {self.endpoint} is closed")
        writer.write(frame(_encode(req_id, method, params, self.max_frame)))
        if writer.transport.get_write_buffer_size() > _DRAIN_ABOVE:
            await writer.drain()

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        frames = FrameReader(self.max_frame)
        try:
            while True:
                data = await reader.read(256 * 1024)
                if not data:
                    raise ConnectionError(f"the daemon at {self.endpoint} closed the connection")
                for body in frames.feed(data):
                    try:
                        msg = loads_json(body)
                    except Exception as exc:
                        log.warning("undecodable message from %s: %s", self.endpoint, exc)
                        continue
                    self._on_message(msg)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._on_lost(exc)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._writer.wait_closed(), 1.0)
            self._writer = None


class WebSocketTransport:
    wire = "websocket"

    def __init__(
        self,
        uri: str,
        *,
        on_message: MessageSink,
        on_lost: LostSink,
        connect_timeout: float = 5.0,
        max_frame: int = DEFAULT_MAX_FRAME,
    ) -> None:
        self.endpoint = uri
        self._on_message = on_message
        self._on_lost = on_lost
        self.connect_timeout = connect_timeout
        self.max_frame = max_frame
        self._ws: ClientConnection | None = None
        self._task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        try:
            self._ws = await ws_connect(
                self.endpoint,
                open_timeout=self.connect_timeout,
                max_size=self.max_frame,
                # loopback: deflate only costs CPU; and never route the daemon via a proxy
                compression=None,
                proxy=None,
            )
        except TimeoutError:
            raise ConnectionRefusedError(
                f"no answer from {self.endpoint} within {self.connect_timeout:g}s"
            ) from None
        except OSError as exc:
            raise ConnectionRefusedError(
                f"cannot connect to {self.endpoint}: {exc.strerror or exc}"
            ) from None
        except (InvalidHandshake, InvalidURI) as exc:
            raise ConnectionRefusedError(
                f"WebSocket handshake with {self.endpoint} failed: {exc}"
            ) from None
        self._task = asyncio.create_task(self._read_loop(self._ws), name="ctxd-ws-reader")

    async def send(self, req_id: int, method: str, params: Any) -> None:
        ws = self._ws
        if ws is None:
            raise ConnectionError(f"the connection to {self.endpoint} is closed")
        try:
            await ws.send(_encode(req_id, method, params, self.max_frame), text=True)
        except ConnectionClosed as exc:
            raise ConnectionError(f"the connection to {self.endpoint} is closed: {exc}") from None

    async def _read_loop(self, ws: ClientConnection) -> None:
        try:
            async for message in ws:
                try:
                    msg = loads_json(message)
                except Exception as exc:
                    log.warning("undecodable message from %s: %s", self.endpoint, exc)
                    continue
                self._on_message(msg)
            raise ConnectionError(f"the daemon at {self.endpoint} closed the connection")
        except asyncio.CancelledError:
            raise
        except ConnectionClosed as exc:
            self._on_lost(
                ConnectionError(f"the daemon at {self.endpoint} closed the connection ({exc})")
            )
        except Exception as exc:
            self._on_lost(exc)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._ws.close(), 1.0)
            self._ws = None
