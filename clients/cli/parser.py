"""The human-facing `ctxd` commands, built on the Python client.

Every command finds the daemon the way the client does (connection file of the data
dir, or the one given), makes its calls, and prints either text for people or, with
`--json`, one JSON document (`watch` and `export`: one JSON object per line).

Exit codes: 0 on success (a compaction that was not effective is still a success),
1 when the daemon cannot be reached, 2 when the daemon refuses a request with a
protocol error (its message is printed as `ctxd: <message>` on stderr).

This module registers the commands with the parser; their bodies are in
clients/cli/commands/ by job: output (printing), running (reaching the daemon, exit
codes), sessions, inspect (show, search) and watch.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ctxd.clients.cli.commands.inspect import cmd_search, cmd_show
from ctxd.clients.cli.commands.running import CommonOptions, Handler, runner
from ctxd.clients.cli.commands.sessions import (
    cmd_compact,
    cmd_export,
    cmd_pins_add,
    cmd_pins_list,
    cmd_pins_remove,
    cmd_rebuild,
    cmd_sessions,
    cmd_status,
)
from ctxd.clients.cli.commands.watch import cmd_watch

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser],
             common: CommonOptions) -> Callable[..., argparse.ArgumentParser]:
    """Add the inspection commands to the `ctxd` parser; returns the `add` that
    commands.admin.register takes, so the admin commands join the same group."""

    def add(name: str, handler: Handler, help: str, parent: Any = sub,
            aliases: tuple[str, ...] = ()) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = parent.add_parser(name, help=help, description=help,
                                                       aliases=list(aliases))
        common(p)
        p.add_argument("--wire", choices=["zmq", "jsonrpc", "websocket"],
                       default=argparse.SUPPRESS,
                       help="how to reach the daemon (default: zmq)")
        p.add_argument("--json", action="store_true",
                       help="machine-readable output: one JSON document"
                       + (" per line" if name in ("watch", "export") else ""))
        p.set_defaults(func=runner(handler))
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
    p.description = ("list sessions, newest first. ACTIVE counts the messages the model "
                     "reads: the archived ones in the context, plus one for the generated "
                     "message that carries the pins and the summary, when there are any")
    p.add_argument("--limit", type=positive, default=50, help="sessions per page (default 50)")
    p.add_argument("--all", action="store_true", help="follow the pages to list every session")

    p = add("show", cmd_show, "show a session's archive and its active context")
    p.add_argument("session", help="session id")
    p.add_argument("--limit", type=count, default=20,
                   help="how many of the latest archive messages to list (default 20)")

    p = add("search", cmd_search, "full-text search of the archive: messages with all the "
            "words; when none has them all, those with some of them, marked as such")
    # words need no quotes: `ctxd search zebracorn deploy` is one query of two words
    p.add_argument("query", nargs="+", help="words to find (FTS5 syntax with --advanced)")
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
                   help="compact even when the context is under its threshold, keeping "
                        "only the last few messages (compaction.force_keep_messages)")
    p.add_argument("--instructions",
                   help="what the summary should keep first (said when not applied)")

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
