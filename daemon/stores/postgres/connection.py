"""One psycopg connection the store's parts share: SQLite's `?` parameters taken,
reconnected on demand, and the server's and the connection's failures turned into typed
errors (`StorageError`, `Conflict`) so a request fails cleanly and the next one connects
again."""

from __future__ import annotations

import threading
from collections.abc import Callable, Container, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import errors as pgerr

from ctxd.daemon.stores.postgres import bundle
from ctxd.daemon.stores.postgres.conn_state import _key, _Rows, _shared, _State, _ThreadState
from ctxd.daemon.stores.postgres.pg_errors import _STORAGE, _duplicate, _storage, _timeout
from ctxd.protocol.errors import SessionBusy, StorageError

# A write transaction about one session first locks that session's row in `sessions`
# (FOR NO KEY UPDATE, which foreign-key checks do not wait for): writes to one session
# are serialized across daemons, so a context row read inside the transaction stays true
# until it commits, while writes to other sessions go on beside it. A row lock needs
# UPDATE rights on ctxd's table, where an advisory key could be held by any role allowed
# to connect. NOWAIT: the event loop never waits for it (SessionBusy; daemon/busy.py
# waits beside the loop and runs the request again).
LOCK_SESSION = "SELECT 1 FROM sessions WHERE id = %s FOR NO KEY UPDATE NOWAIT"
# the same lock waited for, up to the connection's lock_timeout (beside the loop)
WAIT_SESSION = "SELECT 1 FROM sessions WHERE id = %s FOR NO KEY UPDATE"
# how long a request run again, once its session's lock was seen free, queues for it on
# the event loop: behind at most one transaction of each other daemon (each daemon's loop
# queues for one at a time), milliseconds each
PATIENT_WAIT = 0.2

# the bounds every connection of ctxd's sets (postgres.lock_timeout_seconds,
# postgres.statement_timeout_seconds): no wait on the server is unbounded
DEFAULT_LOCK_TIMEOUT = 5.0
DEFAULT_STATEMENT_TIMEOUT = 30.0
# seconds to reach the server when the DSN names no connect_timeout
CONNECT_TIMEOUT = 10


