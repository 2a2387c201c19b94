"""`ctxd stop` and `ctxd explain`: stopping the daemon, and where the summary came from."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ctxd.clients.cli.commands.output import EXIT_OK, EXIT_UNREACHABLE, fail, fit, one_line, when
from ctxd.clients.cli.commands.running import Context
from ctxd.protocol.connection import pid_alive

# how long `stop` waits for the daemon's answer, then for its process to exit
SHUTDOWN_REPLY_SECONDS = 5.0
STOP_WAIT_SECONDS = 20.0


def _alive(pid: Any) -> bool:
    return isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 and pid_alive(pid)


def cmd_stop(ctx: Context) -> int:
    pid = ctx.info.get("pid")
    try:
        ctx.client.shutdown(timeout=SHUTDOWN_REPLY_SECONDS)
    except (ConnectionError, TimeoutError):
        pass  # a daemon closing its sockets may lose the reply: its pid tells
    ctx.client.close()
    # the daemon answers, then finishes writing and removes its connection file
    deadline = time.monotonic() + STOP_WAIT_SECONDS
    while time.monotonic() < deadline:
        if not _alive(pid):
            break
        time.sleep(0.05)
    else:
        fail(f"the daemon (pid {pid}) said it would stop but is still running after "
             f"{STOP_WAIT_SECONDS:g} s; its log says why")
        return EXIT_UNREACHABLE
    if ctx.out.json_mode:
        ctx.out.document({"stopped": True, "pid": pid})
    else:
        where = ctx.info.get("data_dir") or ctx.data_dir
        ctx.out.line(f"stopped the ctxd daemon (pid {pid}) of {where}")
    return EXIT_OK


def cmd_explain(ctx: Context) -> int:
    sid = ctx.args.session
    result = ctx.client.explain(sid)
    out = ctx.out
    if out.json_mode:
        out.document(result)
        return EXIT_OK
    prov = result.get("provenance") or {}
    items = result.get("items") or []
    out.line(f"session {sid}: {len(items)} summary items, "
             f"{result.get('brokenPointers', 0)} broken pointers")
    if prov.get("coversFrom") is not None:
        span = f"msg {prov['coversFrom']}–{prov.get('coversTo')}"
        if prov.get("coversFromOrdinal") is not None:
            span = f"#{prov['coversFromOrdinal']}–#{prov.get('coversToOrdinal')} ({span})"
        out.line(f"summarizes {span} "
                 f"(summarizer {prov.get('summarizer') or '?'}, "
                 f"{len(prov.get('compactionIds') or [])} compactions)")
    pins = result.get("pins") or []
    if pins:
        out.line()
        out.line("PINS")
        for pin in pins:
            out.line(f"  {pin.get('pinId')}  {one_line(pin.get('text', ''))}")
    section = None
    width = out.width
    for item in items:
        if item.get("section") != section:
            section = item.get("section")
            out.line()
            out.line(str(section).upper().replace("_", " "))
        mark = "" if item.get("status", "current") == "current" else f"[{item['status']}] "
        out.line(f"- {mark}{one_line(item.get('text', ''))}")
        for src in item.get("sources") or []:
            if src.get("broken"):
                out.line(f"    msg {src.get('id')}  (broken: not in the archive)")
                continue
            # the #N the summary line cites, then the archive id
            n = f"#{src['ordinal']}" if src.get("ordinal") is not None else "#?"
            head = (f"    {n}  msg {src.get('id')}  {src.get('role', '?')}  "
                    f"{when(src.get('createdAt'))}  ")
            out.line(head + fit(one_line(src.get("snippet") or ""), max(20, width - len(head))))
    if not items and not pins:
        out.line("no summary yet: nothing has been compacted")
    return EXIT_OK


def register(add: Callable[..., Any]) -> None:
    """`add(name, handler, help)` of `commands.register`."""
    add("stop", cmd_stop, "stop the running daemon (it finishes writing and removes its "
        "connection file)")
    p = add("explain", cmd_explain, "show each line of a session's summary with the archive "
            "messages it came from")
    p.add_argument("session", help="session id")
