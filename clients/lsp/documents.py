"""Session documents as Markdown: the transcript (archive) in pages, the active context.

Every document is identified by a `DocKey`; `ctxd:` URIs and cache-file names are two
spellings of it. A rendering carries, beside its text, the positions of its message
anchors and of its links (summary source pointers, page links), so documentLink,
definition and hover answer from the rendering the editor shows without a new render.

Columns are Python string indexes; the server converts them to the client's position
encoding.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, quote, unquote, urlsplit

from ctxd.clients.message_refs import numbered, ref_and_id, ref_label
from ctxd.protocol.connection import UnsafePath, ensure_private_dir
from ctxd.protocol.files import replace_file

SCHEME = "ctxd"
Kind = Literal["transcript", "context", "search"]
KINDS: tuple[str, ...] = ("transcript", "context", "search")
# Messages per transcript page: a 100k-message transcript opens in pages, never whole.
PAGE_SIZE = 200
# Longest message body shown in a document; the rest is one line saying how much is cut.
MAX_BODY_CHARS = 20_000
# Line of the first message header in a transcript page (see `render_transcript`).
FIRST_MESSAGE_LINE = 4


@dataclass(frozen=True)
class DocKey:
    """One document: a session's transcript page (starting at message `start`, None for the
    first page) or active context, or the hits of an archive search (`query`)."""

    kind: str
    session_id: str = ""
    start: int | None = None
    query: str = ""

    def uri(self) -> str:
        if self.kind == "search":
            return f"{SCHEME}:/search.md?q={quote(self.query, safe='')}"
        base = f"{SCHEME}:/sessions/{quote(self.session_id, safe='')}/{self.kind}.md"
        return base if self.start is None else f"{base}?from={self.start}"

    def file_name(self) -> str:
        """Path under the cache dir for clients that cannot read `ctxd:` URIs."""
        if self.kind == "search":
            return f"search/{quote(self.query, safe='')[:180]}.md"
        name = self.kind if self.start is None else f"{self.kind}-from-{self.start}"
        return f"sessions/{quote(self.session_id, safe='')}/{name}.md"


def parse_uri(uri: str) -> DocKey | None:
    """The `DocKey` of a `ctxd:` URI, or None when it names no ctxd document."""
    parts = urlsplit(uri)
    if parts.scheme != SCHEME:
        return None
    query = parse_qs(parts.query)
    path = parts.path.lstrip("/")
    if path == "search.md":
        q = query.get("q", [""])[0]
        return DocKey("search", query=q) if q else None
    pieces = path.split("/")
    if len(pieces) != 3 or pieces[0] != "sessions" or not pieces[2].endswith(".md"):
        return None
    kind = pieces[2][:-3]
    if kind not in ("transcript", "context") or not pieces[1]:
        return None
    start = _int(query.get("from", [None])[0]) if kind == "transcript" else None
    return DocKey(kind, unquote(pieces[1]), start)


def parse_file(root: Path, path: Path) -> DocKey | None:
    """The `DocKey` of a cache file written by `write_file`, or None."""
    try:
        rel = path.resolve().relative_to(root.resolve())
    except ValueError:
        return None
    parts = rel.parts
    if len(parts) == 2 and parts[0] == "search" and parts[1].endswith(".md"):
        q = unquote(parts[1][:-3])
        return DocKey("search", query=q) if q else None
    if len(parts) != 3 or parts[0] != "sessions" or not parts[2].endswith(".md"):
        return None
    name = parts[2][:-3]
    sid = unquote(parts[1])
    if name == "context":
        return DocKey("context", sid)
    if name == "transcript":
        return DocKey("transcript", sid)
    if name.startswith("transcript-from-") and (start := _int(name[16:])) is not None:
        return DocKey("transcript", sid, start)
    return None


def write_file(root: Path, key: DocKey, text: str) -> Path:
    """Write the document under `root` (atomically, read-only) unless unchanged."""
    path = root / key.file_name()
    _private_dirs(root, path.parent)
    try:
        if path.read_text(encoding="utf-8") == text:
            return path
    except OSError:
        pass
    # read-only: a view of the archive, where edits would be lost, so the editor warns
    replace_file(path, text, 0o400)
    return path


def _private_dirs(root: Path, leaf: Path) -> None:
    """Create (0700) or check every directory from the cache root down to `leaf`: each one
    ours alone, or `UnsafePath` says which one is not (another user's, or writable by
    others, where a planted link or file could redirect a write)."""
    ensure_private_dir(root, what="the language server's cache dir", tighten=False)
    current = root
    for part in leaf.relative_to(root).parts:
        current = current / part
        if current.is_symlink():
            raise UnsafePath(f"the cache path {current} is a symbolic link; refusing to use it")
        ensure_private_dir(current, what="the language server's cache dir", tighten=False)


def _int(value: Any) -> int | None:
    try:
        n = int(value)
    except (TypeError, ValueError):
        return None
    return n if n >= 0 else None


@dataclass
class Link:
    """A span of one line that points at an archive message (`target` page, `message_id`)."""

    line: int
    start: int
    end: int
    target: DocKey
    message_id: int | None = None
    tooltip: str = ""


@dataclass
class Lens:
    line: int
    title: str
    command: str
    arguments: dict[str, Any]


@dataclass
class Rendered:
    key: DocKey
    text: str
    links: list[Link] = field(default_factory=list)
    lenses: list[Lens] = field(default_factory=list)
    # archive message id -> text of that message (for hover), bounded by MAX_BODY_CHARS
    bodies: dict[int, str] = field(default_factory=dict)
    # a full transcript page: the append-only archive never changes it again
    complete: bool = False

    @property
    def lines(self) -> list[str]:
        return self.text.split("\n")

    def link_at(self, line: int, col: int) -> Link | None:
        for link in self.links:
            if link.line == line and link.start <= col <= link.end:
                return link
        return None


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.links: list[Link] = []

    def add(self, text: str = "") -> None:
        self.lines.extend(text.split("\n"))

    def add_linked(self, prefix: str, label: str, suffix: str, target: DocKey,
                   message_id: int | None = None, tooltip: str = "") -> None:
        line = len(self.lines)
        self.links.append(Link(line, len(prefix), len(prefix) + len(label), target,
                               message_id, tooltip))
        self.lines.append(prefix + label + suffix)

    @property
    def line(self) -> int:
        return len(self.lines)


def when(ts: Any) -> str:
    if not isinstance(ts, (int, float)):
        return "?"
    return _dt.datetime.fromtimestamp(ts, _dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def ago(ts: Any, now: float) -> str:
    if not isinstance(ts, (int, float)):
        return "never"
    secs = max(0, int(now - ts))
    for unit, size in (("day", 86400), ("h", 3600), ("min", 60)):
        if secs >= size:
            n = secs // size
            return f"{n} {unit}{'s' if unit == 'day' and n > 1 else ''} ago"
    return "just now"


def message_body(msg: dict[str, Any]) -> str:
    """A message's text: content, then each tool call as `name(arguments)`."""
    parts: list[str] = []
    content = msg.get("content")
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):  # content parts
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                parts.append(f"[{part.get('type', 'part') if isinstance(part, dict) else 'part'}]")
    for call in msg.get("tool_calls") or []:
        fn = call.get("function") or {} if isinstance(call, dict) else {}
        args = fn.get("arguments", "")
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        parts.append(f"→ {fn.get('name', '?')}({args})")
    text = "\n".join(parts)
    if len(text) > MAX_BODY_CHARS:
        cut = len(text) - MAX_BODY_CHARS
        text = text[:MAX_BODY_CHARS] + f"\n… ({cut} more characters in the archive)"
    return text


