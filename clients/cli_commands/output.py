"""Where `ctxd` commands print: text for people (columns that fit the terminal, wide
characters counted as two) or JSON for programs; the exit codes."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
import unicodedata
from typing import IO, Any

from ctxd.clients.cli_text import clean, clean_json

EXIT_OK = 0
EXIT_UNREACHABLE = 1
EXIT_REFUSED = 2


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
