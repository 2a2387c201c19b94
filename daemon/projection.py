"""Step projection: the model input for one step, fitted to a token budget.

The stored active context is never changed by a projection. Pins and the summary come
first, then the longest tail suffix that fits without splitting a tool call from its
result; with a query, one clearly marked message recalls the most relevant archived
messages that are no longer in the active context.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .compaction import render_summary_message, valid_boundaries
from .compactor import strip_archive_fields
from .messages import message_text

if TYPE_CHECKING:
    from .engine import Engine

RECALL_HEADER = (
    "Recalled from the archive for this step (these messages are no longer in the "
    "active context; [msg N] are archive ids):"
)
# share of the budget a recall message may take when a query is given
RECALL_SHARE = 0.25
RECALL_HITS = 8
RECALL_CHARS = 600


def project(
    engine: Engine, session_id: str, budget_tokens: int | None, query: str | None
) -> dict[str, Any]:
    st = engine.context_state(session_id)
    count = engine.tokens.count_message
    head = engine.system_messages(st)
    ids: list[int | None] = list(st.system_ids[: len(head)])
    summary_text = render_summary_message(engine.pin_texts(session_id), st.summary)
    if summary_text:
        head.append({"role": "system", "content": summary_text})
        ids.append(None)
    used = sum(count(m) for m in head)
    budget = budget_tokens if budget_tokens is not None else 1 << 62

    recall_msg: dict[str, Any] | None = None
    recalled: list[int] = []
    if query:
        allowance = max(0, budget - used)
        if budget_tokens is not None:
            allowance = int(allowance * RECALL_SHARE)
        recall_msg, recalled = _recall(engine, session_id, query, allowance)
        if recall_msg is not None:
            used += count(recall_msg)

    tail = engine.tail_messages(session_id, st)
    start = _longest_fitting_suffix(tail, budget - used)
    kept = tail[start:]
    used += sum(m["tokens"] for m in kept)
    messages = head + ([recall_msg] if recall_msg else []) + [strip_archive_fields(m) for m in kept]
    left_out = tail[:start]
    truncated = None
    if left_out:
        truncated = {
            "messages": len(left_out),
            "tokens": sum(m["tokens"] for m in left_out),
            "fromId": left_out[0]["id"],
            "toId": left_out[-1]["id"],
        }
    return {
        "messages": messages,
        "messageIds": ids + ([None] if recall_msg else []) + [m["id"] for m in kept],
        "estimatedTokens": used,
        "budgetTokens": budget_tokens,
        "overBudget": budget_tokens is not None and used > budget_tokens,
        "truncated": truncated,
        "recalledIds": recalled,
    }


def _longest_fitting_suffix(tail: list[dict[str, Any]], room: int) -> int:
    """The smallest start index whose suffix fits `room` and splits no tool pair."""
    if not tail:
        return 0
    suffix = [0] * (len(tail) + 1)
    for i in range(len(tail) - 1, -1, -1):
        suffix[i] = suffix[i + 1] + int(tail[i]["tokens"])
    for i in [0, *valid_boundaries(tail)]:
        if suffix[i] <= room:
            return i
    return len(tail)  # nothing fits whole: an empty tail rather than a broken pair


def _recall(
    engine: Engine, session_id: str, query: str, allowance: int
) -> tuple[dict[str, Any] | None, list[int]]:
    hits = [
        h
        for h in engine.search(query, session_id=session_id, limit=RECALL_HITS * 3)
        if not h["inActiveContext"]
    ][:RECALL_HITS]
    if not hits:
        return None, []
    found = engine.archive.get_many([h["messageId"] for h in hits])
    lines = [RECALL_HEADER]
    ids: list[int] = []
    for h in hits:
        m = found.get(h["messageId"])
        if m is None:
            continue
        text = " ".join(message_text(m).split())
        if len(text) > RECALL_CHARS:
            text = text[:RECALL_CHARS] + "…"
        line = f"[msg {m['id']} · {m['role']}] {text}"
        candidate = {"role": "system", "content": "\n".join([*lines, line])}
        if engine.tokens.count_message(candidate) > allowance:
            break
        lines.append(line)
        ids.append(m["id"])
    if not ids:
        return None, []
    return {"role": "system", "content": "\n".join(lines)}, ids
