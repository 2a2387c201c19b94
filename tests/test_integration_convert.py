"""The adapters' conversions: framework items to ctxd's chat messages and back, exactly."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from ctxd.clients.integrations._responses import (
    context_to_groups,
    items_to_messages,
    latest,
    message_to_items,
    runs_at_rest,
)
from ctxd.clients.integrations.langchain import from_chat, to_chat
from ctxd.daemon.messages import normalize_message


def _turn() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "what is in a.txt? 你好"},
        {"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "hm"}]},
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Reading it.", "annotations": []}],
        },
        {
            "id": "fc_1",
            "type": "function_call",
            "call_id": "c1",
            "name": "read",
            "arguments": '{"path": "a.txt"}',
            "status": "completed",
        },
        {"id": "fc_2", "type": "function_call", "call_id": "c2", "name": "stat", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "hello"},
        {
            "type": "function_call_output",
            "call_id": "c2",
            "output": [{"type": "input_text", "text": "4 bytes"}],
        },
        {
            "id": "msg_2",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "It says hello.", "annotations": []}],
        },
    ]


def test_items_become_chat_messages_and_come_back_exactly() -> None:
    items = _turn()
    msgs = items_to_messages(items)
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "tool", "assistant"]
    turn = msgs[1]
    assert turn["content"] == "Reading it."
    assert [c["id"] for c in turn["tool_calls"]] == ["c1", "c2"]
    assert msgs[3]["content"] == "4 bytes"
    assert "metadata" not in msgs[0] and "metadata" not in msgs[2]  # plain: no copy kept
    for i, m in enumerate(msgs):
        normalize_message(m, i, 1 << 20)  # the daemon takes every one of them
    back = [item for m in msgs for item in message_to_items(m)]
    assert back == items


def test_chat_messages_of_other_clients_become_items() -> None:
    groups = context_to_groups(
        [
            {"role": "system", "content": "summary"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "x", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "x", "content": "a b"},
            {"role": "assistant", "content": "done"},
        ]
    )
    assert groups == [
        [{"role": "system", "content": "summary"}],
        [{"type": "function_call", "call_id": "x", "name": "ls", "arguments": "{}"}],
        [{"type": "function_call_output", "call_id": "x", "output": "a b"}],
        [{"role": "assistant", "content": "done"}],
    ]


def test_limit_widens_to_keep_calls_with_outputs_and_turns_whole() -> None:
    groups = context_to_groups(items_to_messages(_turn()))
    flat = [i for g in groups for i in g]
    assert latest(groups, None) == flat
    assert latest(groups, 0) == []
    # the newest 2: an output and the answer -> back to the turn that made both calls
    got = latest(groups, 2)
    assert got == flat[1:]
    assert latest(groups, 1) == flat[-1:]
    assert latest(groups, 100) == flat


def test_at_rest_tracks_unanswered_calls() -> None:
    open_calls: set[str] = set()
    msgs = items_to_messages(_turn())
    assert not runs_at_rest(msgs[:2], open_calls) and open_calls == {"c1", "c2"}
    assert not runs_at_rest(msgs[2:4], open_calls) and not open_calls
    assert runs_at_rest(msgs[4:], open_calls)


def test_langchain_messages_round_trip() -> None:
    msgs = [
        SystemMessage("rules"),
        HumanMessage(content=[{"type": "text", "text": "看这个"}], id="h1"),
        AIMessage(
            content="",
            id="a1",
            tool_calls=[{"name": "read", "args": {"path": "a"}, "id": "t1", "type": "tool_call"}],
        ),
        ToolMessage(content="hello", tool_call_id="t1", id="tm1"),
        AIMessage(content="done"),
    ]
    chat = to_chat(msgs)
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "tool", "assistant"]
    assert chat[2]["content"] is None and chat[2]["tool_calls"][0]["id"] == "t1"
    assert "metadata" not in chat[0]
    for i, m in enumerate(chat):
        normalize_message(m, i, 1 << 20)
    assert [from_chat(m) for m in chat] == msgs