def _fence(text: str) -> str:
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return f"{ticks}\n{text}\n{ticks}"


def _message_header(w: _Writer, msg: dict[str, Any], level: str, key: DocKey | None) -> None:
    mid = msg.get("id")
    # "#N": the message's place in its session, as summary lines cite it; the archive id
    # is written "msg N" (see docs/protocol.md)
    label, suffix = ref_and_id(mid, msg.get("ordinal"))
    suffix += f" {msg.get('role', '?')}"
    if msg.get("createdAt") is not None:
        suffix += f" · {when(msg['createdAt'])}"
    if msg.get("tool_call_id"):
        suffix += f" · result of {msg['tool_call_id']}"
    if key is not None and isinstance(mid, int):
        w.add_linked(f"{level} ", label, suffix, key, mid, "open in the transcript")
    else:
        w.add(f"{level} {label}{suffix}")


def _message_block(w: _Writer, msg: dict[str, Any]) -> str:
    body = message_body(msg)
    w.add(_fence(body) if msg.get("role") == "tool" else (body or "(empty)"))
    w.add()
    return body


def render_transcript(key: DocKey, title: str, page: dict[str, Any]) -> Rendered:
    """One page of `archive/read` (`messages`, `nextAfterId`) as Markdown."""
    w = _Writer()
    w.add(f"# Transcript: {title} (`{key.session_id}`)")
    first = DocKey("transcript", key.session_id)
    if key.start is None:
        w.add(f"From the first message, {PAGE_SIZE} messages a page.")
    else:
        w.add_linked(f"From msg {key.start}, {PAGE_SIZE} messages a page · ",
                     "first page", "", first, None, "the session's first message")
    w.add("")
    w.add("---")
    assert w.line == FIRST_MESSAGE_LINE
    messages = numbered(page)
    bodies: dict[int, str] = {}
    for msg in messages:
        _message_header(w, msg, "##", None)
        body = _message_block(w, msg)
        if isinstance(msg.get("id"), int):
            bodies[msg["id"]] = body
    if not messages:
        w.add("(no messages)")
    nxt = page.get("nextAfterId")
    if nxt is not None and len(messages) >= PAGE_SIZE:
        w.add("---")
        w.add_linked("", "next page", f" (after msg {nxt})",
                     DocKey("transcript", key.session_id, int(nxt) + 1))
    return Rendered(key, "\n".join(w.lines) + "\n", w.links, [], bodies,
                    complete=len(messages) >= PAGE_SIZE)


