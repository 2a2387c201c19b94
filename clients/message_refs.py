"""How clients name a message to people: `#N`, its place in its session (what summary
lines cite), and `msg N`, its archive id (see docs/protocol.md). One place for both, so
the editor's documents, the MCP tools and the CLI write them alike."""

from __future__ import annotations

from typing import Any


def numbered(page: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages of an `archive/read` page, each with its `ordinal` (`#N`) when the
    page says where it starts (`firstOrdinal`); as they are otherwise."""
    messages: list[dict[str, Any]] = page.get("messages") or []
    first = page.get("firstOrdinal")
    if not isinstance(first, int) or isinstance(first, bool):
        return messages
    return [{**m, "ordinal": first + i} for i, m in enumerate(messages)]


def ref_label(message_id: Any, ordinal: Any) -> str:
    """`#N` when the message's place is known, else `msg N`."""
    return f"#{ordinal}" if _known(ordinal) else f"msg {message_id}"


def ref_and_id(message_id: Any, ordinal: Any) -> tuple[str, str]:
    """The label and what follows it: `("#12", " · msg 3456")`, or `("msg 3456", "")`
    when the place is not known (the id is then the label)."""
    if _known(ordinal):
        return f"#{ordinal}", f" · msg {message_id}"
    return f"msg {message_id}", ""


def _known(ordinal: Any) -> bool:
    return isinstance(ordinal, int) and not isinstance(ordinal, bool)
