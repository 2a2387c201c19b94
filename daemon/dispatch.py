"""Dispatcher: the request handler behind every wire, and the handlers that need the
connection (login, subscriptions, the runs a connection holds) or shape what the engine
returns (an append's context, a run's end; runs and approvals: run_requests.py).

The path of a request to its handler, in the order each client sent them, is
request_flow.py's. Appends are handled synchronously up to the engine call, so the
order in which a client sent them is the order they are archived in. A large batch
(`messages/append`, `run/finish` with `messages`) is prepared and committed beside the
event loop (see offload.py) while the other clients are served.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Callable
from typing import Any

from ctxd import __version__

# context_edit holds handlers of its own: imported so they register
from ctxd.daemon import context_edit, projection, recall  # noqa: F401
from ctxd.daemon.context_reply import ContextReplies
from ctxd.daemon.engine import Engine
from ctxd.daemon.off_loop import OffLoop
from ctxd.daemon.offload import LargeWrites
from ctxd.daemon.request_flow import Handler, RequestFlow
from ctxd.daemon.run_requests import RunRequests
from ctxd.daemon.scheduler import Scheduler
from ctxd.daemon.servers.base import Connection, EventHub
from ctxd.daemon.servers.page_keys import PageKeys
from ctxd.protocol import auth, types
from ctxd.protocol.errors import SearchTooBroad, Unauthorized
from ctxd.protocol.handlers import HANDLERS, serves
from ctxd.protocol.methods import (
    ARCHIVE_SEARCH,
    CONTEXT_COMPACT,
    CONTEXT_GET,
    CONTEXT_REBUILD,
    HEARTBEAT,
    INITIALIZE,
    MESSAGES_APPEND,
    NOTIFICATIONS,
    PROTOCOL_VERSION,
    SERVER_NAME,
    SESSION_SUBSCRIBE,
    SESSION_UNSUBSCRIBE,
    SHUTDOWN,
    TOOLS_LIST,
)
from ctxd.protocol.table_context import ContextCompactParams, ContextGetParams, ContextRebuildParams
from ctxd.protocol.table_daemon import HeartbeatParams, ShutdownParams
from ctxd.protocol.table_messages import ArchiveSearchParams, MessagesAppendParams
from ctxd.protocol.table_runs import (
    ToolsListParams,
)
from ctxd.protocol.table_sessions import (
    InitializeParams,
    SessionSubscribeParams,
    SessionUnsubscribeParams,
)

log = logging.getLogger("ctxd.dispatch")

SHUTDOWN_REPLY_DELAY = 0.1
# the reply size limit of the wires (`max_request_bytes`, at least 1 MiB)
DEFAULT_MAX_REPLY_BYTES = 64 * 1024 * 1024


class Dispatcher(RunRequests, RequestFlow):
    def __init__(
        self,
        engine: Engine,
        hub: EventHub,
        token: str,
        on_shutdown: Callable[[], None] | None = None,
        wires: list[str] | None = None,
        auth_timeout: float = 5.0,
        run_lease: float = 30.0,
        max_reply_bytes: int | None = None,
    ) -> None:
        self.engine = engine
        # replies carrying the whole context: their size bounded before they are built
        self.replies = ContextReplies(engine, max_reply_bytes or DEFAULT_MAX_REPLY_BYTES)
        self.hub = hub
        self.token = token
        # the web page's one-time logins and keys (it never holds the token)
        self.page_keys = PageKeys(token)
        # the rules of what follows from what (auto-compaction, runs without a client)
        self.scheduler = Scheduler(engine, run_lease)
        self.on_shutdown = on_shutdown
        self.wires = wires or []
        self.started_at = self.scheduler.started_at
        self.auth_timeout = auth_timeout
        self.run_lease = run_lease
        self.large = LargeWrites(engine, lambda: bool(self.scheduler.running()))
        self._live: set[Connection] = set()
        # per connection: the request (a large batch or reply, or one behind it) the next
        # one waits for
        self._in_turn: dict[Connection, asyncio.Future[None]] = {}
        # on a shared store, the frequent requests served on worker threads
        self.off_loop = OffLoop(engine, self._in_turn)
        # each method's handler, registered where it is written (protocol/handlers.py)
        self._handlers: dict[str, Handler] = {h.method.name: self._bind(h) for h in HANDLERS}

    def check_token(self, token: Any) -> bool:
        return isinstance(token, str) and hmac.compare_digest(
            token.encode("utf-8", "surrogatepass"), self.token.encode()
        )

    def connection_opened(self, conn: Connection) -> None:
        self._live.add(conn)
        if not conn.authenticated:
            # a connection that never proves the token must not hold a slot forever
            asyncio.get_running_loop().call_later(
                self.auth_timeout, self._expire_unauthenticated, conn
            )

    def _expire_unauthenticated(self, conn: Connection) -> None:
        if not conn.authenticated and not conn.closed:
            log.info(
                "%r did not send initialize with the token in %.0f s: closed",
                conn,
                self.auth_timeout,
            )
            conn.close()

    def connection_closed(self, conn: Connection) -> None:
        self._live.discard(conn)
        self.page_keys.closed(conn)
        if conn.open_runs:
            log.info(
                "%r closed with open runs %s: marking them interrupted",
                conn,
                sorted(conn.open_runs),
            )
            runs = set(conn.open_runs)
            conn.open_runs.clear()
            if self.large.gate.busy:
                # a write, like any other: after the large commit under way
                asyncio.get_running_loop().create_task(self._client_gone_later(runs))
            else:
                self.scheduler.client_gone(runs)

    async def _client_gone_later(self, runs: set[str]) -> None:
        await self.large.gate.wait_open()
        try:
            self.scheduler.client_gone(runs)
        except Exception:
            log.exception("marking runs %s interrupted failed", sorted(runs))

    def lease_stale_runs(self, run_ids: set[str]) -> None:
        """Runs left open by a daemon that died (see Scheduler.lease_stale_runs)."""
        self.scheduler.lease_stale_runs(run_ids)

    def _claim(self, conn: Connection, run_id: str | None) -> None:
        if self.scheduler.claim(run_id):
            conn.open_runs.add(run_id)  # type: ignore[arg-type]

    # handlers with more than one line

    @serves(INITIALIZE, connection=True)
    def initialize(self, conn: Connection, p: InitializeParams) -> types.InitializeResult:
        page_key = None
        if not conn.authenticated and (p.page_login is not None or p.page_key is not None):
            page_key = self.page_keys.log_in(conn, p.page_login, p.page_key)
            conn.authenticated = True
        if not conn.authenticated:
            if p.proof is not None:
                if not auth.check_client_proof(self.token, p.nonce, p.proof):
                    raise Unauthorized(
                        "wrong proof of the token; compute it from the token in the daemon's "
                        "connection file and the nonce sent with it"
                    )
            elif not self.check_token(p.token):
                raise Unauthorized("wrong token; read it from the daemon's connection file")
            conn.authenticated = True
        conn.client_name = p.client_name
        return types.InitializeResult(
            server_name=SERVER_NAME,
            version=__version__,
            protocol_version=PROTOCOL_VERSION,
            capabilities=self._capabilities(),
            # mutual authentication: the client checks this before sending anything else
            nonce_mac=None if p.nonce is None else auth.daemon_proof(self.token, p.nonce),
            page_key=page_key,
        )

    @serves(HEARTBEAT, connection=True)
    def heartbeat(self, conn: Connection, p: HeartbeatParams) -> types.HeartbeatResult:
        # any request renews the lease of a ZeroMQ client's runs: nothing else to do
        return types.HeartbeatResult(lease_seconds=self.run_lease)

    def _capabilities(self) -> dict[str, Any]:
        return {
            "wires": self.wires,
            "notifications": sorted(NOTIFICATIONS),
            "tools": [recall.SEARCH_TOOL_NAME],
            "summarizer": getattr(self.engine.summarizer, "name", "custom"),
            # when it last failed, {at, message}, or null
            "summarizerLastFailure": _last_failure(self.engine.summarizer),
            "tokenEncoding": self.engine.tokens.encoding_name,
            "search": {"languages": ["en", "zh"], "advanced": True},
            "runLeaseSeconds": self.run_lease,
        }

    @serves(TOOLS_LIST, connection=True)
    def list_tools(self, conn: Connection, p: ToolsListParams) -> types.ToolsListResult:
        return types.ToolsListResult(tools=[recall.SEARCH_TOOL_SCHEMA])

    @serves(SHUTDOWN, connection=True)
    def shutdown(self, conn: Connection, p: ShutdownParams) -> types.Empty:
        if self.on_shutdown is not None:
            # a moment for this reply to leave: a ZeroMQ socket closed at once drops it
            asyncio.get_running_loop().call_later(SHUTDOWN_REPLY_DELAY, self.on_shutdown)
        return types.Empty()

    @serves(SESSION_SUBSCRIBE, connection=True)
    def subscribe(self, conn: Connection, p: SessionSubscribeParams) -> Any:
        sid = p.session_id

        def subscribed(_: None) -> types.Empty:
            self.hub.subscribe(conn, sid)
            return types.Empty()

        # raises for an unknown session; a session not kept here is asked for
        if self.off_loop.wants("session/subscribe"):
            return self.off_loop.run(conn, sid, lambda: self.engine.check_session(sid),
                                     subscribed)
        return subscribed(self.engine.check_session(sid))

    @serves(SESSION_UNSUBSCRIBE, connection=True)
    def unsubscribe(self, conn: Connection, p: SessionUnsubscribeParams) -> types.Empty:
        self.hub.unsubscribe(conn, p.session_id)
        return types.Empty()

    @serves(MESSAGES_APPEND, connection=True)
    def append(self, conn: Connection, p: MessagesAppendParams) -> Any:
        self._claim(conn, p.run_id)
        if self.off_loop.wants("messages/append"):
            return self._append_off_loop(conn, p)
        result = self.engine.append(
            p.session_id,
            p.messages,
            run_id=p.run_id,
            client_batch_id=p.client_batch_id,
        )
        return self._appended(p, result)

    def _append_off_loop(self, conn: Connection, p: MessagesAppendParams) -> Any:
        """`append` on the session's worker thread, its context (`returnContext`) read
        there too; the scheduler told on the loop (see off_loop.py)."""
        sid = p.session_id

        def call() -> tuple[types.AppendResult, dict[str, Any] | None]:
            result = self.engine.append(sid, p.messages, run_id=p.run_id,
                                        client_batch_id=p.client_batch_id)
            if not p.return_context:
                return result, None
            return result, self.replies.get_now(sid, status=result.status,
                                                appended=_stored(result))

        def then(done: tuple[types.AppendResult, dict[str, Any] | None]) -> types.AppendResult:
            result, context = done
            with self.engine.as_committed(sid):
                self.scheduler.after_append(sid, p.run_id, result.status)
            if context is not None:
                result.context = context  # type: ignore[assignment]
            return result

        return self.off_loop.run(conn, sid, call, then)

    def _appended(self, p: Any, result: types.AppendResult, gated: bool = False) -> Any:
        """The append's result; with `returnContext`, with the context as right after
        the append, bounded as `context/get` is. `gated`: the write gate is held (a large
        batch), so the context is read beside the loop (an awaitable of the result);
        else it is read at once, before any other write."""
        sid = p.session_id
        self.scheduler.after_append(sid, p.run_id, result.status)
        if p.return_context:
            return self._with_context(result, sid, result, gated, status=result.status)
        return result

    def _with_context(
        self, result: types.AppendResult | types.RunFinishResult, session_id: str,
        appended: types.AppendResult | None, gated: bool, status: types.Status | None = None,
    ) -> Any:
        """`result` (an append's, or a run/finish's) with the session's context;
        `appended`, the batch stored with it (named when the context is refused)."""
        stored = _stored(appended)
        if not gated:
            _set_context(result, self.replies.get_now(session_id, status=status,
                                                      appended=stored))
            return result

        async def later() -> types.AppendResult | types.RunFinishResult:
            _set_context(result, await self.replies.get(session_id, status=status,
                                                        appended=stored))
            return result

        return later()

    @serves(ARCHIVE_SEARCH, connection=True)
    async def search(self, conn: Connection, p: ArchiveSearchParams) -> types.ArchiveSearchResult:
        return await self.engine.search_async(
            p.query,
            session_id=p.session_id,
            role=p.role,
            limit=p.limit,
            offset=p.offset,
            newest_first=p.newest_first,
            advanced=p.advanced,
            since=p.since,
            until=p.until,
        )

    @serves(CONTEXT_GET, connection=True)
    def context_get(self, conn: Connection, p: ContextGetParams) -> Any:
        sid = p.session_id
        if self.off_loop.wants("context/get") and not p.query:
            return self.off_loop.run(conn, sid, lambda: self.replies.get_ahead(
                sid, p.budget_tokens, None, bool(p.include_metadata)))
        return self._context_get(conn, p)

    async def _context_get(self, conn: Connection, p: ContextGetParams) -> dict[str, Any]:
        sid, query = p.session_id, p.query
        hits = None
        if query:
            try:
                found = await self.engine.search_async(
                    projection.recall_query(query),
                    session_id=sid,
                    limit=projection.RECALL_HITS * 3,
                )
                hits = found.hits
            except SearchTooBroad:
                hits = []  # no recall message rather than no context
        return await self.replies.get(
            sid, p.budget_tokens, query, bool(p.include_metadata), recall_hits=hits
        )

    @serves(CONTEXT_COMPACT, connection=True)
    async def compact(self, conn: Connection, p: ContextCompactParams) -> types.CompactResult:
        result = await self.engine.compact(
            p.session_id, force=bool(p.force), instructions=p.instructions
        )
        assert result is not None  # only an automatic compaction is ever skipped
        return result

    @serves(CONTEXT_REBUILD, connection=True)
    async def rebuild(self, conn: Connection, p: ContextRebuildParams) -> types.CompactResult:
        return await self.engine.rebuild(p.session_id, dry_run=bool(p.dry_run))


def _stored(appended: types.AppendResult | None) -> dict[str, Any]:
    """What an append stored, as a refused context's error data names it."""
    if appended is None:
        return {}
    return {"batchId": appended.batch_id, "messageIds": appended.message_ids}


def _set_context(result: types.AppendResult | types.RunFinishResult, context: Any) -> None:
    result.context = context


def _last_failure(summarizer: object) -> dict[str, Any] | None:
    failure = getattr(summarizer, "last_failure", None)
    return {"at": failure[0], "message": failure[1][:500]} if failure else None


# every method has its handler once every handler module is imported, or the daemon
# does not start (protocol/handlers.py)
HANDLERS.check_complete()
