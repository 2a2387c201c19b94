"""What `ctxd mcp` holds of the daemon: one reconnecting blocking client and the
session the tools work on. Free of the MCP SDK, so `ctxd mcp` can say the extra is
missing before anything of it loads."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ctxd.clients.client import Client
from ctxd.clients.client_methods import _Methods

# sessions scanned to map a directory
SCANNED_SESSIONS = 5000


class DaemonLink(_Methods[Any]):
    """One blocking ctxd client, reconnected (and the daemon restarted) when lost; the
    protocol table's calls (`client_methods.py`) go through `call`."""

    def __init__(self, connect: Callable[[], Client]) -> None:
        self._connect = connect
        self._lock = threading.Lock()
        self._client: Client | None = None

    def client(self) -> Client:
        with self._lock:
            if self._client is None:
                self._client = self._connect()
            return self._client

    def call(self, method: str, params: dict[str, Any] | None = None, *,
             timeout: float | None = None) -> Any:
        try:
            return self.client().call(method, params, timeout=timeout)
        except ConnectionError:
            with self._lock:
                old, self._client = self._client, None
            if old is not None:
                old.close()
            return self.client().call(method, params, timeout=timeout)

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


@dataclass
class SessionChoice:
    """Which session the tools work on: given, mapped from a directory, or the newest."""

    session_id: str | None = None
    cwd: str | None = None
    how: str = ""

    def resolve(self, link: DaemonLink) -> str:
        if self.session_id:
            return self.session_id
        sid, how = _pick_session(link, self.cwd)
        if sid is None:
            title = f"mcp: {self.cwd}" if self.cwd else "mcp"
            meta = {"source": "mcp", **({"cwd": self.cwd} if self.cwd else {})}
            sid = link.create_session(title=title, metadata=meta)["sessionId"]
            how = "created: no session existed"
        self.session_id, self.how = sid, how
        return sid


def _pick_session(link: DaemonLink, cwd: str | None) -> tuple[str | None, str]:
    """The newest session whose metadata `cwd` is this directory (or the nearest parent
    of it), else the newest session of all."""
    newest: str | None = None
    best: tuple[int, str] | None = None
    cursor = None
    seen = 0
    here = os.path.realpath(cwd) if cwd else None
    while seen < SCANNED_SESSIONS:
        page = link.list_sessions(limit=1000, cursor=cursor)
        for s in page["sessions"]:
            seen += 1
            newest = newest or s["sessionId"]
            meta = s.get("metadata") or {}
            where = meta.get("cwd")
            # a subagent's conversation is not the one the project's agent goes on with
            if here and isinstance(where, str) and where and not meta.get("sidechain"):
                there = os.path.realpath(where)
                if here == there or here.startswith(there.rstrip("/") + "/"):
                    if best is None or len(there) > best[0]:
                        best = (len(there), s["sessionId"])
        cursor = page.get("nextCursor")
        if not cursor:
            break
    if best is not None:
        return best[1], f"mapped from the working directory {cwd}"
    return newest, "the most recent session"
