"""The OpenAI Agents SDK's own Runner on a ctxd session, against a real daemon.

The model is scripted (the SDK's `Model` interface, no network): each turn it calls a
tool, then answers. Over 300 turns the model input must stay bounded, never hold a
tool output without its call, and the archive must still find the first turns.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agents import Agent, ModelSettings, RunConfig, Runner, function_tool, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.testing import assistant_message, function_call
from agents.usage import Usage
from helpers import DaemonProcess

from ctxd.clients.client import connect_async
from ctxd.clients.integrations._responses import is_call, is_output
from ctxd.clients.integrations.openai_agents import CtxdSession

TURNS = 300


def check_pairs(items: list[Any]) -> None:
    """No tool output without its call before it; no call left without its output."""
    calls: list[str] = []
    for item in items:
        item = dict(item)
        if is_call(item):
            calls.append(item["call_id"])
        elif is_output(item):
            assert item["call_id"] in calls, f"output {item['call_id']} sent without its call"
    outputs = {dict(i)["call_id"] for i in items if is_output(dict(i))}
    # the current turn's own call may still wait for its output
    assert len([c for c in calls if c not in outputs]) <= 1


class ScriptedModel(Model):
    """Calls `lookup` for each new user message, then answers with what it returned."""

    def __init__(self) -> None:
        self.inputs: list[list[Any]] = []

    async def get_response(
        self, system_instructions: str | None, input: str | list[Any], *args: Any, **kw: Any
    ) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        self.inputs.append(items)
        check_pairs(items)
        last = dict(items[-1])
        n = len(self.inputs)
        if last.get("type") == "function_call_output":
            out = [assistant_message(f"noted: {last['output']}", item_id=f"msg_{n}")]
        else:
            turn = str(last["content"]).split(":")[0].split()[-1]
            out = [
                function_call("lookup", {"turn": int(turn)}, call_id=f"call_{n}", item_id=f"fc_{n}")
            ]
        return ModelResponse(output=out, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kw: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


@function_tool
def lookup(turn: int) -> str:
    """Look a record up."""
    return f"record {turn}: code word zebra{turn}"


async def _scenario(daemon: DaemonProcess) -> None:
    set_tracing_disabled(True)
    model = ScriptedModel()
    agent = Agent(
        name="clerk",
        instructions="Look records up.",
        model=model,
        tools=[lookup],
        model_settings=ModelSettings(),
    )
    session = CtxdSession("agents-300", connection_file=str(daemon.connection_file))
    config = RunConfig(tracing_disabled=True)
    for i in range(TURNS):
        result = await Runner.run(
            agent, f"turn {i}: look up record {i}", session=session, run_config=config
        )
        assert result.final_output == f"noted: record {i}: code word zebra{i}"
    assert len(model.inputs) == 2 * TURNS
    sizes = [len(x) for x in model.inputs]
    # 4 items a turn: without compaction the last input would hold ~1200 items
    assert max(sizes) <= 110, max(sizes)
    assert sizes[-1] <= 110
    c = await connect_async(connection_file=daemon.connection_file)
    try:
        status = await c.context_status("agents-300")
        assert status["archiveMessages"] == 4 * TURNS
        assert status["compactionCount"] >= 1
        assert status["activeRunId"] is None  # every turn's run was finished
        hits = (await c.search("zebra3", session_id="agents-300"))["hits"]
        assert any(not h["inActiveContext"] for h in hits)
        # the summary reaches the model as a system item
        last_input = model.inputs[-1]
        assert any(dict(i).get("role") == "system" for i in last_input[:2])

        # limit widens its cut to keep the newest call with its output
        newest = await session.get_items(limit=2)
        assert [dict(i).get("type") for i in newest] == [
            "function_call",
            "function_call_output",
            "message",
        ]
        check_pairs(newest)
        # items come back as the SDK gave them (ids and output parts included)
        assert dict(newest[-1])["id"] == f"msg_{2 * TURNS}"

        # pop: the answer, then the tool output together with its call
        popped = await session.pop_item()
        assert dict(popped)["type"] == "message"
        popped = await session.pop_item()
        assert dict(popped)["type"] == "function_call_output"
        items = await session.get_items()
        check_pairs(items)
        assert dict(items[-1]).get("role") == "user"
        assert (await c.context_status("agents-300"))["archiveMessages"] == 4 * TURNS

        # the same model items twice are appended once
        again = [dict(assistant_message("dup", item_id="msg_dup"))]
        await session.add_items(again)
        await session.add_items(again)
        assert (await c.context_status("agents-300"))["archiveMessages"] == 4 * TURNS + 1

        # clear: a fresh context, the archive untouched
        await session.clear_session()
        assert await session.get_items() == []
        result = await Runner.run(
            agent, f"turn {TURNS}: look up record {TURNS}", session=session, run_config=config
        )
        assert len(model.inputs[-2]) == 1 and len(model.inputs[-1]) == 3
        assert (await c.search("zebra1", session_id="agents-300"))["hits"]
    finally:
        await session.close()
        await c.close()


def test_runner_300_turns_bounded_paired_searchable(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path).start()
    try:
        asyncio.run(_scenario(daemon))
    finally:
        daemon.stop()


def test_run_sync_reconnects_in_each_loop(tmp_path: Path) -> None:
    set_tracing_disabled(True)
    daemon = DaemonProcess(tmp_path).start()
    try:
        model = ScriptedModel()
        agent = Agent(name="clerk", model=model, tools=[lookup])
        session = CtxdSession("sync", connection_file=str(daemon.connection_file))
        for i in range(3):  # run_sync: a new event loop each time
            Runner.run_sync(
                agent, f"turn {i}: go", session=session, run_config=RunConfig(tracing_disabled=True)
            )
        assert len(model.inputs[-1]) == 4 * 2 + 3  # two turns, then user, call, output
        items = asyncio.run(session.get_items())
        assert len(items) == 12
        check_pairs(items)
    finally:
        daemon.stop()
