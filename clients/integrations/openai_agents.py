"""ctxd as the memory of an OpenAI Agents SDK agent: a drop-in `Session`.

    from agents import Agent, Runner
    from ctxd.clients.integrations.openai_agents import CtxdSession

    session = CtxdSession("support-42")           # finds the daemon like `connect()`
    result = await Runner.run(agent, "hello", session=session)

- `get_items()` returns ctxd's compacted active context as Responses input items: the
  session's system messages, one system item with pins and the summary of older
  history, then the exact recent items. Tool calls and their outputs come together,
  also with `limit` (the cut is widened rather than split).
- `add_items()` appends to the archive (one batch per call; a batch whose items all
  carry ids is idempotent: sent again, it adds nothing).
- Each agent turn is a ctxd run, started by the first items of the turn and finished
  once the model has answered with every tool call answered, so auto-compaction runs
  between turns, never inside one.
- `pop_item()` takes the newest message out of the active context (a tool call goes
  with its outputs); `clear_session()` starts a fresh active context. Neither deletes
  anything from the archive: `archive/search` still finds it all.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from typing import Any

from agents.memory.session_settings import SessionSettings

from ctxd.clients.client import AsyncClient, Wire
from ctxd.clients.integrations._conn import Connection, batch_id
from ctxd.clients.integrations._responses import (
    context_to_groups,
    items_to_messages,
    latest,
    message_to_items,
)
from ctxd.clients.integrations._responses import runs_at_rest as _at_rest
from ctxd.protocol.errors import Conflict, RunActive

__all__ = ["CtxdSession"]


class CtxdSession:
    """An Agents SDK `Session` backed by a ctxd session of the same id.

    Pass a connected `AsyncClient` as `client`, or let the session connect (on first
    use, in the running event loop) through the connection file like `connect_async`;
    sessions share one connection per daemon and event loop. The ctxd session is
    created if it does not exist yet.
    """

    def __init__(
        self,
        session_id: str,
        *,
        client: AsyncClient | None = None,
        connection_file: str | None = None,
        data_dir: str | None = None,
        wire: Wire = "jsonrpc",
        title: str | None = None,
        session_settings: SessionSettings | None = None,
        start_daemon: bool = True,
    ) -> None:
        self.session_id = session_id
        self.session_settings = session_settings
        self._conn = Connection(
            async_client=client,
            connection_file=connection_file,
            data_dir=data_dir,
            wire=wire,
            start_daemon=start_daemon,
        )
        self._title = title
        self._run_id: str | None = None
        self._run_client: AsyncClient | None = None
        self._open_calls: set[str] = set()
        self._locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock]
        self._locks = weakref.WeakKeyDictionary()

    async def _client(self) -> AsyncClient:
        c = await self._conn.aensure(self.session_id, self._title)
        if self._run_client is not None and self._run_client is not c:
            # a new connection (a new event loop: Runner.run_sync makes one per call);
            # the daemon closes the old connection's run when it goes away
            self._run_id, self._run_client = None, None
            self._open_calls.clear()
        return c

    def _guard(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        lock = self._locks.get(loop)
        if lock is None:
            lock = self._locks[loop] = asyncio.Lock()
        return lock

    async def close(self) -> None:
        """Finish an open turn (the connection is shared and stays open)."""
        async with self._guard():
            await self._finish("cancelled")

    # the Session protocol

    async def get_items(self, limit: int | None = None) -> list[Any]:
        c = await self._client()
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit
        ctx = await c.context_get(self.session_id, include_metadata=True)
        return latest(context_to_groups(ctx["messages"]), limit)

    async def add_items(self, items: list[Any]) -> None:
        if not items:
            return
        items = [_as_dict(i) for i in items]
        messages = items_to_messages(items)
        c = await self._client()
        async with self._guard():
            if self._run_id is None:
                try:
                    self._run_id = (await c.start_run(self.session_id))["runId"]
                    self._run_client = c
                except RunActive:
                    # another client holds the session's run: append outside it (the
                    # daemon then checks auto-compaction after the append itself)
                    self._run_id = None
            await c.append(
                self.session_id,
                messages,
                run_id=self._run_id,
                client_batch_id=_batch_id(self.session_id, items),
            )
            if _at_rest(messages, self._open_calls):
                await self._finish("completed")

    async def pop_item(self) -> Any | None:
        c = await self._client()
        async with self._guard():
            popped = (await c.context_pop(self.session_id))["messages"]
        if not popped:
            return None
        items = message_to_items(popped[-1])
        return items[-1] if items else None

    async def clear_session(self) -> None:
        c = await self._client()
        async with self._guard():
            await self._finish("cancelled")
            await c.context_clear(self.session_id)

    # runs

    async def _finish(self, outcome: str) -> None:
        run_id, self._run_id = self._run_id, None
        client, self._run_client = self._run_client, None
        self._open_calls.clear()
        if run_id is None or client is None:
            return
        try:
            await client.finish_run(run_id, outcome)
        except Conflict:
            pass  # already closed (interrupted when an earlier connection went away)


def _as_dict(item: Any) -> dict[str, Any]:
    """Input items are dicts; an output item (a pydantic model) is taken in its JSON form."""
    if hasattr(item, "model_dump"):
        return item.model_dump(mode="json", exclude_unset=True)  # type: ignore[no-any-return]
    return json.loads(json.dumps(item, default=str))


def _batch_id(session_id: str, items: list[dict[str, Any]]) -> str:
    """Items the model made carry ids: the same items twice are one batch. Items without
    ids (user input, tool outputs) may honestly repeat, so they get a fresh key."""
    named = all(isinstance(i.get("id"), str) and i["id"] for i in items)
    return batch_id("oa", [session_id, items] if named else None)
