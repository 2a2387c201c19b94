"""Requests served off the event loop, on a store shared with other daemons (PostgreSQL).

Every store call there is a round trip to a server, perhaps on another host: made on the
event loop, it would hold every client of the daemon for its whole length. The most
frequent requests (`messages/append`, `context/get`, `context/status`) are made instead
on worker threads (`store.in_lane`: four, each with a connection of its own), a
session's calls one after another, so
- the loop waits on no server: it reads and answers other clients meanwhile;
- requests about one session run in the order they came, one after another, and other
  sessions' run beside them on the other threads (their row locks apart);
- each connection's requests still reach the core in the order sent: the connection's
  next request waits until this one is done (`Turns`, the dispatcher's `_in_turn`);
- events the engine emits on a worker thread reach subscribers through the loop, in the
  order emitted (`Engine.serve_off_loop`); what follows on the loop (the scheduler's
  auto-compaction) runs there once the call is back, and makes its own reads and its
  commit on the session's worker thread (`Compactor.beside_loop`).
Runs and approvals (`run/start`, `run/finish`, `approval/request`, `approval/resolve`)
go the same way, in their session's order: what the dispatcher does with their result
(the connection's open runs, the scheduler) runs on the loop once the call is back.
So does every other request that reads or writes the store without waiting on it
already (sessions, archive pages, pins, context edits, explain, the approvals list,
the session check of a subscription). What stays on the loop asks no store, or is a
coroutine whose store calls run beside it (search and the search tool, compactions,
the compactions list: `Engine.beside_loop_if_shared`).
The embedded store keeps every call on the loop: SQLite answers in microseconds, and its
connection is the engine's own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any, TypeVar

from ctxd.daemon.busy import when_free_off_loop

if TYPE_CHECKING:  # the dispatcher owns this: imported for annotations only
    from ctxd.daemon.engine import Engine
    from ctxd.daemon.servers.base import Connection

T = TypeVar("T")

# served off the loop on a shared store; run/finish and approval/resolve name a run or
# an approval, not a session: they are served here when this daemon knows its session
# (`session_of`), else on the loop
OFF_LOOP = frozenset({"messages/append", "context/get", "context/status", "run/start",
                      "run/finish", "approval/request", "approval/resolve",
                      # the rest of what reads or writes the store, less often asked
                      "session/create", "session/list", "session/get", "archive/read",
                      "context/clear", "context/pop", "context/explain",
                      "context/pins/list", "context/pins/add", "context/pins/remove",
                      "approval/list", "session/subscribe"})
# runs and approvals whose session is remembered (the oldest forgotten past this)
KNOWN_MAX = 100_000


class InTurn:
    """An awaitable holding its connection's turn until it is done: the dispatcher
    awaits it before letting the connection's next request start."""

    def __init__(self, work: Awaitable[Any]) -> None:
        self.work = work

    def __await__(self) -> Generator[Any, None, Any]:
        return self.work.__await__()


class OffLoop:
    def __init__(self, engine: Engine, turns: dict[Connection, asyncio.Future[None]]) -> None:
        self.engine = engine
        self.store = engine.store
        self.enabled = engine.shared_store is not None
        self._turns = turns
        self._bound = False
        # run and approval ids -> their session, as runs and approvals went through here
        self._sessions: dict[str, str] = {}
        self._unnamed = 0

    def learn(self, item_id: str, session_id: str) -> None:
        """A run's or an approval's session, for the requests that name only the id."""
        if not self.enabled:
            return
        if len(self._sessions) >= KNOWN_MAX:
            del self._sessions[next(iter(self._sessions))]
        self._sessions[item_id] = session_id

    def session_of(self, method: str, item_id: str | None) -> str | None:
        """The session to serve `method` about the run or approval `item_id` in, off the
        loop; None: serve it on the loop (not shared, or the session is not known here)."""
        if item_id is None or not self.wants(method):
            return None
        return self._sessions.get(item_id)

    def wants(self, method: str) -> bool:
        return self.enabled and method in OFF_LOOP

    def run(self, conn: Connection, session_id: str | None, call: Callable[[], T],
            then: Callable[[T], Any] | None = None,
            find: Callable[[], str | None] | None = None) -> InTurn:
        """`call()` on a worker thread after the session's earlier calls (run again
        while the session is busy elsewhere, as on the loop), then `then(result)` on the
        loop; the connection's turn is taken now, before anything else of its is read.
        A request that names no session (`session/list`, `session/create` without an
        id) waits for no other: its connection's turn keeps its order. `find`: the
        session is not known here but `find()` reads it (a run's or an approval's),
        beside the loop first; None from it, as no session."""
        loop = asyncio.get_running_loop()
        if not self._bound:
            self.engine.serve_off_loop(loop)
            self._bound = True
        turn: asyncio.Future[None] = loop.create_future()
        self._turns[conn] = turn

        async def work() -> Any:
            try:
                sid = session_id
                if find is not None:
                    sid = await self.store.read_async(lambda _archive: find())
                if sid is None:
                    self._unnamed += 1
                    # a key of its own (a session so named would only share its order)
                    sid = f"\0request {self._unnamed}"
                result = await when_free_off_loop(self.store, sid, call)
                return then(result) if then is not None else result
            finally:
                turn.set_result(None)
                if self._turns.get(conn) is turn:
                    del self._turns[conn]

        return InTurn(work())
