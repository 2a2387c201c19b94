"""CompactionLog: every compaction attempt, effective or not, in the `compactions` table.

Rows are written inside the caller's transaction (the log entry of a committed
compaction commits with the new context) and read back through `CompactionRecord`, a
typed row, newest first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

import apsw


@dataclass(frozen=True, slots=True)
class CompactionEntry:
    """One attempt, as the Compactor records it."""

    compaction_id: str
    session_id: str
    trigger: str
    started_at: float
    duration_ms: float
    before_messages: int
    before_tokens: int
    after_messages: int | None
    after_tokens: int | None
    effective: bool
    committed: bool
    summarized_from: int | None
    summarized_to: int | None
    summarizer: str | None
    instructions: str | None
    error: str | None


@dataclass(frozen=True, slots=True)
class CompactionRecord:
    """One attempt as `context/compactions` reports it (without the archive's size then,
    which the engine adds)."""

    compaction_id: str
    trigger: str
    started_at: float
    duration_ms: float
    before_messages: int
    before_tokens: int
    after_messages: int | None
    after_tokens: int | None
    effective: bool
    committed: bool
    summarized_from: int | None
    summarized_to: int | None
    summarizer: str | None
    error: str | None
    # what the caller asked the summarizer to keep (a manual compaction's instructions)
    instructions: str | None = None

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> CompactionRecord:
        (cid, trigger, started, duration, bm, bt, am, at, eff, com, sf, st, summ, err,
         instr) = row
        return cls(cid, trigger, started, duration, bm, bt, am, at, bool(eff), bool(com), sf, st,
                   summ, err, instr)

    def to_wire(self) -> dict[str, Any]:
        """The wire's camelCase names, in the fields' order."""
        return {wire: getattr(self, name) for name, wire in _WIRE_NAMES}


# (field, wire name) of a CompactionRecord: startedAt for started_at, and so on
_WIRE_NAMES = [
    (f.name, re.sub(r"_([a-z])", lambda m: m.group(1).upper(), f.name))
    for f in fields(CompactionRecord)
]


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
    def __init__(self, conn: apsw.Connection) -> None:
        self.conn = conn

    def record(self, e: CompactionEntry) -> None:
        """Must run inside a transaction."""
        self.conn.execute(
            _INSERT,
            (
                e.compaction_id,
                e.session_id,
                e.trigger,
                e.started_at,
                e.duration_ms,
                e.before_messages,
                e.before_tokens,
                e.after_messages,
                e.after_tokens,
                int(e.effective),
                int(e.committed),
                e.summarized_from,
                e.summarized_to,
                e.summarizer,
                e.instructions,
                e.error,
            ),
        )

    def history(self, session_id: str, limit: int = 50) -> list[CompactionRecord]:
        """The session's attempts, newest first."""
        return [
            CompactionRecord.from_row(r) for r in self.conn.execute(_HISTORY, (session_id, limit))
        ]
