"""The model input as rendered, kept per session between reads.

A read of the active context is its leading system messages, one message for the pins
and the summary, and the exact tail, a suffix of the append-only archive. Re-deriving
it on every read cost a SELECT of the whole tail, a `json.loads` per message, a query of
the pins and a render of the summary. Here each session keeps:

- the decoded tail: every archived message of the session from some id on, extended by
  each append (the engine is the archive's only writer) and cut when a compaction moves
  the tail's start; a read takes the suffix its context starts at;
- the leading system messages, by their ids (archived rows never change);
- the pins, until one is added or removed, and the rendered pins + summary message,
  until the pins or the summary change.

On a store other daemons write too (`shared`, PostgreSQL) the copy is checked on every
read instead of trusted: the tail is extended by the session's messages past the last
one kept (one small read, sent with the request's other reads in one round trip:
stores/postgres/store_ahead.py), which is exact because a session's ids grow in commit
order (its row lock, then the ids), so a message committed by any daemon before the
read began is either kept already or past the last kept id. An append of this daemon's
extends the kept tail only when nothing was committed to the session between the kept
tail's end and the batch (the archive says what preceded the batch under its lock);
otherwise the tail is dropped and read again. The leading system messages are kept by
their ids (archived rows never change); the pins and the summary, which other daemons
change in place, are read with each request. Requests about different sessions run on
worker threads there: every change to what is kept is made under one lock.

Sessions are kept least recently read first out, within a bound on their number and on
the size of their tails.

Kept messages are shared between reads: a read returns new top-level dicts, and what
they hold (content parts, tool calls, metadata) is read-only by convention.
"""

from __future__ import annotations

import json
import threading
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxd.daemon.compaction.rules import render_summary_message
from ctxd.daemon.messages import strip_archive_fields
from ctxd.daemon.stores.base import SharedArchive, Store, shared_store
from ctxd.daemon.stores.records import PinRecord
from ctxd.daemon.stores.sql.contexts import ContextState
from ctxd.daemon.summary import Summary

# sessions kept, and the approximate characters of their kept tails
MAX_SESSIONS = 256
MAX_CHARS = 64 * 1024 * 1024
# a batch with more characters of JSON than this drops the kept tail instead of extending it
DECODE_CHARS = 1024 * 1024


@dataclass
class _Kept:
    # the tail: every archived message of the session with id >= tail_from, in id order
    # (tail_from None: nothing kept), as archived and as the model takes it
    tail_from: int | None = None
    ids: list[int] = field(default_factory=list)
    archived: list[dict[str, Any]] = field(default_factory=list)
    model: list[dict[str, Any]] = field(default_factory=list)
    chars: int = 0
    system_key: tuple[int, ...] | None = None
    system: list[dict[str, Any]] = field(default_factory=list)
    pins: list[PinRecord] | None = None
    # the summary message was rendered from this summary object (and the compaction ids
    # list it held then: a compaction replaces it even when it updates the summary in place)
    summary: Summary | None = None
    summary_cids: list[str] | None = None
    summary_text: str | None = None
    summary_pins: list[str] | None = None
    # counted in the view's bound (False once evicted while a caller still holds it)
    tracked: bool = True


def _chars(msg: dict[str, Any]) -> int:
    """About the size of a decoded message, for the bound (cheap: no encoding)."""
    content = msg.get("content")
    n = 64 + (len(content) if isinstance(content, str) else 0)
    if isinstance(content, list):
        n += len(json.dumps(content, ensure_ascii=False, default=str))
    for call in msg.get("tool_calls") or ():
        n += 64 + len(str(call.get("function", {}).get("arguments", "")))
    if msg.get("metadata") is not None:
        n += len(json.dumps(msg["metadata"], ensure_ascii=False, default=str))
    return n


