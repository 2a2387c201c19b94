"""The human-facing `ctxd` commands, built on the Python client.

Every command finds the daemon the way the client does (connection file of the data
dir, or the one given), makes its calls, and prints either text for people or, with
`--json`, one JSON document (`watch` and `export`: one JSON object per line).

Exit codes: 0 on success (a compaction that was not effective is still a success),
1 when the daemon cannot be reached, 2 when the daemon refuses a request with a
protocol error (its message is printed as `ctxd: <message>` on stderr).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import re
import shutil
import sys
import tempfile
import time
import unicodedata
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

from ctxd.clients.cli_text import clean, clean_json, cli_message
from ctxd.clients.client import Client, DaemonNotRunning, Wire, find_daemon
from ctxd.daemon.config import ConfigError
from ctxd.protocol.connection import connection_file_for, daemon_gone
from ctxd.protocol.errors import CtxdError

__all__ = ["register"]

EXIT_OK = 0
EXIT_UNREACHABLE = 1
EXIT_REFUSED = 2

# archive/read allows up to 5000; 1000 keeps each reply small while paging fast
READ_PAGE = 1000
SESSION_PAGE = 1000
# side by side needs two columns wide enough for a role and a useful preview
SIDE_BY_SIDE_MIN_WIDTH = 120
# how long `watch` waits between checks that the daemon is still there
WATCH_POLL_SECONDS = 0.5
WATCH_ALIVE_EVERY = 2.0

EVENTS = (
    "session/didAppend",
    "context/didCompact",
    "context/compactionFailed",
    "approval/didRequest",
    "approval/didResolve",
    "run/didStart",
    "run/didFinish",
    "$/progress",
)

# bookkeeping the archive adds to a message; context/get returns messages without them
_ARCHIVE_KEYS = ("id", "batchId", "tokens", "createdAt", "metadata")

CommonOptions = Callable[[argparse.ArgumentParser], None]


# output


class Output:
    """Where a command prints: text for people, or JSON for programs."""

    def __init__(self, stream: IO[str], json_mode: bool) -> None:
        self.stream = stream
        self.json_mode = json_mode
        encoding = (getattr(stream, "encoding", None) or "utf-8").lower().replace("-", "")
        # JSON must never fail to encode: escape non-ASCII when the stream cannot carry it
        self.ascii_only = not encoding.startswith("utf")
        try:
            self.tty = stream.isatty()
        except (AttributeError, ValueError):
            self.tty = False
        if self.ascii_only and hasattr(stream, "reconfigure"):
            # a Chinese title on a Latin-1 terminal should degrade, not crash the command
            stream.reconfigure(errors="backslashreplace")

    @property
    def width(self) -> int:
        return shutil.get_terminal_size((100, 24)).columns if self.tty else 100

    @property
    def bold(self) -> bool:
        return self.tty and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"

    def line(self, text: str = "", raw: bool = False) -> None:
        """One line for people: control characters, escape sequences and bidi controls
        in it are shown as visible escapes (`raw`: the caller added its own styling to
        text it cleaned)."""
        self.stream.write((text if raw else clean(text)) + "\n")

    def document(self, obj: Any) -> None:
        text = json.dumps(obj, ensure_ascii=self.ascii_only, indent=2)
        self.stream.write(clean_json(text) + "\n")
        self.stream.flush()

    def record(self, obj: Any) -> None:
        """One JSON line, flushed so a pipe sees it at once."""
        self.stream.write(clean_json(json_line(obj, self.ascii_only)) + "\n")
        self.stream.flush()


def json_line(obj: Any, ascii_only: bool = False) -> str:
    return json.dumps(obj, ensure_ascii=ascii_only, separators=(",", ":"))


def fail(message: str) -> None:
    sys.stderr.write(f"ctxd: {clean(message)}\n")
    sys.stderr.flush()


# text layout: terminals give East Asian wide characters two columns


def text_width(text: str) -> int:
    width = 0
    for ch in text:
        if unicodedata.combining(ch):
            continue
        width += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return width


def fit(text: str, width: int) -> str:
    """Cut `text` to at most `width` columns, marking a cut with `…`."""
    if width <= 0:
        return ""
    if text_width(text) <= width:
        return text
    out, used = [], 0
    for ch in text:
        w = 0 if unicodedata.combining(ch) else (
            2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1)
        if used + w > width - 1:
            break
        out.append(ch)
        used += w
    return "".join(out) + "…"


def pad(text: str, width: int) -> str:
    return text + " " * max(0, width - text_width(text))


def one_line(text: str) -> str:
    return clean(re.sub(r"\s+", " ", text).strip())


def table(out: Output, headers: list[str], rows: list[list[str]], flex: int) -> None:
    """Print aligned columns; column `flex` shrinks so the table fits the terminal."""
    widths = [max([text_width(h)] + [text_width(clean(r[i])) for r in rows]) for i, h in
              enumerate(headers)]
    others = sum(w for i, w in enumerate(widths) if i != flex) + 2 * (len(widths) - 1)
    widths[flex] = max(min(widths[flex], out.width - others), text_width(headers[flex]), 8)
    for row in [headers, *rows]:
        cells = [pad(fit(clean(cell), widths[i]), widths[i]) for i, cell in enumerate(row)]
        out.line("  ".join(cells).rstrip())


def when(ts: Any) -> str:
    if not isinstance(ts, int | float):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def id_ranges(ids: list[int]) -> str:
    """`[1, 4, 5, 6]` → `#1, #4–#6`."""
    parts: list[str] = []
    run: list[int] = []
    for i in sorted(ids):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            parts.append(f"#{run[0]}" if len(run) == 1 else f"#{run[0]}–#{run[-1]}")
        run = [i]
    if run:
        parts.append(f"#{run[0]}" if len(run) == 1 else f"#{run[0]}–#{run[-1]}")
    return ", ".join(parts) if parts else "none"


def content_text(content: Any) -> str:
    """Text of an OpenAI `content`: a string, null, or a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                pieces.append(part["text"])
            elif isinstance(part, dict):
                pieces.append(f"[{part.get('type', 'part')}]")
        return " ".join(pieces)
    return str(content)


