"""Dispatcher: the request handler behind every wire, and the handlers that need the
connection (login, subscriptions, the runs a connection holds) or shape what the engine
returns (an append's context, a run's end).

The path of a request to its handler, in the order each client sent them, is
request_flow.py's. Appends are handled synchronously up to the engine call, so the
order in which a client sent them is the order they are archived in. A large batch
(`messages/append`, `run/finish` with `messages`) is prepared and committed beside the
event loop (see offload.py) while the other clients are served.
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
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
from ctxd.daemon.scheduler import Scheduler
from ctxd.daemon.servers.base import Connection, EventHub
from ctxd.daemon.servers.page_keys import PageKeys
from ctxd.protocol import auth, types
from ctxd.protocol.errors import SearchTooBroad, Unauthorized
from ctxd.protocol.handlers import HANDLERS, serves
from ctxd.protocol.methods import (
    APPROVAL_REQUEST,
    APPROVAL_RESOLVE,
    ARCHIVE_SEARCH,
    CONTEXT_COMPACT,
    CONTEXT_GET,
    CONTEXT_REBUILD,
    HEARTBEAT,
    INITIALIZE,
    MESSAGES_APPEND,
    NOTIFICATIONS,
    PROTOCOL_VERSION,
    RUN_FINISH,
    RUN_START,
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
    ApprovalRequestParams,
    ApprovalResolveParams,
    RunFinishParams,
    RunStartParams,
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


class Dispatcher(RequestFlow):
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

    @serves(RUN_START, connection=True)
    def run_start(self, conn: Connection, p: RunStartParams) -> Any:
        sid = p.session_id
        if self.off_loop.wants("run/start"):
            return self.off_loop.run(conn, sid, lambda: self.scheduler.start_run(sid, self._held),
                                     lambda run: self._run_started(conn, run))
        return self._run_started(conn, self.scheduler.start_run(sid, self._held))

    def _run_started(self, conn: Connection, run: types.Run) -> types.RunStartResult:
        # interrupted when the connection closes; on ZeroMQ, which never says so, when the
        # client stays silent past its lease (see ZmqServer)
        conn.open_runs.add(run.run_id)
        self.off_loop.learn(run.run_id, run.session_id)
        if conn.closed:  # it closed while the run started beside the loop
            self.scheduler.client_gone({run.run_id})
        return types.RunStartResult(run_id=run.run_id, run=run)

    def _held(self, run_id: str) -> bool:
        # a copy: asked from a worker thread too, while the loop adds connections
        return any(run_id in c.open_runs for c in list(self._live))

    @serves(RUN_FINISH, connection=True)
    def run_finish(self, conn: Connection, p: RunFinishParams) -> Any:
        def finish() -> types.RunFinishResult:
            return self.engine.finish_run(
                p.run_id, p.outcome, messages=p.messages, client_batch_id=p.client_batch_id
            )

        if not self.off_loop.wants("run/finish"):
            return self._run_finished(conn, p, finish())

        def finish_with_context() -> types.RunFinishResult:
            result = finish()
            if p.return_context:  # read on the same worker thread, as an append's
                appended = (result.append if isinstance(result.append, types.AppendResult)
                            else None)
                _set_context(result, self.replies.get_now(
                    result.run.session_id, appended=_stored(appended)))
            return result

        def finished(result: types.RunFinishResult) -> Any:
            conn.open_runs.discard(p.run_id)
            return self.scheduler.after_run_finished(result)

        sid = self.off_loop.session_of("run/finish", p.run_id)
        return self.off_loop.run(conn, sid, finish_with_context, finished,
                                 find=None if sid else lambda: self._session_of_run(p.run_id))

    def _session_of_run(self, run_id: str) -> str | None:
        run = self.engine.runs.get(run_id)
        return run.session_id if run is not None else None

    def _run_finished(
        self, conn: Connection, p: Any, result: types.RunFinishResult, gated: bool = False
    ) -> Any:
        """The finish's result; with `returnContext`, with the context (see
        `_appended`)."""
        if p.return_context:
            appended = result.append if isinstance(result.append, types.AppendResult) else None
            result = self._with_context(result, result.run.session_id, appended, gated)
            if inspect.isawaitable(result):
                return self._finished_later(conn, p, result)
        conn.open_runs.discard(p.run_id)
        return self.scheduler.after_run_finished(result)

    async def _finished_later(self, conn: Connection, p: Any, result: Any
                              ) -> types.RunFinishResult:
        done = await result
        conn.open_runs.discard(p.run_id)
        return self.scheduler.after_run_finished(done)

    @serves(APPROVAL_RESOLVE, connection=True)
    def approval_resolve(self, conn: Connection, p: ApprovalResolveParams) -> Any:
        def resolve() -> types.Approval:
            return self.engine.resolve_approval(p.approval_id, p.decision, p.reason)

        if not self.off_loop.wants("approval/resolve"):
            return self._approval_resolved(resolve())

        def resolve_beside() -> tuple[types.Approval, bool]:
            # whether a held-back compaction is due now, asked here: the session's
            # context may not be kept by this daemon
            approval = resolve()
            return approval, self.engine.auto_compaction_due(approval.session_id)

        def resolved(done: tuple[types.Approval, bool]) -> types.Approval:
            return self._approval_resolved(*done)

        sid = self.off_loop.session_of("approval/resolve", p.approval_id)
        return self.off_loop.run(conn, sid, resolve_beside, resolved,
                                 find=None if sid else lambda: self._session_of_approval(
                                     p.approval_id))

    def _session_of_approval(self, approval_id: str) -> str | None:
        approval = self.engine.runs.get_approval(approval_id)
        return approval.session_id if approval is not None else None

    def _approval_resolved(self, approval: types.Approval, due: bool | None = None
                           ) -> types.Approval:
        self.scheduler.after_approval_resolved(approval, due)
        return approval

    @serves(APPROVAL_REQUEST, connection=True)
    def approval_request(self, conn: Connection, p: ApprovalRequestParams) -> Any:
        self._claim(conn, p.run_id)

        def request() -> types.Approval:
            return self.engine.request_approval(
                p.session_id, p.run_id, p.tool_call_id, p.tool_name, p.arguments
            )

        if self.off_loop.wants("approval/request"):
            return self.off_loop.run(conn, p.session_id, request, self._approval_requested)
        return self._approval_requested(request())

    def _approval_requested(self, approval: types.Approval) -> types.ApprovalRequestResult:
        self.off_loop.learn(approval.approval_id, approval.session_id)
        return types.ApprovalRequestResult(approval_id=approval.approval_id, approval=approval)


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