class ContextView:
    def __init__(
        self, store: Store, *, shared: bool, max_sessions: int = MAX_SESSIONS,
        max_chars: int = MAX_CHARS,
    ) -> None:
        self.archive = store.archive
        self.pin_store = store.pins
        self.shared = shared
        self.max_sessions = max_sessions
        self.max_chars = max_chars
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
        self._chars = 0
        # held while what is kept changes or is sliced: on a shared store requests about
        # different sessions run on worker threads
        self._lock = threading.RLock()
        # the archive of a shared store says which message preceded a batch it stored
        # (under the session's lock): None where it cannot
        self._preceding = (
            self.archive.preceding_id
            if shared and isinstance(self.archive, SharedArchive) else None
        )
        ahead = shared_store(store) if shared else None
        if ahead is not None:
            ahead.keep_view(self)  # its reads ahead ask for what this view needs (tail_mark)

    def _entry(self, session_id: str) -> _Kept:
        with self._lock:
            kept = self._kept.get(session_id)
            if kept is None:
                kept = self._kept[session_id] = _Kept()
                if len(self._kept) > self.max_sessions:
                    self._evict()
            else:
                self._kept.move_to_end(session_id)
            return kept

    def _evict(self) -> None:
        with self._lock:
            while self._kept and (
                len(self._kept) > self.max_sessions or self._chars > self.max_chars
            ):
                _, old = self._kept.popitem(last=False)
                self._chars -= old.chars
                old.tracked = False

    def forget(self, session_id: str) -> None:
        with self._lock:
            old = self._kept.pop(session_id, None)
            if old is not None:
                self._chars -= old.chars
                old.tracked = False

    def tail_mark(self, session_id: str) -> tuple[int, int] | None:
        """(the first id kept, the id a check of the kept tail reads from) when the
        session's tail is kept: a store reads the check ahead with the request's other
        reads (see the module docstring)."""
        with self._lock:
            kept = self._kept.get(session_id)
            if kept is None or kept.tail_from is None:
                return None
            return kept.tail_from, (kept.ids[-1] + 1 if kept.ids else kept.tail_from)

    def keeps_system(self, session_id: str, ids: Sequence[int]) -> bool:
        """Whether the leading system messages `ids` are kept (nothing to read)."""
        kept = self._kept.get(session_id)
        return kept is not None and kept.system_key == tuple(ids)

    # the parts of the model input

    def system_messages(self, st: ContextState) -> list[dict[str, Any]]:
        """The leading system messages as the model takes them (new dicts)."""
        if not st.system_ids:
            return []
        kept = self._entry(st.session_id)
        key = tuple(st.system_ids)
        if kept.system_key != key:
            kept.system, kept.system_key = self._read_system(st.system_ids), key
        return [dict(m) for m in kept.system]

    def _read_system(self, ids: list[int]) -> list[dict[str, Any]]:
        by_id = self.archive.get_many(ids)
        return [strip_archive_fields(by_id[i]) for i in ids if i in by_id]

    def pins(self, session_id: str) -> list[PinRecord]:
        """Oldest first (a new list)."""
        if self.shared:
            return self.pin_store.list(session_id)
        kept = self._entry(session_id)
        if kept.pins is None:
            kept.pins = self.pin_store.list(session_id)
        return list(kept.pins)

    def pin_texts(self, session_id: str) -> list[str]:
        if self.shared:
            return [p.text for p in self.pin_store.list(session_id)]
        kept = self._entry(session_id)
        if kept.pins is None:
            kept.pins = self.pin_store.list(session_id)
        return [p.text for p in kept.pins]

    def pins_changed(self, session_id: str) -> None:
        """A pin was added or removed (or may have been: call it again after a rollback)."""
        kept = self._kept.get(session_id)
        if kept is not None:
            kept.pins = None
            kept.summary = kept.summary_cids = kept.summary_text = None

    def context_replaced(self, session_id: str) -> None:
        """A committed compaction, clear or pop: the summary message is rendered again
        (the tail and system messages are checked against the context on each read)."""
        kept = self._kept.get(session_id)
        if kept is not None:
            kept.summary = kept.summary_cids = kept.summary_text = None

    def summary_text(self, session_id: str, summary: Summary) -> str | None:
        """The pins + summary message's text; None when there are neither."""
        pins = self.pin_texts(session_id)  # first: it may reset the kept text
        kept = self._entry(session_id)
        # on a shared store the pins are read with each request (other daemons change
        # them) and the store hands out one Summary object while its stored text is the
        # same (stores/postgres/contexts.py): the text is rendered again when either moved
        if (kept.summary is not summary or kept.summary_cids is not summary.compaction_ids
                or (self.shared and kept.summary_pins != pins)):
            text = render_summary_message(pins, summary)
            with self._lock:
                kept.summary_text = text
                kept.summary, kept.summary_cids, kept.summary_pins = (
                    summary, summary.compaction_ids, pins)
            return text
        return kept.summary_text

    def tail_messages(self, session_id: str, st: ContextState) -> list[dict[str, Any]]:
        """The exact tail as archived (with ids and token counts). The dicts are shared
        with later reads: read-only."""
        start = st.tail_start_id
        if start is None:
            return []
        kept = self._tail(session_id, start)
        # a new list: a caller may hold it while later appends extend the kept one
        with self._lock:
            tail = kept.archived[bisect_left(kept.ids, start):]
        return self._without_dropped(tail, st)

    def tail_for_model(
        self, session_id: str, st: ContextState
    ) -> tuple[list[dict[str, Any]], list[int]]:
        """The exact tail as the model takes it (new dicts) and its archive ids."""
        start = st.tail_start_id
        if start is None:
            return [], []
        kept = self._tail(session_id, start)
        with self._lock:
            i = bisect_left(kept.ids, start)
            model, ids = kept.model[i:], kept.ids[i:]
        if st.dropped_ids:
            dropped = set(st.dropped_ids)
            pairs = [(m, mid) for m, mid in zip(model, ids, strict=True) if mid not in dropped]
            return [dict(m) for m, _ in pairs], [mid for _, mid in pairs]
        return [dict(m) for m in model], ids

    def kept_messages(
        self, session_id: str, ids: Sequence[int | None]
    ) -> dict[int, dict[str, Any]]:
        """Those of `ids` the session's kept tail holds, as archived (read-only)."""
        with self._lock:
            kept = self._kept.get(session_id)
            if kept is None or not kept.ids:
                return {}
            first, kept_ids, archived = kept.ids[0], kept.ids, kept.archived
        out: dict[int, dict[str, Any]] = {}
        for mid in ids:
            if mid is not None and mid >= first:
                j = bisect_left(kept_ids, mid)
                if j < len(kept_ids) and kept_ids[j] == mid:
                    out[mid] = archived[j]
        return out

    def kept_tail_chars(self, session_id: str, start: int) -> int | None:
        """About the characters of the kept tail when it holds every message from
        `start` on (None when nothing is kept that does): a read then loads nothing."""
        kept = self._kept.get(session_id)
        if kept is None or kept.tail_from is None or kept.tail_from > start:
            return None
        if self.shared:  # what other daemons appended counts too
            kept = self._tail(session_id, start)
        return kept.chars

    def preload_tail(self, session_id: str, start: int, archived: list[dict[str, Any]]) -> None:
        """Keep `archived`, every message of the session from `start` on, read beside the
        event loop. Not evicted here: the caller reads it next (a later read of another
        session evicts it if it is over the bound)."""
        if self.shared:
            return
        self._set_tail(self._entry(session_id), start, archived)

    @staticmethod
    def _without_dropped(tail: list[dict[str, Any]], st: ContextState) -> list[dict[str, Any]]:
        if st.dropped_ids:
            dropped = set(st.dropped_ids)
            return [m for m in tail if m["id"] not in dropped]
        return tail

    def _tail(self, session_id: str, start: int) -> _Kept:
        """The session's kept tail, holding every message from `start` on (on a shared
        store, every one committed before this call)."""
        kept = self._entry(session_id)
        if self.shared and kept.tail_from is not None and kept.tail_from <= start:
            self._catch_up(session_id, kept)
        with self._lock:
            if kept.tail_from is not None and kept.tail_from <= start:
                if kept.ids and kept.ids[0] < start:
                    # the start moved on (a compaction): what is before it is not read again
                    i = bisect_left(kept.ids, start)
                    self._set_tail(kept, start, kept.archived[i:], kept.model[i:])
                return kept
        msgs = self.archive.read_from(session_id, start)
        with self._lock:
            self._set_tail(kept, start, msgs)
            self._evict()
        return kept

    def _catch_up(self, session_id: str, kept: _Kept) -> None:
        """Extend the kept tail by the session's messages past its last id (a shared
        store: other daemons may have appended). Read without the lock; kept only if
        nothing changed the tail meanwhile (else it is dropped and read whole)."""
        with self._lock:
            mark = kept.tail_from, (kept.ids[-1] + 1 if kept.ids else kept.tail_from)
        if mark[0] is None:
            return
        more = self.archive.read_from(session_id, mark[1])
        with self._lock:
            now = kept.tail_from, (kept.ids[-1] + 1 if kept.ids else kept.tail_from)
            if now != mark:
                if more:  # another call extended it meanwhile: read it whole
                    self._drop_tail(kept)
                return
            for msg in more:
                kept.archived.append(msg)
                kept.model.append(strip_archive_fields(msg))
                kept.ids.append(msg["id"])
                n = _chars(msg)
                kept.chars += n
                if kept.tracked:
                    self._chars += n
            if more and self._chars > self.max_chars:
                self._evict()

    def _drop_tail(self, kept: _Kept) -> None:
        if kept.tracked:
            self._chars -= kept.chars
        kept.tail_from, kept.ids, kept.archived, kept.model, kept.chars = None, [], [], [], 0

    def _set_tail(
        self,
        kept: _Kept,
        start: int,
        archived: list[dict[str, Any]],
        model: list[dict[str, Any]] | None = None,
    ) -> None:
        chars = sum(_chars(m) for m in archived)
        if kept.tracked:
            self._chars += chars - kept.chars
        kept.tail_from, kept.chars = start, chars
        kept.archived = archived
        kept.model = model if model is not None else [strip_archive_fields(m) for m in archived]
        kept.ids = [m["id"] for m in archived]

    # appends

    def appended(
        self,
        session_id: str,
        rows: Sequence[tuple[dict[str, Any], str, int]],
        ids: Sequence[int],
        batch_id: int,
        created_at: float,
    ) -> None:
        """A committed batch: (message, JSON body, tokens) each, with its ids. A kept tail
        takes the messages as a read of the archive would return them (decoded from
        their bodies, so nothing is shared with the caller's objects)."""
        preceding = self._preceding(session_id) if self._preceding is not None else None
        with self._lock:
            self._appended(session_id, rows, ids, batch_id, created_at, preceding)

    def _appended(
        self,
        session_id: str,
        rows: Sequence[tuple[dict[str, Any], str, int]],
        ids: Sequence[int],
        batch_id: int,
        created_at: float,
        preceding: int | None,
    ) -> None:
        kept = self._kept.get(session_id)
        if kept is None or kept.tail_from is None:
            return
        if self.shared:
            # kept whole only if the batch follows the kept tail's last message: another
            # daemon's batch committed between them would be missing
            whole = preceding is not None and (
                preceding == kept.ids[-1] if kept.ids else preceding < kept.tail_from)
            if not whole:
                self._drop_tail(kept)
                return
        if sum(len(body) for _, body, _ in rows) > DECODE_CHARS:
            # a large batch is not decoded here, on the event loop: the next read of the
            # context reads the tail again
            self._drop_tail(kept)
            return
        for (_, body, tokens), mid in zip(rows, ids, strict=True):
            if kept.ids and mid <= kept.ids[-1]:
                # already read from the file: a batch committed on another connection
                # (daemon/offload.py) is visible to a read made before this call
                continue
            msg = json.loads(body)
            msg["id"] = mid
            msg["batchId"] = batch_id
            msg["tokens"] = tokens
            msg["createdAt"] = msg.get("createdAt", created_at)  # its own, if it has one
            kept.archived.append(msg)
            kept.model.append(strip_archive_fields(msg))
            kept.ids.append(mid)
            n = _chars(msg)
            kept.chars += n
            if kept.tracked:
                self._chars += n
        if self._chars > self.max_chars:
            self._evict()
