"""`ctxd import claude-code|codex [PATH…]`: agent transcripts into ctxd sessions."""

from __future__ import annotations

import argparse
import json
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
    find_files,
)
from ctxd.protocol.errors import CtxdError

__all__ = ["FORMATS", "import_paths", "register"]

# name -> (mapper class, file pattern, default paths)
FORMATS: dict[str, tuple[Callable[[Path, Options], Mapper], str, Callable[[], list[Path]]]] = {
    "claude-code": (claude_code.ClaudeCodeMapper, claude_code.PATTERN,
                    claude_code.default_paths),
    "codex": (codex.CodexMapper, codex.PATTERN, codex.default_paths),
}


def import_paths(client: Any, fmt: str, paths: list[Path], options: Options,
                 report: Report | None = None,
                 seen: dict[Path, tuple[int, float]] | None = None,
                 unfinished: dict[Path, tuple[int, int]] | None = None) -> Report:
    """Import every transcript under `paths`; with `seen`, only files changed since.
    `unfinished` keeps, across calls, where each file's unterminated last line starts and
    the file's size then, so that line is parsed again only once the size changed."""
    make, pattern, _ = FORMATS[fmt]
    report = report or Report(verbose=options.verbose)
    for path in find_files(paths, pattern):
        key = None
        if seen is not None:
            try:
                st = path.stat()
            except OSError:
                continue
            key = (st.st_size, st.st_mtime)
            if seen.get(path) == key:
                continue
        try:
            FileImporter(client, make(path, options), path, report, options,
                         unfinished).run()
        except CtxdError as exc:
            report.failed += 1
            report.notes.append(f"{path}: the daemon refused an append: {exc.message}")
        # marked done only now: a file cut short by a lost connection is read again
        if seen is not None and key is not None:
            seen[path] = key
    return report


def _print_report(report: Report, as_json: bool, out: Any = None) -> None:
    out = out or sys.stdout
    if as_json:
        print(json.dumps(report.to_dict(), ensure_ascii=False), file=out, flush=True)
        return
    print(f"imported {report.messages} message(s) in {report.batches} batch(es) from "
          f"{report.files} file(s), {report.lines} line(s) read; "
          f"{report.sessions_created} new session(s)", file=out)
    for title, counter in (("skipped (not conversation)", report.skipped),
                           ("unmappable", report.unmappable),
                           ("repaired", report.repaired)):
        if counter:
            kinds = ", ".join(f"{k}: {n}" for k, n in counter.most_common())
            print(f"  {title}: {kinds}", file=out)
    if report.deferred:
        print(f"  {report.deferred} unfinished message(s) left for the next import (their "
              "transcript is still being written)", file=out)
    for note in report.notes:
        print(f"  note: {note}", file=out)
    if report.verbose or report.unmappable:
        for d in report.details[:200 if not report.verbose else None]:
            print(f"    {d}", file=out)
    out.flush()


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
    try:
        seen: dict[Path, tuple[int, float]] = {}
        unfinished: dict[Path, tuple[int, int]] = {}
        report = import_paths(client, fmt, paths, options, seen=seen, unfinished=unfinished)
        _print_report(report, args.json)
        while args.follow:
            time.sleep(args.interval)
            try:
                report = import_paths(client, fmt, paths, options, seen=seen,
                                      unfinished=unfinished)
            except ConnectionError as exc:
                # the daemon went away (restart, upgrade): start or find it again and go
                # on; what was stored is known from the archive, so nothing is doubled
                print(f"ctxd: lost the daemon ({exc}); reconnecting", file=sys.stderr)
                client.close()
                client = _reconnect(connect, args.interval)
                continue
            if (report.messages or report.notes or report.unmappable
                    or (report.verbose and report.unfinished)):
                _print_report(report, args.json)
    except KeyboardInterrupt:
        return 0
    except ConnectionError as exc:
        print(f"ctxd: lost the daemon: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 2 if report.failed else 0


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
                       help="list every line that was skipped, with its file and number")
        f.add_argument("--json", action="store_true", help="print the report as JSON")
        f.set_defaults(func=lambda a: cmd_import(a, lambda: connect(a)))
