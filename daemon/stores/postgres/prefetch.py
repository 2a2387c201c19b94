"""Reads a request will make, sent ahead in one round trip (PgConnection's memo), as
one statement (bundle.py).

Each function names a statement exactly as the part that makes the read sends it
(the same SQL text and parameters), so that part's own `execute` is answered from the
rows read ahead; a read named here that its part no longer makes the same way only
costs its own round trip again (tests/test_pg_round_trips.py counts them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ctxd.daemon.stores.sql.archive import _CALL_IDS, _RESULT_IDS, lookup_statements
from ctxd.daemon.stores.sql.contexts import _COLUMNS as _CONTEXT_COLUMNS
from ctxd.daemon.stores.sql.runs import _APPROVAL_COLS, _RUN_COLS

Read = tuple[str, Sequence[Any]]

# A session's messages from an id on, read through its batches: a batch is a contiguous
# id range of one session, so the ids come from the session's batches ending at or past
# from_id (batches_by_session_last) and the rows from the primary key, one probe per id,
# never touching another session's rows. The plain `session_id = ? AND id >= ?` leaves
# the planner to guess how many rows match; with a few long sessions it takes session and
# id as independent, expects thousands, and walks the primary key through every newer
# row of every other session (75k rows, 8 ms, for a 24-row tail in bench_store).
#
# Safe to prepare (so the reads sent ahead with it are prepared too): a generic plan,
# made without the values, still reads only the session's rows. The messages are found
# by `id = ANY(<array of the subquery>)`, which the planner always takes for a few
# probes of the primary key (an array it cannot see counts as ten elements). The batches
# are bounded on both sides: a pair of bounds with one of them unknown is taken as a
# narrow range (0.5% of the rows, where `last_message_id >= ?` alone is a third), so
# even with statistics taken when the archive held one session (which make
# `session_id = ?` match every row) the generic plan reads batches_by_session_last
# rather than every batch of every session (13k batches, 3 ms, behind 30k rows of
# another session); with the values at hand the bound changes nothing.
# tests/test_pg_plans.py explains each statement under a forced generic plan.
_NO_BOUND = 9223372036854775807  # bigint's largest: every id is below it
SESSION_IDS_FROM = (
    "SELECT generate_series(greatest(first_message_id, ?), last_message_id) FROM batches "
    f"WHERE session_id = ? AND last_message_id >= ? AND last_message_id < {_NO_BOUND}"
)
READ_TAIL = (
    "SELECT id, batch_id, body, tokens, created_at FROM messages "
    f"WHERE id = ANY(ARRAY({SESSION_IDS_FROM})) ORDER BY id"
)
READ_TAIL_RANGE = (
    "SELECT id, batch_id, body, tokens, created_at FROM messages WHERE id = ANY(ARRAY("
    "SELECT generate_series(greatest(first_message_id, ?), least(last_message_id, ?)) "
    "FROM batches WHERE session_id = ? AND last_message_id >= ? "
    f"AND last_message_id < {_NO_BOUND} AND first_message_id <= ?)) ORDER BY id"
)
# The session's messages past one counted (params: that id + 1, the session, again) and
# the size of its messages from an id on (params: from_id, the session, from_id), read
# the same way: `session_id = ? AND id > ?` under a generic plan walks the primary key
# through every newer row of every other session (15k to 49k rows, 5 to 18 ms, where
# the session has a few thousand). Counting from the session's start probes each of its
# rows (a few ms for 10k), once per session and store; later counts read the new rows.
COUNT_FROM = f"SELECT count(*), max(id) FROM messages WHERE id = ANY(ARRAY({SESSION_IDS_FROM}))"
BYTES_FROM = (
    "SELECT coalesce(sum(octet_length(body)), 0) FROM messages "
    f"WHERE id = ANY(ARRAY({SESSION_IDS_FROM}))"
)


def context(session_id: str) -> Read:
    """ContextStore.load"""
    return (f"SELECT {_CONTEXT_COLUMNS} FROM conversation_context WHERE session_id = ?",
            (session_id,))


def open_run(session_id: str) -> Read:
    """RunStore.open_run"""
    return (f"SELECT {_RUN_COLS} FROM runs WHERE session_id = ? AND status = 'open'",
            (session_id,))


def run(run_id: str) -> Read:
    """RunStore.get"""
    return (f"SELECT {_RUN_COLS} FROM runs WHERE id = ?", (run_id,))


def pending(session_id: str) -> Read:
    """RunStore.list_approvals(session_id, "pending")"""
    return (f"SELECT {_APPROVAL_COLS} FROM approvals WHERE session_id = ? AND status = ? "
            "ORDER BY created_at", (session_id, "pending"))


def pending_count(session_id: str) -> Read:
    """RunStore.pending_count"""
    return ("SELECT count(*) FROM approvals WHERE session_id = ? AND status = 'pending'",
            (session_id,))


def find_batch(session_id: str, client_batch_id: str) -> Read:
    """ArchiveStore.find_batch"""
    return ("SELECT id, digest, first_message_id, last_message_id FROM batches "
            "WHERE session_id = ? AND client_batch_id = ?", (session_id, client_batch_id))


def tool_pairs(session_id: str, msgs: list[dict[str, Any]]) -> list[Read]:
    """What pairing.check_tool_pairs asks the archive about the batch's tool calls."""
    call_ids = [c["id"] for m in msgs for c in m.get("tool_calls") or ()]
    result_ids = [m["tool_call_id"] for m in msgs if m["role"] == "tool"]
    out: list[Read] = []
    if call_ids or result_ids:
        out += lookup_statements(_CALL_IDS, session_id, call_ids + result_ids)
    if result_ids:
        out += lookup_statements(_RESULT_IDS, session_id, result_ids)
    return out


def message_count(archive: Any, session_id: str) -> Read:
    """PgArchive.message_count"""
    after = archive.counted_up_to(session_id) + 1
    return (COUNT_FROM, (after, session_id, after))


def pins(session_id: str) -> Read:
    """PinStore.list"""
    return ("SELECT id, text, created_at FROM pins WHERE session_id = ? ORDER BY created_at, id",
            (session_id,))


def messages(ids: list[int]) -> Read:
    """PgArchive.get_many (the context's leading system messages)"""
    return ("SELECT id, batch_id, body, tokens, created_at FROM messages WHERE id = ANY(?)",
            (list(ids),))


def tail(session_id: str, from_id: int) -> Read:
    """PgArchive.read_from(session_id, from_id)"""
    return (READ_TAIL, (from_id, session_id, from_id))


def stored_bytes(
    session_id: str, from_id: int, also: Sequence[int], less: Sequence[int]
) -> list[Read]:
    """ArchiveStore.stored_bytes (the size bound of a context reply)"""
    return [read for _, read in stored_bytes_parts(session_id, from_id, also, less)]


def stored_bytes_parts(
    session_id: str, from_id: int, also: Sequence[int], less: Sequence[int]
) -> list[tuple[int, Read]]:
    """The reads PgArchive.stored_bytes adds up, each with its sign."""
    out: list[tuple[int, Read]] = [(1, (BYTES_FROM, (from_id, session_id, from_id)))]
    for ids, sign in ((also, 1), (less, -1)):
        for i in range(0, len(ids), 500):
            chunk = list(ids[i : i + 500])
            out.append((sign, ("SELECT coalesce(sum(octet_length(body)), 0) FROM messages "
                               f"WHERE session_id = ? AND id IN ({','.join('?' * len(chunk))})",
                               [session_id, *chunk])))
    return out
