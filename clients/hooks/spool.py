"""The hooks' private queue on disk: what a hook could not hand to the daemon.

A hook must never fail or slow the agent's turn, so when no daemon answers it writes the
event here and returns; the next hook call that reaches the daemon replays the queue
first. Entries are small JSON files (the transcript path, the event, a compaction's
trigger), never transcript text: the transcript itself is read again at replay, and the
import is idempotent, so replaying an entry twice stores nothing twice.

The folder is 0700 and every file 0600, created with O_EXCL: the queue names the
transcripts of the user's agents and nobody else may read or plant entries.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

# a queue bounded in entries and bytes: a daemon down for weeks costs a few MiB at most
MAX_ENTRIES = 10_000
MAX_ENTRY_BYTES = 64 * 1024


class UnsafeSpool(Exception):
    """The queue folder is not private to this user."""


def spool_dir(data_dir: Path) -> Path:
    return data_dir / "hook-queue"


def _ensure_private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise UnsafeSpool(f"{path} is not a folder of this user")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)


def enqueue(folder: Path, entry: dict[str, Any]) -> Path | None:
    """Write one entry; None when the queue is full (the oldest are kept: the transcript
    holds everything anyway, and the next import of it catches up)."""
    _ensure_private_dir(folder)
    body = json.dumps(entry, ensure_ascii=False).encode()
    if len(body) > MAX_ENTRY_BYTES:
        raise ValueError(f"a queue entry of {len(body)} bytes is over {MAX_ENTRY_BYTES}")
    try:
        count = sum(1 for _ in os.scandir(folder))
    except OSError:
        count = 0
    if count >= MAX_ENTRIES:
        return None
    name = f"{time.time_ns():020d}-{os.getpid()}.json"
    path = folder / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, body)
    finally:
        os.close(fd)
    return path


def pending(folder: Path) -> list[tuple[Path, dict[str, Any] | None]]:
    """The queued entries, oldest first; an unreadable entry comes as (path, None)."""
    if not folder.is_dir():
        return []
    _ensure_private_dir(folder)
    out: list[tuple[Path, dict[str, Any] | None]] = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".json"):
            continue
        path = folder / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if st.st_uid != os.getuid() or st.st_size > MAX_ENTRY_BYTES:
                    out.append((path, None))
                    continue
                data = json.loads(f.read())
        except (OSError, ValueError):
            out.append((path, None))
            continue
        out.append((path, data if isinstance(data, dict) else None))
    return out


def done(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
