"""Client edits of the active context: `context/clear` and `context/pop`.

Agent frameworks expect a session store they can clear and pop (the OpenAI Agents
SDK's `clear_session`/`pop_item`, LangChain's `clear`). Neither touches the archive:
clearing starts a fresh active context after the newest archived message, popping
leaves the newest messages out of the active context. Both replace the context (its
`version` goes up), so a compaction computed meanwhile is not committed over them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ctxd.daemon.stores.sql.contexts import ContextState
from ctxd.protocol.errors import ApprovalPending
from ctxd.protocol.handlers import serves
from ctxd.protocol.methods import CONTEXT_CLEAR, CONTEXT_POP
from ctxd.protocol.types import ClearResult, DidChange, PopResult, Size

if TYPE_CHECKING:
    from ctxd.daemon.engine import Engine


@serves(CONTEXT_CLEAR)
def clear(engine: Engine, session_id: str) -> ClearResult:
    """Start a fresh active context: no system messages, summary or tail; pins stay."""
    # read inside the write transaction: on a shared store another daemon may have
    # appended, compacted or pinned since this one last looked
    with engine.store.transaction(session_id):
        _refuse_pending(engine, session_id, None)
        st = engine.context_state(session_id)
        before = Size(messages=st.rendered_messages, tokens=st.rendered_tokens)
        new = ContextState(
            session_id=session_id,
            version=st.version + 1,
            base_id=engine.archive.last_id(session_id) or st.base_id,
            compaction_count=st.compaction_count,
            last_compacted_at=st.last_compacted_at,
        )
        new.summary_tokens = engine.summary_tokens(session_id, new.summary)  # the pins
        engine.store.contexts.save(new)
    engine.set_context_state(new)
    status = engine.status(session_id)
    engine.emit(
        session_id,
        "context/didChange",
        DidChange(session_id=session_id, change="clear", message_ids=[], status=status),
    )
    return ClearResult(before=before, status=status)


@serves(CONTEXT_POP)
def pop(engine: Engine, session_id: str, count: int) -> PopResult:
    """Leave the newest `count` tail messages out of the active context.

    The cut is widened so that no tool result stays without its call and no call
    without its results: popping a tool result also pops the assistant message that
    made the call (and what came after it).
    """
    # read inside the write transaction, as `clear` does
    with engine.store.transaction(session_id):
        st, popped = _pop_locked(engine, session_id, count)
    if st is None:
        return PopResult(messages=[], status=engine.status(session_id))
    engine.set_context_state(st)
    status = engine.status(session_id)
    engine.emit(
        session_id,
        "context/didChange",
        DidChange(session_id=session_id, change="pop", message_ids=[m["id"] for m in popped],
                  status=status),
    )
    # copies: the tail's dicts are kept for later reads
    return PopResult(messages=[dict(m) for m in popped], status=status)


def _pop_locked(
    engine: Engine, session_id: str, count: int
) -> tuple[ContextState | None, list[dict[str, Any]]]:
    """The context without the popped messages, saved, and those messages (None and []
    when there is nothing to pop)."""
    st = engine.context_state(session_id)
    tail = engine.tail_messages(session_id, st)
    start = max(0, len(tail) - count)
    call_index = {c["id"]: i for i, m in enumerate(tail) for c in m.get("tool_calls") or ()}
    while True:
        widened = min(
            (call_index.get(m["tool_call_id"], start) for m in tail[start:] if m["role"] == "tool"),
            default=start,
        )
        if widened >= start:
            break
        start = widened
    popped = tail[start:]
    if not popped:
        return None, []
    popped_calls = {c["id"] for m in popped for c in m.get("tool_calls") or ()}
    _refuse_pending(engine, session_id, popped_calls)
    new = replace(
        st,
        version=st.version + 1,
        system_ids=list(st.system_ids),
        dropped_ids=sorted(set(st.dropped_ids) | {m["id"] for m in popped}),
        active_messages=st.active_messages - len(popped),
        active_tokens=st.active_tokens - sum(m["tokens"] for m in popped),
    )
    engine.store.contexts.save(new)
    return new, popped


def _refuse_pending(engine: Engine, session_id: str, call_ids: set[str] | None) -> None:
    """A tool call awaiting a human decision must stay in front of that human."""
    pending = [
        a
        for a in engine.pending_approvals(session_id)
        if call_ids is None or a.tool_call_id in call_ids
    ]
    if pending:
        raise ApprovalPending(
            "a tool call awaits approval; resolve it with approval/resolve first",
            {"approvalIds": [a.id for a in pending]},
        )
