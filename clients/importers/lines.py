"""Reading transcript lines: bounded in length, parsed without crashing on hostile JSON,
an unfinished last line left for later, and the hash that tells one file from another
at the same path."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# A line longer than this is skipped: no real transcript line comes near, and reading one
# whole takes several times its size in memory.
MAX_LINE_BYTES = 64 * 1024 * 1024
# how much of a file's first line its head hash covers
_HEAD_BYTES = 64 * 1024
# over-long lines are skipped reading this much at a time
_SKIP_CHUNK = 1024 * 1024

_LONE_SURROGATE_HINT = re.compile(rb"\\u[dD][89a-fA-F]")


class BadLine(ValueError):
    """A transcript line that is valid JSON for no purpose of ours (nested past any real
    transcript's depth): skipped like a corrupt one."""


def parse_line(raw: bytes) -> Any:
    """One transcript line as JSON. Nesting past the parser's recursion limit is a
    `BadLine`, not a crash; a lone surrogate escape (`"\\ud800"`, valid JSON that no
    UTF-8 text can hold) becomes U+FFFD, so the message can still be stored and sent."""
    try:
        obj = json.loads(raw)
    except RecursionError:
        raise BadLine("nested too deeply") from None
    if _LONE_SURROGATE_HINT.search(raw):
        obj = _without_lone_surrogates(obj)
    return obj


def _without_lone_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        # json.loads joins a valid pair into one character: what is left is lone
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, list):
        return [_without_lone_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {_without_lone_surrogates(k): _without_lone_surrogates(v)
                for k, v in value.items()}
    return value


def file_head(path: Path) -> tuple[str, bool] | None:
    """A hash of the file's first line (its first 64 KiB at most, without the newline) and
    whether that line is complete; None for an empty or unreadable file."""
    try:
        with open(path, "rb") as f:
            first = f.readline(_HEAD_BYTES)
    except OSError:
        return None
    if not first:
        return None
    complete = first.endswith(b"\n") or len(first) >= _HEAD_BYTES
    return hashlib.sha1(first.rstrip(b"\r\n")).hexdigest(), complete


@dataclass
class Unfinished:
    """An unterminated last line: where it starts and the file's size when it was parsed.
    `seen` is that pair from an earlier look (None: not looked at); `parsed` is set when
    this read parsed it again and found it unfinished."""

    seen: tuple[int, int] | None = None
    found: tuple[int, int] | None = None
    parsed: bool = False


def iter_lines(path: Path, start: int, max_line: int = MAX_LINE_BYTES,
               tail: Unfinished | None = None) -> Iterator[tuple[int, bytes | None]]:
    """(end offset, line) of each complete line from `start`; the line is None when it is
    longer than `max_line` bytes (read in chunks to its newline, never held whole). A last
    line without its newline is returned only when it parses: a writer may be in the
    middle of it. It is parsed again only when the file's size changed since `tail.seen`."""
    tail = tail or Unfinished()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(start)
        pos = start
        while True:
            if tail.seen == (pos, size):
                # the unfinished line found here before, and the file is the same size
                tail.found = tail.seen
                return
            raw = f.readline(max_line + 1)
            if not raw:
                return
            if not raw.endswith(b"\n") and len(raw) > max_line:
                n = len(raw)
                while not raw.endswith(b"\n"):
                    raw = f.readline(_SKIP_CHUNK)
                    if not raw:  # no end yet: wait for it
                        tail.found = (pos, size)
                        return
                    n += len(raw)
                pos += n
                yield pos, None
                continue
            if not raw.endswith(b"\n"):
                tail.found = (pos, size)
                try:
                    parse_line(raw)
                except ValueError:
                    tail.parsed = True
                    return
                tail.found = None
            pos += len(raw)
            yield pos, raw
