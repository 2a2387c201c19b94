"""Commands that read a session: show (the archive beside the active context) and
search."""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from typing import Any

from ctxd.clients.cli.commands.output import (
    EXIT_OK,
    content_text,
    fit,
    id_ranges,
    message_line,
    one_line,
    pad,
    plural,
    text_width,
    when,
)
from ctxd.clients.cli.commands.running import Context, archive_pages
from ctxd.clients.cli.text import clean_field

SIDE_BY_SIDE_MIN_WIDTH = 120

# bookkeeping the archive adds to a message; context/get returns messages without them
_ARCHIVE_KEYS = ("id", "batchId", "tokens", "createdAt", "metadata")


def _strip(msg: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in msg.items() if k not in _ARCHIVE_KEYS}


@dataclass
class ContextMap:
    """How the model context lines up with the archive.

    context/get returns the messages without archive ids, but its shape is fixed: the
    session's leading system messages, then (when there are pins or a summary) one
    generated summary message, then a tail that is always a suffix of the archive.
    Matching contents from the end recovers each context message's archive id.
    """

    archive_ids: list[int | None]  # per context message; None for the summary message
    in_context: set[int]
    summary_index: int | None


def _map_context(ctx_msgs: list[dict[str, Any]], leading: list[dict[str, Any]],
                 last: list[dict[str, Any]], archive_count: int) -> ContextMap | None:
    n, s = len(ctx_msgs), len(leading)
    if [_strip(m) for m in leading] != ctx_msgs[:s]:
        return None
    # without a summary first: with one, the summary would have to equal an archived message
    for has_summary in (0, 1):
        k = n - s - has_summary
        if k < 0 or k > archive_count - s or k > len(last):
            continue
        tail = last[len(last) - k:] if k else []
        if [_strip(m) for m in tail] != ctx_msgs[s + has_summary:]:
            continue
        ids: list[int | None] = [m["id"] for m in leading]
        if has_summary:
            ids.append(None)
        ids.extend(m["id"] for m in tail)
        return ContextMap(ids, {i for i in ids if i is not None}, s if has_summary else None)
    return None


