"""Search that knows about corrections.

The summary remembers which statement superseded which (`Summary.supersessions`, kept
by every compaction). A search hit whose message was superseded says so
(`supersededBy`: the archive id of the statement now current), and the newer statement
ranks directly above it when both are among the hits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# a correction of a correction of ...: how far a chain is followed
_CHAIN = 32


def latest(supersessions: dict[int, int], message_id: int) -> int | None:
    """The id of the statement that finally replaced `message_id`, or None."""
    newer = supersessions.get(message_id)
    for _ in range(_CHAIN):
        if newer is None or newer not in supersessions:
            break
        newer = supersessions[newer]
    return newer


def mark_superseded(
    supersessions: Callable[[str], dict[int, int]], hits: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """`supersessions(session_id)`: that session's map, older statement -> newer one."""
    maps: dict[str, dict[int, int]] = {}
    for hit in hits:
        sid = hit["sessionId"]
        if sid not in maps:
            maps[sid] = supersessions(sid)
        newer = latest(maps[sid], hit["messageId"]) if maps[sid] else None
        if newer is not None:
            hit["supersededBy"] = newer
    if not any("supersededBy" in h for h in hits):
        return hits
    # the current statement goes right above the first hit it supersedes
    out = list(hits)
    for hit in hits:
        newer = hit.get("supersededBy")
        if newer is None:
            continue
        at = out.index(hit)
        moved = next((i for i, h in enumerate(out) if h["messageId"] == newer), None)
        if moved is not None and moved > at:
            out.insert(at, out.pop(moved))
    return out
