"""Per-server state of the JSON-RPC wires: limits, the connection sets, the quota gate."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ctxd.daemon.servers.admission import Gate
from ctxd.daemon.servers.base import Connection, EventHub, RequestHandler
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

    def __init__(
        self,
        handler: RequestHandler,
        hub: EventHub,
        *,
        max_frame: int,
        max_queue_bytes: int,
        max_connections: int,
        max_inflight: int,
        require_login: bool = False,
        login_timeout: float | None = None,
        max_unauthenticated: int = DEFAULT_MAX_UNAUTHENTICATED,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_reply_bytes: int | None = None,
        fd_ceiling: int | None = None,
    ) -> None:
        self.handler = handler
        self.hub = hub
        self.max_frame = max_frame
        self.max_queue_bytes = max_queue_bytes
        self.max_connections = max_connections
        self.max_inflight = max(1, max_inflight)
        self.require_login = require_login
        self.login_timeout = login_timeout
        self.max_batch = max(1, max_batch)
        self.max_reply_bytes = max_reply_bytes or max(max_frame, 1 << 20)
        self.preauth_max_frame = min(max_frame, PREAUTH_MAX_FRAME)
        self.gate = Gate(max_unauthenticated if require_login else max_connections, fd_ceiling)
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
