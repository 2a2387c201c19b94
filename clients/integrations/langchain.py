"""ctxd as the memory of LangChain and LangGraph agents.

LangChain, with `RunnableWithMessageHistory`:

    from ctxd.clients.integrations.langchain import CtxdChatMessageHistory

    chain = RunnableWithMessageHistory(
        runnable, lambda session_id: CtxdChatMessageHistory(session_id), ...)

LangGraph: the graph keeps its own state (and checkpointer); ctxd gets every message
of the thread and gives the model its compacted context for the thread instead of
the whole history:

    memory = CtxdThreadMemory()
    agent = create_react_agent(model, tools, pre_model_hook=memory.pre_model_hook,
                               post_model_hook=memory.post_model_hook, checkpointer=...)
    # or, with LangChain's create_agent:
    agent = create_agent(model, tools, middleware=[memory.middleware()], checkpointer=...)

The messages are stored as OpenAI chat messages (what every ctxd client reads); when
that form cannot give a LangChain message back exactly (ids, extra fields), the
message's own serialized form rides along in its `metadata`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Optional

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    RemoveMessage,
    convert_to_messages,
    convert_to_openai_messages,
    message_to_dict,
    messages_from_dict,
)
from langchain_core.runnables import RunnableConfig

from ctxd.clients.client import AsyncClient, Client, Wire
from ctxd.clients.integrations._conn import Connection, batch_id
from ctxd.protocol.errors import Conflict, RunActive

__all__ = ["CtxdChatMessageHistory", "CtxdThreadMemory", "to_chat", "from_chat"]

META_KEY = "langchain"


# conversion


def to_chat(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """LangChain messages as OpenAI chat messages, each keeping its exact form if needed."""
    out = []
    for m in messages:
        if isinstance(m, RemoveMessage):
            continue
        chat = convert_to_openai_messages(m)
        assert isinstance(chat, dict)
        if chat.get("role") not in ("system", "user", "assistant", "tool"):
            chat["role"] = "system" if chat.get("role") == "developer" else "user"
        if chat.get("role") == "assistant" and chat.get("tool_calls") and not chat.get("content"):
            chat["content"] = None
        elif chat.get("content") is None:
            chat["content"] = ""
        chat.pop("id", None)
        if from_chat(chat) != m:
            chat["metadata"] = {META_KEY: message_to_dict(m)}
        out.append(chat)
    return out


def from_chat(msg: dict[str, Any]) -> BaseMessage:
    """A chat message from ctxd's context as a LangChain message."""
    meta = msg.get("metadata")
    if isinstance(meta, dict) and isinstance(meta.get(META_KEY), dict):
        return messages_from_dict([meta[META_KEY]])[0]
    plain = {k: v for k, v in msg.items() if k != "metadata"}
    if plain.get("content") is None:
        plain["content"] = ""
    return convert_to_messages([plain])[0]


def _batch_id(prefix: str, messages: Sequence[BaseMessage]) -> str:
    """Messages with ids (LangGraph gives every message one) are idempotent by id."""
    ids = [m.id for m in messages]
    return batch_id("lc", [prefix, ids] if all(ids) else None)


def _append_run(c: Client, sid: str, chat: list[dict[str, Any]], batch: str) -> None:
    """One `add_messages` call is one run: the daemon may compact once it is finished."""
    try:
        run = c.start_run(sid)["runId"]
    except RunActive:  # another client's run: append outside it
        c.append(sid, chat, client_batch_id=batch)
        return
    try:
        c.append(sid, chat, run_id=run, client_batch_id=batch)
    except BaseException:
        c.finish_run(run, "failed")
        raise
    c.finish_run(run, "completed")


async def _aappend_run(c: AsyncClient, sid: str, chat: list[dict[str, Any]], batch: str) -> None:
    try:
        run = (await c.start_run(sid))["runId"]
    except RunActive:
        await c.append(sid, chat, client_batch_id=batch)
        return
    try:
        await c.append(sid, chat, run_id=run, client_batch_id=batch)
    except BaseException:
        await c.finish_run(run, "failed")
        raise
    await c.finish_run(run, "completed")


