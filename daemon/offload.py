"""Large appends committed beside the event loop.

A batch of tens of megabytes costs SQLite about a second to insert, index and write to
the WAL; on the daemon's connection, on the event loop, that second is every other
client's wait. Here the batch (validated and counted in a worker thread beforehand) is
committed in a worker thread on a SQLite connection of its own, opened for that commit
and closed after it: no connection is ever used from two threads, and APSW releases
the GIL while SQLite works, so the loop serves other clients meanwhile.

What keeps this as safe as a commit on the loop:

- `WriteGate`: one large commit at a time, and while it runs no other write starts on
  the loop. The dispatcher lets only the methods in `READS` run beside it; any other
  request waits for the gate, so the checks made before the commit (session, run,
  tool-call pairing) still hold when it commits, and appends to one session stay in the
  order they were acknowledged.
- A compaction commits on the loop's connection whenever its summary is ready, so no
  large commit is started while one runs (that batch is committed on the loop, as
  before); compactions start only from requests that wait for the gate.
- The reply is built after the commit returned: what is acknowledged is durable. The
  engine's in-memory state is brought up to date on the loop right after the commit,
  in a task that is not cancelled with the request.
- Only the embedded store: a store shared by several daemons (PostgreSQL) commits on
  the loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from ctxd.daemon.engine import Engine
from ctxd.daemon.messages import PreparedBatch
from ctxd.daemon.pairing import check_tool_pairs
from ctxd.daemon.stores.records import RunRecord
from ctxd.daemon.stores.sql.contexts import ContextState, bump_counts
from ctxd.daemon.stores.sql.runs import RUN_OUTCOMES
from ctxd.daemon.stores.sqlite.archive_fts import SqliteArchive
from ctxd.daemon.stores.sqlite.schema import open_database, thread_transaction
from ctxd.daemon.stores.sqlite.store import SqliteStore
from ctxd.protocol.types import AppendResult, RunFinishResult

# the requests that write nothing: they run while a large commit is under way (any other
# request waits for it, a method added later included)
READS = frozenset({
    "initialize", "session/list", "session/get", "session/subscribe", "session/unsubscribe",
    "archive/read", "archive/search", "context/get", "context/status", "context/explain",
    "context/compactions", "context/pins/list", "approval/list", "tools/list", "tools/call",
    "heartbeat", "shutdown",
})


class WriteGate:
    """Open unless a large commit is under way; one large commit at a time."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._open = asyncio.Event()
        self._open.set()

    @property
    def busy(self) -> bool:
        return not self._open.is_set()

    async def wait_open(self) -> None:
        while not self._open.is_set():
            await self._open.wait()

    @asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        async with self._lock:
            self._open.clear()
            try:
                yield
            finally:
                self._open.set()


def _commit(
    db_path: Path,
    durability: str,
    st: ContextState,
    rows: list[tuple[dict[str, Any], str, int]],
    batch: PreparedBatch,
    run_id: str | None,
    client_batch_id: str | None,
) -> tuple[int, list[int], float, ContextState]:
    """In a worker thread: the write transaction of `Engine.append`, on a connection of
    its own. Returns the batch id, the message ids, their createdAt and the session's new
    context state."""
    conn = open_database(db_path, durability=durability)
    try:
        archive = SqliteArchive(conn)
        with thread_transaction(conn):
            batch_id, ids, created_at = archive.append(
                st.session_id,
                rows,
                digest=batch.digest,
                run_id=run_id,
                client_batch_id=client_batch_id,
                index_texts=batch.index_texts,
            )
            new = st.after_append(rows, ids)
            bump_counts(conn, new)
        return batch_id, ids, created_at, new
    finally:
        conn.close()


class LargeWrites:
    """`append` and `finish_run` of the engine for large batches, committed beside the
    loop when they can be (see the module docstring)."""

    def __init__(self, engine: Engine, compacting: Callable[[], bool]) -> None:
        self.engine = engine
        self.gate = WriteGate()
        # whether a compaction runs or is about to: it would commit on the loop meanwhile
        self._compacting = compacting

    def _beside_loop(self) -> bool:
        eng = self.engine
        return (
            isinstance(eng.store, SqliteStore)
            and not eng.shared
            and not eng.compactor.running
            and not self._compacting()
        )

    async def append(
        self,
        session_id: str,
        messages: list[Any],
        prepared: PreparedBatch,
        *,
        run_id: str | None = None,
        client_batch_id: str | None = None,
        run: RunRecord | None = None,
    ) -> AppendResult:
        """`Engine.append` of a prepared batch; call it holding the gate."""
        eng = self.engine
        eng.require_session(session_id)
        if run_id is not None and (run is None or run.id != run_id):
            run = eng.runs.get(run_id)

        def on_loop() -> AppendResult:
            return eng.append(session_id, messages, run_id=run_id,
                              client_batch_id=client_batch_id, prepared=prepared, run=run)

        if not self._beside_loop() or not prepared.tokens:
            return on_loop()
        if client_batch_id is not None and eng.archive.find_batch(
            session_id, client_batch_id
        ) is not None:
            return on_loop()  # a repeated batch: its stored ids, or the conflict
        if run_id is not None and (
            run is None or run.session_id != session_id or run.status != "open"
        ):
            return on_loop()  # refused there, with the engine's words
        st = eng.context_state(session_id)
        pending = eng.run_book.pending(session_id)
        check_tool_pairs(eng.archive, pending, st, [m for m, _ in prepared.normalized])
        rows = [(m, body, n) for (m, body), n in
                zip(prepared.normalized, prepared.tokens, strict=True)]
        store = eng.store
        assert isinstance(store, SqliteStore)
        work = asyncio.to_thread(_commit, store.db_path, eng.config.durability, st, rows,
                                 prepared, run_id, client_batch_id)
        # the engine's state follows the commit even when the request is cancelled
        done = asyncio.ensure_future(self._committed(work, rows, run_id, len(pending)))
        return await asyncio.shield(done)

    async def _committed(
        self, work: Any, rows: list[tuple[dict[str, Any], str, int]], run_id: str | None,
        pending: int,
    ) -> AppendResult:
        batch_id, ids, created_at, new = await work
        return self.engine.append_committed(new, rows, ids, batch_id, created_at, run_id, pending,
                                            elsewhere=True)

    async def finish_run(
        self,
        run_id: str,
        outcome: str,
        messages: list[Any],
        prepared: PreparedBatch,
        client_batch_id: str | None = None,
    ) -> RunFinishResult:
        """`Engine.finish_run` with messages, their batch prepared; call it holding the
        gate."""
        eng = self.engine
        run = eng.runs.get(run_id)
        if run is None or run.status != "open" or outcome not in RUN_OUTCOMES:
            # refused before anything is appended, with the engine's words
            return eng.finish_run(run_id, outcome, messages=messages,
                                  client_batch_id=client_batch_id)
        appended = await self.append(run.session_id, messages, prepared, run_id=run_id,
                                     client_batch_id=client_batch_id, run=run)
        result = eng.finish_run(run_id, outcome)
        result.append = appended
        return result
