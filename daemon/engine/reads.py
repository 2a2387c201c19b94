"""The engine's reads: the model input, pages of the archive, search, and the pins that
go into the model input. The model input comes from the engine's `ContextView`, which
keeps each session's rendered parts between reads. A part of `Engine`
(daemon/engine/core.py), which provides what is declared below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from ctxd.daemon.compaction.rules import render_summary_message
from ctxd.daemon.config import Config
from ctxd.daemon.corrections import mark_superseded
from ctxd.daemon.engine.context_view import ContextView
from ctxd.daemon.ids import new_id
from ctxd.daemon.ordinals import ordinals_of
from ctxd.daemon.projection import project
from ctxd.daemon.stores.base import ArchiveStore, SharedStore, Store
from ctxd.daemon.stores.records import SearchHitRecord
from ctxd.daemon.stores.sql.contexts import ContextState
from ctxd.daemon.summary import Summary
from ctxd.daemon.tokens import TokenCounter
from ctxd.daemon.views import pin_struct, search_hit_struct
from ctxd.protocol.errors import InvalidParams, NotFound
from ctxd.protocol.handlers import serves
from ctxd.protocol.methods import (
    ARCHIVE_READ,
    CONTEXT_PINS_ADD,
    CONTEXT_PINS_LIST,
    CONTEXT_PINS_REMOVE,
)
from ctxd.protocol.types import (
    ArchiveReadResult,
    ArchiveSearchResult,
    ContextGetResult,
    Pin,
    SearchHit,
    Status,
)

T = TypeVar("T")


class ContextReads:
    config: Config
    store: Store
    archive: ArchiveStore
    tokens: TokenCounter
    view: ContextView
    _contexts: dict[str, ContextState]
    shared: bool
    shared_store: SharedStore | None

    if TYPE_CHECKING:  # provided by Engine

        def check_session(self, session_id: str) -> None: ...

        def context_state(self, session_id: str) -> ContextState: ...

        def status(self, session_id: str) -> Status: ...

        def archive_count(self, session_id: str) -> int: ...

    # the model input

    def context_messages(self, session_id: str) -> list[dict[str, Any]]:
        """The model input: leading system messages, pins + summary, the exact tail."""
        return self.render(session_id, self.context_state(session_id))

    def render(self, session_id: str, st: ContextState) -> list[dict[str, Any]]:
        return self.render_with_ids(session_id, st)[0]

    def render_with_ids(
        self, session_id: str, st: ContextState
    ) -> tuple[list[dict[str, Any]], list[int | None]]:
        """The model input and, for each message, its archive id (None for the summary)."""
        out = self.view.system_messages(st)
        ids: list[int | None] = list(st.system_ids[: len(out)])
        text = self.view.summary_text(session_id, st.summary)
        if text:
            out.append({"role": "system", "content": text})
            ids.append(None)
        tail, tail_ids = self.view.tail_for_model(session_id, st)
        out += tail
        ids += tail_ids
        return out, ids

    def system_messages(self, st: ContextState) -> list[dict[str, Any]]:
        return self.view.system_messages(st)

    def tail_messages(self, session_id: str, st: ContextState) -> list[dict[str, Any]]:
        """The exact tail, as archived (with ids and token counts). Read-only: the
        dicts are kept for later reads."""
        return self.view.tail_messages(session_id, st)

    def pin_texts(self, session_id: str) -> list[str]:
        return self.view.pin_texts(session_id)

    def get_context(
        self,
        session_id: str,
        budget_tokens: int | None = None,
        query: str | None = None,
        include_metadata: bool = False,
        recall_hits: list[SearchHit] | None = None,
        status: Status | None = None,
    ) -> ContextGetResult:
        """`recall_hits`: the search for `query`, when the caller already ran it (the
        daemon does, beside its event loop); `status`, the session's status when the
        caller has just read it (an append with `returnContext`)."""
        ahead = self.shared_store.context_reads if self.shared_store else None
        if ahead is None:
            return self._get_context(session_id, budget_tokens, query, include_metadata,
                                     recall_hits, status)
        with ahead(session_id):
            return self._get_context(session_id, budget_tokens, query, include_metadata,
                                     recall_hits, status)

    def _get_context(
        self,
        session_id: str,
        budget_tokens: int | None,
        query: str | None,
        include_metadata: bool,
        recall_hits: list[SearchHit] | None,
        status: Status | None,
    ) -> ContextGetResult:
        if budget_tokens is None and not query:
            messages, ids = self.render_with_ids(session_id, self.context_state(session_id))
            if include_metadata:
                self._attach_metadata(session_id, messages, ids)
            return ContextGetResult(messages=messages,  # type: ignore[arg-type]
                                    message_ids=ids, status=status or self.status(session_id))
        # a step projection: the stored context is never changed by it
        p = project(self, session_id, budget_tokens, query, recall_hits)
        if include_metadata:
            self._attach_metadata(session_id, p.messages, p.message_ids)
        return ContextGetResult(
            messages=p.messages,  # type: ignore[arg-type]
            message_ids=p.message_ids,
            estimated_tokens=p.estimated_tokens,
            budget_tokens=p.budget_tokens,
            over_budget=p.over_budget,
            truncated=p.truncated,
            recalled_ids=p.recalled_ids,
            dropped_summary_items=p.dropped_summary_items,
            status=status or self.status(session_id),
        )

    def _attach_metadata(
        self, session_id: str, messages: list[dict[str, Any]], ids: list[int | None]
    ) -> None:
        """Give back each archived message's `metadata`, where a client keeps its own form
        of the message (an agent framework's item, say). The kept tail has it; the rest
        (system messages, recalled ones) is read."""
        by_id = self.view.kept_messages(session_id, ids)
        missing = [i for i in ids if i is not None and i not in by_id]
        if missing:
            by_id.update(self.archive.get_many(missing))
        for i, mid in enumerate(ids):
            meta = by_id.get(mid, {}).get("metadata") if mid is not None else None
            if meta is not None:
                messages[i] = {**messages[i], "metadata": meta}

    # the archive

    @serves(ARCHIVE_READ)
    def read_archive(
        self,
        session_id: str,
        after_id: int = 0,
        limit: int = 200,
        before_id: int | None = None,
        max_bytes: int | None = None,
    ) -> ArchiveReadResult:
        """A page of the archive: at most `limit` messages and `max_bytes` of them."""
        self.check_session(session_id)
        if before_id is not None:
            msgs = self.archive.read_before(session_id, before_id, after_id, limit, max_bytes)
            more = len(msgs) == limit or (
                bool(msgs) and self.archive.has_between(session_id, after_id, msgs[0]["id"])
            )
            next_before = msgs[0]["id"] if more else None
            return self._numbered(
                session_id,
                ArchiveReadResult(messages=msgs, next_after_id=None, next_before_id=next_before),
            )
        msgs = self.archive.read(session_id, after_id, limit, max_bytes)
        more = len(msgs) == limit or (
            bool(msgs) and self.archive.has_between(session_id, msgs[-1]["id"], None)
        )
        next_after = msgs[-1]["id"] if more else None
        page = ArchiveReadResult(messages=msgs, next_after_id=next_after)
        return self._numbered(session_id, page)

    def _numbered(self, session_id: str, page: ArchiveReadResult) -> ArchiveReadResult:
        """A page with `firstOrdinal`, the `#N` of its first message (the others follow
        it one by one); an empty page has none."""
        msgs = page.messages
        if msgs:
            page.first_ordinal = self.ordinals(session_id, [msgs[0]["id"]])[msgs[0]["id"]]
        return page

    def ordinals(self, session_id: str, ids: list[int]) -> dict[int, int]:
        """Archive id -> `#N`, its position in the session (see daemon/ordinals.py)."""
        newest = self.archive.last_id(session_id)
        last = (newest, self.archive_count(session_id)) if newest is not None else None
        known = self.context_state(session_id).summary.ordinals
        return ordinals_of(self.archive, session_id, ids, known, last)

    def search(
        self, query: str, *, session_id: str | None = None, **kw: Any
    ) -> list[SearchHit]:
        """The hits of `search_result`, for library users."""
        return self.search_result(query, session_id=session_id, **kw).hits

    def search_result(
        self, query: str, *, session_id: str | None = None, **kw: Any
    ) -> ArchiveSearchResult:
        """`{hits, matched}` on this thread's connection, within the search budget."""
        if session_id is not None:
            self.check_session(session_id)
        hits, matched = self.archive.search(
            query, session_id=session_id, budget_seconds=self.config.search_budget_seconds, **kw
        )
        return ArchiveSearchResult(hits=self._annotate(hits), matched=matched)

    async def search_async(
        self, query: str, *, session_id: str | None = None, **kw: Any
    ) -> ArchiveSearchResult:
        """`search_result` run beside the event loop, so other requests go on meanwhile."""
        if session_id is not None:
            await self.beside_loop_if_shared(lambda: self.check_session(session_id))
        hits, matched = await self.store.search_async(query, session_id=session_id, **kw)
        annotated = await self.beside_loop_if_shared(lambda: self._annotate(hits))
        return ArchiveSearchResult(hits=annotated, matched=matched)

    async def beside_loop_if_shared(self, fn: Callable[[], T]) -> T:
        """`fn()`, beside the event loop on a shared store, where each store call it
        makes may be a round trip (a session checked, the hits' `#N` and context marks
        from sessions this daemon does not keep); on the loop on the embedded store."""
        if self.shared:
            return await self.store.read_async(lambda _archive: fn())
        return fn()

    def _supersessions(self, session_id: str) -> dict[int, int]:
        return self.context_state(session_id).summary.supersessions

    def _annotate(self, hits: list[SearchHitRecord]) -> list[SearchHit]:
        """The store's hits made SearchHits, with what the engine knows of each: still in
        the active context or not, its `#N`, the statement that superseded it."""
        by_session: dict[str, list[int]] = {}
        for hit in hits:
            by_session.setdefault(hit.session_id, []).append(hit.message_id)
        ordinals = {
            (sid, mid): n
            for sid, ids in by_session.items()
            for mid, n in self.ordinals(sid, ids).items()
        }
        structs = [
            search_hit_struct(
                hit,
                self.context_state(hit.session_id).in_active_context(hit.message_id),
                ordinals[(hit.session_id, hit.message_id)],
            )
            for hit in hits
        ]
        return mark_superseded(self._supersessions, structs)

    # pins

    @serves(CONTEXT_PINS_LIST)
    def pins(self, session_id: str) -> list[Pin]:
        self.check_session(session_id)
        return [pin_struct(p) for p in self.view.pins(session_id)]

    @serves(CONTEXT_PINS_ADD)
    def add_pin(self, session_id: str, text: str) -> Pin:
        self.check_session(session_id)
        if not isinstance(text, str) or not text.strip():
            raise InvalidParams("a pin needs non-empty text")
        text = text.strip()
        try:
            with self.store.transaction(session_id):
                # the same text pinned again is the same invariant: one pin, returned again
                for pin in self.store.pins.list(session_id):
                    if pin.text == text:
                        return pin_struct(pin)
                pin = self.store.pins.add(new_id("pin"), session_id, text)
                self.view.pins_changed(session_id)
                self._refresh_summary_tokens(session_id)
        finally:
            # read inside the transaction, the pins are kept only once it has committed
            self.view.pins_changed(session_id)
        return pin_struct(pin)

    @serves(CONTEXT_PINS_REMOVE)
    def remove_pin(self, session_id: str, pin_id: str) -> Pin:
        self.check_session(session_id)
        try:
            with self.store.transaction(session_id):
                pin = self.store.pins.remove(session_id, pin_id)
                if pin is None:
                    raise NotFound(
                        f"no pin {pin_id!r} in session {session_id!r}; "
                        "context/pins/list shows the pins",
                        {"pinId": pin_id},
                    )
                self.view.pins_changed(session_id)
                self._refresh_summary_tokens(session_id)
        finally:
            self.view.pins_changed(session_id)
        return pin_struct(pin)

    def summary_tokens(self, session_id: str, summary: Summary,
                       pins: list[str] | None = None) -> int:
        """The summary message's tokens, with the session's pins (`pins`: their texts
        as the caller read them, so that nothing is asked of the store)."""
        texts = self.pin_texts(session_id) if pins is None else pins
        text = render_summary_message(texts, summary)
        return self.tokens.count_message({"role": "system", "content": text}) if text else 0

    def _refresh_summary_tokens(self, session_id: str) -> None:
        st = self.context_state(session_id)
        tokens = self.summary_tokens(session_id, st.summary)
        self.store.contexts.set_summary_tokens(session_id, tokens)
        self._contexts[session_id] = replace(st, summary_tokens=tokens)
