"""OpenAI Responses input items <-> ctxd's chat messages, with no framework imported.

ctxd archives OpenAI chat messages, so everything else in ctxd (search, summaries,
other clients) understands what an Agents SDK session stored. One model turn (its
reasoning, text and tool calls) becomes one assistant message; each tool output
becomes one tool message answering its call. When the chat form cannot give the
items back exactly (ids, statuses, reasoning, output parts), the items themselves
ride along in the message's `metadata`, so `get_items` returns what `add_items` got.
"""

from __future__ import annotations

import copy
import json
from typing import Any

META_KEY = "openaiAgents"
"""Key of the `metadata` object holding the original items of a message."""

Item = dict[str, Any]
Message = dict[str, Any]


def _text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                for key in ("text", "refusal"):
                    if isinstance(part.get(key), str):
                        parts.append(part[key])
                        break
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False, default=str)


def is_output(item: Item) -> bool:
    """A tool's result: answers the call with the same `call_id`."""
    kind = item.get("type", "")
    return isinstance(item.get("call_id"), str) and kind.endswith("_output")


def is_call(item: Item) -> bool:
    """A tool call the model made (function, custom, computer, shell...): has a `call_id`."""
    return isinstance(item.get("call_id"), str) and not is_output(item)


def _message_role(item: Item) -> str | None:
    if item.get("type", "message") == "message" and isinstance(item.get("role"), str):
        return str(item["role"])
    return None


def _tool_call(item: Item) -> dict[str, Any]:
    name = item.get("name") or item.get("type", "tool")
    args = item.get("arguments")
    if not isinstance(args, str):
        args = item.get("input") if isinstance(item.get("input"), str) else None
    if args is None:
        rest = {k: v for k, v in item.items() if k not in ("type", "id", "call_id", "status")}
        args = json.dumps(rest, ensure_ascii=False, default=str)
    return {
        "id": item["call_id"],
        "type": "function",
        "function": {"name": str(name), "arguments": args},
    }


def _assistant_message(group: list[Item]) -> Message:
    texts = [_text_of(i.get("content")) for i in group if _message_role(i) == "assistant"]
    calls = [_tool_call(i) for i in group if is_call(i)]
    content = "\n".join(texts) if texts or not calls else None
    msg: Message = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = calls
    return msg


def items_to_messages(items: list[Item]) -> list[Message]:
    """Responses items, oldest first, as chat messages (each with its items when needed)."""
    out: list[Message] = []
    group: list[Item] = []

    def flush() -> None:
        if group:
            out.append(_with_items(_assistant_message(group), list(group)))
            group.clear()

    for raw in items:
        item = copy.deepcopy(dict(raw))
        role = _message_role(item)
        if role == "assistant":
            if any(is_call(i) for i in group):
                flush()  # text after a call: a new model turn
            group.append(item)
        elif role is not None:
            flush()
            content = item.get("content")
            chat_role = "user" if role == "user" else "system"
            out.append(_with_items({"role": chat_role, "content": content}, [item]))
        elif is_output(item):
            flush()
            output = item.get("output")
            text = output if isinstance(output, str) else _text_of(output)
            msg = {"role": "tool", "tool_call_id": item["call_id"], "content": text}
            out.append(_with_items(msg, [item]))
        else:
            group.append(item)  # a call, reasoning, a hosted tool's item...
    flush()
    return out


def _with_items(msg: Message, items: list[Item]) -> Message:
    """Keep the items in metadata only when the chat form does not give them back."""
    if message_to_items(msg) != items:
        msg["metadata"] = {META_KEY: {"items": items}}
    return msg


def message_to_items(msg: Message) -> list[Item]:
    """A chat message (from ctxd's context) as Responses input items."""
    meta = msg.get("metadata")
    if isinstance(meta, dict) and isinstance(meta.get(META_KEY), dict):
        items = meta[META_KEY].get("items")
        if isinstance(items, list):
            return copy.deepcopy(items)
    role = msg.get("role")
    if role == "tool":
        return [
            {
                "type": "function_call_output",
                "call_id": msg["tool_call_id"],
                "output": _text_of(msg.get("content")),
            }
        ]
    if role == "assistant":
        items: list[Item] = []
        if msg.get("content") is not None and (msg.get("content") or not msg.get("tool_calls")):
            items.append({"role": "assistant", "content": msg["content"]})
        for call in msg.get("tool_calls") or ():
            fn = call.get("function") or {}
            items.append(
                {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": fn.get("name", ""),
                    "arguments": fn.get("arguments", ""),
                }
            )
        return items
    return [{"role": "user" if role == "user" else "system", "content": msg.get("content")}]


def context_to_groups(messages: list[Message]) -> list[list[Item]]:
    """ctxd's context messages as item groups: one group per message, never split."""
    return [message_to_items(m) for m in messages]


def latest(groups: list[list[Item]], limit: int | None) -> list[Item]:
    """The latest `limit` items, chronological, the cut widened so that it splits no
    message's items and never keeps a tool output whose call it would leave out."""
    flat = [(g, item) for g, items in enumerate(groups) for item in items]
    if limit is None or limit >= len(flat):
        return [item for _, item in flat]
    if limit <= 0:
        return []
    start = len(flat) - limit
    call_at = {item["call_id"]: i for i, (_, item) in enumerate(flat) if is_call(item)}
    while True:
        group = flat[start][0]
        while start > 0 and flat[start - 1][0] == group:
            start -= 1
        calls = [call_at.get(item["call_id"], start) for _, item in flat[start:] if is_output(item)]
        widened = min(calls, default=start)
        if widened >= start:
            return [item for _, item in flat[start:]]
        start = widened


def runs_at_rest(messages: list[Message], open_calls: set[str]) -> bool:
    """Whether the turn these messages end is over: every call answered and the model
    spoke last. Updates `open_calls` (calls still waiting for their output)."""
    for m in messages:
        for call in m.get("tool_calls") or ():
            open_calls.add(call["id"])
        if m["role"] == "tool":
            open_calls.discard(m["tool_call_id"])
    last = messages[-1] if messages else None
    return (
        last is not None
        and last["role"] == "assistant"
        and not last.get("tool_calls")
        and not open_calls
    )
