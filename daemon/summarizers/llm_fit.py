"""Fitting a model's answer: trimming text to a window, the constraints an answer
must keep, and cutting a valid answer that is still over the budget."""

from __future__ import annotations

from collections.abc import Callable

from ctxd.daemon.summarizers.llm_prompt import trim_middle
from ctxd.daemon.summary import Summary, SummaryItem, SummaryRequest

# What the budget gives up first when a valid answer is still too long after the
# retry: the same order as the built-in summarizer, current constraints last.
DROP_ORDER = ("tool_activity", "errors", "files", "decisions", "goals", "open_items")



# Room a retry adds to the conversation: the trimmed bad answer and the problems.
RETRY_RESERVE = 600
# Never fewer tokens of messages per request than this, whatever the window says.
MIN_ROOM = 256


def fit_text(text: str, room: int, count: Callable[[str], int]) -> str:
    """`text` trimmed in the middle until it counts at most `room` tokens."""
    limit = len(text)
    for _ in range(8):
        tokens = count(text)
        if tokens <= room:
            return text
        limit = max(40, int(min(limit, len(text)) * room / tokens * 0.9))
        text = trim_middle(text, limit)
    return text


def lost_constraints(
    anchor: Summary, sections: dict[str, list[SummaryItem]], request: SummaryRequest
) -> list[str]:
    """Current constraints of the anchor that no item cites any more.

    A user's rule dropped from the summary is the most harmful loss; the check is
    skipped when those constraints alone would take half the budget.
    """
    kept = [i for i in anchor.sections.get("constraints") or [] if i.status == "current"]
    if not kept:
        return []
    alone = Summary(sections={"constraints": kept}).render()
    if request.count_tokens(alone) * 2 > request.budget_tokens:
        return []
    cited = {s for items in sections.values() for item in items for s in item.sources}
    return [
        f"the previous summary's constraint {item.text[:60]!r} (sources {item.sources[:5]}) "
        "is missing: keep it with its sources"
        for item in kept
        if not set(item.sources) & cited
    ]


def newest_source(item: SummaryItem) -> int:
    return max(item.sources, default=0)


def fit_budget(
    sections: dict[str, list[SummaryItem]], request: SummaryRequest
) -> dict[str, list[SummaryItem]]:
    """Drop items, least important and oldest first, until the render fits."""
    out = {name: list(items) for name, items in sections.items()}
    order: list[tuple[str, SummaryItem]] = []
    for name in DROP_ORDER:
        order.extend((name, item) for item in sorted(out.get(name, []), key=newest_source))
    constraints = sorted(out.get("constraints", []), key=newest_source)
    order.extend(("constraints", i) for i in constraints if i.status != "current")
    order.extend(("constraints", i) for i in constraints if i.status == "current")
    for name, item in order:
        if request.count_tokens(Summary(sections=out).render()) <= request.budget_tokens:
            break
        out[name] = [i for i in out[name] if i is not item]
    return {name: items for name, items in out.items() if items}
