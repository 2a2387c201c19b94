"""Full-text search text and queries that work for Chinese as well as English.

SQLite's unicode61 tokenizer treats a run of Han characters as one token, so `压缩`
would never match inside `上下文压缩策略`; the trigram tokenizer ignores 2-character
terms and is ten times slower to index; Python tokenizers run at a fifth of the speed.
Instead, before indexing, every CJK character is followed by U+200B (a zero-width
space, which unicode61 treats as a separator). Each character becomes a token in C,
and a query phrase of adjacent characters (`"压 缩"`) matches the word wherever it
stands. Snippets strip the U+200B again.
"""

from __future__ import annotations

import re

from ctxd.protocol.errors import InvalidParams
from ctxd.protocol.methods import QUERY_TERMS_MAX

# a position right after a CJK character; a lookbehind with a plain replacement avoids
# Python's per-match template expansion (indexing runs 1.6x faster than with a group)
_AFTER_CJK = re.compile(
    "(?<=[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af\u3100-\u312f"
    "\U00020000-\U0002a6df])"
)
SEP = "\u200b"
_WORDY = re.compile(r"\w")
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


def plain_query(text: str) -> str | None:
    """Turn user text into an FTS5 query that cannot be read as syntax.

    Each whitespace-separated chunk becomes a quoted phrase (quotes doubled), so `*`,
    `-`, `:`, `NEAR`, `AND` and parentheses are plain text. Chunks are ANDed.
    Returns None when nothing searchable remains.
    """
    check_terms(text)
    terms = [
        '"' + index_text(chunk).replace('"', '""') + '"'
        for chunk in text.split()
        if _WORDY.search(chunk)
    ]
    return " ".join(terms) if terms else None


def any_terms_query(text: str) -> str | None:
    """The same phrases ORed: a looser retry when every term together finds nothing."""
    q = plain_query(text)
    return q.replace('" "', '" OR "') if q else None


def advanced_query(text: str) -> str:
    """FTS5 syntax passed through, CJK split the same way as the index."""
    if not text.strip():
        raise InvalidParams("the search query is empty")
    check_terms(text)
    return index_text(text)
