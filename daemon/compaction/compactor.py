"""Compactor: moves the oldest active messages into the summary, safely.

One attempt: snapshot the context, choose the tail boundary, summarize what leaves
(without holding the write lock: appends go on meanwhile), then commit atomically if
the context version is unchanged and the result really shrank the context. Messages
appended during the summary stay in the tail, so the committed context is exactly
summary(summarized prefix) + every later message.

Drift control: each incremental summary builds on the last one, so errors compound.
After `rederive_after` incremental compactions, the next one re-derives the summary
from the archive (in chunks) instead of from the previous summary.

This module decides when and whether an attempt runs (limits, auto-compaction's retries
and pause) and drives it; `one_at_a_time` keeps one compaction of a session running at a
time (waiting, the lock shared with other daemons), `inputs` reads what leaves and
summarizes it, `commit` commits, logs and shapes the result.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple, NoReturn, Protocol, TypeVar

import msgspec

from ctxd.daemon.busy import when_free, when_free_off_loop
from ctxd.daemon.compaction import commit, inputs, preambles
from ctxd.daemon.compaction.commit import Attempt
from ctxd.daemon.compaction.one_at_a_time import OneAtATime
from ctxd.daemon.compaction.rules import rebuild_boundary, tail_boundary, valid_boundaries
from ctxd.daemon.config import CompactionPolicy
from ctxd.daemon.ids import new_id
from ctxd.daemon.stores.base import Store, shared_store
from ctxd.daemon.stores.records import SessionRecord
from ctxd.daemon.stores.sql.contexts import ContextState
from ctxd.daemon.summary import Summarizer, Summary
from ctxd.daemon.tokens import TokenCounter
from ctxd.protocol.errors import (
    ApprovalPending,
    CompactionInProgress,
    CtxdError,
    SummarizerFailed,
)
from ctxd.protocol.types import (
    Compaction,
    CompactionFailed,
    CompactResult,
    DidCompact,
    ErrorObject,
    Progress,
    ProgressValue,
    Status,
)

log = logging.getLogger("ctxd.compactor")

# auto-compaction pauses on a session after this many failures in a row, until a
# manual compaction or a rebuild succeeds there
MAX_AUTO_FAILURES = 3

T = TypeVar("T")


def _nowhere(session_id: str) -> bool:
    return False


class ActiveContexts(Protocol):
    """What a compaction needs of the active contexts (the engine keeps them): the
    current state, its rendering and status, and the replacement after a commit."""

    def require_session(self, session_id: str) -> SessionRecord: ...

    def context_state(self, session_id: str) -> ContextState: ...

    def set_context_state(self, st: ContextState) -> None: ...

    def tail_messages(self, session_id: str, st: ContextState) -> list[dict[str, Any]]: ...

    def render(self, session_id: str, st: ContextState) -> list[dict[str, Any]]: ...

    def summary_tokens(self, session_id: str, summary: Summary,
                       pins: list[str] | None = None) -> int: ...

    def status(self, session_id: str) -> Status: ...


class RunActivity(Protocol):
    """What holds an auto-compaction back: a session's `Status`, or just these two."""

    @property
    def pending_approvals(self) -> int: ...

    @property
    def active_run_id(self) -> str | None: ...


class Activity(NamedTuple):
    pending_approvals: int
    active_run_id: str | None


# (session id, notification name, its payload Struct from protocol/types.py)
Emit = Callable[[str, str, msgspec.Struct], None]


