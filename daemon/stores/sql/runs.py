"""SqlRuns: runs and tool approvals, stored with the session so they outlive the daemon;
the statements both stores run (PostgreSQL adds the daemon serving each run)."""

from __future__ import annotations

import json
import time
from typing import Any

from ctxd.daemon.stores.records import ApprovalRecord, RunRecord
from ctxd.daemon.stores.sql import SqlConnection
from ctxd.daemon.stores.sql.archive import strict_json

RUN_OUTCOMES = ("completed", "failed", "cancelled")


def _run(row: Any) -> RunRecord:
    rid, sid, status, started, finished = row
    return RunRecord(rid, sid, status, started, finished)


def _approval(row: Any) -> ApprovalRecord:
    (aid, sid, run_id, tcid, tool_name, arguments, status, reason, created, resolved) = row
    return ApprovalRecord(
        aid,
        sid,
        run_id,
        tcid,
        tool_name,
        json.loads(arguments) if arguments else None,
        status,
        reason,
        created,
        resolved,
    )


_RUN_COLS = "id, session_id, status, started_at, finished_at"
_APPROVAL_COLS = (
    "id, session_id, run_id, tool_call_id, tool_name, arguments, status, reason, "
    "created_at, resolved_at"
)


class SqlRuns:
    def __init__(self, conn: SqlConnection) -> None:
        self.conn = conn

    def start(self, run_id: str, session_id: str) -> RunRecord:
        now = time.time()
        self.conn.execute(
            "INSERT INTO runs(id, session_id, status, started_at) VALUES (?, ?, 'open', ?)",
            (run_id, session_id, now),
        )
        return _run((run_id, session_id, "open", now, None))

    def get(self, run_id: str) -> RunRecord | None:
        row = self.conn.execute(f"SELECT {_RUN_COLS} FROM runs WHERE id = ?", (run_id,)).fetchone()
        return _run(row) if row else None

    def open_run(self, session_id: str) -> RunRecord | None:
        row = self.conn.execute(
            f"SELECT {_RUN_COLS} FROM runs WHERE session_id = ? AND status = 'open'", (session_id,)
        ).fetchone()
        return _run(row) if row else None

    def open_run_ids(self) -> set[str]:
        return {r[0] for r in self.conn.execute("SELECT id FROM runs WHERE status = 'open'")}

    def finish(self, run_id: str, status: str) -> RunRecord:
        # (an UPDATE ... RETURNING costs SQLite more than this UPDATE and SELECT by key)
        self.conn.execute(
            "UPDATE runs SET status = ?, finished_at = ? WHERE id = ?",
            (status, time.time(), run_id),
        )
        return self.get(run_id)  # type: ignore[return-value]

    # approvals

    def request_approval(
        self,
        approval_id: str,
        session_id: str,
        run_id: str,
        tool_call_id: str,
        tool_name: str | None,
        arguments: Any,
    ) -> ApprovalRecord:
        self.conn.execute(
            "INSERT INTO approvals(id, session_id, run_id, tool_call_id, tool_name, arguments, "
            "status, created_at) VALUES (?,?,?,?,?,?, 'pending', ?)",
            (
                approval_id,
                session_id,
                run_id,
                tool_call_id,
                tool_name,
                None if arguments is None else strict_json(arguments, "arguments"),
                time.time(),
            ),
        )
        return self.get_approval(approval_id)  # type: ignore[return-value]

    def get_approval(self, approval_id: str) -> ApprovalRecord | None:
        row = self.conn.execute(
            f"SELECT {_APPROVAL_COLS} FROM approvals WHERE id = ?", (approval_id,)
        ).fetchone()
        return _approval(row) if row else None

    def resolve_approval(
        self, approval_id: str, decision: str, reason: str | None
    ) -> ApprovalRecord:
        self.conn.execute(
            "UPDATE approvals SET status = ?, reason = ?, resolved_at = ? WHERE id = ?",
            (decision, reason, time.time(), approval_id),
        )
        return self.get_approval(approval_id)  # type: ignore[return-value]

    def list_approvals(self, session_id: str, status: str | None = None) -> list[ApprovalRecord]:
        if status is None:
            rows = self.conn.execute(
                f"SELECT {_APPROVAL_COLS} FROM approvals WHERE session_id = ? ORDER BY created_at",
                (session_id,),
            )
        else:
            rows = self.conn.execute(
                f"SELECT {_APPROVAL_COLS} FROM approvals WHERE session_id = ? AND status = ? "
                "ORDER BY created_at",
                (session_id, status),
            )
        return [_approval(r) for r in rows]

    def pending_count(self, session_id: str) -> int:
        return int(
            self.conn.execute(
                "SELECT count(*) FROM approvals WHERE session_id = ? AND status = 'pending'",
                (session_id,),
            ).fetchone()[0]
        )
