"""`ctxd hook claude-code|codex`: what the agents run from their hooks (docs/agents.md).

Whatever happens, the command exits 0 for a well-formed event: a hook that fails would
show the user an error for every turn, and ctxd must never stand in the agent's way.
Malformed input exits 1 (a non-blocking error for Claude Code, never 2, which blocks).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ctxd.protocol.connection import default_data_dir


def cmd_hook(args: argparse.Namespace, connection_file: Callable[[argparse.Namespace], Path]
             ) -> int:
    from ctxd.clients.hooks.run import Places, claude_event, handle, read_stdin_event

    places = Places(data_dir=Path(args.data_dir or default_data_dir()),
                    connection_file=connection_file(args))
    try:
        if args.agent == "codex" and args.payload is not None:
            from ctxd.clients.hooks import codex as codex_side

            data = json.loads(args.payload)
            if not isinstance(data, dict):
                raise ValueError("the notify payload is not a JSON object")
            event = codex_side.notify_event(data)
        else:
            event = claude_event(args.agent, read_stdin_event(sys.stdin))
    except ValueError as exc:
        print(f"ctxd hook: unusable input: {exc}", file=sys.stderr)
        return 1
    try:
        out = handle(event, places)
    except Exception as exc:  # noqa: BLE001 - a hook never breaks the agent's turn
        print(f"ctxd hook: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 0
    if out is not None:
        print(json.dumps(out, ensure_ascii=False))
    return 0


def main(argv: list[str], connection_file: Callable[[argparse.Namespace], Path]) -> int:
    """`ctxd hook …` without building the whole `ctxd` parser (and importing every
    command): the same options as registered below."""
    parser = argparse.ArgumentParser(prog="ctxd")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub, _common_options, connection_file)
    args = parser.parse_args(["hook", *argv])
    for name in ("data_dir", "connection_file", "config"):
        if not hasattr(args, name):
            setattr(args, name, None)
    return int(args.func(args) or 0)


def _common_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument("--connection-file", type=Path, default=None)
    p.add_argument("--config", type=Path, default=None)


def register(sub: Any, common: Callable[[argparse.ArgumentParser], None],
             connection_file: Callable[[argparse.Namespace], Path]) -> None:
    p = sub.add_parser("hook", help="what Claude Code's hooks and Codex's notify run: bring "
                       "the agent's transcript into ctxd as it is written (set up with "
                       "`ctxd install`)")
    agents = p.add_subparsers(dest="agent", required=True)
    f = agents.add_parser("claude-code", help="a Claude Code hook: the event's JSON on stdin")
    common(f)
    f.set_defaults(func=lambda a: cmd_hook(a, connection_file), payload=None)
    f = agents.add_parser("codex", help="Codex's notify program (the JSON as argument) or "
                          "a Codex hook (the JSON on stdin)")
    common(f)
    f.add_argument("payload", nargs="?", metavar="JSON",
                   help="the notify payload Codex passes (none: a hook's JSON on stdin)")
    f.set_defaults(func=lambda a: cmd_hook(a, connection_file))
