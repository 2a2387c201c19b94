"""Guesses shown compactly: several hedged items of a section on one line.

Each hedged item costs its unconfirmed mark, a list dash, a newline and a pointer; in
Chinese that is about 10 of the 25 tokens of a short guess. Guesses kept side by side
share one line and one mark instead, each still followed by the `#N` of the message it
came from: "- [unconfirmed] A #12; B #40; C #57", "- [推测] 甲 #12;乙 #40;丙 #57" (a
Chinese guess's full stop left out: the pointer ends it). The next compaction reads such a line back
as the separate guesses it was made of, so each is kept or dropped on its own.
"""

from __future__ import annotations

import re

from ctxd.daemon.summarizers.cues import _CJK_RUN, _trim
from ctxd.daemon.summary import SummaryItem

# guesses per line: enough to save most marks, few enough to stay readable
GUESSES_PER_LINE = 8
# between two guesses on a line: the first one's pointer, then a separator (without
# the space in Chinese, where it costs a token of its own)
_JOINT = re.compile(r" #\d+; ?")
_POINTER = re.compile(r" #(\d+); ?")
# the full stop a Chinese guess ends in: its pointer and the separator end it as well,
# and on a line of twenty guesses the stops are a guess's worth of tokens
_CJK_STOP = "。"


def _cjk(text: str) -> bool:
    return _CJK_RUN.search(text) is not None


def _joinable(item: SummaryItem, ordinals: dict[int, int]) -> bool:
    return (
        item.unconfirmed
        and item.status == "current"
        and not item.was
        and bool(item.sources)
        and all(s in ordinals for s in item.sources)
        and _JOINT.search(item.text) is None
    )


def join_guesses(items: list[SummaryItem], ordinals: dict[int, int]) -> list[SummaryItem]:
    """`items` with its hedged single-source items joined, up to GUESSES_PER_LINE a line,
    each line where the first of its guesses was."""
    out: list[SummaryItem] = []
    line: SummaryItem | None = None
    count = 0
    for item in items:
        if not _joinable(item, ordinals):
            out.append(item)
            continue
        # the mark is written in the script of the text ("[推测]" or "[unconfirmed]"):
        # guesses of the other script start a line of their own
        if line is None or count >= GUESSES_PER_LINE or _cjk(item.text) != _cjk(line.text):
            line = SummaryItem(text=item.text, sources=list(item.sources), unconfirmed=True,
                               subject=item.subject, origin=item.origin)
            out.append(line)
            count = 1
            continue
        if _cjk(item.text):
            head = line.text.removesuffix(_CJK_STOP)
            line.text = f"{head} #{ordinals[line.sources[-1]]};{item.text.removesuffix(_CJK_STOP)}"
        else:
            line.text = f"{line.text} #{ordinals[line.sources[-1]]}; {item.text}"
        # a guess stated in several messages brings all of them: the pointer after it
        # names the last, and reading the line back splits the sources there
        line.sources.extend(item.sources)
        line.subject = None
        count += 1
    return out


def split_guesses(
    item: SummaryItem, ordinals: dict[int, int] | None = None
) -> list[tuple[str, list[int]]]:
    """The guesses a joined line holds, each with its own messages; any other item as
    it is. A guess of several messages is told apart by its pointer, the ordinal of
    the last of them (`ordinals`: the summary's, archive id -> ordinal)."""
    if not item.unconfirmed:
        return [(item.text, list(item.sources))]
    parts = _JOINT.split(item.text)
    if len(parts) < 2:
        return [(item.text, list(item.sources))]
    if len(parts) == len(item.sources):
        return [(part, [src]) for part, src in zip(parts, item.sources, strict=True)]
    if not ordinals:
        return [(item.text, list(item.sources))]
    ends = [int(m.group(1)) for m in _POINTER.finditer(item.text)]
    ends.append(ordinals.get(item.sources[-1], -1))
    out: list[tuple[str, list[int]]] = []
    taken: list[int] = []
    sources = iter(item.sources)
    for part, end in zip(parts, ends, strict=True):
        for src in sources:
            taken.append(src)
            if ordinals.get(src) == end:
                break
        if not taken or ordinals.get(taken[-1]) != end:
            return [(item.text, list(item.sources))]  # not a line this module wrote
        out.append((part, taken))
        taken = []
    if next(sources, None) is not None:
        return [(item.text, list(item.sources))]
    return out


_CLAUSE_END = re.compile(r"[,，;；:：]")


def trim_guess(text: str, limit: int) -> str:
    """A long guess cut to its opening, at the end of a clause when one ends in the
    second half of the room ("我们决定把支付的报表切到只读副本…" rather than "…，不过
    收益在生…"): its unconfirmed mark, not its hedge words, says it is a guess."""
    short = _trim(text, limit)
    if short == text:
        return short
    ends = [m.start() for m in _CLAUSE_END.finditer(text, 0, max(limit - 1, 1))]
    if ends and ends[-1] >= limit // 2:
        return text[: ends[-1]].rstrip() + "…"
    return short
