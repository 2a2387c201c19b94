"""Bounds of `ctxd mcp` against clients that hold what they open.

Over streamable HTTP, anyone on the machine can connect before the bearer token is
checked. 1,100 idle connections at the usual 1024-descriptor limit made the server
exit: asyncio's accept loop hit EMFILE, logged it, and the log handler died opening a
file it imports lazily. And MCP sessions were never closed. Here:

- the soft descriptor limit is raised to the hard one, and connections are capped below
  it (`connection_cap`): a connection past the cap closes the oldest idle one (no request
  in flight), or itself when every one is busy, so descriptors never run out on
  connections and a new client still gets in;
- a connection must send a whole request header within `HEADER_SECONDS` (h11 bounds its
  size), and an idle keep-alive connection closes after `KEEP_ALIVE_SECONDS`;
- the loop's exception handler writes one plain line for a failed accept, so running out
  of descriptors anyway (other processes, a low hard limit) costs a paused accept, never
  the process;
- MCP sessions close after an idle time, and past a cap the least recently used closes
  (`SessionCap`).

Over stdio, one JSON-RPC message is one line: a line longer than `--max-line-bytes` is
skipped to its end, never held whole, and answered with a JSON-RPC error
(`bounded_stdio_lines`).
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import resource
import sys
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_SECONDS = 10.0
KEEP_ALIVE_SECONDS = 5
MAX_HEADER_BYTES = 16 * 1024
# descriptors kept for what is not a client connection (the daemon link, the event loop,
# log files, imports)
RESERVED_DESCRIPTORS = 64
MAX_SOFT_LIMIT = 1 << 16
DEFAULT_MAX_CONNECTIONS = 256
DEFAULT_MAX_SESSIONS = 64
DEFAULT_SESSION_IDLE_SECONDS = 15 * 60.0
DEFAULT_MAX_LINE_BYTES = 4 * 1024 * 1024
INVALID_REQUEST = -32600


def say(text: str) -> None:
    """One line on stderr, where `ctxd mcp` reports (no logging machinery: it must work
    when no descriptor is left)."""
    try:
        sys.stderr.write(f"ctxd mcp: {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def raise_descriptor_limit() -> int:
    """Raise the soft descriptor limit to the hard one; the limit in effect."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(hard if hard != resource.RLIM_INFINITY else MAX_SOFT_LIMIT, MAX_SOFT_LIMIT)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft if soft != resource.RLIM_INFINITY else MAX_SOFT_LIMIT


# connections asyncio accepts in one go: they hold descriptors until the loop has run
# their `connection_made` and closed the ones past the cap, a few batches later
ACCEPT_BATCH = 16
LISTEN_QUEUE = 128


def connection_cap(wanted: int, limit: int) -> int:
    """At most `wanted` connections, within half of `limit` descriptors less the
    reserve (the other half: connections accepted and not yet closed)."""
    return max(4, min(wanted, (limit - RESERVED_DESCRIPTORS) // 2))


def bounded_protocol(cap: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a connection cap and a header deadline."""

    class BoundedH11(H11Protocol):
        _opened = 0.0
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._opened = time.monotonic()
            self._header_timer = self.loop.call_later(HEADER_SECONDS, self._no_request)
            # (connections already closing leave the set a loop iteration later)
            live = [c for c in self.connections if not c.transport.is_closing()]
            if len(live) > cap:
                idle = [c for c in live
                        if isinstance(c, BoundedH11) and c is not self and c._idle()]
                victim = min(idle, key=lambda c: c._opened) if idle else self
                victim.transport.close()

        def _idle(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _no_request(self) -> None:
            # no request header in time: a slot held by nobody who speaks
            if self.cycle is None and not self.transport.is_closing():
                self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            super().connection_lost(exc)

    return BoundedH11


def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """A failed accept (EMFILE, ENFILE...) becomes one line on stderr: asyncio pauses
    accepting for a second and tries again. The default handler logs through handlers
    that may need a descriptor themselves."""
    default = loop.get_exception_handler()
    last = [0.0]

    def handle(lp: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in (
            errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM,
        ):
            now = time.monotonic()
            if now - last[0] > 5:
                last[0] = now
                say(f"cannot accept a connection ({os.strerror(exc.errno)}); retrying")
            return
        if default is not None:
            default(lp, context)
        else:
            lp.default_exception_handler(context)

    loop.set_exception_handler(handle)


class BoundedServer(uvicorn.Server):
    async def startup(self, sockets: list[Any] | None = None) -> None:
        quiet_accept_errors(asyncio.get_running_loop())
        await super().startup(sockets=sockets)
        for sock in sockets or ():
            # asyncio listened with its accept batch as the queue: a longer queue lets
            # a client wait in it rather than retry its handshake
            sock.listen(LISTEN_QUEUE)


class SessionCap:
    """ASGI wrapper: at most `cap` MCP sessions; opening one more closes the least
    recently used. (The SDK closes sessions idle for its idle timeout itself.)"""

    def __init__(self, app: Any, manager: Any, cap: int) -> None:
        self.app = app
        self.manager = manager
        self.cap = cap
        self._used: OrderedDict[str, None] = OrderedDict()

    def _open(self) -> dict[str, Any]:
        # the SDK's table of open sessions (no public accessor)
        return self.manager._server_instances  # type: ignore[no-any-return]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sid = dict(scope.get("headers") or ()).get(b"mcp-session-id")
        if sid is not None:
            key = sid.decode("latin-1")
            if key in self._used:
                self._used.move_to_end(key)
        elif scope.get("method") == "POST":
            await self._make_room()

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                for name, value in message.get("headers") or ():
                    if name.lower() == b"mcp-session-id":
                        self._used[value.decode("latin-1")] = None
            await send(message)

        await self.app(scope, receive, sending)

    async def _make_room(self) -> None:
        open_ = self._open()
        for key in [k for k in self._used if k not in open_]:
            del self._used[key]  # closed by its client or by the idle timeout
        while len(open_) >= self.cap and self._used:
            key, _ = self._used.popitem(last=False)
            transport = open_.get(key)
            if transport is not None:
                await self.manager._discard_session(key, transport)
                say(f"closed the least recently used MCP session {key}: "
                    f"{len(open_)} open, at most {self.cap}")


async def bounded_stdio_lines(
    stdin: Any, write_error: Any, max_line: int
) -> AsyncIterator[str]:
    """The lines of `stdin` (a binary file), each at most `max_line` bytes; a longer one
    is read to its end in chunks, dropped, and answered through `write_error`."""
    import anyio

    buf = bytearray()
    skipping = False
    while True:
        chunk: bytes = await anyio.to_thread.run_sync(stdin.read1, 1 << 16)
        if not chunk:
            if buf and not skipping:
                yield buf.decode("utf-8", "replace")
            return
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            piece = chunk[start:] if nl < 0 else chunk[start:nl]
            if not skipping:
                buf += piece
                if len(buf) > max_line:
                    skipping = True
                    buf.clear()
            if nl < 0:
                break
            if skipping:
                skipping = False
                await write_error(too_long(max_line))
            elif buf:
                yield buf.decode("utf-8", "replace")
                buf.clear()
            start = nl + 1


def too_long(max_line: int) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": None, "error": {
        "code": INVALID_REQUEST,
        "message": f"a line of more than {max_line} bytes: refused (one JSON-RPC message "
                   f"per line, at most {max_line} bytes; ctxd mcp --max-line-bytes)"}})
