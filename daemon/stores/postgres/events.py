"""Events across daemons: a change made through another daemon, told to this one's
subscribers.

Every event a daemon emits is also written as a row of `ctxd_events` (schema migration
5), as a reference: the event's method, its session, the ids of the rows it is about
(batch, run, approval) and the few small values the database does not hold (a
compaction's result numbers, a progress step). The same statement sends a NOTIFY on the
events channel, which is only a wake-up: any role that may connect can send one, so its
payload is never read. A woken daemon reads the rows it has not seen from `ctxd_events`,
which only ctxd's role can write, and computes the session's status itself, so its
subscribers get the same params as the sending daemon's own subscribers, as of the
moment the event is relayed. A `session/didAppend` is written inside the append's own
transaction (stores/postgres/store.py); the other events are written when the daemon that made
the change tells its own subscribers, right after its commit.

Rows are read by id; ids come from a sequence, so a row can commit after one with a
higher id. The reader keeps a horizon (every id at or below it handled) and the ids seen
above it; an id missing above the horizon is looked for again until it has been missing
for GAP_SECONDS (a transaction that rolled back leaves one for good). The listening
thread reconnects by itself, reads what it missed when it is back (rows are kept
RETAIN_SECONDS), and is started again if it ever ends (`ListenerWatch`).

Reading the rows costs statements, and every daemon receives every event: a daemon
reads only for the sessions one of its clients watches (`watched`, asked of the event
hub, which knows the subscriptions of every wire). The bookkeeping that must see every
event (another daemon's compactions, `note_event`) still does.

References stay small: ids, not rows, and long texts (an error message) are cut.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import psycopg

from ctxd.daemon.approval_events import event_approval
from ctxd.daemon.stores.postgres.connection import connect
from ctxd.daemon.views import approval_struct, run_struct
from ctxd.protocol.types import ApprovalEvent, RunDidFinish, RunDidStart

log = logging.getLogger("ctxd.pg.events")

# the channel the wake-ups go on
CHANNEL = "ctxd_events"
# one event written and the listeners woken, in one statement (and one round trip); the
# NOTIFY carries the row's id, which nobody trusts: it is read from the table
RECORD = (
    "WITH e AS (INSERT INTO ctxd_events(origin, session_id, body, created_at) "
    "VALUES (?, ?, ?, ?) RETURNING id) SELECT pg_notify('" + CHANNEL + "', id::text) FROM e"
)
# the longest a reference may be (it was PostgreSQL's NOTIFY payload limit, 8000 bytes)
NOTIFY_LIMIT = 7900
# strings longer than this are cut when a reference would not fit the limit
CUT_CHARS = 1000
# a pop's message ids beyond this many are sent as their range
MAX_IDS = 400

# other daemons' events this one read nothing for (said in its debug log)
_unwatched = itertools.count(1)


def reference(origin: str, session_id: str, method: str, params: dict[str, Any]) -> str | None:
    """The NOTIFY payload for an event, or None when none is sent for it here."""
    if method == "session/didAppend":
        return None  # sent by the append's own transaction
    ref: dict[str, Any] = {"m": method, "s": session_id, "o": origin}
    if method == "run/didStart":
        ref["r"] = params["runId"]
    elif method == "run/didFinish":
        ref["r"] = params["run"]["runId"]
        ref["a"] = bool(params.get("autoCompactionScheduled"))
    elif method in ("approval/didRequest", "approval/didResolve"):
        ref["p"] = params["approval"]["approvalId"]
    else:
        # small values of their own (compaction results, progress, a context edit)
        inline = {k: v for k, v in params.items() if k not in ("sessionId", "status")}
        ids = inline.get("messageIds")
        if isinstance(ids, list) and len(ids) > MAX_IDS:
            inline["messageIds"] = {"lo": min(ids), "hi": max(ids)}
        ref["v"] = inline
        if "status" in params:
            ref["st"] = 1
    text = json.dumps(ref, ensure_ascii=False)
    if len(text.encode()) >= NOTIFY_LIMIT:
        text = json.dumps(_cut(ref), ensure_ascii=False)
        if len(text.encode()) >= NOTIFY_LIMIT:
            log.warning("%s of %s too large to tell other daemons", method, session_id)
            return None
    return text


def _cut(value: Any) -> Any:
    if isinstance(value, str) and len(value) > CUT_CHARS:
        return value[:CUT_CHARS] + "…"
    if isinstance(value, dict):
        return {k: _cut(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut(v) for v in value]
    return value


def relay(
    engine: Any, ref: dict[str, Any], watched: Callable[[str], bool] | None = None
) -> None:
    """Emit, to this daemon's subscribers, the event another daemon sent (on the event
    loop); nothing is read for a session `watched` says nobody here watches."""
    method = ref.get("m", "session/didAppend")
    session_id = ref["s"]
    try:
        engine.store.note_event(ref)
        if watched is not None and not watched(session_id):
            log.debug("%s of %s not relayed: no subscriber here (%d so far)",
                      method, session_id, next(_unwatched))
            return
        params = _params(engine, method, session_id, ref)
        if params is not None:
            engine.emit_local(session_id, method, params)
    except Exception:  # a storage error: the event is lost, clients can re-read
        log.warning("could not relay %s of %s", method, session_id, exc_info=True)


def _params(
    engine: Any, method: str, sid: str, ref: dict[str, Any]
) -> msgspec.Struct | dict[str, Any] | None:
    runs = engine.store.runs
    if method == "session/didAppend":
        batch_id = int(ref["b"])
        found = engine.store.archive.batch(batch_id)
        if found is None or found[0] != sid:
            return None
        _, run_id, first, last = found
        return {
            "sessionId": sid,
            "batchId": batch_id,
            "messageIds": list(range(first, last + 1)),
            "runId": run_id,
            "status": engine.status(sid),
        }
    if method in ("run/didStart", "run/didFinish"):
        run = runs.get(ref["r"])
        if run is None or run.session_id != sid:
            return None
        if method == "run/didStart":
            return RunDidStart(session_id=sid, run_id=run.id, run=run_struct(run))
        return RunDidFinish(session_id=sid, run=run_struct(run),
                            auto_compaction_scheduled=bool(ref.get("a")))
    if method in ("approval/didRequest", "approval/didResolve"):
        approval = runs.get_approval(ref["p"])
        if approval is None or approval.session_id != sid:
            return None
        return ApprovalEvent(session_id=sid, approval=event_approval(approval_struct(approval)))
    params = {"sessionId": sid, **ref.get("v", {})}
    ids = params.get("messageIds")
    if isinstance(ids, dict):  # a long pop: the range's messages now left out
        dropped = engine.context_state(sid).dropped_ids
        params["messageIds"] = [i for i in dropped if ids["lo"] <= i <= ids["hi"]]
    if ref.get("st"):
        params["status"] = engine.status(sid)
    return params


# an id missing this long above the horizon is taken for a rolled-back transaction's
GAP_SECONDS = 10.0
# rows older than this are deleted (by every daemon, every PRUNE_EVERY seconds)
RETAIN_SECONDS = 600.0
PRUNE_EVERY = 60.0
# rows read at most per query (the rest on the next one)
READ_ROWS = 1000
# the listener's own bounds: its reads are short; NOTIFY wake-ups drained per read
LISTENER_SETTINGS = "SELECT set_config('statement_timeout', '30000', false), " \
    "set_config('lock_timeout', '5000', false)"
DRAIN = 10_000


class EventReader:
    """Which rows of `ctxd_events` this daemon has handled (see the module docstring);
    kept across reconnects."""

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.horizon: int | None = None
        self.seen: set[int] = set()
        self.missing_since: dict[int, float] = {}
        self.pruned_at = 0.0
        # set while the listening connection is up (LISTEN done, the backlog read)
        self.listening = threading.Event()

    def start(self, conn: psycopg.Connection) -> None:
        if self.horizon is None:
            row = conn.execute("SELECT coalesce(max(id), 0) FROM ctxd_events").fetchone()
            self.horizon = int(row[0])

    def read(self, conn: psycopg.Connection, on_event: Callable[[dict[str, Any]], None]) -> None:
        """Hand every new row of another daemon to `on_event`, in id order."""
        assert self.horizon is not None
        while True:
            rows = conn.execute(
                "SELECT id, origin, body FROM ctxd_events WHERE id > %s AND id <> ALL(%s) "
                "ORDER BY id LIMIT %s",
                (self.horizon, sorted(self.seen), READ_ROWS),
            ).fetchall()
            for event_id, origin, body in rows:
                self.seen.add(event_id)
                if origin != self.origin:
                    ref = parse_reference(body)
                    if ref is not None:
                        on_event(ref)
            self._advance()
            if len(rows) < READ_ROWS:
                return

    def _advance(self) -> None:
        assert self.horizon is not None
        now = time.monotonic()
        top = max(self.seen, default=self.horizon)
        while self.horizon < top:
            nxt = self.horizon + 1
            if nxt in self.seen:
                self.seen.discard(nxt)
            else:
                since = self.missing_since.setdefault(nxt, now)
                if now - since < GAP_SECONDS:
                    break
                del self.missing_since[nxt]
            self.horizon = nxt
        for gap in range(self.horizon + 1, top):
            if gap not in self.seen:
                self.missing_since.setdefault(gap, now)

    @property
    def waiting(self) -> bool:
        """Whether ids above the horizon are still missing (look again without a wake-up)."""
        return bool(self.missing_since)

    def prune(self, conn: psycopg.Connection) -> None:
        now = time.monotonic()
        if now - self.pruned_at < PRUNE_EVERY:
            return
        self.pruned_at = now
        conn.execute(
            "DELETE FROM ctxd_events WHERE created_at < %s", (time.time() - RETAIN_SECONDS,)
        )


def parse_reference(body: str) -> dict[str, Any] | None:
    """A row's reference, or None for one this ctxd does not understand (a row written
    by a newer ctxd, say): read from ctxd's own table, still checked for its shape."""
    try:
        ref = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(ref, dict) or not isinstance(ref.get("m"), str) or not isinstance(
        ref.get("s"), str
    ):
        return None
    return ref


