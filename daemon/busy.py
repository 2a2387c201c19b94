"""A write refused at once because another connection is writing the same session
(`SessionBusy`, raised by a store shared with other daemons) is run again once the
session is free: the wait happens beside the event loop (`store.wait_session`, in a
thread), so other clients and sessions are served meanwhile, and it is bounded by the
store's `lock_timeout` (then `StorageTimeout`, a typed STORAGE_ERROR). Run again, the
request queues for the lock a moment on the loop (`store.patience`, a fraction of a
second at most) instead of being refused at once: otherwise newer requests would keep
taking the lock first and a busy session could starve the one that waited."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from ctxd.daemon.stores.base import shared_store
from ctxd.protocol.errors import SessionBusy

T = TypeVar("T")


async def when_free(store: Any, call: Callable[[], T], busy: SessionBusy | None = None) -> T:
    """`call()`, run again each time it finds its session busy, until the store's lock
    timeout has passed. `busy`: the refusal of a first run made by the caller."""
    loop = asyncio.get_running_loop()
    timeout = _lock_timeout(store)
    deadline = loop.time() + timeout
    while True:
        if busy is None:
            try:
                return call()
            except SessionBusy as exc:
                busy = exc
        # StorageTimeout once the lock is still held at the deadline
        sid = busy.session_id
        await store.wait_session(sid, max(0.001, deadline - loop.time()))
        # seen free: queue for it a moment now, rather than lose it to every newer request
        try:
            with store.patience(sid):
                return call()
        except SessionBusy as exc:
            busy = exc


async def when_free_off_loop(store: Any, session_id: str, call: Callable[[], T]) -> T:
    """`when_free` for a call made on a worker thread after the session's earlier calls
    (`store.in_lane`): the wait beside the loop, the patient run in the worker thread."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _lock_timeout(store)
    try:
        return await store.in_lane(session_id, call)  # type: ignore[no-any-return]
    except SessionBusy as exc:
        busy = exc
    while True:
        sid = busy.session_id
        await store.wait_session(sid, max(0.001, deadline - loop.time()))

        def patiently(sid: str = sid) -> T:
            with store.patience(sid):
                return call()

        try:
            return await store.in_lane(session_id, patiently)  # type: ignore[no-any-return]
        except SessionBusy as exc:
            busy = exc


def _lock_timeout(store: Any) -> float:
    """How long a write waits for the session's lock: the shared store's setting (the
    embedded store, with one writer, never reports a busy session)."""
    shared = shared_store(store)
    return float(shared.lock_timeout) if shared is not None else 5.0
