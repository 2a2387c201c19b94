"""One hook call from start to end: parse the agent's event, reach the daemon (never
starting one: a hook must return fast), replay what earlier calls queued, import, mark
a compaction, and answer with the note for the agent's context.

When the daemon cannot be reached, or the connection is lost midway, the event is queued
on disk (spool.py) and the call still succeeds: the agent's turn never waits on ctxd.
The daemon is started by `ctxd mcp`, which the agent launches at its start when
`ctxd install` set it up; the first hook call after that catches up.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from ctxd.clients.hooks import spool
from ctxd.clients.hooks.capture import (
    HookEvent,
    NoteState,
    context_note,
    import_transcript,
    pins_of,
    record_compaction,
    session_id_for,
)
from ctxd.protocol.errors import CtxdError

# a hook waits this long for the daemon at most; past it, the event is queued
CONNECT_TIMEOUT = 2.0
CALL_TIMEOUT = 20.0
# the events after which the agent is told its pins: a fresh context (SessionStart, also
# after the agent's own compaction) always; a new prompt only when the pins changed
NOTE_EVENTS = ("SessionStart", "UserPromptSubmit")
# replayed per call at most, so one call after a long outage stays bounded
REPLAY_MAX = 200
# how long a call waits for another one importing the same transcript
LOCK_WAIT = 15.0


@dataclass
class Places:
    data_dir: Path
    connection_file: Path

    @property
    def queue(self) -> Path:
        return spool.spool_dir(self.data_dir)

    @property
    def notes(self) -> Path:
        return self.data_dir / "hook-state"


class Busy(Exception):
    """Another hook call held the transcript's lock for longer than LOCK_WAIT."""


