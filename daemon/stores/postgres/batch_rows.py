"""An append's rows on PostgreSQL: one statement, whatever the batch's size.

The embedded store inserts a batch's rows one statement each (an executemany), which
costs SQLite next to nothing. On PostgreSQL each statement is a message psycopg builds
and the server parses, binds and answers: a turn of four messages wrote a dozen rows in
as many statements, and those statements cost the daemon and the server more CPU than
the rows did. Here every table's rows go as arrays in one `INSERT .. SELECT FROM
unnest(..)`, and the tables' inserts are the WITH queries of one statement
(`batch_writes`), inside the append's pipeline (the same round trip). The batch's event
(event_reader.RECORD: its row, and the notifications sent when the transaction commits)
is in that statement too: a statement less for psycopg to build and the server to run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ctxd.daemon.stores.postgres.event_reader import RECORD
from ctxd.daemon.stores.sql.archive import INSERT_BATCH, tool_links

MESSAGES = (
    "INSERT INTO messages(id, session_id, batch_id, role, body, tokens, created_at) "
    "SELECT m.id, ?, ?, m.role, m.body, m.tokens, m.created_at FROM unnest("
    "?::bigint[], ?::text[], ?::text[], ?::integer[], ?::double precision[]) "
    "AS m(id, role, body, tokens, created_at)"
)
SEARCH = (
    "INSERT INTO messages_search(message_id, part, tsv) "
    "SELECT s.id, s.part, s.tsv::tsvector FROM unnest(?::bigint[], ?::integer[], ?::text[]) "
    "AS s(id, part, tsv)"
)
TOOL_CALLS = (
    "INSERT INTO tool_calls(session_id, tool_call_id, call_message_id) "
    "SELECT ?, t.call, t.mid FROM unnest(?::text[], ?::bigint[]) AS t(call, mid)"
)
TOOL_RESULTS = (
    "INSERT INTO tool_results(session_id, tool_call_id, result_message_id) "
    "SELECT ?, t.call, t.mid FROM unnest(?::text[], ?::bigint[]) AS t(call, mid)"
)

BATCH = INSERT_BATCH


def _writes(tool_calls: bool, tool_results: bool) -> str:
    """Every row of a batch and its event in one statement: each table's INSERT a
    data-modifying WITH query of the batch's own (the foreign keys between them are
    checked when the statement ends, once every row is in), then RECORD's own WITH
    query and its notifying SELECT, the statement's query."""
    parts = [("wb", BATCH), ("wm", MESSAGES)]
    if tool_calls:
        parts.append(("wc", TOOL_CALLS))
    if tool_results:
        parts.append(("wr", TOOL_RESULTS))
    parts.append(("ws", SEARCH))
    return ("WITH " + ", ".join(f"{name} AS ({sql})" for name, sql in parts) + ", "
            + RECORD.removeprefix("WITH "))


assert RECORD.startswith("WITH e AS (INSERT ")  # a WITH query to join, then its SELECT


# the batch's statement for each (tool calls?, tool results?)
WRITES = {(c, r): _writes(c, r) for c in (False, True) for r in (False, True)}
# the statements whose arrays (bodies, tsvector literals, tool call ids) go in binary
# (PgConnection.binary_params)
BINARY = frozenset({MESSAGES, SEARCH, TOOL_CALLS, TOOL_RESULTS, *WRITES.values()})


def batch_writes(
    session_id: str, batch_id: int, client_batch_id: str | None, run_id: str | None,
    digest: str, messages: Sequence[tuple[dict[str, Any], str, int]], ids: Sequence[int],
    parts: Sequence[list[str]], now: float, event: Sequence[Any],
) -> tuple[str, list[Any]]:
    """The batch's row, its messages, their search parts, its tool calls and results
    and its event (`event`: RECORD's parameters) as one statement (one message for
    psycopg to build and the server to parse and plan, where there were six): its SQL
    and parameters."""
    params: list[Any] = [batch_id, session_id, client_batch_id, run_id, digest, ids[0],
                         ids[-1], now]
    params += message_rows(session_id, batch_id, messages, ids, now)[1]
    tools = {sql: p for sql, p in tool_rows(session_id, messages, ids)}
    for sql in (TOOL_CALLS, TOOL_RESULTS):
        params += tools.get(sql, ())
    params += search_rows(ids, parts)[1]
    params += event
    return WRITES[TOOL_CALLS in tools, TOOL_RESULTS in tools], params


def message_rows(
    session_id: str, batch_id: int, messages: Sequence[tuple[dict[str, Any], str, int]],
    ids: Sequence[int], now: float,
) -> tuple[str, list[Any]]:
    """The `messages` rows of a batch (a message that brings its own time keeps it)."""
    return MESSAGES, [
        session_id, batch_id, list(ids), [m["role"] for m, _, _ in messages],
        [body for _, body, _ in messages], [tokens for _, _, tokens in messages],
        [float(m.get("createdAt", now)) for m, _, _ in messages],
    ]


def search_rows(ids: Sequence[int], parts: Sequence[list[str]]) -> tuple[str, list[Any]]:
    """The `messages_search` rows: `parts[k]`, the tsvector literals of message ids[k]."""
    mids, nums, lits = [], [], []
    for mid, literals in zip(ids, parts, strict=True):
        for n, lit in enumerate(literals):
            mids.append(mid)
            nums.append(n)
            lits.append(lit)
    return SEARCH, [mids, nums, lits]


def tool_rows(
    session_id: str, messages: Sequence[tuple[dict[str, Any], str, int]], ids: Sequence[int],
) -> list[tuple[str, list[Any]]]:
    """The `tool_calls` and `tool_results` rows of a batch (none: no statement)."""
    calls, results = tool_links(messages, ids)
    out = []
    for sql, rows in ((TOOL_CALLS, calls), (TOOL_RESULTS, results)):
        if rows:
            out.append((sql, [session_id, [r[0] for r in rows], [r[1] for r in rows]]))
    return out
