"""Shared by the import tests on real transcripts: the public transcripts under
bench/data/transcripts (see SOURCES.md), copied under other names, and reading back what
a real daemon stored."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from helpers import DaemonProcess

from ctxd.clients.client import Client

REAL = Path(__file__).resolve().parent.parent / "bench" / "data" / "transcripts"
CC = REAL / "claude-code"
CODEX = REAL / "codex"


def run_import(d: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ctxd.clients.cli", "import", *args,
         "--connection-file", str(d.connection_file)],
        env=d.env, capture_output=True, text=True, timeout=300, encoding="utf-8")


def import_json(d: DaemonProcess, *args: str) -> dict[str, Any]:
    r = run_import(d, *args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def archive(c: Client, sid: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    after = 0
    while True:
        page = c.read(sid, after_id=after, limit=5000)
        out += page["messages"]
        if page["nextAfterId"] is None:
            return out
        after = page["nextAfterId"]


def records(path: Path) -> list[dict[str, Any]]:
    """The file's lines as JSON, by line number (1-based: index 0 is line 1)."""
    return [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines()]


def unix(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def last_time(path: Path) -> float:
    return max(unix(r["timestamp"]) for r in records(path) if isinstance(r.get("timestamp"), str))


def copy_at_rest(src: Path, dst: Path) -> Path:
    """A copy whose modification time is the transcript's last record, as the agent left
    it (a plain copy would look like a transcript being written now)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    t = last_time(src)
    os.utime(dst, (t, t))
    return dst


def sessions_by_path(c: Client) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    cursor = None
    while True:
        page = c.list_sessions(limit=200, cursor=cursor)
        for s in page["sessions"]:
            path = (s.get("metadata") or {}).get("sourcePath")
            if path and not (s.get("metadata") or {}).get("sidechain"):
                out[path] = s
        cursor = page["nextCursor"]
        if cursor is None:
            return out


def shape(msgs: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What two imports of one transcript must agree on."""
    return [(m["role"], m.get("content"), json.dumps(m.get("tool_calls")),
             m.get("tool_call_id"), m["createdAt"]) for m in msgs]
