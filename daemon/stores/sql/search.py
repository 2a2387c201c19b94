"""SqlSearch: how both stores search the archive, around their own queries and SQL.

The user's words become a match query (`queries`: FTS5's on SQLite, tsquery on
PostgreSQL), every word first; when no message has them all, a ranked page of the
messages with some of them. Each store gives the query builders, the time budget
(`_budget`) and the statement of one page (`_search`); the WHERE of that statement is
`search_where`, the same on both.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from types import ModuleType
from typing import Any, ClassVar, NamedTuple

from ctxd.daemon.stores.records import SearchHitRecord
from ctxd.protocol.errors import SearchTooBroad


def too_broad(seconds: float) -> SearchTooBroad:
    """The error of a search stopped at its time budget, on either store."""
    return SearchTooBroad(
        f"the search was stopped after its time budget of {seconds:g} s: the query is "
        "too broad for this archive; use fewer, more specific words, or narrow it "
        "with a session, a role or a time range",
        {"budgetSeconds": seconds},
    )


class SearchPage(NamedTuple):
    """What a store's statement of one page (`_search`) asks beside its match query."""

    session_id: str | None
    role: str | None
    since: float | None
    until: float | None
    limit: int
    offset: int
    newest_first: bool
    advanced: bool
    # time.monotonic past which the work done outside the statement (snippets) stops
    deadline: float | None


def search_where(match_clause: str, match: str, page: SearchPage) -> tuple[str, list[Any]]:
    """The WHERE of a search (without the keyword) and its parameters: the match clause,
    then the filters that are set. Only fixed clauses are spliced in; every user value is
    a bound parameter."""
    where = [match_clause]
    params: list[Any] = [match]
    for clause, value in (("m.session_id = ?", page.session_id), ("m.role = ?", page.role),
                          ("m.created_at >= ?", page.since), ("m.created_at <= ?", page.until)):
        if value is not None:
            where.append(clause)
            params.append(value)
    return " AND ".join(where), params


class SqlSearch:
    """The search of an archive; the store's class gives `queries`, `_budget` and
    `_search`."""

    # builds the store's match queries from the user's text (plain_query, advanced_query,
    # any_terms_query)
    queries: ClassVar[ModuleType]

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
    ) -> tuple[list[SearchHitRecord], str]:
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
            page = SearchPage(session_id, role, since, until, limit, offset, newest_first,
                              advanced, deadline)
            hits = self._search(match, page)
            if hits or advanced or len(query.split()) < 2:
                return hits, "all"
            # the fallback pages on its own: page 2 of "any" must not come back empty
            # because page 2 of "all" is
            if offset and self._search(match, page._replace(limit=1, offset=0)):
                return hits, "all"
            loose = self.queries.any_terms_query(query)
            if not loose:
                return hits, "all"
            return self._search(loose, page), "any"

    def _budget(self, seconds: float | None) -> AbstractContextManager[float | None]:
        """Stops the statements run inside once `seconds` have passed (`too_broad`);
        yields a deadline (time.monotonic) for work done outside them, or None."""
        raise NotImplementedError

    def _search(self, match: str, page: SearchPage) -> list[SearchHitRecord]:
        """A page of hits for the match query."""
        raise NotImplementedError
