"""What every transcript importer shares: reading JSONL incrementally, batching appends,
resuming where the last import stopped, and reporting what could not be mapped.

Where an import stopped is kept in the archive itself, so it cannot drift from what was
stored: the last message of every batch carries `metadata.import = {offset, line}`, the
byte offset and line count of the transcript consumed up to that batch. A batch is
stored whole or not at all and carries a `clientBatchId` derived from its source range,
so a crash mid-import leaves no half batch and a retry of a batch stores it once. The
next import reads the session's last message (`archive/read` with `beforeId`) and goes
on from its offset: a file read twice adds nothing, a grown file adds only its new lines.

The file is read line by line with bounded batches, so memory stays flat however big the
transcript is. A line longer than `Options.max_line_bytes` is skipped and reported, read
in chunks to its newline and never held whole.

The marker also carries `head`, a hash of the file's first line: a file at the same path
whose first line differs is a new transcript (the agent rotated or replaced it), imported
into a session of its own (the plain id plus `-r` and its head's hash) instead of being
read from the old file's offset; a file shorter than what was imported from it with the
same first line was truncated, and is reported and left alone. An unfinished last line
(a writer in the middle of it, or one that died there) is parsed again only once the file
changed size since it was last looked at.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ctxd.clients.importers.lines import (
    MAX_LINE_BYTES,
    Unfinished,
    file_head,
    iter_lines,
    parse_line,
)
from ctxd.clients.importers.report import Report
from ctxd.clients.importers.values import (
    MAX_TEXT_CHARS,
    Skip,
    cut_text,
    image_reference,
    iso_to_unix,
    safe_id,
)
from ctxd.protocol.errors import Conflict, CtxdError, InvalidMessage, PayloadTooLarge

# what the importers (and the hooks that reuse them) take from here
__all__ = [
    "AT_REST_SECONDS", "BATCH_BYTES", "BATCH_MESSAGES", "MAX_LINE_BYTES", "MAX_TEXT_CHARS",
    "Emit", "FileImporter", "Mapper", "Options", "Report", "Skip", "cut_text", "find_files",
    "image_reference", "iso_to_unix", "safe_id",
]

# A batch is flushed at this many messages or bytes, whichever comes first.
BATCH_MESSAGES = 500
BATCH_BYTES = 4 * 1024 * 1024
# the latest message of a session: any id the archive will ever reach is below this
_END_ID = 2**62
# A transcript not written to for this long is finished: its last message is imported
# even when it looks unfinished (a tool call without its result, a reply cut short), so
# an old file is never reported as still being written.
AT_REST_SECONDS = 3600.0
# how far back from a session's end to look for the last import marker
_MARKER_PAGE = 50
_MARKER_PAGES = 100


@dataclass
class Options:
    drop_reasoning: bool = False
    verbose: bool = False
    sidechains: str = "sessions"  # "sessions": own sessions; "mark": kept in place, marked
    max_line_bytes: int = MAX_LINE_BYTES


@dataclass
class Emit:
    """One message produced from a line, and which of the file's sessions it goes to
    (`None`: the main one; otherwise a suffix such as "sidechain")."""

    message: dict[str, Any]
    target: str | None = None


class Mapper(Protocol):
    """Turns one parsed transcript line into messages. One instance per file."""

    source: str
    # the file's session id; the importer extends it when another file holds it
    base_id: str

    def session_id(self, target: str | None) -> str: ...

    def targets(self) -> Iterable[str | None]:
        """Every target this file may have written to (for resuming)."""
        ...

    def session_info(self, target: str | None) -> tuple[str, dict[str, Any]]:
        """Title and metadata of a session, from what the mapper has seen so far."""
        ...

    def map_line(self, obj: dict[str, Any], line: int) -> list[Emit]: ...

    def merge(self, prev: dict[str, Any], new: dict[str, Any]) -> bool:
        """Fold `new` into `prev` when they are parts of one message; True if folded."""
        ...

    def incomplete(self, msg: dict[str, Any]) -> bool:
        """True when a message last in the file may still grow (more lines to merge)."""
        ...


class _Pending:
    def __init__(self) -> None:
        self.target: str | None = None
        self.messages: list[dict[str, Any]] = []
        # where each message's first line starts: (offset, lines before it)
        self.starts: list[tuple[int, int]] = []
        self.nbytes = 0
        self.first_offset = 0

    def clear(self) -> None:
        self.messages = []
        self.starts = []
        self.nbytes = 0


class FileImporter:
    """Imports one transcript file into its session(s) through a ctxd client."""

    def __init__(self, client: Any, mapper: Mapper, path: Path, report: Report,
                 options: Options,
                 unfinished: dict[Path, tuple[int, int]] | None = None) -> None:
        self.client = client
        self.mapper = mapper
        self.path = path
        self.report = report
        self.options = options
        self.existing: set[str] = set()
        self.pending = _Pending()
        # unfinished last lines found by earlier runs (kept across `--follow` rounds)
        self.unfinished = unfinished if unfinished is not None else {}
        self.head: str | None = None

    # resuming

    def _last_position(self) -> tuple[int, int, str | None] | None:
        """(offset, line, head) this file was imported up to, from the sessions' last
        imported messages; None when a session of this file holds messages no import
        wrote. `head` is the first line's hash the markers recorded (None: not recorded)."""
        best: tuple[int, int, str | None] = (0, 0, None)
        for target in self.mapper.targets():
            sid = self.mapper.session_id(target)
            try:
                pos = self._session_position(sid)
            except CtxdError as exc:
                if exc.code == -32010:  # SESSION_NOT_FOUND: nothing imported there yet
                    continue
                raise
            self.existing.add(sid)
            if pos is None:
                return None
            if pos[:2] > best[:2]:
                best = pos
        return best

    def _session_position(self, sid: str) -> tuple[int, int, str | None] | None:
        """The import marker nearest the end of the session. Other clients may have
        appended after it (an agent working on an imported session), so look back a
        bounded stretch; (0, 0) for an empty session, None when no marker is found."""
        before = _END_ID
        for i in range(_MARKER_PAGES):
            # the last message is the marker unless another client appended after the
            # import: read one first, then small pages (messages can be large)
            page = self.client.read(sid, before_id=before, limit=1 if i == 0 else _MARKER_PAGE)
            for m in reversed(page["messages"]):
                pos = (m.get("metadata") or {}).get("import") or {}
                off, line = pos.get("offset"), pos.get("line")
                if isinstance(off, int) and isinstance(line, int):
                    head = pos.get("head")
                    return off, line, head if isinstance(head, str) else None
            if not page["messages"]:
                return (0, 0, None) if before == _END_ID else None
            if page.get("nextBeforeId") is None:
                return None
            before = page["nextBeforeId"]
        return None

    # batching

    def _flush(self, end_offset: int, end_line: int) -> None:
        p = self.pending
        if not p.messages:
            return
        sid = self.mapper.session_id(p.target)
        if sid not in self.existing:
            title, metadata = self.mapper.session_info(p.target)
            started = _session_start(p.target, p.messages, metadata)
            try:
                self.client.create_session(sid, title=title[:1000], metadata=metadata,
                                           created_at=started)
                self.report.sessions_created += 1
            except Conflict:
                pass  # made by an earlier import, or by a concurrent one
            self.existing.add(sid)
        last = p.messages[-1]
        if self.head is None:
            # the first line is complete (or a whole JSON value) once a batch ends past it
            found = file_head(self.path)
            self.head = found[0] if found else None
        marker: dict[str, Any] = {"offset": end_offset, "line": end_line}
        if self.head is not None:
            marker["head"] = self.head
        last["metadata"] = {**(last.get("metadata") or {}), "import": marker}
        batch_id = safe_id("import", sid, f"{p.first_offset}-{end_offset}")
        messages = p.messages
        for _ in range(len(messages) + 1):
            try:
                result = self.client.append(sid, messages, client_batch_id=batch_id)
                break
            except (InvalidMessage, PayloadTooLarge) as exc:
                index = (exc.data or {}).get("index")
                if not isinstance(index, int) or not 0 <= index < len(messages):
                    raise
                messages[index] = self._repair(messages[index], exc)
        else:  # pragma: no cover - every retry repairs one message, so this cannot loop
            raise RuntimeError("could not repair the batch")
        self.report.sessions.add(sid)
        self.report.messages += len(result["messageIds"])
        self.report.batches += 1
        p.clear()
        p.first_offset = end_offset

    def _repair(self, msg: dict[str, Any], exc: CtxdError) -> dict[str, Any]:
        """A message the daemon refused, turned into one it accepts, keeping the text.

        A tool result whose call is not in this transcript (it began in an earlier file)
        or a reused call id cannot be linked; it is kept as plain text and marked."""
        kind = "too large" if isinstance(exc, PayloadTooLarge) else exc.message.split(": ", 1)[-1]
        kind = kind.split("'")[0].strip()[:60]
        self.report.repaired[kind] += 1
        text = _plain_text(msg)
        meta = {**(msg.get("metadata") or {}), "repaired": exc.message[:300]}
        if isinstance(exc, PayloadTooLarge):
            text = cut_text(text, 100_000)
        role = "assistant" if msg["role"] in ("assistant", "tool") else msg["role"]
        if msg["role"] == "tool":
            text = f"[result of tool call {msg.get('tool_call_id')}]\n{text}"
        out = {"role": role, "content": text or "(empty)", "metadata": meta}
        if "createdAt" in msg:
            out["createdAt"] = msg["createdAt"]
        return out

    def add(self, emit: Emit, line_start: int, line_end: int, line_no: int) -> None:
        p = self.pending
        if p.messages and emit.target != p.target:
            self._flush(line_start, line_no - 1)
        if p.messages and self.mapper.merge(p.messages[-1], emit.message):
            return
        if not p.messages:
            p.target = emit.target
            p.first_offset = line_start
        p.messages.append(emit.message)
        p.starts.append((line_start, line_no - 1))
        p.nbytes += _approx_size(emit.message)

    def _claim_session_id(self) -> None:
        """Transcripts are named by their session (`<uuid>.jsonl`), and one name can occur
        in two project folders. The first file imported keeps the plain id; another file
        of the same name gets an id with a hash of its path, so two transcripts never
        merge into one session (and a re-import finds each again)."""
        base = self.mapper.session_id(None)
        try:
            session = self.client.get_session(base)["session"]
        except CtxdError as exc:
            if exc.code == -32010:  # SESSION_NOT_FOUND: the plain id is free
                return
            raise
        owner = str((session.get("metadata") or {}).get("sourcePath") or "")
        # a relative path (written by an older import) cannot be compared: taken as ours
        if not owner or not Path(owner).is_absolute():
            return
        mine = self.path.resolve()
        if Path(owner) != mine:
            digest = hashlib.sha1(str(mine).encode()).hexdigest()[:8]
            self.mapper.base_id = safe_id(self.mapper.base_id, digest)

    def _resume_point(self) -> tuple[int, int] | None:
        """Where to go on reading this file, after checking it is still the file that was
        imported: a new first line is a new transcript (its own session, from its start);
        a file shorter than what was imported is reported and left alone (None)."""
        position = self._last_position()
        if position is None:
            self.report.notes.append(
                f"{self.path}: its session holds messages no import wrote and no import "
                "marker near its end; left alone so nothing is imported twice")
            return None
        start, line_no, head = position
        try:
            size = self.path.stat().st_size
        except OSError as exc:
            self.report.notes.append(f"{self.path}: cannot read ({exc})")
            return None
        current = file_head(self.path)
        if start > 0 and head is not None and (current is None or current[0] != head):
            if current is None or not current[1]:
                self.report.notes.append(
                    f"{self.path}: its first line is not the one imported and is not "
                    f"complete ({size} bytes now, {start} were imported): rewritten or "
                    "truncated; waiting for a complete first line")
                return None
            # another transcript at the same path (rotated or replaced): never read from
            # the old file's offset; it gets a session of its own, found again by its head
            old = self.mapper.session_id(None)
            self.mapper.base_id = safe_id(self.mapper.base_id, "r" + current[0][:8])
            self.existing.clear()
            self.unfinished.pop(self.path, None)  # what was found in the old file
            position = self._last_position()
            if position is None:
                self.report.notes.append(
                    f"{self.path}: a new transcript at this path, but its session "
                    f"{self.mapper.session_id(None)} holds messages no import wrote; left alone")
                return None
            start, line_no, _ = position
            if start == 0:
                self.report.notes.append(
                    f"{self.path}: a new transcript at this path (its first line differs "
                    f"from the one imported into {old}); imported into session "
                    f"{self.mapper.session_id(None)}")
        if current is not None and current[1]:
            # the markers of this run name the file read now, even if it is replaced
            # while being read (the next run then sees a different first line)
            self.head = current[0]
        if start > size:
            self.report.notes.append(
                f"{self.path}: shorter than what was imported from it ({size} < {start} "
                "bytes) though its first line is the one imported: it was truncated, so it "
                "is left alone (nothing already imported is removed)")
            return None
        return start, line_no

    def _at_rest(self) -> bool:
        try:
            return time.time() - self.path.stat().st_mtime > AT_REST_SECONDS
        except OSError:
            return False

    def run(self) -> None:
        self._claim_session_id()
        resume = self._resume_point()
        if resume is None:
            return
        start, line_no = resume
        self.report.files += 1
        self.pending.first_offset = start
        end = start
        tail = Unfinished(seen=self.unfinished.get(self.path))
        for end_off, raw in iter_lines(self.path, end, self.options.max_line_bytes, tail):
            line_no += 1
            self.report.lines += 1
            line_start = end
            end = end_off
            if raw is None:
                self.report.skip(self.path, line_no, Skip(
                    "line too long", f"{end_off - line_start} bytes, over the limit of "
                    f"{self.options.max_line_bytes}; not read", True))
                continue
            if not raw.strip():
                continue
            try:
                obj = parse_line(raw)
                if not isinstance(obj, dict):
                    raise Skip("not an object", unmappable=True)
                emits = self.mapper.map_line(obj, line_no)
            except ValueError as exc:
                self.report.skip(self.path, line_no, Skip("corrupt JSON", str(exc)[:120], True))
                emits = []
            except Skip as exc:
                self.report.skip(self.path, line_no, exc)
                emits = []
            now = time.time()
            for e in emits:
                e.message.setdefault("metadata", {})["line"] = line_no
                if e.message.get("createdAt", 0) > now:
                    # a writer's clock ahead of this one: the daemon refuses the future
                    e.message["createdAt"] = now
                self.add(e, line_start, end_off, line_no)
            p = self.pending
            if len(p.messages) >= BATCH_MESSAGES or p.nbytes >= BATCH_BYTES:
                if len(p.messages) > 1 and self.mapper.incomplete(p.messages[-1]):
                    # a message the next lines may still add to opens the next batch
                    target, msg, start = p.target, p.messages.pop(), p.starts.pop()
                    self._flush(*start)
                    p.target, p.first_offset = target, start[0]
                    p.messages, p.starts = [msg], [start]
                    p.nbytes = _approx_size(msg)
                else:
                    self._flush(end, line_no)
        tail_line = line_no + 1
        p = self.pending
        if p.messages and self.mapper.incomplete(p.messages[-1]) and not self._at_rest():
            # the writer is still on this message (more blocks, or its tool results, are
            # to come): leave it for the next import, which reads it again from its start
            end, line_no = p.starts.pop()
            p.messages.pop()
            self.report.deferred += 1
        self._flush(end, line_no)
        if tail.found is None:
            self.unfinished.pop(self.path, None)
        else:
            self.unfinished[self.path] = tail.found
        if tail.parsed:
            self.report.unfinished += 1
            if self.report.verbose:
                self.report.details.append(
                    f"{self.path}:{tail_line}: last line not finished "
                    f"({tail.found[1] - tail.found[0] if tail.found else 0} bytes so far); "
                    "read again once the file changes size")
        for kind, n in getattr(self.mapper, "dropped", {}).items():
            self.report.skipped[kind] += n
            if self.report.verbose:
                self.report.details.append(f"{self.path}: {kind} ({n}), skipped; a newer "
                                           "version of the agent may write it")


