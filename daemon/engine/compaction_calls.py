"""The engine's compaction entry points: whether one is due, compact, rebuild, and the
log of the attempts. The Compactor (daemon/compaction/) does the work. A part of
`Engine` (daemon/engine/core.py), which provides what is declared below.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ctxd.daemon.compaction.compactor import Activity, Compactor, RunActivity
from ctxd.daemon.engine.archive_sizes import ArchiveSizes
from ctxd.daemon.engine.run_book import RunBook
from ctxd.daemon.stores.sql.contexts import ContextState
from ctxd.protocol.handlers import serves
from ctxd.protocol.methods import CONTEXT_COMPACTIONS
from ctxd.protocol.types import Compaction, CompactResult

T = TypeVar("T")


class CompactionCalls:
    compactor: Compactor
    archive_sizes: ArchiveSizes
    run_book: RunBook
    shared: bool

    if TYPE_CHECKING:  # provided by Engine

        def check_session(self, session_id: str) -> None: ...

        def context_state(self, session_id: str) -> ContextState: ...

        async def beside_loop_if_shared(self, fn: Callable[[], T]) -> T: ...

    def over_limits(self, session_id: str) -> bool:
        return self.compactor.over_limits(self.context_state(session_id))

    def auto_compaction_due(self, session_id: str, status: RunActivity | None = None) -> bool:
        """`status`: the session's status just read, if the caller has it (its open run and
        pending approvals need not be asked for again)."""
        if status is None and not self.shared:
            # what the compactor would ask the store, answered from memory
            status = Activity(self.run_book.pending_count(session_id),
                              self.run_book.open_run_id(session_id))
        return self.compactor.auto_due(session_id, status)

    async def auto_compaction_still_due(self, session_id: str) -> bool:
        """`auto_compaction_due` asked again by a running auto-compaction, beside the
        event loop on a shared store (its reads are round trips to the server)."""
        return await self.compactor.beside_loop(
            session_id, lambda: self.auto_compaction_due(session_id))

    async def compact(
        self,
        session_id: str,
        *,
        force: bool = False,
        instructions: str | None = None,
        trigger: str = "manual",
    ) -> CompactResult | None:
        """The result; None only for an automatic one no longer due when it ran."""
        return await self.compactor.compact(
            session_id, force=force, instructions=instructions, trigger=trigger
        )

    async def rebuild(self, session_id: str, *, dry_run: bool = False) -> CompactResult:
        result = await self.compactor.compact(session_id, trigger="rebuild", dry_run=dry_run)
        assert result is not None  # only an automatic compaction is ever skipped
        return result

    def compact_sync(self, session_id: str, **kw: Any) -> CompactResult | None:
        """For library users without an event loop."""
        return asyncio.run(self.compact(session_id, **kw))

    def compaction_log(self, session_id: str, limit: int = 50) -> list[Compaction]:
        return self.compactor.history(session_id, limit)

    def compaction_history(self, session_id: str, limit: int = 50) -> list[Compaction]:
        """The attempts, newest first, each with the archive's size when it ran."""
        self.check_session(session_id)
        return self.archive_sizes.rows(session_id, limit)

    @serves(CONTEXT_COMPACTIONS)
    async def compaction_history_async(
        self, session_id: str, limit: int = 50
    ) -> list[Compaction]:
        """`compaction_history` with the archive's sizes counted beside the event loop:
        the first call on a session scans its whole archive (200 ms at 100,000 messages)."""
        await self.beside_loop_if_shared(lambda: self.check_session(session_id))
        return await self.archive_sizes.rows_async(session_id, limit)