@contextlib.contextmanager
def transcript_lock(places: Places, transcript: str | None) -> Iterator[None]:
    """One import of a transcript at a time: an agent runs hooks concurrently (parallel
    tool calls, Codex's notify beside its Stop hook), and two imports from the same
    resume point could cut the new lines into different batches and store them twice."""
    if not transcript:
        yield
        return
    folder = places.notes / "locks"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    name = hashlib.sha256(transcript.encode()).hexdigest()[:32] + ".lock"
    fd = os.open(folder / name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise Busy(f"another hook call is importing {transcript}") from None
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def daemon_absent(places: Places) -> str | None:
    """Why no daemon can answer, found without loading the client (a missing connection
    file, or one whose daemon is gone): the common case of a down daemon costs little."""
    from ctxd.protocol.connection import daemon_gone, read_connection_file

    try:
        info = read_connection_file(places.connection_file)
    except FileNotFoundError:
        return f"no connection file {places.connection_file}"
    except (OSError, ValueError) as exc:
        return f"cannot read {places.connection_file}: {exc}"
    if daemon_gone(info):
        return f"the daemon of {places.connection_file} is not running"
    return None


def _connect(places: Places) -> Any:
    from ctxd.clients.client import Client

    return Client.connect(places.connection_file, None, "jsonrpc", timeout=CALL_TIMEOUT,
                          connect_timeout=CONNECT_TIMEOUT)


def _queue(places: Places, event: HookEvent, err: TextIO, why: str) -> None:
    entry = {**event.to_entry(), "queuedAt": time.time()}
    try:
        where = spool.enqueue(places.queue, entry)
    except (OSError, ValueError, spool.UnsafeSpool) as exc:
        print(f"ctxd hook: {why}; could not queue the event either: {exc}", file=err)
        return
    if where is None:
        print(f"ctxd hook: {why}; the queue is full, the next import catches up", file=err)
    else:
        # exit 0 keeps this out of the agent's way; it shows in the agent's debug output
        print(f"ctxd hook: {why}; queued for the next call", file=err)


def replay(client: Any, places: Places, err: TextIO) -> int:
    """Hand the daemon what earlier calls queued, oldest first; the count replayed."""
    done = 0
    for path, entry in spool.pending(places.queue)[:REPLAY_MAX]:
        if entry is None:
            spool.done(path)  # unreadable or not ours: nothing to replay from it
            continue
        try:
            event = HookEvent.from_entry(entry)
            with transcript_lock(places, event.transcript):
                sid, _ = import_transcript(client, event)
                if event.event == "PreCompact":
                    record_compaction(client, sid, event, late_from=entry.get("queuedAt"))
        except ValueError as exc:
            print(f"ctxd hook: dropped a queue entry {path.name}: {exc}", file=err)
        except CtxdError as exc:
            # the daemon refused it: refused again next time, so it is not kept
            print(f"ctxd hook: the daemon refused a queued event: {exc.message}", file=err)
        spool.done(path)
        done += 1
    return done


def handle(event: HookEvent, places: Places, err: TextIO = sys.stderr) -> dict[str, Any] | None:
    """Run one hook event; the JSON to print for the agent, if any."""
    absent = daemon_absent(places)
    if absent is not None:
        _queue(places, event, err, f"no daemon ({absent})")
        return _remembered_note(event, places)
    from ctxd.clients.client import DaemonNotRunning

    try:
        client = _connect(places)
    except (DaemonNotRunning, ConnectionError, TimeoutError, OSError) as exc:
        _queue(places, event, err, f"no daemon ({str(exc)[:200]})")
        return _remembered_note(event, places)
    try:
        replay(client, places, err)
        with transcript_lock(places, event.transcript):
            sid, _ = import_transcript(client, event)
            if event.event == "PreCompact":
                record_compaction(client, sid, event)
        if event.event not in NOTE_EVENTS:
            return None
        note = context_note(sid, pins_of(client, sid))
        fresh = NoteState(places.notes).changed(_note_key(event), note)
        if event.event == "UserPromptSubmit" and not fresh:
            return None
        return {"hookSpecificOutput": {"hookEventName": event.event,
                                       "additionalContext": note}}
    except (ConnectionError, TimeoutError) as exc:
        _queue(places, event, err, f"lost the daemon ({str(exc)[:200]})")
        return _remembered_note(event, places)
    except Busy as exc:
        # the other call imports the same lines; only a compaction mark must not be lost
        if event.event == "PreCompact":
            _queue(places, event, err, str(exc))
        return None
    except CtxdError as exc:
        print(f"ctxd hook: the daemon refused: {exc.message}", file=err)
        return None
    finally:
        client.close()


def _note_key(event: HookEvent) -> str:
    return f"{event.agent}:{event.agent_session or session_id_for(event)}"


def _remembered_note(event: HookEvent, places: Places) -> dict[str, Any] | None:
    """A fresh context (SessionStart: startup, resume, or after the agent's own
    compaction) while the daemon is down gets the note it was last given: the pins as
    they were then, said to be so."""
    if event.event != "SessionStart":
        return None
    note = NoteState(places.notes).last(_note_key(event))
    if note is None:
        return None
    note += ("\n(ctxd could not be reached just now: these are the pins as they were at "
             "the last hook call of this session.)")
    return {"hookSpecificOutput": {"hookEventName": event.event, "additionalContext": note}}


def read_stdin_event(stream: Any, limit: int = 1 << 20) -> dict[str, Any]:
    raw = stream.read(limit + 1)
    if len(raw) > limit:
        raise ValueError(f"hook input over {limit} bytes")
    data = json.loads(raw or "{}")
    if not isinstance(data, dict):
        raise ValueError("hook input is not a JSON object")
    return data


def _text(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    return value if isinstance(value, str) and value else None


def claude_event(agent: str, data: dict[str, Any]) -> HookEvent:
    """Claude Code's hook input (Codex hooks send the same fields)."""
    name = _text(data, "hook_event_name")
    if name is None:
        raise ValueError("hook input has no hook_event_name")
    return HookEvent(agent=agent, event=name, transcript=_text(data, "transcript_path"),
                     agent_session=_text(data, "session_id"), cwd=_text(data, "cwd"),
                     source=_text(data, "source"), trigger=_text(data, "trigger"),
                     custom_instructions=_text(data, "custom_instructions"))
