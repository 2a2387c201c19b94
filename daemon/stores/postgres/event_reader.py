"""Reading other daemons' events: which channels a daemon listens on, which rows of
`ctxd_events` it reads, and the thread that does both (see events.py for what a row is).

Channels. An event wakes only the daemons that need it:

- `ctxd_events` (SHARED) carries the events every daemon's bookkeeping needs whoever
  watches the session: a compaction's progress and its end (`note_event` in the store
  tells a status that another daemon compacts). Every daemon listens on it.
- `ctxd_s_<hash>` (one per session: the first 32 hex digits of the SHA-256 of the
  session id, so any id makes a valid identifier of bounded length) carries the session's
  other events (appends, runs, approvals, context edits). A daemon listens on it while
  one of its clients watches the session: LISTEN when the first subscribes, UNLISTEN
  when the last leaves (the event hub says when, `watch`).
- `ctxd_events_all` (ALL) carries those same events of every session, for a daemon with
  a client that watches every session (a ZeroMQ subscription to `session/`).

Two sessions whose ids hash alike share a channel: a wake-up too many, nothing lost,
since the rows read are chosen by session id.

Rows. A wake-up is never trusted (any role may NOTIFY); what it wakes is a read of the
table, which only ctxd's role writes. One statement returns the rows this daemon relays
(other daemons' rows of the sessions it watches, and the shared events) and, counted by
the server, which ids are missing: ids come from a sequence, so a row can commit after
one with a higher id. The reader keeps `top` (every id at or below it was looked at,
but the missing ones) and the missing ids with the moment each was first missed; a
missing id is asked for again on every read until it has been missing for GAP_SECONDS
(a rolled-back transaction leaves one for good). Rows of sessions nobody here watches
are never sent to the daemon, so they cost it nothing; a daemon woken by nothing reads
every IDLE_READ seconds to keep `top` near the end of the table.

A subscription made while a read was running would miss that read's rows of the
session (read under the set before it): the next pass reads them again for the new
session (`_catch_up`), from the horizon (every id below it seen) of the moment it was
made, so an event committed around the subscription may be told once though it was
committed just before it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import select
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from ctxd.daemon.stores.postgres.connection import connect

log = logging.getLogger("ctxd.pg.events")

# the channel every daemon listens on, for the events every daemon's bookkeeping needs
SHARED = "ctxd_events"
# every session's watcher events, for a daemon whose clients watch every session
ALL = "ctxd_events_all"
SESSION_CHANNEL_PREFIX = "ctxd_s_"
# the events told on SHARED only (note_event in the store keeps track of them)
SHARED_METHODS = ("$/progress", "context/didCompact", "context/compactionFailed")

# an id missing this long above the horizon is taken for a rolled-back transaction's
GAP_SECONDS = 10.0
# rows older than this are deleted (by every daemon, every PRUNE_EVERY seconds)
RETAIN_SECONDS = 600.0
PRUNE_EVERY = 60.0
# a daemon that nothing woke reads this often anyway, so its `top` stays near the end
IDLE_READ = 5.0
# rows looked at most per query (the rest on the next one)
READ_ROWS = 1000
# the listener's own bounds: its reads are short; NOTIFY wake-ups drained per pass
LISTENER_SETTINGS = "SELECT set_config('statement_timeout', '30000', false), " \
    "set_config('lock_timeout', '5000', false)"
DRAIN = 10_000


def session_channel(session_id: str) -> str:
    """The channel of a session's events: an identifier whatever the id holds."""
    return SESSION_CHANNEL_PREFIX + hashlib.sha256(session_id.encode()).hexdigest()[:32]


def _sql_list(values: tuple[str, ...]) -> str:
    return ", ".join("'" + v.replace("'", "''") + "'" for v in values)


