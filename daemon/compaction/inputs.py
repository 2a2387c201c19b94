"""What a compaction summarizes, and the summarizing itself.

Read from the archive: the region a rebuild or a re-derivation works on (page by page,
so the daemon keeps serving meanwhile), the tool calls whose results will never come,
and each leaving message's ordinal in its session (the pointers a summary cites). Then
the summarizer runs over the leaving messages in chunks, each result checked before the
next chunk builds on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ctxd.daemon.compaction.rules import check_summary
from ctxd.daemon.config import CompactionPolicy
from ctxd.daemon.messages import for_model, strip_archive_fields
from ctxd.daemon.stores.base import ArchiveStore
from ctxd.daemon.stores.sql.contexts import ContextState
from ctxd.daemon.summary import Summarizer, Summary, SummaryItem, SummaryRequest, as_taken
from ctxd.daemon.tokens import TokenCounter

# messages read per page when a compaction reads the archive from the start
ARCHIVE_PAGE = 2000

# ordinals counted per compaction for sources cited before ordinals were kept
_BACKFILL = 32


def rederives(
    summarizer: Summarizer, policy: CompactionPolicy, st: ContextState, trigger: str
) -> bool:
    """Whether this compaction summarizes from the archive instead of the last summary."""
    # The drift bound is for summarizers whose errors compound (models); the built-in
    # one is extractive and deterministic, so re-deriving would only cost time.
    drifts = getattr(summarizer, "drifts", True)
    return trigger == "rebuild" or (
        drifts and policy.rederive_after > 0 and st.summary.depth >= policy.rederive_after
    )


def abandoned_calls(archive: ArchiveStore, region: list[dict[str, Any]]) -> set[str]:
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
    closed = archive.batches_of_closed_runs(set(unanswered.values()))
    return {cid for cid, batch in unanswered.items() if batch in closed}


def _leaving_ordinals(
    archive: ArchiveStore, session_id: str, anchor: Summary, leaving: list[dict[str, Any]]
) -> dict[int, int]:
    """Archive id -> 1-based position in the session, for the leaving messages.

    Counted on from the previous summary's last covered message, so the cost is the
    new stretch, not the whole history."""
    if not leaving:
        return {}
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


def ordinals(
    archive: ArchiveStore, session_id: str, current: Summary, leaving: list[dict[str, Any]]
) -> dict[int, int]:
    """The ordinals the new summary may cite: the current summary's, the leaving
    messages', and a few of the sources cited before ordinals were kept."""
    out = {**current.ordinals, **_leaving_ordinals(archive, session_id, current, leaving)}
    # items from before ordinals were kept: a few are counted each time, so the
    # summary moves to compact pointers without one compaction paying for all
    missing = sorted(current.all_sources() - out.keys())[-_BACKFILL:]
    for mid in missing:
        out[mid] = archive.count_between(session_id, 0, mid)
    return out


async def non_system_messages(
    archive: ArchiveStore, session_id: str, st: ContextState, before_id: int | None = None
) -> list[dict[str, Any]]:
    """The session's archive since the context began, but its leading system messages,
    read page by page so the daemon keeps serving other requests while a long history
    loads."""
    # neither cleared (context/clear) nor popped (context/pop) messages are in it
    system = set(st.system_ids) | set(st.dropped_ids)
    out: list[dict[str, Any]] = []
    after = st.base_id
    while True:
        page = archive.read(session_id, after, ARCHIVE_PAGE)
        for m in page:
            if before_id is not None and m["id"] >= before_id:
                return out
            if m["id"] not in system:
                out.append(m)
        if len(page) < ARCHIVE_PAGE:
            return out
        after = page[-1]["id"]
        await asyncio.sleep(0)