class CtxdChatMessageHistory(BaseChatMessageHistory):
    """A LangChain chat history backed by the ctxd session `session_id`.

    `messages` is ctxd's compacted active context (a system message with pins and the
    summary of what left it, then the recent messages exactly); `add_messages` appends
    to the archive as one run, so auto-compaction happens between turns; `clear`
    starts a fresh active context, and the archive keeps everything.
    """

    def __init__(
        self,
        session_id: str,
        *,
        client: Client | None = None,
        async_client: AsyncClient | None = None,
        connection_file: str | None = None,
        data_dir: str | None = None,
        wire: Wire = "jsonrpc",
        title: str | None = None,
        start_daemon: bool = True,
    ) -> None:
        self.session_id = session_id
        self.title = title
        self._conn = Connection(
            client=client,
            async_client=async_client,
            connection_file=connection_file,
            data_dir=data_dir,
            wire=wire,
            start_daemon=start_daemon,
        )

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        c = self._conn.ensure(self.session_id, self.title)
        ctx = c.context_get(self.session_id, include_metadata=True)
        return [from_chat(m) for m in ctx["messages"]]

    async def aget_messages(self) -> list[BaseMessage]:
        c = await self._conn.aensure(self.session_id, self.title)
        ctx = await c.context_get(self.session_id, include_metadata=True)
        return [from_chat(m) for m in ctx["messages"]]

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        chat = to_chat(messages)
        if not chat:
            return
        c = self._conn.ensure(self.session_id, self.title)
        _append_run(c, self.session_id, chat, _batch_id(self.session_id, messages))

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        chat = to_chat(messages)
        if not chat:
            return
        c = await self._conn.aensure(self.session_id, self.title)
        await _aappend_run(c, self.session_id, chat, _batch_id(self.session_id, messages))

    def clear(self) -> None:
        self._conn.ensure(self.session_id, self.title).context_clear(self.session_id)

    async def aclear(self) -> None:
        c = await self._conn.aensure(self.session_id, self.title)
        await c.context_clear(self.session_id)


