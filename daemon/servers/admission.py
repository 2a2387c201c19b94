"""Who gets a descriptor: the process's descriptor budget and each wire's accept loop.

A local process without the token can open connections as fast as the kernel lets it.
Each one costs the daemon a descriptor, and when the descriptors run out it is not the
attacker who fails but whatever opens the next file: libzmq asserts (and aborts the
process) when it cannot create a socket's internal pipe, SQLite cannot open its journal.
So:

* at start the soft `RLIMIT_NOFILE` is raised to the hard limit;
* `RESERVED_DESCRIPTORS` of them are kept for ZeroMQ, SQLite, logs and worker threads:
  the JSON-RPC wires never hold a descriptor numbered above the rest;
* each wire holds at most `max_connections` authenticated clients plus
  `max_unauthenticated` connections that have not proven the token yet (the WebSocket
  handshake included). When the unauthenticated quota is full the wire stops calling
  `accept()` until one of them logs in or goes away: further connections wait in the
  kernel's backlog and cost the daemon nothing.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("ctxd.servers.admission")

# descriptors kept free for everything that is not a JSON-RPC client
RESERVED_DESCRIPTORS = 128
# the two JSON-RPC wires share what is left
JSONRPC_WIRES = 2
# the soft limit is raised at most this far (select()-free code, but memory per fd)
_MAX_SOFT_LIMIT = 1 << 20
# after an accept() that failed for want of resources, wait this long before the next
_RETRY_DELAY = 0.1


@dataclass(frozen=True)
class Budget:
    """What the descriptor limit leaves for each JSON-RPC wire."""

    limit: int  # the soft RLIMIT_NOFILE in effect
    ceiling: int  # a wire never keeps a connection whose descriptor is >= this
    max_connections: int  # authenticated clients per wire
    max_unauthenticated: int  # connections before login per wire


def raise_descriptor_limit() -> int:
    """Raise the soft descriptor limit to the hard one; return the limit in effect."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else _MAX_SOFT_LIMIT
    target = min(target, _MAX_SOFT_LIMIT)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the descriptor limit from %d to %d: %s", soft, target, exc)
    return soft if soft != resource.RLIM_INFINITY else _MAX_SOFT_LIMIT


def plan_budget(limit: int, max_connections: int, max_unauthenticated: int) -> Budget:
    """Fit the configured per-wire quotas into `limit` descriptors minus the reserve."""
    ceiling = max(limit - RESERVED_DESCRIPTORS, limit // 2)
    per_wire = max(2, (ceiling - 32) // JSONRPC_WIRES)  # 32: stdio, listeners, epoll...
    unauth = max(1, min(max_unauthenticated, per_wire // 4))
    conns = max(1, min(max_connections, per_wire - unauth))
    if (conns, unauth) != (max_connections, max_unauthenticated):
        log.warning(
            "descriptor limit %d: serving at most %d clients and %d connections before "
            "login per wire (configured %d and %d); raise `ulimit -n` for more",
            limit, conns, unauth, max_connections, max_unauthenticated,
        )
    return Budget(limit, ceiling, conns, unauth)


class Gate:
    """Counts a wire's connections that have not logged in; closed while the quota is full.

    While it is full, the login deadline shrinks to `pressure_grace` for the connections
    already in: a client with the token logs in within milliseconds of connecting, so
    under a flood the places go to new connections quickly instead of every 5 s.
    """

    def __init__(
        self, max_unauthenticated: int, ceiling: int | None = None, pressure_grace: float = 1.0
    ) -> None:
        self.max_unauthenticated = max(1, max_unauthenticated)
        self.ceiling = ceiling
        self.pressure_grace = pressure_grace
        # key -> (when it came in, how to drop it)
        self._pending: dict[object, tuple[float, Callable[[], None] | None]] = {}
        self._open = asyncio.Event()
        self._open.set()
        self._sweep: asyncio.TimerHandle | None = None

    @property
    def pending(self) -> int:
        return len(self._pending)

    def enter(self, key: object, drop: Callable[[], None] | None = None) -> None:
        self._pending[key] = (time.monotonic(), drop)
        if len(self._pending) >= self.max_unauthenticated:
            self._open.clear()
            self._schedule_sweep()

    def leave(self, key: object) -> None:
        """`key` logged in or went away (idempotent)."""
        self._pending.pop(key, None)
        if len(self._pending) < self.max_unauthenticated:
            self._open.set()

    def _schedule_sweep(self) -> None:
        if self._sweep is None:
            loop = asyncio.get_running_loop()
            self._sweep = loop.call_later(self.pressure_grace, self._drop_stale)

    def _drop_stale(self) -> None:
        self._sweep = None
        if len(self._pending) < self.max_unauthenticated:
            return
        cutoff = time.monotonic() - self.pressure_grace
        stale = [drop for when, drop in list(self._pending.values())
                 if when <= cutoff and drop is not None]
        if stale:
            log.info("%d connections before login dropped: the quota is full", len(stale))
        for drop in stale:
            try:
                drop()
            except Exception:
                log.exception("cannot drop a connection before login")
        if len(self._pending) >= self.max_unauthenticated:
            self._schedule_sweep()

    async def wait_open(self) -> None:
        await self._open.wait()


class Acceptor:
    """An accept loop on one listening socket that honours a `Gate`.

    asyncio's own server loop accepts whenever the socket is readable; this one first
    waits for the gate, so a full quota leaves connections queued in the kernel.
    """

    def __init__(
        self,
        listener: socket.socket,
        gate: Gate,
        factory: Callable[[], asyncio.Protocol],
        name: str,
    ) -> None:
        self.listener = listener
        self.gate = gate
        self.factory = factory
        self.name = name
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self.gate.wait_open()
            try:
                sock, _addr = await loop.sock_accept(self.listener)
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.warning("%s: accept failed (%s); retrying shortly", self.name, exc)
                    await asyncio.sleep(_RETRY_DELAY)
                    continue
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EINTR, errno.EAGAIN):
                    continue
                log.exception("%s: accept failed; the wire stops accepting", self.name)
                return
            ceiling = self.gate.ceiling
            fd = sock.fileno()
            if ceiling is not None and fd >= ceiling:
                # descriptors above the ceiling belong to ZeroMQ and SQLite
                sock.close()
                log.warning(
                    "%s: refusing a connection: descriptor %d reaches the reserve (from %d)",
                    self.name, fd, ceiling,
                )
                await asyncio.sleep(_RETRY_DELAY)
                continue
            try:
                await loop.connect_accepted_socket(self.factory, sock)
            except Exception:
                log.exception("%s: cannot set up an accepted connection", self.name)
                sock.close()


def bind_listener(host: str, port: int, backlog: int = 128) -> socket.socket:
    """A non-blocking listening TCP socket on `host:port` (0 picks a free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=backlog)
    sock.setblocking(False)
    return sock
