"""`ctxd import claude-code|codex [PATH…]`: agent transcripts into ctxd sessions."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ctxd.clients.importers import claude_code, codex
from ctxd.clients.importers.common import (
    MAX_LINE_BYTES,
    FileImporter,
    Mapper,
    Options,
    Report,
)
from ctxd.clients.importers.detect import Finder, Survey
from ctxd.protocol.errors import CtxdError

__all__ = ["FORMATS", "Progress", "import_paths", "register"]

# name -> (mapper class, file pattern, default paths); the pattern is the name the agent
# gives its transcripts, but files are found by their content (see detect.py)
FORMATS: dict[str, tuple[Callable[[Path, Options], Mapper], str, Callable[[], list[Path]]]] = {
    "claude-code": (claude_code.ClaudeCodeMapper, claude_code.PATTERN,
                    claude_code.default_paths),
    "codex": (codex.CodexMapper, codex.PATTERN, codex.default_paths),
}


def import_paths(client: Any, fmt: str, paths: list[Path], options: Options,
                 report: Report | None = None,
                 seen: dict[Path, tuple[int, float]] | None = None,
                 unfinished: dict[Path, tuple[int, int]] | None = None,
                 finder: Finder | None = None,
                 progress: Progress | None = None) -> Report:
    """Import every transcript under `paths` (found by content, whatever its name); with
    `seen`, only files changed since. `unfinished` keeps, across calls, where each file's
    unterminated last line starts and the file's size then, so that line is parsed again
    only once the size changed. `finder` keeps what each file was found to be across
    calls; `progress` is told of each file as it is read."""
    make = FORMATS[fmt][0]
    report = report or Report(verbose=options.verbose)
    finder = finder or Finder(fmt)
    survey = Survey()
    files = finder.find(paths, survey)
    report.found += len(files)
    report.looked_at += survey.looked_at
    report.other_format += len(survey.other)
    for path, kind in survey.refused:
        if path in finder.refused:
            continue  # said once: a `--follow` round does not repeat it
        finder.refused.add(path)
        report.failed += 1
        report.notes.append(f"{path}: a {_NAMES.get(kind, kind)} transcript, not a "
                            f"{_NAMES[fmt]} one; import it with `ctxd import {kind}`")
    for i, path in enumerate(files):
        key = None
        if seen is not None:
            try:
                st = path.stat()
            except OSError:
                continue
            key = (st.st_size, st.st_mtime)
            if seen.get(path) == key:
                continue
        if progress is not None:
            progress.show(i, len(files), report, path)
        try:
            FileImporter(client, make(path, options), path, report, options,
                         unfinished).run()
        except CtxdError as exc:
            report.failed += 1
            report.notes.append(f"{path}: the daemon refused an append: {exc.message}")
        # marked done only now: a file cut short by a lost connection is read again
        if seen is not None and key is not None:
            seen[path] = key
    if progress is not None:
        progress.clear()
    return report


_NAMES = {"claude-code": "Claude Code", "codex": "Codex"}


class Progress:
    """One line on a terminal, rewritten in place as files are read; nothing elsewhere."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.shown = False

    def show(self, index: int, total: int, report: Report, path: Path) -> None:
        line = (f"importing {index + 1}/{total}: {report.messages} message(s) so far, "
                f"{path.name}")
        self.out.write("\r" + line[:150] + "\x1b[K")
        self.out.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.out.write("\r\x1b[K")
            self.out.flush()
            self.shown = False


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def _print_report(report: Report, as_json: bool, out: Any = None, hint: bool = True) -> None:
    out = out or sys.stdout
    if as_json:
        print(json.dumps(report.to_dict(), ensure_ascii=False), file=out, flush=True)
        return
    skipped = sum(report.skipped.values()) + sum(report.unmappable.values())
    line = (f"imported {_plural(report.messages, 'message')} into "
            f"{_plural(len(report.sessions), 'session')} "
            f"({report.sessions_created} new) from {_plural(report.files, 'file')}; "
            f"{_plural(report.lines, 'line')} read, {skipped} skipped")
    if report.repaired:
        line += f", {_plural(sum(report.repaired.values()), 'message')} repaired"
    print(line, file=out)
    if report.deferred:
        print(f"  {_plural(report.deferred, 'unfinished message')} left for the next "
              "import (its transcript is still being written)", file=out)
    for note in report.notes:
        print(f"  note: {note}", file=out)
    if report.verbose:
        for title, counter in (("skipped (not conversation)", report.skipped),
                               ("unmappable", report.unmappable),
                               ("repaired", report.repaired)):
            if counter:
                kinds = ", ".join(f"{k}: {n}" for k, n in counter.most_common())
                print(f"  {title}: {kinds}", file=out)
        for d in report.details:
            print(f"    {d}", file=out)
    elif hint and (skipped or report.repaired):
        print("  (--verbose lists what was skipped or repaired, line by line)", file=out)
    out.flush()