class CtxdThreadMemory:
    """Keeps each LangGraph thread's messages in a ctxd session (`session_for_thread`
    names it; the thread id by default) and hands the model ctxd's context for it.

    Each graph invocation (from a human message to the model's answer without tool
    calls) is one ctxd run, so the daemon compacts between invocations.
    """

    def __init__(
        self,
        *,
        client: Client | None = None,
        async_client: AsyncClient | None = None,
        connection_file: str | None = None,
        data_dir: str | None = None,
        wire: Wire = "jsonrpc",
        session_for_thread: Callable[[str], str] = lambda thread_id: thread_id,
        start_daemon: bool = True,
    ) -> None:
        self._conn = Connection(
            client=client,
            async_client=async_client,
            connection_file=connection_file,
            data_dir=data_dir,
            wire=wire,
            start_daemon=start_daemon,
        )
        self.session_for_thread = session_for_thread
        self._synced: dict[str, str] = {}  # session -> id of the last message it has
        self._runs: dict[str, str] = {}  # session -> its open run

    # what to sync

    def _session(self, config: Any) -> str:
        if config is None:
            from langgraph.config import get_config

            config = get_config()
        thread = (config.get("configurable") or {}).get("thread_id")
        if not thread:
            raise ValueError(
                "ctxd keeps one session per LangGraph thread: invoke the graph with "
                "config={'configurable': {'thread_id': ...}}"
            )
        return self.session_for_thread(str(thread))

    def _new(self, sid: str, messages: Sequence[BaseMessage], tail_ids: list[str]) -> list[Any]:
        """The state's messages ctxd does not have yet (state only grows)."""
        last = self._synced.get(sid)
        known = {last} if last else set(tail_ids)
        for i in range(len(messages) - 1, -1, -1):
            if messages[i].id in known:
                return list(messages[i + 1 :])
        return list(messages)

    def _plan(self, sid: str, new: list[BaseMessage]) -> list[tuple[str, list[BaseMessage]]]:
        """Split the new messages: what ends the previous run, then the new run's part."""
        first_human = next((i for i, m in enumerate(new) if isinstance(m, HumanMessage)), None)
        if first_human is None:
            return [("continue", new)]
        return [("finish", new[:first_human]), ("start", new[first_human:])]

    @staticmethod
    def _at_rest(new: list[BaseMessage]) -> bool:
        return bool(new) and isinstance(new[-1], AIMessage) and not new[-1].tool_calls

    # sync and async cores

    def _sync(self, state: Any, config: Any, *, context: bool) -> list[BaseMessage]:
        messages = state["messages"] if isinstance(state, dict) else state.messages
        sid = self._session(config)
        c = self._conn.ensure(sid)
        tail_ids: list[str] = []
        if sid not in self._synced:
            ctx = c.context_get(sid, include_metadata=True)
            tail_ids = [m.id for m in map(from_chat, ctx["messages"]) if m.id]
        new = self._new(sid, messages, tail_ids)
        for step, part in self._plan(sid, new):
            if step == "start":
                self._finish(c, sid, "completed")
            if part:
                run = self._runs.get(sid)
                if run is None and step != "finish":
                    run = self._start(c, sid)
                c.append(sid, to_chat(part), run_id=run, client_batch_id=_batch_id(sid, part))
                self._synced[sid] = part[-1].id or ""
            if step == "finish":
                self._finish(c, sid, "completed")
        if self._at_rest(new):
            self._finish(c, sid, "completed")
        if not context:
            return []
        return [from_chat(m) for m in c.context_get(sid, include_metadata=True)["messages"]]

    def _start(self, c: Client, sid: str) -> str | None:
        try:
            self._runs[sid] = c.start_run(sid)["runId"]
        except RunActive:
            return None
        return self._runs[sid]

    def _finish(self, c: Client, sid: str, outcome: str) -> None:
        run = self._runs.pop(sid, None)
        if run is not None:
            try:
                c.finish_run(run, outcome)
            except Conflict:
                pass

    # the hooks

    # LangGraph passes `config` to a node only when its annotation (a string here) is one
    # it lists: "Optional[RunnableConfig]" is, "RunnableConfig | None" is not.
    def pre_model_hook(
        self,
        state: Any,
        config: Optional[RunnableConfig] = None,  # noqa: UP045
    ) -> dict[str, Any]:
        """For `create_react_agent(pre_model_hook=...)`: stores the thread's new messages
        and gives the model ctxd's context (`llm_input_messages`); state is untouched."""
        return {"llm_input_messages": self._sync(state, config, context=True)}

    def post_model_hook(
        self,
        state: Any,
        config: Optional[RunnableConfig] = None,  # noqa: UP045
    ) -> dict[str, Any]:
        """For `create_react_agent(post_model_hook=...)`: stores the model's answer at
        once and finishes the run when it called no tool."""
        self._sync(state, config, context=False)
        return {}

    async def apre_model_hook(
        self,
        state: Any,
        config: Optional[RunnableConfig] = None,  # noqa: UP045
    ) -> dict[str, Any]:
        return await asyncio.to_thread(self.pre_model_hook, state, config)

    async def apost_model_hook(
        self,
        state: Any,
        config: Optional[RunnableConfig] = None,  # noqa: UP045
    ) -> dict[str, Any]:
        return await asyncio.to_thread(self.post_model_hook, state, config)

    def context_for(self, thread_id: str) -> list[BaseMessage]:
        """ctxd's current context of a thread, as LangChain messages."""
        sid = self.session_for_thread(thread_id)
        ctx = self._conn.ensure(sid).context_get(sid, include_metadata=True)
        return [from_chat(m) for m in ctx["messages"]]

    def middleware(self) -> Any:
        """The same for LangChain's `create_agent(middleware=[...])`: the model request's
        messages become ctxd's context; the answer is stored after the model call."""
        from langchain.agents.middleware import AgentMiddleware

        memory = self

        class CtxdContextMiddleware(AgentMiddleware):  # type: ignore[misc]
            def wrap_model_call(self, request: Any, handler: Any) -> Any:
                msgs = memory._sync({"messages": request.messages}, None, context=True)
                return handler(request.override(messages=msgs))

            async def awrap_model_call(self, request: Any, handler: Any) -> Any:
                from langgraph.config import get_config

                config = get_config()
                msgs = await asyncio.to_thread(
                    memory._sync, {"messages": request.messages}, config, context=True
                )
                return await handler(request.override(messages=msgs))

            def after_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
                memory._sync(state, None, context=False)
                return None

            async def aafter_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
                from langgraph.config import get_config

                config = get_config()
                await asyncio.to_thread(memory._sync, state, config, context=False)
                return None

        return CtxdContextMiddleware()
