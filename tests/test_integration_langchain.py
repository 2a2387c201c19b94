"""LangChain's RunnableWithMessageHistory and LangGraph agents on ctxd, real daemon.

The models are LangChain's own fake chat models (scripted answers and tool calls,
no network). Over 300 turns the model input must stay bounded while the graph's own
state keeps every message, no tool result may reach the model without its call, and
the archive must still find the first turns.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import DaemonProcess
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from ctxd.clients.integrations.langchain import CtxdChatMessageHistory, CtxdThreadMemory
from ctxd.protocol.connection import read_connection_file

TURNS = 300


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path).start()
    yield d
    d.stop()


def check_pairs(messages: list[BaseMessage]) -> None:
    calls: set[str] = set()
    for m in messages:
        if isinstance(m, AIMessage):
            calls.update(c["id"] for c in m.tool_calls)
        if m.type == "tool":
            assert m.tool_call_id in calls, f"tool result {m.tool_call_id} without its call"


class RecordingModel(GenericFakeChatModel):
    """LangChain's scripted fake chat model, which also records every input it got."""

    inputs: list[list[BaseMessage]] = []

    def bind_tools(self, tools: Any, **kw: Any) -> RecordingModel:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kw: Any) -> Any:
        self.inputs.append(list(messages))
        check_pairs(messages)
        return super()._generate(messages, *args, **kw)


def script(turns: range) -> Iterator[AIMessage]:
    for i in turns:
        yield AIMessage(
            content="",
            tool_calls=[
                {"name": "lookup", "args": {"turn": i}, "id": f"call_{i}", "type": "tool_call"}
            ],
        )
        yield AIMessage(content=f"noted record {i}")


@tool
def lookup(turn: int) -> str:
    """Look a record up."""
    return f"record {turn}: code word zebra{turn}"


def test_runnable_with_message_history(daemon: DaemonProcess) -> None:
    model = RecordingModel(messages=iter(AIMessage(f"answer {i}") for i in range(TURNS + 5)))
    model.inputs = []
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Be brief."), MessagesPlaceholder("history"), ("human", "{q}")]
    )
    chain = RunnableWithMessageHistory(
        prompt | model,
        lambda sid: CtxdChatMessageHistory(sid, connection_file=str(daemon.connection_file)),
        input_messages_key="q",
        history_messages_key="history",
    )
    cfg = {"configurable": {"session_id": "lc-history"}}
    for i in range(TURNS):
        out = chain.invoke({"q": f"question {i}: the code word is zebra{i}"}, config=cfg)
        assert out.content == f"answer {i}"
    sizes = [len(x) for x in model.inputs]
    assert max(sizes) <= 100 and len(model.inputs) == TURNS  # 600 messages were stored
    history = CtxdChatMessageHistory("lc-history", connection_file=str(daemon.connection_file))
    msgs = history.messages
    assert isinstance(msgs[0], SystemMessage) and isinstance(msgs[-1], AIMessage)
    assert msgs[-1].content == f"answer {TURNS - 1}"
    with daemon.client() as c:
        status = c.context_status("lc-history")
        assert status["archiveMessages"] == 2 * TURNS and status["compactionCount"] >= 1
        assert status["activeRunId"] is None
        assert any(not h["inActiveContext"] for h in c.search("zebra2", "lc-history")["hits"])
    # async side, and clear keeps the archive
    asyncio.run(history.aadd_messages([HumanMessage("late"), AIMessage("ok")]))
    assert [m.content for m in asyncio.run(history.aget_messages())][-2:] == ["late", "ok"]
    history.clear()
    assert history.messages == []
    asyncio.run(history.aclear())
    with daemon.client() as c:
        assert c.context_status("lc-history")["archiveMessages"] == 2 * TURNS + 2


