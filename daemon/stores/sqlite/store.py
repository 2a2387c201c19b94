"""The embedded store: one SQLite file through APSW, full-text search with FTS5.

The default, and the reference for other implementations (see `base`). Its parts are the
shared SQL of stores/sql/ (runs, pins and the compaction log as they are) and what is
SQLite's beside it: archive_fts.py (FTS5), contexts.py (INSERT OR REPLACE); schema.py
creates and migrates the file; search.py runs searches on reader connections beside the
event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, TypeVar

import apsw

from ctxd.daemon.stores.records import SearchHitRecord
from ctxd.daemon.stores.sql.compaction_log import CompactionLog
from ctxd.daemon.stores.sql.runs import SqlRuns
from ctxd.daemon.stores.sqlite.archive_fts import SqliteArchive
from ctxd.daemon.stores.sqlite.contexts import SqliteContexts, SqlitePins
from ctxd.daemon.stores.sqlite.schema import open_database, transaction
from ctxd.daemon.stores.sqlite.search import Searcher

T = TypeVar("T")


class SqliteRuns(SqlRuns):
    """Runs and approvals on SQLite: the shared SQL as it is."""


class SqliteStore:
    def __init__(
        self, db_path: Path, *, durability: str = "normal", search_budget_seconds: float = 0
    ) -> None:
        self.db_path = db_path
        self.conn: apsw.Connection = open_database(db_path, durability=durability)
        self.archive = SqliteArchive(self.conn)
        self.contexts = SqliteContexts(self.conn)
        self.pins = SqlitePins(self.conn)
        self.runs = SqliteRuns(self.conn)
        self.compactions = CompactionLog(self.conn)
        self.searcher = Searcher(db_path, search_budget_seconds)

    def transaction(self, session_id: str | None = None) -> AbstractContextManager[None]:
        # one writer: every write is serialized, whichever session it is about
        return transaction(self.conn)

    async def search_async(self, query: str, **kw: Any) -> tuple[list[SearchHitRecord], str]:
        return await self.searcher.search(query, **kw)

    async def read_async(self, fn: Callable[[SqliteArchive], T]) -> T:
        return await self.searcher.read(fn)

    def close(self) -> None:
        self.searcher.close()
        self.conn.close()
