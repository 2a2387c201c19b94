"""Engine: the archive, the active contexts, runs, approvals and compaction, as one API.

The engine knows nothing of sockets. It is used from one thread (the daemon's event
loop, or a library user's thread): APSW connections refuse concurrent use. Every write
is one explicit transaction; in-memory state is updated only after the commit, so a
crash at any moment leaves the database as of the last acknowledged call.

This module holds sessions, appends and status; the reads (the model input, the archive,
search, pins) are in reads.py, runs and approvals in runs.py, the compaction entry points
in compaction_calls.py.
What the engine keeps between requests (contexts, rendered model inputs, open runs and
pending approvals) it keeps only on a store no other daemon writes.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import msgspec

from ctxd.daemon.compaction.compactor import Compactor
from ctxd.daemon.config import Config
from ctxd.daemon.engine.archive_sizes import ArchiveSizes
from ctxd.daemon.engine.compaction_calls import CompactionCalls
from ctxd.daemon.engine.context_view import ContextView
from ctxd.daemon.engine.reads import ContextReads
from ctxd.daemon.engine.run_book import RunBook
from ctxd.daemon.engine.runs import RunsAndApprovals
from ctxd.daemon.ids import new_id
from ctxd.daemon.messages import PreparedBatch, check_time, prepare_batch
from ctxd.daemon.pairing import check_tool_pairs
from ctxd.daemon.stores.base import Store, shared_store
from ctxd.daemon.stores.records import RunRecord, SessionRecord
from ctxd.daemon.stores.sql.contexts import ContextState
from ctxd.daemon.stores.sqlite.store import SqliteStore
from ctxd.daemon.summarizers import make_summarizer, summarizer_status
from ctxd.daemon.summary import Summarizer
from ctxd.daemon.tokens import TokenCounter
from ctxd.daemon.views import listed_session_struct, session_struct
from ctxd.protocol.errors import Conflict, InvalidParams, SessionNotFound
from ctxd.protocol.handlers import serves
from ctxd.protocol.methods import (
    CONTEXT_STATUS,
    SESSION_CREATE,
    SESSION_GET,
    SESSION_LIST,
)
from ctxd.protocol.types import (
    AppendResult,
    DidAppend,
    Session,
    SessionGetResult,
    SessionListResult,
    Status,
)

log = logging.getLogger("ctxd.engine")

# (session id, notification name, payload): the payload Struct of protocol/types.py, or a
# dict in its wire form (an event another daemon sent, rebuilt by the relay)
EventListener = Callable[[str, str, "msgspec.Struct | dict[str, Any]"], None]


# "not known: ask the store" (None is a known answer: no open run)
_ASK: Any = object()


class Engine(ContextReads, RunsAndApprovals, CompactionCalls):
    def __init__(
        self,
        config: Config | None = None,
        *,
        summarizer: Summarizer | None = None,
        store: Store | None = None,
    ) -> None:
        """`store`: where the data lives (see stores/base.py); by default the embedded
        SQLite file in the config's data dir."""
        self.config = config or Config()
        if store is None:
            # the archive is private to its user, like the runtime dir
            self.config.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            store = SqliteStore(
                self.config.db_path,
                durability=self.config.durability,
                search_budget_seconds=self.config.search_budget_seconds,
            )
        self.store: Store = store
        # a store other daemons write too (PostgreSQL): per-session state is read from it
        # on every request instead of kept between requests
        self.shared_store = shared_store(store)
        self.shared = self.shared_store is not None
        self.archive = store.archive
        self.runs = store.runs
        self.tokens = TokenCounter(self.config.encoding)
        self.summarizer: Summarizer = summarizer or make_summarizer(self.config)
        self.policy = self.config.compaction
        self._contexts: dict[str, ContextState] = {}
        # the context an append has just committed, while its status is made (per
        # thread: appends to a shared store may run on worker threads)
        self._thread = threading.local()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        # archived messages per session: counted once, then kept current by appends
        self._archive_counts: dict[str, int] = {}
        # the rendered model inputs, and each session's open run and pending approvals
        self.view = ContextView(store, shared=self.shared)
        self.run_book = RunBook(store.runs, shared=self.shared)
        self._listeners: list[EventListener] = []
        # a store shared with other daemons tells them of each event (ids; they read the
        # rest from the database); None on the embedded store, which has nothing to do
        self._share_event: EventListener | None = (
            self.shared_store.share_event if self.shared_store else None
        )
        # events emitted on the loop, being told to the other daemons (held: a task
        # nobody refers to may be collected before it has run)
        self._telling: set[asyncio.Future[None]] = set()
        self.compactor = Compactor(
            self,
            store,
            summarizer=self.summarizer,
            tokens=self.tokens,
            policy=self.policy,
            emit=self.emit,
        )
        self.archive_sizes = ArchiveSizes(store, self.compactor.history)

    new_id = staticmethod(new_id)

    @property
    def _committed_context(self) -> ContextState | None:
        return getattr(self._thread, "committed", None)

    @_committed_context.setter
    def _committed_context(self, st: ContextState | None) -> None:
        self._thread.committed = st

    def set_context_state(self, st: ContextState) -> None:
        """After a committed replacement of the stored context."""
        self._contexts[st.session_id] = st
        self.view.context_replaced(st.session_id)

    @property
    def conn(self) -> Any:
        """The SQLite connection of the embedded store (for tests and tools that look at
        the file itself; the engine never uses it)."""
        return self.store.conn  # type: ignore[attr-defined]

    def close(self) -> None:
        self.store.close()

    # events

    def add_listener(self, listener: EventListener) -> None:
        self._listeners.append(listener)

    def emit(self, session_id: str, method: str, params: msgspec.Struct) -> None:
        self.emit_local(session_id, method, params)
        share = self._share_event
        if share is None:
            return
        # other daemons are told in the wire form (stores/postgres/events.py)
        wire = msgspec.to_builtins(params)
        if self._loop is not None and threading.get_ident() == self._loop_thread:
            # a statement is a round trip: from the event loop (a compaction's progress
            # and its end, a run its client left), on the session's worker thread, in
            # the session's order, while the loop serves on
            assert self.shared_store is not None
            told = self.shared_store.in_lane(session_id,
                                             lambda: share(session_id, method, wire))
            self._telling.add(told)
            told.add_done_callback(self._told)
            return
        share(session_id, method, wire)

    def _told(self, told: asyncio.Future[None]) -> None:
        self._telling.discard(told)
        if not told.cancelled() and told.exception() is not None:
            log.error("telling other daemons of an event failed", exc_info=told.exception())

    @contextmanager
    def as_committed(self, session_id: str) -> Iterator[None]:
        """While the block runs, the session's context is the one this daemon's last
        append committed (what follows an append made on a worker thread, on the loop:
        no read of the server for it)."""
        st = self._contexts.get(session_id)
        before = self._committed_context
        self._committed_context = st if st is not None and st.session_id == session_id \
            else before
        try:
            yield
        finally:
            self._committed_context = before

    def serve_off_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Requests may now run on worker threads (a shared store's lanes): events
        they emit reach the subscribers on `loop`, in the order emitted."""
        self._loop, self._loop_thread = loop, threading.get_ident()

    def emit_local(
        self, session_id: str, method: str, params: msgspec.Struct | dict[str, Any]
    ) -> None:
        """To this daemon's subscribers only (an event another daemon shared)."""
        if self._loop is not None and threading.get_ident() != self._loop_thread:
            self._loop.call_soon_threadsafe(self.emit_local, session_id, method, params)
            return
        for listener in self._listeners:
            try:
                listener(session_id, method, params)
            except Exception:
                log.exception("event listener failed for %s", method)

    # sessions

    @serves(SESSION_CREATE)
    def create_session(
        self,
        session_id: str | None = None,
        title: str | None = None,
        metadata: dict[str, Any] | None = None,
        created_at: float | None = None,
    ) -> Session:
        sid = session_id or new_id("ses")
        if created_at is not None:
            why = check_time(created_at)
            if why:
                raise InvalidParams(why, {"param": "createdAt"})
        with self.store.transaction():
            if self.archive.get_session(sid) is not None:
                raise Conflict(
                    f"session {sid!r} already exists; use session/get to read it",
                    {"sessionId": sid},
                )
            self.archive.create_session(sid, title, metadata, created_at)
            st = ContextState(session_id=sid)
            self.store.contexts.save(st)
        self._contexts[sid] = st
        if not self.shared:
            self._archive_counts[sid] = 0
            self.run_book.created(sid)
        return session_struct(self.require_session(sid))  # as stored

    @serves(SESSION_GET)
    def get_session(self, session_id: str) -> SessionGetResult:
        session = self.require_session(session_id)
        return SessionGetResult(session=session_struct(session), status=self.status(session_id))

    @serves(SESSION_LIST)
    def list_sessions(
        self, limit: int = 50, cursor: str | None = None, title: str | None = None
    ) -> SessionListResult:
        after = None
        if cursor:
            try:
                ts, _, sid = cursor.partition(":")
                after = (float(ts), sid)
            except ValueError:
                raise InvalidParams(
                    "cursor is not one this daemon returned; pass nextCursor from the previous page"
                ) from None
        rows = self.archive.list_sessions(limit + 1, after, title)
        page = rows[:limit]
        sessions = []
        for s in page:
            sessions.append(listed_session_struct(
                s, self.status(s.id), self.archive.last_message_at(s.id) or s.created_at
            ))
        next_cursor = f"{page[-1].created_at!r}:{page[-1].id}" if len(rows) > limit else None
        return SessionListResult(sessions=sessions, next_cursor=next_cursor)

    def require_session(self, session_id: str) -> SessionRecord:
        session = self.archive.get_session(session_id)
        if session is None:
            raise SessionNotFound(
                f"no session {session_id!r}; create it with session/create or list "
                "sessions with session/list",
                {"sessionId": session_id},
            )
        return session

    def check_session(self, session_id: str) -> None:
        """`require_session` without the query for a session whose context is kept: a
        kept context is of a stored session, and sessions are never deleted."""
        if session_id not in self._contexts:
            self.require_session(session_id)

    def context_state(self, session_id: str) -> ContextState:
        if self.shared:
            st = self._committed_context
            if st is not None and st.session_id == session_id:
                return st
        else:
            st = self._contexts.get(session_id)
            if st is not None:
                return st
        st = self.store.contexts.load(session_id)
        if st is None:
            self.require_session(session_id)
            st = self._backfill(session_id)
        self._contexts[session_id] = st
        return st

    def _backfill(self, session_id: str) -> ContextState:
        """A session archived before contexts existed: derive its context once."""
        st = ContextState(session_id=session_id)
        msgs = self.archive.read_from(session_id, 0)
        for m in msgs:
            if st.tail_start_id is None and m["role"] == "system":
                st.system_ids.append(m["id"])
            elif st.tail_start_id is None:
                st.tail_start_id = m["id"]
        st.active_messages = len(msgs)
        st.active_tokens = sum(m["tokens"] for m in msgs)
        st.summary_tokens = self.summary_tokens(session_id, st.summary)
        with self.store.transaction():
            if self.store.contexts.load(session_id) is None:
                self.store.contexts.save(st)
        log.info(
            "backfilled the active context of %s from %d archived messages", session_id, len(msgs)
        )
        return st

    # appending

    def append(
        self,
        session_id: str,
        messages: list[Any],
        *,
        run_id: str | None = None,
        client_batch_id: str | None = None,
        prepared: PreparedBatch | None = None,
        run: RunRecord | None = None,
    ) -> AppendResult:
        """Archive a batch. `prepared` is `prepare_append(messages)` done beforehand (the
        daemon does it in a worker thread for large batches); `run`, the run `run_id`
        names, when the caller has just read it."""
        self.check_session(session_id)
        batch = prepared or self.prepare_append(messages, count_tokens=False)
        normalized, digest = batch.normalized, batch.digest
        if client_batch_id is not None and not self.shared:
            # (on a shared store it is looked for under the session's lock, below)
            found = self.archive.find_batch(session_id, client_batch_id)
            if found is not None:
                return self._repeat_batch(session_id, client_batch_id, found, digest)
        if run_id is not None and not self.shared:
            self._check_run(session_id, run_id, run)
        msgs = [m for m, _ in normalized]
        if not self.shared:
            pending = self.run_book.pending(session_id)
            check_tool_pairs(self.archive, pending, self.context_state(session_id), msgs)
        counts = batch.tokens or [self.tokens.count_message(m) for m, _ in normalized]
        rows = [(m, body, n) for (m, body), n in zip(normalized, counts, strict=True)]
        open_run_id: Any = _ASK
        with self._append_transaction(session_id, msgs, client_batch_id, run_id):
            if self.shared and client_batch_id is not None:
                # the same batch may have come through another daemon meanwhile (a
                # client's retry): it is stored once, and both get its result
                found = self.archive.find_batch(session_id, client_batch_id)
                if found is not None:
                    return self._repeat_batch(session_id, client_batch_id, found, digest)
            if self.shared and run_id is not None:  # read with the lock, in one round trip
                self._check_run(session_id, run_id, run)
            # read inside the write transaction: on a shared store another daemon may
            # have appended to this session since this daemon last looked
            st = self.context_state(session_id)
            if self.shared:
                # checked under the store's write lock: a call id another daemon stored a
                # moment ago is refused here as a repeated one, not by a unique key
                pending = self.run_book.pending(session_id)
                check_tool_pairs(self.archive, pending, st, msgs)
                if run_id is None:  # read with the lock (one round trip with the above)
                    open_run_id = self.run_book.open_run_id(session_id)
            batch_id, ids, created = self.archive.append(
                session_id,
                rows,
                digest=digest,
                run_id=run_id,
                client_batch_id=client_batch_id,
                index_texts=batch.index_texts,
            )
            new = st.after_append(rows, ids)
            self.store.contexts.bump_counts(new)
        return self.append_committed(new, rows, ids, batch_id, created, run_id, len(pending),
                                     open_run_id=open_run_id)

    def _append_transaction(
        self, session_id: str, msgs: list[dict[str, Any]], client_batch_id: str | None,
        run_id: str | None,
    ) -> Any:
        """The store's write transaction for an append; a store that can send the reads
        made under its lock ahead of them (PostgreSQL: one round trip) is told them."""
        if self.shared_store is None:
            return self.store.transaction(session_id)
        return self.shared_store.append_transaction(session_id, msgs, client_batch_id, run_id)

    def append_committed(
        self,
        new: ContextState,
        rows: list[tuple[dict[str, Any], str, int]],
        ids: list[int],
        batch_id: int,
        created_at: float,
        run_id: str | None,
        pending: int,
        *,
        elsewhere: bool = False,
        open_run_id: Any = _ASK,
    ) -> AppendResult:
        """What follows a committed batch (on this connection or, `elsewhere`, on another
        one beside the event loop): the kept state, the event and the result. `new`: the
        session's context with the batch; `pending`, the pending approvals the batch was
        checked against."""
        session_id = new.session_id
        self._contexts[session_id] = new
        self.view.appended(session_id, rows, ids, batch_id, created_at)
        if elsewhere:
            # a count made while that commit ran may hold the batch already: count again
            self._archive_counts.pop(session_id, None)
        elif session_id in self._archive_counts:
            self._archive_counts[session_id] += len(ids)
        # what this append already asked is not asked again: the run it names is the
        # session's open one, and the pending approvals are those it checked against
        # and, on a shared store, the context just committed is the session's now
        self._committed_context = new
        try:
            status = self.status(
                session_id, open_run_id=run_id if run_id is not None else open_run_id,
                pending=pending,
            )
        finally:
            self._committed_context = None
        self.emit(
            session_id,
            "session/didAppend",
            DidAppend(session_id=session_id, batch_id=batch_id, message_ids=ids, run_id=run_id,
                      status=status),
        )
        return AppendResult(batch_id=batch_id, message_ids=ids, status=status)

    def prepare_append(self, messages: Any, *, count_tokens: bool = True) -> PreparedBatch:
        """The part of `append` that reads no database state; safe in a worker thread."""
        count = self.tokens.count_message if count_tokens else None
        return prepare_batch(
            messages, self.config.max_batch_messages, self.config.max_message_bytes, count
        )

    def _repeat_batch(
        self, session_id: str, client_batch_id: str, found: tuple[int, str, int, int], digest: str
    ) -> AppendResult:
        batch_id, old_digest, first, last = found
        if old_digest != digest:
            raise Conflict(
                f"clientBatchId {client_batch_id!r} was already used for different "
                "messages; use a new clientBatchId for a new batch",
                {"clientBatchId": client_batch_id, "batchId": batch_id},
            )
        ids = list(range(first, last + 1))
        return AppendResult(batch_id=batch_id, message_ids=ids, status=self.status(session_id))

    def archive_count(self, session_id: str) -> int:
        if self.shared:
            return self.archive.message_count(session_id)
        n = self._archive_counts.get(session_id)
        if n is None:
            n = self._archive_counts[session_id] = self.archive.message_count(session_id)
        return n

    @serves(CONTEXT_STATUS)
    def status(
        self, session_id: str, *, open_run_id: str | None = _ASK, pending: int | None = None
    ) -> Status:
        """`open_run_id` and `pending`: the session's open run and number of pending
        approvals when the caller has just read them."""
        ahead = self.shared_store.status_reads if self.shared_store else None
        if ahead is None:
            return self._status(session_id, open_run_id, pending)
        committed = self._committed_context
        with ahead(
            session_id,
            context=committed is None or committed.session_id != session_id,
            open_run=open_run_id is _ASK,
            pending=pending is None,
        ):
            return self._status(session_id, open_run_id, pending)

    def _status(
        self, session_id: str, open_run_id: str | None, pending: int | None
    ) -> Status:
        st = self.context_state(session_id)
        if open_run_id is _ASK:
            open_run_id = self.run_book.open_run_id(session_id)
        if pending is None:
            pending = self.run_book.pending_count(session_id)
        summarizer = summarizer_status(self.summarizer)
        return Status(
            session_id=session_id,
            active_messages=st.rendered_messages,
            estimated_tokens=st.rendered_tokens,
            archive_messages=self.archive_count(session_id),
            compaction_count=st.compaction_count,
            last_compacted_at=st.last_compacted_at,
            pending_approvals=pending,
            active_run_id=open_run_id,
            compacting=session_id in self.compactor.running
            or (self.shared and self.compactor.elsewhere(session_id)),
            auto_compaction_paused=self.compactor.auto_paused(session_id),
            version=st.version,
            summarizer=summarizer["summarizer"],
            summarizer_last_failure_at=summarizer["summarizerLastFailureAt"],
            summarizer_last_failure=summarizer["summarizerLastFailure"],
        )
