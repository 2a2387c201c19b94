"""Codex: `notify` (the program Codex runs after each turn, with the turn as a JSON
argument) and `[mcp_servers.ctxd]` in `config.toml` (`$CODEX_HOME/config.toml`, by
default `~/.codex/config.toml`; `.codex/config.toml` of a project for project scope).

The file is edited as text, so the user's comments and layout stay: each addition is a
block between two marker comments (`notify` first in the file, where a top-level key
must be; the server table last), and `--uninstall` cuts exactly those blocks out again.
A `notify` or a `ctxd` server the user has already is left alone, and said so.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path

from ctxd.clients.agent_install.claude_code import EVENTS, HOOK_TIMEOUT_SECONDS
from ctxd.clients.agent_install.files import Change, ctxd_argv, read_text, shell_line

_BEGIN = "# >>> ctxd (written by `ctxd install codex`; `ctxd install codex --uninstall` removes it)"
_BEGIN_NL = "# >>> ctxd+newline (written by `ctxd install codex`; `--uninstall` removes it)"
_END = "# <<< ctxd"
_BLOCK = re.compile(r"(\n)?^# >>> ctxd(\+newline)? \(.*?\n.*?^# <<< ctxd\n", re.M | re.S)


def codex_home() -> Path:
    return Path(os.environ.get("CODEX_HOME") or "~/.codex").expanduser()


def config_path(scope: str, project: Path) -> Path:
    if scope == "project":
        return project / ".codex" / "config.toml"
    return codex_home() / "config.toml"


def _toml_array(argv: list[str]) -> str:
    # JSON strings are TOML basic strings (same escapes)
    return "[" + ", ".join(json.dumps(a) for a in argv) + "]"


def _parse(path: Path, text: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path} is not valid TOML ({exc}); fix it first") from None


def _strip_ours(text: str) -> str:
    # each block takes back the line break it added before itself (a blank line, or the
    # newline the file's last line lacked)
    return _BLOCK.sub("", text)


def config_change(path: Path, extra: list[str], uninstall: bool,
                  scope: str = "user") -> Change:
    before = read_text(path)
    text = before or ""
    _parse(path, text)
    change = Change(path, before, before)
    if uninstall:
        after = _strip_ours(text)
        if after != text:
            _parse(path, after)
            change.after = None if not after and _created_by_us(path) else after
        return change
    if _BLOCK.search(text):
        return change  # installed already
    data = _parse(path, text)
    head = ""
    if scope == "project":
        change.notes.append(f"{path}: Codex reads `notify` from the user's config only; "
                            "the hooks capture this project's sessions")
    elif "notify" in data:
        change.notes.append(f"{path}: `notify` is set already ({data['notify']!r}); left "
                            "as it is, so turns are not captured live. Put `ctxd hook "
                            "codex` in your notify program to capture them.")
    else:
        notify = ctxd_argv(["hook", "codex", *extra])
        head = f"{_BEGIN}\nnotify = {_toml_array(notify)}\n{_END}\n"
    body = ""
    servers = data.get("mcp_servers")
    if isinstance(servers, dict) and "ctxd" in servers:
        change.notes.append(f"{path}: [mcp_servers.ctxd] is there already; left as it is")
    else:
        mcp = ctxd_argv(["mcp", *extra])
        body = (f"[mcp_servers.ctxd]\ncommand = {json.dumps(mcp[0])}\n"
                f"args = {_toml_array(mcp[1:])}\n")
    body += _hook_tables(shell_line(ctxd_argv(["hook", "codex", *extra]))) + f"{_END}\n"
    if text and not text.endswith("\n"):
        tail = f"\n{_BEGIN_NL}\n{body}"
    else:
        tail = f"\n{_BEGIN}\n{body}" if text else f"{_BEGIN}\n{body}"
    after = head + text + tail
    _parse(path, after)  # a config whose own tables clash with ours is refused, unchanged
    change.after = after
    return change


def _created_by_us(path: Path) -> bool:
    from ctxd.clients.agent_install.files import backup_path

    return not backup_path(path).exists()


def plan(scope: str, project: Path, extra: list[str], uninstall: bool) -> list[Change]:
    return [config_change(config_path(scope, project), extra, uninstall, scope)]


def _hook_tables(command: str) -> str:
    """Codex's hooks (the same events and input as Claude Code's); Codex runs a hook
    only once the user trusted it (`/hooks` in Codex), and says so at its start."""
    out = []
    for event, matcher in EVENTS.items():
        out.append(f"[[hooks.{event}]]\n")
        if matcher is not None:
            out.append(f"matcher = {json.dumps(matcher)}\n")
        # Codex allows a SessionEnd hook 3 s at most (and warns at every start if asked
        # for more); what it leaves unimported, the next hook or import brings in
        timeout = 3 if event == "SessionEnd" else HOOK_TIMEOUT_SECONDS
        out.append(f"[[hooks.{event}.hooks]]\ntype = \"command\"\n"
                   f"command = {json.dumps(command)}\ntimeout = {timeout}\n")
    return "".join(out)
