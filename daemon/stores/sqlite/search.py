"""Searches beside the event loop: full-text queries on their own read connections.

A broad query over a large archive can keep SQLite busy for seconds; on the daemon's
one connection that would stall every wire. Here each worker thread has its own
connection (WAL lets readers run beside the writer), APSW releases the GIL while SQLite
works, and the time budget stops a query that runs too long (`SearchTooBroad`).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import apsw

from ctxd.daemon.stores.records import SearchHitRecord
from ctxd.daemon.stores.sqlite.archive_fts import SqliteArchive

T = TypeVar("T")

# two searches at once; more wait their turn (each is bounded by the budget)
SEARCH_WORKERS = 2


class Searcher:
    def __init__(self, db_path: Path, budget_seconds: float) -> None:
        self.db_path = db_path
        self.budget_seconds = budget_seconds
        self._pool: ThreadPoolExecutor | None = None
        self._local = threading.local()
        self._conns: list[apsw.Connection] = []
        self._lock = threading.Lock()

    def _store(self) -> SqliteArchive:
        store: SqliteArchive | None = getattr(self._local, "store", None)
        if store is None:
            conn = apsw.Connection(str(self.db_path))
            conn.set_busy_timeout(10_000)
            conn.pragma("query_only", True)  # a reader, whatever code runs on it
            with self._lock:
                self._conns.append(conn)
            store = self._local.store = SqliteArchive(conn)
        return store

    def _search(self, query: str, kw: dict[str, Any]) -> tuple[list[SearchHitRecord], str]:
        return self._store().search(query, budget_seconds=self.budget_seconds, **kw)

    async def search(self, query: str, **kw: Any) -> tuple[list[SearchHitRecord], str]:
        return await self._run(functools.partial(self._search, query, kw))

    async def read(self, fn: Callable[[SqliteArchive], T]) -> T:
        """`fn(archive)` on a reader connection beside the event loop (a long scan)."""
        return await self._run(lambda: fn(self._store()))

    async def _run(self, fn: Callable[[], T]) -> T:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(SEARCH_WORKERS, thread_name_prefix="ctxd-search")
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def close(self) -> None:
        if self._pool is not None:
            # a running search ends within its budget
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()
