"""The engine's runs and tool approvals: starting and finishing runs, asking for and
deciding approvals, each committed and then told to the engine's `RunBook` and to
event listeners. A part of `Engine` (daemon/engine/core.py), which provides what is declared
below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from ctxd.daemon.approval_events import event_approval
from ctxd.daemon.compaction.compactor import RunActivity
from ctxd.daemon.engine.run_book import RunBook
from ctxd.daemon.ids import new_id
from ctxd.daemon.stores.base import ArchiveStore, RunStore, Store
from ctxd.daemon.stores.records import ApprovalRecord, RunRecord
from ctxd.daemon.stores.sql.runs import RUN_OUTCOMES
from ctxd.daemon.views import approval_struct, run_struct
from ctxd.protocol.errors import Conflict, InvalidParams, NotFound, RunActive
from ctxd.protocol.handlers import serves
from ctxd.protocol.methods import APPROVAL_LIST
from ctxd.protocol.types import (
    AppendResult,
    Approval,
    ApprovalEvent,
    Run,
    RunDidFinish,
    RunDidStart,
    RunFinishResult,
)


class RunsAndApprovals:
    store: Store
    archive: ArchiveStore
    runs: RunStore
    run_book: RunBook

    if TYPE_CHECKING:  # provided by Engine

        def check_session(self, session_id: str) -> None: ...

        def emit(self, session_id: str, method: str, params: msgspec.Struct) -> None: ...

        def append(
            self,
            session_id: str,
            messages: list[Any],
            *,
            run_id: str | None = None,
            client_batch_id: str | None = None,
            run: RunRecord | None = None,
        ) -> AppendResult: ...

        def auto_compaction_due(
            self, session_id: str, status: RunActivity | None = None
        ) -> bool: ...

    def start_run(self, session_id: str) -> Run:
        self.check_session(session_id)
        with self.store.transaction(session_id):
            current = self.run_book.open_run(session_id)
            if current is not None:
                raise RunActive(
                    f"run {current.id} is still open in this session; finish it with "
                    "run/finish first",
                    {"runId": current.id},
                )
            record = self.runs.start(new_id("run"), session_id)
        self.run_book.started(record)
        run = run_struct(record)
        self.emit(session_id, "run/didStart",
                  RunDidStart(session_id=session_id, run_id=run.run_id, run=run))
        return run

    def finish_run(
        self,
        run_id: str,
        outcome: str,
        *,
        messages: list[Any] | None = None,
        client_batch_id: str | None = None,
    ) -> RunFinishResult:
        """Close a run; returns the run and whether auto-compaction is now due. With
        `messages`, the run's last messages are appended in it first (their result is
        `append`); when they are refused, the run stays open."""
        if outcome not in RUN_OUTCOMES + ("interrupted",):
            raise InvalidParams(f"outcome must be one of {', '.join(RUN_OUTCOMES)}")
        run = self.run_book.get(run_id)
        if run is None:
            raise NotFound(
                f"no run {run_id!r}; run/start returns the id to finish", {"runId": run_id}
            )
        if run.status != "open":
            raise Conflict(
                f"run {run_id!r} is already {run.status}",
                {"runId": run_id, "status": run.status},
            )
        appended = None
        if messages is not None:
            appended = self.append(
                run.session_id, messages, run_id=run_id, client_batch_id=client_batch_id, run=run
            )
        with self.store.transaction():
            run = self.runs.finish(run_id, outcome)
        self.run_book.finished(run)
        sid = run.session_id
        due = outcome == "completed" and self.auto_compaction_due(sid)
        finished = run_struct(run)
        self.emit(sid, "run/didFinish",
                  RunDidFinish(session_id=sid, run=finished, auto_compaction_scheduled=due))
        result = RunFinishResult(run=finished, auto_compaction_scheduled=due)
        if appended is not None:
            result.append = appended
        return result

    def request_approval(
        self,
        session_id: str,
        run_id: str,
        tool_call_id: str,
        tool_name: str | None = None,
        arguments: Any = None,
    ) -> Approval:
        self.check_session(session_id)
        run = self.run_book.get(run_id)
        if run is None or run.session_id != session_id:
            raise NotFound(f"no run {run_id!r} in session {session_id!r}", {"runId": run_id})
        if run.status != "open":
            raise InvalidParams(f"run {run_id!r} is {run.status}; approvals need an open run")
        if not self.archive.existing_tool_calls(session_id, [tool_call_id]):
            raise NotFound(
                f"no tool call {tool_call_id!r} in session {session_id!r}; append "
                "the assistant message with that call first",
                {"toolCallId": tool_call_id},
            )
        if self.archive.answered_tool_calls(session_id, [tool_call_id]):
            raise Conflict(f"tool call {tool_call_id!r} already has a result")
        waiting = self.run_book.pending(session_id).get(tool_call_id)
        if waiting is not None:
            raise Conflict(
                f"tool call {tool_call_id!r} already awaits approval {waiting.id}",
                {"approvalId": waiting.id},
            )
        with self.store.transaction(session_id):
            record = self.runs.request_approval(
                new_id("apr"), session_id, run_id, tool_call_id, tool_name, arguments
            )
        self.run_book.requested(record)
        approval = approval_struct(record)
        self.emit(
            session_id,
            "approval/didRequest",
            ApprovalEvent(session_id=session_id, approval=event_approval(approval)),
        )
        return approval

    def resolve_approval(
        self, approval_id: str, decision: str, reason: str | None = None
    ) -> Approval:
        if decision not in ("approved", "denied"):
            raise InvalidParams("decision must be 'approved' or 'denied'")
        # its session first (outside), to lock that session: two answers given at once,
        # through two daemons, are checked one after the other
        found = self.runs.get_approval(approval_id)
        with self.store.transaction(found.session_id if found else None):
            approval = self.runs.get_approval(approval_id)
            if approval is None:
                raise NotFound(
                    f"no approval {approval_id!r}; approval/list shows them",
                    {"approvalId": approval_id},
                )
            if approval.status != "pending":
                raise Conflict(
                    f"approval {approval_id!r} was already {approval.status}; the first "
                    "decision stands",
                    {"approvalId": approval_id, "status": approval.status},
                )
            record = self.runs.resolve_approval(approval_id, decision, reason)
        self.run_book.resolved(record)
        sid = record.session_id
        resolved = approval_struct(record)
        self.emit(sid, "approval/didResolve",
                  ApprovalEvent(session_id=sid, approval=event_approval(resolved)))
        return resolved

    @serves(APPROVAL_LIST)
    def list_approvals(self, session_id: str, status: str | None = None) -> list[Approval]:
        self.check_session(session_id)
        return [approval_struct(a) for a in self.runs.list_approvals(session_id, status)]

    def pending_approvals(self, session_id: str) -> list[ApprovalRecord]:
        """The session's pending approvals, oldest first."""
        return list(self.run_book.pending(session_id).values())

    def interrupt_runs(self, run_ids: set[str]) -> None:
        """Runs whose client went away without run/finish."""
        for rid in run_ids:
            run = self.runs.get(rid)
            if run and run.status == "open":
                self.finish_run(rid, "interrupted")

    def _check_run(
        self, session_id: str, run_id: str, run: RunRecord | None
    ) -> None:
        """The run an append names must be the session's, and open."""
        if run is None or run.id != run_id:
            run = self.run_book.get(run_id)
        if run is None or run.session_id != session_id:
            raise NotFound(
                f"no run {run_id!r} in session {session_id!r}; start one with run/start",
                {"runId": run_id},
            )
        if run.status != "open":
            raise InvalidParams(
                f"run {run_id!r} is {run.status}; start a new run", {"runId": run_id}
            )

