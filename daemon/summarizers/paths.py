"""Paths in text and tool arguments, and how a call's arguments are shown."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from ctxd.daemon.summarizers.cues import _trim

_URL = re.compile(r"\bhttps?://[^\s<>\"'`()\[\]{}]+", re.IGNORECASE)
_WIN_PATH = re.compile(r"\b[A-Za-z]:\\[^\s\"'<>|*?`]+")
_EXTENSIONS = (
    "py|pyi|ipynb|md|rst|txt|json|jsonl|yaml|yml|toml|ini|cfg|conf|env|lock|js|mjs|cjs|ts|tsx|"
    "jsx|vue|svelte|html|htm|css|scss|less|go|rs|c|h|cc|cpp|hpp|cs|java|kt|kts|swift|rb|php|pl|"
    "sh|bash|zsh|ps1|bat|sql|db|sqlite|sqlite3|csv|tsv|xml|svg|png|jpe?g|gif|pdf|log|proto|"
    "gradle|mk|cmake|tf|hcl|zip|gz|tgz|tar|whl|so|dll|exe|wasm|lua|r|scala|ex|exs|erl|hs|ml|"
    "clj|dart|patch|diff"
)
# ASCII only: Chinese prose runs straight into a path ("修改src/app.py文件") with no
# space, and Unicode \w would swallow the surrounding words into it.
_PATH = re.compile(
    r"(?<![\w@:/.\\-])(?:~|\.{1,2})?/?(?:[\w.@+-]+/)+[\w.@+-]*"
    r"|(?<![\w./-])(?:[\w-]+\.)+(?:" + _EXTENSIONS + r")\b"
    r"|(?<![\w./-])(?:Dockerfile|Makefile|Procfile|Justfile|\.env|\.gitignore|\.dockerignore)\b",
    re.ASCII,
)
_PATH_TRAILING = ".,;:!?)]}'\"`…"
_HAS_EXT = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,9}$")
_PATH_KEYS = frozenset(
    {"path", "paths", "file", "files", "file_path", "filepath", "filename", "file_name",
     "dir", "directory", "cwd", "target_file", "source", "destination", "src", "dst", "url"}
)
# Arguments worth showing for a call, most telling first.
_KEY_ARGS = (
    "path", "file_path", "filepath", "file", "filename", "paths", "command", "cmd", "query",
    "q", "pattern", "url", "uri", "name", "target", "directory", "dir", "cwd", "sql",
)


def _clean_path(raw: str) -> str | None:
    path = raw.rstrip(_PATH_TRAILING)
    if len(path) < 2 or len(path) > 260:
        return None
    if path.startswith(("./", "../", "~/")):
        return path if len(path) > path.index("/") + 1 else None
    segments = [s for s in path.split("/") if s]
    if not segments or all(s.replace(".", "").isdigit() for s in segments):
        return None
    if "/" not in path:
        return path
    if path.startswith("/"):
        # "/health" or "/tmp" alone are more often routes or words than artifacts.
        return path if len(segments) >= 2 or _HAS_EXT.search(path) else None
    if _HAS_EXT.search(segments[-1]):
        return path
    if path.endswith("/") and len(segments) >= 1 and len(segments[0]) >= 2:
        return path
    return None


def _may_hold_path(token: str) -> bool:
    """A whitespace-separated token that could hold a path: it has a separator, a dot
    or "file" (Makefile)."""
    return "/" in token or "." in token or "\\" in token or "file" in token


@lru_cache(maxsize=4096)
def _token_paths(token: str) -> tuple[str, ...]:
    found: dict[str, None] = {}
    if "://" in token:
        for m in _URL.finditer(token):
            found.setdefault(m.group(0).rstrip(_PATH_TRAILING), None)
        token = _URL.sub(" ", token)
    if ":\\" in token:
        for m in _WIN_PATH.finditer(token):
            found.setdefault(m.group(0).rstrip(_PATH_TRAILING), None)
        token = _WIN_PATH.sub(" ", token)
    for m in _PATH.finditer(token):
        path = _clean_path(m.group(0))
        if path:
            found.setdefault(path, None)
    return tuple(found)


def _find_paths(text: str, limit: int) -> list[str]:
    # Tool output (source files, logs, listings) repeats the same tokens over and over,
    # and nearly all of its words hold no path: each distinct token is looked at once
    # (str.split() cuts at the same whitespace as a regex's \s, at half the cost of a
    # regex scan for the candidates), and short ones are remembered across messages.
    if not _may_hold_path(text):
        return []
    found: dict[str, None] = {}
    for token in dict.fromkeys(text.split()):
        # _may_hold_path, spelt out: it runs for every distinct word of every message
        if "/" not in token and "." not in token and "\\" not in token and "file" not in token:
            continue
        paths = _token_paths(token) if len(token) <= 200 else _token_paths.__wrapped__(token)
        for path in paths:
            found.setdefault(path, None)
        if len(found) >= limit:
            break
    return list(found)[:limit]


def _walk_strings(value: Any, key: str = "", depth: int = 0) -> Iterator[tuple[str, str]]:
    # Tool arguments are model output; a pathological nesting must not cost a stack.
    if depth > 16:
        return
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _walk_strings(v, str(k).lower(), depth + 1)
    elif isinstance(value, list):
        for v in value:
            yield from _walk_strings(v, key, depth + 1)


def _parse_args(raw: Any) -> Any:
    if isinstance(raw, dict | list):
        return raw
    if not isinstance(raw, str) or not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return raw


def _format_value(value: Any, limit: int = 60) -> str:
    if isinstance(value, str):
        return json.dumps(_trim(value, limit), ensure_ascii=False)
    if isinstance(value, bool | int | float) or value is None:
        return json.dumps(value)
    return _trim(json.dumps(value, ensure_ascii=False, sort_keys=True), limit)


def _key_args(args: Any) -> str:
    if isinstance(args, str):
        return _format_value(args)
    if not isinstance(args, dict) or not args:
        return ""
    lowered = {str(k).lower(): k for k in args}
    chosen = [lowered[k] for k in _KEY_ARGS if k in lowered][:2]
    if not chosen:
        chosen = [k for k, v in args.items() if not isinstance(v, dict | list)][:2]
    return ", ".join(f"{k}={_format_value(args[k])}" for k in chosen)