def status_line(status: dict[str, Any], now: float) -> str:
    return (f"{status.get('activeMessages', '?')} active messages · "
            f"{status.get('estimatedTokens', '?')} tokens · "
            f"{status.get('compactionCount', 0)} compactions · last compaction "
            f"{ago(status.get('lastCompactedAt'), now)} · "
            f"{status.get('archiveMessages', '?')} archived · "
            f"{status.get('pendingApprovals', 0)} pending approvals")


def page_of(session_id: str, message_id: int) -> DocKey:
    """The transcript page that starts at `message_id` (its header is FIRST_MESSAGE_LINE)."""
    return DocKey("transcript", session_id, message_id)


def render_context(key: DocKey, title: str, context: dict[str, Any],
                   explain: dict[str, Any], now: float) -> Rendered:
    """`context/get` + `context/explain` as Markdown: leading system messages, pins,
    summary by section with linked source pointers, and the exact tail."""
    sid = key.session_id
    w = _Writer()
    lenses: list[Lens] = []
    bodies: dict[int, str] = {}
    w.add(f"# Context: {title} (`{sid}`)")
    for cmd, label in (("ctxd.compact", "Compact"), ("ctxd.rebuild", "Rebuild"),
                       ("ctxd.openSession", "Open transcript"),
                       ("ctxd.chooseSession", "Make current")):
        args: dict[str, Any] = {"sessionId": sid}
        if cmd == "ctxd.openSession":
            args["document"] = "transcript"
        lenses.append(Lens(0, label, cmd, args))
    w.add(status_line(context.get("status") or {}, now))
    w.add("")
    messages = context.get("messages") or []
    ids = context.get("messageIds") or [None] * len(messages)
    split = next((i for i, mid in enumerate(ids) if mid is None), None)
    leading = [] if split is None else list(range(split))
    tail = list(range(len(messages))) if split is None else list(range(split + 1, len(ids)))
    if leading:
        w.add("## Leading system messages")
        w.add("")
        for i in leading:
            msg = {**messages[i], "id": ids[i]}
            _message_header(w, msg, "###", page_of(sid, ids[i]))
            bodies[ids[i]] = _message_block(w, msg)
    pins = explain.get("pins") or []
    w.add(f"## Pins ({len(pins)})")
    w.add("")
    for pin in pins:
        lenses.append(Lens(w.line, "Unpin", "ctxd.unpin",
                           {"sessionId": sid, "pinId": pin.get("pinId")}))
        text = str(pin.get("text", "")).replace("\n", " ")
        w.add(f"- {text} (`{pin.get('pinId')}`)")
    if not pins:
        w.add("(none)")
    w.add("")
    items = explain.get("items") or []
    w.add(f"## Summary ({len(items)} items)")
    section = None
    for item in items:
        if item.get("section") != section:
            section = item.get("section")
            w.add("")
            w.add(f"### {str(section).replace('_', ' ').capitalize()}")
        line = f"- {str(item.get('text', '')).replace(chr(10), ' ')}"
        if item.get("status") not in (None, "current"):
            line += f" ({item['status']})"
        spans: list[tuple[int, int, int, str]] = []
        for src in item.get("sources") or []:
            mid = src.get("id")
            if not isinstance(mid, int):
                continue
            label = ref_label(mid, src.get("ordinal"))
            line += " "
            spans.append((len(line), len(line) + len(label), mid, src.get("snippet") or ""))
            line += label + (" (broken)" if src.get("broken") else "")
            if src.get("snippet"):
                bodies.setdefault(mid, f"{src.get('role', '?')} · {when(src.get('createdAt'))}"
                                       f"\n\n{src['snippet']}")
        for start, end, mid, snippet in spans:
            w.links.append(Link(w.line, start, end, page_of(sid, mid), mid, snippet[:200]))
        w.add(line)
    if not items:
        w.add("")
        w.add("(no summary yet)")
    w.add("")
    w.add(f"## Tail ({len(tail)} messages)")
    w.add("")
    # the tail is the archive's end: its last message is the session's last
    total = (context.get("status") or {}).get("archiveMessages")
    for i in tail:
        msg = {**messages[i], "id": ids[i]}
        if isinstance(total, int) and isinstance(ids[i], int):
            msg["ordinal"] = total - (len(ids) - 1 - i)
        _message_header(w, msg, "###", page_of(sid, ids[i]) if isinstance(ids[i], int) else None)
        body = _message_block(w, msg)
        if isinstance(ids[i], int):
            bodies[ids[i]] = body
    return Rendered(key, "\n".join(w.lines) + "\n", w.links, lenses, bodies)


