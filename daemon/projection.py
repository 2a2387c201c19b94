"""Step projection: the model input for one step, fitted to a token budget.

The stored active context is never changed by a projection. The leading system
messages and pins come first and always; then the summary, giving up its least important
items when it does not fit the budget; then the longest tail suffix that fits without
splitting a tool call from its result; with a query, one clearly marked message recalls
the most relevant archived messages that are no longer in the active context.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ctxd.daemon.compaction.rules import render_summary_message, valid_boundaries
from ctxd.daemon.messages import message_text, strip_archive_fields
from ctxd.daemon.stores.sql.contexts import ContextState
from ctxd.daemon.stores.sql.search_text import cap_terms
from ctxd.daemon.summary import Summary
from ctxd.daemon.tokens import TokenCounter
from ctxd.protocol.errors import SearchTooBroad
from ctxd.protocol.types import SearchHit, Truncated


class MessageLookup(Protocol):
    def get_many(self, ids: Sequence[int]) -> dict[int, dict[str, Any]]: ...


class ContextReader(Protocol):
    """What a projection reads (the engine provides it): the stored context and its
    parts as rendered, archived messages by id, token counts and search."""

    tokens: TokenCounter
    archive: MessageLookup

    def context_state(self, session_id: str) -> ContextState: ...

    def system_messages(self, st: ContextState) -> list[dict[str, Any]]: ...

    def pin_texts(self, session_id: str) -> list[str]: ...

    def tail_messages(self, session_id: str, st: ContextState) -> list[dict[str, Any]]: ...

    def search(
        self, query: str, *, session_id: str | None = None, **kw: Any
    ) -> list[SearchHit]: ...

RECALL_HEADER = (
    "Recalled from the archive for this step (these messages are no longer in the "
    "active context; [msg N] are archive ids):"
)
# share of the budget a recall message may take when a query is given
RECALL_SHARE = 0.25
RECALL_HITS = 8
RECALL_CHARS = 600


@dataclass(slots=True)
class Projection:
    """The model input for one step under a budget, and what it left out (the members of
    `context/get`'s result but its status)."""

    messages: list[dict[str, Any]]
    message_ids: list[int | None]
    estimated_tokens: int
    budget_tokens: int | None
    over_budget: bool
    truncated: Truncated | None
    recalled_ids: list[int]
    dropped_summary_items: int


def project(
    engine: ContextReader,
    session_id: str,
    budget_tokens: int | None,
    query: str | None,
    recall_hits: list[SearchHit] | None = None,
) -> Projection:
    st = engine.context_state(session_id)
    count = engine.tokens.count_message
    head = engine.system_messages(st)
    ids: list[int | None] = list(st.system_ids[: len(head)])
    used = sum(count(m) for m in head)
    budget = budget_tokens if budget_tokens is not None else 1 << 62
    pins = engine.pin_texts(session_id)
    summary, dropped = _fit_summary(pins, st.summary, budget - used, count)
    summary_text = render_summary_message(pins, summary)
    if summary_text:
        head.append({"role": "system", "content": summary_text})
        ids.append(None)
        used += count(head[-1])

    recall_msg: dict[str, Any] | None = None
    recalled: list[int] = []
    if query:
        allowance = max(0, budget - used)
        if budget_tokens is not None:
            allowance = int(allowance * RECALL_SHARE)
        if recall_hits is None:
            recall_hits = recall_search(engine, session_id, query)
        recall_msg, recalled = _recall(engine, recall_hits, allowance)
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
        truncated = Truncated(
            messages=len(left_out),
            tokens=sum(m["tokens"] for m in left_out),
            from_id=left_out[0]["id"],
            to_id=left_out[-1]["id"],
        )
    return Projection(
        messages=messages,
        message_ids=ids + ([None] if recall_msg else []) + [m["id"] for m in kept],
        estimated_tokens=used,
        budget_tokens=budget_tokens,
        # only when the system messages and pins alone exceed the budget: the summary
        # gives up items and the tail messages until the rest fits
        over_budget=budget_tokens is not None and used > budget_tokens,
        truncated=truncated,
        recalled_ids=recalled,
        dropped_summary_items=dropped,
    )


# Which summary items a tight budget gives up first: least important sections first
# (what tools did and which files were touched can be recalled from the archive; goals
# and the user's constraints are what the agent must not lose).
_DROP_ORDER = ("tool_activity", "files", "errors", "decisions", "open_items", "goals",
               "constraints")


def _fit_summary(
    pins: list[str], summary: Summary, room: int, count: Callable[[dict[str, Any]], int]
) -> tuple[Summary, int]:
    """The summary with as few items dropped as needed for its message (pins included,
    never dropped) to fit `room` tokens; and how many were dropped."""

    def size(s: Summary) -> int:
        text = render_summary_message(pins, s)
        return count({"role": "system", "content": text}) if text else 0

    if size(summary) <= room:
        return summary, 0
    rank = {name: i for i, name in enumerate(_DROP_ORDER)}
    # superseded items first, then by section, then the oldest (by newest source)
    order = sorted(
        ((name, i, item) for name, items in summary.sections.items()
         for i, item in enumerate(items)),
        key=lambda e: (
            e[2].status == "current",
            rank.get(e[0], len(rank)),
            max(e[2].sources, default=0),
            e[1],
        ),
    )
    gone: set[tuple[str, int]] = set()
    kept = summary
    for name, i, _ in order:
        gone.add((name, i))
        kept = replace(
            summary,
            sections={
                sec: [it for j, it in enumerate(items) if (sec, j) not in gone]
                for sec, items in summary.sections.items()
            },
        )
        if size(kept) <= room:
            break
    return kept, len(gone)


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


def recall_query(query: str) -> str:
    """Recall is best effort: a long query (a whole user message) uses its first terms."""
    return cap_terms(query)


def recall_search(engine: ContextReader, session_id: str, query: str) -> list[SearchHit]:
    try:
        return engine.search(recall_query(query), session_id=session_id, limit=RECALL_HITS * 3)
    except SearchTooBroad:
        return []  # no recall message rather than no context


def _recall(
    engine: ContextReader, hits: list[SearchHit], allowance: int
) -> tuple[dict[str, Any] | None, list[int]]:
    hits = [h for h in hits if not h.in_active_context][:RECALL_HITS]
    if not hits:
        return None, []
    found = engine.archive.get_many([h.message_id for h in hits])
    lines = [RECALL_HEADER]
    ids: list[int] = []
    for h in hits:
        m = found.get(h.message_id)
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
