"""The core of `ctxd lsp`: a client of the shared ctxd daemon that knows nothing of LSP.

It finds the daemon through its connection file (starting one if none runs, like `ctxd
stdio`), subscribes to every session's events, and turns them into calls on a `UI` (the
language server implements it): approvals to ask about, compaction progress, status,
documents that changed. When the daemon goes away it says so once and reconnects when
the daemon is back; calls made meanwhile fail with `DaemonGone`, never hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from ctxd.clients.client import AsyncClient, DaemonNotRunning, find_daemon
from ctxd.clients.client_methods import _Methods
from ctxd.clients.daemon_link import wait_for_daemon
from ctxd.clients.lsp import documents as docs
from ctxd.clients.lsp.documents import DocKey, Rendered
from ctxd.protocol.errors import Conflict, CtxdError

log = logging.getLogger("ctxd.lsp")

# how often new sessions are looked for (their events are subscribed to when found)
DISCOVER_INTERVAL = 1.0
RECONNECT_INTERVAL = 0.5
START_TIMEOUT = 15.0
# events are coalesced this long before documents and status are refreshed
REFRESH_DELAY = 0.15
SYMBOL_LIMIT = 100
# rendered documents kept for links, hovers and refreshes; older ones are rendered again
LIVE_DOCUMENTS = 256
# sessions listed per discovery poll (newest first; a page of known ones ends the walk)
DISCOVER_PAGE = 20
FILE_HISTORY_LIMIT = 200
# approval arguments shown in a prompt are cut to this many characters
PROMPT_ARGS_CHARS = 300


class DaemonGone(ConnectionError):
    """The daemon cannot be reached right now; the bridge reconnects when it is back."""


class BadArgument(ValueError):
    """A command's arguments are not what it takes."""


class UI(Protocol):
    async def ask_approval(self, approval: dict[str, Any]) -> str | None:
        """'approved', 'denied', or None when the user gave no answer."""

    def show(self, level: str, text: str) -> None:
        """A message for the user: level 'error', 'warning' or 'info'."""

    def progress(self, session_id: str, token: str, value: dict[str, Any]) -> None: ...

    def status(self, params: dict[str, Any]) -> None: ...

    def documents_changed(self, rendered: list[Rendered]) -> None: ...


def approval_prompt(approval: dict[str, Any], title: str) -> str:
    args = approval.get("arguments")
    text = args if isinstance(args, str) else docs.json.dumps(args, ensure_ascii=False)
    text = " ".join(str(text).split())
    if len(text) > PROMPT_ARGS_CHARS:
        text = text[:PROMPT_ARGS_CHARS] + f"… ({len(text) - PROMPT_ARGS_CHARS} more characters)"
    return (f"ctxd: the agent of session '{title}' wants to run "
            f"{approval.get('toolName') or 'a tool'}({text}). Approve?")


class DaemonCalls(_Methods[Awaitable[Any]]):
    """The protocol table's calls (`client_methods.py`), sent through the bridge."""

    def __init__(self, bridge: Bridge) -> None:
        self._bridge = bridge

    def call(self, method: str, params: dict[str, Any] | None = None, *,
             timeout: float | None = None) -> Awaitable[Any]:
        return self._bridge.call(method, params, timeout)


