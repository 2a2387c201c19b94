"""Commands on the daemon and its sessions: status, sessions, compact, rebuild, pins and
export."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ctxd.clients.cli.commands.output import (
    EXIT_OK,
    fields,
    fit,
    json_line,
    one_line,
    table,
    when,
)
from ctxd.clients.cli.commands.running import Context, all_sessions, archive_pages
from ctxd.clients.cli.text import cli_message
from ctxd.protocol.files import replacing


def cmd_status(ctx: Context) -> int:
    info = ctx.info
    sessions = sum(1 for _ in all_sessions(ctx.client))
    endpoints = {k: info[k] for k in ("zmq_router", "zmq_pub", "jsonrpc_tcp", "websocket")
                 if info.get(k)}
    capabilities = (getattr(ctx.client, "server_info", None) or {}).get("capabilities") or {}
    summarizer = capabilities.get("summarizer")
    failure = capabilities.get("summarizerLastFailure")
    if ctx.out.json_mode:
        ctx.out.document({
            "running": True,
            "pid": info.get("pid"),
            "version": info.get("version"),
            "dataDir": info.get("data_dir") or str(ctx.data_dir),
            "store": info.get("store"),
            "connectionFile": str(ctx.connection_file),
            "endpoints": endpoints,
            "sessions": sessions,
            "summarizer": summarizer,
            "summarizerLastFailure": failure,
        })
        return EXIT_OK
    out = ctx.out
    out.line(f"ctxd daemon {info.get('version', '?')} running, pid {info.get('pid', '?')}")
    rows = [
        ("store", str(info.get("store") or "?")),
        ("data dir", str(info.get("data_dir") or ctx.data_dir)),
        ("connection file", str(ctx.connection_file)),
        *[(name.replace("_", " "), str(url)) for name, url in endpoints.items()],
        ("sessions", str(sessions)),
        ("summarizer", str(summarizer or "?")),
    ]
    if failure:
        message = one_line(str(failure.get("message") or ""))
        rows.append(("last failure", f"{when(failure.get('at'))}: {message}"))
    fields(out, rows)
    return EXIT_OK


def cmd_sessions(ctx: Context) -> int:
    args = ctx.args
    if args.all:
        sessions = list(all_sessions(ctx.client))
        cursor = None
    else:
        page = ctx.client.list_sessions(limit=args.limit)
        sessions, cursor = page["sessions"], page.get("nextCursor")
    if ctx.out.json_mode:
        ctx.out.document({"sessions": sessions, "nextCursor": cursor})
        return EXIT_OK
    if not sessions:
        ctx.out.line("no sessions")
        return EXIT_OK
    rows = []
    for s in sessions:
        st = s.get("status") or {}
        rows.append([
            s["sessionId"], one_line(s.get("title") or ""), when(s.get("createdAt")),
            str(st.get("archiveMessages", "?")), str(st.get("activeMessages", "?")),
            str(st.get("estimatedTokens", "?")), str(st.get("compactionCount", "?")),
        ])
    table(ctx.out, ["ID", "TITLE", "CREATED", "ARCHIVE", "ACTIVE", "TOKENS", "COMPACTIONS"],
          rows, flex=1, squeeze=0)
    if ctx.out.tty:
        # a pipe keeps to one row a line; a person is told what ACTIVE counts
        ctx.out.line("ACTIVE: messages the model reads, the one carrying pins and summary "
                     "included")
    if cursor:
        ctx.out.line(f"(more sessions: --all lists them all, or raise --limit from {args.limit})")
    return EXIT_OK


def _compaction_report(ctx: Context, result: dict[str, Any], verb: str) -> int:
    out = ctx.out
    if out.json_mode:
        out.document(result)
        return EXIT_OK
    before, after = result.get("before") or {}, result.get("after") or {}
    numbers = (f"{before.get('messages', '?')} → {after.get('messages', '?')} messages, "
               f"{before.get('tokens', '?')} → {after.get('tokens', '?')} tokens")
    span = ""
    if result.get("summarizedFrom") is not None:
        span = f" (summarized msg {result['summarizedFrom']}–{result['summarizedTo']})"
    if result.get("effective"):
        out.line(f"{verb}: effective, {numbers}{span}")
    elif result.get("compactionId"):
        # a rebuild is kept even when it did not shrink the context: say what happened,
        # not "not effective"
        out.line(f"{verb}: done, the context did not shrink, {numbers}{span}")
        out.line("note: " + cli_message(result.get("note") or (
            "a rebuild is kept even when it does not shrink the context")))
    elif result.get("underLimits"):
        limits = result.get("limits") or {}
        out.line(f"{verb}: not effective, {numbers}")
        out.line(f"reason: the context is under its limit ({before.get('messages', '?')} of "
                 f"{limits.get('messages', '?')} messages, {before.get('tokens', '?')} of "
                 f"{limits.get('tokens', '?')} tokens); use --force to compact it anyway")
        if result.get("instructionsApplied") is False:
            out.line("instructions: not applied (nothing was compacted)")
    else:
        out.line(f"{verb}: not effective, {numbers}")
        reason = cli_message(result.get("reason") or "the context did not shrink")
        out.line(f"reason: {reason}")
    return EXIT_OK


def cmd_compact(ctx: Context) -> int:
    result = ctx.client.compact(ctx.args.session, force=ctx.args.force or None,
                                instructions=ctx.args.instructions)
    return _compaction_report(ctx, result, "compaction")


def cmd_rebuild(ctx: Context) -> int:
    return _compaction_report(ctx, ctx.client.rebuild(ctx.args.session), "rebuild")


def _pin_of(result: dict[str, Any]) -> dict[str, Any]:
    # the protocol documents `{pin: {...}}`; accept a bare pin object as well
    pin = result.get("pin")
    return pin if isinstance(pin, dict) else result


def cmd_pins_add(ctx: Context) -> int:
    result = ctx.client.add_pin(ctx.args.session, ctx.args.text)
    pin = _pin_of(result)
    if ctx.out.json_mode:
        ctx.out.document({"pin": pin})
    else:
        ctx.out.line(f"pinned {pin.get('pinId', '?')}: {fit(one_line(pin.get('text', '')), 60)}")
    return EXIT_OK


def cmd_pins_list(ctx: Context) -> int:
    pins = ctx.client.list_pins(ctx.args.session)["pins"]
    if ctx.out.json_mode:
        ctx.out.document({"pins": pins})
        return EXIT_OK
    if not pins:
        ctx.out.line("no pins")
        return EXIT_OK
    rows = [[p["pinId"], when(p.get("createdAt")), one_line(p.get("text", ""))] for p in pins]
    table(ctx.out, ["PIN", "CREATED", "TEXT"], rows, flex=2)
    return EXIT_OK


def cmd_pins_remove(ctx: Context) -> int:
    result = ctx.client.remove_pin(ctx.args.session, ctx.args.pin_id)
    pin = _pin_of(result)
    if ctx.out.json_mode:
        ctx.out.document({"pin": pin})
    else:
        text = pin.get("text")
        ctx.out.line(f"unpinned {pin.get('pinId', ctx.args.pin_id)}"
                     + (f": {fit(one_line(text), 60)}" if isinstance(text, str) else ""))
    return EXIT_OK


_EXPORT_FIRST = ("id", "batchId", "createdAt", "tokens")


def _export_record(msg: dict[str, Any]) -> dict[str, Any]:
    # bookkeeping first so a line reads well in a pager; the chat fields follow unchanged
    head = {k: msg[k] for k in _EXPORT_FIRST if k in msg}
    return {**head, **{k: v for k, v in msg.items() if k not in head}}


def cmd_export(ctx: Context) -> int:
    sid = ctx.args.session
    ctx.client.get_session(sid)  # an unknown session fails before a file is created
    if ctx.args.output is None:
        for msg in archive_pages(ctx.client, sid):
            ctx.out.record(_export_record(msg))
        return EXIT_OK
    target: Path = ctx.args.output
    # written beside the target and renamed at the end: a failed export leaves no half file
    with replacing(target, 0o600) as f:
        n = 0
        for msg in archive_pages(ctx.client, sid):
            f.write(json_line(_export_record(msg)) + "\n")
            n += 1
    sys.stderr.write(f"exported {n} messages of {sid} to {target}\n")
    return EXIT_OK
