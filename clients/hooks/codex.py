"""Codex's side: its `notify` program gets one JSON argument after each turn
(`{"type": "agent-turn-complete", "thread-id", "turn-id", "cwd", "input-messages",
"last-assistant-message"}`) but no transcript path, so the rollout is found by its
thread id under `$CODEX_HOME/sessions/YYYY/MM/DD/rollout-<time>-<thread id>.jsonl`.
Codex's hooks, where the installed version has them, send Claude Code's fields on stdin
(`hook_event_name`, `session_id`, `transcript_path`, `cwd`) and are read the same way."""

from __future__ import annotations

import datetime as dt
import os
import re
from pathlib import Path
from typing import Any

from ctxd.clients.hooks.capture import HookEvent

_THREAD_ID = re.compile(r"^[0-9A-Za-z-]{8,80}$")
# folders of the last days searched first; the whole tree only when they miss
_RECENT_DAYS = 3


def codex_home() -> Path:
    return Path(os.environ.get("CODEX_HOME") or "~/.codex").expanduser()


def find_rollout(thread_id: str, home: Path | None = None) -> Path | None:
    if not _THREAD_ID.match(thread_id):
        return None
    root = (home or codex_home()) / "sessions"
    today = dt.datetime.now()
    for back in range(_RECENT_DAYS):
        day = today - dt.timedelta(days=back)
        folder = root / f"{day:%Y}" / f"{day:%m}" / f"{day:%d}"
        hits = sorted(folder.glob(f"*{thread_id}.jsonl")) if folder.is_dir() else []
        if hits:
            return hits[-1]
    hits = sorted(root.rglob(f"*{thread_id}.jsonl")) if root.is_dir() else []
    return hits[-1] if hits else None


def notify_event(data: dict[str, Any]) -> HookEvent:
    kind = data.get("type")
    if not isinstance(kind, str) or not kind:
        raise ValueError("notify payload has no type")
    thread = data.get("thread-id")
    thread = thread if isinstance(thread, str) and thread else None
    rollout = find_rollout(thread) if thread else None
    cwd = data.get("cwd")
    return HookEvent(agent="codex", event=kind,
                     transcript=str(rollout) if rollout else None,
                     agent_session=thread, cwd=cwd if isinstance(cwd, str) else None)
