"""CompactionLog: every compaction attempt, effective or not, in the `compactions` table.

The same statements on both stores. Rows are written inside the caller's transaction
(the log entry of a committed compaction commits with the new context) and read back
newest first. One record type both ways: `Compaction` (protocol/types.py), what
`context/compactions` sends; the archive's size when it ran is not in this table, so it
is read back as None and the engine fills it in (engine/archive_sizes.py).
"""

from __future__ import annotations

from typing import Any

from ctxd.protocol.types import Compaction

_INSERT = (
    "INSERT INTO compactions(id, session_id, trigger, started_at, duration_ms, "
    "before_messages, before_tokens, after_messages, after_tokens, effective, "
    "committed, summarized_from, summarized_to, summarizer, instructions, error) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)

_HISTORY = (
    "SELECT id, trigger, started_at, duration_ms, before_messages, before_tokens, "
    "after_messages, after_tokens, effective, committed, summarized_from, "
    "summarized_to, summarizer, error, instructions "
    "FROM compactions WHERE session_id = ? ORDER BY started_at DESC LIMIT ?"
)


class CompactionLog:
    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def record(self, session_id: str, c: Compaction) -> None:
        """Must run inside a transaction."""
        self.conn.execute(
            _INSERT,
            (
                c.compaction_id,
                session_id,
                c.trigger,
                c.started_at,
                c.duration_ms,
                c.before_messages,
                c.before_tokens,
                c.after_messages,
                c.after_tokens,
                int(c.effective),
                int(c.committed),
                c.summarized_from,
                c.summarized_to,
                c.summarizer,
                c.instructions,
                c.error,
            ),
        )

    def history(self, session_id: str, limit: int = 50) -> list[Compaction]:
        """The session's attempts, newest first (their archive sizes None)."""
        return [_from_row(r) for r in self.conn.execute(_HISTORY, (session_id, limit))]


def _from_row(row: tuple[Any, ...]) -> Compaction:
    (cid, trigger, started, duration, bm, bt, am, at, eff, com, sf, st, summ, err,
     instr) = row
    return Compaction(
        compaction_id=cid, trigger=trigger, started_at=started, duration_ms=duration,
        before_messages=bm, before_tokens=bt, after_messages=am, after_tokens=at,
        effective=bool(eff), committed=bool(com), summarized_from=sf, summarized_to=st,
        summarizer=summ, error=err, instructions=instr, archive_messages=None,
        archive_tokens=None,
    )
