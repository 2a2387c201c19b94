"""Where `ctxd` commands print: text for people (columns that fit the terminal, wide
characters counted as two) or JSON for programs; the exit codes."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import shutil
import sys
import time
import unicodedata
from typing import IO, TYPE_CHECKING, Any

from ctxd.clients.cli.text import clean, clean_field, clean_json

if TYPE_CHECKING:
    from rich.table import Table

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


def fit_middle(text: str, width: int) -> str:
    """Cut `text` to at most `width` columns by dropping its middle for `…`: the head
    and the tail of an id stay, so it is still recognisable."""
    if text_width(text) <= width:
        return text
    if width <= 2:
        return fit(text, width)
    tail_width = (width - 1) // 2
    tail: list[str] = []
    used = 0
    for ch in reversed(text):
        w = text_width(ch)
        if used + w > tail_width:
            break
        tail.append(ch)
        used += w
    head = fit(text, width - used)  # ends with its own `…`
    return head + "".join(reversed(tail))


# on a terminal the flexible column gets at least this many cells when a long id
# can give them up; an id is never shortened below ID_MIN_CELLS, so the daemon's own
# ids (`ses_` and 20 hex digits) stay whole and can be copied into the next command
FLEX_MIN_CELLS = 24
ID_MIN_CELLS = 24


def table(out: Output, headers: list[str], rows: list[list[str]], flex: int,
          squeeze: int | None = None) -> None:
    """Print aligned columns under a header row.

    On a terminal, column `flex` shrinks (cut with `…`) so the table fits its width and
    the header is bold; when that would leave it fewer than FLEX_MIN_CELLS, the cells
    of column `squeeze` (ids) longer than needed lose their middle to `…`, never below
    ID_MIN_CELLS. Elsewhere (a pipe, a file) nothing is cut: every cell is whole, one
    row per line, so a script can read any column."""
    # rich is imported by the commands that print tables only: the others (`export` and
    # `stdio` among them) do not pay its tens of milliseconds of start-up
    from rich.cells import cell_len
    from rich.table import Table
    from rich.text import Text

    cells = [[clean_field(c) for c in r] for r in rows]
    widths = [max([cell_len(h)] + [cell_len(r[i]) for r in cells]) for i, h in
              enumerate(headers)]
    if out.tty:
        others = sum(w for i, w in enumerate(widths) if i != flex) + _GAP * (len(widths) - 1)
        wanted = min(widths[flex], FLEX_MIN_CELLS)
        if squeeze is not None and out.width - others < wanted:
            floor = max(ID_MIN_CELLS, cell_len(headers[squeeze]))
            narrower = max(widths[squeeze] - (wanted - (out.width - others)), floor)
            if narrower < widths[squeeze]:
                others -= widths[squeeze] - narrower
                widths[squeeze] = narrower
                for r in cells:
                    r[squeeze] = fit_middle(r[squeeze], narrower)
        widths[flex] = max(min(widths[flex], out.width - others), cell_len(headers[flex]), 8)
    grid = Table(box=None, padding=(0, 0, 0, _GAP), pad_edge=False, show_header=True,
                 header_style="bold" if out.bold else "")
    for i, h in enumerate(headers):
        # every column has its width set: rich never has to shrink one on its own
        grid.add_column(Text(h), width=widths[i], no_wrap=True, overflow="ellipsis")
    for r in cells:
        grid.add_row(*(Text(c) for c in r))
    _print(out, grid, sum(widths) + _GAP * (len(widths) - 1))


def fields(out: Output, rows: list[tuple[str, str]], indent: int = 2) -> None:
    """Print `name  value` lines, the names in one column; values are never cut."""
    from rich.cells import cell_len
    from rich.table import Table
    from rich.text import Text

    names = max((cell_len(n) for n, _ in rows), default=0)
    values = max((cell_len(clean(v)) for _, v in rows), default=0)
    grid = Table(box=None, padding=(0, 0, 0, _GAP), pad_edge=False, show_header=False)
    grid.add_column(width=names, no_wrap=True)
    grid.add_column(width=values, no_wrap=True)
    for name, value in rows:
        grid.add_row(Text(name), Text(clean(value)))
    _print(out, grid, names + values + _GAP, prefix=" " * indent)


# columns between two cells: the left padding of every column but the first
_GAP = 2


def _print(out: Output, renderable: Table, width: int, prefix: str = "") -> None:
    """Render with rich to text, then write it line by line: trailing padding stripped,
    colour only on a terminal that takes it (rich honours NO_COLOR too)."""
    from rich.console import Console

    buffer = io.StringIO()
    console = Console(file=buffer, width=max(width, 1), force_terminal=out.bold,
                      color_system="standard" if out.bold else None, no_color=not out.bold,
                      highlight=False, markup=False, emoji=False, legacy_windows=False)
    console.print(renderable)
    for line in buffer.getvalue().splitlines():
        out.line(prefix + line.rstrip(), raw=True)


def when(ts: Any) -> str:
    if not isinstance(ts, int | float):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def id_ranges(ids: list[int], archive: bool = False) -> str:
    """`[1, 4, 5, 6]` → `#1, #4–#6` (ordinals), or `msg 1, 4–6` with `archive`: archive
    ids are written apart from the `#N` ordinals everywhere (see docs/protocol.md)."""
    mark = "" if archive else "#"
    parts: list[str] = []
    run: list[int] = []
    for i in sorted(ids):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            parts.append(f"{mark}{run[0]}" if len(run) == 1 else f"{mark}{run[0]}–{mark}{run[-1]}")
        run = [i]
    if run:
        parts.append(f"{mark}{run[0]}" if len(run) == 1 else f"{mark}{run[0]}–{mark}{run[-1]}")
    if not parts:
        return "none"
    return ("msg " if archive else "") + ", ".join(parts)


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


# arguments that name a file or directory: a cut call shows them first and whole
PATH_ARGUMENTS = ("path", "file_path", "filename", "notebook_path", "cwd")
# a word of a shell command that names a file: `src/mod.py`, `./run.sh`, `notes.md`
_COMMAND_FILE = re.compile(r"[\w.~/+-]*/[\w.+-]+|[\w.~/+-]*\.[A-Za-z]\w{0,7}")
# cells the rest of a cut call's arguments keep after its paths, however long those are
_REST_MIN = 12
# `, …`: the least a cut call shows of the arguments after its paths
_REST_SHORTEST = 3


def tool_call_text(call: Any, max_args: int = 40, room: int | None = None) -> str:
    """`name(arguments)`, the arguments cut to `max_args` columns; when cut, the
    path-like ones (PATH_ARGUMENTS, and the file a `command` names) come first, whole,
    so a line says which file the call touched. `room`: the columns the whole call may
    take on its line; a path too long for it keeps its end (`…/daemon/engine.py`)."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict):
        return "?()"
    raw = fn.get("arguments")
    args = one_line(raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False))
    if text_width(args) > max_args:
        name_width = text_width(str(fn.get("name", "?"))) + 2
        paths_first = _paths_first(raw, max_args,
                                   None if room is None else room - name_width)
        if paths_first is not None:
            args = paths_first
        else:
            args = fit(args, max_args)
    return f"{fn.get('name', '?')}({args})"


