"""FTS5 match queries from the user's text (SQLite's search syntax).

The words are split as the index was (stores/sql/search_text.py: every CJK character its
own token), so a query phrase of adjacent characters (`"压 缩"`) matches the word
wherever it stands.
"""

from __future__ import annotations

import re

from ctxd.daemon.stores.sql.search_text import check_terms, index_text
from ctxd.protocol.errors import InvalidParams

_WORDY = re.compile(r"\w")


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
