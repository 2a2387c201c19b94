"""What both installers share: the command line the agent runs, a backup beside each file
changed, writes that replace a file whole, and a diff for `--dry-run`."""

from __future__ import annotations

import difflib
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ctxd.protocol.files import replace_file

BACKUP_SUFFIX = ".ctxd-backup"


def ctxd_argv(extra: list[str]) -> list[str]:
    """How the agent starts ctxd: the absolute path of the `ctxd` being run (the agent's
    PATH may not have it, or another one), else this very Python with the CLI module
    (`python -m ctxd.clients.cli install …`)."""
    exe = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if exe is not None and exe.name == "ctxd" and exe.is_file():
        return [str(exe.absolute()), *extra]
    return [sys.executable, "-m", "ctxd.clients.cli", *extra]


def shell_line(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


@dataclass
class Change:
    path: Path
    before: str | None  # None: the file did not exist
    after: str | None  # None: the file is removed
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.before != self.after

    def diff(self) -> str:
        a = (self.before or "").splitlines(keepends=True)
        b = (self.after or "").splitlines(keepends=True)
        return "".join(difflib.unified_diff(
            a, b, f"{self.path} (now)" if self.before is not None else "/dev/null",
            f"{self.path} (after)" if self.after is not None else "/dev/null"))


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def backup_path(path: Path) -> Path:
    return path.with_name(path.name + BACKUP_SUFFIX)


def apply(change: Change) -> None:
    """Write the change, after copying what was there to the backup (same mode)."""
    if not change.changed:
        return
    path = change.path
    if change.before is not None:
        _write(backup_path(path), change.before, path)
    else:
        # no file before: a backup left from an earlier install names another state
        backup_path(path).unlink(missing_ok=True)
    if change.after is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    _write(path, change.after, path)


def _write(target: Path, text: str, like: Path) -> None:
    try:
        mode = like.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o600 if like.name.startswith(".") or like.suffix == ".toml" else 0o644
    replace_file(target, text, mode, durable=True)
