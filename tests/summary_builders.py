"""Messages as the built-in summarizer receives them (archive ids, OpenAI shape), and one
call of it, for the summary tests."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ctxd.daemon.summarizers.builtin import BuiltinSummarizer
from ctxd.daemon.summary import Summary, SummaryRequest


def user(mid: int, text: str) -> dict[str, Any]:
    return {"id": mid, "role": "user", "content": text}


def assistant(mid: int, text: str | None, *calls: dict[str, Any], **extra: Any
              ) -> dict[str, Any]:
    msg: dict[str, Any] = {"id": mid, "role": "assistant", "content": text, **extra}
    if calls:
        msg["tool_calls"] = list(calls)
    return msg


def call(cid: str, name: str, **args: Any) -> dict[str, Any]:
    return {"id": cid, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


def result(mid: int, cid: str, text: str, name: str | None = None) -> dict[str, Any]:
    msg: dict[str, Any] = {"id": mid, "role": "tool", "tool_call_id": cid, "content": text}
    if name:
        msg["name"] = name
    return msg


def summarize(
    messages: list[dict[str, Any]],
    previous: Summary | None = None,
    summarizer: BuiltinSummarizer | None = None,
    budget: int = 4000,
    count_tokens: Callable[[str], int] = lambda text: len(text) // 3,
) -> Summary:
    """One run of the built-in summarizer over `messages` (session "s", no pins)."""
    request = SummaryRequest(
        session_id="s",
        previous=previous or Summary(),
        messages=messages,
        pins=[],
        instructions=None,
        budget_tokens=budget,
        count_tokens=count_tokens,
    )
    return (summarizer or BuiltinSummarizer()).summarize_sync(request)
