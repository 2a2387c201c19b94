"""Each session's open run and pending approvals, kept between requests.

An append asks whether its run is the session's open one and which tool calls await
approval; a status asks for the open run and how many approvals are pending. The engine
is the only writer of runs and approvals, so it tells this book what it committed and
the book answers from memory after one read per session. A store other daemons write
too (`shared`, PostgreSQL) is asked every time instead. Records are immutable: the book
hands out the ones it keeps.
"""

from __future__ import annotations

from ctxd.daemon.stores.base import RunStore
from ctxd.daemon.stores.records import ApprovalRecord, RunRecord


class RunBook:
    def __init__(self, runs: RunStore, *, shared: bool) -> None:
        self.runs = runs
        self.shared = shared
        # per session: its open run (None: none), and its pending approvals by tool call
        # id, oldest first; a session not in a map is read from the store when asked
        self._open: dict[str, RunRecord | None] = {}
        self._pending: dict[str, dict[str, ApprovalRecord]] = {}
        # the session of each open run in `_open`
        self._sessions: dict[str, str] = {}

    def _open_run(self, session_id: str) -> RunRecord | None:
        if session_id not in self._open:
            run = self._open[session_id] = self.runs.open_run(session_id)
            if run is not None:
                self._sessions[run.id] = session_id
        return self._open[session_id]

    def open_run(self, session_id: str) -> RunRecord | None:
        """The session's open run, or None."""
        if self.shared:
            return self.runs.open_run(session_id)
        return self._open_run(session_id)

    def open_run_id(self, session_id: str) -> str | None:
        run = self.runs.open_run(session_id) if self.shared else self._open_run(session_id)
        return run.id if run is not None else None

    def get(self, run_id: str) -> RunRecord | None:
        """The run `run_id`: from memory when it is a known open run."""
        if not self.shared:
            sid = self._sessions.get(run_id)
            run = self._open.get(sid) if sid is not None else None
            if run is not None and run.id == run_id:
                return run
        return self.runs.get(run_id)

    def pending(self, session_id: str) -> dict[str, ApprovalRecord]:
        """The session's pending approvals by tool call id, oldest first. Read-only."""
        if self.shared:
            return {a.tool_call_id: a for a in self.runs.list_approvals(session_id, "pending")}
        found = self._pending.get(session_id)
        if found is None:
            found = self._pending[session_id] = {
                a.tool_call_id: a for a in self.runs.list_approvals(session_id, "pending")
            }
        return found

    def pending_count(self, session_id: str) -> int:
        if self.shared:
            return self.runs.pending_count(session_id)
        return len(self.pending(session_id))

    # what the engine committed

    def created(self, session_id: str) -> None:
        """A new session: no run, no approval."""
        if not self.shared:
            self._open[session_id] = None
            self._pending[session_id] = {}

    def started(self, run: RunRecord) -> None:
        if not self.shared:
            self._open[run.session_id] = run
            self._sessions[run.id] = run.session_id

    def finished(self, run: RunRecord) -> None:
        # a session has at most one open run: once it is finished, none is
        if not self.shared:
            self._open[run.session_id] = None
            self._sessions.pop(run.id, None)

    def requested(self, approval: ApprovalRecord) -> None:
        found = None if self.shared else self._pending.get(approval.session_id)
        if found is not None:
            found[approval.tool_call_id] = approval

    def resolved(self, approval: ApprovalRecord) -> None:
        found = None if self.shared else self._pending.get(approval.session_id)
        if found is not None:
            found.pop(approval.tool_call_id, None)
