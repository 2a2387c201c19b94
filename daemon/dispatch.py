"""Dispatcher: the request handler behind every wire.

Each handler validates (against the protocol table), calls one engine function and
shapes the result. Appends are handled synchronously up to the engine call, so the
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

import msgspec

from ctxd import __version__

# context_edit holds handlers of its own: imported so they register
from ctxd.daemon import context_edit, projection, recall  # noqa: F401
from ctxd.daemon.busy import when_free
from ctxd.daemon.context_reply import ContextReplies
from ctxd.daemon.engine import Engine
from ctxd.daemon.messages import PreparedBatch, text_size
from ctxd.daemon.off_loop import InTurn, OffLoop
from ctxd.daemon.offload import READS, LargeWrites
from ctxd.daemon.scheduler import Scheduler
from ctxd.daemon.servers.base import Connection, EventHub
from ctxd.daemon.servers.page_keys import PageKeys
from ctxd.protocol import auth
from ctxd.protocol.errors import SearchTooBroad, SessionBusy, Unauthorized
from ctxd.protocol.handlers import HANDLERS, serves
from ctxd.protocol.handlers import Handler as RegisteredHandler
from ctxd.protocol.large import JSON_WIRES, MSGPACK_WIRES, encode_sliced
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
    validate_params,
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

# a batch carrying this much text is validated, counted and committed beside the loop, and
# a reply carrying this much is encoded beside it
OFFLOAD_TEXT_CHARS = 256 * 1024

Handler = Callable[[Connection, dict[str, Any]], Any]

SHUTDOWN_REPLY_DELAY = 0.1
# the reply size limit of the wires (`max_request_bytes`, at least 1 MiB)
DEFAULT_MAX_REPLY_BYTES = 64 * 1024 * 1024


def _large_batch(method: str, p: dict[str, Any]) -> bool:
    """A batch to prepare and commit beside the loop (the same rule for both methods
    that carry one)."""
    if method not in ("messages/append", "run/finish") or p.messages is None:
        return False
    return text_size(p.messages) >= OFFLOAD_TEXT_CHARS


# the results that carry messages (`messages`, or `context.messages`), and the wires whose
# encoding protocol/large.py knows
_MESSAGE_REPLIES = frozenset({"context/get", "archive/read", "messages/append", "run/finish"})
_ENCODED_WIRES = JSON_WIRES | MSGPACK_WIRES


def _large_reply(result: Any) -> bool:
    """A result carrying this much text is encoded beside the loop."""
    if not isinstance(result, dict):
        return False
    msgs = result.get("messages")
    if msgs is None and isinstance(result.get("context"), dict):
        msgs = result["context"].get("messages")
    return isinstance(msgs, list) and text_size(msgs) >= OFFLOAD_TEXT_CHARS


async def _wrap_later(result: Any, key: str) -> dict[str, Any]:
    return {key: await result}


class Dispatcher:
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

    def _bind(self, handler: RegisteredHandler) -> Handler:
        fn, method = handler.function, handler.method
        on_engine = False
        if handler.owner is not None:
            # a method of the dispatcher or of the engine: bound to the instance
            owners = [o for o in (self, self.engine)
                      if any(c.__name__ == handler.owner for c in type(o).__mro__)]
            if not owners:
                raise LookupError(f"{method.name}: no instance of {handler.owner} to serve it")
            fn = getattr(owners[0], fn.__name__)
            on_engine = owners[0] is self.engine
        if handler.connection:
            return fn  # type: ignore[no-any-return]
        lead = () if handler.owner is not None else (self.engine,)
        wrap = method.wrap
        # the params Struct's fields are the handler's keyword names
        as_kwargs = msgspec.structs.asdict

        off_loop = self.off_loop.wants(method.name) and on_engine

        def call(conn: Connection, p: Any) -> Any:
            if off_loop:
                kw = as_kwargs(p)
                return self.off_loop.run(conn, p.session_id, lambda: fn(**kw),
                                         None if wrap is None else lambda r: {wrap: r})
            result = fn(*lead, **as_kwargs(p))
            if wrap is None:
                return result
            if inspect.isawaitable(result):
                return _wrap_later(result, wrap)
            return {wrap: result}

        return call

    # the RequestHandler interface

    async def handle(self, conn: Connection, method: str, params: Any) -> Any:
        result = self.handle_now(conn, method, params)
        if inspect.isawaitable(result):
            result = await result
        return result

    def handle_now(self, conn: Connection, method: str, params: Any) -> Any:
        """`handle` without a task: the result, or an awaitable the wire awaits in a task
        of its own (most methods answer here, so the wires skip a task per request)."""
        if not conn.authenticated and method != "initialize":
            # the same answer for every method, known or not: before login the list of
            # methods (which an unknown-method error names) is nobody's business
            raise Unauthorized("send initialize with the token from the connection file first")
        p = validate_params(method, params)
        before = self._in_turn.get(conn)
        large = _large_batch(method, p)
        if before is not None or large or (self.large.gate.busy and method not in READS):
            return self._after(conn, before, method, p, large)
        try:
            result = self._handlers[method](conn, p)
        except SessionBusy as busy:
            # the session is being written through another connection: wait beside the
            # loop, the connection's next requests behind this one
            turn = asyncio.get_running_loop().create_future()
            self._in_turn[conn] = turn
            return self._when_free(conn, method, p, busy, turn)
        if method in _MESSAGE_REPLIES and conn.wire in _ENCODED_WIRES:
            if inspect.isawaitable(result):
                return self._encoded(conn, method, result, hold=False)
            if _large_reply(result):
                return self._encoded(conn, method, result, hold=True)
        return result

    async def _when_free(
        self, conn: Connection, method: str, p: Any, busy: SessionBusy,
        turn: asyncio.Future[None],
    ) -> Any:
        """A request refused with SessionBusy, run again once its session is free (at
        most the store's lock_timeout; see busy.py)."""
        try:
            result = await when_free(
                self.engine.store, lambda: self._handlers[method](conn, p), busy
            )
        finally:
            turn.set_result(None)
            if self._in_turn.get(conn) is turn:
                del self._in_turn[conn]
        if inspect.isawaitable(result):
            result = await result
        return await self._maybe_encoded(conn, method, result)

    async def _encoded(self, conn: Connection, method: str, result: Any, hold: bool) -> Any:
        """The result, encoded in a worker thread when it is large (see `_maybe_encoded`).
        With `hold`, the connection's next requests wait for it: a reply answered at once
        before is not overtaken by the ones after it."""
        turn: asyncio.Future[None] | None = None
        if hold:
            turn = asyncio.get_running_loop().create_future()
            self._in_turn[conn] = turn
        try:
            if inspect.isawaitable(result):
                result = await result
            return await self._maybe_encoded(conn, method, result)
        finally:
            if turn is not None:
                turn.set_result(None)
                if self._in_turn.get(conn) is turn:
                    del self._in_turn[conn]

    async def _maybe_encoded(self, conn: Connection, method: str, result: Any) -> Any:
        """A result carrying megabytes of messages is encoded here, beside the loop and
        piece by piece, into the bytes the wire would send (protocol/large.py): one
        encoder call on the loop would hold every client for its whole length."""
        if method in _MESSAGE_REPLIES and conn.wire in _ENCODED_WIRES and _large_reply(result):
            return await asyncio.to_thread(encode_sliced, result, conn.wire)
        return result

    async def _after(
        self,
        conn: Connection,
        before: asyncio.Future[None] | None,
        method: str,
        p: Any,
        large: bool,
    ) -> Any:
        """A large batch, a request behind one from the same connection, or a write
        while a large batch is being committed.

        The batch is validated and its tokens counted in a worker thread, and committed
        in one (see offload.py), so the event loop serves other clients meanwhile; other
        writes wait until that commit is over. Requests of the same connection still
        start in the order they came: each one waits until the one before it has started,
        and behind a large batch until its reply is out (so replies keep their order).
        """
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._in_turn[conn] = turn
        try:
            prepared = None
            if large:
                if method == "messages/append":
                    self.engine.require_session(p.session_id)
                prepared = await asyncio.to_thread(self.engine.prepare_append, p.messages)
            if before is not None:
                await before
            if prepared is not None:
                # not cancelled with the request: the write gate opens only once the
                # commit and the engine's state after it are done
                work = asyncio.ensure_future(self._large_write(conn, method, p, prepared))
                return await self._maybe_encoded(conn, method, await asyncio.shield(work))
            if method not in READS:
                await self.large.gate.wait_open()
            result = await when_free(self.engine.store, lambda: self._handlers[method](conn, p))
            if isinstance(result, InTurn):  # the next request waits until it is done
                result = await result
            if not inspect.isawaitable(result):
                return await self._maybe_encoded(conn, method, result)
        finally:
            turn.set_result(None)
            if self._in_turn.get(conn) is turn:
                del self._in_turn[conn]
        return await self._maybe_encoded(conn, method, await result)

    async def _large_write(
        self,
        conn: Connection,
        method: str,
        p: dict[str, Any],
        prepared: PreparedBatch,
    ) -> dict[str, Any]:
        async with self.large.gate.held():
            # a context asked for with the batch is read before the gate opens: no other
            # write comes between
            if method == "messages/append":
                self._claim(conn, p.run_id)
                result = await self.large.append(
                    p.session_id, p.messages, prepared,
                    run_id=p.run_id, client_batch_id=p.client_batch_id,
                )
                out = self._appended(p, result, gated=True)
            else:
                finished = await self.large.finish_run(
                    p.run_id, p.outcome, p.messages, prepared, p.client_batch_id
                )
                out = self._run_finished(conn, p, finished, gated=True)
            return await out if inspect.isawaitable(out) else out  # type: ignore[no-any-return]

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
    def initialize(self, conn: Connection, p: InitializeParams) -> dict[str, Any]:
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
        result = self._server_info()
        if p.nonce is not None:
            # mutual authentication: the client checks this before sending anything else
            result["nonceMac"] = auth.daemon_proof(self.token, p.nonce)
        if page_key is not None:
            result["pageKey"] = page_key
        return result

    @serves(HEARTBEAT, connection=True)
    def heartbeat(self, conn: Connection, p: HeartbeatParams) -> dict[str, Any]:
        # any request renews the lease of a ZeroMQ client's runs: nothing else to do
        return {"leaseSeconds": self.run_lease}

    def _server_info(self) -> dict[str, Any]:
        return {
            "serverName": SERVER_NAME,
            "version": __version__,
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {
                "wires": self.wires,
                "notifications": sorted(NOTIFICATIONS),
                "tools": [recall.SEARCH_TOOL_NAME],
                "summarizer": getattr(self.engine.summarizer, "name", "custom"),
                # when it last failed, {at, message}, or null
                "summarizerLastFailure": _last_failure(self.engine.summarizer),
                "tokenEncoding": self.engine.tokens.encoding_name,
                "search": {"languages": ["en", "zh"], "advanced": True},
                "runLeaseSeconds": self.run_lease,
            },
        }

    @serves(TOOLS_LIST, connection=True)
    def list_tools(self, conn: Connection, p: ToolsListParams) -> dict[str, Any]:
        return {"tools": [recall.SEARCH_TOOL_SCHEMA]}

    @serves(SHUTDOWN, connection=True)
    def shutdown(self, conn: Connection, p: ShutdownParams) -> dict[str, Any]:
        if self.on_shutdown is not None:
            # a moment for this reply to leave: a ZeroMQ socket closed at once drops it
            asyncio.get_running_loop().call_later(SHUTDOWN_REPLY_DELAY, self.on_shutdown)
        return {}

    @serves(SESSION_SUBSCRIBE, connection=True)
    def subscribe(self, conn: Connection, p: SessionSubscribeParams) -> dict[str, Any]:
        self.engine.get_session(p.session_id)  # raises for an unknown session
        conn.subscriptions.add(p.session_id)
        return {}

    @serves(SESSION_UNSUBSCRIBE, connection=True)
    def unsubscribe(self, conn: Connection, p: SessionUnsubscribeParams) -> dict[str, Any]:
        conn.subscriptions.discard(p.session_id)
        return {}

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

        def call() -> tuple[dict[str, Any], dict[str, Any] | None]:
            result = self.engine.append(sid, p.messages, run_id=p.run_id,
                                        client_batch_id=p.client_batch_id)
            if not p.return_context:
                return result, None
            stored = {k: result[k] for k in ("batchId", "messageIds")}
            return result, self.replies.get_now(sid, status=result["status"], appended=stored)

        def then(done: tuple[dict[str, Any], dict[str, Any] | None]) -> dict[str, Any]:
            result, context = done
            with self.engine.as_committed(sid):
                self.scheduler.after_append(sid, p.run_id, result["status"])
            if context is not None:
                result["context"] = context
            return result

        return self.off_loop.run(conn, sid, call, then)

    def _appended(self, p: dict[str, Any], result: dict[str, Any], gated: bool = False) -> Any:
        """The append's result; with `returnContext`, with the context as right after
        the append, bounded as `context/get` is. `gated`: the write gate is held (a large
        batch), so the context is read beside the loop (an awaitable of the result);
        else it is read at once, before any other write."""
        sid = p.session_id
        self.scheduler.after_append(sid, p.run_id, result["status"])
        if p.return_context:
            return self._with_context(result, sid, result, gated, status=result["status"])
        return result

    def _with_context(
        self, result: dict[str, Any], session_id: str, appended: dict[str, Any], gated: bool,
        status: dict[str, Any] | None = None,
    ) -> Any:
        stored = {k: appended[k] for k in ("batchId", "messageIds") if k in appended}
        if not gated:
            result["context"] = self.replies.get_now(session_id, status=status,
                                                     appended=stored)
            return result

        async def later() -> dict[str, Any]:
            result["context"] = await self.replies.get(session_id, status=status,
                                                       appended=stored)
            return result

        return later()

    @serves(ARCHIVE_SEARCH, connection=True)
    async def search(self, conn: Connection, p: ArchiveSearchParams) -> dict[str, Any]:
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
                hits = found["hits"]
            except SearchTooBroad:
                hits = []  # no recall message rather than no context
        return await self.replies.get(
            sid, p.budget_tokens, query, bool(p.include_metadata), recall_hits=hits
        )

    @serves(CONTEXT_COMPACT, connection=True)
    async def compact(self, conn: Connection, p: ContextCompactParams) -> dict[str, Any]:
        return await self.engine.compact(
            p.session_id, force=bool(p.force), instructions=p.instructions
        )

    @serves(CONTEXT_REBUILD, connection=True)
    async def rebuild(self, conn: Connection, p: ContextRebuildParams) -> dict[str, Any]:
        return await self.engine.rebuild(p.session_id, dry_run=bool(p.dry_run))

    @serves(RUN_START, connection=True)
    def run_start(self, conn: Connection, p: RunStartParams) -> Any:
        sid = p.session_id
        if self.off_loop.wants("run/start"):
            return self.off_loop.run(conn, sid, lambda: self.scheduler.start_run(sid, self._held),
                                     lambda run: self._run_started(conn, run))
        return self._run_started(conn, self.scheduler.start_run(sid, self._held))

    def _run_started(self, conn: Connection, run: dict[str, Any]) -> dict[str, Any]:
        # interrupted when the connection closes; on ZeroMQ, which never says so, when the
        # client stays silent past its lease (see ZmqServer)
        conn.open_runs.add(run["runId"])
        self.off_loop.learn(run["runId"], run["sessionId"])
        if conn.closed:  # it closed while the run started beside the loop
            self.scheduler.client_gone({run["runId"]})
        return {"runId": run["runId"], "run": run}

    def _held(self, run_id: str) -> bool:
        # a copy: asked from a worker thread too, while the loop adds connections
        return any(run_id in c.open_runs for c in list(self._live))

    @serves(RUN_FINISH, connection=True)
    def run_finish(self, conn: Connection, p: RunFinishParams) -> Any:
        def finish() -> dict[str, Any]:
            return self.engine.finish_run(
                p.run_id, p.outcome, messages=p.messages, client_batch_id=p.client_batch_id
            )

        sid = None if p.return_context else self.off_loop.session_of("run/finish", p.run_id)
        if sid is not None:
            return self.off_loop.run(conn, sid, finish,
                                     lambda result: self._run_finished(conn, p, result))
        return self._run_finished(conn, p, finish())

    def _run_finished(
        self, conn: Connection, p: dict[str, Any], result: dict[str, Any], gated: bool = False
    ) -> Any:
        """The finish's result; with `returnContext`, with the context (see
        `_appended`)."""
        if p.return_context:
            result = self._with_context(result, result["run"]["sessionId"],
                                        result.get("append") or {}, gated)
            if inspect.isawaitable(result):
                return self._finished_later(conn, p, result)
        conn.open_runs.discard(p.run_id)
        return self.scheduler.after_run_finished(result)

    async def _finished_later(self, conn: Connection, p: dict[str, Any], result: Any
                              ) -> dict[str, Any]:
        done = await result
        conn.open_runs.discard(p.run_id)
        return self.scheduler.after_run_finished(done)

    @serves(APPROVAL_RESOLVE, connection=True)
    def approval_resolve(self, conn: Connection, p: ApprovalResolveParams) -> Any:
        def resolve() -> dict[str, Any]:
            return self.engine.resolve_approval(p.approval_id, p.decision, p.reason)

        sid = self.off_loop.session_of("approval/resolve", p.approval_id)
        if sid is not None:
            return self.off_loop.run(conn, sid, resolve, self._approval_resolved)
        return self._approval_resolved(resolve())

    def _approval_resolved(self, approval: dict[str, Any]) -> dict[str, Any]:
        self.scheduler.after_approval_resolved(approval)
        return approval

    @serves(APPROVAL_REQUEST, connection=True)
    def approval_request(self, conn: Connection, p: ApprovalRequestParams) -> Any:
        self._claim(conn, p.run_id)

        def request() -> dict[str, Any]:
            return self.engine.request_approval(
                p.session_id, p.run_id, p.tool_call_id, p.tool_name, p.arguments
            )

        if self.off_loop.wants("approval/request"):
            return self.off_loop.run(conn, p.session_id, request, self._approval_requested)
        return self._approval_requested(request())

    def _approval_requested(self, approval: dict[str, Any]) -> dict[str, Any]:
        self.off_loop.learn(approval["approvalId"], approval["sessionId"])
        return {"approvalId": approval["approvalId"], "approval": approval}


def _last_failure(summarizer: object) -> dict[str, Any] | None:
    failure = getattr(summarizer, "last_failure", None)
    return {"at": failure[0], "message": failure[1][:500]} if failure else None


# every method has its handler once every handler module is imported, or the daemon
# does not start (protocol/handlers.py)
HANDLERS.check_complete()
