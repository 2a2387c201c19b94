"""How a request reaches its handler, in order: the part of the dispatcher that is not
a handler.

`Dispatcher.handle_now` (dispatch.py) converts the params into the method's params
Struct and calls the handler bound here (`_bind`: an engine method or a function given
the engine, called with the params as keywords; a dispatcher method, with the
connection and the Struct; a method's `wrap` makes its result Struct). Most requests are
answered right there. A large batch is prepared and committed beside the event loop
(offload.py), a large reply encoded beside it (protocol/large.py), a request refused
with SessionBusy run again once its session is free (busy.py); meanwhile the
connection's next requests wait their turn, so each client's requests reach the core in
the order sent.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from ctxd.daemon.busy import when_free
from ctxd.daemon.messages import PreparedBatch, text_size
from ctxd.daemon.off_loop import InTurn
from ctxd.daemon.offload import READS
from ctxd.daemon.servers.base import Connection
from ctxd.protocol.declare import Method
from ctxd.protocol.errors import SessionBusy, Unauthorized
from ctxd.protocol.handlers import Handler as RegisteredHandler
from ctxd.protocol.large import JSON_WIRES, MSGPACK_WIRES, encode_sliced
from ctxd.protocol.methods import validate_params

if TYPE_CHECKING:
    from ctxd.daemon.engine import Engine
    from ctxd.daemon.off_loop import OffLoop
    from ctxd.daemon.offload import LargeWrites

# a batch carrying this much text is validated, counted and committed beside the loop, and
# a reply carrying this much is encoded beside it
OFFLOAD_TEXT_CHARS = 256 * 1024

# a bound handler: called with the connection and the params Struct
Handler = Callable[[Connection, Any], Any]


def _large_batch(method: str, p: Any) -> bool:
    """A batch to prepare and commit beside the loop (the same rule for both methods
    that carry one)."""
    if method not in ("messages/append", "run/finish") or p.messages is None:
        return False
    return text_size(p.messages) >= OFFLOAD_TEXT_CHARS


# the results that carry messages (`messages`, or `context.messages`), and the wires whose
# encoding protocol/large.py knows
_MESSAGE_REPLIES = frozenset({"context/get", "archive/read", "messages/append", "run/finish"})
_ENCODED_WIRES = JSON_WIRES | MSGPACK_WIRES


def _member(value: Any, name: str) -> Any:
    """`value`'s member `name`: a result Struct's attribute, or a dict's key (None if it
    has none)."""
    if isinstance(value, dict):
        return value.get(name)
    if isinstance(value, msgspec.Struct):
        return getattr(value, name, None)
    return None


def _large_reply(result: Any) -> bool:
    """A result carrying this much text is encoded beside the loop."""
    msgs = _member(result, "messages")
    if msgs is None:
        msgs = _member(_member(result, "context"), "messages")
    return isinstance(msgs, list) and text_size(msgs) >= OFFLOAD_TEXT_CHARS


def _wrapper(method: Method) -> Callable[[Any], msgspec.Struct] | None:
    """For a method with `wrap`: its result Struct made of the handler's return value."""
    if method.wrap is None:
        return None
    result_type = method.returns
    (attr,) = [f.name for f in msgspec.structs.fields(result_type)
               if f.encode_name == method.wrap]
    return lambda value: result_type(**{attr: value})


async def _wrap_later(result: Any, wrap: Callable[[Any], msgspec.Struct]) -> msgspec.Struct:
    return wrap(await result)


class RequestFlow:
    """The dispatcher's request path; `Dispatcher` provides what is declared here."""

    engine: Engine
    large: LargeWrites
    off_loop: OffLoop
    _in_turn: dict[Connection, asyncio.Future[None]]
    _handlers: dict[str, Handler]

    if TYPE_CHECKING:

        def _claim(self, conn: Connection, run_id: str | None) -> None: ...

        def _appended(self, p: Any, result: Any, gated: bool = False) -> Any: ...

        def _run_finished(self, conn: Connection, p: Any, result: Any,
                          gated: bool = False) -> Any: ...

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
        wrap = _wrapper(method)
        # the params Struct's fields are the handler's keyword names
        as_kwargs = msgspec.structs.asdict

        # the engine's own handlers and the module functions it is passed to; a
        # coroutine's store calls already run beside the loop
        off_loop = (self.off_loop.wants(method.name) and (on_engine or handler.owner is None)
                    and not inspect.iscoroutinefunction(fn))

        def call(conn: Connection, p: Any) -> Any:
            if off_loop:
                kw = as_kwargs(p)
                return self.off_loop.run(conn, getattr(p, "session_id", None),
                                         lambda: fn(*lead, **kw), wrap)
            result = fn(*lead, **as_kwargs(p))
            if wrap is None:
                return result
            if inspect.isawaitable(result):
                return _wrap_later(result, wrap)
            return wrap(result)

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
                    sid = p.session_id
                    await self.engine.beside_loop_if_shared(
                        lambda: self.engine.require_session(sid))
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
        p: Any,
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
