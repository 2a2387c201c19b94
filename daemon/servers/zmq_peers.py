"""The ZeroMQ wire's peers: a ROUTER peer that proved the token is a connection.

ZeroMQ never says when a peer goes away, so peers silent for `idle_timeout` (and with
nothing in flight) are treated as gone; peers holding runs must show they are alive
within the shorter `run_lease` (any request or a `heartbeat`), or their runs are
interrupted.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ctxd.daemon.servers.base import EventHub, RequestHandler
from ctxd.daemon.servers.zmq_frames import ZmqConnection

log = logging.getLogger("ctxd.servers.zmq")


class PeerTable:
    """Peers by routing identity; only peers that sent the token are ever in it, so a
    stream of random identities cannot fill it."""

    def __init__(self, handler: RequestHandler, hub: EventHub, stats: dict[str, int]) -> None:
        self.handler = handler
        self.hub = hub
        self.stats = stats
        self.peers: dict[bytes, ZmqConnection] = {}

    def get(self, identity: bytes) -> ZmqConnection | None:
        return self.peers.get(identity)

    def open(self, identity: bytes) -> ZmqConnection:
        conn = ZmqConnection(identity)
        self.peers[identity] = conn
        self.hub.add_connection(conn)
        try:
            self.handler.connection_opened(conn)
        except Exception:
            log.exception("connection_opened failed for %r", conn)
        log.debug("new peer %r", conn)
        return conn

    def drop(self, conn: ZmqConnection, why: str) -> None:
        if self.peers.get(conn.identity) is conn:
            del self.peers[conn.identity]
        if conn.closed:
            return
        log.debug("dropping %r: %s", conn, why)
        conn.close()
        self.hub.remove_connection(conn)
        try:
            self.handler.connection_closed(conn)
        except Exception:
            log.exception("connection_closed failed for %r", conn)

    async def reap(self, idle_timeout: float, run_lease: float) -> None:
        period = max(0.05, min(idle_timeout / 4, run_lease / 4, 30.0))
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for conn in list(self.peers.values()):
                if conn.inflight:
                    continue
                if conn.open_runs and conn.last_seen < now - run_lease:
                    self.stats["runs_lease_expired"] += 1
                    self.drop(conn, f"silent for more than the run lease of {run_lease:g}s")
                elif conn.last_seen < now - idle_timeout:
                    self.stats["peers_reaped"] += 1
                    self.drop(conn, f"idle for more than {idle_timeout:g}s")