def render_search(key: DocKey, hits: list[dict[str, Any]], titles: dict[str, str],
                  now: float) -> Rendered:
    """Archive search hits, newest first, each linked to its transcript page."""
    w = _Writer()
    w.add(f"# ctxd: messages matching {key.query!r}")
    w.add(f"{len(hits)} messages in {len({h.get('sessionId') for h in hits})} sessions")
    w.add("")
    for hit in hits:
        sid, mid = str(hit.get("sessionId")), hit.get("messageId")
        if not isinstance(mid, int):
            continue
        label, where = ref_and_id(mid, hit.get("ordinal"))
        w.add_linked("## ", label, f"{where} {hit.get('role')} · {titles.get(sid, sid)} · "
                     f"{ago(hit.get('createdAt'), now)}", page_of(sid, mid), mid)
        w.add(clean_snippet(str(hit.get("snippet", ""))))
        w.add("")
    return Rendered(key, "\n".join(w.lines) + "\n", w.links, [], {})


def clean_snippet(snippet: str) -> str:
    """A search snippet on one line, without the `**` highlight marks."""
    return " ".join(snippet.replace("**", "").split())


def default_cache_dir() -> Path:
    """Where session documents are written for editors that cannot read `ctxd:` URIs."""

    import platformdirs

    env = os.environ.get("CTXD_CACHE_DIR")
    base = Path(env).expanduser() if env else Path(platformdirs.user_cache_dir("ctxd"))
    return (base / "lsp").resolve()