def _paths_first(raw: Any, max_args: int, room: int | None) -> str | None:
    """The arguments as a JSON object with its path-like members first and whole (or
    their ends, when `room` is too narrow for them), the rest cut to fit; None when there
    is no such member."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return None
    if not isinstance(raw, dict):
        return None
    paths = [(key, one_line(raw[key])) for key in PATH_ARGUMENTS
             if isinstance(raw.get(key), str) and raw[key].strip()]
    if paths and room is not None:
        # what the keys, quotes and separators take, then the cells left for the values
        frame = 1 + sum(text_width(_json(k)) + 4 for k, _ in paths) + 2 * (len(paths) - 1)
        share = max((room - _REST_SHORTEST - frame) // len(paths), _REST_MIN)
        paths = [(k, fit_start(v, share)) for k, v in paths]
    first = [f"{_json(k)}: {_json(v)}" for k, v in paths]
    taken = {k for k, _ in paths}
    command = raw.get("command")
    if isinstance(command, str):
        shown = _command_showing_its_file(one_line(command), max_args)
        if shown is not None:
            first.append(f'"command": {_json(shown)}')
            taken.add("command")
    if not first:
        return None
    head = "{" + ", ".join(first)
    rest = {k: v for k, v in raw.items() if k not in taken}
    if not rest:
        return one_line(head + "}")
    rest_text = one_line(", " + json.dumps(rest, ensure_ascii=False)[1:])
    budget = max(max_args - text_width(head), _REST_MIN)
    if room is not None:
        # the paths come first: the rest shrinks to `, …` before a path loses a cell
        budget = max(min(budget, room - text_width(head)), _REST_SHORTEST)
    return one_line(head) + fit(rest_text, budget)


def _command_showing_its_file(command: str, max_args: int) -> str | None:
    """A long shell command cut around the first file it names (`cat … src/mod.py …`);
    None when it names none or is short enough to show whole."""
    if text_width(command) <= max_args // 2:
        return None
    try:
        words = shlex.split(command)
    except ValueError:  # an unclosed quote: plain words will do
        words = command.split()
    named = [w for w in words[1:] if not w.startswith("-") and "://" not in w
             and _COMMAND_FILE.fullmatch(w) and w in command]
    # a file (`tests/test_x.py`) says more than a directory (`cd /work/repo && …`)
    files = [w for w in named if "." in w.rsplit("/", 1)[-1].lstrip(".")]
    if not (files or named):
        return None
    word = (files or named)[0]
    at = command.find(word)
    before, after = command[:at], command[at + len(word):]
    if text_width(before) > _REST_MIN:
        before = fit(before.rstrip(), _REST_MIN) + " "
    return before + word + (" …" if after.strip() else "")


def fit_start(text: str, width: int) -> str:
    """Cut `text` to at most `width` columns from its start: a path keeps its file name
    (`…/daemon/engine.py`)."""
    if text_width(text) <= width:
        return text
    return "…" + fit(text[::-1], width)[:-1][::-1] if width > 1 else fit(text, width)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def preview(msg: dict[str, Any], width: int | None = None) -> str:
    """The first line of a message's content, then its tool calls as `name(args…)`;
    `width`: the columns the line has, so a call's path fits in them."""
    text = content_text(msg.get("content")).strip()
    lines = text.splitlines()
    first = one_line(lines[0]) + (" …" if len(lines) > 1 else "") if lines else ""
    calls = msg.get("tool_calls") or []
    if calls:
        room = None
        if width is not None:
            # the content and ` → ` before the calls, `, ` between them
            used = (text_width(first) + 3 if first else 0) + 2 * (len(calls) - 1)
            room = (width - used) // len(calls)
        called = ", ".join(tool_call_text(c, room=room) for c in calls)
        first = f"{first} → {called}" if first else called
    return first


def message_line(role: str, msg: dict[str, Any], width: int) -> str:
    head = f"{role}: "
    return fit(head + preview(msg, width - text_width(head)), width)


# resolving and reaching the daemon