class Bridge:
    def __init__(
        self,
        connection_file: Path,
        ui: UI,
        start_daemon: Callable[[], None] | None = None,
        *,
        discover_interval: float = DISCOVER_INTERVAL,
    ) -> None:
        self.connection_file = Path(connection_file)
        self.ui = ui
        self.start_daemon = start_daemon
        self.discover_interval = discover_interval
        self.client: AsyncClient | None = None
        # the protocol's calls, through `call` (its reconnects and errors)
        self.daemon = DaemonCalls(self)
        self.current: str | None = None
        self.chosen = False  # the user chose `current`: events no longer move it
        self.titles: dict[str, str] = {}
        # documents the editor has read, least recently rendered first (bounded)
        self.live: OrderedDict[DocKey, Rendered] = OrderedDict()
        self._subscribed: set[str] = set()
        self._asked: set[str] = set()
        self._answered_elsewhere: dict[str, dict[str, Any]] = {}
        # approvals shown but not answered in a prompt (the editor cannot ask, or the user
        # dismissed it): offered as code actions until someone resolves them
        self.unanswered: dict[str, dict[str, Any]] = {}
        self._dirty: set[str] = set()
        self._flush_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._main: asyncio.Task[None] | None = None
        self._connected = asyncio.Event()
        self._closed = False
        self.last_error = "not connected yet"

    # lifecycle

    def start(self) -> None:
        self._main = asyncio.create_task(self._supervise())

    async def close(self) -> None:
        self._closed = True
        for task in [self._main, self._flush_task, *self._tasks]:
            if task is not None:
                task.cancel()
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.close()

    @property
    def connected(self) -> bool:
        return self.client is not None and not self.client.closed

    async def wait_connected(self, timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._connected.wait()
        return self.connected

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _open(self) -> AsyncClient:
        path, info = find_daemon(self.connection_file)
        client = AsyncClient(info, "jsonrpc", source=str(path), client_name="ctxd-lsp")
        await client.open()
        return client

    async def _first_connect(self) -> AsyncClient:
        try:
            return await self._open()
        except ConnectionError:
            if self.start_daemon is None:
                raise
        self.start_daemon()
        await asyncio.to_thread(wait_for_daemon, self.connection_file, START_TIMEOUT)
        return await self._open()

    async def _supervise(self) -> None:
        first, told = True, False
        while not self._closed:
            try:
                client = await (self._first_connect() if first else self._open())
            except (ConnectionError, OSError, CtxdError) as exc:
                self.last_error = str(exc)
                if not told:
                    told = True
                    self.ui.show("warning" if not first else "error",
                                 f"ctxd: no daemon reachable ({exc}); "
                                 "will connect when it is back")
                    self.ui.status({"connected": False, "error": str(exc)})
                first = False
                await asyncio.sleep(RECONNECT_INTERVAL)
                continue
            stream = client.notifications()
            self.client = client
            self._subscribed.clear()
            try:
                await self._discover()
            except (ConnectionError, CtxdError) as exc:
                log.warning("subscribing failed: %s", exc)
            self._connected.set()
            if told or not first:
                self.ui.show("info", "ctxd: connected to the daemon again")
            first, told = False, False
            if self.current is None:
                self.ui.status({"connected": True, "sessionId": None})
            else:
                self._dirty.add(self.current)
            self._dirty.update(k.session_id for k in self.live)  # missed while away
            self._schedule_flush()
            discover = asyncio.create_task(self._discover_loop())
            try:
                async for method, params in stream:
                    try:
                        self._on_event(method, params)
                    except Exception:
                        log.exception("event %s failed", method)
            finally:
                discover.cancel()
            self._connected.clear()
            if self._closed:
                return
            self.last_error = "the ctxd daemon went away"
            self.ui.show("warning", "ctxd: lost the daemon; will reconnect when it is back")
            self.ui.status({"connected": False, "error": self.last_error})
            told = True
            with contextlib.suppress(Exception):
                await client.close()

    async def _discover(self) -> None:
        """Subscribe to sessions not yet subscribed to (newest first, stop at a known one)."""
        cursor: str | None = None
        newest: str | None = None
        while True:
            page = await self.daemon.list_sessions(limit=DISCOVER_PAGE, cursor=cursor)
            sessions = page.get("sessions") or []
            fresh = False
            for s in sessions:
                sid = s["sessionId"]
                newest = newest or sid
                self.titles[sid] = s.get("title") or sid
                if sid in self._subscribed:
                    continue
                fresh = True
                await self.daemon.subscribe(sid)
                self._subscribed.add(sid)
                pending = await self.daemon.list_approvals(sid, status="pending")
                for approval in pending.get("approvals") or []:
                    self._spawn(self._ask(approval))
            cursor = page.get("nextCursor")
            if not cursor or not fresh:
                break
        if self.current is None and newest is not None:
            self.current = newest
            self._dirty.add(newest)

    async def _discover_loop(self) -> None:
        while True:
            await asyncio.sleep(self.discover_interval)
            try:
                await self._discover()
            except (ConnectionError, TimeoutError):
                return
            except CtxdError as exc:
                log.warning("session discovery failed: %s", exc)
            self._schedule_flush()

    # calls

    async def call(self, method: str, params: dict[str, Any] | None = None,
                   timeout: float | None = None) -> Any:
        client = self.client
        if client is None or client.closed:
            raise DaemonGone(f"ctxd daemon not reachable ({self.last_error}); "
                             "the server reconnects when it is back")
        params = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            return await client.call(method, params, timeout=timeout)
        except DaemonNotRunning as exc:
            raise DaemonGone(str(exc)) from None
        except ConnectionError as exc:
            raise DaemonGone(f"lost the ctxd daemon during {method} ({exc}); "
                             "the server reconnects when it is back") from None

    async def title(self, sid: str) -> str:
        if sid not in self.titles:
            got = await self.daemon.get_session(sid)
            self.titles[sid] = got["session"].get("title") or sid
        return self.titles[sid]

    def session_of(self, args: dict[str, Any]) -> str:
        sid = args.get("sessionId", self.current)
        if sid is None:
            raise BadArgument("no session given and none is current: pass sessionId "
                              "or choose one with ctxd.chooseSession")
        if not isinstance(sid, str) or not sid:
            raise BadArgument("sessionId must be a non-empty string")
        return sid

    # events

    def _on_event(self, method: str, params: dict[str, Any]) -> None:
        sid = params.get("sessionId")
        if not isinstance(sid, str):
            return
        if method == "approval/didRequest":
            self._spawn(self._ask(params.get("approval") or {}))
        elif method == "approval/didResolve":
            approval = params.get("approval") or {}
            aid = approval.get("approvalId")
            if aid in self._asked:
                self._answered_elsewhere[aid] = approval
            self.unanswered.pop(aid, None)
        elif method == "$/progress":
            self.ui.progress(sid, str(params.get("token")), params.get("value") or {})
        elif method == "context/compactionFailed":
            err = params.get("error") or {}
            self.ui.show("error", f"ctxd: compaction of '{self.titles.get(sid, sid)}' failed: "
                                  f"{err.get('message', err)}")
        if method == "session/didAppend" and not self.chosen:
            self.current = sid
        self._dirty.add(sid)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if self._flush_task is None or self._flush_task.done():
            self._flush_task = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        await asyncio.sleep(REFRESH_DELAY)
        dirty, self._dirty = self._dirty, set()
        try:
            if self.current in dirty:
                await self.push_status()
            changed = []
            # a full transcript page never changes (the archive is append-only)
            for key in [k for k, r in self.live.items()
                        if k.session_id in dirty and not r.complete]:
                changed.append(await self.render(key))
            if changed:
                self.ui.documents_changed(changed)
        except (DaemonGone, CtxdError, TimeoutError) as exc:
            log.info("refresh skipped: %s", exc)

    async def push_status(self) -> None:
        if self.current is None:
            return
        status = await self.daemon.context_status(self.current)
        self.ui.status({**status, "connected": True,
                        "title": await self.title(self.current)})

    # approvals

    async def _ask(self, approval: dict[str, Any]) -> None:
        try:
            await self._ask_once(approval)
        except (DaemonGone, CtxdError, TimeoutError) as exc:
            self.ui.show("error", f"ctxd: could not resolve approval "
                                  f"{approval.get('approvalId')}: {exc}")
        except Exception:
            log.exception("asking about approval %s failed", approval.get("approvalId"))

    async def _ask_once(self, approval: dict[str, Any]) -> None:
        aid = approval.get("approvalId")
        if not isinstance(aid, str) or aid in self._asked or approval.get("status") != "pending":
            return
        self._asked.add(aid)
        sid = str(approval.get("sessionId"))
        try:
            title = await self.title(sid)
        except (DaemonGone, CtxdError):
            title = sid
        approval = {**approval, "prompt": approval_prompt(approval, title)}
        self.unanswered[aid] = approval
        decision = await self.ui.ask_approval(approval)
        if decision is not None:
            await self.resolve(aid, decision)  # tells the user if another answer won

    async def resolve(self, approval_id: str, decision: str) -> dict[str, Any]:
        """Resolve; if another client answered first, tell the user which answer won."""
        self.unanswered.pop(approval_id, None)
        try:
            result = await self.daemon.resolve_approval(approval_id, decision)
        except Conflict:
            won = self._answered_elsewhere.get(approval_id) or await self._approval(approval_id)
            status = won.get("status", "resolved") if won else "resolved"
            reason = f" ({won['reason']})" if won and won.get("reason") else ""
            self.ui.show("warning", f"ctxd: another client answered first: {status}{reason}; "
                                    f"your '{decision}' was not applied")
            return {"approvalId": approval_id, "status": status, "answeredElsewhere": True}
        self.ui.show("info", f"ctxd: {result.get('toolName') or 'tool call'} {decision}")
        return result

    async def _approval(self, approval_id: str) -> dict[str, Any] | None:
        for sid in list(self._subscribed):
            got = await self.daemon.list_approvals(sid)
            for a in got.get("approvals") or []:
                if a.get("approvalId") == approval_id:
                    return a  # type: ignore[no-any-return]
        return None

    # documents

    async def render(self, key: DocKey) -> Rendered:
        now = time.time()
        if key.kind == "search":
            hits = (await self.daemon.search(key.query, limit=200, newest_first=True))["hits"]
            for sid in {h["sessionId"] for h in hits}:
                await self.title(sid)
            rendered = docs.render_search(key, hits, self.titles, now)
        elif key.kind == "transcript":
            title = await self.title(key.session_id)
            after = None if key.start is None else key.start - 1
            page = await self.daemon.read(key.session_id, after_id=after,
                                           limit=docs.PAGE_SIZE)
            rendered = docs.render_transcript(key, title, page)
        else:
            title = await self.title(key.session_id)
            context = await self.daemon.context_get(key.session_id)
            explain = await self.daemon.explain(key.session_id)
            rendered = docs.render_context(key, title, context, explain, now)
        self.live[key] = rendered
        self.live.move_to_end(key)
        while len(self.live) > LIVE_DOCUMENTS:
            self.live.popitem(last=False)
        return rendered

    async def rendered(self, key: DocKey) -> Rendered:
        return self.live.get(key) or await self.render(key)

    # features

    async def search(self, query: str, limit: int = SYMBOL_LIMIT) -> list[dict[str, Any]]:
        """`archive/search` over all sessions; each hit gets its session's `title`."""
        hits = (await self.daemon.search(query, limit=limit))["hits"]
        missing = {h["sessionId"] for h in hits} - self.titles.keys()
        if missing:
            await asyncio.gather(*(self.title(sid) for sid in missing))
        return [{**h, "title": self.titles.get(h["sessionId"], h["sessionId"])} for h in hits]

    async def file_history(self, path: str) -> dict[str, Any]:
        """Sessions whose archived messages mention the workspace-relative `path`."""
        hits = (await self.daemon.search(path, limit=FILE_HISTORY_LIMIT,
                                           newest_first=True))["hits"]
        name = path.rsplit("/", 1)[-1]
        hits = [h for h in hits if name in h.get("snippet", "").replace("**", "")]
        sessions = {h["sessionId"] for h in hits}
        last = max((h.get("createdAt") or 0 for h in hits), default=None)
        return {"path": path, "sessions": len(sessions), "messages": len(hits),
                "lastAt": last, "hits": hits}

    async def choose(self, sid: str) -> dict[str, Any]:
        await self.title(sid)  # SessionNotFound for an unknown id, and nothing changes
        self.current, self.chosen = sid, True
        if sid not in self._subscribed:
            await self.daemon.subscribe(sid)
            self._subscribed.add(sid)
        await self.push_status()
        return {"sessionId": sid, "title": self.titles[sid]}

    async def sessions(self, limit: int = 20) -> list[dict[str, Any]]:
        page = await self.daemon.list_sessions(limit=limit)
        for s in page.get("sessions") or []:
            self.titles[s["sessionId"]] = s.get("title") or s["sessionId"]
        return list(page.get("sessions") or [])
