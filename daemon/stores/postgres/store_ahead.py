"""PostgresStore's requests in few round trips, and off the event loop.

- Reads sent ahead (daemon/stores/postgres/prefetch.py, PgConnection's memo): an append's write
  transaction takes BEGIN, the session's lock and every read made under it in one round
  trip, the ids in a second, its writes and COMMIT in a third; a status is one round
  trip, a `context/get` two.
- Lanes: requests run on the worker thread that serves their session, each thread on
  a connection of its own (daemon/off_loop.py says which and how).
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ctxd.daemon.stores.postgres import prefetch
from ctxd.protocol.errors import StorageError

if TYPE_CHECKING:  # the store this mixes into
    from ctxd.daemon.stores.postgres.connection import PgConnection
    from ctxd.daemon.stores.postgres.contexts import PgContexts
    from ctxd.daemon.stores.postgres.ids import IdAllocator

T = TypeVar("T")


class KeptView(Protocol):
    """What the reads ahead ask of the engine's kept contexts."""

    def tail_mark(self, session_id: str) -> tuple[int, int] | None: ...

    def keeps_system(self, session_id: str, ids: Any) -> bool: ...


# worker threads serving requests off the event loop (in_lane), each with a connection
LANES = 4
SWITCH_INTERVAL = 0.0005
# seconds the lanes wait for each other to start before opening their connections
WARM_WAIT = 5.0


class ReadsAhead:
    conn: PgConnection
    archive: Any  # PgArchive (store.py imports this module)
    ids: IdAllocator
    contexts: PgContexts
    _lanes: list[ThreadPoolExecutor] | None
    # session -> the last call given for it (in_lane), done when that call is
    _session_tails: dict[str, asyncio.Future[None]]

    @contextmanager
    def append_transaction(
        self, session_id: str, msgs: list[dict[str, Any]], client_batch_id: str | None,
        run_id: str | None,
    ) -> Iterator[None]:
        """An append's write transaction: BEGIN, the session's lock and every read the
        engine makes under it (the context, pending approvals, the batch's tool calls,
        a repeated clientBatchId, the run named or the open one, the archive count) in
        one round trip;
        its writes and the COMMIT in one more (daemon/stores/postgres/prefetch.py)."""
        reads = [prefetch.context(session_id), prefetch.pending(session_id),
                 *prefetch.tool_pairs(session_id, msgs),
                 prefetch.message_count(self.archive, session_id)]
        if client_batch_id is not None:
            reads.append(prefetch.find_batch(session_id, client_batch_id))
        reads.append(prefetch.open_run(session_id) if run_id is None else prefetch.run(run_id))
        with self.conn.transaction(session_id, reads):
            # counted under the lock: with this batch, the count as of the commit, so
            # the status that follows asks nothing (PgArchive.message_count)
            self.archive.message_count(session_id)
            yield

    def status_reads(
        self, session_id: str, *, context: bool, open_run: bool, pending: bool,
    ) -> AbstractContextManager[None]:
        """What a status reads, in one round trip (outside a transaction; the rows not
        asked for in the block are forgotten at its end)."""
        return self.conn.prefetch(self._status_reads(session_id, context, open_run, pending))

    def _status_reads(
        self, session_id: str, context: bool, open_run: bool, pending: bool
    ) -> list[prefetch.Read]:
        reads = []
        if not self.archive.count_known(session_id):
            reads.append(prefetch.message_count(self.archive, session_id))
        if context:
            reads.append(prefetch.context(session_id))
        if open_run:
            reads.append(prefetch.open_run(session_id))
        if pending:
            reads.append(prefetch.pending_count(session_id))
        return reads

    def keep_view(self, view: KeptView) -> None:
        """The engine's copy of the sessions' contexts (daemon/engine/context_view.py):
        a `context/get` reads what that copy lacks, and checks the rest in the same
        round trip."""
        self._view = view

    _view: KeptView | None = None

    @contextmanager
    def context_reads(self, session_id: str) -> Iterator[None]:
        """What a `context/get` reads: the context row, pins, open run, pending
        approvals, archive count and, when the engine keeps the session's tail, the
        messages past its last one, in one round trip; then, only for what the engine
        does not keep as that context names it, its leading system messages, its tail
        and their size in a second."""
        reads = [*self._status_reads(session_id, True, True, True), prefetch.pins(session_id)]
        mark = self._view.tail_mark(session_id) if self._view is not None else None
        if mark is not None:
            reads.append(prefetch.tail(session_id, mark[1]))
        with self.conn.prefetch(reads):
            st = self.contexts.load(session_id)  # answered from what was read ahead
            more = []
            if st is not None and st.system_ids and not (
                    self._view is not None and self._view.keeps_system(session_id,
                                                                       st.system_ids)):
                more.append(prefetch.messages(st.system_ids))
            start = st.tail_start_id if st is not None else None
            if start is not None and (mark is None or mark[0] > start):
                more.append(prefetch.tail(session_id, start))
                # the reply's size bound (daemon/context_reply.py)
                more += prefetch.stored_bytes(session_id, start, st.system_ids,
                                              st.dropped_ids)
            with self.conn.prefetch(more):
                yield

    def in_lane(self, session_id: str, fn: Callable[[], T]) -> asyncio.Future[T]:
        """`fn()` on a worker thread (each with a connection of its own), after every
        call given before it about the same session: one session's calls run one after
        another, in the order given; other sessions' run beside them on the other
        threads, and the event loop waits on none. The call's place in its session's
        order is taken here, when it is given, not when its result is awaited: a call
        nobody waits for (an event told to the other daemons) keeps its place too."""
        loop = asyncio.get_running_loop()
        lanes = self._lane_pool()
        before = self._session_tails.get(session_id)
        mine: asyncio.Future[None] = loop.create_future()
        self._session_tails[session_id] = mine

        async def after_before() -> T:
            if before is not None:
                await asyncio.wait([before])  # its outcome is its own caller's
            return await loop.run_in_executor(lanes, fn)

        def done(_: object) -> None:
            # also for a task cancelled before it began: the session's next call runs
            mine.set_result(None)
            if self._session_tails.get(session_id) is mine:
                del self._session_tails[session_id]

        task = loop.create_task(after_before())
        task.add_done_callback(done)
        return task

    def _lane_pool(self) -> ThreadPoolExecutor:
        if self._lanes is None:
            self._lanes = [ThreadPoolExecutor(LANES, thread_name_prefix="ctxd-pg-lane")]
            # a thread waits for the interpreter's lock up to the switch interval (5 ms
            # by default) while another runs Python: a cheap request answered on one
            # thread would wait that long, several times, behind an append's encoding on
            # another; the lanes' calls are short and mostly wait on the network
            sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
        return self._lanes[0]

    def warm_lanes(self) -> None:
        """Open every lane's connections now, beside the event loop (a daemon about to
        serve). Each is a TCP and an authentication handshake (SCRAM: milliseconds of
        CPU for the daemon and for the server): opened by the first requests, they cost
        those requests, and a short burst of turns several times their own work."""
        if self._lanes is not None:
            return  # started already: its threads may be busy, and have connected
        lanes = self._lane_pool()
        # one task per thread: each holds its thread until every lane has one
        started = threading.Barrier(LANES)

        def connect() -> None:
            try:
                started.wait(WARM_WAIT)
            except threading.BrokenBarrierError:
                pass
            try:
                self.conn.raw()
                self.ids.conn.raw()
            except StorageError:
                pass  # the first request connects again, and says why if it cannot

        for _ in range(LANES):
            lanes.submit(connect)
