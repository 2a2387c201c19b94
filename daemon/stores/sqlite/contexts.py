"""The active contexts and pins on SQLite: the shared SQL of stores/sql/contexts.py, the
whole row written with SQLite's INSERT OR REPLACE."""

from __future__ import annotations

import apsw

from ctxd.daemon.stores.sql.contexts import (
    _COLUMNS,
    ContextState,
    SqlContexts,
    SqlPins,
    context_row,
)


def save_context(conn: apsw.Connection, st: ContextState) -> None:
    conn.execute(
        f"INSERT OR REPLACE INTO conversation_context({_COLUMNS}, updated_at) "
        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
        context_row(st),
    )


class SqliteContexts(SqlContexts):
    """The active contexts on one SQLite connection."""

    conn: apsw.Connection

    def save(self, st: ContextState) -> None:
        save_context(self.conn, st)


class SqlitePins(SqlPins):
    """The pins on one SQLite connection: the shared SQL as it is."""