async def summarize(
    summarizer: Summarizer,
    policy: CompactionPolicy,
    tokens: TokenCounter,
    session_id: str,
    previous: Summary,
    leaving: list[dict[str, Any]],
    pins: list[str],
    instructions: str | None,
    ordinals: dict[int, int],
    report: Callable[[int], None],
    size_limit: int | None = None,
    verbatim: list[str] | None = None,
) -> Summary:
    """The summary of `previous` and `leaving`, chunk by chunk; `report` gets the
    percentage done after each chunk when there are several. `size_limit` bounds the
    final summary below the budget (see `size_limit`); `verbatim` is what the summary
    message carries word for word anyway (see SummaryRequest)."""
    # a summarizer may say how much it takes at once (the built-in one takes large
    # batches: one hop to its worker thread instead of one per 200 messages)
    chunk = max(1, getattr(summarizer, "chunk_messages", 0) or policy.rebuild_chunk_messages)
    budget = policy.summary_budget_tokens
    summary = previous
    allowed = previous.all_sources()
    for start in range(0, len(leaving), chunk):
        part = leaving[start : start + chunk]
        allowed |= {m["id"] for m in part}
        # the chunks before the last one are steps: only the result is bounded
        last = start + chunk >= len(leaving)
        limit = size_limit if last and size_limit is not None and size_limit < budget else None
        # a summarizer that cannot honour the limit gets it as a smaller budget
        request = as_taken(summarizer, SummaryRequest(
            session_id=session_id,
            previous=summary,
            messages=[{**for_model(strip_archive_fields(m)), "id": m["id"]} for m in part],
            pins=pins,
            instructions=instructions,
            budget_tokens=budget,
            count_tokens=tokens.count_text,
            ordinals=ordinals,
            size_limit_tokens=limit,
            verbatim=list(verbatim or ()),
        ))
        summary = await run_summarizer(summarizer, request)
        problems = check_summary(summary, allowed)
        if problems:
            raise ValueError("summary rejected: " + "; ".join(problems[:3]))
        if len(leaving) > chunk:
            report(min(99, (start + chunk) * 100 // len(leaving)))
    return summary


def size_limit(
    policy: CompactionPolicy,
    old_message_tokens: int,
    overhead_tokens: int,
    leaving_tokens: int,
) -> int:
    """The most tokens the new summary's text may take so that the summary message
    grows by at most `summary_share` of what leaves the context: the old summary
    message (`old_message_tokens`, pins and header included) plus that share, less the
    new message's own `overhead_tokens` (pins and header)."""
    grown = old_message_tokens + policy.summary_share * leaving_tokens
    return max(0, int(grown) - overhead_tokens)


def summary_overhead(
    message_tokens: Callable[[Summary], int], count_text: Callable[[str], int]
) -> int:
    """Tokens the summary message takes besides the summary's own text (the header,
    the pins, the message's framing), measured on a one-line summary."""
    probe = Summary(sections={"goals": [SummaryItem(text="x", sources=[1])]})
    return max(0, message_tokens(probe) - count_text(probe.render()))


async def run_summarizer(summarizer: Summarizer, request: SummaryRequest) -> Summary:
    """CPU-bound summarizers run in a worker thread so the event loop stays free."""
    summarize_sync = getattr(summarizer, "summarize_sync", None)
    if summarize_sync is not None:
        return await asyncio.to_thread(summarize_sync, request)  # type: ignore[no-any-return]
    return await summarizer.summarize(request)


def finish(
    summary: Summary,
    current: Summary,
    previous: Summary,
    leaving: list[dict[str, Any]],
    ordinals: dict[int, int],
    cid: str,
    rederived: bool,
) -> None:
    """The bookkeeping a new summary carries on from the current one: what it covers,
    the ordinals it cites, supersessions, the compactions behind it and its depth."""
    if leaving:
        summary.covers_to = max(summary.covers_to or 0, leaving[-1]["id"])
        if summary.covers_from is None or rederived:
            summary.covers_from = leaving[0]["id"]
    # the model sees per-session ordinals; the map keeps what the summary cites and
    # the last covered message, the anchor the next compaction counts on from
    keep = summary.all_sources() | {summary.covers_to}
    summary.ordinals = {k: v for k, v in ordinals.items() if k in keep}
    # what superseded what outlives the items (search marks superseded hits with it)
    summary.supersessions = dict(
        list({**current.supersessions, **summary.supersessions}.items())[-2000:]
    )
    summary.compaction_ids = [*previous.compaction_ids, cid][-50:]
    summary.depth = 0 if rederived else previous.depth + 1
