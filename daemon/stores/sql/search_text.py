"""The search text both stores index and query: ctxd's own token stream.

SQLite's unicode61 tokenizer treats a run of Han characters as one token, so `压缩`
would never match inside `上下文压缩策略`; the trigram tokenizer ignores 2-character
terms and is ten times slower to index; Python tokenizers run at a fifth of the speed.
Instead, before indexing, every CJK character is followed by U+200B (a zero-width
space, which unicode61 treats as a separator). Each character becomes a token in C,
and a query phrase of adjacent characters (`"压 缩"`) matches the word wherever it
stands. Snippets strip the U+200B again. PostgreSQL's tsvectors are built from the same
stream (stores/postgres/tsearch.py); both make snippets from `windows` of a long text.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from ctxd.protocol.errors import InvalidParams
from ctxd.protocol.methods import QUERY_TERMS_MAX

# a position right after a CJK character; a lookbehind with a plain replacement avoids
# Python's per-match template expansion (indexing runs 1.6x faster than with a group)
_AFTER_CJK = re.compile(
    "(?<=[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af\u3100-\u312f"
    "\U00020000-\U0002a6df])"
)
SEP = "\u200b"
_TOKEN = re.compile(r"\w+")

# Each term of a query costs a walk of its posting list (and in the any-word fallback a
# rank computed over the union of them): a 5,000-word query kept SQLite busy for minutes.
# Real queries, a pasted sentence included, stay far below this.
MAX_QUERY_TERMS = QUERY_TERMS_MAX


# a long text is marked in slices of this many characters: one regular-expression pass
# over megabytes holds the GIL (and the event loop, when a worker thread indexes) for
# a tenth of a second
_SLICE = 1 << 16


def index_text(text: str) -> str:
    """The text stored in the FTS table for a message."""
    # FTS5 reads a string only up to a NUL character
    text = text.replace("\x00", " ")
    if text.isascii():  # no CJK to mark (and Python knows it without a scan)
        return text
    if len(text) <= _SLICE:
        return _AFTER_CJK.sub(SEP, text)
    # a slice's start has nothing behind it, and a CJK character ending a slice gets its
    # separator at that slice's end: the same text as one pass
    return "".join(
        _AFTER_CJK.sub(SEP, text[i : i + _SLICE]) for i in range(0, len(text), _SLICE)
    )


def clean_snippet(snippet: str) -> str:
    return snippet.replace(SEP, "")


def term_count(text: str) -> int:
    """How many index tokens a query names (each CJK character is one)."""
    return len(_TOKEN.findall(index_text(text)))


def check_terms(text: str) -> None:
    """Refuse a query with more terms than any search is allowed to weigh."""
    n = term_count(text)
    if n > MAX_QUERY_TERMS:
        raise InvalidParams(
            f"the search query has {n} terms; at most {MAX_QUERY_TERMS} are allowed (each "
            "Chinese or Japanese character counts as one): search for fewer, more specific "
            "words",
            {"param": "query", "terms": n, "limit": MAX_QUERY_TERMS},
        )


def cap_terms(text: str) -> str:
    """The query cut after its first MAX_QUERY_TERMS terms (for best-effort recall)."""
    indexed = index_text(text)
    for i, m in enumerate(_TOKEN.finditer(indexed)):
        if i + 1 == MAX_QUERY_TERMS:
            # index_text only added separators (and blanked NULs): dropping them again
            # gives the original text up to that term
            return indexed[: m.end()].replace(SEP, "")
    return text


# characters a snippet is made from at once: a few hundred hits at most, a few ms of work
WINDOW = 16_000
# windows overlap by this much, so a phrase across a cut is still found whole
OVERLAP = 1_000


def windows(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) slices of at most WINDOW characters covering `text`, cut at
    whitespace where there is some near the cut, overlapping by about OVERLAP."""
    n = len(text)
    start = 0
    while True:
        end = min(n, start + WINDOW)
        if end < n:
            space = text.rfind(" ", end - OVERLAP, end)
            if space > start:
                end = space
        yield start, end
        if end >= n:
            return
        nxt = max(start + 1, end - OVERLAP)
        space = text.find(" ", nxt, end)
        start = space + 1 if space != -1 else nxt
