"""The rows a store returns for sessions, runs, approvals, pins and search hits: small
records with snake_case fields named for their table's columns (`id` is the row's own key).

A store knows nothing of the protocol: the engine turns these into the protocol's
Structs (daemon/views.py), which is where the wire's camelCase names live. Records are
immutable, so one kept between requests (the engine's run book) can be handed out as it
is. NamedTuples rather than frozen dataclasses: a list of approvals is read on every
approval/list and a frozen dataclass costs five times a NamedTuple to make.
Archived messages are not records: a message is the payload, and stays its dict.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class SessionRecord(NamedTuple):
    id: str
    title: str | None
    # the metadata given at creation, decoded ({} when none was given)
    metadata: dict[str, Any]
    created_at: float


class RunRecord(NamedTuple):
    id: str
    session_id: str
    # "open", or how it ended: "completed", "failed", "cancelled", "interrupted"
    status: str
    started_at: float
    finished_at: float | None


class ApprovalRecord(NamedTuple):
    id: str
    session_id: str
    run_id: str
    tool_call_id: str
    tool_name: str | None
    # the tool call's arguments as given, decoded (None when none were given)
    arguments: Any
    # "pending", "approved" or "denied"
    status: str
    reason: str | None
    created_at: float
    resolved_at: float | None


class PinRecord(NamedTuple):
    id: str
    session_id: str
    text: str
    created_at: float


class SearchHitRecord(NamedTuple):
    """One search hit as the store knows it; what the engine knows besides (whether the
    message is still in context, its `#N`, the statement that superseded it) is added
    when the protocol's SearchHit is made of it (daemon/views.py)."""

    message_id: int
    session_id: str
    role: str
    # the matching text around the query's words, the words in **bold**
    snippet: str
    created_at: float
    # the higher the better, rounded to 4 places (BM25 on SQLite, ts_rank on PostgreSQL)
    score: float
