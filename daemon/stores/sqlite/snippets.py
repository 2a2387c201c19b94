"""Search snippets at a bounded cost, however large the message.

FTS5's snippet() scores every place a match could start against every match in the
column: on one 3 MB tool output holding 40,000 hits of the query word it ran for minutes,
inside a single SQLite call that the progress handler never interrupts. So snippets are
made here instead: the hit's text is cut into windows of at most WINDOW characters, and
snippet() runs on the first window that matches, in a one-row FTS5 table in memory
with the archive's tokenizer, so the same query marks the same words. Its cost is
bounded by the window, not by the message, and the search's deadline is checked
between windows and by the progress handler inside them.
"""

from __future__ import annotations

import time

import apsw

from ctxd.daemon.stores.sql.search_text import windows

# the tokenizer of messages_fts (daemon/stores/sqlite/schema.py): the same words must match
TOKENIZE = "unicode61 remove_diacritics 2"
TOKENS = 24
PROGRESS_STEPS = 10_000


def _mark_cuts(snip: str, start: int, end: int, n: int) -> str:
    if start > 0 and not snip.startswith("…"):
        snip = "…" + snip
    if end < n and not snip.endswith("…"):
        snip += "…"
    return snip


class Snippets:
    """One per thread (an in-memory connection of its own)."""

    def __init__(self) -> None:
        self._conn: apsw.Connection | None = None

    def _db(self) -> apsw.Connection:
        if self._conn is None:
            self._conn = apsw.Connection(":memory:")
            self._conn.execute(f"CREATE VIRTUAL TABLE w USING fts5(body, tokenize = '{TOKENIZE}')")
        return self._conn

    def make(self, match: str, text: str, deadline: float | None) -> str:
        """The snippet of `text` (as indexed) for the FTS5 query `match`, matches in
        **bold**. Raises apsw.InterruptError once `deadline` (time.monotonic) passes."""
        conn = self._db()
        if deadline is not None:
            conn.set_progress_handler(lambda: time.monotonic() > deadline, PROGRESS_STEPS)
        try:
            for start, end in windows(text):
                if deadline is not None and time.monotonic() > deadline:
                    raise apsw.InterruptError("snippet interrupted by the search budget")
                conn.execute("DELETE FROM w")
                conn.execute("INSERT INTO w(rowid, body) VALUES (1, ?)", (text[start:end],))
                row = conn.execute(
                    f"SELECT snippet(w, 0, '**', '**', '…', {TOKENS}) FROM w WHERE w MATCH ?",
                    (match,),
                ).fetchone()
                if row is not None:
                    return _mark_cuts(row[0], start, end, len(text))
        finally:
            if deadline is not None:
                conn.set_progress_handler(None)
        # the query matches the whole text but no one window (terms far apart): its start
        words = text[:2000].split()
        head = " ".join(words[:TOKENS])
        return head + ("…" if len(words) > TOKENS or len(text) > 2000 else "")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
