"""Items under construction: entries, deduplication, what supersedes what, shares."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from ctxd.daemon.summary import SECTIONS

from .cues import _FIRM_DECISION, _is_weak, _merge_sources, _norm, _subject

# What each kind of item may claim of an overfull summary, least important first. Rules
# the user set get the most room; a "make sure" sentence and the superseded history of
# a rule get little, because a model can work without them.
_SHARES: dict[str, float] = {
    "superseded": 0.015,
    "weak": 0.02,
    "tentative": 0.015,
    "tool_activity": 0.025,
    "errors": 0.025,
    "files": 0.04,
    "open_items": 0.03,
    "goals": 0.04,
    "specific": 0.04,
    "decisions": 0.10,
    "constraints": 0.70,
}

# A number standing on its own ("about 4679 records", "30 seconds"), not part of a name
# or a path ("p99", "mod_5.py", "eu-west-1").
_QUANTITY = re.compile(r"(?<![\w./:-])\d+(?:[.,]\d+)*(?![\w/-]|[.,:]\w)", re.ASCII)


def _share_class(e: _Entry) -> str:
    if e.section == "decisions":
        return "tentative" if e.weak else "decisions"
    if e.section == "goals":
        # A request that states a quantity (a size, a limit, a budget) holds a detail the
        # model cannot get back elsewhere; plain requests are replaced by newer ones.
        return "goals" if e.weak else "specific"
    if e.section != "constraints":
        return e.section
    if e.status != "current":
        return "superseded"
    return "weak" if e.weak else "constraints"


# ------------------------------------------------------------------------- draft


@dataclass(eq=False)
class _Entry:
    section: str
    text: str
    sources: list[int]
    seq: int
    status: str = "current"
    terms: frozenset[str] = frozenset()
    values: frozenset[str] = frozenset()
    # the lesser kind of its section, the first to go under the budget (_share_class): a
    # constraint whose only cue is "make sure", a decision that names no choice, a
    # request without a quantity
    weak: bool = False

    def recency(self) -> tuple[int, int]:
        # Sources are kept sorted (_merge_sources), so the last is the most recent.
        return (self.sources[-1] if self.sources else -1, self.seq)


class _Draft:
    """Items under construction, deduplicated per section by normalised text."""

    def __init__(self, pins: list[str], max_sources: int) -> None:
        self.sections: dict[str, list[_Entry]] = {name: [] for name in SECTIONS}
        self._by_key: dict[tuple[str, str], _Entry] = {}
        # rules by their subject words, for restatements with a new value
        self._by_terms: dict[frozenset[str], list[_Entry]] = {}
        self._pins = [k for k in (_norm(p) for p in pins if isinstance(p, str)) if k]
        self._max_sources = max_sources
        self._seq = 0

    def _pinned(self, key: str) -> bool:
        # Near-equal only: a file item "app.py" is not a copy of the pin "never edit app.py".
        for pin in self._pins:
            short, long = (key, pin) if len(key) <= len(pin) else (pin, key)
            if short in long and len(short) >= 0.8 * len(long):
                return True
        return False

    def add(
        self, section: str, text: str, sources: Iterable[int], status: str = "current"
    ) -> _Entry | None:
        text = text.strip()
        src = list(sources)
        key = _norm(text)
        if not key or self._pinned(key):
            return None
        existing = self._by_key.get((section, key))
        if existing is not None:
            existing.sources = _merge_sources(existing.sources, src, self._max_sources)
            # Repeating an instruction makes it current again even if it was corrected.
            if status == "current":
                existing.status = "current"
            return existing
        self._seq += 1
        entry = _Entry(
            section=section,
            text=text,
            sources=_merge_sources(src, (), self._max_sources),
            seq=self._seq,
            status=status,
        )
        if section == "constraints":
            entry.terms, entry.values = _subject(text)
            entry.weak = _is_weak(text)
            self._by_terms.setdefault(entry.terms, []).append(entry)
        elif section == "decisions":
            entry.weak = not _FIRM_DECISION.search(text)
        elif section == "goals":
            entry.weak = _QUANTITY.search(text) is None
        self.sections[section].append(entry)
        self._by_key[(section, key)] = entry
        return entry

    def supersede(self, new: _Entry, message_id: int, *, correction: bool) -> None:
        """Mark the earlier instructions `new` replaces as superseded.

        A correction replaces the instruction it matches best, not every one it resembles:
        "the ledger client should retry 2 times" shares most words with the catalog
        client's retry rule, but all of them with the ledger's own. The best match may
        be one already superseded (a second correction of the ledger's retries); then
        only the current instructions that match as well go. An instruction without a
        correction cue replaces only one with the same words and another value ("Set
        the timeout to 30 seconds" after "Set the timeout to 20 seconds").
        """
        if not new.terms or not (correction or new.values):
            return
        candidates = (
            self.sections["constraints"] if correction else self._by_terms.get(new.terms, ())
        )
        scored: list[tuple[float, _Entry]] = []
        for entry in candidates:
            if entry is new:
                continue
            # Sentences of the same message are read together, not as a correction chain.
            if entry.sources and entry.sources[-1] >= message_id:
                continue
            if correction:
                score = _similarity(entry, new)
            elif entry.terms == new.terms and entry.values and new.values:
                score = 0.0 if entry.values == new.values else 1.0
            else:
                continue
            if score >= 0.5:
                scored.append((score, entry))
        if not scored:
            return
        best = max(score for score, _ in scored)
        for score, entry in scored:
            if score >= best - 0.01:
                entry.status = "superseded"


@dataclass
class _Call:
    name: str
    args: str
    sources: list[int]
    call_id: str | None
    outcome: str = "no result yet"
    paths: list[str] = field(default_factory=list)



def _similarity(old: _Entry, new: _Entry) -> float:
    """How surely `new` speaks about the same setting as `old` (0: not at all)."""
    shared = len(old.terms & new.terms)
    if not shared:
        return 0.0
    score = shared / min(len(old.terms), len(new.terms))
    # "use port 9090 instead of 8080" names the value it replaces next to its own; one
    # shared value alone ("retry 11 times" twice) is a coincidence, not a reference.
    if score >= 0.5 and old.values & new.values and new.values - old.values:
        score += 0.5
    return score


