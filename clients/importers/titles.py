"""A session's title from the first thing its person asked, not from the markup agent
front ends put into user messages (slash commands and their output, the environment of
the run, IDE context, AGENTS.md preambles, caveats, continuation preambles): the
summarizer's boilerplate detector tells the one from the other."""

from __future__ import annotations

import re

from ctxd.daemon.summarizers.boilerplate import clean

TITLE_CHARS = 200


def request_title(text: str) -> str | None:
    """The first line of what a person wrote in a user message, or None when the message
    is boilerplate only."""
    if not text or not text.strip() or _COMMAND.search(text):
        # a slash command's arguments are titled with their command (command_title)
        return None
    prose = clean(text).prose
    for line in prose.splitlines():
        words = " ".join(line.split())
        if words:
            return words[:TITLE_CHARS]
    return None


_COMMAND = re.compile(r"<command-name>\s*([^<]*?)\s*</command-name>", re.IGNORECASE)
_ARGS = re.compile(r"<command-args>\s*([^<]*?)\s*</command-args>", re.IGNORECASE)


def command_title(text: str) -> str | None:
    """A slash command and its arguments (`/orchestrator update CLAUDE.md`): the title of
    a session whose person typed nothing else."""
    m = _COMMAND.search(text or "")
    if not m or not m.group(1):
        return None
    args = _ARGS.search(text)
    words = " ".join(f"{m.group(1)} {args.group(1) if args else ''}".split())
    return words[:TITLE_CHARS] or None


class TitleFinder:
    """The best title seen so far for each of a file's sessions (by target): the first
    request a person wrote, else the first slash command with its arguments."""

    def __init__(self) -> None:
        self.requests: dict[str | None, str] = {}
        self.commands: dict[str | None, str] = {}

    def see(self, text: str, target: str | None = None) -> None:
        if target in self.requests:
            return
        title = request_title(text)
        if title:
            self.requests[target] = title
        elif target not in self.commands:
            command = command_title(text)
            if command:
                self.commands[target] = command

    def title(self, target: str | None = None) -> str | None:
        return self.requests.get(target) or self.commands.get(target)
