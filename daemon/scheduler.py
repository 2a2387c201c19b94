"""AutoCompactor: background auto-compaction, one at a time per session.

It never blocks request handling: a compaction runs as its own task, and its progress
and result reach subscribers as notifications from the engine. Failures are counted by
the engine's Compactor, which pauses auto-compaction on a session after three in a row.
"""

from __future__ import annotations

import asyncio
import logging

from ctxd.protocol.errors import CtxdError

from .engine import Engine

log = logging.getLogger("ctxd.scheduler")


class AutoCompactor:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def maybe_schedule(self, session_id: str) -> bool:
        """Schedule auto-compaction if it is due; True when it was scheduled."""
        if session_id in self._tasks or not self.engine.auto_compaction_due(session_id):
            return False
        self._tasks[session_id] = asyncio.get_running_loop().create_task(
            self._run(session_id), name=f"auto-compact {session_id}"
        )
        return True

    async def _run(self, session_id: str) -> None:
        try:
            await asyncio.sleep(0)  # let the reply that scheduled us go out first
            # Appends keep landing while the summary is computed: when they outran it,
            # go again at once instead of waiting for the next append or run.
            while self.engine.auto_compaction_due(session_id):
                result = await self.engine.compact(session_id, trigger="auto")
                if not result["effective"]:
                    break
        except CtxdError as exc:
            log.warning("auto-compaction of %s failed: %s", session_id, exc.message)
        except Exception:
            log.exception("auto-compaction of %s failed", session_id)
        finally:
            self._tasks.pop(session_id, None)

    def running(self) -> list[asyncio.Task[None]]:
        return list(self._tasks.values())

    async def drain(self, timeout: float) -> None:
        """Let running compactions finish (at shutdown); cancel what is left: a cancelled
        compaction has committed nothing."""
        tasks = self.running()
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
