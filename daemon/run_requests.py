"""The dispatcher's handlers of runs and approvals (`run/start`, `run/finish`,
`approval/request`, `approval/resolve`): each connection's open runs, the runs and
approvals whose session this daemon knows (to serve them on that session's worker
thread on a shared store, daemon/off_loop.py), and what the scheduler is told once each
is done. A part of `Dispatcher` (daemon/dispatch.py), which provides what is declared
below.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from ctxd.daemon.context_reply import ContextReplies
from ctxd.daemon.engine import Engine
from ctxd.daemon.off_loop import OffLoop
from ctxd.daemon.scheduler import Scheduler
from ctxd.daemon.servers.base import Connection
from ctxd.protocol import types
from ctxd.protocol.handlers import serves
from ctxd.protocol.methods import APPROVAL_REQUEST, APPROVAL_RESOLVE, RUN_FINISH, RUN_START
from ctxd.protocol.table_runs import (
    ApprovalRequestParams,
    ApprovalResolveParams,
    RunFinishParams,
    RunStartParams,
)


class RunRequests:
    engine: Engine
    replies: ContextReplies
    scheduler: Scheduler
    off_loop: OffLoop
    _live: set[Connection]

    if TYPE_CHECKING:  # provided by Dispatcher

        def _claim(self, conn: Connection, run_id: str | None) -> None: ...

        def _with_context(
            self, result: types.AppendResult | types.RunFinishResult, session_id: str,
            appended: types.AppendResult | None, gated: bool,
            status: types.Status | None = None,
        ) -> Any: ...

    @serves(RUN_START, connection=True)
    def run_start(self, conn: Connection, p: RunStartParams) -> Any:
        sid = p.session_id
        if self.off_loop.wants("run/start"):
            return self.off_loop.run(conn, sid, lambda: self.scheduler.start_run(sid, self._held),
                                     lambda run: self._run_started(conn, run))
        return self._run_started(conn, self.scheduler.start_run(sid, self._held))

    def _run_started(self, conn: Connection, run: types.Run) -> types.RunStartResult:
        # interrupted when the connection closes; on ZeroMQ, which never says so, when the
        # client stays silent past its lease (see ZmqServer)
        conn.open_runs.add(run.run_id)
        self.off_loop.learn(run.run_id, run.session_id)
        if conn.closed:  # it closed while the run started beside the loop
            self.scheduler.client_gone({run.run_id})
        return types.RunStartResult(run_id=run.run_id, run=run)

    def _held(self, run_id: str) -> bool:
        # a copy: asked from a worker thread too, while the loop adds connections
        return any(run_id in c.open_runs for c in list(self._live))

    @serves(RUN_FINISH, connection=True)
    def run_finish(self, conn: Connection, p: RunFinishParams) -> Any:
        def finish() -> types.RunFinishResult:
            return self.engine.finish_run(
                p.run_id, p.outcome, messages=p.messages, client_batch_id=p.client_batch_id
            )

        if not self.off_loop.wants("run/finish"):
            return self._run_finished(conn, p, finish())

        def finish_with_context() -> types.RunFinishResult:
            result = finish()
            if p.return_context:  # read on the same worker thread, as an append's
                self._with_context(result, result.run.session_id, _appended(result), False)
            return result

        sid = self.off_loop.session_of("run/finish", p.run_id)
        return self.off_loop.run(conn, sid, finish_with_context,
                                 lambda result: self._run_done(conn, p.run_id, result),
                                 find=None if sid else lambda: self._session_of_run(p.run_id))

    def _session_of_run(self, run_id: str) -> str | None:
        run = self.engine.runs.get(run_id)
        return run.session_id if run is not None else None

    def _run_finished(
        self, conn: Connection, p: Any, result: types.RunFinishResult, gated: bool = False
    ) -> Any:
        """The finish's result; with `returnContext`, with the context (see
        `_appended`)."""
        if p.return_context:
            result = self._with_context(result, result.run.session_id, _appended(result), gated)
            if inspect.isawaitable(result):
                return self._finished_later(conn, p, result)
        return self._run_done(conn, p.run_id, result)

    async def _finished_later(self, conn: Connection, p: Any, result: Any
                              ) -> types.RunFinishResult:
        return self._run_done(conn, p.run_id, await result)

    def _run_done(self, conn: Connection, run_id: str, result: types.RunFinishResult
                  ) -> types.RunFinishResult:
        """The connection holds the run no more; the scheduler is told (on the loop)."""
        conn.open_runs.discard(run_id)
        return self.scheduler.after_run_finished(result)

    @serves(APPROVAL_RESOLVE, connection=True)
    def approval_resolve(self, conn: Connection, p: ApprovalResolveParams) -> Any:
        def resolve() -> types.Approval:
            return self.engine.resolve_approval(p.approval_id, p.decision, p.reason)

        if not self.off_loop.wants("approval/resolve"):
            return self._approval_resolved(resolve())

        def resolve_beside() -> tuple[types.Approval, bool]:
            # whether a held-back compaction is due now, asked here: the session's
            # context may not be kept by this daemon
            approval = resolve()
            return approval, self.engine.auto_compaction_due(approval.session_id)

        def resolved(done: tuple[types.Approval, bool]) -> types.Approval:
            return self._approval_resolved(*done)

        sid = self.off_loop.session_of("approval/resolve", p.approval_id)
        return self.off_loop.run(conn, sid, resolve_beside, resolved,
                                 find=None if sid else lambda: self._session_of_approval(
                                     p.approval_id))

    def _session_of_approval(self, approval_id: str) -> str | None:
        approval = self.engine.runs.get_approval(approval_id)
        return approval.session_id if approval is not None else None

    def _approval_resolved(self, approval: types.Approval, due: bool | None = None
                           ) -> types.Approval:
        self.scheduler.after_approval_resolved(approval, due)
        return approval

    @serves(APPROVAL_REQUEST, connection=True)
    def approval_request(self, conn: Connection, p: ApprovalRequestParams) -> Any:
        self._claim(conn, p.run_id)

        def request() -> types.Approval:
            return self.engine.request_approval(
                p.session_id, p.run_id, p.tool_call_id, p.tool_name, p.arguments
            )

        if self.off_loop.wants("approval/request"):
            return self.off_loop.run(conn, p.session_id, request, self._approval_requested)
        return self._approval_requested(request())

    def _approval_requested(self, approval: types.Approval) -> types.ApprovalRequestResult:
        self.off_loop.learn(approval.approval_id, approval.session_id)
        return types.ApprovalRequestResult(approval_id=approval.approval_id, approval=approval)


def _appended(result: types.RunFinishResult) -> types.AppendResult | None:
    """The batch a finish appended, if it appended one."""
    return result.append if isinstance(result.append, types.AppendResult) else None