def _run_agent(
    agent: Any, model: RecordingModel, turns: int, thread: str, memory: CtxdThreadMemory
) -> None:
    cfg = {"configurable": {"thread_id": thread}}
    for i in range(turns):
        out = agent.invoke({"messages": [HumanMessage(f"turn {i}: look up record {i}")]}, cfg)
        assert out["messages"][-1].content == f"noted record {i}"
        # the graph's own state keeps every message
        assert len(out["messages"]) == 4 * (i + 1)
        assert out["messages"][-2].content == f"record {i}: code word zebra{i}"
    assert len(model.inputs) == 2 * turns
    assert max(len(x) for x in model.inputs) <= 100
    ctx = memory.context_for(thread)
    check_pairs(ctx)


def test_create_agent_middleware_300_turns(daemon: DaemonProcess) -> None:
    from langchain.agents import create_agent

    model = RecordingModel(messages=script(range(TURNS)))
    model.inputs = []
    memory = CtxdThreadMemory(connection_file=str(daemon.connection_file))
    agent = create_agent(
        model, [lookup], middleware=[memory.middleware()], checkpointer=InMemorySaver()
    )
    _run_agent(agent, model, TURNS, "graph-300", memory)
    with daemon.client() as c:
        status = c.context_status("graph-300")
        assert status["archiveMessages"] == 4 * TURNS
        assert status["compactionCount"] >= 1 and status["activeRunId"] is None
        hits = c.search("zebra3", "graph-300")["hits"]
        assert any(not h["inActiveContext"] for h in hits)
    # the summary reaches the model
    assert any(isinstance(m, SystemMessage) for m in model.inputs[-1][:2])


def test_create_react_agent_hooks(daemon: DaemonProcess) -> None:
    from langgraph.prebuilt import create_react_agent

    turns = 40
    model = RecordingModel(messages=script(range(turns)))
    model.inputs = []
    memory = CtxdThreadMemory(connection_file=str(daemon.connection_file))
    agent = create_react_agent(
        model,
        [lookup],
        pre_model_hook=memory.pre_model_hook,
        post_model_hook=memory.post_model_hook,
        checkpointer=InMemorySaver(),
    )
    _run_agent(agent, model, turns, "react", memory)
    with daemon.client() as c:
        status = c.context_status("react")
        assert status["archiveMessages"] == 4 * turns and status["activeRunId"] is None
    # a new memory object (a restarted process) picks the thread up where it was
    model2 = RecordingModel(messages=script(range(turns, turns + 1)))
    model2.inputs = []
    memory2 = CtxdThreadMemory(connection_file=str(daemon.connection_file))
    agent2 = create_react_agent(
        model2, [lookup], pre_model_hook=memory2.pre_model_hook, checkpointer=agent.checkpointer
    )
    cfg = {"configurable": {"thread_id": "react"}}
    agent2.invoke({"messages": [HumanMessage(f"turn {turns}: go")]}, cfg)
    with daemon.client() as c:
        # 2 more model turns synced before model calls; the final answer waits for the
        # next turn without a post_model_hook
        assert c.context_status("react")["archiveMessages"] == 4 * turns + 3
    with pytest.raises(ValueError, match="thread_id"):
        agent2.invoke({"messages": [HumanMessage("no thread")]})


def test_history_starts_the_daemon_when_none_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import time

    from ctxd.clients.client import DaemonNotRunning, connect

    monkeypatch.setenv("CTXD_RUNTIME_DIR", str(tmp_path / "run"))
    where = {
        "connection_file": str(tmp_path / "run" / "ctxd.json"),
        "data_dir": str(tmp_path / "data"),
    }
    with pytest.raises(DaemonNotRunning):
        CtxdChatMessageHistory("s", start_daemon=False, **where).add_messages([HumanMessage("x")])
    history = CtxdChatMessageHistory("s", **where)
    try:
        history.add_messages([HumanMessage("hi"), AIMessage("hello")])
        assert [m.content for m in history.messages] == ["hi", "hello"]
    finally:
        pid = read_connection_file(where["connection_file"]).pid
        with connect(connection_file=where["connection_file"]) as c:
            c.call("shutdown", {})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
