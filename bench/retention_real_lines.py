"""The summary message the model reads, as `bench/retention_real.py` judges it: its
sections and items, and the tests applied to them (boilerplate, superseded marks and
whether what they mark is a correction)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.retention_real_extract import norm

# ------------------------------------------------------------------ summary lines

POINTER = re.compile(r" ?\[(?:msg [^\]]*|#[^\]]*)\]| #\d+(?:[-,]\d+)*$")
MARKS = re.compile(r"^(?:\[(?:superseded|unconfirmed|推测)\]\s*)+")
BOILERPLATE = re.compile(
    r"<environment_context>|</?command-(?:name|message|args)>|<local-command-stdout>"
    r"|<task-notification>|<system-reminder>|# Context from my IDE setup"
    r"|This session is being continued from a previous conversation|<user_instructions>"
    r"|\[Image #\d+\]|\blen=\d+|\[image [^\]]*sha256:|<permissions instructions>"
    r"|\[Request interrupted by user|Base directory for this skill:",
    re.IGNORECASE,
)
SUPERSEDED = re.compile(r"\[superseded\]|\(was |\(原为|\s→\s")
CORRECTION = SUPERSEDED
# sections where " → " is a call and its result, not an old and a new value
_ARROW_IS_RESULT = ("tool", "artifact", "file")


def marks_superseded(line: SummaryLine, source: str = "") -> bool:
    """`source`: the transcript's text, normalised; an arrow or "(was" the transcript
    itself wrote on that line is not the summarizer's mark."""
    if "[superseded]" in line.raw:
        return True
    if line.section.lower().startswith(_ARROW_IS_RESULT) and " → " in line.raw:
        return bool(re.search(r"\(was |\(原为", line.raw))
    if not SUPERSEDED.search(line.raw):
        return False
    # guesses joined on one line ("A #37; B #41") are each a statement of their own: an
    # arrow one of them quotes from the transcript ("Intake → Plan → Deliver") is no
    # mark, whatever the other one says; an excerpt cut short ("…") is checked as far as
    # it goes
    return any(
        SUPERSEDED.search(piece) and norm(piece.rstrip().rstrip("…")) not in source
        for piece in _JOINED.split(line.text)
    )


# where two joined guesses meet on a summary line: the first one's pointer and a ";"
_JOINED = re.compile(r"\s#\d+(?:-\d+)?;\s*")
PASTED = re.compile(
    r"Traceback|^\s*at \S+ \(|File \"[^\"]+\", line \d+|\[Image #?\d+\]|\blen=\d+"
    r"|\[image [^\]]*sha256|```|\bERROR\b|Exit code:? \d|^\s*\d+\s*[|→]|\$ \S|<\w+>.*</\w+>"
    r"|^\s*[+-]{3} |\bat line \d+|:\d+:\d+\b|<[a-z][\w-]*>",
    re.MULTILINE,
)


@dataclass
class SummaryLine:
    section: str  # the section title as rendered
    raw: str  # the line as the model reads it
    text: str  # without marks and pointer


def summary_lines(summary_message: str) -> list[SummaryLine]:
    out: list[SummaryLine] = []
    section = ""
    body = summary_message.split("Summary of earlier messages", 1)[-1]
    for line in body.splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        elif line.startswith("- ") and section:
            text = MARKS.sub("", POINTER.sub("", line[2:]).strip())
            out.append(SummaryLine(section, line, text))
    return out


def in_section(ln: SummaryLine, key: str) -> bool:
    """The line is in the summary section `key` (goals, constraints...): by the title
    the measured ctxd gives that section, or by the title's first word."""
    try:
        from ctxd.daemon.summary import SECTIONS

        title = SECTIONS.get(key)
    except ImportError:  # a ctxd that names them elsewhere
        title = None
    if title is not None and ln.section == title:
        return True
    return ln.section.lower().startswith(key)


def superseded_parts(line: SummaryLine, same_section: list[SummaryLine]) -> tuple[str, str]:
    """(old, new) of a line that marks a replaced value, as far as the text tells."""
    t = line.text
    if " → " in t:
        old, new = t.split(" → ", 1)
        return old, new
    was = re.search(r"\((?:was|原为) ?([^)]*)\)", t)
    if was and "[superseded]" not in line.raw:
        return was.group(1), t[: was.start()].strip()
    # "[superseded] X": the replacing item is the next current line of the section
    later = same_section[same_section.index(line) + 1:] if line in same_section else []
    new = next((x.text for x in later if "[superseded]" not in x.raw), "")
    return t, new


_COUNTER = re.compile(
    r"(?:step|turn|page|chunk|task|item|line|worker|module|part|phase|round|iteration|"
    r"number|no\.|#|第|m)\s*$", re.IGNORECASE)


def _numbered_series(a: str, b: str) -> bool:
    """The texts differ only in numbers, and each differing number counts something
    (step 74 / step 75) or moves by one: a series of requests, not a changed value."""
    if a == b or re.sub(r"\d+", "#", a) != re.sub(r"\d+", "#", b):
        return False
    pa, pb = list(re.finditer(r"\d+", a)), list(re.finditer(r"\d+", b))
    for x, y in zip(pa, pb, strict=True):
        if x.group() == y.group():
            continue
        counted = bool(_COUNTER.search(a[: x.start()]))
        if not counted and abs(int(x.group()) - int(y.group())) != 1:
            return False
    return True


def not_a_correction(old: str, new: str) -> str | None:
    """Why a superseded pair is not a real correction, or None when it may be one."""
    a, b = norm(POINTER.sub("", old)), norm(POINTER.sub("", new))
    if not b:
        return None  # no replacing text shown: left to the person judging the sample
    if a == b:
        return "identical"
    if _numbered_series(a, b):
        return "numbered series"
    if PASTED.search(old) or PASTED.search(new):
        return "pasted output"
    return None


def supersession_pairs(summary: Any, old_text: Callable[[int], str]) -> list[tuple[str, str, str]]:
    """(item text, old statement, new statement) of the summary's items that show a
    replaced value, from its structure; `old_text(id)` reads an archived message.
    Empty when the summary has no such structure."""
    out: list[tuple[str, str, str]] = []
    try:
        items = [item for _, item in summary.items()]
        supersessions = dict(getattr(summary, "supersessions", {}) or {})
        for item in items:
            was, value = getattr(item, "was", None), getattr(item, "value", None)
            if was and getattr(item, "status", "current") == "current":
                before = item.text.replace(value, was, 1) if value and value in item.text else was
                out.append((item.text, before, item.text))
            elif getattr(item, "status", "") == "superseded":
                new_ids = [supersessions[s] for s in item.sources if s in supersessions]
                new = next((other.text for other in items for n in new_ids
                            if n in other.sources and other is not item), "")
                if not new and new_ids:
                    new = old_text(new_ids[-1])
                out.append((item.text, item.text, new))
    except (AttributeError, TypeError, KeyError):
        return []
    return out
