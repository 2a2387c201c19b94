"""Validation of OpenAI-shaped chat messages before anything is written.

A batch is checked whole: the first bad message refuses the batch, and the error says
which message (its index in the batch) and why.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ctxd.daemon.stores.sql.search_text import index_text
from ctxd.protocol.errors import InvalidMessage, InvalidParams, PayloadTooLarge

ROLES = ("system", "user", "assistant", "tool")
# A message's or session's own time (`createdAt`, given by an importer) may be ahead of
# this daemon's clock by this much at most: the writer's clock may drift a little, but
# a time in the future would sort before messages that are appended after it.
CLOCK_SKEW_SECONDS = 300.0


def check_time(value: Any) -> str | None:
    """Why `value` is not a usable `createdAt` (unix seconds), or None when it is."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "createdAt must be a number (unix seconds)"
    if not math.isfinite(value) or value < 0:
        return "createdAt must be a finite number of unix seconds, not negative"
    if value > time.time() + CLOCK_SKEW_SECONDS:
        return "createdAt is in the future"
    return None


def _bad(index: int, why: str, field: str | None = None) -> InvalidMessage:
    data: dict[str, Any] = {"index": index}
    if field:
        data["field"] = field
    return InvalidMessage(f"message {index}: {why}", data)


def normalize_message(raw: Any, index: int, max_bytes: int) -> tuple[dict[str, Any], str]:
    """Check one message; return it normalized and its canonical JSON."""
    if not isinstance(raw, dict):
        raise _bad(index, "must be an object with 'role' and 'content'")
    role = raw.get("role")
    if role not in ROLES:
        raise _bad(index, f"unknown role {role!r}; use one of {', '.join(ROLES)}", "role")
    msg: dict[str, Any] = {"role": role}
    content = raw.get("content")
    tool_calls = raw.get("tool_calls")
    if content is None:
        if not (role == "assistant" and tool_calls):
            raise _bad(
                index, "content may be null only on an assistant message with tool_calls", "content"
            )
    elif isinstance(content, list):
        for j, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise _bad(index, f"content part {j} must be an object with a 'type'", "content")
            if part["type"] == "text" and not isinstance(part.get("text"), str):
                raise _bad(
                    index, f"content part {j} of type 'text' needs a string 'text'", "content"
                )
    elif not isinstance(content, str):
        raise _bad(index, "content must be a string, a list of parts, or null", "content")
    msg["content"] = content

    if tool_calls is not None:
        if role != "assistant":
            raise _bad(index, "only assistant messages carry tool_calls", "tool_calls")
        if not isinstance(tool_calls, list) or not tool_calls:
            raise _bad(index, "tool_calls must be a non-empty list", "tool_calls")
        for j, call in enumerate(tool_calls):
            if not isinstance(call, dict) or not isinstance(call.get("id"), str) or not call["id"]:
                raise _bad(index, f"tool_calls[{j}] needs a non-empty string 'id'", "tool_calls")
            if call.get("type", "function") != "function":
                raise _bad(index, f"tool_calls[{j}].type must be 'function'", "tool_calls")
            fn = call.get("function")
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
                raise _bad(index, f"tool_calls[{j}].function needs a string 'name'", "tool_calls")
            args = fn.get("arguments", "")
            if not isinstance(args, str):
                raise _bad(
                    index, f"tool_calls[{j}].function.arguments must be a JSON string", "tool_calls"
                )
        msg["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {
                    "name": c["function"]["name"],
                    "arguments": c["function"].get("arguments", ""),
                },
            }
            for c in tool_calls
        ]
    if role == "tool":
        tcid = raw.get("tool_call_id")
        if not isinstance(tcid, str) or not tcid:
            raise _bad(index, "a tool message needs the 'tool_call_id' it answers", "tool_call_id")
        msg["tool_call_id"] = tcid
    elif raw.get("tool_call_id") is not None:
        raise _bad(index, "only tool messages carry tool_call_id", "tool_call_id")
    name = raw.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise _bad(index, "name must be a string", "name")
        msg["name"] = name
    metadata = raw.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise _bad(index, "metadata must be an object", "metadata")
        msg["metadata"] = metadata
    created_at = raw.get("createdAt")
    if created_at is not None:
        # the message's own time (an imported transcript's): stored as its createdAt
        why = check_time(created_at)
        if why:
            raise _bad(index, why, "createdAt")
        msg["createdAt"] = float(created_at)
    # Fields this version does not know (e.g. a provider's reasoning_content) are kept
    # as they came: the archive must not lose what the agent sent.
    for key, value in raw.items():
        if key not in msg and key not in ("tool_calls", "tool_call_id", "name", "metadata"):
            msg[key] = value
    try:
        # allow_nan=False: NaN and Infinity are not JSON, and browsers refuse them
        body = _canonical_json(msg)
        size = len(body.encode("utf-8"))
    except UnicodeEncodeError:
        raise _bad(index, "contains a lone surrogate; send valid Unicode text") from None
    except (TypeError, ValueError) as exc:
        raise _bad(index, f"not JSON-serializable: {exc}") from None
    except RecursionError:
        raise _bad(index, "nested too deeply; flatten metadata and content") from None
    if size > max_bytes:
        raise PayloadTooLarge(
            f"message {index} is {size} bytes, over the limit of {max_bytes}; "
            "store large tool output elsewhere and append a reference",
            {"index": index, "bytes": size, "limit": max_bytes},
        )
    return msg, body


