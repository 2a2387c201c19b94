"""A PgConnection's state of its own (one per thread, or one for all), and the rows
of reads sent ahead."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg


class _State:
    """A connection's state of its own: the server connection, the open transaction."""

    def __init__(self) -> None:
        self.conn: psycopg.Connection | None = None
        self.depth = 0
        # the sessions whose row the open transaction has locked
        self.locked_sessions: set[str] = set()
        # the sessions whose lock a request run again queues for (see lock_session)
        self.patient: set[str] = set()
        # set while a search's own statement_timeout runs: its cancel is SearchTooBroad
        self.in_search_budget = False
        # reads sent ahead together (see `prefetch`): (sql, params) -> their rows
        self.memo: dict[Any, list[Any]] = {}
        # run once the outermost transaction has committed (nothing on a rollback)
        self.after_commit: list[Callable[[], None]] = []
        # a session whose row lock was asked for in a pipeline and not yet answered: a
        # LockNotAvailable surfacing later in that transaction is SessionBusy
        self.unconfirmed: str | None = None
        # set while a transaction's reads were sent ahead (see transaction), and the
        # depth of nested prefetch blocks
        self.tx_reads = False
        self.prefetching = 0
        # a write kept back in a pipelined transaction (PgConnection.hold)
        self.held: tuple[str, Sequence[Any]] | None = None
        # reads sent ahead -> how often `conn` ran them (bundle.preparing)
        self.read_runs: dict[tuple[str, ...], int] = {}
        # PgConnection._epoch when `conn` was opened
        self.epoch = 0


class _ThreadState(threading.local, _State):
    """_State, one per thread."""


def _shared(name: str) -> Any:
    """An attribute of PgConnection kept in its (per-thread) state."""
    return property(lambda self: getattr(self._s, name),
                    lambda self, value: setattr(self._s, name, value))


def _key(sql: str, params: Sequence[Any]) -> tuple[str, tuple[Any, ...]] | None:
    """A read's key in the memo; None for parameters that cannot be one (a list)."""
    key = (sql, tuple(tuple(p) if isinstance(p, list) else p for p in params))
    try:
        hash(key)
    except TypeError:
        return None
    return key


class _Rows:
    """Rows read ahead (PgConnection.prefetch), answered as a cursor would."""

    def __init__(self, rows: list[Any]) -> None:
        self._rows = rows

    def fetchone(self) -> Any:
        return self._rows[0] if self._rows else None

    def fetchall(self) -> list[Any]:
        return self._rows

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows)