def cmd_show(ctx: Context) -> int:
    client, sid, limit = ctx.client, ctx.args.session, ctx.args.limit
    session = client.get_session(sid)["session"]
    # context first: its status fixes how many archived messages belong to this snapshot,
    # so appends that land while the archive is read are left out of the comparison
    got = client.context_get(sid)
    ctx_msgs: list[dict[str, Any]] = got["messages"]
    status: dict[str, Any] = got["status"]
    snapshot = int(status.get("archiveMessages", 0))
    leading: list[dict[str, Any]] = []
    in_lead = True
    last: deque[dict[str, Any]] = deque(maxlen=max(limit, len(ctx_msgs)) + 1)
    count = tokens = 0
    for msg in archive_pages(client, sid, stop_after=snapshot):
        count += 1
        tokens += int(msg.get("tokens") or 0)
        if in_lead and msg.get("role") == "system":
            leading.append(msg)
        else:
            in_lead = False
        last.append(msg)
    mapping = _map_context(ctx_msgs, leading, list(last), count)
    shown = list(last)[-limit:] if limit else []
    # `#N`: a message's place in the session (the summary cites the same numbers); the
    # archive was read from its start, so the last ones end at `count`
    ordinal = {m["id"]: n for n, m in enumerate(leading, start=1)}
    ordinal.update({m["id"]: count - len(last) + n for n, m in enumerate(last, start=1)})

    if ctx.out.json_mode:
        ctx.out.document({
            "session": session,
            "status": status,
            "archive": {
                "messages": count,
                "tokens": tokens,
                "last": [{**m, "ordinal": ordinal[m["id"]],
                          "inContext": mapping is not None and m["id"] in mapping.in_context}
                         for m in shown],
            },
            "context": {
                # `messages` counts the pins/summary message too, as `activeMessages` does
                "messages": len(ctx_msgs),
                "fromArchive": len(mapping.in_context) if mapping else None,
                "estimatedTokens": status.get("estimatedTokens"),
                "hasSummary": mapping is not None and mapping.summary_index is not None,
                "items": [{"archiveId": mapping.archive_ids[i] if mapping else None,
                           "ordinal": ordinal.get(mapping.archive_ids[i] or -1)
                           if mapping else None, **m}
                          for i, m in enumerate(ctx_msgs)],
            },
            "inContextIds": sorted(mapping.in_context) if mapping else None,
        })
        return EXIT_OK

    out = ctx.out
    title = one_line(session.get("title") or "")
    out.line(f"session {sid}" + (f"  {title}" if title else "")
             + f"  (created {when(session.get('createdAt'))})")
    compactions = status.get("compactionCount", 0)
    if compactions:
        out.line(f"compactions: {compactions}, last {when(status.get('lastCompactedAt'))}")
    else:
        out.line("compactions: 0")
    if status.get("pendingApprovals"):
        out.line(f"pending approvals: {status['pendingApprovals']}")
    in_ctx = mapping.in_context if mapping else set()
    if mapping:
        out.line(f"messages in context: {id_ranges([ordinal[i] for i in in_ctx])} "
                 f"(archive ids {id_ranges(sorted(in_ctx), archive=True)})")
    else:
        out.line("messages in context: unknown (context and archive did not line up; "
                 "try again)")
    out.line()

    left_head = [f"ARCHIVE  {plural(count, 'message')}, {plural(tokens, 'token')}",
                 f"last {len(shown)} (* = in context):"]
    right_head = [f"ACTIVE CONTEXT  {_active_count(len(ctx_msgs), mapping)}, "
                  f"~{status.get('estimatedTokens', '?')} tokens", ""]
    width = out.width
    side = out.tty and width >= SIDE_BY_SIDE_MIN_WIDTH
    col = (width - 3) // 2 if side else width

    def archive_lines() -> list[str]:
        lines = []
        for m in shown:
            mark = "*" if m["id"] in in_ctx else " "
            ref = _ref(ordinal[m["id"]], m["id"])
            lead = f"{ref}{mark} "
            lines.append(lead + message_line(m.get("role", "?"), m, col - text_width(lead)))
        return lines or ["(empty)"]

    def context_lines() -> list[str]:
        lines = []
        for i, m in enumerate(ctx_msgs):
            aid = mapping.archive_ids[i] if mapping else None
            summary = mapping is not None and mapping.summary_index == i
            label = "summary" if summary else m.get("role", "?")
            ref = " " * len(_ref(0, 0)) if aid is None else _ref(ordinal.get(aid), aid)
            lines.append(ref + " " + message_line(label, m, col - text_width(ref) - 1))
        return lines or ["(empty)"]

    left = left_head + archive_lines()
    right = right_head + context_lines()
    if side:
        for i in range(max(len(left), len(right))):
            a = left[i] if i < len(left) else ""
            b = right[i] if i < len(right) else ""
            out.line((pad(fit(a, col), col) + " │ " + b).rstrip())
    else:
        for text in right_head[:1] + context_lines():
            out.line(text)
        out.line()
        for text in left:
            out.line(text)
    if mapping is not None and mapping.summary_index is not None:
        # the listing above gives the summary one line; here it is whole
        out.line()
        out.line("SUMMARY  (pins and summary as the model reads them; `ctxd explain "
                 f"{sid}` shows where each line came from)")
        for text in content_text(ctx_msgs[mapping.summary_index].get("content")).splitlines():
            out.line(f"  {text}")
    return EXIT_OK


def _active_count(messages: int, mapping: ContextMap | None) -> str:
    """`63 messages (62 from the archive + pins/summary)`: the status's `activeMessages`
    counts the generated message that carries the pins and the summary as one."""
    text = plural(messages, "message")
    if mapping is not None and mapping.summary_index is not None:
        text += f" ({len(mapping.in_context)} from the archive + pins/summary)"
    return text


def _ref(ordinal: int | None, archive_id: int) -> str:
    """`#12   msg 3456 `: the message's place in its session, then its archive id."""
    n = f"#{ordinal}" if ordinal is not None else "#?"
    return f"{n:<6}msg {archive_id:<6}"


_BOLD = re.compile(r"\*\*(.+?)\*\*", re.S)


def cmd_search(ctx: Context) -> int:
    args = ctx.args
    extra: dict[str, Any] = {}
    if args.advanced:
        extra["advanced"] = True
    if args.newest:
        extra["newestFirst"] = True
    found = ctx.client.search(" ".join(args.query), session_id=args.session, role=args.role,
                              limit=args.limit, **extra)
    hits, matched = found["hits"], found.get("matched", "all")
    out = ctx.out
    if out.json_mode:
        out.document({"hits": hits, "matched": matched})
        return EXIT_OK
    if not hits:
        out.line("no matches")
        return EXIT_OK
    if matched == "any":
        out.line("no message has all the words; these have some of them (best first):")
    for hit in hits:
        where = "in context" if hit.get("inActiveContext") else "archive only"
        n = f"#{hit['ordinal']}" if hit.get("ordinal") is not None else "#?"
        sid = clean_field(hit["sessionId"])
        out.line(f"{n}  msg {hit['messageId']}  {sid}  {hit.get('role', '?')}  "
                 f"{when(hit.get('createdAt'))}  [{where}]")
        snippet = one_line(hit.get("snippet") or "")  # cleaned: the bold is ours alone
        if out.bold:
            snippet = _BOLD.sub("\x1b[1m\\1\x1b[0m", snippet)
        out.line(f"    {snippet}", raw=True)
    return EXIT_OK
