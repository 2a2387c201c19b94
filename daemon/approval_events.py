"""The approval as events carry it: the reply's approval, its arguments cut to a bound.

Shared by the engine, which emits `approval/didRequest` and `approval/didResolve`, and
by the PostgreSQL relay, which rebuilds the same events from other daemons' rows, so
the relay needs nothing of the engine.
"""

from __future__ import annotations

import json

import msgspec

from ctxd.protocol.types import Approval

# Events go to every subscriber, and a subscriber that stops reading holds them in the
# daemon until its queue limit: keep them small. approval/list has the full arguments.
EVENT_ARGUMENTS_CHARS = 2048


def event_approval(approval: Approval) -> Approval:
    """`approval` itself when its arguments are short, else a copy with them cut."""
    args = approval.arguments
    if args is None:
        return approval
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    if len(text) <= EVENT_ARGUMENTS_CHARS:
        return approval
    return msgspec.structs.replace(
        approval, arguments=text[:EVENT_ARGUMENTS_CHARS] + "…", arguments_truncated=True
    )
