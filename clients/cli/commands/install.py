"""`ctxd install claude-code|codex [--scope project|user] [--dry-run] [--uninstall]`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def cmd_install(args: argparse.Namespace) -> int:
    from ctxd.clients.agent_install import claude_code, codex
    from ctxd.clients.agent_install.files import apply

    extra: list[str] = []
    # the daemon the agent's hooks and MCP server reach: the one this command was told of
    for name, flag in (("data_dir", "--data-dir"), ("connection_file", "--connection-file"),
                       ("config", "--config")):
        value = getattr(args, name, None)
        if value is not None:
            extra += [flag, str(Path(value).expanduser().resolve())]
    project = Path(args.project).expanduser().resolve()
    planner = claude_code.plan if args.agent == "claude-code" else codex.plan
    try:
        changes = planner(args.scope, project, extra, args.uninstall)
    except ValueError as exc:
        print(f"ctxd install: {exc}", file=sys.stderr)
        return 2
    for change in changes:
        for note in change.notes:
            print(f"note: {note}")
        if not change.changed:
            print(f"{change.path}: unchanged")
            continue
        if args.dry_run:
            sys.stdout.write(change.diff())
            continue
        try:
            apply(change)
        except OSError as exc:
            print(f"ctxd install: cannot write {change.path}: {exc}", file=sys.stderr)
            return 1
        verb = "removed" if change.after is None else "updated"
        backup = " (backup: " + change.path.name + ".ctxd-backup)" if change.before else ""
        print(f"{change.path}: {verb}{backup}")
    return 0


def register(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("install", help="set up Claude Code or Codex to send their sessions "
                       "to ctxd as they happen and to use its MCP server")
    agents = p.add_subparsers(dest="agent", required=True)
    for name, what in (("claude-code", "hooks in settings.json and the MCP server in "
                        ".mcp.json (project) or ~/.claude.json (user)"),
                       ("codex", "notify and [mcp_servers.ctxd] in config.toml")):
        f = agents.add_parser(name, help=what)
        common(f)
        f.add_argument("--scope", choices=["project", "user"], default="user",
                       help="this project's config or the user's (default: user)")
        f.add_argument("--project", default=".", metavar="DIR",
                       help="the project folder for --scope project (default: here)")
        f.add_argument("--dry-run", action="store_true", help="print the change, write nothing")
        f.add_argument("--uninstall", action="store_true",
                       help="remove what install added, and only that")
        f.set_defaults(func=cmd_install)
