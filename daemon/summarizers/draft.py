"""Items under construction: entries, deduplication, what supersedes what, shares."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ctxd.daemon.summarizers.cues import (
    _FIRM_DECISION,
    _is_weak,
    _key_terms,
    _merge_sources,
    _norm,
    _subject,
)
from ctxd.daemon.summarizers.sentences import bare_claim
from ctxd.daemon.summarizers.settings import (
    Setting,
    changes_value,
    other_parts,
    same_subject,
    setting_of,
    value_kind,
)
from ctxd.daemon.summary import SECTIONS

# What each kind of item may claim of an overfull summary, least important first. Rules
# the user set get the most room; a "make sure" sentence and the superseded history of
# a rule get little, because a model can work without them.
_SHARES: dict[str, float] = {
    "superseded": 0.015,
    "weak": 0.02,
    "tentative": 0.015,
    "tool_activity": 0.025,
    "errors": 0.025,
    "files": 0.03,
    "open_items": 0.03,
    "goals": 0.04,
    "specific": 0.04,
    "artifacts": 0.12,
    "decisions": 0.10,
    "constraints": 0.60,
}

# the subject of the line that counts the artifacts no longer listed
FOLDED_ARTIFACTS = "artifacts:earlier"
_FOLDED_COUNT = re.compile(r"^\+(\d+) earlier artifacts")


def folded_text(n: int) -> str:
    return f"+{n} earlier artifacts not listed (search_past_messages finds them)"


def folded_count(text: str) -> int:
    m = _FOLDED_COUNT.match(text)
    return int(m.group(1)) if m else 0


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
    unconfirmed: bool = False
    # a constraint or decision that sets a value: what it sets, to what
    setting: Setting | None = None
    # the value this one replaced ("(was X)"); for an artifact, the path or id it names
    was: str | None = None
    subject: str | None = None

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
        # rules by each of their subject words, for corrections
        self._by_term: dict[str, list[_Entry]] = {}
        # settings by the terms of their subject
        self._settings: dict[str, list[_Entry]] = {}
        # archive id of a superseded statement -> id of the statement that replaced it
        self.supersessions: dict[int, int] = {}

    def _pinned(self, key: str) -> bool:
        # Near-equal only: a file item "app.py" is not a copy of the pin "never edit app.py".
        for pin in self._pins:
            short, long = (key, pin) if len(key) <= len(pin) else (pin, key)
            if short in long and len(short) >= 0.8 * len(long):
                return True
        return False

    def add(
        self,
        section: str,
        text: str,
        sources: Iterable[int],
        status: str = "current",
        *,
        unconfirmed: bool = False,
        was: str | None = None,
        subject: str | None = None,
    ) -> _Entry | None:
        """`subject`: what an item of the previous summary set, for a statement that
        does not name it ("Make it 2000.")."""
        text = text.strip()
        if unconfirmed:
            # shown with an unconfirmed mark: a clause that only repeats the hedge goes
            text = bare_claim(text)
        src = list(sources)
        key = _norm(text)
        if not key or self._pinned(key):
            return None
        existing = self._by_key.get((section, key))
        if existing is not None:
            existing.sources = _merge_sources(existing.sources, src, self._max_sources)
            # Repeating an instruction makes it current again even if it was corrected;
            # its earlier statements are then no longer superseded (by anything, and
            # least of all by this repeat of them).
            if status == "current":
                if existing.status != "current":
                    for old in existing.sources:
                        self.supersessions.pop(old, None)
                existing.status = "current"
            existing.unconfirmed = existing.unconfirmed or unconfirmed
            return existing
        self._seq += 1
        entry = _Entry(
            section=section,
            text=text,
            sources=_merge_sources(src, (), self._max_sources),
            seq=self._seq,
            status=status,
            unconfirmed=unconfirmed,
            was=was,
        )
        if section == "constraints":
            entry.terms, entry.values = _subject(text)
            entry.weak = _is_weak(text)
            entry.setting = setting_of(text, True)
            self._by_terms.setdefault(entry.terms, []).append(entry)
            for term in entry.terms:
                self._by_term.setdefault(term, []).append(entry)
        elif section == "decisions":
            entry.weak = not _FIRM_DECISION.search(text)
            entry.setting = setting_of(text, True)
        if entry.setting is not None and not entry.setting.terms and subject:
            entry.setting = _with_subject(entry.setting, subject)
        elif section == "goals":
            entry.weak = _QUANTITY.search(text) is None
        if entry.setting is not None:
            for term in entry.setting.terms:
                self._settings.setdefault(term, []).append(entry)
        self.sections[section].append(entry)
        self._by_key[(section, key)] = entry
        return entry

    def add_artifact(self, target: str, text: str, sources: Iterable[int]) -> None:
        """An artifact by the path or id it names: a later operation on it replaces the
        text ("created x" then "edited x") and makes it the most recent."""
        src = list(sources)
        key = ("artifacts", "\0" + target)
        entry = self._by_key.get(key)
        self._seq += 1
        if entry is None:
            entry = _Entry("artifacts", text, [], self._seq, subject=target)
            self.sections["artifacts"].append(entry)
            self._by_key[key] = entry
        elif not (text.startswith("created ") and entry.text.startswith("edited ")):
            entry.text = text
        entry.seq = self._seq
        entry.sources = _merge_sources(entry.sources, src, self._max_sources)

    def fold_artifacts(self, keep: int) -> None:
        """Keep the `keep` most recent artifacts; the older ones become a count on one
        line (the archive still has them), so none is lost without a trace."""
        entries = [e for e in self.sections["artifacts"] if e.subject != FOLDED_ARTIFACTS]
        fold = self._by_key.get(("artifacts", "\0" + FOLDED_ARTIFACTS))
        if fold is not None:
            fold.seq = 0  # it stands for the oldest, whatever its sources say
        if len(entries) <= keep:
            return
        entries.sort(key=_Entry.recency)
        self.fold_into([e for e in entries[: len(entries) - keep]])

    def fold_into(self, old: list[_Entry]) -> _Entry:
        """Fold `old` artifacts into the count line; return that line."""
        key = ("artifacts", "\0" + FOLDED_ARTIFACTS)
        fold = self._by_key.get(key)
        if fold is None:
            fold = _Entry("artifacts", folded_text(0), [], 0, subject=FOLDED_ARTIFACTS)
            self.sections["artifacts"].append(fold)
            self._by_key[key] = fold
        gone = {id(e) for e in old if e is not fold}
        sources = [s for e in old if id(e) in gone for s in e.sources]
        fold.text = folded_text(folded_count(fold.text) + len(gone))
        fold.sources = _merge_sources(fold.sources, sources, self._max_sources)
        fold.seq = 0
        self.sections["artifacts"] = [e for e in self.sections["artifacts"] if id(e) not in gone]
        for e in old:
            if id(e) in gone:
                self._by_key.pop(("artifacts", "\0" + (e.subject or e.text)), None)
        return fold

    def confirm(self, sentence: str, last: _Entry | None) -> None:
        """A confirmation ("confirmed: ...", "已确认") clears the hedge of what it names,
        or of the item just before it when it names nothing ("I confirmed that")."""
        terms = _key_terms(sentence)
        if last is not None and len(terms) <= 2:
            last.unconfirmed = False
            return
        for section in ("constraints", "decisions", "goals"):
            for entry in self.sections[section]:
                if entry.unconfirmed:
                    own = _key_terms(entry.text)
                    if own and len(own & terms) >= 0.6 * len(own):
                        entry.unconfirmed = False

    def supersede_setting(self, new: _Entry, message_id: int) -> None:
        """A later value for the same subject supersedes the earlier one, whatever the
        wording: "raise the batch size to 2000" after "batch size 500", "改到周二上午".
        A current setting goes when its subject is (almost) all in the new one's and
        its value differs. The same value again, a numbered series ("turn 52", "turn
        53") and another subject ("upload retries", "download retries") replace nothing."""
        if new.setting is None or new.status != "current":
            return
        if new.unconfirmed:
            # a guess replaces no value, not even an earlier guess on the same subject:
            # both stay, each with its hedge, until one is confirmed
            return
        if not new.setting.terms:
            self._supersede_elided(new, message_id)
            return
        # only settings sharing enough of the subject's terms are scored: a bulk batch
        # holds hundreds, and comparing each new one with all of them would be quadratic
        shared: dict[int, int] = {}
        by_id: dict[int, _Entry] = {}
        for term in new.setting.terms:
            for entry in self._settings.get(term, ()):
                shared[id(entry)] = shared.get(id(entry), 0) + 1
                by_id[id(entry)] = entry
        n = len(new.setting.terms)
        scored: list[_Entry] = []
        for key, count in shared.items():
            entry = by_id[key]
            setting = entry.setting
            if entry is new or setting is None or entry.status != "current":
                continue
            if count < 0.4 * min(n, len(setting.terms)):
                continue
            if entry.sources and entry.sources[-1] >= message_id:
                continue
            if not changes_value(setting, new.setting):
                continue  # the same value again: a restatement, not an update
            # every current value of the subject goes, not only the closest wording:
            # two phrasings of it may both be current when a third one comes
            if same_subject(setting, new.setting) >= 0.9:
                scored.append(entry)
        for entry in sorted(scored, key=_Entry.recency):
            self._retire(entry, new)

    def _supersede_elided(self, new: _Entry, message_id: int) -> None:
        """"Make it 2000.", "No, 4.", "改成 200。": no subject of its own, so it is about
        the setting stated last, when that holds a value of the same kind."""
        assert new.setting is not None
        kinds = {value_kind(v) for v in new.setting.values}
        last: _Entry | None = None
        for section in ("constraints", "decisions"):
            for entry in self.sections[section]:
                if (
                    entry is not new
                    and entry.setting is not None
                    and entry.setting.terms
                    and entry.sources
                    and entry.sources[-1] < message_id
                    and (last is None or entry.recency() > last.recency())
                ):
                    last = entry
        if last is None or last.status != "current" or last.setting is None:
            return
        if not kinds & {value_kind(v) for v in last.setting.values}:
            return
        if not changes_value(last.setting, new.setting):
            return
        old = last.setting
        # the new statement takes the subject over, so later values of it find it
        new.setting = Setting(
            old.terms, new.setting.values, new.setting.old, old.order, old.label, old.ids
        )
        for term in old.terms:
            self._settings.setdefault(term, []).append(new)
        self._retire(last, new)
        # "Make it 2000. (was export batch 500)": the text alone does not say of what
        if new.was and old.label:
            new.was = f"{old.label} {new.was}"

    def _retire(self, old: _Entry, new: _Entry) -> None:
        was_current = old.status == "current"
        if was_current and old.setting is not None:
            # "(was X)": the value it replaces, unless the new text names it already
            gone = sorted(old.setting.values - (new.setting.values if new.setting else set()))
            gone = [_as_written(v, old.text) for v in gone if v not in new.text.casefold()]
            if gone:
                new.was = ", ".join(gone[:2])
        old.status = "superseded"
        if new.sources:
            for src in old.sources:
                self.supersessions[src] = new.sources[-1]
        if was_current and old.setting is not None and old.section == "constraints":
            # what else the old statement said still holds, as its own item
            for part in other_parts(old.text, old.setting):
                self.add("constraints", part, old.sources, unconfirmed=old.unconfirmed)

    def supersede(self, new: _Entry, message_id: int, *, correction: bool) -> bool:
        """Mark the earlier instructions a correction replaces as superseded.

        Only a value that changes is a correction: both statements set something (a
        number, a day, a named choice, an owner), of the same subject, to different
        values. A correction replaces the instruction it matches best, not every one it
        resembles: "the ledger client should retry 2 times" shares most words with the
        catalog client's retry rule, but all of them with the ledger's own. The best
        match may be one already superseded (a second correction of the ledger's
        retries); then only the current instructions that match as well go. Without a
        correction cue the setting match (`supersede_setting`) decides alone.
        """
        if not correction or new.setting is None or not new.setting.terms or not new.terms:
            return False
        # the rules sharing a word with it: a correction matches nothing else
        found: dict[int, _Entry] = {}
        for term in new.terms:
            for entry in self._by_term.get(term, ()):
                found.setdefault(id(entry), entry)
        scored: list[tuple[float, _Entry]] = []
        for entry in sorted(found.values(), key=lambda e: e.seq):
            if entry is new or entry.setting is None:
                continue
            # Sentences of the same message are read together, not as a correction chain.
            if entry.sources and entry.sources[-1] >= message_id:
                continue
            old = entry.setting
            if old.ids and new.setting.ids and old.ids != new.setting.ids:
                continue  # "turn 53" after "turn 52": the next task, not a correction
            if not changes_value(old, new.setting):
                if entry.status != "current" and old.values <= new.setting.values:
                    # an older value set again: that statement is no longer superseded
                    for src in entry.sources:
                        self.supersessions.pop(src, None)
                continue
            # the cue lets fewer words name the subject, not other words: "solved X
            # by using Y instead" is no correction of a rule that merely shares two
            if same_subject(old, new.setting) < 0.5:
                continue
            score = _similarity(entry, new)
            if score >= 0.5:
                scored.append((score, entry))
        if not scored:
            return False
        best = max(score for score, _ in scored)
        retired = False
        for score, entry in scored:
            if score >= best - 0.01:
                retired = retired or entry.status == "current"
                self._retire(entry, new)
        # only what was current counts: an older value of the subject found again
        # leaves the current one to the setting match
        return retired


@dataclass
class _Call:
    name: str
    args: str
    sources: list[int]
    call_id: str | None
    outcome: str = "no result yet"
    paths: list[str] = field(default_factory=list)
    raw: Any = None  # the parsed arguments, for the artifacts the call produced



def _with_subject(setting: Setting, subject: str) -> Setting:
    """A setting that names no subject, given the one it was found to be about."""
    named = setting_of(f"{subject} {' '.join(sorted(setting.values))}", True)
    if named is None or not named.terms:
        return setting
    return Setting(named.terms, setting.values, setting.old, named.order, subject, named.ids)


def _as_written(value: str, text: str) -> str:
    """A value as the statement wrote it ("Alice", "Thursday"); values are compared
    case-folded."""
    at = text.casefold().find(value)
    if at < 0 or len(text.casefold()) != len(text):
        return value
    return text[at : at + len(value)]


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


