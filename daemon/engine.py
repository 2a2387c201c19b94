"""Engine: the archive, the active contexts, runs, approvals and compaction, as one API.

The engine knows nothing of sockets. It is used from one thread (the daemon's event
loop, or a library user's thread): APSW connections refuse concurrent use. Every write
is one explicit transaction; in-memory state is updated only after the commit, so a
crash at any moment leaves the database as of the last acknowledged call.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ctxd.daemon.compaction import render_summary_message
from ctxd.daemon.compactor import Compactor
from ctxd.daemon.config import Config
from ctxd.daemon.context_store import ContextState
from ctxd.daemon.corrections import mark_superseded
from ctxd.daemon.ids import new_id
from ctxd.daemon.messages import PreparedBatch, prepare_batch, strip_archive_fields
from ctxd.daemon.pairing import check_tool_pairs
from ctxd.daemon.projection import project
from ctxd.daemon.runs import RUN_OUTCOMES
from ctxd.daemon.stores.base import Store
from ctxd.daemon.stores.sqlite import SqliteStore
from ctxd.daemon.summarizers import make_summarizer
from ctxd.daemon.summary import Summarizer, Summary
from ctxd.daemon.tokens import TokenCounter
from ctxd.protocol.errors import (
    Conflict,
    InvalidParams,
    NotFound,
    RunActive,
    SessionNotFound,
)

log = logging.getLogger("ctxd.engine")

EventListener = Callable[[str, str, dict[str, Any]], None]


# "not known: ask the store" (None is a known answer: no open run)
_ASK: Any = object()


class Engine:
    def __init__(
        self,
        config: Config | None = None,
        *,
        summarizer: Summarizer | None = None,
        store: Store | None = None,
    ) -> None:
        """`store`: where the data lives (see stores/base.py); by default the embedded
        SQLite file in the config's data dir."""
        self.config = config or Config()
        if store is None:
            # the archive is private to its user, like the runtime dir
            self.config.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            store = SqliteStore(
                self.config.db_path,
                durability=self.config.durability,
                search_budget_seconds=self.config.search_budget_seconds,
            )
        self.store: Store = store
        # a store other daemons write too (PostgreSQL): per-session state is read from it
        # on every request instead of kept between requests
        self.shared = bool(getattr(store, "shared", False))
        self.archive = store.archive
        self.runs = store.runs
        self.tokens = TokenCounter(self.config.encoding)
        self.summarizer: Summarizer = summarizer or make_summarizer(self.config)
        self.policy = self.config.compaction
        self._contexts: dict[str, ContextState] = {}
        # archived messages per session: counted once, then kept current by appends
        self._archive_counts: dict[str, int] = {}
        # (messages, tokens) of the archive when each compaction ran, and per session the
        # scan's checkpoint (time, (last id, messages, tokens)): see compaction_history
        self._archive_sizes: dict[str, dict[str, tuple[int, int]]] = {}
        self._size_checkpoints: dict[str, tuple[float, tuple[int, int, int]]] = {}
        self._listeners: list[EventListener] = []
        # a store shared with other daemons tells them of each event (ids; they read the
        # rest from the database); None on the embedded store, which has nothing to do
        self._share_event: EventListener | None = getattr(store, "share_event", None)
        self.compactor = Compactor(
            self,
            store,
            summarizer=self.summarizer,
            tokens=self.tokens,
            policy=self.policy,
            emit=self.emit,
        )

    new_id = staticmethod(new_id)

    def set_context_state(self, st: ContextState) -> None:
        """After a committed replacement of the stored context."""
        self._contexts[st.session_id] = st

    @property
    def conn(self) -> Any:
        """The SQLite connection of the embedded store (for tests and tools that look at
        the file itself; the engine never uses it)."""
        return self.store.conn  # type: ignore[attr-defined]

    def close(self) -> None:
        self.store.close()

    # events

    def add_listener(self, listener: EventListener) -> None:
        self._listeners.append(listener)

    def emit(self, session_id: str, method: str, params: dict[str, Any]) -> None:
        self.emit_local(session_id, method, params)
        if self._share_event is not None:
            self._share_event(session_id, method, params)

    def emit_local(self, session_id: str, method: str, params: dict[str, Any]) -> None:
        """To this daemon's subscribers only (an event another daemon shared)."""
        for listener in self._listeners:
            try:
                listener(session_id, method, params)
            except Exception:
                log.exception("event listener failed for %s", method)

    # sessions

    def create_session(
        self,
        session_id: str | None = None,
        title: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        sid = session_id or new_id("ses")
        with self.store.transaction():
            if self.archive.get_session(sid) is not None:
                raise Conflict(
                    f"session {sid!r} already exists; use session/get to read it",
                    {"sessionId": sid},
                )
            self.archive.create_session(sid, title, metadata)
            st = ContextState(session_id=sid)
            self.store.contexts.save(st)
        self._contexts[sid] = st
        return self.get_session(sid)["session"]

    def get_session(self, session_id: str) -> dict[str, Any]:
        session = self.require_session(session_id)
        return {"session": session, "status": self.status(session_id)}

    def list_sessions(
        self, limit: int = 50, cursor: str | None = None, title: str | None = None
    ) -> dict[str, Any]:
        after = None
        if cursor:
            try:
                ts, _, sid = cursor.partition(":")
                after = (float(ts), sid)
            except ValueError:
                raise InvalidParams(
                    "cursor is not one this daemon returned; pass nextCursor from the previous page"
                ) from None
        rows = self.archive.list_sessions(limit + 1, after, title)
        page = rows[:limit]
        sessions = [
            {
                **s,
                "status": self.status(s["sessionId"]),
                "lastActivityAt": self.archive.last_message_at(s["sessionId"]) or s["createdAt"],
            }
            for s in page
        ]
        next_cursor = (
            f"{page[-1]['createdAt']!r}:{page[-1]['sessionId']}" if len(rows) > limit else None
        )
        return {"sessions": sessions, "nextCursor": next_cursor}

    def require_session(self, session_id: str) -> dict[str, Any]:
        session = self.archive.get_session(session_id)
        if session is None:
            raise SessionNotFound(
                f"no session {session_id!r}; create it with session/create or list "
                "sessions with session/list",
                {"sessionId": session_id},
            )
        return session

    def context_state(self, session_id: str) -> ContextState:
        st = None if self.shared else self._contexts.get(session_id)
        if st is not None:
            return st
        st = self.store.contexts.load(session_id)
        if st is None:
            self.require_session(session_id)
            st = self._backfill(session_id)
        self._contexts[session_id] = st
        return st

    def _backfill(self, session_id: str) -> ContextState:
        """A session archived before contexts existed: derive its context once."""
        st = ContextState(session_id=session_id)
        msgs = self.archive.read_from(session_id, 0)
        for m in msgs:
            if st.tail_start_id is None and m["role"] == "system":
                st.system_ids.append(m["id"])
            elif st.tail_start_id is None:
                st.tail_start_id = m["id"]
        st.active_messages = len(msgs)
        st.active_tokens = sum(m["tokens"] for m in msgs)
        st.summary_tokens = self.summary_tokens(session_id, st.summary)
        with self.store.transaction():
            if self.store.contexts.load(session_id) is None:
                self.store.contexts.save(st)
        log.info(
            "backfilled the active context of %s from %d archived messages", session_id, len(msgs)
        )
        return st

    # appending

    def append(
        self,
        session_id: str,
        messages: list[Any],
        *,
        run_id: str | None = None,
        client_batch_id: str | None = None,
        prepared: PreparedBatch | None = None,
        run: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Archive a batch. `prepared` is `prepare_append(messages)` done beforehand (the
        daemon does it in a worker thread for large batches); `run`, the run `run_id`
        names, when the caller has just read it."""
        if session_id not in self._contexts:  # a cached context is of a stored session
            self.require_session(session_id)
        batch = prepared or self.prepare_append(messages, count_tokens=False)
        normalized, digest = batch.normalized, batch.digest
        if client_batch_id is not None:
            found = self.archive.find_batch(session_id, client_batch_id)
            if found is not None:
                return self._repeat_batch(session_id, client_batch_id, found, digest)
        if run_id is not None:
            if run is None or run["runId"] != run_id:
                run = self.runs.get(run_id)
            if run is None or run["sessionId"] != session_id:
                raise NotFound(
                    f"no run {run_id!r} in session {session_id!r}; start one with run/start",
                    {"runId": run_id},
                )
            if run["status"] != "open":
                raise InvalidParams(
                    f"run {run_id!r} is {run['status']}; start a new run", {"runId": run_id}
                )
        pending = check_tool_pairs(
            self.archive,
            self.runs,
            self.context_state(session_id),
            [m for m, _ in normalized],
        )
        counts = batch.tokens or [self.tokens.count_message(m) for m, _ in normalized]
        rows = [(m, body, n) for (m, body), n in zip(normalized, counts, strict=True)]
        with self.store.transaction():
            if self.shared and client_batch_id is not None:
                # the same batch may have come through another daemon meanwhile (a
                # client's retry): it is stored once, and both get its result
                found = self.archive.find_batch(session_id, client_batch_id)
                if found is not None:
                    return self._repeat_batch(session_id, client_batch_id, found, digest)
            # read inside the write transaction: on a shared store another daemon may
            # have appended to this session since this daemon last looked
            st = self.context_state(session_id)
            new = replace(st, system_ids=list(st.system_ids))
            new.active_messages += len(rows)
            new.active_tokens += sum(tokens for _, _, tokens in rows)
            batch_id, ids, created = self.archive.append(
                session_id,
                rows,
                digest=digest,
                run_id=run_id,
                client_batch_id=client_batch_id,
                index_texts=batch.index_texts,
            )
            for (m, _, _), mid in zip(rows, ids, strict=True):
                if new.tail_start_id is None:
                    if m["role"] == "system":
                        new.system_ids.append(mid)
                    else:
                        new.tail_start_id = mid
            self.store.contexts.bump_counts(new)
        self._contexts[session_id] = new
        if session_id in self._archive_counts:
            self._archive_counts[session_id] += len(ids)
        # what this append already asked is not asked again: the run it names is the
        # session's open one, and the pending approvals are those it checked against
        status = self.status(
            session_id, open_run_id=run_id if run_id is not None else _ASK, pending=pending
        )
        self.emit(
            session_id,
            "session/didAppend",
            {
                "sessionId": session_id,
                "batchId": batch_id,
                "messageIds": ids,
                "runId": run_id,
                "status": status,
            },
        )
        return {"batchId": batch_id, "messageIds": ids, "status": status}

    def prepare_append(self, messages: Any, *, count_tokens: bool = True) -> PreparedBatch:
        """The part of `append` that reads no database state; safe in a worker thread."""
        count = self.tokens.count_message if count_tokens else None
        return prepare_batch(
            messages, self.config.max_batch_messages, self.config.max_message_bytes, count
        )

    def _repeat_batch(
        self, session_id: str, client_batch_id: str, found: tuple[int, str, int, int], digest: str
    ) -> dict[str, Any]:
        batch_id, old_digest, first, last = found
        if old_digest != digest:
            raise Conflict(
                f"clientBatchId {client_batch_id!r} was already used for different "
                "messages; use a new clientBatchId for a new batch",
                {"clientBatchId": client_batch_id, "batchId": batch_id},
            )
        ids = list(range(first, last + 1))
        return {"batchId": batch_id, "messageIds": ids, "status": self.status(session_id)}

    # reading

    def read_archive(
        self,
        session_id: str,
        after_id: int = 0,
        limit: int = 200,
        before_id: int | None = None,
        max_bytes: int | None = None,
    ) -> dict[str, Any]:
        """A page of the archive: at most `limit` messages and `max_bytes` of them."""
        self.require_session(session_id)
        if before_id is not None:
            msgs = self.archive.read_before(session_id, before_id, after_id, limit, max_bytes)
            more = len(msgs) == limit or (
                bool(msgs) and self.archive.has_between(session_id, after_id, msgs[0]["id"])
            )
            next_before = msgs[0]["id"] if more else None
            return {"messages": msgs, "nextAfterId": None, "nextBeforeId": next_before}
        msgs = self.archive.read(session_id, after_id, limit, max_bytes)
        more = len(msgs) == limit or (
            bool(msgs) and self.archive.has_between(session_id, msgs[-1]["id"], None)
        )
        next_after = msgs[-1]["id"] if more else None
        return {"messages": msgs, "nextAfterId": next_after}

    def archive_count(self, session_id: str) -> int:
        if self.shared:
            return self.archive.message_count(session_id)
        n = self._archive_counts.get(session_id)
        if n is None:
            n = self._archive_counts[session_id] = self.archive.message_count(session_id)
        return n

    def status(
        self, session_id: str, *, open_run_id: str | None = _ASK, pending: int | None = None
    ) -> dict[str, Any]:
        """`open_run_id` and `pending`: the session's open run and number of pending
        approvals when the caller has just read them."""
        st = self.context_state(session_id)
        if open_run_id is _ASK:
            run = self.runs.open_run(session_id)
            open_run_id = run["runId"] if run else None
        if pending is None:
            pending = self.runs.pending_count(session_id)
        return {
            "sessionId": session_id,
            "activeMessages": st.rendered_messages,
            "estimatedTokens": st.rendered_tokens,
            "archiveMessages": self.archive_count(session_id),
            "compactionCount": st.compaction_count,
            "lastCompactedAt": st.last_compacted_at,
            "pendingApprovals": pending,
            "activeRunId": open_run_id,
            "compacting": session_id in self.compactor.running,
            "autoCompactionPaused": self.compactor.auto_paused(session_id),
            "version": st.version,
        }

    def pins(self, session_id: str) -> list[dict[str, Any]]:
        self.require_session(session_id)
        return self.store.pins.list(session_id)

    def context_messages(self, session_id: str) -> list[dict[str, Any]]:
        """The model input: leading system messages, pins + summary, the exact tail."""
        return self.render(session_id, self.context_state(session_id))

    def render(self, session_id: str, st: ContextState) -> list[dict[str, Any]]:
        return self.render_with_ids(session_id, st)[0]

    def render_with_ids(
        self, session_id: str, st: ContextState
    ) -> tuple[list[dict[str, Any]], list[int | None]]:
        """The model input and, for each message, its archive id (None for the summary)."""
        out = self.system_messages(st)
        ids: list[int | None] = list(st.system_ids[: len(out)])
        text = render_summary_message(self.pin_texts(session_id), st.summary)
        if text:
            out.append({"role": "system", "content": text})
            ids.append(None)
        for m in self.tail_messages(session_id, st):
            out.append(strip_archive_fields(m))
            ids.append(m["id"])
        return out, ids

    def system_messages(self, st: ContextState) -> list[dict[str, Any]]:
        by_id = self.archive.get_many(st.system_ids) if st.system_ids else {}
        return [strip_archive_fields(by_id[i]) for i in st.system_ids if i in by_id]

    def tail_messages(self, session_id: str, st: ContextState) -> list[dict[str, Any]]:
        """The exact tail, as archived (with ids and token counts)."""
        if st.tail_start_id is None:
            return []
        tail = self.archive.read_from(session_id, st.tail_start_id)
        if st.dropped_ids:
            dropped = set(st.dropped_ids)
            tail = [m for m in tail if m["id"] not in dropped]
        return tail

    def pin_texts(self, session_id: str) -> list[str]:
        return [p["text"] for p in self.store.pins.list(session_id)]

    def get_context(
        self,
        session_id: str,
        budget_tokens: int | None = None,
        query: str | None = None,
        include_metadata: bool = False,
        recall_hits: list[dict[str, Any]] | None = None,
        status: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """`recall_hits`: the search for `query`, when the caller already ran it (the
        daemon does, beside its event loop); `status`, the session's status when the
        caller has just read it (an append with `returnContext`)."""
        if budget_tokens is None and not query:
            messages, ids = self.render_with_ids(session_id, self.context_state(session_id))
            result = {"messages": messages, "messageIds": ids}
        else:
            # a step projection: the stored context is never changed by it
            result = project(self, session_id, budget_tokens, query, recall_hits)
        if include_metadata:
            self._attach_metadata(result["messages"], result["messageIds"])
        return {**result, "status": status or self.status(session_id)}

    def _attach_metadata(self, messages: list[dict[str, Any]], ids: list[int | None]) -> None:
        """Give back each archived message's `metadata`, where a client keeps its own form
        of the message (an agent framework's item, say)."""
        by_id = self.archive.get_many([i for i in ids if i is not None])
        for i, mid in enumerate(ids):
            meta = by_id.get(mid, {}).get("metadata") if mid is not None else None
            if meta is not None:
                messages[i] = {**messages[i], "metadata": meta}

    def search(
        self, query: str, *, session_id: str | None = None, **kw: Any
    ) -> list[dict[str, Any]]:
        """The hits of `search_result`, for library users."""
        return self.search_result(query, session_id=session_id, **kw)["hits"]

    def search_result(
        self, query: str, *, session_id: str | None = None, **kw: Any
    ) -> dict[str, Any]:
        """`{hits, matched}` on this thread's connection, within the search budget."""
        if session_id is not None:
            self.require_session(session_id)
        hits, matched = self.archive.search(
            query, session_id=session_id, budget_seconds=self.config.search_budget_seconds, **kw
        )
        return {"hits": self._annotate(hits), "matched": matched}

    async def search_async(
        self, query: str, *, session_id: str | None = None, **kw: Any
    ) -> dict[str, Any]:
        """`search_result` run beside the event loop, so other requests go on meanwhile."""
        if session_id is not None:
            self.require_session(session_id)
        hits, matched = await self.store.search_async(query, session_id=session_id, **kw)
        return {"hits": self._annotate(hits), "matched": matched}

    def _supersessions(self, session_id: str) -> dict[int, int]:
        return self.context_state(session_id).summary.supersessions

    def _annotate(self, hits: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for hit in hits:
            st = self.context_state(hit["sessionId"])
            hit["inActiveContext"] = st.in_active_context(hit["messageId"])
        return mark_superseded(self._supersessions, hits)

    # pins

    def add_pin(self, session_id: str, text: str) -> dict[str, Any]:
        self.require_session(session_id)
        if not isinstance(text, str) or not text.strip():
            raise InvalidParams("a pin needs non-empty text")
        with self.store.transaction():
            pin = self.store.pins.add(new_id("pin"), session_id, text.strip())
            self._refresh_summary_tokens(session_id)
        return pin

    def remove_pin(self, session_id: str, pin_id: str) -> dict[str, Any]:
        self.require_session(session_id)
        with self.store.transaction():
            pin = self.store.pins.remove(session_id, pin_id)
            if pin is None:
                raise NotFound(
                    f"no pin {pin_id!r} in session {session_id!r}; "
                    "context/pins/list shows the pins",
                    {"pinId": pin_id},
                )
            self._refresh_summary_tokens(session_id)
        return pin

    def summary_tokens(self, session_id: str, summary: Summary) -> int:
        text = render_summary_message(self.pin_texts(session_id), summary)
        return self.tokens.count_message({"role": "system", "content": text}) if text else 0

    def _refresh_summary_tokens(self, session_id: str) -> None:
        st = self.context_state(session_id)
        tokens = self.summary_tokens(session_id, st.summary)
        self.store.contexts.set_summary_tokens(session_id, tokens)
        self._contexts[session_id] = replace(st, summary_tokens=tokens)

    # runs and approvals

    def start_run(self, session_id: str) -> dict[str, Any]:
        self.require_session(session_id)
        with self.store.transaction():
            current = self.runs.open_run(session_id)
            if current is not None:
                raise RunActive(
                    f"run {current['runId']} is still open in this session; finish it with "
                    "run/finish first",
                    {"runId": current["runId"]},
                )
            run = self.runs.start(new_id("run"), session_id)
        self.emit(
            session_id, "run/didStart", {"sessionId": session_id, "runId": run["runId"], "run": run}
        )
        return run

    def finish_run(
        self,
        run_id: str,
        outcome: str,
        *,
        messages: list[Any] | None = None,
        client_batch_id: str | None = None,
    ) -> dict[str, Any]:
        """Close a run; returns the run and whether auto-compaction is now due. With
        `messages`, the run's last messages are appended in it first (their result is
        `append`); when they are refused, the run stays open."""
        if outcome not in RUN_OUTCOMES + ("interrupted",):
            raise InvalidParams(f"outcome must be one of {', '.join(RUN_OUTCOMES)}")
        run = self.runs.get(run_id)
        if run is None:
            raise NotFound(
                f"no run {run_id!r}; run/start returns the id to finish", {"runId": run_id}
            )
        if run["status"] != "open":
            raise Conflict(
                f"run {run_id!r} is already {run['status']}",
                {"runId": run_id, "status": run["status"]},
            )
        appended = None
        if messages is not None:
            appended = self.append(
                run["sessionId"], messages, run_id=run_id, client_batch_id=client_batch_id, run=run
            )
        with self.store.transaction():
            run = self.runs.finish(run_id, outcome)
        sid = run["sessionId"]
        due = outcome == "completed" and self.auto_compaction_due(sid)
        self.emit(
            sid, "run/didFinish", {"sessionId": sid, "run": run, "autoCompactionScheduled": due}
        )
        result = {"run": run, "autoCompactionScheduled": due}
        if appended is not None:
            result["append"] = appended
        return result

    def request_approval(
        self,
        session_id: str,
        run_id: str,
        tool_call_id: str,
        tool_name: str | None = None,
        arguments: Any = None,
    ) -> dict[str, Any]:
        self.require_session(session_id)
        run = self.runs.get(run_id)
        if run is None or run["sessionId"] != session_id:
            raise NotFound(f"no run {run_id!r} in session {session_id!r}", {"runId": run_id})
        if run["status"] != "open":
            raise InvalidParams(f"run {run_id!r} is {run['status']}; approvals need an open run")
        if not self.archive.existing_tool_calls(session_id, [tool_call_id]):
            raise NotFound(
                f"no tool call {tool_call_id!r} in session {session_id!r}; append "
                "the assistant message with that call first",
                {"toolCallId": tool_call_id},
            )
        if self.archive.answered_tool_calls(session_id, [tool_call_id]):
            raise Conflict(f"tool call {tool_call_id!r} already has a result")
        for a in self.runs.list_approvals(session_id, "pending"):
            if a["toolCallId"] == tool_call_id:
                raise Conflict(
                    f"tool call {tool_call_id!r} already awaits approval {a['approvalId']}",
                    {"approvalId": a["approvalId"]},
                )
        with self.store.transaction():
            approval = self.runs.request_approval(
                new_id("apr"), session_id, run_id, tool_call_id, tool_name, arguments
            )
        self.emit(
            session_id,
            "approval/didRequest",
            {"sessionId": session_id, "approval": _event_approval(approval)},
        )
        return approval

    def resolve_approval(
        self, approval_id: str, decision: str, reason: str | None = None
    ) -> dict[str, Any]:
        if decision not in ("approved", "denied"):
            raise InvalidParams("decision must be 'approved' or 'denied'")
        with self.store.transaction():
            approval = self.runs.get_approval(approval_id)
            if approval is None:
                raise NotFound(
                    f"no approval {approval_id!r}; approval/list shows them",
                    {"approvalId": approval_id},
                )
            if approval["status"] != "pending":
                raise Conflict(
                    f"approval {approval_id!r} was already {approval['status']}; the first "
                    "decision stands",
                    {"approvalId": approval_id, "status": approval["status"]},
                )
            approval = self.runs.resolve_approval(approval_id, decision, reason)
        sid = approval["sessionId"]
        self.emit(
            sid, "approval/didResolve", {"sessionId": sid, "approval": _event_approval(approval)}
        )
        return approval

    def list_approvals(self, session_id: str, status: str | None = None) -> list[dict[str, Any]]:
        self.require_session(session_id)
        return self.runs.list_approvals(session_id, status)

    def interrupt_runs(self, run_ids: set[str]) -> None:
        """Runs whose client went away without run/finish."""
        for rid in run_ids:
            run = self.runs.get(rid)
            if run and run["status"] == "open":
                self.finish_run(rid, "interrupted")

    # compaction (the Compactor does the work)

    def over_limits(self, session_id: str) -> bool:
        return self.compactor.over_limits(self.context_state(session_id))

    def auto_compaction_due(
        self, session_id: str, status: dict[str, Any] | None = None
    ) -> bool:
        """`status`: the session's status just read, if the caller has it (its open run and
        pending approvals need not be asked for again)."""
        return self.compactor.auto_due(session_id, status)

    async def compact(
        self,
        session_id: str,
        *,
        force: bool = False,
        instructions: str | None = None,
        trigger: str = "manual",
    ) -> dict[str, Any]:
        return await self.compactor.compact(
            session_id, force=force, instructions=instructions, trigger=trigger
        )

    async def rebuild(self, session_id: str, *, dry_run: bool = False) -> dict[str, Any]:
        return await self.compactor.compact(session_id, trigger="rebuild", dry_run=dry_run)

    def compact_sync(self, session_id: str, **kw: Any) -> dict[str, Any]:
        """For library users without an event loop."""
        return asyncio.run(self.compact(session_id, **kw))

    def compaction_log(self, session_id: str, limit: int = 50) -> list[dict[str, Any]]:
        return self.compactor.history(session_id, limit)

    def compaction_history(self, session_id: str, limit: int = 50) -> list[dict[str, Any]]:
        """The attempts, newest first, each with the archive's size when it ran."""
        rows, missing, times, checkpoint = self._history_todo(session_id, limit)
        if missing:
            self._sizes_counted(session_id, missing, times,
                                self.archive.sizes_at(session_id, times, checkpoint))
        return self._with_sizes(session_id, rows)

    async def compaction_history_async(
        self, session_id: str, limit: int = 50
    ) -> list[dict[str, Any]]:
        """`compaction_history` with the archive's sizes counted beside the event loop:
        the first call on a session scans its whole archive (200 ms at 100,000 messages)."""
        rows, missing, times, checkpoint = self._history_todo(session_id, limit)
        if missing:
            counted = await self.store.read_async(
                lambda archive: archive.sizes_at(session_id, times, checkpoint))
            self._sizes_counted(session_id, missing, times, counted)
        return self._with_sizes(session_id, rows)

    def _history_todo(self, session_id: str, limit: int) -> tuple[
        list[dict[str, Any]], list[dict[str, Any]], list[float], tuple[int, int, int]
    ]:
        """The attempts, those whose archive size is not known yet, their times, and the
        checkpoint to count them from."""
        self.require_session(session_id)
        rows = self.compactor.history(session_id, limit)
        # the archive before a compaction never changes: each size is counted once, and
        # later compactions continue the count from the newest one (a checkpoint)
        known = self._archive_sizes.get(session_id, {})
        missing = [r for r in rows if r["compactionId"] not in known]
        times = [r["startedAt"] for r in missing]
        at, checkpoint = self._size_checkpoints.get(session_id, (0.0, (0, 0, 0)))
        if times and min(times) < at:
            checkpoint = (0, 0, 0)  # older than the checkpoint: count from the start
        return rows, missing, times, checkpoint

    def _sizes_counted(
        self, session_id: str, missing: list[dict[str, Any]], times: list[float],
        counted: tuple[list[tuple[int, int]], tuple[int, int, int]],
    ) -> None:
        sizes, end = counted
        known = self._archive_sizes.setdefault(session_id, {})
        for row, size in zip(missing, sizes, strict=True):
            known[row["compactionId"]] = size
        # (another call may have moved the checkpoint meanwhile: keep the later one)
        at, _ = self._size_checkpoints.get(session_id, (0.0, (0, 0, 0)))
        if max(times) >= at:
            self._size_checkpoints[session_id] = (max(times), end)

    def _with_sizes(self, session_id: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        known = self._archive_sizes[session_id] if rows else {}
        for row in rows:
            row["archiveMessages"], row["archiveTokens"] = known[row["compactionId"]]
        return rows


# Events go to every subscriber, and a subscriber that stops reading holds them in the
# daemon until its queue limit: keep them small. approval/list has the full arguments.
EVENT_ARGUMENTS_CHARS = 2048


def _event_approval(approval: dict[str, Any]) -> dict[str, Any]:
    args = approval.get("arguments")
    if args is None:
        return approval
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    if len(text) <= EVENT_ARGUMENTS_CHARS:
        return approval
    return {**approval, "arguments": text[:EVENT_ARGUMENTS_CHARS] + "…", "argumentsTruncated": True}
