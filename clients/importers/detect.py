"""Which agent wrote a transcript, told from its content rather than its name.

Codex names its rollouts `rollout-<time>-<id>.jsonl` and Claude Code names transcripts
after their session, but copies, exports and published logs are named anything: a file
is taken for what its first records say it is.

- Codex: a first line `{timestamp, type: "session_meta", payload}` (or another of its
  wrapped record types), or the older unwrapped header `{id, timestamp, instructions}`
  followed by bare response items and `{"record_type": …}` lines.
- Claude Code: lines whose `type` is one of its record types (`user`, `assistant`,
  `summary`, `system`, `file-history-snapshot`, …) and that carry its bookkeeping keys
  (`sessionId`, `uuid`, `leafUuid`, `messageId`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ctxd.clients.importers.lines import parse_line

CLAUDE_CODE = "claude-code"
CODEX = "codex"

# a file is judged on its first few records; bookkeeping lines may come before the
# first one that names its writer
_LINES = 8
# a first line longer than this is judged on its start (see _PREFIX_HINTS)
_LINE_BYTES = 1 << 20

_CODEX_TYPES = {"session_meta", "response_item", "turn_context", "event_msg", "compacted"}
_CODEX_ITEMS = {"message", "function_call", "function_call_output", "reasoning",
                "local_shell_call", "custom_tool_call", "custom_tool_call_output",
                "web_search_call"}
_CLAUDE_TYPES = {"user", "assistant", "summary", "system", "file-history-snapshot",
                 "queue-operation", "progress", "attachment", "last-prompt",
                 "permission-mode", "ai-title", "mode", "custom-title"}
_CLAUDE_KEYS = ("sessionId", "uuid", "leafUuid", "messageId")
# a line too long to parse whole: what its start shows
_PREFIX_HINTS = (
    (re.compile(rb'^\{"timestamp":"[^"]*","type":"(?:session_meta|response_item)"'), CODEX),
    (re.compile(rb'"type":"(?:user|assistant)".{0,4000}"sessionId":"', re.DOTALL),
     CLAUDE_CODE),
    (re.compile(rb'"sessionId":"[^"]*".{0,4000}"type":"(?:user|assistant)"', re.DOTALL),
     CLAUDE_CODE),
)


def kind_of_record(obj: object, line: int) -> str | None:
    """The writer one parsed record points to, or None when it does not tell."""
    if not isinstance(obj, dict):
        return None
    kind = obj.get("type")
    if kind in _CODEX_TYPES and "payload" in obj:
        return CODEX
    if "record_type" in obj:
        return CODEX
    if kind is None and line == 1 and isinstance(obj.get("id"), str) and "timestamp" in obj:
        return CODEX  # an older rollout's header
    if kind in _CODEX_ITEMS and "payload" not in obj and "sessionId" not in obj and (
            "role" in obj or "call_id" in obj or "summary" in obj):
        return CODEX  # an older rollout's bare response item
    if kind in _CLAUDE_TYPES and any(k in obj for k in _CLAUDE_KEYS):
        return CLAUDE_CODE
    return None


def sniff(path: Path) -> str | None:
    """`CLAUDE_CODE`, `CODEX`, or None: not a transcript of either (or not yet readable:
    an empty file, or one whose first record is still being written)."""
    try:
        with open(path, "rb") as f:
            for line in range(1, _LINES + 1):
                raw = f.readline(_LINE_BYTES)
                if not raw:
                    return None
                if not raw.lstrip()[:1] == b"{":
                    if raw.strip() and line == 1:
                        return None  # not JSON lines
                    continue
                if not raw.endswith(b"\n") and len(raw) >= _LINE_BYTES:
                    for pattern, kind in _PREFIX_HINTS:
                        if pattern.search(raw):
                            return kind
                    # the rest of a line too long to judge: on to the next one
                    while raw and not raw.endswith(b"\n"):
                        raw = f.readline(_LINE_BYTES)
                    continue
                try:
                    obj = parse_line(raw)
                except ValueError:
                    continue  # a corrupt line: the importer reports it, the next one tells
                found = kind_of_record(obj, line)
                if found:
                    return found
    except OSError:
        return None
    return None


@dataclass
class Survey:
    """What a search for transcripts looked at: for saying why nothing was found."""

    looked_at: int = 0
    # files found to be the other agent's transcripts
    other: list[Path] = field(default_factory=list)
    # files named on the command line that are the other agent's transcripts
    refused: list[tuple[Path, str]] = field(default_factory=list)


class Finder:
    """Finds one agent's transcripts below paths, by content. Keeps what it learnt of each
    file (by path, inode and size) so a `--follow` round does not read every file again."""

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt
        self._known: dict[Path, tuple[int, int, str | None]] = {}
        # named files already reported as the other agent's
        self.refused: set[Path] = set()

    def kind(self, path: Path) -> str | None:
        try:
            st = path.stat()
        except OSError:
            return None
        known = self._known.get(path)
        if known is not None and known[0] == st.st_ino and (
                known[2] is not None or known[1] == st.st_size):
            return known[2]  # a writer's kind does not change as the file grows
        found = sniff(path)
        self._known[path] = (st.st_ino, st.st_size, found)
        return found

    def find(self, paths: list[Path], survey: Survey | None = None) -> list[Path]:
        """This format's transcripts: the `*.jsonl` files below folders whatever their
        names, and the files named, oldest first."""
        survey = survey if survey is not None else Survey()
        found: list[Path] = []
        for p in paths:
            if p.is_dir():
                for f in p.rglob("*.jsonl"):
                    if not f.is_file():
                        continue
                    survey.looked_at += 1
                    kind = self.kind(f)
                    if kind == self.fmt:
                        found.append(f)
                    elif kind is not None:
                        survey.other.append(f)
            elif p.is_file():
                survey.looked_at += 1
                kind = self.kind(p)
                # a file named on the command line is taken for the format asked for
                # unless it is plainly the other agent's (its records may all be corrupt)
                if kind is None or kind == self.fmt:
                    found.append(p)
                else:
                    survey.refused.append((p, kind))
        uniq = {os.path.realpath(f): f for f in found}

        def mtime(f: Path) -> float:
            try:
                return f.stat().st_mtime
            except OSError:
                return 0.0

        return sorted(uniq.values(), key=lambda f: (mtime(f), str(f)))
