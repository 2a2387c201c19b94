"""The active contexts on PostgreSQL: the shared reads (stores/sql/contexts.py), an
upsert, and each session's summary decoded once per stored text."""

from __future__ import annotations

import json
import time
from typing import Any

from ctxd.daemon.stores.postgres.batch_rows import WRITES
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


# the cheap write an append makes (stores/sql/contexts.py bump_counts: counters and the
# tail start, not the summary)
BUMP = (
    "UPDATE conversation_context SET system_ids = ?, tail_start_id = ?, "
    "active_messages = ?, active_tokens = ?, updated_at = ? WHERE session_id = ?"
)
# a batch's statement (batch_rows.WRITES) with BUMP one more of its WITH queries (its
# parameters first): another table's row, which none of the batch's queries touches
WITH_COUNTS = {w: f"WITH wx AS ({BUMP}), " + w.removeprefix("WITH ") for w in WRITES.values()}


class PgContexts(SqlContexts):
    """Contexts read on every request (other daemons write them too), with each
    session's summary decoded once per stored text: a summary of a few hundred items
    cost more to decode (json, then an object per item) than the rest of a
    `context/get`. The same Summary object is handed out while the stored text is the
    same, as the embedded store hands out the one it keeps."""

    def __init__(self, conn: Any) -> None:
        super().__init__(conn)
        # the batch's arrays go in binary (batch_rows.BINARY)
        conn.binary_params |= set(WITH_COUNTS.values())
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

    def bump_counts(self, st: ContextState) -> None:
        """After an append in its transaction: in the statement of the batch's rows,
        kept back for it (PgArchive.append), one statement less for psycopg to build and
        the server to run; alone otherwise."""
        params = (json.dumps(st.system_ids), st.tail_start_id, st.active_messages,
                  st.active_tokens, time.time(), st.session_id)
        held = self.conn.take_held(WITH_COUNTS)
        if held is None:
            self.conn.execute(BUMP, params)
            return
        writes, writes_params = held
        self.conn.execute(WITH_COUNTS[writes], [*params, *writes_params])

    def save(self, st: ContextState) -> None:
        cols = _CONTEXT_COLUMNS.split(", ")
        self.conn.execute(
            f"INSERT INTO conversation_context({_CONTEXT_COLUMNS}) "
            f"VALUES ({','.join('?' * len(cols))}) ON CONFLICT (session_id) DO UPDATE SET "
            + ", ".join(f"{c} = excluded.{c}" for c in cols[1:]),
            context_row(st),
        )
