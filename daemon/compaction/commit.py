"""The end of a compaction attempt: the version-checked commit, the log entry, and the
result the caller gets back.

The commit runs in one transaction: the stored context must still be the version the
attempt started from (else nothing changes), the new counters are taken from the archive
(appends made meanwhile stay in the tail), and the new context is saved only when it
really shrank (a rebuild is kept anyway). The attempt's log entry commits with it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ctxd.daemon.config import CompactionPolicy
from ctxd.daemon.stores.base import Store
from ctxd.daemon.stores.sql.contexts import ContextState
from ctxd.daemon.summary import Summary
from ctxd.protocol.errors import CompactionInProgress
from ctxd.protocol.types import Compaction, CompactResult, Size

log = logging.getLogger("ctxd.compactor")


@dataclass(frozen=True, slots=True)
class Attempt:
    """What one compaction attempt was asked, fixed when it starts."""

    cid: str
    session_id: str
    trigger: str
    started: float
    instructions: str | None
    dry_run: bool


@dataclass(slots=True)
class Outcome:
    """The context a summary makes, against the one stored when it was committed."""

    new: ContextState
    before: dict[str, int]
    after: dict[str, int]
    effective: bool
    committed: bool


def record(
    store: Store,
    a: Attempt,
    summarizer: str,
    before: dict[str, int],
    after: dict[str, int] | None,
    effective: bool,
    committed: bool,
    leaving: list[dict[str, Any]],
    error: str | None,
) -> None:
    """The attempt's entry in the compaction log (inside the caller's transaction)."""
    store.compactions.record(
        a.session_id,
        Compaction(
            compaction_id=a.cid,
            trigger=a.trigger,
            started_at=a.started,
            duration_ms=(time.time() - a.started) * 1000,
            before_messages=before["messages"],
            before_tokens=before["tokens"],
            after_messages=after["messages"] if after else None,
            after_tokens=after["tokens"] if after else None,
            effective=effective,
            committed=committed,
            summarized_from=leaving[0]["id"] if leaving else None,
            summarized_to=leaving[-1]["id"] if leaving else None,
            summarizer=summarizer,
            error=error,
            instructions=a.instructions,
            archive_messages=None,
            archive_tokens=None,
        ),
    )
    log.info(
        "compaction %s of %s (%s): effective=%s before=%s after=%s error=%s",
        a.cid,
        a.session_id,
        a.trigger,
        effective,
        before,
        after,
        error,
    )


def apply_summary(
    store: Store,
    a: Attempt,
    snapshot: ContextState,
    summary: Summary,
    tail_start_id: int,
    summary_tokens: Callable[[str, Summary], int],
) -> Outcome:
    """The new context with `summary` and the tail from `tail_start_id`, saved when it
    is kept; call inside a transaction. Raises CompactionInProgress when the context
    changed since `snapshot`."""
    session_id = a.session_id
    archive = store.archive
    now_st = store.contexts.load(session_id)
    assert now_st is not None
    if now_st.version != snapshot.version:
        raise CompactionInProgress(
            "the context was replaced while this compaction ran; nothing was changed, try again"
        )
    before = {"messages": now_st.rendered_messages, "tokens": now_st.rendered_tokens}
    new = replace(now_st, summary=summary, version=now_st.version + 1)
    new.tail_start_id = tail_start_id
    # appends made meanwhile only added to the counters: subtract what left
    count, tokens = archive.sums_from(session_id, new.tail_start_id)
    # popped messages (context/pop) stay out; those before the new tail are gone
    new.dropped_ids = [i for i in now_st.dropped_ids if i >= new.tail_start_id]
    if new.dropped_ids:
        dropped = archive.get_many(new.dropped_ids).values()
        count -= len(dropped)
        tokens -= sum(m["tokens"] for m in dropped)
    system = archive.get_many(now_st.system_ids).values()
    system_tokens = sum(m["tokens"] for m in system)
    new.active_messages = len(now_st.system_ids) + count
    new.active_tokens = system_tokens + tokens
    new.summary_tokens = summary_tokens(session_id, summary)
    after = {"messages": new.rendered_messages, "tokens": new.rendered_tokens}
    effective = after["messages"] < before["messages"] and after["tokens"] < before["tokens"]
    commit = (effective or a.trigger == "rebuild") and not a.dry_run
    if commit:
        if effective:
            new.compaction_count += 1
            new.last_compacted_at = time.time()
        store.contexts.save(new)
    return Outcome(new, before, after, effective, commit)


def result(
    a: Attempt, o: Outcome, leaving: list[dict[str, Any]], rederived: bool
) -> CompactResult:
    """What compact returns for an attempt that got as far as the commit."""
    out = CompactResult(
        effective=o.effective,
        compaction_id=a.cid if o.committed else None,
        before=Size(**o.before),
        after=Size(**(o.after if o.committed else o.before)),
        summarized_from=leaving[0]["id"] if leaving else None,
        summarized_to=leaving[-1]["id"] if leaving else None,
        trigger=a.trigger,
        rederived=rederived,
    )
    if not o.effective and o.committed:
        out.note = (
            "a rebuild is kept even when it does not shrink the context: it re-derives "
            "the context with the current strategy"
        )
    elif not o.effective:
        out.reason = (
            f"the new context would have {o.after['messages']} messages and "
            f"{o.after['tokens']} tokens against {o.before['messages']} and "
            f"{o.before['tokens']} now: a compaction must shrink both; nothing was changed"
        )
        out.proposed = Size(**o.after)
    return out


def preview(
    old: ContextState, o: Outcome, leaving: list[dict[str, Any]], rendered: list[dict[str, Any]]
) -> CompactResult:
    """What a dry run returns: the context it would make (`rendered`) and the change."""
    return CompactResult(
        dry_run=True,
        effective=o.effective,
        compaction_id=None,
        before=Size(**o.before),
        after=Size(**o.after),
        summarized_from=leaving[0]["id"] if leaving else None,
        summarized_to=leaving[-1]["id"] if leaving else None,
        messages=rendered,  # type: ignore[arg-type]  # encoded as stored
        diff={
            "items": o.new.summary.item_count() - old.summary.item_count(),
            "messages": o.after["messages"] - o.before["messages"],
            "tokens": o.after["tokens"] - o.before["tokens"],
        },
    )


def not_effective(a: Attempt, before: dict[str, int], reason: str) -> CompactResult:
    """What compact returns when nothing could leave the context."""
    return CompactResult(
        effective=False,
        compaction_id=None,
        before=Size(**before),
        after=Size(**before),
        summarized_from=None,
        summarized_to=None,
        trigger=a.trigger,
        rederived=False,
        reason=reason,
    )


def say_instructions(result: CompactResult) -> None:
    """Instructions given to a compaction that committed nothing were not used: say so
    rather than drop them silently."""
    applied = bool(result.compaction_id)
    result.instructions_applied = applied
    if not applied:
        why = result.reason or "nothing was committed"
        result.reason = f"{why}; the instructions were not applied (the summary is unchanged)"


def say_under_limits(result: CompactResult, policy: CompactionPolicy) -> None:
    """A compaction nobody forced, of a context under its limits: that is the news."""
    before = result.before
    result.under_limits = True
    result.limits = Size(messages=policy.max_active_messages, tokens=policy.max_active_tokens)
    result.reason = (
        f"the context is under its limits ({before.messages} of "
        f"{policy.max_active_messages} messages, {before.tokens} of "
        f"{policy.max_active_tokens} tokens): nothing is due; pass force to compact it anyway"
    )
