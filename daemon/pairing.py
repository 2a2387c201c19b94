"""Tool-call pairing: what an append may add without breaking a call from its result.

Providers reject a model input holding a tool result without its call, so an append is
refused whole when a call id repeats one of the session's, a result answers no earlier
call, a call would get a second result, or its call has left the active context (cleared,
popped, or abandoned when its run closed); and while an approval is pending, neither a
user message nor the result of the call awaiting it is accepted. The archive's call
bookkeeping is read once per table for the whole batch.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ctxd.daemon.stores.base import ArchiveStore
from ctxd.daemon.stores.records import ApprovalRecord
from ctxd.daemon.stores.sql.contexts import ContextState
from ctxd.protocol.errors import ApprovalPending, InvalidMessage


def check_tool_pairs(
    archive: ArchiveStore,
    pending: Mapping[str, ApprovalRecord],
    st: ContextState,
    msgs: list[dict[str, Any]],
) -> None:
    """Refuses a batch that would break a tool call's pairing. `pending`: the session's
    pending approvals by tool call id, oldest first."""
    session_id = st.session_id
    call_ids = [c["id"] for m in msgs for c in m.get("tool_calls") or ()]
    result_ids = [m["tool_call_id"] for m in msgs if m["role"] == "tool"]
    # a batch without tool calls or results (a user message, an answer) asks nothing
    existing = archive.call_message_ids(session_id, call_ids + result_ids) if (
        call_ids or result_ids) else {}
    tail_start = st.tail_start_id
    # calls that left the context without a summary: cleared or popped
    gone = set(st.dropped_ids)
    answered = archive.answered_tool_calls(session_id, result_ids) if result_ids else set()
    seen_calls: set[str] = set()
    seen_results: set[str] = set()
    for i, m in enumerate(msgs):
        if m["role"] == "user" and pending:
            raise ApprovalPending(
                f"message {i}: a tool call awaits approval; resolve it with "
                "approval/resolve before adding user messages",
                {"index": i, "approvalIds": [a.id for a in pending.values()]},
            )
        for call in m.get("tool_calls") or ():
            cid = call["id"]
            if cid in seen_calls or cid in existing:
                raise InvalidMessage(
                    f"message {i}: tool call id {cid!r} is already used in this session; "
                    "tool call ids must be unique",
                    {"index": i, "toolCallId": cid},
                )
            seen_calls.add(cid)
        if m["role"] == "tool":
            cid = m["tool_call_id"]
            if cid not in seen_calls and cid not in existing:
                raise InvalidMessage(
                    f"message {i}: tool_call_id {cid!r} answers no earlier tool call of "
                    "this session; append the assistant message with that call first",
                    {"index": i, "toolCallId": cid},
                )
            if cid in seen_results or cid in answered:
                raise InvalidMessage(
                    f"message {i}: tool call {cid!r} already has a result",
                    {"index": i, "toolCallId": cid},
                )
            if cid not in seen_calls and (
                existing[cid] <= st.base_id or existing[cid] in gone
            ):
                raise InvalidMessage(
                    f"message {i}: tool call {cid!r} was cleared or popped from the "
                    "active context; its result can no longer be added",
                    {"index": i, "toolCallId": cid},
                )
            if cid not in seen_calls and tail_start is not None and existing[cid] < tail_start:
                # the context would hold a result without its call, which providers
                # reject; this only happens to calls abandoned when their run closed
                raise InvalidMessage(
                    f"message {i}: tool call {cid!r} was abandoned when its run closed "
                    "and has left the active context; its result can no longer be added",
                    {"index": i, "toolCallId": cid},
                )
            if cid in pending:
                raise ApprovalPending(
                    f"message {i}: tool call {cid!r} awaits approval; its result is "
                    "accepted once approval/resolve decides it",
                    {"index": i, "approvalId": pending[cid].id},
                )
            seen_results.add(cid)