# the same channel as session_channel, computed by the server from the row's session id
_SQL_SESSION_CHANNEL = (
    f"'{SESSION_CHANNEL_PREFIX}' || "
    "left(encode(sha256(convert_to(e.session_id, 'UTF8')), 'hex'), 32)"
)
# one event written and the daemons that need it woken, in one statement (and one round
# trip); the NOTIFY carries the row's id, which nobody trusts: it is read from the table
RECORD = (
    "WITH e AS (INSERT INTO ctxd_events(origin, session_id, body, created_at) "
    "VALUES (?, ?, ?, ?) RETURNING id, session_id, body::json->>'m' AS m) "
    "SELECT pg_notify(c, e.id::text) FROM e, unnest(CASE WHEN e.m IN ("
    + _sql_list(SHARED_METHODS) + f") THEN ARRAY['{SHARED}'] "
    f"ELSE ARRAY['{ALL}', {_SQL_SESSION_CHANNEL}] END) AS c"
)

# The rows to relay, then one row saying what was looked at: the highest id (`hi`), how
# many rows above `top` (`n`: READ_ROWS means read again) and the ids still missing.
READ = """
WITH fresh AS (
    (SELECT id, origin, session_id, body FROM ctxd_events WHERE id = ANY(%(missing)s))
    UNION ALL
    (SELECT id, origin, session_id, body FROM ctxd_events WHERE id > %(top)s
     ORDER BY id LIMIT %(rows)s)
), span AS (
    SELECT coalesce(max(id), %(top)s) AS hi, count(*) AS n FROM fresh WHERE id > %(top)s
)
SELECT id, body, NULL::bigint, NULL::bigint, NULL::bigint[] FROM fresh
 WHERE origin <> %(origin)s AND (%(everything)s OR session_id = ANY(%(sessions)s)
       OR (body::json->>'m') = ANY(%(shared)s))
UNION ALL
SELECT NULL, NULL, hi, n, ARRAY(
    SELECT g FROM (SELECT generate_series(%(top)s + 1, hi) UNION ALL
                   SELECT unnest(%(missing)s::bigint[])) AS m(g)
    WHERE NOT EXISTS (SELECT 1 FROM fresh WHERE fresh.id = m.g) ORDER BY g)
FROM span
"""

# rows of sessions just watched that a read running meanwhile passed over
CATCH_UP = """
SELECT id, body FROM ctxd_events
 WHERE id > %(since)s AND id <= %(top)s AND id <> ALL(%(missing)s) AND origin <> %(origin)s
   AND ((%(everything)s AND session_id <> ALL(%(before)s)) OR session_id = ANY(%(sessions)s))
   AND (body::json->>'m') <> ALL(%(shared)s)
 ORDER BY id
"""

OnEvent = Callable[[dict[str, Any]], None]
Parse = Callable[[str], "dict[str, Any] | None"]


