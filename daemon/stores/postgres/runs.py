"""Runs on PostgreSQL: the shared SqlRuns (stores/sql/runs.py), each run recording the
daemon that serves it, so the other daemons can tell the runs of a daemon that is gone
from those of a live one.

A daemon is live while it holds the row lock on its own row of `ctxd_daemons` (schema
migration 6), through a transaction kept open on a connection of its own. A row lock,
not an advisory key: locking a row needs UPDATE rights on ctxd's table, so a role that
may only connect can neither keep a dead daemon's runs from being adopted nor make a
live daemon's runs look abandoned. A daemon that dies (even `kill -9`) loses its
connection, PostgreSQL ends the transaction and the lock with it, and the next look of
another daemon adopts its runs.
"""

from __future__ import annotations

import threading
import time
import uuid

import psycopg

from ctxd.daemon.stores.postgres.connection import PgConnection, _storage
from ctxd.daemon.stores.records import RunRecord
from ctxd.daemon.stores.sql.runs import SqlRuns, _run

REGISTER = (
    "INSERT INTO ctxd_daemons(daemon_id, started_at) VALUES (%s, %s) "
    "ON CONFLICT DO NOTHING"
)
# FOR UPDATE: the one row lock the probe's FOR KEY SHARE waits for (skips)
HOLD = "SELECT 1 FROM ctxd_daemons WHERE daemon_id = %s FOR UPDATE"
# the open runs of daemons that are gone (their row free, or none: a run copied in, or
# opened before runs named their daemon) and of no transaction now (SKIP LOCKED: a run
# being finished is left to its finisher; nothing here waits), taken over by this daemon
ADOPT = """
WITH free AS (SELECT daemon_id FROM ctxd_daemons FOR KEY SHARE SKIP LOCKED),
live AS (SELECT daemon_id FROM ctxd_daemons EXCEPT SELECT daemon_id FROM free),
orphaned AS (
    SELECT id FROM runs
    WHERE status = 'open' AND daemon_id IS DISTINCT FROM ?
      AND (daemon_id IS NULL OR daemon_id NOT IN (SELECT daemon_id FROM live))
    FOR UPDATE SKIP LOCKED
)
UPDATE runs SET daemon_id = ? FROM orphaned WHERE runs.id = orphaned.id
RETURNING runs.id
"""
# how long a daemon whose own row lock was lost (and taken back) adopts nothing, so the
# daemons that lost theirs with it (a server restart) take them back first; long enough
# for a daemon on a busy machine to reconnect
RETAKE_GRACE = 15.0
# the rows of daemons that are gone and serve no open run any more (not this daemon's:
# its own lock does not keep its own transaction out)
FORGET = """
DELETE FROM ctxd_daemons d
WHERE d.daemon_id <> ?
  AND d.daemon_id IN (SELECT daemon_id FROM ctxd_daemons FOR UPDATE SKIP LOCKED)
  AND NOT EXISTS (SELECT 1 FROM runs WHERE status = 'open' AND daemon_id = d.daemon_id)
"""


class DaemonPresence:
    """This daemon's row in `ctxd_daemons`, locked for as long as the daemon lives
    (taken lazily: a store that serves no run, `ctxd copy` say, takes none)."""

    def __init__(self, main: PgConnection) -> None:
        self.main = main
        self.daemon_id = uuid.uuid4().hex
        self._holder: psycopg.Connection | None = None
        self._ever_held = False
        # when the row was last taken back after the holding connection ended
        self.retaken_at = -RETAKE_GRACE
        # runs start on the sessions' worker threads and orphans are looked for on
        # another: one of them at a time makes or checks the holding connection
        self._lock = threading.Lock()

    def _connect(self) -> psycopg.Connection:
        return self.main.lock_holder()

    def hold(self, check: bool = False) -> str:
        """Hold the row; with `check`, ask the server whether the holding connection
        still lives (else the connection's own state is trusted). Says whether the row
        was "held" already, "taken" for the first time, or "retaken" after the holding
        connection ended (runs adopted by others meanwhile are theirs)."""
        c = self._holder
        if c is not None and not c.closed and not c.broken and not check:
            return "held"  # the common case, without waiting for the lock
        with self._lock:
            return self._hold(check)

    def _hold(self, check: bool) -> str:
        c = self._holder
        if c is not None and not c.closed and not c.broken:
            if not check:
                return "held"
            try:
                c.execute("SELECT 1")
                return "held"
            except psycopg.Error:
                c.close()
        retaken = "retaken" if self._ever_held else "taken"
        self._holder = None
        # (a server that is away: StorageError, and the next look tries again)
        c = self._connect() if c is None or c.closed or c.broken else c
        try:
            # the row committed first, so that every daemon sees it; then locked in a
            # transaction left open (the row may be forgotten between the two by a
            # daemon taking it for a dead one's: written again then)
            for _ in range(3):
                c.execute(REGISTER, (self.daemon_id, time.time()))
                c.commit()
                if c.execute(HOLD, (self.daemon_id,)).fetchone() is not None:
                    self._holder = c
                    if self._ever_held:
                        self.retaken_at = time.monotonic()
                    self._ever_held = True
                    return retaken
                c.rollback()
        except psycopg.Error as exc:
            c.close()
            raise _storage(exc) from None
        c.close()
        raise _storage(RuntimeError("this daemon's row in ctxd_daemons kept disappearing"))

    def close(self) -> None:
        if self._holder is not None:
            self._holder.close()
            self._holder = None


class PgRuns(SqlRuns):
    """Runs, each open one naming the daemon serving it (the one that opened it, or the
    one that adopted it once that daemon was gone)."""

    conn: PgConnection

    def __init__(self, conn: PgConnection) -> None:
        super().__init__(conn)
        self.presence = DaemonPresence(conn)

    @property
    def daemon_id(self) -> str:
        return self.presence.daemon_id

    def start(self, run_id: str, session_id: str) -> RunRecord:
        self.presence.hold()
        now = time.time()
        self.conn.execute(
            "INSERT INTO runs(id, session_id, status, started_at, daemon_id) "
            "VALUES (?, ?, 'open', ?, ?)",
            (run_id, session_id, now, self.daemon_id),
        )
        return _run((run_id, session_id, "open", now, None))

    def adopt_orphans(self) -> set[str]:
        """Open runs no live daemon serves, now served by this one (to lease them out)."""
        # this daemon's own row first (taken again after a lost connection), so that the
        # look below never counts this daemon gone
        got = self.presence.hold(check=True)
        if got == "retaken" or time.monotonic() < self.presence.retaken_at + RETAKE_GRACE:
            # this daemon's connection ended, so did the others' if the server restarted:
            # they get until this daemon's next look, and RETAKE_GRACE seconds at least,
            # to take their rows back (they look as often), and keep their runs
            return set()
        adopted = {r[0] for r in self.conn.execute(ADOPT, (self.daemon_id, self.daemon_id))}
        if adopted or got == "taken":
            self.conn.execute(FORGET, (self.daemon_id,))
        return adopted

    def close(self) -> None:
        self.presence.close()