class Compactor(OneAtATime):
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
        # a store shared with other daemons: its lock lets one compact a session at a
        # time, and `elsewhere` says whether another daemon compacts one (the engine asks it
        # on a shared store only)
        shared = shared_store(store)
        self._shared_lock: Callable[[str], bool] | None = (
            shared.try_compaction_lock if shared else None)
        self._shared_release: Callable[[str], None] | None = (
            shared.release_compaction_lock if shared else None)
        self.elsewhere: Callable[[str], bool] = (
            shared.compacting_elsewhere if shared else _nowhere)
        # a shared store's worker threads: each of its calls is a round trip to a server
        self._in_lane = shared.in_lane if shared else None

    async def beside_loop(self, session_id: str, fn: Callable[[], T]) -> T:
        """`fn()`, which reads or writes the store: on a shared store, on the session's
        worker thread after its earlier calls, so the event loop serves other clients
        while the server answers (one round trip at 5 ms between hosts held every
        client's `context/status` behind an automatic compaction); on the embedded
        store, here (SQLite answers in microseconds, and its connection is the loop's)."""
        if self._in_lane is None:
            return fn()
        return await self._in_lane(session_id, fn)

    # when

    def over_limits(self, st: ContextState) -> bool:
        return (
            st.rendered_messages > self.policy.max_active_messages
            or st.rendered_tokens > self.policy.max_active_tokens
        )

    def auto_paused(self, session_id: str) -> bool:
        return self.auto_failures.get(session_id, 0) >= MAX_AUTO_FAILURES

    def auto_due(self, session_id: str, status: RunActivity | None = None) -> bool:
        st = self.contexts.context_state(session_id)
        if session_id in self.running or self._waiting.get(session_id) or not self.over_limits(st):
            return False
        if self.auto_paused(session_id):
            return False
        if status is not None:
            if status.pending_approvals or status.active_run_id is not None:
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
    ) -> CompactResult | None:
        """The result; None for an automatic one found no longer due."""
        await self.beside_loop(session_id, lambda: self.contexts.require_session(session_id))
        cid = new_id("cmp")
        begun = False
        # a store shared by several daemons lets one of them compact a session at a time
        locked = False  # whether this holds the session's shared compaction lock
        if trigger != "auto":
            # a manual compaction or rebuild asked for while another one runs (often an
            # automatic one, here or on another daemon) waits for it, then runs on what
            # it left
            if not await self._take_if_free(session_id):
                begun = await self._wait_for_running(session_id, cid, trigger)
            locked = True
        try:
            # read first: the checks below and marking the session running are made with
            # nothing awaited between them (the shared lock's round trips excepted:
            # `_take_if_free` looks at the running mark again after them)
            pending = await self.beside_loop(
                session_id, lambda: self.store.runs.pending_count(session_id))
            if pending:
                if begun:
                    self._progress(session_id, cid,
                                   ProgressValue(kind="end", message="not started"))
                raise ApprovalPending(
                    "a tool call awaits approval in this session; compaction waits until "
                    "approval/resolve decides it"
                )
            if session_id in self.running:
                raise CompactionInProgress(
                    "a compaction of this session is running; wait for context/didCompact"
                )
            if not locked and not await self._take_if_free(session_id):
                if session_id in self.running:  # started here while the lock was asked for
                    raise CompactionInProgress(
                        "a compaction of this session is running; wait for context/didCompact"
                    )
                raise CompactionInProgress(
                    "another daemon is compacting this session; wait for context/didCompact "
                    "and try again"
                )
        except BaseException:
            if locked:
                await self._release_shared(session_id)
            raise
        self.running.add(session_id)
        self._idle.setdefault(session_id, asyncio.Event()).clear()
        try:
            under = not self.over_limits(await self.beside_loop(
                session_id, lambda: self.contexts.context_state(session_id)))
        except BaseException:
            await self._unlock(session_id)
            raise
        if under and trigger == "auto":
            # due when it was scheduled, not now: on a shared store another daemon has
            # compacted the session since (compacting it again would only shrink the tail)
            await self._unlock(session_id)
            log.info("auto-compaction of %s skipped: compacted meanwhile", session_id)
            return None
        try:
            result = await self._attempt(
                session_id, force, instructions, trigger, dry_run, cid, begun
            )
            if under and trigger == "manual" and not force and not result.effective:
                commit.say_under_limits(result, self.policy)
            if instructions and not dry_run:
                commit.say_instructions(result)
        except CtxdError:
            if trigger == "auto":
                self.auto_failures[session_id] = self.auto_failures.get(session_id, 0) + 1
            raise
        finally:
            await self._unlock(session_id)
        if not dry_run:
            if result.compaction_id:
                self.auto_failures.pop(session_id, None)
            # sent once the attempt is over, so the status it carries is final
            status = await self.beside_loop(session_id, lambda: self.contexts.status(session_id))
            self.emit(
                session_id,
                "context/didCompact",
                DidCompact(session_id=session_id, status=status, **_event_members(result)),
            )
        return result

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
    ) -> CompactResult:
        a = Attempt(cid, session_id, trigger, time.time(), instructions, dry_run)
        st, tail_region, pins = await self.beside_loop(
            session_id, lambda: self._read_context(session_id))
        before = {"messages": st.rendered_messages, "tokens": st.rendered_tokens}
        title = "Rebuilding context" if trigger == "rebuild" else "Compacting context"
        if not begun:
            self._progress(session_id, cid, ProgressValue(kind="begin", title=title, percentage=0))
        rederive = inputs.rederives(self.summarizer, self.policy, st, trigger)
        region = (
            await inputs.non_system_messages(self.archive, session_id, st)
            if trigger == "rebuild"
            else tail_region
        )
        # which tool calls will never be answered asks the archive (runs closed)
        abandoned = await self.beside_loop(
            session_id, lambda: inputs.abandoned_calls(self.archive, region))
        boundary = tail_boundary(
            region,
            keep=self.policy.keep_messages,
            keep_tokens=self.policy.max_active_tokens // 2,
            force=force,
            abandoned=abandoned,
            force_keep=self.policy.force_keep_messages,
        )
        if trigger == "rebuild" and region:
            boundary = rebuild_boundary(region, boundary, st.tail_start_id)
        if boundary is None:
            return await self.beside_loop(session_id, lambda: self._not_effective(
                a,
                before,
                "nothing can leave the context: the tail keeps at least the latest message "
                "and never starts between a tool call and its result"
                + ("" if force else f", and it keeps {self.policy.keep_messages} messages "
                   "(pass force to keep fewer)"),
            ))
        tries = [boundary]
        last = valid_boundaries(region, abandoned)[-1:]
        if force and trigger == "manual" and last and last[0] > boundary:
            # a summary that would not pay for itself (short messages, the header's
            # cost): the shortest tail is tried once more
            tries.append(last[0])
        for boundary in tries:
            summary, leaving, departing = await self._summarize_upto(
                a, st, region, boundary, rederive, pins, before
            )
            # with the pins as the attempt read them: on a shared store each reading of
            # them is a round trip, and this runs on the event loop (the commit counts
            # them again in its transaction)
            grows = self.contexts.summary_tokens(session_id, summary, pins) - st.summary_tokens
            if grows < departing:
                break
        # on a shared store the session may be being written through another daemon at
        # this moment: wait for it beside the event loop (busy.py), and commit on the
        # session's worker thread (a transaction of several round trips)
        def commit_it() -> CompactResult:
            return self._commit(a, st, summary, region[boundary]["id"], leaving, rederive)

        if self._in_lane is None:
            return await when_free(self.store, commit_it)
        return await when_free_off_loop(self.store, session_id, commit_it)

    def _read_context(
        self, session_id: str
    ) -> tuple[ContextState, list[dict[str, Any]], list[str]]:
        """What an attempt starts from: the context, its tail's messages, the pins."""
        st = self.contexts.context_state(session_id)
        pins = [p.text for p in self.store.pins.list(session_id)]
        return st, self.contexts.tail_messages(session_id, st), pins

    async def _summarize_upto(
        self,
        a: Attempt,
        st: ContextState,
        region: list[dict[str, Any]],
        boundary: int,
        rederive: bool,
        pins: list[str],
        before: dict[str, int],
    ) -> tuple[Summary, list[dict[str, Any]], int]:
        """The summary for a tail starting at `region[boundary]`, what it summarized,
        and the tokens of the messages leaving the context."""
        session_id, cid = a.session_id, a.cid
        if rederive and a.trigger != "rebuild":
            # summarize everything before the new tail again, from the archive
            cut = region[boundary]["id"]
            leaving = await inputs.non_system_messages(self.archive, session_id, st, before_id=cut)
            log.info("compaction %s of %s re-derives the summary from the archive after %d "
                     "incremental compactions", cid, session_id, st.summary.depth)
        else:
            leaving = region[:boundary]
        previous = Summary() if rederive else st.summary
        ordinals = await self.beside_loop(
            session_id, lambda: inputs.ordinals(self.archive, session_id, st.summary, leaving))
        # what leaves the context now (a rebuild or re-derivation also reads messages
        # the old summary stands for): the summary may grow by a share of it
        start = st.tail_start_id or 0
        departing = sum(int(m.get("tokens", 0)) for m in region[:boundary] if m["id"] >= start)
        overhead = inputs.summary_overhead(
            lambda s: self.contexts.summary_tokens(session_id, s, pins), self.tokens.count_text
        )
        # instruction preambles move into the summary message word for word, outside
        # the summary's own bound (preambles.py)
        kept, carried, leaving_tokens = preambles.plan(
            self.policy.instructions_max_tokens, st.summary, previous, leaving,
            region[boundary:], departing, self.tokens.count_text)
        limit = inputs.size_limit(self.policy, st.summary_tokens - carried, overhead,
                                  leaving_tokens)
        try:
            summary = await inputs.summarize(
                self.summarizer, self.policy, self.tokens, session_id, previous, leaving, pins,
                a.instructions, ordinals,
                lambda done: self._progress(
                    session_id, cid, ProgressValue(kind="report", percentage=done)
                ),
                limit,
                [p.text for p in kept],
            )
        except CtxdError:
            raise
        except Exception as exc:
            self._failed(a, before, leaving, exc)
        summary.preambles = kept
        preambles.drop_repeated(summary)
        inputs.finish(summary, st.summary, previous, leaving, ordinals, cid, rederive)
        return summary, leaving, departing

    def _failed(
        self, a: Attempt, before: dict[str, int], leaving: list[dict[str, Any]], exc: Exception
    ) -> NoReturn:
        """The summarizer raised: log it, tell the session, raise SummarizerFailed."""
        reason = f"{type(exc).__name__}: {exc}"
        with self.store.transaction():
            commit.record(self.store, a, self._name(), before, None, False, False, leaving, reason)
        self.emit(
            a.session_id,
            "context/compactionFailed",
            CompactionFailed(
                session_id=a.session_id,
                trigger=a.trigger,  # type: ignore[arg-type]
                compaction_id=a.cid,
                error=ErrorObject(code=int(SummarizerFailed.code), message=str(exc)),
            ),
        )
        self._progress(a.session_id, a.cid, ProgressValue(kind="end", message="failed"))
        raise SummarizerFailed(
            f"the summarizer failed: {exc}; the context is unchanged",
            {"compactionId": a.cid},
        ) from None

    def _commit(
        self,
        a: Attempt,
        snapshot: ContextState,
        summary: Summary,
        tail_start_id: int,
        leaving: list[dict[str, Any]],
        rederived: bool,
    ) -> CompactResult:
        session_id = a.session_id
        with self.store.transaction(session_id):
            o = commit.apply_summary(
                self.store, a, snapshot, summary, tail_start_id, self.contexts.summary_tokens
            )
            if not a.dry_run:
                name = self._name(summary.summarizer)
                commit.record(
                    self.store, a, name, o.before, o.after, o.effective, o.committed, leaving, None
                )
        if a.dry_run:
            self._progress(session_id, a.cid, ProgressValue(kind="end", message="dry run"))
            return commit.preview(snapshot, o, leaving, self.contexts.render(session_id, o.new))
        if o.committed:
            self.contexts.set_context_state(o.new)
        if o.effective:
            self._auto_retry_at.pop(session_id, None)
        elif a.trigger == "auto":
            self._retry_later(session_id, o.before)
        result = commit.result(a, o, leaving, rederived)
        self._progress(
            session_id,
            a.cid,
            ProgressValue(kind="end", message="effective" if o.effective else "not effective"),
        )
        return result

    def _not_effective(self, a: Attempt, before: dict[str, int], reason: str) -> CompactResult:
        with self.store.transaction():
            commit.record(self.store, a, self._name(), before, before, False, False, [], None)
        if a.trigger == "auto":
            self._retry_later(a.session_id, before)
        self._progress(a.session_id, a.cid, ProgressValue(kind="end", message="not effective"))
        return commit.not_effective(a, before, reason)

    def _retry_later(self, session_id: str, before: dict[str, int]) -> None:
        """An auto-compaction that did not shrink the context waits for more messages."""
        self._auto_retry_at[session_id] = before["messages"] + max(
            4, self.policy.keep_messages // 3
        )

    def _progress(self, session_id: str, token: str, value: ProgressValue) -> None:
        self.emit(
            session_id, "$/progress", Progress(session_id=session_id, token=token, value=value)
        )

    def _name(self, written_by: str = "") -> str:
        """The summarizer a log entry names: the summary's own word wins (it says when a
        fallback wrote it), else the configured one's."""
        return written_by or getattr(self.summarizer, "name", type(self.summarizer).__name__)

    def history(self, session_id: str, limit: int = 50) -> list[Compaction]:
        return self.store.compactions.history(session_id, limit)


def _event_members(result: CompactResult) -> dict[str, Any]:
    """The result's members that `context/didCompact` carries (all but a dry run's)."""
    members = msgspec.structs.asdict(result)
    for dry_run_only in ("dry_run", "messages", "diff"):
        del members[dry_run_only]
    return members
