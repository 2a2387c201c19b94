"""What the CLI prints that came from elsewhere: made safe for a terminal, and the
daemon's words for a protocol client turned into the CLI's.

Session ids, titles, message text and error messages are written by agents and other
clients. A terminal obeys escape sequences (clear the screen, set the title, fake a
prompt) and bidi overrides reorder what is shown, so text for people shows those
characters as visible escapes instead (`\\x1b`, `\\u202e`). JSON output escapes them
as JSON does, so the data a script reads is unchanged.
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, C1 controls (0x9b is CSI on some terminals),
# and the bidi marks, embeddings, overrides and isolates
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ufeff]"
)
# the same for JSON text: C0 controls are escaped by the encoder already
_UNSAFE_JSON = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def _escape(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def clean(text: str) -> str:
    """`text` with every control character (but tab and newline), escape sequence
    introducer and bidi control shown as a visible escape."""
    return _UNSAFE.sub(_escape, text)


def clean_field(text: str) -> str:
    """`text` for a one-line field (an id, a title, a table cell): `clean`, and a newline,
    carriage return or tab shown as `\\n`, `\\r`, `\\t`, so an id cannot break a row
    into two or pass for another line of output."""
    return clean(text).replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


def clean_json(text: str) -> str:
    """JSON text with DEL, C1 controls and bidi controls escaped as `\\uXXXX`: the same
    JSON value, harmless on a terminal."""
    return _UNSAFE_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


# The daemon's messages name protocol methods (written for client authors); a person
# at the CLI needs the command that does the same. Longest names first.
_COMMANDS: tuple[tuple[str, str], ...] = (
    ("create it with session/create or list sessions with session/list",
     "`ctxd sessions` lists the sessions"),
    ("context/pins/remove", "`ctxd pins rm SESSION PIN`"),
    ("context/pins/list", "`ctxd pins list SESSION`"),
    ("context/pins/add", "`ctxd pins add SESSION TEXT`"),
    ("context/compactions", "`ctxd show SESSION`"),
    ("context/didCompact", "the running compaction to end (`ctxd watch SESSION` shows it)"),
    ("context/compact", "`ctxd compact SESSION`"),
    ("context/rebuild", "`ctxd rebuild SESSION`"),
    ("context/explain", "`ctxd explain SESSION`"),
    ("context/status", "`ctxd show SESSION`"),
    ("session/list", "`ctxd sessions`"),
    ("session/get", "`ctxd show SESSION`"),
    ("archive/search", "`ctxd search QUERY`"),
    ("archive/read", "`ctxd export SESSION`"),
    ("approval/resolve", "a decision on the approval (by the agent's client, or on the web "
     "page: `ctxd ui`)"),
    ("approval/list", "the web page (`ctxd ui`)"),
)


def cli_message(message: str, session: str | None = None) -> str:
    """A daemon error message in the CLI's terms, safe to print."""
    for method, command in _COMMANDS:
        message = message.replace(method, command)
    if session:
        message = message.replace("SESSION", session)
    message = message.replace("pass force", "use --force").replace(
        "; force compacts", "; --force compacts")
    return clean(message)
