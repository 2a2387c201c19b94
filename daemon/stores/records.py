"""The rows a store returns for sessions, runs, approvals and pins: small records with
snake_case fields named for their table's columns (`id` is the row's own key).

A store knows nothing of the protocol: the engine turns these into the protocol's
Structs (daemon/views.py), which is where the wire's camelCase names live. Records are
frozen, so one kept between requests (the engine's run book) can be handed out as it is.
Archived messages are not records: a message is the payload, and stays its dict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class SessionRecord:
    id: str
    title: str | None
    # the metadata given at creation, decoded ({} when none was given)
    metadata: dict[str, Any]
    created_at: float


@dataclass(frozen=True, slots=True)
class RunRecord:
    id: str
    session_id: str
    # "open", or how it ended: "completed", "failed", "cancelled", "interrupted"
    status: str
    started_at: float
    finished_at: float | None


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
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


@dataclass(frozen=True, slots=True)
class PinRecord:
    id: str
    session_id: str
    text: str
    created_at: float