class EventReader:
    """Which rows of `ctxd_events` this daemon has looked at, and which sessions' it
    reads (see the module docstring); kept across reconnects. Until told otherwise
    (`watch`), it reads every session's events."""

    def __init__(self, origin: str, parse: Parse) -> None:
        self.origin = origin
        self.parse = parse
        # every id at or below `horizon` looked at; above it up to `top`, all but `missing`
        self.horizon: int | None = None
        self.top: int | None = None
        self.missing: dict[int, float] = {}
        self.reads = 0
        self.read_at = 0.0
        self.pruned_at = 0.0
        # set while the listening connection is up (LISTEN done, the backlog read)
        self.listening = threading.Event()
        # what is read: every session's events, or those of `sessions` (as listened on)
        self.everything = True
        self.sessions: set[str] = set()
        # changes asked for (session, or None for every session) and not yet made: the
        # wanted state, the reads made and the horizon when it was asked
        self._lock = threading.Lock()
        self._changes: dict[str | None, tuple[bool, int, int | None]] = {}
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    # asked from the event loop

    def watch(self, session_id: str | None, watched: bool) -> None:
        """Read (or stop reading) the events of a session, or with None of every
        session; takes effect on the listening thread, which is woken for it."""
        log.debug("events of %s %s", session_id or "every session",
                  "read" if watched else "no longer read")
        with self._lock:
            self._changes[session_id] = (watched, self.reads, self.horizon)
        try:
            os.write(self._wake_w, b"w")
        except BlockingIOError:  # already woken: the pipe is full of wake-ups
            pass
        except OSError:  # closed: the store is closing
            pass

    # on the listening thread

    def start(self, conn: psycopg.Connection, on_event: OnEvent) -> None:
        """On a new connection: the starting point (once) and every LISTEN."""
        if self.top is None:
            row = conn.execute("SELECT coalesce(max(id), 0) FROM ctxd_events").fetchone()
            self.horizon = self.top = int(row[0])
        _, late = self._apply()
        channels = [SHARED]
        if self.everything:
            channels.append(ALL)
        channels += sorted({session_channel(s) for s in self.sessions})
        conn.execute("; ".join(f"LISTEN {c}" for c in channels))
        self._catch_up(conn, on_event, late)

    def changes(self, conn: psycopg.Connection, on_event: OnEvent) -> None:
        """Make the changes asked for: LISTEN, UNLISTEN, and read what a read running
        meanwhile passed over."""
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        statements, late = self._apply()
        if statements:
            log.debug("%s", "; ".join(statements))
            conn.execute("; ".join(statements))
        self._catch_up(conn, on_event, late)

    def _apply(self) -> tuple[list[str], tuple[int, bool, list[str], list[str]] | None]:
        """Take the changes asked for: the LISTEN and UNLISTEN statements they need, and
        what a read made since they were asked for ran past (see `_catch_up`)."""
        with self._lock:
            changes, self._changes = self._changes, {}
        was_everything, was_sessions = self.everything, set(self.sessions)
        statements: list[str] = []
        for sid, (watched, _, _) in changes.items():
            if sid is None:
                if watched != self.everything:
                    self.everything = watched
                    statements.append(f"{'LISTEN' if watched else 'UNLISTEN'} {ALL}")
            elif watched and sid not in self.sessions:
                self.sessions.add(sid)
                statements.append(f"LISTEN {session_channel(sid)}")
            elif not watched and sid in self.sessions:
                self.sessions.discard(sid)
                channel = session_channel(sid)
                if not any(session_channel(s) == channel for s in self.sessions):
                    statements.append(f"UNLISTEN {channel}")
        # newly read, and a read ran under the set before: its rows were passed over
        since: int | None = None
        everything, sessions = False, []
        for sid, (watched, reads_then, horizon_then) in changes.items():
            if not watched or reads_then == self.reads or was_everything:
                continue
            if sid is None and self.everything:
                everything = True
            elif sid is not None and sid in self.sessions and sid not in was_sessions:
                sessions.append(sid)
            else:
                continue
            lo = horizon_then or 0
            since = lo if since is None else min(since, lo)
        if since is None:
            return statements, None
        return statements, (since, everything, sorted(was_sessions), sessions)

    def _catch_up(self, conn: psycopg.Connection, on_event: OnEvent,
                  late: tuple[int, bool, list[str], list[str]] | None) -> None:
        """Relay the rows of sessions just watched (`late`: since which id, whether every
        session, the sessions read before, the sessions added) that a read passed over."""
        if late is None or self.top is None:
            return
        since, everything, before, added = late
        rows = conn.execute(CATCH_UP, {
            "since": since, "top": self.top, "missing": sorted(self.missing),
            "origin": self.origin, "everything": everything, "before": before,
            "sessions": added, "shared": list(SHARED_METHODS),
        }).fetchall()
        for _, body in rows:
            ref = self.parse(body)
            if ref is not None:
                on_event(ref)

    def read(self, conn: psycopg.Connection, on_event: OnEvent) -> None:
        """Hand every new row this daemon relays to `on_event`, in id order."""
        assert self.top is not None
        while True:
            rows = conn.execute(READ, {
                "missing": sorted(self.missing), "top": self.top, "rows": READ_ROWS,
                "origin": self.origin, "everything": self.everything,
                "sessions": sorted(self.sessions), "shared": list(SHARED_METHODS),
            }).fetchall()
            found: list[tuple[int, str]] = []
            hi, n, missing = self.top, 0, []
            for event_id, body, row_hi, row_n, row_missing in rows:
                if event_id is None:
                    hi, n, missing = int(row_hi), int(row_n), row_missing
                else:
                    found.append((event_id, body))
            self._advance(hi, missing)
            log.debug("read: %d rows up to %d (%d missing)", len(found), hi, len(missing))
            for _, body in sorted(found):
                ref = self.parse(body)
                if ref is not None:
                    on_event(ref)
            if n < READ_ROWS:
                return

    def _advance(self, hi: int, missing: list[int]) -> None:
        now = self.read_at = time.monotonic()
        self.reads += 1
        still = {i: self.missing.get(i, now) for i in missing}
        self.missing = {i: t for i, t in still.items() if now - t < GAP_SECONDS}
        self.top = max(hi, self.top or 0)
        self.horizon = min(self.missing) - 1 if self.missing else self.top

    def due(self) -> bool:
        """Whether to read without a wake-up: ids are missing, or it has been long."""
        return bool(self.missing) or time.monotonic() - self.read_at >= IDLE_READ

    def prune(self, conn: psycopg.Connection) -> None:
        now = time.monotonic()
        if now - self.pruned_at < PRUNE_EVERY:
            return
        self.pruned_at = now
        conn.execute(
            "DELETE FROM ctxd_events WHERE created_at < %s", (time.time() - RETAIN_SECONDS,)
        )

    @property
    def wake_fd(self) -> int:
        return self._wake_r

    def close(self) -> None:
        """Close the wake-up pipe (the listening thread has ended)."""
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass


