"""Search that knows about corrections.

The summary remembers which statement superseded which (`Summary.supersessions`, kept
by every compaction). A search hit whose message was superseded says so (`superseded_by`,
`supersededBy` on the wire: the archive id of the statement now current), and the newer
statement ranks directly above it when both are among the hits.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from ctxd.protocol.types import SearchHit

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
    supersessions: Callable[[str], dict[int, int]], hits: list[SearchHit]
) -> list[SearchHit]:
    """`supersessions(session_id)`: that session's map, older statement -> newer one.
    Sets `superseded_by` on the hits it finds superseded."""
    maps: dict[str, dict[int, int]] = {}
    superseded = False
    for hit in hits:
        sid = hit.session_id
        if sid not in maps:
            maps[sid] = supersessions(sid)
        newer = latest(maps[sid], hit.message_id) if maps[sid] else None
        if newer is not None:
            hit.superseded_by = newer
            superseded = True
    if not superseded:
        return hits
    # the current statement goes right above the first hit it supersedes
    out = list(hits)
    for hit in hits:
        newer = hit.superseded_by
        if newer is msgspec.UNSET:
            continue
        at = out.index(hit)
        moved = next((i for i, h in enumerate(out) if h.message_id == newer), None)
        if moved is not None and moved > at:
            out.insert(at, out.pop(moved))
    return out