# a string content longer than this is encoded in slices (see _canonical_json)
_SLICE = 1 << 18


def _canonical_json(msg: dict[str, Any]) -> str:
    """`msg` as compact JSON (its canonical form). One json.dumps of megabytes holds the
    GIL, and so the event loop while a worker thread prepares a batch, for 70 ms per
    5 MB: a long string content is encoded in slices instead. JSON escapes each
    character on its own, so the slices join to the same text."""
    content = msg.get("content")
    if not isinstance(content, str) or len(content) <= _SLICE or list(msg)[:2] != [
        "role", "content",
    ]:
        return json.dumps(msg, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    rest = {k: v for k, v in msg.items() if k not in ("role", "content")}
    tail = json.dumps(rest, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    parts = [json.dumps(content[i : i + _SLICE], ensure_ascii=False)[1:-1]
             for i in range(0, len(content), _SLICE)]
    role = json.dumps(msg["role"], ensure_ascii=False)
    return (f'{{"role":{role},"content":"' + "".join(parts) + '"'
            + ("}" if tail == "{}" else "," + tail[1:]))


@dataclass
class PreparedBatch:
    """What `prepare_batch` computed for a batch: normalized messages with their
    canonical JSON, the batch digest, and (when asked) token counts."""

    normalized: list[tuple[dict[str, Any], str]]
    digest: str
    tokens: list[int] | None = None
    index_texts: list[str] | None = None  # what the full-text index stores for each


def prepare_batch(
    messages: Any, max_batch: int, max_bytes: int, count: Callable[[dict[str, Any]], int] | None
) -> PreparedBatch:
    """Validate a batch whole and compute what reads no database state. It touches no
    shared state, so the daemon runs it in a worker thread for large batches (token
    counting releases the GIL) while the event loop serves other clients."""
    if not isinstance(messages, list) or not messages:
        raise InvalidParams("messages must be a non-empty list of chat messages")
    if len(messages) > max_batch:
        raise PayloadTooLarge(
            f"{len(messages)} messages in one batch; the limit is {max_batch}: split the batch",
            {"limit": max_batch},
        )
    normalized = [normalize_message(m, i, max_bytes) for i, m in enumerate(messages)]
    # the digest of the bodies joined by newlines, fed one body at a time: one join and
    # encode of a whole large batch would hold the GIL for tens of milliseconds
    h = hashlib.sha256()
    for i, (_, body) in enumerate(normalized):
        h.update(b"\n" if i else b"")
        h.update(body.encode())
    digest = h.hexdigest()
    if count is None:
        return PreparedBatch(normalized, digest)
    tokens = [count(m) for m, _ in normalized]
    texts = [index_text(message_text(m)) for m, _ in normalized]
    return PreparedBatch(normalized, digest, tokens, texts)


def text_size(messages: Any) -> int:
    """About how many characters of text a batch carries (cheap: no encoding)."""
    if not isinstance(messages, list):
        return 0
    n = 0
    for m in messages:
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        if isinstance(content, str):
            n += len(content)
        elif isinstance(content, list):
            n += sum(len(p.get("text") or "") for p in content
                     if isinstance(p, dict) and isinstance(p.get("text"), str))
        for call in m.get("tool_calls") or ():
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                n += len(fn["arguments"])
    return n


def content_text(content: Any, *, mark_other_parts: bool = False) -> str:
    """The text of a message's content: a string, or its text parts joined by newlines.

    With `mark_other_parts`, parts that are not text (images, audio, files) appear as
    `[type]`, so a summary can at least say they were there.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    parts.append(part["text"])
                elif mark_other_parts and part.get("type"):
                    parts.append(f"[{part['type']}]")
        return "\n".join(parts)
    return str(content)


def message_id(msg: Any) -> int | None:
    """The archive id of a message as summarizers receive it; None when it has none (a
    message without an id cannot be cited)."""
    if not isinstance(msg, dict):
        return None
    raw = msg.get("id")
    if isinstance(raw, bool):
        return None
    try:
        return int(raw)
    except (TypeError, ValueError):
        return None


def message_text(msg: dict[str, Any]) -> str:
    """All searchable text of a message: content, tool call names and arguments."""
    parts: list[str] = []
    text = content_text(msg.get("content"))
    if text:
        parts.append(text)
    for call in msg.get("tool_calls") or ():
        fn = call["function"]
        parts.append(f"{fn['name']} {fn.get('arguments', '')}")
    if msg.get("name"):
        parts.append(msg["name"])
    return "\n".join(parts)


def for_model(msg: dict[str, Any]) -> dict[str, Any]:
    """The message as a chat-completions endpoint takes it (no ctxd metadata)."""
    if "metadata" not in msg:
        return msg
    return {k: v for k, v in msg.items() if k != "metadata"}


def strip_archive_fields(msg: dict[str, Any]) -> dict[str, Any]:
    """An archived message as the model takes it: no archive bookkeeping, no metadata."""
    return {
        k: v
        for k, v in msg.items()
        if k not in ("id", "batchId", "tokens", "createdAt", "metadata")
    }