def listen_forever(
    dsn: str, password: str | None, origin: str, stop: threading.Event,
    on_event: Callable[[dict[str, Any]], None], reader: EventReader | None = None,
    own_pids: Callable[[], set[int]] = set,
) -> None:
    """Until `stop`, call `on_event(reference)` for every event another daemon wrote;
    reconnects by itself when the server comes back, and survives anything a
    notification carries (its payload is never read). A notification sent by one of
    `own_pids()` (the server processes of this daemon's own connections, as the server
    reports the sender, not as the payload says) wakes nothing: this daemon's own
    events need no reading, and its rows are passed over at the next read."""
    reader = reader or EventReader(origin)
    while not stop.is_set():
        try:
            with connect(dsn, password, autocommit=True) as conn:
                conn.execute(LISTENER_SETTINGS)
                conn.execute(f"LISTEN {CHANNEL}")
                reader.start(conn)
                reader.read(conn, on_event)  # what came while this was not listening
                reader.listening.set()
                while not stop.is_set():
                    got = list(conn.notifies(timeout=0.5, stop_after=1))
                    if got:
                        # every wake-up queued meanwhile is answered by the same read
                        got += conn.notifies(timeout=0.001, stop_after=DRAIN)
                    mine = own_pids() if got else set()
                    woke = any(n.pid not in mine for n in got)
                    if woke or reader.waiting:
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


