"""What the JSON-RPC wires share: one connection's message handling (the per-server state
is in `rpc_state.py`).

See `jsonrpc.py` for the behaviour both wires promise; this module implements it over
four transport hooks that `rpc_tcp` and `rpc_websocket` provide.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any

from ctxd.daemon.servers.base import Connection, now_or_later
from ctxd.daemon.servers.rpc_state import ServerCore, too_many_connections
from ctxd.protocol.codec import (
    check_request,
    dumps_json,
    error_response,
    loads_json,
    notification,
    response,
)
from ctxd.protocol.envelope import internal
from ctxd.protocol.errors import (
    CtxdError,
    InvalidRequest,
    PayloadTooLarge,
    Unauthorized,
)

log = logging.getLogger("ctxd.servers.jsonrpc")

# frames above this size that look like a batch have their requests counted first
_PRECOUNT_BYTES = 256 * 1024


_LOGIN_FIRST = "send initialize with the token from the connection file first"

# A client whose unread output passes three quarters of `max_queue_bytes` has its session
# events dropped (and counted) instead of queued, so a paused subscriber keeps its
# connection and room stays for its replies; once its output is down to a quarter, it is
# told what it missed. (A burst of large events outruns a healthy but busy reader for a
# while: shedding much earlier costs it events it would have read.) The drain is checked
# on a timer that backs off to once a second.
MISSED_EVENTS_METHOD = "session/didMissEvents"
_DRAIN_CHECK_FIRST = 0.05
_DRAIN_CHECK_LAST = 1.0


class JsonRpcConnection(Connection):
    """One JSON-RPC client: decodes messages, runs requests as tasks, writes replies.

    Subclasses provide the byte transport: `_pending_output`, `_write_message`,
    `_abort`, and the flow-control hooks `_pause_input`/`_resume_input`.
    """

    def __init__(self, core: ServerCore, peer: str) -> None:
        super().__init__(peer)
        self._core = core
        self._inflight = 0
        self._input_paused = False
        self._cleaned_up = False
        self._opened = False
        self._login_started = False
        self._login_timer: asyncio.TimerHandle | None = None
        # what holds this connection's place in the quota before login
        self._gate_key: object = self
        # session id -> events dropped since this client's output passed the high-water mark
        self._missed: dict[str, int] = {}
        self._drain_timer: asyncio.TimerHandle | None = None
        self._drain_delay = _DRAIN_CHECK_FIRST

    # transport hooks

    def _pending_output(self) -> int:
        raise NotImplementedError

    def _write_message(self, body: bytes) -> None:
        raise NotImplementedError

    def _abort(self) -> None:
        raise NotImplementedError

    def _pause_input(self) -> None:
        pass

    def _resume_input(self) -> None:
        pass

    def _idle(self) -> None:
        """Called when the last running request finished."""

    def _logged_in(self) -> None:
        """Called once `initialize` succeeded: lift the limits for strangers."""

    def abort(self) -> None:
        """Drop the connection now, whatever is still queued for it."""
        self.closed = True
        self._abort()

    # lifecycle

    def _open(self) -> bool:
        core = self._core
        core.connections.add(self)
        core.hub.add_connection(self)
        self._opened = True
        if not core.require_login or self.authenticated:
            # a bare transport, or a connection its transport authenticated already: a
            # client from the start
            core.clients.add(self)
            core.gate.leave(self._gate_key)
            if core.require_login:
                self._logged_in()
        elif core.login_timeout is not None:
            # whatever the connection does (or does not read), the deadline drops it
            self._login_timer = asyncio.get_running_loop().call_later(
                core.login_timeout, self._login_expired
            )
        try:
            core.handler.connection_opened(self)
        except Exception:
            log.exception("connection_opened failed for %r; closing it", self)
            self.close()
            return False
        log.debug("opened %r", self)
        return True

    def _login_expired(self) -> None:
        self._login_timer = None
        if not self.authenticated and not self._cleaned_up:
            log.info("%r did not log in within %.0f s: dropped", self, self._core.login_timeout)
            self.abort()

    def _cleanup(self) -> None:
        """Runs exactly once when the connection is gone, whatever the reason."""
        if self._cleaned_up:
            return
        self._cleaned_up = True
        self.closed = True
        core = self._core
        core.connections.discard(self)
        core.clients.discard(self)
        core.gate.leave(self._gate_key)
        if self._login_timer is not None:
            self._login_timer.cancel()
            self._login_timer = None
        if self._drain_timer is not None:
            self._drain_timer.cancel()
            self._drain_timer = None
        if not self._opened:
            return
        try:
            core.handler.connection_closed(self)
        except Exception:
            log.exception("connection_closed failed for %r", self)
        finally:
            core.hub.remove_connection(self)
        log.debug("closed %r", self)

    # output

    def send_notification(self, method: str, params: dict[str, Any]) -> None:
        if self.closed:
            return
        # an event Struct (protocol/types.py), or a dict in its wire form
        session_id = (params.get("sessionId") if isinstance(params, dict)
                      else getattr(params, "session_id", None))
        if isinstance(session_id, str) and (
            self._missed
            # shed only where a client used to be dropped: a subscriber that is merely
            # slow during a burst keeps every event
            or self._pending_output() > self._core.max_queue_bytes
        ):
            # once one event is dropped, the later ones are too until the notice is sent:
            # the client then sees the gap announced before any event after it
            self._miss(session_id)
            return
        self._send(dumps_json(notification(method, params)))

    def _miss(self, session_id: str) -> None:
        if not self._missed:
            log.warning(
                "%r is not reading its output (%d bytes unread): dropping its events "
                "until it reads again", self, self._pending_output(),
            )
            self._drain_delay = _DRAIN_CHECK_FIRST
            self._drain_timer = asyncio.get_running_loop().call_later(
                self._drain_delay, self._check_drain
            )
        self._missed[session_id] = self._missed.get(session_id, 0) + 1

    def _check_drain(self) -> None:
        """Tell the client which sessions' events it missed once its output drained;
        until then, look again later (less and less often)."""
        self._drain_timer = None
        if self.closed or not self._missed:
            return
        if self._pending_output() > self._core.max_queue_bytes // 4:
            self._drain_delay = min(self._drain_delay * 2, _DRAIN_CHECK_LAST)
            self._drain_timer = asyncio.get_running_loop().call_later(
                self._drain_delay, self._check_drain
            )
            return
        missed, self._missed = self._missed, {}
        log.info("%r reads again: it missed %d events", self, sum(missed.values()))
        for session_id, count in missed.items():
            self._send(dumps_json(notification(
                MISSED_EVENTS_METHOD, {"sessionId": session_id, "missed": count}
            )))

    def _send(self, body: bytes) -> None:
        """Queue one message without blocking; drop the client if it stopped reading."""
        if self.closed:
            return
        pending = self._pending_output()
        if pending > self._core.max_queue_bytes:
            log.warning(
                "dropping %r: %d bytes of output unread (limit %d); the client stopped reading",
                self,
                pending,
                self._core.max_queue_bytes,
            )
            self.abort()
            return
        self._write_message(body)

    def _send_error(self, id_: Any, err: CtxdError) -> None:
        self._send(dumps_json(error_response(id_, err)))

    def _refuse(self, id_: Any, err: CtxdError) -> None:
        """One error, then the connection is closed (dropped at the login deadline at
        the latest if the client does not read it)."""
        log.info("closing %r before login: %s", self, err.message)
        self._send_error(id_, err)
        self.close()

    # input

    def handle_message(self, body: bytes | str) -> None:
        """Decode one JSON-RPC message (object or batch) and start its request task(s)."""
        if self.closed:
            return
        if self._core.require_login and not self.authenticated:
            self._login(body)
            return
        if len(body) > _PRECOUNT_BYTES and self._obviously_too_many(body):
            return
        try:
            msg = loads_json(body)
        except CtxdError as err:
            self._send_error(None, err)
            return
        if isinstance(msg, dict):
            if "method" not in msg and ("result" in msg or "error" in msg):
                log.info("ignoring a response-shaped message from %r", self)
                return
            try:
                id_, method, params, is_notification = check_request(msg)
            except CtxdError as err:
                self._send_error(msg.get("id"), err)
                return
            self._start(id_, method, params, is_notification)
        elif isinstance(msg, list):
            self._start_batch(msg)
        else:
            self._send_error(None, InvalidRequest("a JSON-RPC request must be an object"))

    def _obviously_too_many(self, body: bytes | str) -> bool:
        """A large batch with more "method" keys than the batch limit is refused before
        it is decoded: decoding 38 MB of small requests holds the event loop for seconds.
        (Escaped keys slip through; that batch is refused after decoding instead.)"""
        head = body[:64].lstrip()
        if head[:1] not in (b"[", "["):
            return False
        key = b'"method"' if isinstance(body, bytes) else '"method"'
        n = body.count(key)  # type: ignore[arg-type]
        limit = self._core.max_batch
        if n <= limit:
            return False
        self._send_error(None, InvalidRequest(
            f"a batch of about {n} requests; the limit is {limit}: split it", {"limit": limit}
        ))
        return True

    def _login(self, body: bytes | str) -> None:
        """Before login exactly one message is read: an `initialize` request. Anything
        else (a batch, a notification, another method, bad JSON) gets one error and the
        connection is closed; so does a failed `initialize`."""
        if self._login_started:
            return  # input is paused while initialize runs; nothing more is read
        self._login_started = True
        try:
            msg = loads_json(body)
        except CtxdError as err:
            self._refuse(None, err)
            return
        if isinstance(msg, list):
            self._refuse(None, InvalidRequest(f"no batches before login; {_LOGIN_FIRST}"))
            return
        try:
            id_, method, params, is_notification = check_request(msg)
        except CtxdError as err:
            self._refuse(msg.get("id") if isinstance(msg, dict) else None, err)
            return
        if method != "initialize" or is_notification:
            # not MethodNotFound with the list of methods: strangers learn nothing
            self._refuse(id_, Unauthorized(_LOGIN_FIRST))
            return
        self._input_paused = True
        self._pause_input()
        self._track(self._run_login(id_, params))

    async def _run_login(self, id_: Any, params: Any) -> None:
        core = self._core
        try:
            if core.full():
                log.warning(
                    "refusing %r: %d clients logged in (limit %d)",
                    self, len(core.clients), core.max_connections,
                )
                self._refuse(id_, too_many_connections(core.max_connections))
                return
            reply = await self._call(id_, "initialize", params, False)
            if not self.authenticated:
                log.info("closing %r: initialize failed", self)
                if reply is not None:
                    self._send(self._encode(reply))
                self.close()
                return
            if self._login_timer is not None:
                self._login_timer.cancel()
                self._login_timer = None
            core.gate.leave(self._gate_key)
            core.clients.add(self)
            self._logged_in()
            if reply is not None:
                self._send(self._encode(reply))
        finally:
            # resumes input (see _untrack): the next messages are read as a client's
            self._untrack()

    def _track(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._core.tasks.add(task)
        self._inflight += 1
        if self._inflight >= self._core.max_inflight and not self._input_paused:
            self._input_paused = True
            self._pause_input()
        return task

    def _untrack(self) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._core.tasks.discard(task)
        self._inflight -= 1
        if self._input_paused and self._inflight <= self._core.max_inflight // 2:
            self._input_paused = False
            self._resume_input()
        if self._inflight == 0:
            self._idle()

    def _start(self, id_: Any, method: str, params: Any, is_notification: bool) -> None:
        """Answer now when the handler can (most methods); otherwise a task, created
        right away, in arrival order (see the module docstring)."""
        try:
            result = now_or_later(self._core.handler, self, method, params)
        except Exception as exc:
            reply = self._failed(id_, method, is_notification, exc)
        else:
            if inspect.isawaitable(result):
                # until it starts, this connection's next requests queue behind it
                self.queued += 1
                self._track(self._run(id_, method, result, is_notification))
                return
            reply = None if is_notification else response(id_, result)
        if reply is not None:
            self._send(self._encode(reply))

    async def _run(self, id_: Any, method: str, work: Any, is_notification: bool) -> None:
        self.queued -= 1
        try:
            try:
                result = await work
            except Exception as exc:
                reply = self._failed(id_, method, is_notification, exc)
            else:
                reply = None if is_notification else response(id_, result)
            if reply is not None:
                self._send(self._encode(reply))
        finally:
            # after the reply is queued: finishing the last request may close the connection
            self._untrack()

    def _start_batch(self, items: list[Any]) -> None:
        if not items:
            self._send_error(None, InvalidRequest("an empty batch is not a valid request"))
            return
        limit = self._core.max_batch
        if len(items) > limit:
            self._send_error(None, InvalidRequest(
                f"a batch of {len(items)} requests; the limit is {limit}: split it",
                {"limit": limit},
            ))
            return
        entries: list[Any] = []
        for item in items:
            try:
                id_, method, params, is_notification = check_request(item)
            except CtxdError as err:
                item_id = item.get("id") if isinstance(item, dict) else None
                entries.append(error_response(item_id, err))
                continue
            entries.append(self._track(self._call_untrack(id_, method, params, is_notification)))
        # the batch reply counts as running work too, so a half-close waits for it; the
        # connection's next requests wait for it to start, so they are answered after it
        self.queued += 1
        self._track(self._finish_batch(entries))

    async def _call_untrack(
        self, id_: Any, method: str, params: Any, is_notification: bool
    ) -> dict[str, Any] | None:
        try:
            return await self._call(id_, method, params, is_notification)
        finally:
            self._untrack()

    async def _finish_batch(self, entries: list[Any]) -> None:
        self.queued -= 1
        try:
            parts: list[bytes] = []
            size = 2
            for entry in entries:
                if isinstance(entry, asyncio.Task):
                    entry = await entry
                if entry is None:
                    continue
                part = self._encode(entry, self._core.max_reply_bytes - size)
                size += len(part) + 1
                parts.append(part)
            if parts:
                self._send(b"[" + b",".join(parts) + b"]")
        finally:
            self._untrack()

    async def _call(
        self, id_: Any, method: str, params: Any, is_notification: bool
    ) -> dict[str, Any] | None:
        """Run one request through the handler; return its reply (None for a notification)."""
        try:
            result = await self._core.handler.handle(self, method, params)
        except Exception as exc:
            return self._failed(id_, method, is_notification, exc)
        return None if is_notification else response(id_, result)

    def _failed(
        self, id_: Any, method: str, is_notification: bool, exc: Exception
    ) -> dict[str, Any] | None:
        """The error reply to a request that raised `exc` (None for a notification)."""
        if isinstance(exc, CtxdError):
            if is_notification:
                log.info("notification %s from %r failed: %r", method, self, exc)
                return None
            return error_response(id_, exc)
        log.error("%s from %r failed", method, self, exc_info=exc)
        return None if is_notification else error_response(id_, internal(exc))

    def _encode(self, reply: dict[str, Any], room: int | None = None) -> bytes:
        """The reply's bytes; an error in its place when it cannot be encoded or is
        larger than `room` (the reply size limit by default)."""
        limit = self._core.max_reply_bytes if room is None else room
        try:
            body = dumps_json(reply)
        except (TypeError, ValueError) as exc:
            # a handler returned something JSON cannot carry: the client still gets an answer
            log.exception("cannot encode the reply to %r for %r", reply.get("id"), self)
            return dumps_json(error_response(reply.get("id"), internal(exc)))
        if len(body) > limit:
            log.warning("reply to %r for %r is %d bytes: refused", reply.get("id"), self, len(body))
            err = PayloadTooLarge(
                f"the reply is {len(body)} bytes; replies are limited to "
                f"{self._core.max_reply_bytes}: ask for less at a time (a smaller limit, "
                "fewer requests per batch)",
                {"limit": self._core.max_reply_bytes, "size": len(body)},
            )
            return dumps_json(error_response(reply.get("id"), err))
        return body
