"""PostgresStore: the store interface (stores/base.py) on PostgreSQL through psycopg 3.

Most of the SQL is the shared SQL of stores/sql/: the parts (archive, runs, pins,
compaction log) run its statements through `PgConnection`, which takes their `?`
parameters and turns failures of the server or the connection into typed
`StorageError`s. What is PostgreSQL's own is here:

- writes: a write transaction about a session locks that session's row first
  (daemon/stores/postgres/connection.py), so writes to one session are serialized across daemons and
  writes to different sessions are not; ids come from a counter advanced apart
  (daemon/stores/postgres/ids.py): a batch's ids are consecutive and, within a session, increase in
  commit order;
- the active context is written with INSERT .. ON CONFLICT;
- search uses the tsvector parts of daemon/stores/postgres/tsearch.py, ranked by ts_rank, with the
  time budget as a statement_timeout.

A lost connection (PostgreSQL restarted, a network cut) fails the request in flight with
`StorageError`; the next request connects again, so a daemon recovers by itself.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from psycopg import errors as pgerr

from ctxd.daemon.messages import message_text
from ctxd.daemon.stores.postgres import batch_rows, events, prefetch, schema, tsearch
from ctxd.daemon.stores.postgres.connection import (
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_STATEMENT_TIMEOUT,
    PgConnection,
)
from ctxd.daemon.stores.postgres.contexts import PgContexts
from ctxd.daemon.stores.postgres.ids import IdAllocator
from ctxd.daemon.stores.postgres.locks import CompactionLocks
from ctxd.daemon.stores.postgres.prefetch import READ_TAIL, READ_TAIL_RANGE
from ctxd.daemon.stores.postgres.runs import PgRuns
from ctxd.daemon.stores.postgres.store_ahead import ReadsAhead
from ctxd.daemon.stores.records import SearchHitRecord
from ctxd.daemon.stores.sql.archive import SqlArchive, message_from_row
from ctxd.daemon.stores.sql.compaction_log import CompactionLog
from ctxd.daemon.stores.sql.contexts import SqlPins
from ctxd.daemon.stores.sql.search import SearchPage, search_where, too_broad
from ctxd.protocol.errors import InvalidParams, StorageError

log = logging.getLogger("ctxd.pg.store")

SEARCH_WORKERS = 2
# threads waiting, beside the event loop, for a session's row lock (daemon/busy.py)
LOCK_WAITERS = 4
T = TypeVar("T")
# how long the count an append made under its lock answers the status that follows it
# (asked right after the commit, on the same event-loop turn); later asks read again
EXACT_FOR = 0.5

class PgArchive(SqlArchive):
    conn: PgConnection

    def __init__(self, conn: PgConnection) -> None:
        super().__init__(conn)
        conn.binary_params |= batch_rows.BINARY
        # session -> (highest message id counted, count): see message_count
        self._counts: dict[str, tuple[int, int]] = {}
        # counts made in the open transaction under the session's lock, and the sessions
        # whose count is exact as of this store's last commit to them
        self._in_tx: dict[str, tuple[int, int]] = {}
        self._exact: dict[str, float] = {}  # session -> until (monotonic)
        # session -> its last message id before this store's latest append to it: in the
        # open transaction, then once it committed
        self._before_tx: dict[str, int] = {}
        self._preceding: dict[str, int] = {}

    def count_known(self, session_id: str) -> bool:
        """Whether message_count answers without asking the server."""
        return self._exact.get(session_id, 0) > time.monotonic()

    def counted_up_to(self, session_id: str) -> int:
        return self._counts.get(session_id, (0, 0))[0]

    def message_count(self, session_id: str) -> int:
        """Every status asks this, so it must not walk the session's whole history: rows
        are never deleted and a session's ids grow in commit order (its row lock, then
        the ids), so the count is the last one plus the rows past the highest id it
        counted. Right after this store's own append committed, the count that append
        made under the session's lock is the answer (once: later asks read again)."""
        if self._exact.pop(session_id, 0) > time.monotonic():
            return self._counts[session_id][1]
        last, base = self._counts.get(session_id, (0, 0))
        n, top = self.conn.execute(*prefetch.message_count(self, session_id)).fetchone()
        counted = (top or last, base + n)
        if self.conn._depth == 0:
            self._counts[session_id] = counted
        elif session_id in self.conn.locked_sessions:
            # exact while the lock is held; kept (with this transaction's appends) only
            # if it commits
            self._in_tx[session_id] = counted
            self._before_tx.pop(session_id, None)  # a rolled back attempt's
            self._preceding.pop(session_id, None)
            self.conn.after_commit.append(lambda: self._committed(session_id))
        return base + n

    def preceding_id(self, session_id: str) -> int | None:
        """The id of the session's last message before the batch this store last
        appended to it (counted under that append's lock; 0: none), once; None when it
        is not known."""
        return self._preceding.pop(session_id, None)

    def _committed(self, session_id: str) -> None:
        before = self._before_tx.pop(session_id, None)
        if before is not None:
            self._preceding[session_id] = before
        counted = self._in_tx.pop(session_id, None)
        if counted is not None:
            self._counts[session_id] = counted
            self._exact[session_id] = time.monotonic() + EXACT_FOR

    def append(
        self,
        session_id: str,
        messages: Sequence[tuple[dict[str, Any], str, int]],
        *,
        digest: str,
        run_id: str | None,
        client_batch_id: str | None,
        index_texts: Sequence[str] | None = None,
    ) -> tuple[int, list[int], float]:
        c = self.conn
        if c._depth:  # the store's write transaction has taken it first, as a rule
            c.lock_session(session_id)
        now = time.time()
        # a round trip is most of a statement's cost here: one for the ids (taken after
        # the session's lock, so within the session they follow commit order), one for
        # every row the batch writes
        ids, batch_id = self.ids.allocate(len(messages))
        if session_id in self._in_tx:  # counted under this lock: the batch counts too
            top, n = self._in_tx[session_id]
            self._in_tx[session_id] = (max(top, ids[-1]), n + len(ids))
            # the session's last message before this batch (ids follow commit order
            # within a session): the engine's kept tail is whole if it ends there
            self._before_tx[session_id] = top
        parts = [tsearch.tsvector_parts(message_text(m)) for m, _, _ in messages]
        # seen by every listening daemon when (and only if) this transaction commits
        event = (self.origin, session_id,
                 json.dumps({"m": "session/didAppend", "s": session_id, "b": batch_id,
                             "o": self.origin}),
                 now)
        # every row and the event in one statement (daemon/stores/postgres/batch_rows.py),
        # in the append's transaction kept back for the context's counts to join
        # (PgContexts.bump_counts)
        writes = batch_rows.batch_writes(session_id, batch_id, client_batch_id, run_id,
                                         digest, messages, ids, parts, now, event)
        if not c.hold(*writes):
            with c.pipeline():
                c.execute(*writes)
        return batch_id, ids, now

    origin = ""
    ids: IdAllocator

    def read_from(
        self, session_id: str, from_id: int, to_id: int | None = None
    ) -> list[dict[str, Any]]:
        """Every message of the session with from_id <= id (<= to_id): see READ_TAIL."""
        if to_id is None:
            rows = self.conn.execute(READ_TAIL, (from_id, session_id, from_id))
        else:
            rows = self.conn.execute(
                READ_TAIL_RANGE, (from_id, to_id, session_id, from_id, to_id)
            )
        return [message_from_row(r) for r in rows]

    def stored_bytes(
        self, session_id: str, from_id: int, also: Sequence[int] = (),
        less: Sequence[int] = (),
    ) -> int:
        """SqlArchive.stored_bytes, its rows from from_id found as READ_TAIL finds them
        (prefetch.BYTES_FROM)."""
        return sum(sign * int(self.conn.execute(*read).fetchone()[0]) for sign, read in
                   prefetch.stored_bytes_parts(session_id, from_id, also, less))

    def batch(self, batch_id: int) -> tuple[str, str | None, int, int] | None:
        """(session id, run id, first message id, last message id) of a batch."""
        row = self.conn.execute(
            "SELECT session_id, run_id, first_message_id, last_message_id FROM batches "
            "WHERE id = ?", (batch_id,),
        ).fetchone()
        return tuple(row) if row else None  # type: ignore[return-value]

    def get_many(self, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        rows = self.conn.execute(
            "SELECT id, batch_id, body, tokens, created_at FROM messages WHERE id = ANY(?)",
            (list(ids),),
        )
        return {r[0]: message_from_row(r) for r in rows}

    # `search` is SqlSearch's: the same fallback from "all" words to "any" and the
    # same paging, over PostgreSQL's query builders, budget and SQL below
    queries = tsearch

    @contextmanager
    def _budget(self, seconds: float | None) -> Iterator[float | None]:
        """A statement_timeout for the search's transaction; the server cancels the
        statement at the budget, so no deadline is given to the code outside it."""
        if not seconds:
            yield None
            return
        with self.conn.transaction():
            self.conn.execute(
                "SELECT set_config('statement_timeout', ?, true)", (str(int(seconds * 1000)),)
            )
            self.conn.in_search_budget = True
            try:
                yield None
            except pgerr.QueryCanceled:
                raise too_broad(seconds) from None
            finally:
                self.conn.in_search_budget = False

    def _search(self, match: str, page: SearchPage) -> list[SearchHitRecord]:
        where, params = search_where("s.tsv @@ ?::tsquery", match, page)
        order = "m.id DESC" if page.newest_first else "score DESC, m.id"
        sql = (
            "SELECT m.id, m.session_id, m.role, m.created_at, m.body, "
            "max(ts_rank(s.tsv, ?::tsquery)) AS score "
            "FROM messages_search s JOIN messages m ON m.id = s.message_id "
            f"WHERE {where} GROUP BY m.id ORDER BY {order} LIMIT ? OFFSET ?"
        )
        params = [match, *params, page.limit, page.offset]  # the first for ts_rank
        try:
            rows = list(self.conn.execute(sql, params))
        except pgerr.SyntaxError as exc:
            raise InvalidParams(
                f"search query not understood: {exc}; check the query syntax, or search "
                "without advanced mode"
            ) from None
        lexemes = tsearch.query_lexemes(match)
        return [
            SearchHitRecord(
                message_id=mid,
                session_id=sid,
                role=r,
                snippet=tsearch.snippet(message_text(json.loads(body)), lexemes),
                created_at=created,
                score=round(float(score), 4),
            )
            for mid, sid, r, created, body, score in rows
        ]


class PostgresStore(ReadsAhead):
    # several daemons may write: the engine keeps no per-session state between requests
    shared = True

    def __init__(
        self, dsn: str, *, password: str | None = None, search_budget_seconds: float = 0,
        migrate: bool = True, lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT,
    ) -> None:
        self.dsn = dsn
        self.password = password
        self.search_budget_seconds = search_budget_seconds
        self.lock_timeout = lock_timeout
        self.statement_timeout = statement_timeout
        # per thread: requests served on worker threads (see `in_lane`) each have a
        # connection of their own
        self.conn = PgConnection(
            dsn, password, lock_timeout=lock_timeout, statement_timeout=statement_timeout,
            per_thread=True,
        )
        if migrate:
            schema.migrate(self.conn.raw())
        # this store's own appends, told apart from other daemons' on the events channel
        self.origin = uuid.uuid4().hex
        self.ids = IdAllocator(self.conn)
        self.archive = PgArchive(self.conn)  # type: ignore[arg-type]
        self.archive.origin = self.origin
        self.archive.ids = self.ids
        self.compaction_locks = CompactionLocks(self.conn)
        self._waiters: ThreadPoolExecutor | None = None
        self.contexts = PgContexts(self.conn)  # type: ignore[arg-type]
        self.pins = SqlPins(self.conn)
        self.runs = PgRuns(self.conn)
        self.compactions = CompactionLog(self.conn)
        self._pool: ThreadPoolExecutor | None = None
        self._lanes: list[ThreadPoolExecutor] | None = None
        self._session_tails: dict[str, asyncio.Future[None]] = {}
        self._readers: list[PgConnection] = []
        self._local: Any = None
        self._stop = threading.Event()
        self._listener: threading.Thread | None = None
        self._on_event: Callable[[dict[str, Any]], None] | None = None
        self._event_reader = events.EventReader(self.origin, events.parse_reference)
        # session -> the compactions other daemons told of beginning and not of ending
        # (their progress tokens): only while there are any does a status ask the
        # server whether one of them holds the session's compaction lock
        self._elsewhere: dict[str, set[str]] = {}

    def _connection(self) -> PgConnection:
        return PgConnection(
            self.dsn, self.password, lock_timeout=self.lock_timeout,
            statement_timeout=self.statement_timeout,
        )

    def transaction(self, session_id: str | None = None):  # type: ignore[no-untyped-def]
        """A write transaction; with `session_id`, that session's row locked first (at
        once, or SessionBusy)."""
        return self.conn.transaction(session_id)

    def patience(self, session_id: str):  # type: ignore[no-untyped-def]
        """The next lock of the session queues a moment instead of refusing (busy.py)."""
        return self.conn.patience(session_id)

    async def wait_session(self, session_id: str, timeout: float) -> None:
        """Wait beside the event loop, at most `timeout` seconds (StorageTimeout), until
        no connection holds the session's write lock (daemon/busy.py)."""
        if self._waiters is None:
            self._waiters = ThreadPoolExecutor(LOCK_WAITERS, thread_name_prefix="ctxd-pg-wait")

        def wait() -> None:
            conn = getattr(self._local_waiter(), "conn", None)
            if conn is None:
                conn = self._local_waiter().conn = self._connection()
                self._readers.append(conn)
            conn.wait_session(session_id, timeout)

        await asyncio.get_running_loop().run_in_executor(self._waiters, wait)

    def _local_waiter(self) -> Any:
        if self._local is None:
            self._local = threading.local()
        return self._local

    def try_compaction_lock(self, session_id: str) -> bool:
        """Whether this daemon may compact the session now (no other daemon does)."""
        return self.compaction_locks.try_lock(session_id)

    def release_compaction_lock(self, session_id: str) -> None:
        self.compaction_locks.release(session_id)

    def compacting_elsewhere(self, session_id: str) -> bool:
        """Whether another daemon compacts the session now. No query unless another
        daemon's compaction events said one began and has not said it ended; then one
        look at the server's locks settles it (and forgets the ones whose daemon died or
        let go without saying so)."""
        if not self._elsewhere.get(session_id):
            return False
        try:
            held = self.compaction_locks.held_elsewhere(session_id)
        except StorageError:
            return True  # the server is away: say what the events said
        if not held:
            self._elsewhere.pop(session_id, None)
        return held

    def note_event(self, ref: dict[str, Any]) -> None:
        """Keep track of other daemons' compactions from their events (on the event
        loop, before any relaying): progress under a token means one runs or waits, its
        end (or the compaction's result) that it is over."""
        method = ref.get("m")
        if method == "$/progress":
            v = ref.get("v") or {}
            token, kind = v.get("token"), (v.get("value") or {}).get("kind")
        elif method in ("context/didCompact", "context/compactionFailed"):
            token, kind = (ref.get("v") or {}).get("compactionId"), "end"
        else:
            return
        if not isinstance(token, str):
            return
        sid = ref["s"]
        if kind == "end":
            tokens = self._elsewhere.get(sid)
            if tokens is not None:
                tokens.discard(token)
                if not tokens:
                    del self._elsewhere[sid]
        else:
            self._elsewhere.setdefault(sid, set()).add(token)

    def share_event(self, session_id: str, method: str, params: dict[str, Any]) -> None:
        """Tell the other daemons of an event this one emitted (see stores/postgres/events.py).
        Never fails the request that made the change: a lost notification is logged."""
        payload = events.reference(self.origin, session_id, method, params)
        if payload is None:
            return
        try:
            self.conn.execute(events.RECORD, (self.origin, session_id, payload, time.time()))
        except StorageError:
            log.warning("could not tell other daemons of %s of %s", method, session_id)

    def listen(self, on_event: Callable[[dict[str, Any]], None]) -> None:
        """Call `on_event(reference)` (from a thread of its own) for every event another
        daemon sends (daemon/stores/postgres/events.py); reconnects by itself when the server comes
        back."""
        self._on_event = on_event
        self._listener = threading.Thread(
            target=self._listen, args=(on_event,), name="ctxd-pg-listen", daemon=True
        )
        self._listener.start()
        # a daemon about to serve: the lanes' connections opened now, not by its first
        # requests
        self.warm_lanes()

    @property
    def listening(self) -> threading.Event:
        """Set while this daemon hears other daemons' events."""
        return self._event_reader.listening

    def ensure_listening(self) -> None:
        """Start the listening thread again if it has ended (it never should)."""
        if self._on_event is None or self._stop.is_set():
            return
        if self._listener is not None and self._listener.is_alive():
            return
        log.warning("the events listener had stopped; listening again")
        self.listen(self._on_event)

    def _listen(self, on_event: Callable[[dict[str, Any]], None]) -> None:
        events.listen_forever(
            self.dsn, self.password, self._stop, on_event, self._event_reader, self._own_pids,
        )

    def watch(self, session_id: str | None, watched: bool) -> None:
        """Read other daemons' events of the session (None: of every session), or stop:
        told by the event hub as this daemon's clients subscribe and leave."""
        self._event_reader.watch(session_id, watched)

    def _own_pids(self) -> set[int]:
        """The server processes of the connections this daemon sends events on."""
        return self.conn.backend_pids()

    def _reader(self) -> PgArchive:
        if self._local is None:
            self._local = threading.local()
        archive = getattr(self._local, "archive", None)
        if archive is None:
            conn = self._connection()
            self._readers.append(conn)
            archive = self._local.archive = PgArchive(conn)  # type: ignore[arg-type]
        return archive

    def _search(self, query: str, kw: dict[str, Any]) -> tuple[list[SearchHitRecord], str]:
        return self._reader().search(query, budget_seconds=self.search_budget_seconds, **kw)

    async def search_async(self, query: str, **kw: Any) -> tuple[list[SearchHitRecord], str]:
        return await self._run(functools.partial(self._search, query, kw))

    async def read_async(self, fn: Callable[[PgArchive], T]) -> T:
        return await self._run(lambda: fn(self._reader()))

    async def _run(self, fn: Callable[[], T]) -> T:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(SEARCH_WORKERS, thread_name_prefix="ctxd-pg-search")
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def close(self) -> None:
        self._stop.set()
        if self._listener is not None:
            self._listener.join(5)
        if self._listener is None or not self._listener.is_alive():
            self._event_reader.close()
        for pool in (self._pool, self._waiters, *(self._lanes or ())):
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        self._pool = self._waiters = self._lanes = None
        self.compaction_locks.close()
        self.runs.close()
        self.ids.close()
        for r in self._readers:
            r.close()
        self._readers.clear()
        self.conn.close()