def listen_forever(
    dsn: str, password: str | None, stop: threading.Event, on_event: OnEvent,
    reader: EventReader, own_pids: Callable[[], set[int]] = set,
) -> None:
    """Until `stop`, call `on_event(reference)` for every event of another daemon that
    `reader` reads; reconnects by itself when the server comes back, and survives
    anything a notification carries (its payload is never read). A notification sent
    by one of `own_pids()` (the server processes of this daemon's own connections, as
    the server reports the sender, not as the payload says) wakes nothing: this
    daemon's own events need no reading."""
    while not stop.is_set():
        try:
            with connect(dsn, password, autocommit=True) as conn:
                conn.execute(LISTENER_SETTINGS)
                reader.start(conn, on_event)
                reader.read(conn, on_event)  # what came while this was not listening
                reader.listening.set()
                # poll, not select: a daemon serving many clients has descriptors past
                # select's limit
                poller = select.poll()
                poller.register(conn.fileno(), select.POLLIN)
                poller.register(reader.wake_fd, select.POLLIN)
                while not stop.is_set():
                    ready = {fd for fd, _ in poller.poll(500)}
                    if reader.wake_fd in ready:
                        reader.changes(conn, on_event)
                    # wake-ups that came during a statement wait in psycopg's backlog
                    got = list(conn.notifies(timeout=0, stop_after=DRAIN))
                    mine = own_pids() if got else set()
                    woke = any(n.pid not in mine for n in got)
                    if woke or reader.due():
                        reader.read(conn, on_event)
                    reader.prune(conn)
        except psycopg.Error:
            reader.listening.clear()
            stop.wait(1.0)  # the server is away: try again shortly
        except Exception:
            # nothing may end this thread: a bug here would deafen the daemon until restart
            reader.listening.clear()
            log.exception("the events listener failed; listening again")
            stop.wait(1.0)
