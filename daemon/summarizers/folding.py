"""Requests of one shape fold into one line with their range.

An agent driven by a script gets "Step 74: please check module m74.py and run its
tests." and seventy-five more like it. Each is a request, and together they say one
thing: "Steps 74–149: check module mN.py and run its tests (76 requests)". The shape is
the request with its numbers taken out; the line keeps the range and the count, and its
sources the first and the latest request. A folded line read back from the previous
summary keeps folding the requests that follow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ctxd.daemon.summarizers.cues import _merge_sources, _norm
from ctxd.daemon.summarizers.draft import _Draft, _Entry
from ctxd.daemon.summarizers.sentences import SERIES

_DIGITS = re.compile(r"\d+")
# sentences two requests share to be one text sent twice
_RESENT_SHARED = 3
_LEAD = re.compile(r"^\W*(?:(?:please|pls|kindly)\b\s*,?\s*|请)", re.IGNORECASE)
# what a folded line looks like, so the next compaction can extend it
_FOLDED_EN = re.compile(
    r"^(?P<word>[A-Z][a-z]+) (?P<lo>\d+)–(?P<hi>\d+): (?P<body>.+) \((?P<n>\d+) requests\)$"
)
_FOLDED_ZH = re.compile(
    r"^第 (?P<lo>\d+)–(?P<hi>\d+) (?P<word>\S)：(?P<body>.+)（共 (?P<n>\d+) 条请求）$"
)
_FOLDED_BARE = re.compile(r"^(?P<body>.+) \(N = (?P<lo>\d+)–(?P<hi>\d+), (?P<n>\d+) requests\)$")
_FOLDED_BARE_ZH = re.compile(r"^(?P<body>.+)（N = (?P<lo>\d+)–(?P<hi>\d+)，共 (?P<n>\d+) 条请求）$")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")


@dataclass
class _Shape:
    key: str  # the request with every number replaced
    word: str | None  # the series label: "Step", "步"
    zh: bool  # a Chinese label: "第 N 步"
    number: int | None  # the number that varies
    body: str  # the request, its own number written as N


def shape_of(text: str) -> _Shape | None:
    """The shape of a request, or None when it has no number to vary over."""
    m = SERIES.match(text)
    word: str | None = None
    zh = False
    number: int | None = None
    body = text
    if m:
        body = text[m.end() :]
        if m.group("word"):
            word, number = m.group("word").capitalize(), int(m.group("n"))
        else:
            word, number, zh = m.group("zw"), int(m.group("zn")), True
    body = _LEAD.sub("", body).strip()
    if body[:1].isalpha() and body[:1].isupper() and body[1:2].islower():
        body = body[0].lower() + body[1:]
    body = body.rstrip(" .。!！")
    if number is None:
        first = _DIGITS.search(body)
        if first is None:
            return None
        number = int(first.group(0))
    if not body:
        return None
    own = str(number)
    body = re.sub(rf"(?<!\d){own}(?!\d)", "N", body)
    key = f"{word or ''}|{zh}|" + _DIGITS.sub("#", _norm(body))
    return _Shape(key, word, zh, number, body)


def _parse_folded(text: str) -> tuple[_Shape, int, int, int] | None:
    for pattern, zh in (
        (_FOLDED_EN, False), (_FOLDED_ZH, True), (_FOLDED_BARE, False), (_FOLDED_BARE_ZH, False)
    ):
        m = pattern.match(text)
        if m:
            word = m.groupdict().get("word")
            if word and not zh:
                # back from the plural the line was written with
                word = word[:-2] if word.endswith(("ches", "shes", "xes", "sses")) else word[:-1]
            body = m.group("body")
            shape = _Shape(
                f"{word or ''}|{zh}|" + _DIGITS.sub("#", _norm(body)), word, zh, None, body
            )
            return shape, int(m.group("lo")), int(m.group("hi")), int(m.group("n"))
    return None


@dataclass
class _Fold:
    entry: _Entry
    shape: _Shape
    lo: int
    hi: int
    count: int

    def render(self) -> str:
        s = self.shape
        span = f"{self.lo}–{self.hi}"
        if s.zh:
            return f"第 {span} {s.word}：{s.body}（共 {self.count} 条请求）"
        if s.word:
            plural = s.word + ("es" if s.word.endswith(("ch", "sh", "x", "s")) else "s")
            return f"{plural} {span}: {s.body} ({self.count} requests)"
        if _CJK.search(s.body):
            return f"{s.body}（N = {span}，共 {self.count} 条请求）"
        return f"{s.body} (N = {span}, {self.count} requests)"


class Folds:
    """Goals of one shape, as one entry of the draft per shape."""

    def __init__(self) -> None:
        self._by_key: dict[str, _Fold] = {}
        # the sentences of each request kept, to know a text sent again
        self._sent: list[tuple[frozenset[str], _Entry]] = []

    def _resent(self, draft: _Draft, sentences: list[str]) -> _Entry | None:
        """The goal a request repeats: the same pasted text sent again after an
        interrupt, with another lead-in ("这是今天的报告：…", then the report alone).
        At least three sentences in common, and half of the shorter request's."""
        own = frozenset(k for k in (_norm(x) for x in sentences) if len(k) >= 2)
        if len(own) < _RESENT_SHARED:
            return None
        for seen, entry in self._sent:
            shared = len(seen & own)
            if (shared >= _RESENT_SHARED and 2 * shared >= min(len(seen), len(own))
                    and entry in draft.sections["goals"]):
                return entry
        return None

    def load(self, draft: _Draft) -> None:
        """Take up the goals the previous summary left, folded or single."""
        for entry in draft.sections["goals"]:
            parsed = _parse_folded(entry.text)
            if parsed is not None:
                shape, lo, hi, n = parsed
                self._by_key[shape.key] = _Fold(entry, shape, lo, hi, n)
                continue
            single = shape_of(entry.text)
            if single is not None and single.number is not None:
                self._by_key.setdefault(
                    single.key, _Fold(entry, single, single.number, single.number, 1)
                )

    def add(
        self, draft: _Draft, text: str, mid: int, *, unconfirmed: bool = False,
        sentences: list[str] | None = None,
    ) -> _Entry | None:
        if sentences:
            again = self._resent(draft, sentences)
            if again is not None:
                again.sources = _merge_sources(again.sources, [mid], draft._max_sources)
                return again
            entry = self._add(draft, text, mid, unconfirmed=unconfirmed)
            if entry is not None:
                self._sent.append(
                    (frozenset(k for k in (_norm(x) for x in sentences) if len(k) >= 2), entry)
                )
            return entry
        return self._add(draft, text, mid, unconfirmed=unconfirmed)

    def _add(
        self, draft: _Draft, text: str, mid: int, *, unconfirmed: bool = False
    ) -> _Entry | None:
        shape = shape_of(text)
        fold = self._by_key.get(shape.key) if shape is not None else None
        if shape is None or shape.number is None:
            return draft.add("goals", text, [mid], unconfirmed=unconfirmed)
        if fold is None or fold.entry not in draft.sections["goals"]:
            entry = draft.add("goals", text, [mid], unconfirmed=unconfirmed)
            if entry is not None:
                self._by_key[shape.key] = _Fold(entry, shape, shape.number, shape.number, 1)
            return entry
        if mid in fold.entry.sources:
            return fold.entry
        if fold.count == 1 and fold.lo == shape.number:
            # the same request again, not a series: one item citing both
            return draft.add("goals", text, [mid], unconfirmed=unconfirmed)
        if fold.shape.body != shape.body:
            # the requests differ in more than their own number: every number varies
            fold.shape.body = _DIGITS.sub("N", fold.shape.body)
        fold.lo = min(fold.lo, shape.number)
        fold.hi = max(fold.hi, shape.number)
        fold.count += 1
        entry = fold.entry
        old_key = ("goals", _norm(entry.text))
        entry.text = fold.render()
        entry.sources = _merge_sources(entry.sources, [mid], draft._max_sources)
        entry.unconfirmed = entry.unconfirmed or unconfirmed
        # the draft finds entries by their text; the folded line is the text now
        if draft._by_key.get(old_key) is entry:
            del draft._by_key[old_key]
        draft._by_key[("goals", _norm(entry.text))] = entry
        return entry
