"""The protocol's Structs made of a store's records: one function per kind.

Replies and events that carry a session, a run, an approval, a pin or a search hit build
it here, so the wire's shape of each is written once (its camelCase names are
protocol/types.py's).
Beside the engine rather than in it: the PostgreSQL relay of other daemons' events
(stores/postgres/events.py) rebuilds the same events from the same records.
"""

from __future__ import annotations

from ctxd.daemon.stores.records import (
    ApprovalRecord,
    PinRecord,
    RunRecord,
    SearchHitRecord,
    SessionRecord,
)
from ctxd.protocol.types import Approval, ListedSession, Pin, Run, SearchHit, Session, Status


def session_struct(session: SessionRecord) -> Session:
    return Session(
        session_id=session.id,
        title=session.title,
        metadata=session.metadata,
        created_at=session.created_at,
    )


def listed_session_struct(
    session: SessionRecord, status: Status, last_activity_at: float
) -> ListedSession:
    return ListedSession(
        session_id=session.id,
        title=session.title,
        metadata=session.metadata,
        created_at=session.created_at,
        status=status,
        last_activity_at=last_activity_at,
    )


def run_struct(run: RunRecord) -> Run:
    return Run(
        run_id=run.id,
        session_id=run.session_id,
        status=run.status,  # type: ignore[arg-type]  # the store keeps only these
        started_at=run.started_at,
        finished_at=run.finished_at,
    )


def approval_struct(approval: ApprovalRecord) -> Approval:
    return Approval(
        approval_id=approval.id,
        session_id=approval.session_id,
        run_id=approval.run_id,
        tool_call_id=approval.tool_call_id,
        tool_name=approval.tool_name,
        arguments=approval.arguments,
        status=approval.status,  # type: ignore[arg-type]  # the store keeps only these
        reason=approval.reason,
        created_at=approval.created_at,
        resolved_at=approval.resolved_at,
    )


def pin_struct(pin: PinRecord) -> Pin:
    return Pin(pin_id=pin.id, text=pin.text, created_at=pin.created_at)


def search_hit_struct(hit: SearchHitRecord, in_active_context: bool, ordinal: int) -> SearchHit:
    """`superseded_by` is set afterwards, by daemon/corrections.py, on the hits it finds
    superseded."""
    return SearchHit(
        message_id=hit.message_id,
        session_id=hit.session_id,
        role=hit.role,
        snippet=hit.snippet,
        created_at=hit.created_at,
        score=hit.score,
        in_active_context=in_active_context,
        ordinal=ordinal,
    )
