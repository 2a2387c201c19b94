"""Events across daemons: a change made through another daemon, told to this one's
subscribers.

Every event a daemon emits is also written as a row of `ctxd_events` (schema migration
5), as a reference: the event's method, its session, the ids of the rows it is about
(batch, run, approval) and the few small values the database does not hold (a
compaction's result numbers, a progress step). The same statement sends a NOTIFY, which
is only a wake-up: any role that may connect can send one, so its payload is never read.
A woken daemon reads the rows it has not seen from `ctxd_events`, which only ctxd's role
can write, and computes the session's status itself, so its subscribers get the same
params as the sending daemon's own subscribers, as of the moment the event is relayed. A
`session/didAppend` is written inside the append's own transaction
(stores/postgres/store.py); the other events are written when the daemon that made the
change tells its own subscribers, right after its commit.

An event costs only the daemons that need it (event_reader.py): a compaction's events go
on one channel every daemon listens on (its bookkeeping, `note_event`, needs them);
every other event goes on a channel of its session, which a daemon listens on while one
of its clients watches the session (the event hub tells it, `start_relay`), and a daemon
reads no row of a session none of its clients watches. Gaps in the ids (a row committed
after one with a higher id, a rolled-back transaction), reconnecting and reading what was
missed (rows are kept RETAIN_SECONDS) are the reader's; the listening thread is started
again if it ever ends (`watch_listener`).

References stay small: ids, not rows, and long texts (an error message) are cut.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import Callable
from typing import Any

import msgspec

from ctxd.daemon.approval_events import event_approval
from ctxd.daemon.stores.postgres.event_reader import (  # noqa: F401 - the module's names
    ALL,
    GAP_SECONDS,
    PRUNE_EVERY,
    READ_ROWS,
    RECORD,
    RETAIN_SECONDS,
    SHARED,
    SHARED_METHODS,
    EventReader,
    listen_forever,
    session_channel,
)
from ctxd.daemon.views import approval_struct, run_struct
from ctxd.protocol.types import ApprovalEvent, RunDidFinish, RunDidStart

log = logging.getLogger("ctxd.pg.events")

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
    """Emit, to this daemon's subscribers, the event another daemon sent, reading what
    it names here; nothing is read for a session `watched` says nobody here watches."""
    method = ref.get("m", "session/didAppend")
    session_id = ref["s"]
    try:
        if not _to_relay(engine, ref, watched):
            return
        params = _params(engine, method, session_id, ref)
        if params is not None:
            engine.emit_local(session_id, method, params)
    except Exception:  # a storage error: the event is lost, clients can re-read
        log.warning("could not relay %s of %s", method, session_id, exc_info=True)


def relay_beside_loop(
    engine: Any, ref: dict[str, Any], watched: Callable[[str], bool] | None = None
) -> None:
    """`relay` from the event loop: what the event names is read on its session's
    worker thread, in the session's order (a round trip or two), and the event emitted
    on the loop once read; the events of one session keep their order."""
    method = ref.get("m", "session/didAppend")
    session_id = ref["s"]
    try:
        if not _to_relay(engine, ref, watched):
            return
        read = engine.store.in_lane(session_id, lambda: _params(engine, method, session_id, ref))
    except Exception:
        log.warning("could not relay %s of %s", method, session_id, exc_info=True)
        return

    def emit(done: asyncio.Future[Any]) -> None:
        if done.cancelled():
            return
        if done.exception() is not None:  # a storage error: as in `relay`
            log.warning("could not relay %s of %s", method, session_id,
                        exc_info=done.exception())
            return
        params = done.result()
        if params is not None:
            engine.emit_local(session_id, method, params)

    read.add_done_callback(emit)


def _to_relay(engine: Any, ref: dict[str, Any], watched: Callable[[str], bool] | None) -> bool:
    """Noted (compactions elsewhere); whether anyone here watches its session."""
    engine.store.note_event(ref)
    session_id = ref["s"]
    if watched is not None and not watched(session_id):
        log.debug("%s of %s not relayed: no subscriber here (%d so far)",
                  ref.get("m", "session/didAppend"), session_id, next(_unwatched))
        return False
    return True


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


def start_relay(engine: Any, loop: Any, hub: Any = None) -> asyncio.Task[None]:
    """Listen for other daemons' events; each is relayed on `loop`. With `hub` (the
    daemon's EventHub), only the events of the sessions its clients watch are read,
    following its subscriptions as they change. The listening thread is watched from
    `loop` and started again if it ever ends (the task returned)."""
    watched: Callable[[str], bool] | None = None
    if hub is not None:
        store = engine.store
        watched = hub.watched

        def follow(session_id: str | None) -> None:
            if session_id is None:
                store.watch(None, hub.watches_everything())
            else:
                store.watch(session_id, hub.watched(session_id))

        store.watch(None, hub.watches_everything())
        for session_id in hub.watched_sessions():
            store.watch(session_id, True)
        hub.add_watch_hook(follow)
    engine.store.listen(
        lambda ref: loop.call_soon_threadsafe(relay_beside_loop, engine, ref, watched))
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
            # round trips (and a connection made when the daemon's own was lost): beside
            # the event loop
            orphans = await asyncio.to_thread(engine.store.runs.adopt_orphans)
        except Exception:  # the server is away: look again next time
            log.debug("could not look for orphaned runs", exc_info=True)
            continue
        if orphans:
            log.info("runs left open by a daemon that is gone, leased: %s", sorted(orphans))
            lease_runs(orphans)
