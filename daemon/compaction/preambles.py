"""Instruction preambles carried verbatim past the tail.

Codex resends AGENTS.md, Claude Code CLAUDE.md, with every request: the rules in them
apply for the whole session. When a front end sent one as a user message and that
message leaves the tail, the summary message carries it word for word instead (the
latest copy of each: the same preamble sent again is one, a new version replaces the
old), outside the summary's budget. The message was in the model input already, so
this never makes a compaction grow it; a preamble longer than
`instructions_max_tokens` is kept up to that bound, with a note that the rest is in
the message it cites.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ctxd.daemon.messages import content_text
from ctxd.daemon.summarizers.boilerplate import preambles, repeats
from ctxd.daemon.summary import Summary, SummaryItem

# sources kept per preamble: where it was first sent and where last
_MAX_SOURCES = 2


def bounded(text: str, max_tokens: int, count: Callable[[str], int]) -> str:
    """`text`, or as many of its first lines as fit `max_tokens` and a note on the rest
    (the pointer of the preamble names the message that holds it whole)."""
    if count(text) <= max_tokens:
        return text
    lines = text.split("\n")
    lo, hi = 0, len(lines)  # the longest prefix that fits has lo lines
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count("\n".join(lines[:mid])) <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    rest = len(lines) - lo
    return "\n".join(lines[:lo]) + (
        f"\n[… {rest} more line{'s' if rest != 1 else ''} of it: the message above holds it "
        "whole, search_past_messages recalls it]"
    )


def carry(
    previous: Iterable[SummaryItem],
    leaving: Iterable[dict[str, Any]],
    max_tokens: int,
    count: Callable[[str], int],
) -> list[SummaryItem]:
    """The preambles the next summary carries: `previous`, then those of the user
    messages in `leaving`, oldest first; a later copy of a preamble replaces the earlier
    one (an identical copy cites both messages)."""
    by_key: dict[str, SummaryItem] = {(p.subject or p.text): p for p in previous}
    for m in leaving:
        if m.get("role") != "user" or m.get("id") is None:
            continue
        for pre in preambles(content_text(m.get("content"))):
            text = bounded(pre.text, max_tokens, count)
            old = by_key.pop(pre.key, None)
            sources = [int(m["id"])]
            if old is not None and old.text == text:
                sources = [*old.sources, *sources][-_MAX_SOURCES:]
            # re-inserted: the order is that of the latest copies
            by_key[pre.key] = SummaryItem(text=text, sources=sources, subject=pre.key)
    return list(by_key.values())


def plan(
    max_tokens: int,
    current: Summary,
    previous: Summary,
    leaving: list[dict[str, Any]],
    staying: list[dict[str, Any]],
    departing: int,
    count: Callable[[str], int],
) -> tuple[list[SummaryItem], int, int]:
    """What a compaction carries, and how it counts: the preambles of the new summary
    (none when `max_tokens` is 0: their rules are then filed as any other), the tokens
    the current summary message spends on its own, and the tokens of what leaves the
    context (`departing`) less what the new preambles add, since they move into the
    summary message whole instead of being summarized: the summary's share is
    counted on the rest. A preamble sent again in the messages `staying` in the tail is
    not carried: the model reads its latest copy there, once (it is carried again when
    that message leaves)."""
    kept = carry(previous.preambles, leaving, max_tokens, count) if max_tokens > 0 else []
    if kept:
        resent = {p.key for m in staying if m.get("role") == "user"
                  for p in preambles(content_text(m.get("content")))}
        kept = [p for p in kept if p.subject not in resent]
    carried = tokens_of(current, count)
    added = max(0, tokens_of(Summary(preambles=kept), count) - carried)
    return kept, carried, max(0, departing - added)


def tokens_of(summary: Summary, count: Callable[[str], int]) -> int:
    """Tokens the preambles take in the summary message (0 without any)."""
    if not summary.preambles:
        return 0
    return count(summary.render_preambles()) + 12  # the title line and the joins


def drop_repeated(summary: Summary) -> None:
    """Remove the constraint items of `summary` that only repeat a preamble line it
    carries (a summarizer that did not know of the preambles wrote them)."""
    if not summary.preambles:
        return
    said = repeats([p.text for p in summary.preambles])
    items = summary.sections.get("constraints")
    if items:
        kept = [i for i in items if not (i.status == "current" and said(i.text))]
        if kept:
            summary.sections["constraints"] = kept
        else:
            del summary.sections["constraints"]
