"""Compactor: moves the oldest active messages into the summary, safely.

One attempt: snapshot the context, choose the tail boundary, summarize what leaves
(without holding the write lock: appends go on meanwhile), then commit atomically if
the context version is unchanged and the result really shrank the context. Messages
appended during the summary stay in the tail, so the committed context is exactly
summary(summarized prefix) + every later message.

Drift control: each incremental summary builds on the last one, so errors compound.
After `rederive_after` incremental compactions, the next one re-derives the summary
from the archive (in chunks) instead of from the previous summary.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from ctxd.daemon.compaction import check_summary, tail_boundary
from ctxd.daemon.compaction_log import CompactionEntry
from ctxd.daemon.config import CompactionPolicy
from ctxd.daemon.context_store import ContextState
from ctxd.daemon.ids import new_id
from ctxd.daemon.messages import for_model, strip_archive_fields
from ctxd.daemon.stores.base import Store
from ctxd.daemon.summary import Summarizer, Summary, SummaryRequest
from ctxd.daemon.tokens import TokenCounter
from ctxd.protocol.errors import (
    ApprovalPending,
    CompactionInProgress,
    CtxdError,
    SummarizerFailed,
)

log = logging.getLogger("ctxd.compactor")

# auto-compaction pauses on a session after this many failures in a row, until a
# manual compaction or a rebuild succeeds there
MAX_AUTO_FAILURES = 3
# messages read per page when a compaction reads the archive from the start
ARCHIVE_PAGE = 2000


# ordinals counted per compaction for sources cited before ordinals were kept
_BACKFILL = 32


class ActiveContexts(Protocol):
    """What a compaction needs of the active contexts (the engine keeps them): the
    current state, its rendering and status, and the replacement after a commit."""

    def require_session(self, session_id: str) -> dict[str, Any]: ...

    def context_state(self, session_id: str) -> ContextState: ...

    def set_context_state(self, st: ContextState) -> None: ...

    def tail_messages(self, session_id: str, st: ContextState) -> list[dict[str, Any]]: ...

    def render(self, session_id: str, st: ContextState) -> list[dict[str, Any]]: ...

    def summary_tokens(self, session_id: str, summary: Summary) -> int: ...

    def status(self, session_id: str) -> dict[str, Any]: ...


Emit = Callable[[str, str, dict[str, Any]], None]


class Compactor:
    def __init__(
        self,
        contexts: ActiveContexts,
        store: Store,
        *,
        summarizer: Summarizer,
        tokens: TokenCounter,
        policy: CompactionPolicy,
        emit: Emit,
    ) -> None:
        self.contexts = contexts
        self.store = store
        self.archive = store.archive
        self.summarizer = summarizer
        self.tokens = tokens
        self.policy = policy
        self.emit = emit
        self.running: set[str] = set()
        # set while no compaction of the session runs: what a waiting one waits for
        self._idle: dict[str, asyncio.Event] = {}
        # manual compactions waiting per session: auto-compaction yields to them
        self._waiting: dict[str, int] = {}
        # an auto-compaction that did not shrink the context waits for this many messages
        self._auto_retry_at: dict[str, int] = {}
        self.auto_failures: dict[str, int] = {}

    # when

    def over_limits(self, st: ContextState) -> bool:
        return (
            st.rendered_messages > self.policy.max_active_messages
            or st.rendered_tokens > self.policy.max_active_tokens
        )

    def auto_paused(self, session_id: str) -> bool:
        return self.auto_failures.get(session_id, 0) >= MAX_AUTO_FAILURES

    def auto_due(self, session_id: str, status: dict[str, Any] | None = None) -> bool:
        st = self.contexts.context_state(session_id)
        if session_id in self.running or self._waiting.get(session_id) or not self.over_limits(st):
            return False
        if self.auto_paused(session_id):
            return False
        if status is not None:
            if status["pendingApprovals"] or status["activeRunId"] is not None:
                return False
        elif self.store.runs.pending_count(session_id) or self.store.runs.open_run(session_id):
            return False
        retry_at = self._auto_retry_at.get(session_id)
        return retry_at is None or st.rendered_messages >= retry_at

    # entry points

    async def compact(
        self,
        session_id: str,
        *,
        force: bool = False,
        instructions: str | None = None,
        trigger: str = "manual",
        dry_run: bool = False,
    ) -> dict[str, Any]:
        self.contexts.require_session(session_id)
        cid = new_id("cmp")
        begun = False
        if session_id in self.running and trigger != "auto":
            # a manual compaction or rebuild asked for while another one runs (often an
            # automatic one) waits for it, then runs on what it left
            begun = await self._wait_for_running(session_id, cid, trigger)
        if self.store.runs.pending_count(session_id):
            if begun:
                self._progress(session_id, cid, {"kind": "end", "message": "not started"})
            raise ApprovalPending(
                "a tool call awaits approval in this session; compaction waits until "
                "approval/resolve decides it"
            )
        if session_id in self.running:
            raise CompactionInProgress(
                "a compaction of this session is running; wait for context/didCompact"
            )
        # a store shared by several daemons lets one of them compact a session at a time
        shared_lock = getattr(self.store, "try_compaction_lock", None)
        if shared_lock is not None and not shared_lock(session_id):
            if begun:
                self._progress(session_id, cid, {"kind": "end", "message": "not started"})
            raise CompactionInProgress(
                "another daemon is compacting this session; wait for context/didCompact "
                "and try again"
            )
        self.running.add(session_id)
        self._idle.setdefault(session_id, asyncio.Event()).clear()
        try:
            under = not self.over_limits(self.contexts.context_state(session_id))
        except BaseException:
            self._unlock(session_id)
            raise
        try:
            result = await self._attempt(
                session_id, force, instructions, trigger, dry_run, cid, begun
            )
            if under and trigger == "manual" and not force and not result["effective"]:
                self._say_under_limits(result)
        except CtxdError:
            if trigger == "auto":
                self.auto_failures[session_id] = self.auto_failures.get(session_id, 0) + 1
            raise
        finally:
            self._unlock(session_id)
        if not dry_run:
            if result.get("compactionId"):
                self.auto_failures.pop(session_id, None)
            # sent once the attempt is over, so the status it carries is final
            self.emit(
                session_id,
                "context/didCompact",
                {"sessionId": session_id, **result, "status": self.contexts.status(session_id)},
            )
        return result

    def _unlock(self, session_id: str) -> None:
        self.running.discard(session_id)
        self._idle[session_id].set()
        release = getattr(self.store, "release_compaction_lock", None)
        if release is not None:
            release(session_id)

    def _say_under_limits(self, result: dict[str, Any]) -> None:
        """A compaction nobody forced, of a context under its limits: that is the news."""
        p = self.policy
        before = result["before"]
        result["underLimits"] = True
        result["limits"] = {"messages": p.max_active_messages, "tokens": p.max_active_tokens}
        result["reason"] = (
            f"the context is under its limits ({before['messages']} of "
            f"{p.max_active_messages} messages, {before['tokens']} of {p.max_active_tokens} "
            "tokens): nothing is due; pass force to compact it anyway"
        )

    async def _wait_for_running(self, session_id: str, cid: str, trigger: str) -> bool:
        """Wait, at most `wait_seconds`, until no compaction of the session runs; reports
        the wait as progress under `cid`. Returns True (progress has begun)."""
        title = "Rebuilding context" if trigger == "rebuild" else "Compacting context"
        self._progress(
            session_id,
            cid,
            {
                "kind": "begin",
                "title": title,
                "message": "waiting for the compaction already running",
                "percentage": 0,
            },
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.policy.wait_seconds
        self._waiting[session_id] = self._waiting.get(session_id, 0) + 1
        try:
            # several waiters may wake together: whoever starts first runs, the others
            # wait on
            while session_id in self.running:
                left = deadline - loop.time()
                try:
                    if left <= 0:
                        raise TimeoutError
                    await asyncio.wait_for(self._idle[session_id].wait(), left)
                except TimeoutError:
                    self._progress(session_id, cid, {"kind": "end", "message": "timed out"})
                    raise CompactionInProgress(
                        f"a compaction of this session was still running after "
                        f"{self.policy.wait_seconds:g} s of waiting; wait for "
                        "context/didCompact and try again",
                        {"waitedSeconds": self.policy.wait_seconds},
                    ) from None
        finally:
            self._waiting[session_id] -= 1
            if not self._waiting[session_id]:
                del self._waiting[session_id]
        self._progress(
            session_id,
            cid,
            {"kind": "report", "message": "the running compaction finished", "percentage": 0},
        )
        return True

    # one attempt

    async def _attempt(
        self,
        session_id: str,
        force: bool,
        instructions: str | None,
        trigger: str,
        dry_run: bool,
        cid: str,
        begun: bool = False,
    ) -> dict[str, Any]:
        started = time.time()
        st = self.contexts.context_state(session_id)
        before = {"messages": st.rendered_messages, "tokens": st.rendered_tokens}
        title = "Rebuilding context" if trigger == "rebuild" else "Compacting context"
        if not begun:
            self._progress(session_id, cid, {"kind": "begin", "title": title, "percentage": 0})
        # The drift bound is for summarizers whose errors compound (models); the built-in
        # one is extractive and deterministic, so re-deriving would only cost time.
        drifts = getattr(self.summarizer, "drifts", True)
        rederive = trigger == "rebuild" or (
            drifts
            and self.policy.rederive_after > 0
            and st.summary.depth >= self.policy.rederive_after
        )
        tail_region = self.contexts.tail_messages(session_id, st)
        region = (
            await self._non_system_messages(session_id, st) if trigger == "rebuild" else tail_region
        )
        boundary = tail_boundary(
            region,
            keep=self.policy.keep_messages,
            keep_tokens=self.policy.max_active_tokens // 2,
            force=force,
            abandoned=self._abandoned_calls(region),
        )
        if trigger == "rebuild" and boundary is None and region:
            boundary = 0  # nothing to summarize: the whole region is the tail
        if boundary is None:
            return self._not_effective(
                cid,
                session_id,
                trigger,
                started,
                before,
                instructions,
                "nothing can leave the context without splitting a tool call from its "
                "result, or dropping the latest user message (force mode)",
            )
        if rederive and trigger != "rebuild":
            # summarize everything before the new tail again, from the archive
            cut = region[boundary]["id"]
            leaving = await self._non_system_messages(session_id, st, before_id=cut)
            log.info(
                "compaction %s of %s re-derives the summary from the archive after %d "
                "incremental compactions",
                cid,
                session_id,
                st.summary.depth,
            )
        else:
            leaving = region[:boundary]
        previous = Summary() if rederive else st.summary
        pins = [p["text"] for p in self.store.pins.list(session_id)]
        ordinals = {**st.summary.ordinals, **self._ordinals(session_id, st.summary, leaving)}
        # items from before ordinals were kept: a few are counted each time, so the
        # summary moves to compact pointers without one compaction paying for all
        missing = sorted(st.summary.all_sources() - ordinals.keys())[-_BACKFILL:]
        for mid in missing:
            ordinals[mid] = self.archive.count_between(session_id, 0, mid)
        try:
            summary = await self._summarize(
                session_id, previous, leaving, pins, instructions, cid, ordinals
            )
        except CtxdError:
            raise
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            with self.store.transaction():
                self._log(
                    cid,
                    session_id,
                    trigger,
                    started,
                    before,
                    None,
                    False,
                    False,
                    leaving,
                    instructions,
                    reason,
                )
            self.emit(
                session_id,
                "context/compactionFailed",
                {
                    "sessionId": session_id,
                    "trigger": trigger,
                    "compactionId": cid,
                    "error": {"code": int(SummarizerFailed.code), "message": str(exc)},
                },
            )
            self._progress(session_id, cid, {"kind": "end", "message": "failed"})
            raise SummarizerFailed(
                f"the summarizer failed: {exc}; the context is unchanged",
                {"compactionId": cid},
            ) from None
        if leaving:
            summary.covers_to = max(summary.covers_to or 0, leaving[-1]["id"])
            if summary.covers_from is None or rederive:
                summary.covers_from = leaving[0]["id"]
        # the model sees per-session ordinals; the map keeps what the summary cites and
        # the last covered message, the anchor the next compaction counts on from
        keep = summary.all_sources() | {summary.covers_to}
        summary.ordinals = {k: v for k, v in ordinals.items() if k in keep}
        # what superseded what outlives the items (search marks superseded hits with it)
        summary.supersessions = dict(
            list({**st.summary.supersessions, **summary.supersessions}.items())[-2000:]
        )
        summary.compaction_ids = [*previous.compaction_ids, cid][-50:]
        summary.depth = 0 if rederive else previous.depth + 1
        return self._commit(
            cid,
            session_id,
            trigger,
            started,
            st,
            summary,
            region,
            boundary,
            leaving,
            instructions,
            dry_run,
            rederive,
        )

    def _abandoned_calls(self, region: list[dict[str, Any]]) -> set[str]:
        """Unanswered tool calls whose run has closed: their results will not come."""
        answered = {m["tool_call_id"] for m in region if m["role"] == "tool"}
        unanswered = {
            c["id"]: m["batchId"]
            for m in region
            for c in m.get("tool_calls") or ()
            if c["id"] not in answered
        }
        if not unanswered:
            return set()
        closed = self.archive.batches_of_closed_runs(set(unanswered.values()))
        return {cid for cid, batch in unanswered.items() if batch in closed}

    def _ordinals(
        self, session_id: str, anchor: Summary, leaving: list[dict[str, Any]]
    ) -> dict[int, int]:
        """Archive id -> 1-based position in the session, for the leaving messages.

        Counted on from the previous summary's last covered message, so the cost is the
        new stretch, not the whole history."""
        if not leaving:
            return {}
        archive = self.archive
        first, last = leaving[0]["id"], leaving[-1]["id"]
        known = anchor.ordinals.get(anchor.covers_to) if anchor.covers_to is not None else None
        if known is not None and anchor.covers_to is not None and anchor.covers_to < first:
            base = known + archive.count_between(session_id, anchor.covers_to + 1, first - 1)
        else:
            base = archive.count_between(session_id, 0, first - 1)
        if archive.count_between(session_id, first, last) == len(leaving):
            return {m["id"]: base + 1 + i for i, m in enumerate(leaving)}
        # messages of the session in between that are not leaving (system messages)
        out: dict[int, int] = {}
        prev = first
        n = base
        for m in leaving:
            n += archive.count_between(session_id, prev, m["id"]) if m["id"] != first else 1
            out[m["id"]] = n
            prev = m["id"] + 1
        return out

    async def _non_system_messages(
        self, session_id: str, st: ContextState, before_id: int | None = None
    ) -> list[dict[str, Any]]:
        """The session's archive since the context began, but its leading system messages,
        read page by page so the daemon keeps serving other requests while a long history
        loads."""
        # neither cleared (context/clear) nor popped (context/pop) messages are in it
        system = set(st.system_ids) | set(st.dropped_ids)
        out: list[dict[str, Any]] = []
        after = st.base_id
        while True:
            page = self.archive.read(session_id, after, ARCHIVE_PAGE)
            for m in page:
                if before_id is not None and m["id"] >= before_id:
                    return out
                if m["id"] not in system:
                    out.append(m)
            if len(page) < ARCHIVE_PAGE:
                return out
            after = page[-1]["id"]
            await asyncio.sleep(0)

    async def _summarize(
        self,
        session_id: str,
        previous: Summary,
        leaving: list[dict[str, Any]],
        pins: list[str],
        instructions: str | None,
        cid: str,
        ordinals: dict[int, int] | None = None,
    ) -> Summary:
        # a summarizer may say how much it takes at once (the built-in one takes large
        # batches: one hop to its worker thread instead of one per 200 messages)
        chunk = max(
            1, getattr(self.summarizer, "chunk_messages", 0) or self.policy.rebuild_chunk_messages
        )
        summary = previous
        allowed = previous.all_sources()
        for start in range(0, len(leaving), chunk):
            part = leaving[start : start + chunk]
            allowed |= {m["id"] for m in part}
            request = SummaryRequest(
                session_id=session_id,
                previous=summary,
                messages=[{**for_model(strip_archive_fields(m)), "id": m["id"]} for m in part],
                pins=pins,
                instructions=instructions,
                budget_tokens=self.policy.summary_budget_tokens,
                count_tokens=self.tokens.count_text,
                ordinals=ordinals or {},
            )
            summary = await self._run_summarizer(request)
            problems = check_summary(summary, allowed)
            if problems:
                raise ValueError("summary rejected: " + "; ".join(problems[:3]))
            if len(leaving) > chunk:
                done = min(99, (start + chunk) * 100 // len(leaving))
                self._progress(session_id, cid, {"kind": "report", "percentage": done})
        return summary

    async def _run_summarizer(self, request: SummaryRequest) -> Summary:
        """CPU-bound summarizers run in a worker thread so the event loop stays free."""
        summarizer = self.summarizer
        summarize_sync = getattr(summarizer, "summarize_sync", None)
        if summarize_sync is not None:
            return await asyncio.to_thread(summarize_sync, request)  # type: ignore[no-any-return]
        return await summarizer.summarize(request)

    def _commit(
        self,
        cid: str,
        session_id: str,
        trigger: str,
        started: float,
        snapshot: ContextState,
        summary: Summary,
        region: list[dict[str, Any]],
        boundary: int,
        leaving: list[dict[str, Any]],
        instructions: str | None,
        dry_run: bool,
        rederived: bool,
    ) -> dict[str, Any]:
        with self.store.transaction():
            now_st = self.store.contexts.load(session_id)
            assert now_st is not None
            if now_st.version != snapshot.version:
                raise CompactionInProgress(
                    "the context was replaced while this compaction ran; nothing was "
                    "changed, try again"
                )
            before = {"messages": now_st.rendered_messages, "tokens": now_st.rendered_tokens}
            new = replace(now_st, summary=summary, version=now_st.version + 1)
            new.tail_start_id = region[boundary]["id"]
            # appends made meanwhile only added to the counters: subtract what left
            count, tokens = self.archive.sums_from(session_id, new.tail_start_id)
            # popped messages (context/pop) stay out; those before the new tail are gone
            new.dropped_ids = [i for i in now_st.dropped_ids if i >= new.tail_start_id]
            if new.dropped_ids:
                dropped = self.archive.get_many(new.dropped_ids).values()
                count -= len(dropped)
                tokens -= sum(m["tokens"] for m in dropped)
            system = self.archive.get_many(now_st.system_ids).values()
            system_tokens = sum(m["tokens"] for m in system)
            new.active_messages = len(now_st.system_ids) + count
            new.active_tokens = system_tokens + tokens
            new.summary_tokens = self.contexts.summary_tokens(session_id, summary)
            after = {"messages": new.rendered_messages, "tokens": new.rendered_tokens}
            effective = (
                after["messages"] < before["messages"] and after["tokens"] < before["tokens"]
            )
            commit = (effective or trigger == "rebuild") and not dry_run
            if commit:
                if effective:
                    new.compaction_count += 1
                    new.last_compacted_at = time.time()
                self.store.contexts.save(new)
            if not dry_run:
                self._log(
                    cid,
                    session_id,
                    trigger,
                    started,
                    before,
                    after,
                    effective,
                    commit,
                    leaving,
                    instructions,
                    None,
                    summary.summarizer or None,
                )
        if dry_run:
            self._progress(session_id, cid, {"kind": "end", "message": "dry run"})
            return self._preview(session_id, snapshot, new, before, after, effective, leaving)
        if commit:
            self.contexts.set_context_state(new)
        if effective:
            self._auto_retry_at.pop(session_id, None)
        elif trigger == "auto":
            self._auto_retry_at[session_id] = before["messages"] + max(
                4, self.policy.keep_messages // 3
            )
        result: dict[str, Any] = {
            "effective": effective,
            "compactionId": cid if commit else None,
            "before": before,
            "after": after if commit else before,
            "summarizedFrom": leaving[0]["id"] if leaving else None,
            "summarizedTo": leaving[-1]["id"] if leaving else None,
            "trigger": trigger,
            "rederived": rederived,
        }
        if not effective and commit:
            result["note"] = (
                "a rebuild is kept even when it does not shrink the context: it re-derives "
                "the context with the current strategy"
            )
        elif not effective:
            result["reason"] = (
                f"the new context would have {after['messages']} messages and "
                f"{after['tokens']} tokens against {before['messages']} and "
                f"{before['tokens']} now: a compaction must shrink both; nothing was changed"
            )
            result["proposed"] = after
        self._progress(
            session_id,
            cid,
            {"kind": "end", "message": "effective" if effective else "not effective"},
        )
        return result

    def _preview(
        self,
        session_id: str,
        old: ContextState,
        new: ContextState,
        before: dict[str, int],
        after: dict[str, int],
        effective: bool,
        leaving: list[dict[str, Any]],
    ) -> dict[str, Any]:
        return {
            "dryRun": True,
            "effective": effective,
            "compactionId": None,
            "before": before,
            "after": after,
            "summarizedFrom": leaving[0]["id"] if leaving else None,
            "summarizedTo": leaving[-1]["id"] if leaving else None,
            "messages": self.contexts.render(session_id, new),
            "diff": {
                "items": new.summary.item_count() - old.summary.item_count(),
                "messages": after["messages"] - before["messages"],
                "tokens": after["tokens"] - before["tokens"],
            },
        }

    def _not_effective(
        self,
        cid: str,
        session_id: str,
        trigger: str,
        started: float,
        before: dict[str, int],
        instructions: str | None,
        reason: str,
    ) -> dict[str, Any]:
        with self.store.transaction():
            self._log(
                cid,
                session_id,
                trigger,
                started,
                before,
                before,
                False,
                False,
                [],
                instructions,
                None,
            )
        if trigger == "auto":
            self._auto_retry_at[session_id] = before["messages"] + max(
                4, self.policy.keep_messages // 3
            )
        self._progress(session_id, cid, {"kind": "end", "message": "not effective"})
        return {
            "effective": False,
            "compactionId": None,
            "before": before,
            "after": before,
            "summarizedFrom": None,
            "summarizedTo": None,
            "trigger": trigger,
            "rederived": False,
            "reason": reason,
        }

    def _progress(self, session_id: str, token: str, value: dict[str, Any]) -> None:
        self.emit(
            session_id, "$/progress", {"sessionId": session_id, "token": token, "value": value}
        )

    def _log(
        self,
        cid: str,
        session_id: str,
        trigger: str,
        started: float,
        before: dict[str, int],
        after: dict[str, int] | None,
        effective: bool,
        committed: bool,
        leaving: list[dict[str, Any]],
        instructions: str | None,
        error: str | None,
        summarizer: str | None = None,
    ) -> None:
        self.store.compactions.record(
            CompactionEntry(
                compaction_id=cid,
                session_id=session_id,
                trigger=trigger,
                started_at=started,
                duration_ms=(time.time() - started) * 1000,
                before_messages=before["messages"],
                before_tokens=before["tokens"],
                after_messages=after["messages"] if after else None,
                after_tokens=after["tokens"] if after else None,
                effective=effective,
                committed=committed,
                summarized_from=leaving[0]["id"] if leaving else None,
                summarized_to=leaving[-1]["id"] if leaving else None,
                # the summary's own word wins: it says when a fallback wrote it
                summarizer=summarizer
                or getattr(self.summarizer, "name", type(self.summarizer).__name__),
                instructions=instructions,
                error=error,
            )
        )
        log.info(
            "compaction %s of %s (%s): effective=%s before=%s after=%s error=%s",
            cid,
            session_id,
            trigger,
            effective,
            before,
            after,
            error,
        )

    def history(self, session_id: str, limit: int = 50) -> list[dict[str, Any]]:
        return [r.to_wire() for r in self.store.compactions.history(session_id, limit)]