def _session_start(target: str | None, messages: list[dict[str, Any]],
                   metadata: dict[str, Any]) -> float | None:
    """When a session began, from its transcript: its first message's time or, for a
    file's main session, the start its header names, whichever is earlier."""
    times = [t for t in (messages[0].get("createdAt") if messages else None,
                         metadata.get("startedAt") if target is None else None)
             if isinstance(t, int | float)]
    return min(min(times), time.time()) if times else None


def _approx_size(msg: dict[str, Any]) -> int:
    content = msg.get("content")
    n = len(content) if isinstance(content, str) else 200
    if isinstance(content, list):
        n = sum(len(p.get("text", "")) for p in content if isinstance(p, dict))
    for c in msg.get("tool_calls") or ():
        n += len(c["function"].get("arguments", ""))
    meta = msg.get("metadata") or {}
    n += len(meta.get("reasoning", "")) if isinstance(meta.get("reasoning"), str) else 0
    return n * 3 + 200  # worst case UTF-8 plus the JSON around it


def _plain_text(msg: dict[str, Any]) -> str:
    parts: list[str] = []
    content = msg.get("content")
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        parts += [p.get("text", "") for p in content if isinstance(p, dict)]
    for c in msg.get("tool_calls") or ():
        parts.append(f"[tool call {c['id']}] {c['function']['name']} "
                     f"{c['function'].get('arguments', '')}")
    return "\n".join(p for p in parts if p)


def find_files(paths: list[Path], pattern: str) -> list[Path]:
    """The transcript files named or found below the given paths, oldest first."""
    found: list[Path] = []
    for p in paths:
        if p.is_dir():
            found += [f for f in p.rglob(pattern) if f.is_file()]
        elif p.is_file():
            found.append(p)
    uniq = {os.path.realpath(f): f for f in found}

    def mtime(f: Path) -> float:
        try:
            return f.stat().st_mtime
        except OSError:
            return 0.0

    return sorted(uniq.values(), key=lambda f: (mtime(f), str(f)))
