"""Small value helpers the importers share: text cut to the archive's limit, session ids
the daemon accepts, image stand-ins, transcript times."""

from __future__ import annotations

import hashlib
from typing import Any

# Text longer than this (a whole file a tool read, a huge command output) is cut: the
# archive is for finding and following history, and the transcript keeps the rest.
MAX_TEXT_CHARS = 200_000
# ids the daemon accepts are at most 200 characters
_ID_MAX = 200


class Skip(Exception):
    """A line that maps to no message; `kind` names why, for the report."""

    def __init__(self, kind: str, note: str = "", unmappable: bool = False) -> None:
        super().__init__(kind)
        self.kind = kind
        self.note = note
        self.unmappable = unmappable


def cut_text(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[… {len(text) - limit} more characters not imported]"


def safe_id(*parts: str) -> str:
    """A session id from parts, hashed when it would be too long for the daemon."""
    sid = "-".join(p for p in parts if p)
    if len(sid) <= _ID_MAX:
        return sid
    digest = hashlib.sha1(sid.encode()).hexdigest()[:16]
    return sid[: _ID_MAX - 17] + "-" + digest


def image_reference(media_type: str | None, data: Any, where: str) -> str:
    """What stands in for an inline image: its type, size and hash, never its bytes."""
    size = len(data) if isinstance(data, str) else 0
    digest = hashlib.sha256(data.encode()).hexdigest()[:16] if isinstance(data, str) else "?"
    approx = size * 3 // 4
    return f"[image {media_type or 'unknown type'}, ~{approx} bytes, sha256:{digest}, {where}]"


def iso_to_unix(value: Any) -> float | None:
    from datetime import datetime

    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