def start_relay(
    engine: Any, loop: Any, watched: Callable[[str], bool] | None = None
) -> asyncio.Task[None]:
    """Listen for other daemons' events; each is relayed on `loop`, read only when
    `watched(session_id)` (None: always). The listening thread is watched from `loop`
    and started again if it ever ends (the task returned)."""
    engine.store.listen(lambda ref: loop.call_soon_threadsafe(relay, engine, ref, watched))
    return loop.create_task(watch_listener(engine.store))


async def watch_listener(store: Any, interval: float = 1.0) -> None:
    while True:
        await asyncio.sleep(interval)
        try:
            store.ensure_listening()
        except Exception:
            log.exception("could not start the events listener again")


async def watch_orphaned_runs(engine: Any, lease_runs: Any, interval: float) -> None:
    """Every `interval` seconds, adopt the open runs of daemons that are gone and hand
    them to `lease_runs` (their clients get one lease to come back, then they are marked
    interrupted), so no dead daemon's run keeps a session locked."""
    while True:
        await asyncio.sleep(interval)
        try:
            orphans = engine.store.runs.adopt_orphans()
        except Exception:  # the server is away: look again next time
            log.debug("could not look for orphaned runs", exc_info=True)
            continue
        if orphans:
            log.info("runs left open by a daemon that is gone, leased: %s", sorted(orphans))
            lease_runs(orphans)
