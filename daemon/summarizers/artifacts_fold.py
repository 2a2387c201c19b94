"""Artifacts the budget leaves out are counted, not lost without a trace.

Fitting (fit.py) may drop the oldest artifacts of an overfull summary. Each one dropped
is added to the count line ("+N earlier artifacts not listed"), so the model knows the
archive holds more; the count line takes the place of the oldest listed ones, never
more room than they had.
"""

from __future__ import annotations

from collections.abc import Callable

from ctxd.daemon.summarizers.cues import _merge_sources
from ctxd.daemon.summarizers.draft import (
    FOLDED_ARTIFACTS,
    _Draft,
    folded_count,
    folded_text,
)
from ctxd.daemon.summary import SummaryItem


def fold_unlisted(
    draft: _Draft,
    sections: dict[str, list[SummaryItem]],
    count_tokens: Callable[[str], int],
    max_sources: int,
) -> None:
    """Count the draft's artifacts that `sections` no longer lists on its count line."""
    listed = sections.get("artifacts")
    if not listed:
        return  # nothing of the section fit: the budget has no room for a count either
    kept = {item.subject for item in listed}
    fold = next((i for i in listed if i.subject == FOLDED_ARTIFACTS), None)
    dropped = [
        e for e in draft.sections["artifacts"]
        if e.subject not in kept and e.subject != FOLDED_ARTIFACTS
    ]
    if not dropped:
        return
    items = [i for i in listed if i is not fold]
    # the draft's count line holds what earlier compactions folded, listed or not
    before = next((e for e in draft.sections["artifacts"] if e.subject == FOLDED_ARTIFACTS), None)
    n = (folded_count(before.text) if before is not None else 0) + len(dropped)
    sources = [s for e in dropped for s in e.sources]
    if before is not None:
        sources += before.sources
    room = count_tokens(f"- {fold.text}") if fold is not None else 0
    # the oldest listed lines give way until the count line fits in their room
    while True:
        text = folded_text(n)
        if count_tokens(f"- {text}") <= room or not items:
            break
        gone = items.pop()
        room += count_tokens(f"- {gone.text}")
        sources += gone.sources
        n += 1
    if count_tokens(f"- {text}") > room:
        return  # not even every line of the section makes room for it
    merged = _merge_sources([], sources, max_sources)
    items.append(SummaryItem(text=text, sources=merged, subject=FOLDED_ARTIFACTS))
    sections["artifacts"] = items
