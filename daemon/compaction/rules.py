"""Where the tail may start, and what a compaction must satisfy before it is committed.

The tail boundary never separates an assistant message with tool calls from its
results (parallel calls included), never starts the tail with a tool message, and
never summarizes a call whose result is still to come.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from ctxd.daemon.summary import Summary

_PENDING = 1 << 62  # "the result is still to come": blocks every boundary after the call


def _reach(msgs: Sequence[dict[str, Any]], abandoned: Collection[str]) -> list[int]:
    """reach[i]: the index of the last result answering a call made at i (or -1).

    A call without a result is pending (it blocks every boundary after it: its result
    may still come, and a result must never stay in the context without its call)
    unless it was abandoned: its run has closed (`abandoned`), or the user has spoken
    since. One abandoned call must not block compaction forever.
    """
    result_at: dict[str, int] = {}
    for i, m in enumerate(msgs):
        if m["role"] == "tool":
            result_at[m["tool_call_id"]] = i
    last_user = max((i for i, m in enumerate(msgs) if m["role"] == "user"), default=-1)
    reach = [-1] * len(msgs)
    for i, m in enumerate(msgs):
        for call in m.get("tool_calls") or ():
            r = result_at.get(call["id"])
            if r is None:
                r = -1 if (call["id"] in abandoned or last_user > i) else _PENDING
            reach[i] = max(reach[i], r)
    return reach


def valid_boundaries(msgs: Sequence[dict[str, Any]], abandoned: Collection[str] = ()) -> list[int]:
    """Every i in 1..len-1 where msgs[:i] may leave the context and msgs[i:] stays."""
    out: list[int] = []
    furthest = -1
    reach = _reach(msgs, abandoned)
    for i in range(1, len(msgs)):
        furthest = max(furthest, reach[i - 1])
        if furthest < i and msgs[i]["role"] != "tool":
            out.append(i)
    return out


def tail_boundary(
    msgs: Sequence[dict[str, Any]],
    *,
    keep: int,
    keep_tokens: int | None = None,
    force: bool = False,
    abandoned: Collection[str] = (),
    force_keep: int | None = None,
) -> int | None:
    """The index where the kept tail starts, or None when nothing can leave.

    Normal mode keeps about `keep` messages. Force mode (manual compaction) also works
    on short contexts: it keeps about `force_keep` messages (`keep` when not given), at
    most half of them, and keeps the latest user message when a boundary before it
    moves at least half as much; otherwise (one request, then a long tool chain) the
    request may leave too, so any context with a boundary can be compacted. With
    `keep_tokens`, a tail heavier than that moves forward.
    """
    n = len(msgs)
    candidates = valid_boundaries(msgs, abandoned)
    if force:
        kept = keep if force_keep is None else force_keep
        target = n - min(kept, max(1, n // 2))
        last_user = max((i for i, m in enumerate(msgs) if m["role"] == "user"), default=None)
        if last_user is not None:
            before_user = [i for i in candidates if i <= last_user]
            # a boundary that moves only a sliver would not pay for the summary
            if before_user and before_user[-1] >= target // 2:
                candidates = before_user
    else:
        target = n - keep
        if target <= 0:
            return None
    if not candidates:
        return None
    best = min(candidates, key=lambda i: (abs(i - target), i))
    if keep_tokens is not None:
        tokens = [int(m.get("tokens", 0)) for m in msgs]
        suffix = [0] * (n + 1)
        for i in range(n - 1, -1, -1):
            suffix[i] = suffix[i + 1] + tokens[i]
        if suffix[best] > keep_tokens:
            lighter = [i for i in candidates if i > best and suffix[i] <= keep_tokens]
            best = lighter[0] if lighter else candidates[-1]
    return best


def rebuild_boundary(
    msgs: Sequence[dict[str, Any]], boundary: int | None, tail_start_id: int | None
) -> int:
    """Where a rebuild's tail starts: where `tail_boundary` says, but never before the
    current tail's start. A rebuild re-derives the summary; bringing summarized messages
    back into the tail would make the context bigger."""
    current = next(
        (i for i, m in enumerate(msgs) if m["id"] >= (tail_start_id or 0)), len(msgs)
    )
    return max(boundary or 0, min(current, len(msgs) - 1))


def check_summary(summary: Summary, allowed_ids: set[int]) -> list[str]:
    """Reasons a summary must not be committed (empty list: it may)."""
    problems: list[str] = []
    for name, item in summary.items():
        if not item.text.strip():
            problems.append(f"an item in {name} has no text")
        if not item.sources:
            problems.append(f"item {item.text[:40]!r} in {name} cites no source")
        bad = [s for s in item.sources if s not in allowed_ids]
        if bad:
            problems.append(f"item {item.text[:40]!r} in {name} cites unknown ids {bad[:5]}")
    return problems


SUMMARY_HEADER = "Context carried over from earlier in this conversation."
PREAMBLES_TITLE = "Standing instructions, as the user last sent them (always apply):"


def render_summary_message(pins: Sequence[str], summary: Summary) -> str | None:
    """The one system message holding pins and summary; None when there are neither."""
    if not pins and summary.is_empty():
        return None
    parts = [SUMMARY_HEADER]
    if pins:
        parts.append("Pinned (always applies):\n" + "\n".join(f"- {p}" for p in pins))
    if summary.preambles:
        # what the front end sent as standing instructions stays word for word, as it
        # would if the agent resent it with this request
        parts.append(PREAMBLES_TITLE + "\n" + summary.render_preambles())
    if summary.item_count():
        # a small summary (a few short rules, a short context compacted by hand) gets a
        # short legend: the long one alone would cost more than the messages it replaces
        legend = (
            "Summary of earlier messages (#N: N-th message):\n"
            if summary.is_small()
            else "Summary of earlier messages (#N after an item: the N-th message of "
            "this conversation; [msg N]: an archive id; search_past_messages recalls the "
            "full text):\n"
        )
        parts.append(legend + summary.render())
    return "\n\n".join(parts)
