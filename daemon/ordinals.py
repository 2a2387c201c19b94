"""A message's ordinal: its 1-based position among its session's archived messages.

The `#N` the summary cites and every reader-facing listing (CLI, web page, explain,
search, MCP tools) shows is this number; archive ids are written `msg N`. Counting from
the start of a long session would cost a walk over all of it, so each ordinal is counted
from the nearest position already known: the summary's cited ordinals, the session's
start and its end (the newest message is the session's message count).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from ctxd.daemon.stores.base import ArchiveStore


def ordinals_of(
    archive: ArchiveStore,
    session_id: str,
    ids: Iterable[int],
    known: dict[int, int],
    last: tuple[int, int] | None = None,
) -> dict[int, int]:
    """Archive id -> ordinal for `ids` (ids of `session_id`'s messages).

    `known`: ordinals already known (the summary's); `last`: the session's newest id and
    its message count, when the caller has them."""
    anchors: dict[int, int] = {0: 0, **known}
    if last is not None:
        anchors[last[0]] = last[1]
    keys = sorted(anchors)
    out: dict[int, int] = {}
    for mid in sorted(set(ids)):
        if mid in anchors:
            out[mid] = anchors[mid]
            continue
        at = bisect.bisect_left(keys, mid)
        below = keys[at - 1]  # 0 is always there
        above = keys[at] if at < len(keys) else None
        # ids of other sessions interleave, so the id distance only estimates the walk
        if above is not None and above - mid < mid - below:
            n = anchors[above] - archive.count_between(session_id, mid + 1, above)
        else:
            n = anchors[below] + archive.count_between(session_id, below + 1, mid)
        out[mid] = n
        # the next id counts on from this one
        anchors[mid] = n
        bisect.insort(keys, mid)
    return out
