"""Per-server state of the JSON-RPC wires: limits, the connection sets, the quota gate."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from ctxd.daemon.servers.admission import Gate
from ctxd.daemon.servers.base import Connection, EventHub, RequestHandler
from ctxd.protocol.codec import DEFAULT_MAX_FRAME
from ctxd.protocol.connection import format_hostport
from ctxd.protocol.errors import CtxdError, InternalError

log = logging.getLogger("ctxd.servers.jsonrpc")

DEFAULT_MAX_QUEUE_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_CONNECTIONS = 1024
DEFAULT_MAX_UNAUTHENTICATED = 32
DEFAULT_MAX_INFLIGHT = 1024
DEFAULT_MAX_BATCH = 256
DEFAULT_CLOSE_GRACE = 5.0
# before login a frame carries `initialize` only: its params are a few hundred bytes
PREAUTH_MAX_FRAME = 64 * 1024
_CLOSE_FLUSH_TIMEOUT = 5.0


@dataclass(frozen=True)
class WireLimits:
    """The bounds of one listening JSON-RPC server (TCP, Unix socket or WebSocket): what
    `daemon/app.py` sets from the config, and what a test of a wire changes.

    `max_frame`: the largest request frame (before login `PREAUTH_MAX_FRAME`);
    `max_queue_bytes`: unsent output before a client is dropped (events are shed from
    three quarters of it); `max_connections`: logged-in clients; `max_inflight`: requests
    of one connection running at once; `require_login`: `initialize` first, within
    `login_timeout` seconds, at most `max_unauthenticated` connections waiting to;
    `max_batch`: requests in one batch; `max_reply_bytes`: the largest reply (None: the
    frame limit, at least 1 MiB); `fd_ceiling`: descriptors left for the process before
    the wire stops accepting (see admission.py).
    """

    max_frame: int = DEFAULT_MAX_FRAME
    max_queue_bytes: int = DEFAULT_MAX_QUEUE_BYTES
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_inflight: int = DEFAULT_MAX_INFLIGHT
    require_login: bool = False
    login_timeout: float | None = None
    max_unauthenticated: int = DEFAULT_MAX_UNAUTHENTICATED
    max_batch: int = DEFAULT_MAX_BATCH
    max_reply_bytes: int | None = None
    fd_ceiling: int | None = None


# a bare transport's limits (what the wire tests start with): no login, the defaults
BARE_LIMITS = WireLimits()


def peer_name(addr: Any) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        return format_hostport(str(addr[0]), int(addr[1]))
    return str(addr or "")


def too_many_connections(limit: int) -> CtxdError:
    return InternalError(
        f"the daemon serves at most {limit} connections; close idle clients and retry",
        {"reason": "too_many_connections", "limit": limit},
    )




class ServerCore:
    """State shared by all connections of one listening server.

    With `require_login` (what the daemon uses) a connection must log in with one
    `initialize` request before anything else: see `JsonRpcConnection._login`. Without
    it (a bare transport, as the wire tests use) every connection counts as a client.
    """

    def __init__(self, handler: RequestHandler, hub: EventHub, limits: WireLimits) -> None:
        self.handler = handler
        self.hub = hub
        self.limits = limits
        self.max_frame = limits.max_frame
        self.max_queue_bytes = limits.max_queue_bytes
        self.max_connections = limits.max_connections
        self.max_inflight = max(1, limits.max_inflight)
        self.require_login = limits.require_login
        self.login_timeout = limits.login_timeout
        self.max_batch = max(1, limits.max_batch)
        self.max_reply_bytes = limits.max_reply_bytes or max(limits.max_frame, 1 << 20)
        self.preauth_max_frame = min(limits.max_frame, PREAUTH_MAX_FRAME)
        self.gate = Gate(
            limits.max_unauthenticated if limits.require_login else limits.max_connections,
            limits.fd_ceiling,
        )
        # JsonRpcConnections (rpc_core.py, which builds on this module)
        self.connections: set[Connection] = set()
        self.clients: set[Connection] = set()  # logged in (all, without login)
        # every running request task of every connection, so close() can wait for them
        self.tasks: set[asyncio.Task[Any]] = set()
        self.closing = False

    def full(self) -> bool:
        """No room for one more client (unauthenticated connections have their own quota)."""
        counted = self.clients if self.require_login else self.connections
        return len(counted) >= self.max_connections

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
