"""One compaction of a session at a time, in this daemon and across the daemons sharing
a store: the session's running mark, the lock shared with other daemons, and the wait of
a compaction asked for while another one runs. A part of `Compactor`
(daemon/compaction/compactor.py), which provides what is declared below.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ctxd.daemon.config import CompactionPolicy
from ctxd.protocol.errors import CompactionInProgress, CtxdError
from ctxd.protocol.types import ProgressValue

# a compaction waiting for another daemon's asks for the shared lock again after this
# long, doubling up to the most (a short query each time)
SHARED_POLL_FIRST = 0.05
SHARED_POLL_MAX = 0.5

T = TypeVar("T")


class OneAtATime:
    policy: CompactionPolicy
    running: set[str]
    _idle: dict[str, asyncio.Event]
    _waiting: dict[str, int]
    _shared_lock: Callable[[str], bool] | None
    _shared_release: Callable[[str], None] | None

    if TYPE_CHECKING:  # provided by Compactor

        def _progress(self, session_id: str, token: str, value: ProgressValue) -> None: ...

        async def beside_loop(self, session_id: str, fn: Callable[[], T]) -> T: ...

    async def _unlock(self, session_id: str) -> None:
        # the shared lock let go before the running mark: a compaction of the session
        # started here next asks for the lock after it is released, never before
        try:
            await self._release_shared(session_id)
        finally:
            self.running.discard(session_id)
            self._idle[session_id].set()

    async def _take_if_free(self, session_id: str) -> bool:
        """Take the session's compaction lock shared with other daemons (always granted
        on a store of one daemon's own) for a session no compaction of this daemon runs.
        False when one runs here or another daemon holds the lock.

        On a shared store the lock is asked for on the session's worker thread (round
        trips to the server), so the running mark is looked at again once it is taken:
        a lock this daemon holds is granted to it again, so a compaction started here
        meanwhile must not be run beside. On the embedded store nothing is awaited."""
        if session_id in self.running:
            return False
        if self._shared_lock is not None:
            take = self._shared_lock
            if not await self.beside_loop(session_id, lambda: take(session_id)):
                return False
        if session_id in self.running:
            await self._release_shared(session_id)
            return False
        return True

    async def _release_shared(self, session_id: str) -> None:
        if self._shared_release is not None:
            release = self._shared_release
            await self.beside_loop(session_id, lambda: release(session_id))

    async def _wait_for_running(self, session_id: str, cid: str, trigger: str) -> bool:
        """Wait, at most `wait_seconds`, until no compaction of the session runs, here or
        on another daemon sharing the store, and take the shared lock; reports the wait
        as progress under `cid`. Returns True (progress has begun)."""
        title = "Rebuilding context" if trigger == "rebuild" else "Compacting context"
        self._progress(
            session_id,
            cid,
            ProgressValue(
                kind="begin",
                title=title,
                message="waiting for the compaction already running",
                percentage=0,
            ),
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.policy.wait_seconds
        self._waiting[session_id] = self._waiting.get(session_id, 0) + 1
        poll = SHARED_POLL_FIRST
        try:
            # several waiters may wake together: whoever starts first runs, the others
            # wait on
            while True:
                left = deadline - loop.time()
                try:
                    if session_id in self.running:
                        if left <= 0:
                            raise TimeoutError
                        await asyncio.wait_for(self._idle[session_id].wait(), left)
                        continue
                    if await self._take_if_free(session_id):
                        break
                    if session_id in self.running:
                        continue  # one started here meanwhile: wait for it as above
                    if left <= 0:
                        raise TimeoutError
                    # another daemon compacts it: its end is not told here, so look again
                    # shortly (a short query each time; the event loop serves meanwhile)
                    await asyncio.sleep(min(poll, left))
                    poll = min(poll * 2, SHARED_POLL_MAX)
                except TimeoutError:
                    self._progress(session_id, cid, ProgressValue(kind="end", message="timed out"))
                    raise CompactionInProgress(
                        f"a compaction of this session was still running after "
                        f"{self.policy.wait_seconds:g} s of waiting; wait for "
                        "context/didCompact and try again",
                        {"waitedSeconds": self.policy.wait_seconds},
                    ) from None
                except CtxdError:  # the shared store could not be asked (StorageError)
                    self._progress(session_id, cid,
                                   ProgressValue(kind="end", message="not started"))
                    raise
        finally:
            self._waiting[session_id] -= 1
            if not self._waiting[session_id]:
                del self._waiting[session_id]
        self._progress(
            session_id,
            cid,
            ProgressValue(kind="report", message="the running compaction finished",
                          percentage=0),
        )
        return True
