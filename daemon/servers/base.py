"""What every wire shares: a connection, the request handler it calls, the event fan-out.

A transport (JSON-RPC over TCP/WebSocket/stdio, ZeroMQ) only frames bytes. For each
request it calls `RequestHandler.handle(conn, method, params)` and writes back the
result or the `CtxdError` it raised. Events reach clients through `EventHub`.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

log = logging.getLogger("ctxd.servers")

_conn_ids = itertools.count(1)


class Connection:
    """One client connection on one wire.

    Subclasses implement `send_notification` without blocking: each keeps a bounded
    outgoing queue and drops the client (with a log line) when it stops reading.
    """

    wire: str = "?"
    # whether session events reach this connection through `send_notification` (a
    # ZeroMQ peer gets them on the PUB socket instead, where its SUB subscribes)
    pushes_events: bool = True

    def __init__(self, peer: str = "") -> None:
        self.id = next(_conn_ids)
        self.peer = peer
        self.authenticated = False
        self.client_name: str | None = None
        self.subscriptions: set[str] = set()
        # runs opened through this connection: marked interrupted when it closes
        self.open_runs: set[str] = set()
        self.closed = False
        # requests handed to a task that has not started yet: the connection's next
        # requests queue behind them, so each client's requests start in the order sent
        self.queued = 0
        # a browser on the daemon's own origin (the web page): it may log in with a page
        # key instead of the token; `page_key` is the one it holds (see page_keys.py)
        self.page_origin = False
        self.page_key: bytes | None = None

    def send_notification(self, method: str, params: dict[str, Any]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.closed = True

    def __repr__(self) -> str:
        return f"<{type(self).__name__} #{self.id} {self.wire} {self.peer}>"


class RequestHandler(Protocol):
    """The daemon side of every wire (implemented by `ctxd.daemon.dispatch.Dispatcher`)."""

    async def handle(self, conn: Connection, method: str, params: Any) -> Any:
        """Serve one request; return a JSON-able result or raise `CtxdError`."""
        ...

    def check_token(self, token: Any) -> bool:
        """Constant-time comparison with the daemon's token."""
        ...

    def connection_opened(self, conn: Connection) -> None: ...

    # A handler may also offer `handle_now(conn, method, params)`: the same work without
    # a task, returning the result or an awaitable (see `now_or_later`).

    def connection_closed(self, conn: Connection) -> None: ...


def now_or_later(handler: RequestHandler, conn: Connection, method: str, params: Any) -> Any:
    """Serve a request at once when its handler can: the result (or the `CtxdError` it
    raises), or an awaitable that the wire must await in a task of its own.

    Most methods are synchronous, so a wire answers them without a task and without an
    event-loop hop. A request behind one that still waits for its task to start also
    waits (it gets a task too): the handler sees a connection's requests in order.
    """
    now = getattr(handler, "handle_now", None)
    if now is None or conn.queued:
        return handler.handle(conn, method, params)
    return now(conn, method, params)


EventSink = Callable[[str, str, dict[str, Any]], None]
# whether a wire-level publisher has a subscriber for a session's events
Watcher = Callable[[str], bool]
# told that whether a session is watched may have changed (None: whether every session is)
WatchHook = Callable[[str | None], None]


class EventHub:
    """Fans events out to subscribed connections and to wire-level publishers (ZeroMQ PUB)."""

    def __init__(self) -> None:
        self._connections: set[Connection] = set()
        self._sinks: list[EventSink] = []
        self._watchers: list[Watcher] = []
        # the wire-level publishers' "a subscriber takes every session's events"
        self._watch_all: list[Callable[[], bool]] = []
        self._watch_hooks: list[WatchHook] = []

    def add_connection(self, conn: Connection) -> None:
        self._connections.add(conn)

    def remove_connection(self, conn: Connection) -> None:
        self._connections.discard(conn)
        for session_id in conn.subscriptions:
            self.watch_changed(session_id)

    def add_sink(self, sink: EventSink) -> None:
        self._sinks.append(sink)

    def add_watcher(self, watcher: Watcher, everything: Callable[[], bool] | None = None
                    ) -> None:
        """A wire-level publisher's `watcher(session_id)`; `everything()` says whether one
        of its subscribers takes every session's events (a prefix of them all)."""
        self._watchers.append(watcher)
        if everything is not None:
            self._watch_all.append(everything)

    # subscriptions: whoever reads events for this daemon's clients (another daemon's,
    # on a shared store) follows them through the hooks

    def add_watch_hook(self, hook: WatchHook) -> None:
        self._watch_hooks.append(hook)

    def watch_changed(self, session_id: str | None) -> None:
        """Whether `session_id` is watched (None: every session) may have changed."""
        for hook in self._watch_hooks:
            try:
                hook(session_id)
            except Exception:
                log.exception("watch hook failed")

    def subscribe(self, conn: Connection, session_id: str) -> None:
        conn.subscriptions.add(session_id)
        self.watch_changed(session_id)

    def unsubscribe(self, conn: Connection, session_id: str) -> None:
        if session_id in conn.subscriptions:
            conn.subscriptions.discard(session_id)
            self.watch_changed(session_id)

    def watches_everything(self) -> bool:
        """Whether a client takes every session's events (a wire-level subscription)."""
        return any(everything() for everything in self._watch_all)

    def watched_sessions(self) -> set[str]:
        """The sessions the connections subscribe to now."""
        return {s for c in self._connections if c.pushes_events and not c.closed
                for s in c.subscriptions}

    def watched(self, session_id: str) -> bool:
        """Whether any client of this daemon would receive the session's events now: a
        connection subscribed to it, or a wire-level subscriber (ZeroMQ SUB). Walks the
        connections like `publish` does, so asking costs no more than publishing."""
        for conn in self._connections:
            if conn.pushes_events and session_id in conn.subscriptions and not conn.closed:
                return True
        return any(watcher(session_id) for watcher in self._watchers)

    def publish(self, session_id: str, method: str, params: dict[str, Any]) -> None:
        for conn in list(self._connections):
            if session_id in conn.subscriptions and not conn.closed:
                try:
                    conn.send_notification(method, params)
                except Exception:  # a broken client must not stop the fan-out
                    log.exception("dropping event for %r", conn)
        for sink in self._sinks:
            try:
                sink(session_id, method, params)
            except Exception:
                log.exception("event sink failed")

    def notify_connection(self, conn: Connection, method: str, params: dict[str, Any]) -> None:
        if not conn.closed:
            conn.send_notification(method, params)


AsyncCallback = Callable[..., Awaitable[Any]]
