"""Scheduling rules: what follows from what, in one place of the core.

- after an append outside a run, auto-compaction runs if it is due (appends inside a
  run are checked when the run finishes, so a turn is never summarized half-way);
- after a run finishes `completed`, auto-compaction runs if it is due;
- after an approval is resolved, a compaction held back by it runs if it is now due;
- a run whose client went away is interrupted; a run left open by a daemon that died is
  interrupted when its client does not claim it within one lease, or at once when a new
  run is started in its session by someone else.

The wires' dispatcher only reports what happened (`after_append`, `after_run_finished`,
...) and keeps which connection holds which run; the rules are here.

AutoCompactor never blocks request handling: a compaction runs as its own task, and its
progress and result reach subscribers as notifications from the engine. Failures are
counted by the engine's Compactor, which pauses auto-compaction on a session after three
in a row.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from ctxd.daemon.busy import when_free_off_loop
from ctxd.daemon.engine import Engine
from ctxd.protocol.errors import CompactionInProgress, CtxdError, RunActive
from ctxd.protocol.types import Approval, Run, RunFinishResult, Status

log = logging.getLogger("ctxd.scheduler")


class AutoCompactor:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._tasks: dict[str, asyncio.Task[None]] = {}
        # runs being marked interrupted beside the loop (a shared store): a shutdown
        # lets them finish too
        self._interrupting: set[asyncio.Task[None]] = set()

    def maybe_schedule(
        self, session_id: str, *, due: bool | None = None, status: Status | None = None
    ) -> bool:
        """Schedule auto-compaction if it is due; True when it was scheduled. `due` is the
        answer the caller just had (nothing ran since); `status`, the session's status it
        just read, saves asking for its open run and pending approvals again."""
        if session_id in self._tasks:
            return False
        if due is None:
            due = self.engine.auto_compaction_due(session_id, status)
        if not due:
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
            while await self.engine.auto_compaction_still_due(session_id):
                result = await self.engine.compact(session_id, trigger="auto")
                if result is None or not result.effective:
                    break
        except CompactionInProgress as exc:
            # another compaction (another daemon's, on a shared store) has it in hand
            log.info("auto-compaction of %s left to the one running: %s", session_id,
                     exc.message)
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
        tasks = [*self.running(), *self._interrupting]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


class Scheduler(AutoCompactor):
    """The rules above, for a daemon started at `started_at` whose clients hold runs for
    `run_lease` seconds after their daemon died."""

    def __init__(self, engine: Engine, run_lease: float = 30.0) -> None:
        super().__init__(engine)
        self.run_lease = run_lease
        self.started_at = time.time()
        # runs open in the file when this daemon started, not yet claimed by a client
        self._stale_runs: set[str] = set()

    # what a change triggers

    def after_append(self, session_id: str, run_id: str | None, status: Status) -> None:
        if run_id is None:  # appends outside a run are checked here, runs at run/finish
            self.maybe_schedule(session_id, status=status)

    def after_run_finished(self, result: RunFinishResult) -> RunFinishResult:
        """`result` of Engine.finish_run, with `autoCompactionScheduled` made true only
        when a compaction was really started."""
        if result.auto_compaction_scheduled:
            result.auto_compaction_scheduled = self.maybe_schedule(
                result.run.session_id, due=True
            )
        return result

    def after_approval_resolved(self, approval: Approval, due: bool | None = None) -> None:
        """`due`: whether auto-compaction was due just after, if the caller asked (on a
        shared store, beside the loop: the context may have to be read)."""
        # a run that finished while this approval was pending scheduled nothing: with the
        # last approval resolved and no run open, the held-back compaction is due now
        self.maybe_schedule(approval.session_id, due=due)

    # runs without a client

    def start_run(self, session_id: str, held: Callable[[str], bool]) -> Run:
        """Start a run; an open run of the session that predates this daemon and that no
        live client holds (`held`) is interrupted first: its client died with the old
        daemon and must not lock the session forever."""
        try:
            return self.engine.start_run(session_id)
        except RunActive as exc:
            stale = exc.data["runId"]
            run = self.engine.runs.get(stale)
            if run is None or run.started_at >= self.started_at or held(stale):
                raise
            log.info("run %s predates this daemon and has no client: interrupted", stale)
            self.engine.finish_run(stale, "interrupted")
            return self.engine.start_run(session_id)

    def client_gone(self, run_ids: set[str]) -> None:
        """Runs whose client went away without run/finish."""
        self._interrupt(run_ids)

    def _interrupt(self, run_ids: set[str]) -> None:
        if not self.engine.shared:
            self.engine.interrupt_runs(run_ids)
            return
        # on a shared store each run is read, then finished in a transaction of its own:
        # round trips, made beside the loop, each in its session's order
        task = asyncio.get_running_loop().create_task(self._interrupt_beside_loop(run_ids))
        self._interrupting.add(task)
        task.add_done_callback(self._interrupting.discard)

    async def _interrupt_beside_loop(self, run_ids: set[str]) -> None:
        store = self.engine.store
        for rid in sorted(run_ids):
            try:
                run = await store.read_async(lambda _archive, rid=rid: self.engine.runs.get(rid))
                if run is None or run.status != "open":
                    continue
                await when_free_off_loop(store, run.session_id,
                                         lambda rid=rid: self.engine.interrupt_runs({rid}))
            except Exception:
                log.exception("marking run %s interrupted failed", rid)

    def lease_stale_runs(self, run_ids: set[str]) -> None:
        """Runs left open by a daemon that died. A client that comes back claims its run
        by naming it (`messages/append`, `approval/request` with its `runId`) within one
        lease; the others are marked interrupted then, so no dead run locks a session."""
        if not run_ids:
            return
        self._stale_runs |= set(run_ids)
        asyncio.get_running_loop().call_later(self.run_lease, self._expire_stale_runs)

    def claim(self, run_id: str | None) -> bool:
        """Whether `run_id` was a stale run, now held by the client that named it."""
        if run_id is not None and run_id in self._stale_runs:
            self._stale_runs.discard(run_id)
            return True
        return False

    def _expire_stale_runs(self) -> None:
        stale, self._stale_runs = self._stale_runs, set()
        if stale:
            log.info("runs left open by a previous daemon and not claimed: interrupted %s",
                     sorted(stale))
            self._interrupt(stale)
