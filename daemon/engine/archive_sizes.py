"""The archive's size when each compaction ran, for `context/compactions`.

The archive before a compaction never changes: each size is counted once, and later
compactions continue the count from the newest one counted (a checkpoint), so a
session's archive is scanned once however often its history is asked for.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from ctxd.daemon.stores.base import Store
from ctxd.protocol.types import Compaction

History = Callable[[str, int], list[Compaction]]
# (the sizes of the rows asked for, the checkpoint after them): see ArchiveStore.sizes_at
Counted = tuple[list[tuple[int, int]], tuple[int, int, int]]


class ArchiveSizes:
    def __init__(self, store: Store, history: History) -> None:
        """`history(session_id, limit)`: the session's compaction attempts, newest
        first, as `context/compactions` returns them."""
        self.store = store
        self.history = history
        # (messages, tokens) of the archive when each compaction ran, and per session the
        # scan's checkpoint (time, (last id, messages, tokens))
        self._sizes: dict[str, dict[str, tuple[int, int]]] = {}
        self._checkpoints: dict[str, tuple[float, tuple[int, int, int]]] = {}

    def rows(self, session_id: str, limit: int) -> list[Compaction]:
        """The attempts, newest first, each with the archive's size when it ran."""
        rows, missing, times, checkpoint = self._todo(session_id, limit)
        if missing:
            counted = self.store.archive.sizes_at(session_id, times, checkpoint)
            self._counted(session_id, missing, times, counted)
        return self._with_sizes(session_id, rows)

    async def rows_async(self, session_id: str, limit: int) -> list[Compaction]:
        """`rows` with the archive's sizes counted beside the event loop: the first call
        on a session scans its whole archive (200 ms at 100,000 messages)."""
        rows, missing, times, checkpoint = self._todo(session_id, limit)
        if missing:
            counted = await self.store.read_async(
                lambda archive: archive.sizes_at(session_id, times, checkpoint))
            self._counted(session_id, missing, times, counted)
        return self._with_sizes(session_id, rows)

    def _todo(self, session_id: str, limit: int) -> tuple[
        list[Compaction], list[Compaction], list[float], tuple[int, int, int]
    ]:
        """The attempts, those whose archive size is not known yet, their times, and the
        checkpoint to count them from."""
        rows = self.history(session_id, limit)
        known = self._sizes.get(session_id, {})
        missing = [r for r in rows if r.compaction_id not in known]
        times = [r.started_at for r in missing]
        at, checkpoint = self._checkpoints.get(session_id, (0.0, (0, 0, 0)))
        if times and min(times) < at:
            checkpoint = (0, 0, 0)  # older than the checkpoint: count from the start
        return rows, missing, times, checkpoint

    def _counted(
        self, session_id: str, missing: list[Compaction], times: list[float],
        counted: Counted,
    ) -> None:
        sizes, end = counted
        known = self._sizes.setdefault(session_id, {})
        for row, size in zip(missing, sizes, strict=True):
            known[row.compaction_id] = size
        # (another call may have moved the checkpoint meanwhile: keep the later one)
        at, _ = self._checkpoints.get(session_id, (0.0, (0, 0, 0)))
        if max(times) >= at:
            self._checkpoints[session_id] = (max(times), end)

    def _with_sizes(self, session_id: str, rows: list[Compaction]) -> list[Compaction]:
        known = self._sizes[session_id] if rows else {}
        return [
            msgspec.structs.replace(r, archive_messages=known[r.compaction_id][0],
                                    archive_tokens=known[r.compaction_id][1])
            for r in rows
        ]
