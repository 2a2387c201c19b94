"""Replies that carry a session's whole active context, bounded before they are built.

`context/get`, and `messages/append` / `run/finish` with `returnContext`, return the
active context: the leading system messages, the pins + summary message and every
message of the exact tail. A tail of 32 messages of 7.5 MB took 28 s of the event loop
and 1.1 GB to read, decode and encode before the wire refused the 240 MB reply as too
large; every other client waited meanwhile.

Here the reply's size is known first: the session's kept tail tells it when it is small,
otherwise the archive sums the stored sizes of the rows the reply would carry
(`ArchiveStore.stored_bytes`: SQLite reads a row's length without its content), in a
worker thread. A context above the reply limit is refused at once with
`PAYLOAD_TOO_LARGE`, naming what to do instead; one that fits but is large is read and
decoded in a worker thread and handed to the engine's view, so only the (cheap) render
runs on the loop; the dispatcher encodes it beside the loop as well.

An append with `returnContext` answers with the context as right after it, before any
other write: a large batch reads it beside the loop while the write gate (offload.py)
still holds other writes back; a small one counts and reads it at once, on the loop
(the sum reads only row headers; the tail is usually kept in memory already).
"""

from __future__ import annotations

from typing import Any

from ctxd.daemon.engine import Engine
from ctxd.daemon.stores.base import ArchiveStore
from ctxd.protocol.errors import PayloadTooLarge
from ctxd.protocol.types import ContextGetResult, SearchHit, Status

# a context whose kept tail is smaller than this share of the limit is built at once
# (6 bytes per character: the most a character costs in JSON, as a \\u escape)
_BYTES_PER_CHAR = 6
# at this size a tail not kept in memory is read and decoded beside the loop
OFFLOAD_BYTES = 256 * 1024


def refusal(
    session_id: str, size: int, limit: int, tail_from: int | None, appended: Any = None
) -> PayloadTooLarge:
    """The error for a context of `size` bytes above `limit`: what to ask for instead."""
    after = max(0, (tail_from or 1) - 1)
    stored = (
        "the batch was stored (its ids are in `data.appended`); "
        if appended is not None else ""
    )
    data: dict[str, Any] = {"limit": limit, "size": size, "tailFromId": tail_from}
    if appended is not None:
        data["appended"] = appended
    return PayloadTooLarge(
        f"{stored}the active context of session {session_id!r} holds {size} bytes of "
        f"messages; replies are limited to {limit}: read its tail in pages with "
        f"archive/read (afterId {after}, maxBytes), or compact the session "
        "(context/compact) so the context shrinks",
        data,
    )


class ContextReplies:
    """`get_context` of the engine behind the size bound (see the module docstring)."""

    def __init__(self, engine: Engine, max_reply_bytes: int) -> None:
        self.engine = engine
        self.max_reply_bytes = max_reply_bytes

    def _to_count(self, session_id: str) -> tuple[Any, int | None, bool]:
        """(the state, the context's size when it must be counted, None when the kept
        tail shows it is small; whether the tail must be read)."""
        eng = self.engine
        st = eng.context_state(session_id)
        if st.tail_start_id is None:
            return st, None, False
        kept = eng.view.kept_tail_chars(session_id, st.tail_start_id)
        if kept is not None and kept * _BYTES_PER_CHAR * 2 < self.max_reply_bytes:
            return st, None, False
        return st, -1, kept is None

    async def get(
        self,
        session_id: str,
        budget_tokens: int | None = None,
        query: str | None = None,
        include_metadata: bool = False,
        recall_hits: list[SearchHit] | None = None,
        status: Status | None = None,
        appended: Any = None,
    ) -> ContextGetResult:
        """`Engine.get_context`, refused up front when the context cannot fit a reply
        and read beside the loop when it is large. `appended`: what an append with
        `returnContext` stored, named in the refusal."""
        eng = self.engine
        if eng.shared_store is not None:
            return self.get_ahead(session_id, budget_tokens, query, include_metadata,
                                  recall_hits, status, appended)
        st, count, must_read = self._to_count(session_id)
        if count is not None and hasattr(eng.archive, "stored_bytes"):
            start = st.tail_start_id
            system, dropped = list(st.system_ids), list(st.dropped_ids)
            size = await eng.store.read_async(
                lambda archive: _stored_bytes(archive, session_id, start, system, dropped))
            if size > self.max_reply_bytes:
                raise refusal(session_id, size, self.max_reply_bytes, start, appended)
            if must_read and size >= OFFLOAD_BYTES and not eng.shared:
                await self._read_tail(session_id, st)
        return eng.get_context(session_id, budget_tokens, query, include_metadata,
                               recall_hits=recall_hits, status=status)

    def get_ahead(
        self,
        session_id: str,
        budget_tokens: int | None = None,
        query: str | None = None,
        include_metadata: bool = False,
        recall_hits: list[SearchHit] | None = None,
        status: Status | None = None,
        appended: Any = None,
    ) -> ContextGetResult:
        """`get` on a shared store that reads all of it, the size included, in two
        round trips (store.context_reads); synchronous, for a worker thread."""
        with self.engine.store.context_reads(session_id):  # type: ignore[attr-defined]
            return self.get_now(session_id, status=status, appended=appended,
                                budget_tokens=budget_tokens, query=query,
                                include_metadata=include_metadata, recall_hits=recall_hits)

    def get_now(
        self, session_id: str, status: Status | None = None, appended: Any = None,
        **get: Any,
    ) -> ContextGetResult:
        """`get` at once, on the loop: the context right after an append, before any
        other write (its size is summed on the loop: a read of row headers)."""
        eng = self.engine
        st, count, _ = self._to_count(session_id)
        if count is not None and hasattr(eng.archive, "stored_bytes"):
            size = _stored_bytes(eng.archive, session_id, st.tail_start_id,
                                 list(st.system_ids), list(st.dropped_ids))
            if size > self.max_reply_bytes:
                raise refusal(session_id, size, self.max_reply_bytes, st.tail_start_id,
                              appended)
        return eng.get_context(session_id, status=status, **get)

    async def _read_tail(self, session_id: str, st: Any) -> None:
        """Read and decode the tail in a worker thread, and keep it in the engine's view
        when the context has not changed meanwhile (else the render reads it again)."""
        eng = self.engine
        start = st.tail_start_id
        msgs = await eng.store.read_async(lambda archive: archive.read_from(session_id, start))
        if eng.context_state(session_id) is st:
            eng.view.preload_tail(session_id, start, msgs)


def _stored_bytes(
    archive: ArchiveStore, session_id: str, start: int, system: list[int], dropped: list[int]
) -> int:
    return int(archive.stored_bytes(session_id, start, system, dropped))  # type: ignore[attr-defined]
