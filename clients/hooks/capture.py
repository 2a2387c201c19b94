"""What a hook call does once it has an event: bring the agent's transcript into ctxd
(through the transcript importers, incrementally and idempotently), mark where the
agent compacted its own context, and say what ctxd gives the agent back (its pins and
how to search the archive).

The archive itself records where each import stopped (see importers/common.py), so a
hook call reads only the lines written since the last one, and a call repeated (or a
queued event replayed) stores nothing twice.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ctxd.clients.importers import FORMATS
from ctxd.clients.importers.common import FileImporter, Options, Report, safe_id
from ctxd.protocol.errors import CtxdError
from ctxd.protocol.files import replace_file

# The text a pin adds to the note is bounded: the note goes into every fresh context.
MAX_NOTE_CHARS = 8_000
MCP_SERVER_NAME = "ctxd"
SEARCH_TOOL = "search_past_messages"


@dataclass
class HookEvent:
    """One hook call, whichever agent made it."""

    agent: str  # "claude-code" or "codex": also the importer's format name
    event: str  # the agent's own event name (SessionStart, agent-turn-complete, ...)
    transcript: str | None = None
    agent_session: str | None = None
    cwd: str | None = None
    source: str | None = None  # SessionStart: startup, resume, clear, compact
    trigger: str | None = None  # PreCompact: manual or auto
    custom_instructions: str | None = None  # PreCompact: what /compact was given

    def to_entry(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_entry(cls, entry: dict[str, Any]) -> HookEvent:
        known = {k: entry[k] for k in cls.__dataclass_fields__ if isinstance(entry.get(k), str)}
        if "agent" not in known or "event" not in known:
            raise ValueError("a queue entry without agent or event")
        if known["agent"] not in FORMATS:
            raise ValueError(f"a queue entry for an unknown agent {known['agent']!r}")
        return cls(**known)


def session_id_for(event: HookEvent) -> str:
    """The ctxd session an agent session is imported into, before any import ran: the
    importers name a session by its transcript's file name (Claude Code: the session id)."""
    if event.transcript:
        stem = Path(event.transcript).stem
        if event.agent == "codex":
            stem = stem.removeprefix("rollout-")
        if Path(event.transcript).parent.name == "subagents":
            stem = f"{Path(event.transcript).parent.parent.name}-{stem}"
        return safe_id(event.agent, stem)
    return safe_id(event.agent, event.agent_session or "unknown")


def import_transcript(client: Any, event: HookEvent) -> tuple[str, Report]:
    """Import what the transcript holds beyond the last import; the ctxd session id."""
    report = Report()
    path = Path(event.transcript) if event.transcript else None
    if path is None or not path.is_file():
        return session_id_for(event), report
    make = FORMATS[event.agent][0]
    options = Options()
    mapper = make(path, options)
    FileImporter(client, mapper, path, report, options).run()
    return mapper.session_id(None), report


def record_compaction(client: Any, session_id: str, event: HookEvent,
                      late_from: float | None = None) -> bool:
    """Mark in the archive where the agent compacted its own context: one message, after
    everything imported so far, whose metadata says what it is. It is appended only to a
    session the import made, so the importer still finds its last marker behind it.
    `late_from`: the time a queued event happened; the marker then follows what the agent
    wrote meanwhile (its own compaction summary, imported as `compactSummary`)."""
    try:
        client.get_session(session_id)
    except CtxdError as exc:
        if exc.code == -32010:  # SESSION_NOT_FOUND: nothing imported yet, nothing to mark
            return False
        raise
    trigger = event.trigger or "unknown"
    text = f"[{event.agent} compacted its context here ({trigger})]"
    if event.custom_instructions:
        text += f"\ninstructions: {event.custom_instructions[:2000]}"
    meta: dict[str, Any] = {"agentCompaction": {"agent": event.agent, "trigger": trigger}}
    if event.custom_instructions:
        meta["agentCompaction"]["instructions"] = event.custom_instructions[:2000]
    if isinstance(late_from, (int, float)):
        meta["agentCompaction"]["recordedLate"] = True
        meta["agentCompaction"]["at"] = late_from
    client.append(session_id, [{"role": "assistant", "content": text, "metadata": meta}])
    return True


def pins_of(client: Any, session_id: str) -> list[str]:
    try:
        got = client.list_pins(session_id)
    except CtxdError as exc:
        if exc.code == -32010:
            return []
        raise
    pins = got.get("pins", []) if isinstance(got, dict) else got
    return [p["text"] for p in pins if isinstance(p, dict) and isinstance(p.get("text"), str)]


def context_note(session_id: str, pins: list[str]) -> str:
    """What the agent is told: the rules pinned in ctxd, and where its history is."""
    lines = [f"ctxd archives this conversation (ctxd session {session_id})."]
    if pins:
        lines.append("Rules pinned in ctxd for this session (they hold even after the "
                     "context is compacted):")
        used = sum(len(x) for x in lines)
        for text in pins:
            item = "- " + " ".join(text.split())
            if used + len(item) > MAX_NOTE_CHARS:
                lines.append(f"- … {len(pins)} pins in all; see `ctxd pins list {session_id}`")
                break
            lines.append(item)
            used += len(item)
    lines.append(f"To recall earlier messages of this or past sessions (including what "
                 f"left the context), call the MCP tool `{SEARCH_TOOL}` of the "
                 f"`{MCP_SERVER_NAME}` server (scope \"all\" for every session).")
    return "\n".join(lines)


class NoteState:
    """Which note each agent session was last given, so a prompt hook repeats it only
    when the pins changed. One small 0600 file per agent session."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _path(self, key: str) -> Path:
        return self.folder / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".json")

    def changed(self, key: str, note: str) -> bool:
        digest = hashlib.sha256(note.encode()).hexdigest()
        path = self._path(key)
        try:
            if json.loads(path.read_text()).get("note") == digest:
                return False
        except (OSError, ValueError, AttributeError):
            pass
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        # the text too: a fresh context while the daemon is down still gets the rules
        replace_file(path, json.dumps({"note": digest, "text": note}), 0o600)
        return True

    def last(self, key: str) -> str | None:
        """The note this agent session was last given, if any."""
        try:
            text = json.loads(self._path(key).read_text()).get("text")
        except (OSError, ValueError, AttributeError):
            return None
        return text if isinstance(text, str) else None
