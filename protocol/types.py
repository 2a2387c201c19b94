"""Typed results, notification payloads and message shapes of the protocol (msgspec).

The protocol table (`table_*.py`) declares every method's params Struct and names its
result Struct (`Method.returns`). This module declares what comes back: one Struct per
result and per notification (`NOTIFICATIONS`), with the chat message shapes they
share. Field names are snake_case in Python and camelCase on the wire
(`rename="camel"`); chat messages keep OpenAI's snake_case keys. `python -m ctxd.protocol`
prints all of it as one JSON Schema, from which a client in another language can be
generated; `tests/test_contract.py` checks real daemon replies convert into these types.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

JSON = Any
Role = Literal["system", "user", "assistant", "tool"]


class _Wire(msgspec.Struct, rename="camel", kw_only=True):
    """camelCase keys on the wire."""


# chat messages (OpenAI's shape: snake_case keys)


class ToolCallFunction(msgspec.Struct, kw_only=True):
    name: str
    arguments: str


class ToolCall(msgspec.Struct, kw_only=True):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(msgspec.Struct, kw_only=True):
    """A chat message as appended and as handed back for the model."""

    role: Role
    content: str | list[JSON] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    # where a client keeps its own form of the message (`includeMetadata`)
    metadata: dict[str, JSON] | None = None
    # its own time when appended from elsewhere (an imported transcript), unix seconds
    created_at: float | None = msgspec.field(default=None, name="createdAt")


class ArchivedMessage(ChatMessage, kw_only=True):
    """A message as the archive holds it: the chat message and its archive fields."""

    id: int
    batch_id: int = msgspec.field(name="batchId")
    tokens: int
    created_at: float = msgspec.field(name="createdAt")
    run_id: str | None = msgspec.field(default=None, name="runId")


# shared objects


class Status(_Wire):
    session_id: str
    active_messages: int
    estimated_tokens: int
    archive_messages: int
    compaction_count: int
    last_compacted_at: float | None
    pending_approvals: int
    active_run_id: str | None
    compacting: bool
    auto_compaction_paused: bool
    version: int
    summarizer: str = ""
    summarizer_last_failure_at: float | None = None
    summarizer_last_failure: str | None = None


class Session(_Wire):
    session_id: str
    title: str | None
    metadata: dict[str, JSON] | None
    created_at: float


class ListedSession(Session):
    status: Status
    last_activity_at: float


class Size(_Wire):
    messages: int
    tokens: int


class Run(_Wire):
    run_id: str
    session_id: str
    status: Literal["open", "completed", "failed", "cancelled", "interrupted"]
    started_at: float
    finished_at: float | None


class Approval(_Wire, kw_only=True):
    approval_id: str
    session_id: str
    run_id: str
    tool_call_id: str
    tool_name: str | None
    arguments: JSON
    status: Literal["pending", "approved", "denied"]
    reason: str | None
    created_at: float
    resolved_at: float | None
    # set only in an event's copy whose arguments were cut
    arguments_truncated: bool | msgspec.UnsetType = msgspec.UNSET


class Pin(_Wire):
    pin_id: str
    text: str
    created_at: float


class SearchHit(_Wire):
    message_id: int
    session_id: str
    role: str
    snippet: str
    created_at: float
    score: float
    in_active_context: bool
    # the message's position in its session: the `#N` summaries and listings show
    ordinal: int | None = None
    # the archive id of the statement now current, when a later statement of the same
    # subject superseded this one; absent otherwise
    superseded_by: int | msgspec.UnsetType = msgspec.UNSET


class Truncated(_Wire):
    messages: int
    tokens: int
    from_id: int | None
    to_id: int | None


class ErrorObject(_Wire, omit_defaults=True):
    """`data` only when the error has some."""

    code: int
    message: str
    data: dict[str, JSON] | None = None


# results, one per method


class Empty(_Wire):
    """`{}`."""


class InitializeResult(_Wire, omit_defaults=True):
    """`nonceMac` and `pageKey` only when the login asked for them."""

    server_name: str
    version: str
    protocol_version: str
    capabilities: dict[str, JSON]
    nonce_mac: str | None = None
    page_key: str | None = None


class SessionListResult(_Wire):
    sessions: list[ListedSession]
    next_cursor: str | None


class SessionGetResult(_Wire):
    session: Session
    status: Status


class AppendResult(_Wire):
    batch_id: int
    message_ids: list[int]
    status: Status
    # with `returnContext` only
    context: ContextGetResult | msgspec.UnsetType = msgspec.UNSET


class ArchiveReadResult(_Wire):
    messages: list[ArchivedMessage]
    next_after_id: int | None
    # a page read backwards (`beforeId`) only; null when nothing is older
    next_before_id: int | None | msgspec.UnsetType = msgspec.UNSET
    # the `#N` of the first message (the others follow it one by one); a page with
    # messages only
    first_ordinal: int | msgspec.UnsetType = msgspec.UNSET


class ArchiveSearchResult(_Wire):
    hits: list[SearchHit]
    matched: str


class ContextGetResult(_Wire, kw_only=True):
    """The members after `messageIds` come with a step projection (`budgetTokens` or
    `query`) only, and then all of them."""

    messages: list[ChatMessage]
    message_ids: list[int | None]
    estimated_tokens: int | msgspec.UnsetType = msgspec.UNSET
    budget_tokens: int | None | msgspec.UnsetType = msgspec.UNSET
    over_budget: bool | msgspec.UnsetType = msgspec.UNSET
    truncated: Truncated | None | msgspec.UnsetType = msgspec.UNSET
    recalled_ids: list[int] | msgspec.UnsetType = msgspec.UNSET
    dropped_summary_items: int | msgspec.UnsetType = msgspec.UNSET
    status: Status


class CompactResult(_Wire, kw_only=True):
    # context/rebuild with dryRun: first, the order its reply has always had
    dry_run: bool | None | msgspec.UnsetType = msgspec.UNSET
    effective: bool
    compaction_id: str | None
    before: Size
    after: Size
    summarized_from: int | None
    summarized_to: int | None
    # absent from a dry run's reply
    trigger: str | None | msgspec.UnsetType = msgspec.UNSET
    rederived: bool | None | msgspec.UnsetType = msgspec.UNSET
    reason: str | None | msgspec.UnsetType = msgspec.UNSET
    proposed: JSON | msgspec.UnsetType = msgspec.UNSET
    under_limits: bool | None | msgspec.UnsetType = msgspec.UNSET
    limits: Size | None | msgspec.UnsetType = msgspec.UNSET
    # given instructions: whether they shaped a committed summary
    instructions_applied: bool | None | msgspec.UnsetType = msgspec.UNSET
    note: str | None | msgspec.UnsetType = msgspec.UNSET
    # context/rebuild with dryRun
    messages: list[ChatMessage] | None | msgspec.UnsetType = msgspec.UNSET
    diff: dict[str, int] | None | msgspec.UnsetType = msgspec.UNSET


class ClearResult(_Wire):
    before: Size
    status: Status


class PopResult(_Wire):
    messages: list[ArchivedMessage]
    status: Status


class ExplainResult(_Wire):
    session_id: str
    pins: list[Pin]
    items: list[dict[str, JSON]]
    broken_pointers: int
    provenance: dict[str, JSON] | None


class Compaction(_Wire, kw_only=True):
    compaction_id: str
    trigger: str
    started_at: float
    duration_ms: float | None
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
    # the archive's size when it ran (None only inside the daemon, before it is counted)
    archive_messages: int | None
    archive_tokens: int | None


class CompactionsResult(_Wire):
    compactions: list[Compaction]


class PinResult(_Wire):
    pin: Pin


class PinsResult(_Wire):
    pins: list[Pin]


class RunStartResult(_Wire):
    run_id: str
    run: Run


class RunFinishResult(_Wire):
    run: Run
    auto_compaction_scheduled: bool
    # with `messages` only
    append: AppendResult | msgspec.UnsetType = msgspec.UNSET
    # with `returnContext` only
    context: ContextGetResult | msgspec.UnsetType = msgspec.UNSET


class ApprovalRequestResult(_Wire):
    approval_id: str
    approval: Approval


class ApprovalListResult(_Wire):
    approvals: list[Approval]


class ToolsListResult(_Wire):
    tools: list[dict[str, JSON]]


class ToolsCallResult(_Wire):
    content: str
    data: dict[str, JSON]


class HeartbeatResult(_Wire):
    lease_seconds: float


# notification payloads


class DidAppend(_Wire):
    session_id: str
    batch_id: int
    message_ids: list[int]
    run_id: str | None
    status: Status | None = None


class DidCompact(_Wire, kw_only=True):
    """The session and the `CompactResult` of the compaction (a dry run sends none), in
    its order, with the status after it."""

    session_id: str
    effective: bool
    compaction_id: str | None
    before: Size
    after: Size
    summarized_from: int | None
    summarized_to: int | None
    trigger: Literal["auto", "manual", "rebuild"]
    rederived: bool | None | msgspec.UnsetType = msgspec.UNSET
    reason: str | None | msgspec.UnsetType = msgspec.UNSET
    proposed: JSON | msgspec.UnsetType = msgspec.UNSET
    under_limits: bool | None | msgspec.UnsetType = msgspec.UNSET
    limits: Size | None | msgspec.UnsetType = msgspec.UNSET
    instructions_applied: bool | None | msgspec.UnsetType = msgspec.UNSET
    note: str | None | msgspec.UnsetType = msgspec.UNSET
    status: Status


class DidChange(_Wire):
    session_id: str
    change: Literal["clear", "pop"]
    message_ids: list[int]
    status: Status


class CompactionFailed(_Wire):
    session_id: str
    trigger: Literal["auto", "manual", "rebuild"]
    compaction_id: str | None
    error: ErrorObject


class ApprovalEvent(_Wire):
    session_id: str
    approval: Approval


class RunDidStart(_Wire):
    session_id: str
    run_id: str
    run: Run


class RunDidFinish(_Wire):
    session_id: str
    run: Run
    auto_compaction_scheduled: bool


class DidMissEvents(_Wire):
    session_id: str
    missed: int


class ProgressValue(_Wire, omit_defaults=True):
    """Only the members given."""

    kind: Literal["begin", "report", "end"]
    title: str | None = None
    message: str | None = None
    percentage: float | None = None


class Progress(_Wire):
    session_id: str
    token: str
    value: ProgressValue


NOTIFICATIONS: dict[str, type[msgspec.Struct]] = {
    "session/didAppend": DidAppend,
    "context/didCompact": DidCompact,
    "context/didChange": DidChange,
    "context/compactionFailed": CompactionFailed,
    "approval/didRequest": ApprovalEvent,
    "approval/didResolve": ApprovalEvent,
    "run/didStart": RunDidStart,
    "run/didFinish": RunDidFinish,
    "session/didMissEvents": DidMissEvents,
    "$/progress": Progress,
}