def tool_call_text(call: Any, max_args: int = 40) -> str:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict):
        return "?()"
    args = fn.get("arguments")
    args = one_line(args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))
    return f"{fn.get('name', '?')}({fit(args, max_args)})"


def preview(msg: dict[str, Any]) -> str:
    """The first line of a message's content, then its tool calls as `name(args…)`."""
    text = content_text(msg.get("content")).strip()
    lines = text.splitlines()
    first = one_line(lines[0]) + (" …" if len(lines) > 1 else "") if lines else ""
    calls = msg.get("tool_calls") or []
    if calls:
        called = ", ".join(tool_call_text(c) for c in calls)
        first = f"{first} → {called}" if first else called
    return first


def message_line(role: str, msg: dict[str, Any], width: int) -> str:
    return fit(f"{role}: {preview(msg)}", width)


# resolving and reaching the daemon


@dataclass
class Context:
    args: argparse.Namespace
    out: Output
    client: Client
    info: dict[str, Any]
    connection_file: Path
    data_dir: Path


Handler = Callable[[Context], int]


class NoDaemon(Exception):
    """find_daemon failed: the message names the data dir and says how to start one."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


def _locate(args: argparse.Namespace) -> tuple[Path | None, Path]:
    """The connection file given (flag or config) if any, and the effective data dir."""
    from ctxd.daemon.config import load_config

    cfg = load_config(args.config, {
        "data_dir": args.data_dir, "connection_file": args.connection_file})
    return cfg.connection_file, cfg.data_dir


def _find(args: argparse.Namespace) -> tuple[Path, dict[str, Any], Path]:
    given, data_dir = _locate(args)
    path = given or connection_file_for(data_dir)
    try:
        found, info = find_daemon(given, data_dir)
    except DaemonNotRunning as exc:
        where = f"at {given}" if given else f"for {data_dir}"
        detail = (f"no connection file at {path}" if not path.exists() else str(exc))
        raise NoDaemon(f"no ctxd daemon {where}; start one with `ctxd serve`", detail) from None
    return found, info, data_dir


def _client_log_to_stderr() -> None:
    """Show the client's warnings (a lost connection and why) the way the CLI reports."""
    root, client_log = logging.getLogger(), logging.getLogger("ctxd.client")
    if root.handlers or client_log.handlers:
        return  # an embedding program configured logging: leave it alone
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("ctxd: %(message)s"))
    handler.setLevel(logging.WARNING)
    client_log.addHandler(handler)