class PgConnection:
    """One psycopg connection (autocommit; explicit transactions), reconnected on demand,
    speaking the SQL dialect the embedded store's parts write."""

    def __init__(
        self, dsn: str, password: str | None = None, *,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT,
        settings: dict[str, str] | None = None,
        per_thread: bool = False,
    ) -> None:
        self.dsn = dsn
        self.password = password
        self.lock_timeout = lock_timeout
        self.statement_timeout = statement_timeout
        # more server settings for this connection (name -> value)
        self.settings = settings or {}
        self._sql: dict[str, str] = {}
        # statements never prepared, so each is planned for its own values: for one
        # whose generic plan (what a prepared statement may switch to after five runs)
        # would be worse than planning each run, or whose planning costs less than the
        # round trip preparing it takes (ids.py). The reads of a session's rows are safe
        # to prepare (prefetch.READ_TAIL says why)
        self.planned_per_call: set[str] = set()
        # statements whose parameters are sent in binary: psycopg writes a list of texts
        # in the text format through a regular expression per element (every `"` of a
        # JSON body escaped by a template substitution: 0.5 ms for a turn's bodies),
        # where the binary format copies each element as it is (8 us)
        self.binary_params: set[str] = set()
        # called with each new connection (after a server restart, say)
        self.on_connect: list[Any] = []
        # per_thread: each thread that uses this object has a server connection (and a
        # transaction) of its own, so requests served on worker threads never share one
        self._s: _State = _ThreadState() if per_thread else _State()
        self._opened: list[psycopg.Connection] = []
        # bumped when a connection is found lost; each thread's connection is replaced
        # before its next use if it was opened before the last bump
        self._epoch = 0
        self._opened_lock = threading.Lock()

    def lock_holder(self) -> psycopg.Connection:
        """A new connection of the same settings that holds transaction-scoped locks
        (compaction locks, a daemon's presence row). Not autocommit: a lock lives as long
        as its transaction, which the server must not end for being idle."""
        holder = PgConnection(
            self.dsn, self.password, lock_timeout=self.lock_timeout,
            statement_timeout=self.statement_timeout,
            settings={"idle_in_transaction_session_timeout": "0"},
        ).raw()
        holder.autocommit = False
        return holder

    def raw(self) -> psycopg.Connection:
        c = self._conn
        if c is None or c.closed or c.broken or (
                self._s.epoch < self._epoch and self._depth == 0 and c._pipeline is None):
            if c is not None and not c.closed:
                c.close()
            self._conn = None
            try:
                c = connect(self.dsn, self.password, autocommit=True)
            except psycopg.Error as exc:
                raise _storage(exc) from None
            # no JIT compilation: ctxd's statements are short, and a cost estimate that
            # passes jit_above_cost (a generate_series over many batches, a join the
            # planner misjudges) would add milliseconds of compiling to a sub-millisecond
            # read; and every wait bounded
            settings = {
                "jit": "off",
                "lock_timeout": str(int(self.lock_timeout * 1000)),
                "statement_timeout": str(int(self.statement_timeout * 1000)),
                **self.settings,
            }
            try:
                c.execute(
                    "SELECT " + ", ".join("set_config(%s, %s, false)" for _ in settings),
                    [x for kv in settings.items() for x in kv],
                )
            except psycopg.Error as exc:
                c.close()
                raise _storage(exc) from None
            self._conn = c
            self._read_runs = {}
            self._s.epoch = self._epoch
            with self._opened_lock:
                self._opened = [x for x in self._opened if not x.closed]
                self._opened.append(c)
            for hook in self.on_connect:
                hook(c)
        return c

    @property
    def backend_pid(self) -> int | None:
        """The server process of the calling thread's connection (None while there is
        none)."""
        c = self._conn
        return None if c is None or c.closed else c.info.backend_pid

    def backend_pids(self) -> set[int]:
        """The server processes of every open connection of this object's, any thread's."""
        with self._opened_lock:
            return {c.info.backend_pid for c in self._opened if not c.closed}

    def _convert(self, sql: str) -> str:
        out = self._sql.get(sql)
        if out is None:
            mark = "%b" if sql in self.binary_params else "%s"
            out = self._sql[sql] = sql.replace("%", "%%").replace("?", mark)
        return out

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        if self._memo and (self._depth == 0 or self._tx_reads):
            # in the transaction that read them under its lock, once (its own writes may
            # follow); outside, as often as the block that read them asks
            key = _key(sql, params)
            rows = self._memo.pop(key, None) if self._depth else self._memo.get(key)
            if rows is not None:
                return _Rows(rows)
        if self._held is not None:
            self._send_held()
        prepare = False if sql in self.planned_per_call else None
        try:
            return self.raw().execute(self._convert(sql), params or None, prepare=prepare)
        except _STORAGE as exc:
            raise self._reraise(exc) from None
        except pgerr.UniqueViolation as exc:
            raise _duplicate(exc) from None

    def execute_again(self, sql: str, params: Sequence[Any] = ()) -> psycopg.Cursor:
        """`execute`, sent once more on a new connection when the old one turns out to
        be dead (the server restarted since this connection was last used): for a
        statement that may run twice, outside a transaction."""
        try:
            return self.execute(sql, params)
        except StorageError as exc:
            c = self._conn
            ended = (exc.data or {}).get("reason") == "AdminShutdown"  # not run: safe again
            if c is not None and not c.closed and not c.broken and not ended:
                raise
            if c is not None:
                c.close()
            return self.execute(sql, params)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if self._held is not None:
            self._send_held()
        try:
            with self.raw().cursor() as cur:
                cur.executemany(self._convert(sql), rows)
        except _STORAGE as exc:
            raise self._reraise(exc) from None
        except pgerr.UniqueViolation as exc:
            raise _duplicate(exc) from None

    def hold(self, sql: str, params: Sequence[Any]) -> bool:
        """In a transaction whose reads were sent ahead (its statements pipelined, their
        results unread): keep a write back, to be sent with the transaction's next
        statement or its COMMIT, unless the next write takes it into its own statement
        first (`take_held`); False (nothing kept) elsewhere."""
        if not self._tx_reads or self._held is not None:
            return False
        self._held = (sql, params)
        return True

    def take_held(self, among: Container[str]) -> tuple[str, Sequence[Any]] | None:
        """The write kept back (`hold`) if its statement is one of `among`: now the
        caller's to send."""
        held = self._held
        if held is None or held[0] not in among:
            return None
        self._held = None
        return held

    def _send_held(self) -> None:
        sql, params = self._held
        self._held = None
        self.raw().execute(self._convert(sql), params or None,
                           prepare=False if sql in self.planned_per_call else None)

    def _reraise(self, exc: Exception) -> Exception:
        """A search's statement_timeout stays itself (it becomes SearchTooBroad); another
        timeout is StorageTimeout; the rest of the server's and the connection's
        failures become StorageError."""
        if isinstance(exc, pgerr.QueryCanceled) and self.in_search_budget:
            return exc
        if isinstance(exc, (pgerr.QueryCanceled, pgerr.LockNotAvailable)):
            return _timeout(exc, self.lock_timeout, self.statement_timeout)
        if type(exc) is psycopg.OperationalError or isinstance(exc, pgerr.AdminShutdown):
            # the server is gone or ended this connection (a restart ends them all): the
            # other threads' connections, which may have sat idle through it, are
            # replaced before their next use rather than failing a request each
            self._epoch += 1
        return _storage(exc)

    @contextmanager
    def transaction(
        self, session_id: str | None = None,
        reads: Sequence[tuple[str, Sequence[Any]]] = (),
    ) -> Iterator[None]:
        """One transaction (a savepoint inside another); with `session_id`, that
        session's row is locked first (see LOCK_SESSION), at once or not at all.

        With `reads` (and a session, outermost): BEGIN, the lock and the reads go in one
        round trip, the reads as one statement (bundle.py) after the lock's own: a
        statement reads the snapshot taken when it starts, so reads in the lock's
        statement could miss what the lock's last holder committed. Each read's rows
        are kept for the `execute` that asks for it, and the rest of the transaction
        stays pipelined, so its writes and the COMMIT go in one more (a failure of a
        write surfaces at the commit)."""
        if not reads or session_id is None or self._depth:
            with self._transaction(session_id):
                yield
            return
        conn = self.raw()
        self._memo.clear()
        committed = False
        self._depth += 1
        try:
            # BEGIN and COMMIT as statements of the pipeline: psycopg's own transaction
            # block waits for the server at each (a round trip apiece)
            self._tx_reads = True
            with conn.pipeline():
                conn.execute("BEGIN")
                self.lock_session(session_id, pipelined=True)
                self._send_reads(reads)
                yield
                if self._held is not None:
                    self._send_held()
                conn.execute("COMMIT")
            committed = True
        except pgerr.UniqueViolation as exc:
            raise _duplicate(exc) from None
        except (pgerr.LockNotAvailable, pgerr.PipelineAborted) as exc:
            if self._unconfirmed == session_id:
                raise SessionBusy(session_id) from None
            raise self._reraise(exc) from None
        except _STORAGE as exc:
            raise self._reraise(exc) from None
        finally:
            self._depth -= 1
            self.locked_sessions.clear()
            self._unconfirmed = None
            self._tx_reads = False
            self._held = None
            self._memo.clear()
            if not committed:
                self.after_commit.clear()
                self._read_runs.clear()
                self._rollback(conn)
        hooks, self.after_commit = self.after_commit, []
        for hook in hooks:
            hook()

    @staticmethod
    def _rollback(conn: psycopg.Connection) -> None:
        """End a pipelined transaction that failed (nothing of it was committed)."""
        if conn.closed or conn.broken:
            return
        try:
            # psycopg's rollback also forgets the statements it had prepared: those a
            # failed pipeline never got to prepare are not asked for by name later
            conn.rollback()
        except psycopg.Error:
            conn.close()  # a connection in an unknown state is not used again

    @contextmanager
    def _transaction(self, session_id: str | None, pipelined: bool = False) -> Iterator[None]:
        conn = self.raw()
        committed = False
        try:
            with conn.transaction():
                self._depth += 1
                try:
                    if session_id is not None:
                        self.lock_session(session_id, pipelined=pipelined)
                    yield
                finally:
                    self._depth -= 1
                    if self._depth == 0:
                        self.locked_sessions.clear()
            committed = self._depth == 0
        except _STORAGE as exc:
            if self._depth == 0:
                self.after_commit.clear()
            self._read_runs.clear()
            raise self._reraise(exc) from None
        except BaseException:
            if self._depth == 0:
                self.after_commit.clear()
            self._read_runs.clear()
            raise
        if committed:
            hooks, self.after_commit = self.after_commit, []
            for hook in hooks:
                hook()

    def _send_reads(self, reads: Sequence[tuple[str, Sequence[Any]]]) -> None:
        """Send `reads` behind what the transaction's pipeline holds and wait for every
        answer: one round trip. A read that fails (the session's lock refused first)
        raises here."""
        raw = self.raw()
        keep = self._sent(raw, reads, self._preparing(raw, reads)[0])
        if raw._pipeline is not None:  # inside a transaction's pipeline: answered now
            raw._pipeline.sync()
        keep()
        self._unconfirmed = None

    def _sent(
        self, raw: psycopg.Connection, reads: Sequence[tuple[str, Sequence[Any]]],
        prepare: bool,
    ) -> Callable[[], None]:
        return bundle.send(raw, reads, prepare, self._convert, self._memo)

    def _preparing(
        self, raw: psycopg.Connection, reads: Sequence[tuple[str, Sequence[Any]]]
    ) -> tuple[bool, bool]:
        return bundle.preparing(self._read_runs, [sql for sql, _ in reads],
                                self.planned_per_call, raw.prepare_threshold)

    @contextmanager
    def prefetch(self, reads: Sequence[tuple[str, Sequence[Any]]]) -> Iterator[None]:
        """Outside a transaction: `reads` sent together (one statement, bundle.py: one
        round trip and one snapshot for the request the block wraps) and answered,
        inside the block, to every `execute` that asks for them; forgotten when the
        outermost block ends, so nothing read here is served later. A block inside
        another sends only what the outer one has not read."""
        if self._depth:
            yield
            return
        if not self._prefetching:
            self._memo.clear()
        self._prefetching += 1
        try:
            self._read_ahead([r for r in reads if _key(*r) not in self._memo])
            yield
        finally:
            self._prefetching -= 1
            if not self._prefetching:
                self._memo.clear()

    def _read_ahead(self, reads: Sequence[tuple[str, Sequence[Any]]]) -> None:
        if not reads:
            return
        try:
            raw = self.raw()
            prepare, pipelined = self._preparing(raw, reads)
            if raw._pipeline is None and not pipelined:  # one statement
                self._sent(raw, reads, prepare)()
            else:
                with raw.pipeline():  # answered when this pipeline ends
                    keep = self._sent(raw, reads, prepare)
                keep()
        except _STORAGE as exc:
            raise self._reraise(exc) from None

    def peek(self, sql: str, params: Sequence[Any]) -> list[Any] | None:
        """The rows a read sent ahead got (None: not read ahead)."""
        return self._memo.get(_key(sql, params))

    def lock_session(self, session_id: str, pipelined: bool = False) -> None:
        """Lock the session's row for the open transaction (SessionBusy when another
        connection holds it). A request run again once the lock was seen free (see
        `patient`) queues for it a moment instead: NOWAIT again would let every newer
        request, of this daemon or another, take it first, and a busy session would keep
        refusing the one that waited."""
        if session_id in self.locked_sessions:
            return
        if self._held is not None:
            self._send_held()
        raw = self.raw()
        try:
            if session_id in self.patient:
                raw.execute(
                    "SELECT set_config('lock_timeout', %s, true)",
                    (str(int(PATIENT_WAIT * 1000)),),
                )
                raw.execute(WAIT_SESSION, (session_id,))
            else:
                raw.execute(LOCK_SESSION, (session_id,))
            if pipelined:  # answered with the reads sent behind it
                self._unconfirmed = session_id
        except pgerr.LockNotAvailable:
            raise SessionBusy(session_id) from None
        self.locked_sessions.add(session_id)

    @contextmanager
    def patience(self, session_id: str) -> Iterator[None]:
        """While the block runs, the session's lock is queued for (at most PATIENT_WAIT
        seconds, on the event loop: the holder was seen letting go), not refused."""
        self.patient.add(session_id)
        try:
            yield
        finally:
            self.patient.discard(session_id)

    def wait_session(self, session_id: str, timeout: float) -> None:
        """Wait (in a thread beside the event loop) until no other connection holds the
        session's row lock, at most `timeout` seconds (StorageTimeout); holds nothing
        after."""
        # a dead connection (the server restarted) is noticed by this first statement
        self.execute_again("SELECT 1")
        with self.transaction():
            self.execute(
                "SELECT set_config('lock_timeout', ?, true)", (str(max(1, int(timeout * 1000))),)
            )
            self.raw().execute(WAIT_SESSION, (session_id,))

    @contextmanager
    def pipeline(self) -> Iterator[None]:
        """Statements sent together and answered together: one round trip for those
        whose results are not read (a failure surfaces when the block ends). Inside a
        pipelined transaction they join it, answered with its COMMIT."""
        if self.raw()._pipeline is not None:
            yield
            return
        try:
            with self.raw().pipeline():
                yield
        except _STORAGE as exc:
            raise self._reraise(exc) from None
        except pgerr.UniqueViolation as exc:
            raise _duplicate(exc) from None

    def close(self) -> None:
        with self._opened_lock:
            opened, self._opened = self._opened, []
        for c in opened:
            c.close()
        self._conn = None

    # the calling thread's state (see `per_thread`)
    _conn = _shared("conn")
    _depth = _shared("depth")
    locked_sessions = _shared("locked_sessions")
    patient = _shared("patient")
    in_search_budget = _shared("in_search_budget")
    _memo = _shared("memo")
    after_commit = _shared("after_commit")
    _unconfirmed = _shared("unconfirmed")
    _tx_reads = _shared("tx_reads")
    _prefetching = _shared("prefetching")
    _read_runs = _shared("read_runs")
    _held = _shared("held")


def connect(dsn: str, password: str | None, **kw: Any) -> psycopg.Connection:
    """A psycopg connection to `dsn`: the password given apart, and a bound on reaching
    the server unless the DSN sets its own."""
    if password is not None:
        kw["password"] = password
    if "connect_timeout" not in dsn:
        kw["connect_timeout"] = CONNECT_TIMEOUT
    return psycopg.connect(dsn, **kw)
