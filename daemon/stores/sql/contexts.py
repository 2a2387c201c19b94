"""The active context: a replaceable row per session, apart from the archive; and the
session's pins. The statements both stores run: SqlContexts (each store writes the whole
row its own way: `save`), SqlPins.

The active messages are the session's leading system messages (`system_ids`) plus
every archived message from `tail_start_id` on: the tail is always a suffix of the
archive, so an append only bumps counters and a compaction only moves the start.
Two exceptions, both asked for by a client: `context/clear` starts a fresh context
after `base_id` (older messages belong to no context any more), and `context/pop`
leaves the newest messages out (`dropped_ids`) while the archive keeps them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxd.daemon.stores.records import PinRecord
from ctxd.daemon.stores.sql import SqlConnection
from ctxd.daemon.summary import Summary


@dataclass
class ContextState:
    session_id: str
    version: int = 1
    system_ids: list[int] = field(default_factory=list)
    tail_start_id: int | None = None  # None: no non-system message yet
    summary: Summary = field(default_factory=Summary)
    summary_tokens: int = 0  # tokens of the rendered pins + summary message
    active_messages: int = 0  # leading system messages + tail
    active_tokens: int = 0
    compaction_count: int = 0
    last_compacted_at: float | None = None
    base_id: int = 0  # messages with id <= base_id were cleared out by context/clear
    dropped_ids: list[int] = field(default_factory=list)  # tail ids left out by context/pop

    def with_own_system_ids(self) -> ContextState:
        """A copy whose `system_ids` can grow apart from this one's (what an append
        changes; `dataclasses.replace` does the same at several times the cost)."""
        new = object.__new__(ContextState)
        new.__dict__.update(self.__dict__)
        new.system_ids = list(self.system_ids)
        return new

    def after_append(
        self, rows: Sequence[tuple[dict[str, Any], str, int]], ids: Sequence[int]
    ) -> ContextState:
        """A copy that counts an appended batch ((message, text, tokens) rows and their
        ids): system messages before the first other one join `system_ids`, and that
        first other message starts the tail."""
        new = self.with_own_system_ids()
        new.active_messages += len(rows)
        new.active_tokens += sum(tokens for _, _, tokens in rows)
        for (m, _, _), mid in zip(rows, ids, strict=True):
            if new.tail_start_id is None:
                if m["role"] == "system":
                    new.system_ids.append(mid)
                else:
                    new.tail_start_id = mid
        return new

    @property
    def has_summary_message(self) -> bool:
        return self.summary_tokens > 0

    @property
    def rendered_messages(self) -> int:
        return self.active_messages + (1 if self.has_summary_message else 0)

    @property
    def rendered_tokens(self) -> int:
        return self.active_tokens + self.summary_tokens

    def in_active_context(self, message_id: int) -> bool:
        if message_id in self.system_ids:
            return True
        return (
            self.tail_start_id is not None
            and message_id >= self.tail_start_id
            and message_id not in self.dropped_ids
        )


_COLUMNS = (
    "session_id, version, system_ids, tail_start_id, summary, summary_tokens, "
    "active_messages, active_tokens, compaction_count, last_compacted_at, base_id, dropped_ids"
)


def decode_summary(text: str | None) -> Summary:
    return Summary.from_dict(json.loads(text)) if text else Summary()


def load_context(
    conn: SqlConnection, session_id: str,
    summary_of: Callable[[str, str | None], Summary] | None = None,
) -> ContextState | None:
    """`summary_of(session_id, stored text)`: the summary decoded (by default, anew)."""
    row = conn.execute(
        f"SELECT {_COLUMNS} FROM conversation_context WHERE session_id = ?", (session_id,)
    ).fetchone()
    if row is None:
        return None
    (
        sid,
        version,
        system_ids,
        tail_start_id,
        summary,
        summary_tokens,
        active_messages,
        active_tokens,
        compaction_count,
        last_compacted_at,
        base_id,
        dropped_ids,
    ) = row
    return ContextState(
        session_id=sid,
        version=version,
        system_ids=json.loads(system_ids),
        tail_start_id=tail_start_id,
        summary=summary_of(sid, summary) if summary_of else decode_summary(summary),
        summary_tokens=summary_tokens,
        active_messages=active_messages,
        active_tokens=active_tokens,
        compaction_count=compaction_count,
        last_compacted_at=last_compacted_at,
        base_id=base_id,
        dropped_ids=json.loads(dropped_ids) if dropped_ids else [],
    )


def context_row(st: ContextState) -> tuple[Any, ...]:
    """The values of a context's row, in the order of `_COLUMNS` then `updated_at`
    (both stores write this row)."""
    return (
        st.session_id,
        st.version,
        json.dumps(st.system_ids),
        st.tail_start_id,
        None if st.summary.is_empty() else json.dumps(st.summary.to_dict(), ensure_ascii=False),
        st.summary_tokens,
        st.active_messages,
        st.active_tokens,
        st.compaction_count,
        st.last_compacted_at,
        st.base_id,
        json.dumps(st.dropped_ids) if st.dropped_ids else None,
        time.time(),
    )


def bump_counts(conn: SqlConnection, st: ContextState) -> None:
    """The cheap write an append makes: counters and the tail start, not the summary."""
    conn.execute(
        "UPDATE conversation_context SET system_ids = ?, tail_start_id = ?, "
        "active_messages = ?, active_tokens = ?, updated_at = ? WHERE session_id = ?",
        (
            json.dumps(st.system_ids),
            st.tail_start_id,
            st.active_messages,
            st.active_tokens,
            time.time(),
            st.session_id,
        ),
    )


def set_summary_tokens(conn: SqlConnection, session_id: str, tokens: int) -> None:
    conn.execute(
        "UPDATE conversation_context SET summary_tokens = ? WHERE session_id = ?",
        (tokens, session_id),
    )


# pins


def list_pins(conn: SqlConnection, session_id: str) -> list[PinRecord]:
    return [
        PinRecord(pid, session_id, text, created)
        for pid, text, created in conn.execute(
            "SELECT id, text, created_at FROM pins WHERE session_id = ? ORDER BY created_at, id",
            (session_id,),
        )
    ]


def add_pin(conn: SqlConnection, pin_id: str, session_id: str, text: str) -> PinRecord:
    now = time.time()
    conn.execute(
        "INSERT INTO pins(id, session_id, text, created_at) VALUES (?,?,?,?)",
        (pin_id, session_id, text, now),
    )
    return PinRecord(pin_id, session_id, text, now)


def remove_pin(conn: SqlConnection, session_id: str, pin_id: str) -> PinRecord | None:
    """Delete a pin; returns it as it was, or None when there is no such pin."""
    row = conn.execute(
        "SELECT id, text, created_at FROM pins WHERE id = ? AND session_id = ?",
        (pin_id, session_id),
    ).fetchone()
    if row is None:
        return None
    conn.execute("DELETE FROM pins WHERE id = ? AND session_id = ?", (pin_id, session_id))
    return PinRecord(row[0], session_id, row[1], row[2])


class SqlContexts:
    """The active contexts on one connection (the functions above, bound to it)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def load(self, session_id: str) -> ContextState | None:
        return load_context(self.conn, session_id)

    def save(self, st: ContextState) -> None:
        """Write the whole row (`context_row`): an upsert, which each engine words its
        own way."""
        raise NotImplementedError

    def bump_counts(self, st: ContextState) -> None:
        bump_counts(self.conn, st)

    def set_summary_tokens(self, session_id: str, tokens: int) -> None:
        set_summary_tokens(self.conn, session_id, tokens)


class SqlPins:
    """The pins on one connection."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def list(self, session_id: str) -> list[PinRecord]:
        return list_pins(self.conn, session_id)

    def add(self, pin_id: str, session_id: str, text: str) -> PinRecord:
        return add_pin(self.conn, pin_id, session_id, text)

    def remove(self, session_id: str, pin_id: str) -> PinRecord | None:
        return remove_pin(self.conn, session_id, pin_id)
