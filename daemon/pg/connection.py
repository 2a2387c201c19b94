"""One psycopg connection the store's parts share: SQLite's `?` parameters taken,
reconnected on demand, and the server's and the connection's failures turned into typed
errors (`StorageError`, `Conflict`) so a request fails cleanly and the next one connects
again."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import errors as pgerr

from ctxd.protocol.errors import Conflict, StorageError

# the advisory lock every write transaction holds until commit ("ctxa"): writes from all
# daemons are serialized as SQLite's single writer serializes them, so a context row
# read inside a write transaction stays true until it commits
APPEND_LOCK = 0x63747861

def _storage(exc: Exception) -> StorageError:
    if isinstance(exc, pgerr.DiskFull):
        what = "the database server's disk is full"
    elif isinstance(exc, pgerr.ReadOnlySqlTransaction):
        what = "the database is read-only (a standby, or default_transaction_read_only)"
    elif isinstance(exc, psycopg.OperationalError):
        what = f"the PostgreSQL server cannot be reached ({str(exc).strip() or type(exc).__name__})"
    else:
        what = f"the database could not be written ({type(exc).__name__}: {exc})"
    return StorageError(
        f"{what}; nothing was written: fix it and send the request again",
        {"reason": type(exc).__name__},
    )


_STORAGE = (psycopg.OperationalError, pgerr.DiskFull, pgerr.ReadOnlySqlTransaction,
            pgerr.InsufficientResources)


def _reraise(exc: Exception) -> StorageError | Exception:
    """A search's statement_timeout stays itself (it becomes SearchTooBroad); the rest of
    the server's and the connection's failures become StorageError."""
    return exc if isinstance(exc, pgerr.QueryCanceled) else _storage(exc)


def _duplicate(exc: pgerr.UniqueViolation) -> Conflict:
    """A row another daemon stored at the same moment (the engine checked before the
    write lock that none existed): the retry is answered as any duplicate is."""
    what = getattr(exc.diag, "constraint_name", None) or "a unique key"
    return Conflict(
        f"another daemon stored the same ids at the same moment ({what}); nothing of this "
        "request was written: read the session (archive/read) before sending it again",
        {"reason": "UniqueViolation"},
    )


class PgConnection:
    """One psycopg connection (autocommit; explicit transactions), reconnected on demand,
    speaking the SQL dialect the embedded store's parts write."""

    def __init__(self, dsn: str, password: str | None = None) -> None:
        self.dsn = dsn
        self.password = password
        self._conn: psycopg.Connection | None = None
        self._sql: dict[str, str] = {}
        self._depth = 0
        # whether the open transaction holds APPEND_LOCK (an append need not ask again)
        self.write_locked = False
        # called with each new connection (after a server restart, say)
        self.on_connect: list[Any] = []
        # statements never prepared, so each is planned for its own values: the generic
        # plan a prepared statement switches to after five runs may read a session's
        # tail through the primary key (its order matches the heap's), walking every
        # newer row of every other session, where the (session_id, id) index reads only
        # the tail (8 ms instead of 0.2 ms behind 30k rows of another session)
        self.planned_per_call: set[str] = set()

    def raw(self) -> psycopg.Connection:
        c = self._conn
        if c is None or c.closed or c.broken:
            if c is not None and not c.closed:
                c.close()
            self._conn = None
            try:
                kw = {"password": self.password} if self.password is not None else {}
                c = psycopg.connect(self.dsn, autocommit=True, **kw)
            except psycopg.Error as exc:
                raise _storage(exc) from None
            # no JIT compilation: ctxd's statements are short, and a cost estimate that
            # passes jit_above_cost (a generate_series over many batches, a join the
            # planner misjudges) would add milliseconds of compiling to a sub-millisecond
            # read
            try:
                c.execute("SET jit = off")
            except psycopg.Error as exc:
                c.close()
                raise _storage(exc) from None
            self._conn = c
            for hook in self.on_connect:
                hook(c)
        return c

    def _convert(self, sql: str) -> str:
        out = self._sql.get(sql)
        if out is None:
            out = self._sql[sql] = sql.replace("%", "%%").replace("?", "%s")
        return out

    def execute(self, sql: str, params: Sequence[Any] = ()) -> psycopg.Cursor:
        try:
            prepare = False if sql in self.planned_per_call else None
            return self.raw().execute(self._convert(sql), params or None, prepare=prepare)
        except _STORAGE as exc:
            raise _reraise(exc) from None
        except pgerr.UniqueViolation as exc:
            raise _duplicate(exc) from None

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        try:
            with self.raw().cursor() as cur:
                cur.executemany(self._convert(sql), rows)
        except _STORAGE as exc:
            raise _reraise(exc) from None
        except pgerr.UniqueViolation as exc:
            raise _duplicate(exc) from None

    @contextmanager
    def transaction(self, *, write_lock: bool = False) -> Iterator[None]:
        conn = self.raw()
        try:
            with conn.transaction():
                self._depth += 1
                try:
                    if write_lock and self._depth == 1:
                        conn.execute("SELECT pg_advisory_xact_lock(%s)", (APPEND_LOCK,))
                        self.write_locked = True
                    yield
                finally:
                    self._depth -= 1
                    if self._depth == 0:
                        self.write_locked = False
        except _STORAGE as exc:
            raise _reraise(exc) from None

    @contextmanager
    def pipeline(self) -> Iterator[None]:
        """Statements sent together and answered together: one round trip for those
        whose results are not read (a failure surfaces when the block ends)."""
        try:
            with self.raw().pipeline():
                yield
        except _STORAGE as exc:
            raise _reraise(exc) from None
        except pgerr.UniqueViolation as exc:
            raise _duplicate(exc) from None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
