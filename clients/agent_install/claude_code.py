"""Claude Code: hooks in `settings.json` (`.claude/settings.json` of the project, or
`~/.claude/settings.json`; `CLAUDE_CONFIG_DIR` moves the latter), and the MCP server in
`.mcp.json` (project) or `~/.claude.json` (user), as `claude mcp add` writes them.

Entries are recognised by their command (`… hook claude-code`, `… mcp` of a ctxd), so
installing twice adds nothing and uninstalling removes only them. When what is left
after removing them is the content of the backup taken at install, the backup's bytes
are put back: install then uninstall leaves the file as it was, byte for byte.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from ctxd.clients.agent_install.files import (
    Change,
    backup_path,
    ctxd_argv,
    read_text,
    shell_line,
)

# the events ctxd listens to, with the matcher each needs (None: the event has none)
EVENTS: dict[str, str | None] = {
    "SessionStart": None,
    "UserPromptSubmit": None,
    "PostToolUse": "*",
    "Stop": None,
    "PreCompact": None,
    "SessionEnd": None,
}
HOOK_TIMEOUT_SECONDS = 30
# hooks whose work the agent need not wait for: they only bring the transcript in, so
# Claude Code runs them in the background ("async") and goes on at once. SessionStart
# and UserPromptSubmit answer with context and PreCompact must mark the cut before the
# compaction: those the agent waits for.
BACKGROUND = frozenset({"PostToolUse", "Stop", "SessionEnd"})
SERVER_NAME = "ctxd"
_OUR_HOOK = re.compile(r"(^|[/\s'\"])(ctxd|ctxd\.clients\.cli)['\"]?\s.*\bhook claude-code\b")


def config_dir() -> Path:
    return Path(os.environ.get("CLAUDE_CONFIG_DIR") or "~/.claude").expanduser()


def places(scope: str, project: Path) -> tuple[Path, Path, str]:
    """(settings file, MCP file, key of the MCP servers in it)."""
    if scope == "project":
        return project / ".claude" / "settings.json", project / ".mcp.json", "mcpServers"
    base = os.environ.get("CLAUDE_CONFIG_DIR")
    user_state = Path(base) / ".claude.json" if base else Path("~/.claude.json").expanduser()
    return config_dir() / "settings.json", user_state, "mcpServers"


def _load(path: Path, text: str | None) -> dict[str, Any]:
    if text is None or not text.strip():
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); fix or move it first") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return data


def _dump(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def _is_ours(hook: Any) -> bool:
    return (isinstance(hook, dict) and isinstance(hook.get("command"), str)
            and bool(_OUR_HOOK.search(hook["command"])))


def _restore(path: Path, data: dict[str, Any], before: str | None) -> str | None:
    """The text after removing ours: the backup's own bytes when it holds just that;
    None (remove the file) when there was no file before ctxd wrote it."""
    backup = read_text(backup_path(path))
    if backup is not None:
        if not backup.strip() and not data:
            return backup
        try:
            if json.loads(backup) == data:
                return backup
        except ValueError:
            pass
    if not data and backup is None:
        return None
    if data == _load(path, before):
        return before
    return _dump(data)


def settings_change(path: Path, command: str, uninstall: bool) -> Change:
    before = read_text(path)
    data = _load(path, before)
    hooks = data.get("hooks")
    if hooks is not None and not isinstance(hooks, dict):
        raise ValueError(f"{path}: `hooks` is not an object; left alone")
    if uninstall:
        if not isinstance(hooks, dict):
            return Change(path, before, before)
        for event in list(hooks):
            groups = hooks[event]
            if not isinstance(groups, list):
                continue
            kept = []
            for g in groups:
                if isinstance(g, dict) and isinstance(g.get("hooks"), list):
                    inner = [h for h in g["hooks"] if not _is_ours(h)]
                    if not inner and g["hooks"]:
                        continue
                    g = {**g, "hooks": inner}
                kept.append(g)
            if kept:
                hooks[event] = kept
            else:
                del hooks[event]
        if not hooks:
            del data["hooks"]
        return Change(path, before, _restore(path, data, before))
    hooks = data.setdefault("hooks", {})
    for event, matcher in EVENTS.items():
        groups = hooks.setdefault(event, [])
        if not isinstance(groups, list):
            raise ValueError(f"{path}: hooks.{event} is not a list; left alone")
        if any(_is_ours(h) for g in groups if isinstance(g, dict)
               for h in g.get("hooks") or ()):
            continue
        entry: dict[str, Any] = {}
        if matcher is not None:
            entry["matcher"] = matcher
        hook: dict[str, Any] = {"type": "command", "command": command,
                                "timeout": HOOK_TIMEOUT_SECONDS}
        if event in BACKGROUND:
            hook["async"] = True
        entry["hooks"] = [hook]
        groups.append(entry)
    after = _dump(data)
    return Change(path, before, after if data != _load(path, before) else before)


def mcp_change(path: Path, key: str, server: dict[str, Any], uninstall: bool) -> Change:
    before = read_text(path)
    data = _load(path, before)
    servers = data.get(key)
    if servers is not None and not isinstance(servers, dict):
        raise ValueError(f"{path}: `{key}` is not an object; left alone")
    change = Change(path, before, before)
    ours = isinstance(servers, dict) and _is_our_server(servers.get(SERVER_NAME))
    if uninstall:
        if ours:
            del servers[SERVER_NAME]
            if not servers:
                del data[key]
            change.after = _restore(path, data, before)
        return change
    if isinstance(servers, dict) and SERVER_NAME in servers:
        if not ours:
            change.notes.append(f"{path}: an MCP server named {SERVER_NAME!r} is there "
                                "already and is not ctxd's; left as it is")
        return change
    data.setdefault(key, {})[SERVER_NAME] = server
    change.after = _dump(data)
    return change


def _is_our_server(entry: Any) -> bool:
    if not isinstance(entry, dict):
        return False
    argv = [str(entry.get("command", "")), *[str(a) for a in entry.get("args") or ()]]
    line = " ".join(argv)
    return "mcp" in argv and ("ctxd" in Path(argv[0]).name or "ctxd.clients.cli" in line)


def plan(scope: str, project: Path, extra: list[str], uninstall: bool) -> list[Change]:
    settings, mcp_file, key = places(scope, project)
    hook = shell_line(ctxd_argv(["hook", "claude-code", *extra]))
    argv = ctxd_argv(["mcp", *extra])
    server = {"type": "stdio", "command": argv[0], "args": argv[1:]}
    return [settings_change(settings, hook, uninstall),
            mcp_change(mcp_file, key, server, uninstall)]
