"""Runs on PostgreSQL: the embedded store's RunStore, plus a session-level advisory lock
on each open run the daemon serves, so the other daemons can tell the runs of a daemon
that is gone (their lock is free) from those of a live one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg

from ctxd.daemon.runs import RunStore

if TYPE_CHECKING:
    from ctxd.daemon.pg.connection import PgConnection

# the class of the session-level advisory locks a daemon holds on each open run it
# serves ("ctxr"): a run whose lock is free was opened through a daemon that is gone
RUN_LOCK = 0x63747872


class PgRuns(RunStore):
    """Runs, each open one held by a session-level advisory lock of the daemon serving it
    (released when the run finishes, or by PostgreSQL when that daemon's connection
    ends)."""

    conn: PgConnection  # type: ignore[assignment]

    def __init__(self, conn: PgConnection) -> None:
        super().__init__(conn)  # type: ignore[arg-type]
        self.owned: set[str] = set()
        conn.on_connect.append(self._relock)

    def _relock(self, raw: psycopg.Connection) -> None:
        # a new connection holds none of the old one's locks: take back those still free
        for rid in list(self.owned):
            got = raw.execute(
                "SELECT pg_try_advisory_lock(%s, hashtext(%s))", (RUN_LOCK, rid)
            ).fetchone()
            if not got or not got[0]:
                self.owned.discard(rid)  # another daemon adopted it meanwhile

    def _lock(self, run_id: str) -> bool:
        got = self.conn.execute(
            "SELECT pg_try_advisory_lock(?, hashtext(?))", (RUN_LOCK, run_id)
        ).fetchone()[0]
        if got:
            self.owned.add(run_id)
        return bool(got)

    def start(self, run_id: str, session_id: str) -> dict[str, Any]:
        run = super().start(run_id, session_id)
        self._lock(run_id)
        return run

    def finish(self, run_id: str, status: str) -> dict[str, Any]:
        run = super().finish(run_id, status)
        if run_id in self.owned:
            self.owned.discard(run_id)
            self.conn.execute("SELECT pg_advisory_unlock(?, hashtext(?))", (RUN_LOCK, run_id))
        return run

    def adopt_orphans(self) -> set[str]:
        """Open runs no live daemon holds, now held by this one (to lease them out)."""
        return {rid for rid in self.open_run_ids() - self.owned if self._lock(rid)}