def _run(handler: Handler) -> Callable[[argparse.Namespace], int]:
    """Connect, run `handler`, and turn every failure into a message and an exit code."""

    def run(args: argparse.Namespace) -> int:
        _client_log_to_stderr()
        # `ctxd --json status` and `ctxd status --json` alike
        json_mode = bool(args.json or getattr(args, "json_first", False))
        out = Output(sys.stdout, json_mode)
        client: Client | None = None
        try:
            path, info, data_dir = _find(args)
            client = Client(info, cast(Wire, args.wire), source=str(path))
            client.open()
            return handler(Context(args, out, client, info, path, data_dir))
        except BrokenPipeError:
            raise  # the reader went away: not an error to report (see `guarded`)
        except NoDaemon as exc:
            fail(str(exc))
            fail(exc.detail)
            if json_mode and args.command == "status":
                out.document({"running": False, "message": str(exc), "detail": exc.detail})
            return EXIT_UNREACHABLE
        except CtxdError as exc:
            fail(cli_message(exc.message, getattr(args, "session", None)))
            return EXIT_REFUSED
        except (ConnectionError, TimeoutError) as exc:
            fail(str(exc))
            return EXIT_UNREACHABLE
        except ConfigError as exc:
            fail(str(exc))  # a bad config file, CTXD_* variable or flag: a usage mistake
            return EXIT_REFUSED
        except (ValueError, OSError) as exc:
            # an unwritable --output
            fail(str(exc))
            return EXIT_UNREACHABLE
        finally:
            if client is not None:
                client.close()

    def guarded(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except BrokenPipeError:
            # the reader (`| head`) has all it wanted; keep Python from complaining at exit
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return EXIT_OK

    return guarded


def _pages(client: Client, session_id: str, stop_after: int | None = None
           ) -> Iterator[dict[str, Any]]:
    """Every archived message of the session in id order, one page in memory at a time."""
    after = 0
    seen = 0
    while True:
        page = client.read(session_id, after_id=after, limit=READ_PAGE)
        for msg in page["messages"]:
            if stop_after is not None and seen >= stop_after:
                return
            seen += 1
            yield msg
        nxt = page.get("nextAfterId")
        if nxt is None or not page["messages"] or nxt <= after:
            return
        after = nxt


def _all_sessions(client: Client) -> Iterator[dict[str, Any]]:
    cursor: str | None = None
    while True:
        page = client.list_sessions(limit=SESSION_PAGE, cursor=cursor)
        yield from page["sessions"]
        cursor = page.get("nextCursor")
        if not cursor:
            return


# commands


def cmd_status(ctx: Context) -> int:
    info = ctx.info
    sessions = sum(1 for _ in _all_sessions(ctx.client))
    endpoints = {k: info[k] for k in ("zmq_router", "zmq_pub", "jsonrpc_tcp", "websocket")
                 if info.get(k)}
    if ctx.out.json_mode:
        ctx.out.document({
            "running": True,
            "pid": info.get("pid"),
            "version": info.get("version"),
            "dataDir": info.get("data_dir") or str(ctx.data_dir),
            "connectionFile": str(ctx.connection_file),
            "endpoints": endpoints,
            "sessions": sessions,
        })
        return EXIT_OK
    out = ctx.out
    out.line(f"ctxd daemon {info.get('version', '?')} running, pid {info.get('pid', '?')}")
    rows = [
        ("data dir", str(info.get("data_dir") or ctx.data_dir)),
        ("connection file", str(ctx.connection_file)),
        *[(name.replace("_", " "), str(url)) for name, url in endpoints.items()],
        ("sessions", str(sessions)),
    ]
    for name, value in rows:
        out.line(f"  {name:<16} {value}")
    return EXIT_OK


def cmd_sessions(ctx: Context) -> int:
    args = ctx.args
    if args.all:
        sessions = list(_all_sessions(ctx.client))
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
          rows, flex=1)
    if cursor:
        ctx.out.line(f"(more sessions: --all lists them all, or raise --limit from {args.limit})")
    return EXIT_OK


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
    for msg in _pages(client, sid, stop_after=snapshot):
        count += 1
        tokens += int(msg.get("tokens") or 0)
        if in_lead and msg.get("role") == "system":
            leading.append(msg)
        else:
            in_lead = False
        last.append(msg)
    mapping = _map_context(ctx_msgs, leading, list(last), count)
    shown = list(last)[-limit:] if limit else []

    if ctx.out.json_mode:
        ctx.out.document({
            "session": session,
            "status": status,
            "archive": {
                "messages": count,
                "tokens": tokens,
                "last": [{**m, "inContext": mapping is not None and m["id"] in mapping.in_context}
                         for m in shown],
            },
            "context": {
                "messages": len(ctx_msgs),
                "estimatedTokens": status.get("estimatedTokens"),
                "hasSummary": mapping is not None and mapping.summary_index is not None,
                "items": [{"archiveId": mapping.archive_ids[i] if mapping else None, **m}
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
    out.line("archive ids in context: "
             + (id_ranges(sorted(in_ctx)) if mapping else "unknown (context and archive "
                "did not line up; try again)"))
    out.line()

    left_head = [f"ARCHIVE  {plural(count, 'message')}, {plural(tokens, 'token')}",
                 f"last {len(shown)} (* = in context):"]
    right_head = [f"ACTIVE CONTEXT  {plural(len(ctx_msgs), 'message')}, "
                  f"~{status.get('estimatedTokens', '?')} tokens", ""]
    width = out.width
    side = out.tty and width >= SIDE_BY_SIDE_MIN_WIDTH
    col = (width - 3) // 2 if side else width

    def archive_lines() -> list[str]:
        lines = []
        for m in shown:
            mark = "*" if m["id"] in in_ctx else " "
            lines.append(fit(f"#{m['id']:<5}{mark} " + message_line(m.get("role", "?"), m, col),
                             col))
        return lines or ["(empty)"]

    def context_lines() -> list[str]:
        lines = []
        for i, m in enumerate(ctx_msgs):
            aid = mapping.archive_ids[i] if mapping else None
            summary = mapping is not None and mapping.summary_index == i
            label = "summary" if summary else m.get("role", "?")
            ref = "      " if aid is None else f"#{aid:<5}"
            lines.append(fit(ref + " " + message_line(label, m, col), col))
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


_BOLD = re.compile(r"\*\*(.+?)\*\*", re.S)


def cmd_search(ctx: Context) -> int:
    args = ctx.args
    extra: dict[str, Any] = {}
    if args.advanced:
        extra["advanced"] = True
    if args.newest:
        extra["newestFirst"] = True
    found = ctx.client.search(args.query, session_id=args.session, role=args.role,
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
        out.line(f"#{hit['messageId']}  {hit['sessionId']}  {hit.get('role', '?')}  "
                 f"{when(hit.get('createdAt'))}  [{where}]")
        snippet = one_line(hit.get("snippet") or "")  # cleaned: the bold is ours alone
        if out.bold:
            snippet = _BOLD.sub("\x1b[1m\\1\x1b[0m", snippet)
        out.line(f"    {snippet}", raw=True)
    return EXIT_OK


def _compaction_report(ctx: Context, result: dict[str, Any], verb: str) -> int:
    out = ctx.out
    if out.json_mode:
        out.document(result)
        return EXIT_OK
    before, after = result.get("before") or {}, result.get("after") or {}
    numbers = (f"{before.get('messages', '?')} → {after.get('messages', '?')} messages, "
               f"{before.get('tokens', '?')} → {after.get('tokens', '?')} tokens")
    if result.get("effective"):
        span = ""
        if result.get("summarizedFrom") is not None:
            span = f" (summarized #{result['summarizedFrom']}–#{result['summarizedTo']})"
        out.line(f"{verb}: effective, {numbers}{span}")
    elif result.get("underLimits"):
        limits = result.get("limits") or {}
        out.line(f"{verb}: not effective, {numbers}")
        out.line(f"reason: the context is under its limit ({before.get('messages', '?')} of "
                 f"{limits.get('messages', '?')} messages, {before.get('tokens', '?')} of "
                 f"{limits.get('tokens', '?')} tokens); use --force to compact it anyway")
    else:
        out.line(f"{verb}: not effective, {numbers}")
        reason = cli_message(result.get("reason") or "the context did not shrink")
        out.line(f"reason: {reason}")
        if result.get("compactionId"):
            # a rebuild replaces the context even when the result is not smaller
            out.line(f"note: the daemon kept the new context ({result['compactionId']})")
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
        for msg in _pages(ctx.client, sid):
            ctx.out.record(_export_record(msg))
        return EXIT_OK
    target: Path = ctx.args.output
    # write beside the target and rename at the end: a failed export leaves no half file
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                               suffix=".part")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            n = 0
            for msg in _pages(ctx.client, sid):
                f.write(json_line(_export_record(msg)) + "\n")
                n += 1
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    sys.stderr.write(f"exported {n} messages of {sid} to {target}\n")
    return EXIT_OK


def event_text(method: str, p: dict[str, Any]) -> str:
    """One human line for a notification."""
    if method == "session/didAppend":
        ids = p.get("messageIds") or []
        span = id_ranges(ids) if ids else "no messages"
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


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser],
             common: CommonOptions) -> Callable[..., argparse.ArgumentParser]:
    """Add the inspection commands to the `ctxd` parser; returns the `add` that
    commands_admin.register takes, so the admin commands join the same group."""

    def add(name: str, handler: Handler, help: str, parent: Any = sub,
            aliases: tuple[str, ...] = ()) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = parent.add_parser(name, help=help, description=help,
                                                       aliases=list(aliases))
        common(p)
        p.add_argument("--wire", choices=["zmq", "jsonrpc", "websocket"], default="zmq",
                       help="how to reach the daemon (default: zmq)")
        p.add_argument("--json", action="store_true",
                       help="machine-readable output: one JSON document"
                       + (" per line" if name in ("watch", "export") else ""))
        p.set_defaults(func=_run(handler))
        return p

    def positive(text: str) -> int:
        value = int(text)
        if value < 1:
            raise argparse.ArgumentTypeError("must be at least 1")
        return value

    def count(text: str) -> int:
        value = int(text)
        if value < 0:
            raise argparse.ArgumentTypeError("must not be negative")
        return value

    add("status", cmd_status, "show the running daemon (pid, endpoints, data dir) and "
        "how many sessions it holds")

    p = add("sessions", cmd_sessions, "list sessions, newest first")
    p.add_argument("--limit", type=positive, default=50, help="sessions per page (default 50)")
    p.add_argument("--all", action="store_true", help="follow the pages to list every session")

    p = add("show", cmd_show, "show a session's archive and its active context")
    p.add_argument("session", help="session id")
    p.add_argument("--limit", type=count, default=20,
                   help="how many of the latest archive messages to list (default 20)")

    p = add("search", cmd_search, "full-text search of the archive: messages with all the "
            "words; when none has them all, those with some of them, marked as such")
    p.add_argument("query", help="words to find (FTS5 syntax with --advanced)")
    p.add_argument("--session", help="only this session")
    p.add_argument("--role", choices=["system", "user", "assistant", "tool"],
                   help="only messages of this role")
    p.add_argument("--limit", type=positive, default=20, help="most hits (default 20)")
    p.add_argument("--advanced", action="store_true",
                   help="pass the query through as SQLite FTS5 syntax")
    p.add_argument("--newest", action="store_true", help="newest first instead of best first")

    p = add("compact", cmd_compact, "compact a session's active context now")
    p.add_argument("session", help="session id")
    p.add_argument("--force", action="store_true",
                   help="compact even when the context is under its threshold")
    p.add_argument("--instructions", help="extra guidance for the summarizer")

    p = add("rebuild", cmd_rebuild, "rebuild a session's summary from the whole archive")
    p.add_argument("session", help="session id")

    pins = sub.add_parser("pins", help="texts kept in the context through every compaction",
                          description="texts kept in the context through every compaction")
    pins_sub = pins.add_subparsers(dest="pins_command", required=True)
    p = add("add", cmd_pins_add, "pin a text to the session's context", parent=pins_sub)
    p.add_argument("session", help="session id")
    p.add_argument("text", help="text to keep in the context")
    p = add("list", cmd_pins_list, "list the session's pins", parent=pins_sub)
    p.add_argument("session", help="session id")
    p = add("rm", cmd_pins_remove, "unpin a text", parent=pins_sub, aliases=("remove",))
    p.add_argument("session", help="session id")
    p.add_argument("pin_id", help="pin id, from `ctxd pins list`")

    p = add("export", cmd_export, "write the whole archive of a session as JSON lines")
    p.add_argument("session", help="session id")
    p.add_argument("--output", "-o", type=Path, help="file to write (default: stdout)")

    p = add("watch", cmd_watch, "print a session's live events until Ctrl-C")
    p.add_argument("session", help="session id")

    return add
