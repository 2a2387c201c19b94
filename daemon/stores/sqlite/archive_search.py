"""ArchiveSearch: full-text search over the archive (SQLite FTS5), with a time budget.

`SqliteArchive` (archive.py) takes it in; the PostgreSQL store keeps `search` and gives
its own query builders, `_budget` and `_search` (daemon/stores/postgres/store.py). Queries are built
by `fts.py`, snippets by `snippets.py`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any, ClassVar

import apsw

from ctxd.daemon.stores.sqlite import fts
from ctxd.daemon.stores.sqlite.snippets import Snippets
from ctxd.protocol.errors import InvalidParams, SearchTooBroad

# SQLite virtual-machine steps between two looks at the clock: about a millisecond of work
PROGRESS_STEPS = 10_000


def too_broad(seconds: float) -> SearchTooBroad:
    """The error of a search stopped at its time budget, on either store."""
    return SearchTooBroad(
        f"the search was stopped after its time budget of {seconds:g} s: the query is "
        "too broad for this archive; use fewer, more specific words, or narrow it "
        "with a session, a role or a time range",
        {"budgetSeconds": seconds},
    )


@contextmanager
def _budget(conn: apsw.Connection, seconds: float | None) -> Iterator[float | None]:
    """Interrupt the statements run inside when `seconds` have passed; yields the
    deadline (time.monotonic) for work done outside `conn`, None without a budget."""
    if not seconds:
        yield None
        return
    deadline = time.monotonic() + seconds
    conn.set_progress_handler(lambda: time.monotonic() > deadline, PROGRESS_STEPS)
    try:
        yield deadline
    except apsw.InterruptError:
        raise too_broad(seconds) from None
    finally:
        conn.set_progress_handler(None)


def search_where(
    match_clause: str,
    match: str,
    session_id: str | None,
    role: str | None,
    since: float | None,
    until: float | None,
) -> tuple[str, list[Any]]:
    """The WHERE of a search (without the keyword) and its parameters: the match clause,
    then the filters that are set. Only fixed clauses are spliced in; every user value is
    a bound parameter."""
    where = [match_clause]
    params: list[Any] = [match]
    if session_id is not None:
        where.append("m.session_id = ?")
        params.append(session_id)
    if role is not None:
        where.append("m.role = ?")
        params.append(role)
    if since is not None:
        where.append("m.created_at >= ?")
        params.append(since)
    if until is not None:
        where.append("m.created_at <= ?")
        params.append(until)
    return " AND ".join(where), params


class ArchiveSearch:
    """The search half of `SqliteArchive`: it reads the store's `conn` and `snippets`."""

    conn: apsw.Connection
    snippets: Snippets
    # builds the store's match queries from the user's text (plain_query, advanced_query,
    # any_terms_query)
    queries: ClassVar[ModuleType] = fts

    def search(
        self,
        query: str,
        *,
        session_id: str | None = None,
        role: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 20,
        offset: int = 0,
        newest_first: bool = False,
        advanced: bool = False,
        budget_seconds: float | None = None,
    ) -> tuple[list[dict[str, Any]], str]:
        """Hits and how they matched: "all" (every word, or the advanced query as
        written) or "any" (no message has every word: ranked hits with some of them).

        With `budget_seconds`, the store stops the search when the budget runs out
        (`_budget`) and `SearchTooBroad` is raised."""
        if advanced:
            match = self.queries.advanced_query(query)
        else:
            match = self.queries.plain_query(query)
            if match is None:
                return [], "all"
        with self._budget(budget_seconds) as deadline:
            args = (session_id, role, since, until, limit, offset, newest_first, advanced,
                    deadline)
            hits = self._search(match, *args)
            if hits or advanced or len(query.split()) < 2:
                return hits, "all"
            # the fallback pages on its own: page 2 of "any" must not come back empty
            # because page 2 of "all" is
            if offset and self._search(match, *args[:4], 1, 0, newest_first, advanced, deadline):
                return hits, "all"
            loose = self.queries.any_terms_query(query)
            if not loose:
                return hits, "all"
            return self._search(loose, *args), "any"

    @contextmanager
    def _budget(self, seconds: float | None) -> Iterator[float | None]:
        """SQLite's progress handler stops the statements when `seconds` have passed."""
        with _budget(self.conn, seconds) as deadline:
            yield deadline

    def _search(
        self,
        match: str,
        session_id: str | None,
        role: str | None,
        since: float | None,
        until: float | None,
        limit: int,
        offset: int,
        newest_first: bool,
        advanced: bool,
        deadline: float | None,
    ) -> list[dict[str, Any]]:
        """A page of hits, each with a snippet made by daemon/stores/sqlite/snippets.py (not by
        FTS5's snippet() in this query, whose cost grows with the square of a message's hits and
        which the progress handler cannot stop); past `deadline`, InterruptError."""
        where, params = search_where(
            "messages_fts MATCH ?", match, session_id, role, since, until
        )
        order = "messages_fts.rowid DESC" if newest_first else "rank"
        sql = (
            "SELECT m.id, m.session_id, m.role, m.created_at, bm25(messages_fts) "
            "FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid "
            f"WHERE {where} ORDER BY {order} LIMIT ? OFFSET ?"
        )
        params += [limit, offset]
        try:
            rows = list(self.conn.execute(sql, params))
            texts = [self._indexed_text(row[0]) for row in rows]
        except UnicodeEncodeError:
            raise InvalidParams(
                "the search text contains a lone surrogate; send valid Unicode text"
            ) from None
        except apsw.SQLError as exc:
            hint = (
                "check the FTS5 query syntax, or search without advanced mode"
                if advanced
                else "report this query as a bug"
            )
            raise InvalidParams(f"search query not understood: {exc}; {hint}") from None
        return [
            {
                "messageId": mid,
                "sessionId": sid,
                "role": r,
                "snippet": fts.clean_snippet(self.snippets.make(match, text, deadline)),
                "createdAt": created,
                "score": round(-score, 4),
            }
            for (mid, sid, r, created, score), text in zip(rows, texts, strict=True)
        ]

    def _indexed_text(self, message_id: int) -> str:
        row = self.conn.execute(
            "SELECT body FROM messages_fts WHERE rowid = ?", (message_id,)
        ).fetchone()
        return row[0] if row and row[0] is not None else ""
