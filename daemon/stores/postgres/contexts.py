"""The active contexts on PostgreSQL: the shared reads (stores/sql/contexts.py), an
upsert, and each session's summary decoded once per stored text."""

from __future__ import annotations

from typing import Any

from ctxd.daemon.stores.sql.contexts import (
    ContextState,
    SqlContexts,
    context_row,
    decode_summary,
    load_context,
)
from ctxd.daemon.summary import Summary

# sessions whose decoded summary PgContexts keeps
SUMMARIES_KEPT = 1024


_CONTEXT_COLUMNS = (
    "session_id, version, system_ids, tail_start_id, summary, summary_tokens, "
    "active_messages, active_tokens, compaction_count, last_compacted_at, base_id, "
    "dropped_ids, updated_at"
)


class PgContexts(SqlContexts):
    """Contexts read on every request (other daemons write them too), with each
    session's summary decoded once per stored text: a summary of a few hundred items
    cost more to decode (json, then an object per item) than the rest of a
    `context/get`. The same Summary object is handed out while the stored text is the
    same, as the embedded store hands out the one it keeps."""

    def __init__(self, conn: Any) -> None:
        super().__init__(conn)
        # session -> (the stored text, its Summary)
        self._summaries: dict[str, tuple[str, Summary]] = {}

    def load(self, session_id: str) -> ContextState | None:
        return load_context(self.conn, session_id, self._summary_of)  # type: ignore[arg-type]

    def _summary_of(self, session_id: str, text: str | None) -> Summary:
        if not text:
            return Summary()
        kept = self._summaries.get(session_id)
        if kept is not None and kept[0] == text:
            return kept[1]
        summary = decode_summary(text)
        if len(self._summaries) >= SUMMARIES_KEPT:
            self._summaries.clear()  # a bound, not a cache policy: rarely reached
        self._summaries[session_id] = (text, summary)
        return summary

    def save(self, st: ContextState) -> None:
        cols = _CONTEXT_COLUMNS.split(", ")
        self.conn.execute(
            f"INSERT INTO conversation_context({_CONTEXT_COLUMNS}) "
            f"VALUES ({','.join('?' * len(cols))}) ON CONFLICT (session_id) DO UPDATE SET "
            + ", ".join(f"{c} = excluded.{c}" for c in cols[1:]),
            context_row(st),
        )
