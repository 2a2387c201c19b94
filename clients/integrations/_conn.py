"""Connections shared by the framework adapters.

Frameworks make a session or history object per request (`RunnableWithMessageHistory`
calls its factory on every invoke), so the adapters do not open a connection each:
one blocking client per daemon for the process, one async client per daemon and
event loop (`Runner.run_sync` and `asyncio.run` make a new loop each time). Like
`ctxd stdio` and `ctxd mcp`, they start the shared daemon when none runs (unless told
not to), so one line is enough to use ctxd from a framework.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import uuid
import weakref
from pathlib import Path
from typing import Any

from ctxd.clients.client import (
    AsyncClient,
    Client,
    DaemonNotRunning,
    Wire,
    connect,
    connect_async,
    find_daemon,
)
from ctxd.clients.daemon_link import START_TIMEOUT, spawn_daemon, wait_for_daemon
from ctxd.protocol.connection import connection_file_for, default_data_dir
from ctxd.protocol.errors import Conflict

_lock = threading.Lock()
_lock_start = threading.Lock()
_sync: dict[tuple[Any, ...], Client] = {}
_async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[Any, ...], AsyncClient]]
_async = weakref.WeakKeyDictionary()
_created: set[tuple[Any, ...]] = set()  # (daemon, session id) known to exist


class Connection:
    """Where the daemon is, or a client given by the caller; hands out live clients."""

    def __init__(
        self,
        *,
        client: Client | None = None,
        async_client: AsyncClient | None = None,
        connection_file: str | None = None,
        data_dir: str | None = None,
        wire: Wire = "jsonrpc",
        start_daemon: bool = True,
    ) -> None:
        self._client = client
        self._aclient = async_client
        self._args = {"connection_file": connection_file, "data_dir": data_dir, "wire": wire}
        self._key = (str(connection_file), str(data_dir), wire)
        self._start = start_daemon

    def sync(self) -> Client:
        if self._client is not None:
            return self._client
        with _lock:
            c = _sync.get(self._key)
            if c is None or c.closed:
                self._start_if_needed()
                c = _sync[self._key] = connect(**self._args)  # type: ignore[arg-type]
            return c

    async def aio(self) -> AsyncClient:
        if self._aclient is not None:
            return self._aclient
        per_loop = _async.setdefault(asyncio.get_running_loop(), {})
        c = per_loop.get(self._key)
        if c is None or c.closed:
            await asyncio.to_thread(self._start_if_needed)
            c = per_loop[self._key] = await connect_async(**self._args)  # type: ignore[arg-type]
        return c

    def _start_if_needed(self) -> None:
        """Start the shared daemon when none answers, as `ctxd stdio` does, and wait."""
        data_dir = self._args["data_dir"]
        path = Path(
            self._args["connection_file"] or connection_file_for(data_dir or default_data_dir())
        )
        try:
            find_daemon(path)
            return
        except DaemonNotRunning:
            if not self._start:
                raise
        with _lock_start:
            try:
                find_daemon(path)
                return  # another session of this process started it meanwhile
            except DaemonNotRunning:
                pass
            log = spawn_daemon(path, Path(data_dir) if data_dir else None)
            wait_for_daemon(path, START_TIMEOUT, str(log))

    def ensure(self, session_id: str, title: str | None = None) -> Client:
        """The client, after creating the ctxd session if this process has not seen it."""
        c = self.sync()
        if (*self._key, session_id) not in _created:
            try:
                c.create_session(session_id, title=title)
            except Conflict:
                pass  # it exists: carry on where it was left
            _created.add((*self._key, session_id))
        return c

    async def aensure(self, session_id: str, title: str | None = None) -> AsyncClient:
        c = await self.aio()
        if (*self._key, session_id) not in _created:
            try:
                await c.create_session(session_id, title=title)
            except Conflict:
                pass
            _created.add((*self._key, session_id))
        return c


def batch_id(tag: str, key: object | None) -> str:
    """The `client_batch_id` of an adapter's append: `tag-` and a digest of `key` (what
    names the messages: their ids, with the session) when they carry ids, so the same
    messages sent again are one batch the daemon stores once; a fresh one when `key` is
    None (messages without ids may honestly repeat)."""
    if key is None:
        return f"{tag}-{uuid.uuid4().hex}"
    body = json.dumps(key, sort_keys=True, default=str)
    return f"{tag}-" + hashlib.sha256(body.encode()).hexdigest()[:40]
