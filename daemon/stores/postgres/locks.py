"""One compactor per session across daemons: a row lock on the session's row in
`compaction_locks` (schema migration 5), held by an open transaction on a connection of
its own for as long as the daemon compacts.

A row lock, not an advisory key: locking a row needs UPDATE rights on ctxd's table, so a
role that may only connect cannot hold the lock to stop every compaction. A daemon that
dies (even `kill -9`) loses its connection, and PostgreSQL ends its transaction and the
lock with it, so another daemon's next compaction goes ahead at once.
"""

from __future__ import annotations

import logging

import psycopg
from psycopg import errors as pgerr

from ctxd.daemon.stores.postgres.connection import PgConnection, _storage

log = logging.getLogger("ctxd.pg.locks")

TAKE = "SELECT 1 FROM compaction_locks WHERE session_id = %s FOR UPDATE NOWAIT"
CREATE = "INSERT INTO compaction_locks(session_id) VALUES (?) ON CONFLICT DO NOTHING"
# whether another connection holds it: the weakest row lock, skipped where one is held
# (taken and let go in the same statement)
HELD = (
    "SELECT EXISTS (SELECT 1 FROM compaction_locks WHERE session_id = ?) AND NOT EXISTS "
    "(SELECT 1 FROM compaction_locks WHERE session_id = ? FOR KEY SHARE SKIP LOCKED)"
)
# idle holder connections kept for the next compaction
KEEP_IDLE = 2


class CompactionLocks:
    def __init__(self, main: PgConnection) -> None:
        self.main = main
        # session -> (its holder connection, times taken by this daemon): taken again by
        # the daemon that holds it, as the advisory lock it replaces was
        self._held: dict[str, tuple[psycopg.Connection, int]] = {}
        self._idle: list[psycopg.Connection] = []

    def _holder(self, fresh: bool = False) -> psycopg.Connection:
        while self._idle and not fresh:
            c = self._idle.pop()
            if not c.closed and not c.broken:
                return c
        # held while the summarizer works: the server must not end it for being idle
        return self.main.lock_holder()

    def try_lock(self, session_id: str) -> bool:
        """Whether this daemon may compact the session now (no other daemon does)."""
        held = self._held.get(session_id)
        if held is not None:
            self._held[session_id] = (held[0], held[1] + 1)
            return True
        # the session's row, through the daemon's own connection: a server that is gone
        # fails the attempt here (StorageError) as it fails every other request
        self.main.execute(CREATE, (session_id,))
        c = self._holder()
        try:
            try:
                got = c.execute(TAKE, (session_id,)).fetchone()
            except psycopg.OperationalError:
                if not c.broken and not c.closed:
                    raise
                # a kept connection the server dropped (a restart): a new one, once
                c.close()
                c = self._holder(fresh=True)
                got = c.execute(TAKE, (session_id,)).fetchone()
        except pgerr.LockNotAvailable:
            c.rollback()
            self._idle.append(c)
            return False
        except psycopg.Error as exc:
            c.close()
            raise _storage(exc) from None
        if got is None:  # cannot happen: the row was just committed
            c.rollback()
            self._idle.append(c)
            return False
        self._held[session_id] = (c, 1)
        return True

    def release(self, session_id: str) -> None:
        held = self._held.get(session_id)
        if held is None:
            return
        c, times = held
        if times > 1:
            self._held[session_id] = (c, times - 1)
            return
        del self._held[session_id]
        try:
            c.rollback()
        except psycopg.Error:
            c.close()  # the connection is gone, and the lock with it
            return
        if len(self._idle) < KEEP_IDLE:
            self._idle.append(c)
        else:
            c.close()

    def held_elsewhere(self, session_id: str) -> bool:
        """Whether a connection holds the session's lock (this daemon's own as well)."""
        return bool(self.main.execute(HELD, (session_id, session_id)).fetchone()[0])

    def close(self) -> None:
        for c, _ in self._held.values():
            c.close()
        self._held.clear()
        for c in self._idle:
            c.close()
        self._idle.clear()
