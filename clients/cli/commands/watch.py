"""`ctxd watch`: a session's live events, one line (or JSON object) each, until Ctrl-C."""

from __future__ import annotations

import json
import queue
import signal
import sys
import time
from typing import Any

from ctxd.clients.cli.commands.output import (
    EXIT_OK,
    EXIT_UNREACHABLE,
    clock,
    fail,
    id_ranges,
    one_line,
    plural,
    tool_call_text,
)
from ctxd.clients.cli.commands.running import Context
from ctxd.protocol.connection import daemon_gone
from ctxd.protocol.methods import NOTIFICATIONS

# how long `watch` waits between checks that the daemon is still there
WATCH_POLL_SECONDS = 0.5
WATCH_ALIVE_EVERY = 2.0

# the notifications, from the protocol table: never a copy that could lag it
EVENTS = tuple(NOTIFICATIONS)


def event_text(method: str, p: dict[str, Any]) -> str:
    """One human line for a notification."""
    if method == "session/didAppend":
        ids = p.get("messageIds") or []
        span = id_ranges(ids, archive=True) if ids else "no messages"
        run = f" (run {p['runId']})" if p.get("runId") else ""
        return f"append     batch {p.get('batchId')}: {plural(len(ids), 'message')} {span}{run}"
    if method == "context/didCompact":
        b, a = p.get("before") or {}, p.get("after") or {}
        return (f"compact    {p.get('trigger', '?')}: {b.get('messages')} → {a.get('messages')}"
                f" messages, {b.get('tokens')} → {a.get('tokens')} tokens")
    if method == "context/compactionFailed":
        err = p.get("error") or {}
        return f"compact    {p.get('trigger', '?')} FAILED: {err.get('message', '?')}"
    if method in ("approval/didRequest", "approval/didResolve"):
        ap = p.get("approval") or {}
        call = tool_call_text({"function": {"name": ap.get("toolName") or "?",
                                            "arguments": ap.get("arguments") or ""}})
        if method == "approval/didRequest":
            return f"approval   {ap.get('approvalId')} requested: {call}"
        reason = f" ({one_line(ap['reason'])})" if ap.get("reason") else ""
        return f"approval   {ap.get('approvalId')} {ap.get('status', '?')}: {call}{reason}"
    if method == "run/didStart":
        # documented as `runId`; the daemon also sends the whole `run`
        run_id = p.get("runId") or (p.get("run") or {}).get("runId")
        return f"run        {run_id} started"
    if method == "run/didFinish":
        run = p.get("run") or {}
        auto = ", auto-compaction scheduled" if p.get("autoCompactionScheduled") else ""
        return f"run        {run.get('runId')} {run.get('status', 'finished')}{auto}"
    if method == "session/didMissEvents":
        return (f"missed     {plural(int(p.get('missed') or 0), 'event')} while this watch "
                "fell behind: `ctxd show` has the session as it is now")
    if method == "$/progress":
        v = p.get("value") or {}
        bits = [str(v.get("kind", "?"))]
        for key in ("title", "message"):
            if v.get(key):
                bits.append(str(v[key]))
        if v.get("percentage") is not None:
            bits.append(f"{v['percentage']}%")
        return f"progress   {p.get('token')}: {' '.join(bits)}"
    return f"{method}  {json.dumps(p, ensure_ascii=False)}"


def cmd_watch(ctx: Context) -> int:
    sid = ctx.args.session
    events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()

    def deliver(method: str, params: dict[str, Any]) -> None:
        # ZeroMQ topics match by prefix (session/abc also gets session/abcd); the client
        # drops foreign topics, and checking here keeps every wire honest all the same
        if params.get("sessionId") == sid and not method.startswith("$/probe"):
            events.put((method, params))

    out = ctx.out
    checked = time.monotonic()
    # A background job of a non-interactive shell starts with SIGINT ignored, and Python
    # then installs no handler of its own: without this, Ctrl-C or `kill -INT` would not
    # stop the watch.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        ctx.client.on_notification(deliver)
        ctx.client.subscribe(sid)
        # stderr, so stdout carries events only; it also tells a script the watch is live
        sys.stderr.write(f"watching {sid} (Ctrl-C to stop)\n")
        sys.stderr.flush()
        while True:
            try:
                # a timed wait, so Ctrl-C and a vanished daemon are noticed promptly
                method, params = events.get(timeout=WATCH_POLL_SECONDS)
            except queue.Empty:
                now = time.monotonic()
                if ctx.client.closed:
                    fail("the connection to the daemon was lost")
                    return EXIT_UNREACHABLE
                if now - checked >= WATCH_ALIVE_EVERY:
                    checked = now
                    # ZeroMQ never reports a peer going away: check the daemon's pid
                    if daemon_gone(ctx.info):
                        fail(f"the daemon (pid {ctx.info.get('pid')}) stopped")
                        return EXIT_UNREACHABLE
                continue
            if out.json_mode:
                out.record({"method": method, "params": params})
            else:
                out.line(f"{clock(time.time())}  {event_text(method, params)}")
                out.stream.flush()
    except KeyboardInterrupt:
        return EXIT_OK


# registration