def _nothing_found(fmt: str, paths: list[Path], report: Report) -> str:
    """Why nothing was imported: what was looked at, and what it was instead."""
    where = ", ".join(str(p) for p in paths)
    why = (f"no {_NAMES[fmt]} transcript under {where} "
           f"({_plural(report.looked_at, 'file')} looked at")
    if report.other_format:
        other = next(k for k in FORMATS if k != fmt)
        why += (f"; {report.other_format} of them are {_NAMES[other]} transcripts: "
                f"import them with `ctxd import {other}`")
    return why + ")"


def cmd_import(args: argparse.Namespace, connect: Callable[[], Any]) -> int:
    from ctxd.clients.client import DaemonNotRunning

    fmt = args.format
    paths = [Path(p).expanduser() for p in args.paths] or FORMATS[fmt][2]()
    missing = [p for p in paths if not p.exists()]
    if missing and not args.follow:
        for p in missing:
            print(f"ctxd: {p} does not exist", file=sys.stderr)
        if len(missing) == len(paths):
            return 2
    if args.max_line_bytes < 1:
        print("ctxd: --max-line-bytes must be at least 1", file=sys.stderr)
        return 2
    options = Options(drop_reasoning=args.drop_reasoning, verbose=args.verbose,
                      sidechains=args.sidechains, max_line_bytes=args.max_line_bytes)
    try:
        client = connect()
    except (DaemonNotRunning, ConnectionError) as exc:
        print(f"ctxd: {exc}", file=sys.stderr)
        return 1
    progress = Progress(sys.stderr) if sys.stderr.isatty() and not args.json else None
    finder = Finder(fmt)
    if args.follow:
        # A background job of a non-interactive shell starts with SIGINT ignored, and
        # Python then installs no handler of its own: without this, Ctrl-C or `kill -INT`
        # would not stop the follow.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        seen: dict[Path, tuple[int, float]] = {}
        unfinished: dict[Path, tuple[int, int]] = {}
        report = import_paths(client, fmt, paths, options, seen=seen, unfinished=unfinished,
                              finder=finder, progress=progress)
        _print_report(report, args.json)
        empty = not report.found and not report.failed
        if empty:
            print(f"ctxd: {_nothing_found(fmt, paths, report)}"
                  + ("; watching for new ones" if args.follow else ""), file=sys.stderr)
        while args.follow:
            time.sleep(args.interval)
            try:
                report = import_paths(client, fmt, paths, options, seen=seen,
                                      unfinished=unfinished, finder=finder)
            except ConnectionError as exc:
                # the daemon went away (restart, upgrade): start or find it again and go
                # on; what was stored is known from the archive, so nothing is doubled
                print(f"ctxd: lost the daemon ({exc}); reconnecting", file=sys.stderr)
                client.close()
                client = _reconnect(connect, args.interval)
                continue
            if (report.messages or report.notes or report.unmappable
                    or (report.verbose and report.unfinished)):
                _print_report(report, args.json, hint=False)
    except KeyboardInterrupt:
        return 0
    except ConnectionError as exc:
        print(f"ctxd: lost the daemon: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    if report.failed:
        return 2
    return 1 if empty else 0


def _reconnect(connect: Callable[[], Any], interval: float) -> Any:
    while True:
        try:
            return connect()
        except ConnectionError:
            time.sleep(max(interval, 1.0))


def register(sub: Any, common: Callable[[argparse.ArgumentParser], None],
             connect: Callable[[argparse.Namespace], Any]) -> None:
    p = sub.add_parser("import", help="import Claude Code or Codex CLI transcripts as "
                       "sessions (idempotent; --follow keeps importing as agents write)")
    formats = p.add_subparsers(dest="format", required=True)
    for name, where in (("claude-code", "~/.claude/projects"),
                        ("codex", "~/.codex/sessions")):
        f = formats.add_parser(name, help=f"transcripts under {where} (the default) or "
                               "the given files and folders")
        common(f)
        f.add_argument("paths", nargs="*", metavar="PATH",
                       help=f"transcript files or folders (default: {where})")
        f.add_argument("--follow", action="store_true",
                       help="keep watching and import new lines as they are written")
        f.add_argument("--interval", type=float, default=1.0,
                       help="seconds between checks with --follow (default 1)")
        f.add_argument("--drop-reasoning", action="store_true",
                       help="leave out the model's reasoning (kept as metadata by default)")
        f.add_argument("--sidechains", choices=["sessions", "mark"], default="sessions",
                       help="subagent conversations as their own sessions (default) or "
                       "kept in the main session, marked")
        f.add_argument("--max-line-bytes", type=int, default=MAX_LINE_BYTES, metavar="N",
                       help="skip (and report) a transcript line longer than N bytes "
                       f"without reading it whole (default {MAX_LINE_BYTES // 2**20} MiB)")
        f.add_argument("--verbose", action="store_true",
                       help="also list what was skipped or repaired, line by line, with "
                       "its file and number")
        f.add_argument("--json", action="store_true", help="print the report as JSON")
        f.set_defaults(func=lambda a: cmd_import(a, lambda: connect(a)))
