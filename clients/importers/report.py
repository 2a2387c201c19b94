"""What an import did, for its summary and (under `--verbose`) its details."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxd.clients.importers.values import Skip


@dataclass
class Report:
    files: int = 0
    sessions_created: int = 0
    messages: int = 0
    batches: int = 0
    lines: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    unmappable: Counter[str] = field(default_factory=Counter)
    repaired: Counter[str] = field(default_factory=Counter)
    deferred: int = 0
    failed: int = 0  # files the daemon refused an append of
    unfinished: int = 0  # unterminated last lines parsed and found not yet complete
    notes: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    verbose: bool = False
    # the sessions messages went to
    sessions: set[str] = field(default_factory=set)
    # transcripts of the format asked for, and files looked at to find them
    found: int = 0
    looked_at: int = 0
    # the other agent's transcripts met on the way (`ctxd import <the other>` takes them)
    other_format: int = 0

    def skip(self, path: Path, line: int, exc: Skip) -> None:
        (self.unmappable if exc.unmappable else self.skipped)[exc.kind] += 1
        if self.verbose:
            if len(self.details) < 10_000:  # bounded, even for a hostile file
                note = f": {exc.note}" if exc.note else ""
                self.details.append(f"{path}:{line}: {exc.kind}{note}")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "files": self.files,
            "lines": self.lines,
            "sessionsCreated": self.sessions_created,
            "messages": self.messages,
            "batches": self.batches,
            "skipped": dict(self.skipped),
            "unmappable": dict(self.unmappable),
            "repaired": dict(self.repaired),
            "deferred": self.deferred,
            "failed": self.failed,
            "unfinished": self.unfinished,
            "notes": self.notes,
            "sessions": len(self.sessions),
            "found": self.found,
            "lookedAt": self.looked_at,
            "otherFormat": self.other_format,
        }
        if self.verbose:
            out["details"] = self.details
        return out
