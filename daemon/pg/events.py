"""Events across daemons: an append made through another daemon, told to this one's
subscribers.

The notification carries ids only (session, batch); the payload is read here from the
database, so a client sees the same `session/didAppend` whichever daemon took the batch.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("ctxd.pg.events")


def relay_append(engine: Any, session_id: str, batch_id: int) -> None:
    """Emit `session/didAppend` for a batch another daemon committed (on the event loop)."""
    try:
        found = engine.store.archive.batch(batch_id)
        if found is None or found[0] != session_id:
            return
        _, run_id, first, last = found
        engine.emit(
            session_id,
            "session/didAppend",
            {
                "sessionId": session_id,
                "batchId": batch_id,
                "messageIds": list(range(first, last + 1)),
                "runId": run_id,
                "status": engine.status(session_id),
            },
        )
    except Exception:  # a storage error: the event is lost, clients can re-read
        log.warning("could not relay batch %s of %s", batch_id, session_id, exc_info=True)


def start_relay(engine: Any, loop: Any) -> None:
    """Listen for other daemons' appends; each is relayed on `loop`."""
    engine.store.listen(
        lambda sid, bid: loop.call_soon_threadsafe(relay_append, engine, sid, bid)
    )


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
