"""The structured summary of history that has left the active context.

A summary is a fixed set of sections; each item is a short text with `sources`, the
archive ids of the messages it came from, so every claim can be followed back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

# Order matters: it is the order the model reads them in.
SECTIONS: dict[str, str] = {
    "goals": "Goals",
    "constraints": "Constraints and user corrections",
    "decisions": "Decisions",
    "files": "Files and artifacts",
    "tool_activity": "Tool activity",
    "errors": "Errors",
    "open_items": "Open items",
}


@dataclass
class SummaryItem:
    text: str
    sources: list[int]
    # "superseded" marks an item a later user message corrected; kept so the model
    # sees the history of a constraint, rendered as no longer current.
    status: str = "current"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"text": self.text, "sources": list(self.sources)}
        if self.status != "current":
            out["status"] = self.status
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SummaryItem:
        return cls(
            text=str(d["text"]),
            sources=[int(s) for s in d.get("sources", [])],
            status=str(d.get("status", "current")),
        )


@dataclass
class Summary:
    sections: dict[str, list[SummaryItem]] = field(default_factory=dict)
    # archive id range of the messages this summary stands for (inclusive)
    covers_from: int | None = None
    covers_to: int | None = None
    # compactions that built it, oldest first
    compaction_ids: list[str] = field(default_factory=list)
    # which summarizer produced the latest version
    summarizer: str = ""
    # incremental compactions since the summary was last derived from the archive
    depth: int = 0

    def items(self) -> list[tuple[str, SummaryItem]]:
        return [(name, item) for name in SECTIONS for item in self.sections.get(name, [])]

    def item_count(self) -> int:
        return sum(len(v) for v in self.sections.values())

    def all_sources(self) -> set[int]:
        return {s for _, item in self.items() for s in item.sources}

    def is_empty(self) -> bool:
        return self.item_count() == 0

    def render(self) -> str:
        """Plain text the model reads inside the context's summary system message."""
        lines: list[str] = []
        for name, title in SECTIONS.items():
            items = self.sections.get(name) or []
            if not items:
                continue
            lines.append(f"## {title}")
            for item in items:
                refs = ",".join(str(s) for s in item.sources[:8])
                if len(item.sources) > 8:
                    refs += ",…"
                mark = "[superseded] " if item.status == "superseded" else ""
                suffix = f" [msg {refs}]" if refs else ""
                lines.append(f"- {mark}{item.text}{suffix}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "sections": {
                name: [i.to_dict() for i in self.sections.get(name, [])]
                for name in SECTIONS
                if self.sections.get(name)
            },
            "coversFrom": self.covers_from,
            "coversTo": self.covers_to,
            "compactionIds": list(self.compaction_ids),
            "summarizer": self.summarizer,
            "depth": self.depth,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Summary:
        if not d:
            return cls()
        sections = {
            name: [SummaryItem.from_dict(i) for i in items]
            for name, items in (d.get("sections") or {}).items()
            if name in SECTIONS
        }
        return cls(
            sections=sections,
            covers_from=d.get("coversFrom"),
            covers_to=d.get("coversTo"),
            compaction_ids=list(d.get("compactionIds") or []),
            summarizer=str(d.get("summarizer") or ""),
            depth=int(d.get("depth") or 0),
        )


@dataclass
class SummaryRequest:
    """Everything a summarizer gets; it must not read the archive itself.

    `messages` are the archived messages leaving the active context, oldest first, as
    OpenAI-shaped dicts with their archive `id`. `previous` is the anchor: the summary
    the new one extends. `budget_tokens` bounds the rendered output.
    """

    session_id: str
    previous: Summary
    messages: list[dict[str, Any]]
    pins: list[str]
    instructions: str | None
    budget_tokens: int
    count_tokens: Callable[[str], int]


class Summarizer(Protocol):
    """Optional attributes: `drifts` (default True: errors can compound over incremental
    summaries, so the compactor re-derives from the archive now and then) and
    `summarize_sync(request)` (CPU-bound work the compactor runs in a worker thread)."""

    name: str

    async def summarize(self, request: SummaryRequest) -> Summary:
        """Return the new summary: the previous one extended with the leaving messages."""
        ...
