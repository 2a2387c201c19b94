"""The structured summary of history that has left the active context.

A summary is a fixed set of sections; each item is a short text with `sources`, the
archive ids of the messages it came from, so every claim can be followed back.

Items know what kind of fact they hold. A setting or decision names its `subject` and
`value`, so a later value for the same subject supersedes it whatever the wording; an
`unconfirmed` item is a hedged conclusion and is shown as one in every later summary;
an artifact (a file the agent's tools wrote, a commit, a PR, a job id) names its
`subject`, the path or id. What the model reads cites sources by their ordinal in the
session (`#12` at the end of a line), a fraction of what a global archive id costs;
`ordinals` maps them.

Beside the sections, `preambles` holds the standing instructions a front end sent as
a user message (an AGENTS.md, a CLAUDE.md, a user_instructions block), verbatim and
outside the summary's budget: the agents themselves resend them with every request.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

# Order matters: it is the order the model reads them in.
SECTIONS: dict[str, str] = {
    "goals": "Goals",
    "constraints": "Constraints and user corrections",
    "decisions": "Decisions",
    "artifacts": "Artifacts (own changes and tool ids, newest first)",
    "files": "Files mentioned",
    "tool_activity": "Tool activity",
    "errors": "Errors",
    "open_items": "Open items",
}


# sections whose lines are rendered without a pointer
UNPOINTED = frozenset({"artifacts", "files", "tool_activity"})


@dataclass
class SummaryItem:
    text: str
    sources: list[int]
    # "superseded" marks an item a later user message corrected; kept so the model
    # sees the history of a constraint, rendered as no longer current.
    status: str = "current"
    # a hedged conclusion ("probably", "I haven't confirmed that", "推测"): shown as such
    # until the archive shows it confirmed
    unconfirmed: bool = False
    # what a setting or decision is about, or the path or id an artifact names
    subject: str | None = None
    # the value a setting sets; `was`: the value it replaced, shown as "(was X)"
    value: str | None = None
    was: str | None = None
    # who wrote it when a model and the built-in extractor summarize together:
    # "extractor", "model", or "model+extractor" (a model's wording of an extracted
    # item); None when one summarizer wrote the whole summary
    origin: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"text": self.text, "sources": list(self.sources)}
        if self.status != "current":
            out["status"] = self.status
        if self.unconfirmed:
            out["unconfirmed"] = True
        for key in ("subject", "value", "was", "origin"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SummaryItem:
        def opt(key: str) -> str | None:
            v = d.get(key)
            return str(v) if v not in (None, "") else None

        return cls(
            text=str(d["text"]),
            sources=[int(s) for s in d.get("sources", [])],
            status=str(d.get("status", "current")),
            unconfirmed=bool(d.get("unconfirmed", False)),
            subject=opt("subject"),
            value=opt("value"),
            was=opt("was"),
            origin=opt("origin"),
        )

    def line(
        self, ordinals: dict[int, int] | None = None, text: str | None = None, pointer: bool = True
    ) -> str:
        """The rendered line: marks, the text, the old value, one compact pointer."""
        text = self.text if text is None else text
        mark = "[superseded] " if self.status == "superseded" else ""
        if self.unconfirmed:
            mark += "[推测] " if _CJK.search(text) else "[unconfirmed] "
        was = f" (was {self.was})" if self.was and self.status == "current" else ""
        ref = _pointer(self.sources, ordinals or {}) if pointer else ""
        return f"- {mark}{text}{was}{' ' + ref if ref else ''}"


_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")

# a summary whose items hold at most this many characters (about 8 each for marks and
# pointers) is small: see Summary.is_small
SMALL_SUMMARY_CHARS = 720
_CJK_STOPS = ("。", "！", "？", "；")


def _plain(item: SummaryItem) -> bool:
    return item.status == "current" and not item.unconfirmed and not item.was


def _joined_lines(items: list[SummaryItem], ordinals: dict[int, int]) -> list[str]:
    """The lines of a small summary's section: neighbouring plain items (no mark, no old
    value) share one line and one pointer, `#first-last`, the range of the messages
    they were last stated in; each keeps its own words, its sources stay in explain."""
    out: list[str] = []
    run: list[SummaryItem] = []

    def flush() -> None:
        if len(run) == 1:
            out.append(run[0].line(ordinals))
        elif run:
            at = [ordinals.get(i.sources[-1]) for i in run if i.sources]
            known = [n for n in at if n is not None]
            ref = ""
            if known:
                lo, hi = min(known), max(known)
                ref = f" #{lo}" if lo == hi else f" #{lo}-{hi}"
            text = run[0].text
            for item in run[1:]:
                # Chinese runs on after its own full stop; a space would cost a token
                text += item.text if text.endswith(_CJK_STOPS) else " " + item.text
            out.append(f"- {text}{ref}")
        run.clear()

    for item in items:
        if _plain(item) and item.sources and item.sources[-1] in ordinals:
            run.append(item)
        else:
            flush()
            out.append(item.line(ordinals))
    flush()
    return out


def _pointer(sources: list[int], ordinals: dict[int, int]) -> str:
    """`#N`: where the item was last stated, as the message's ordinal in its session
    (every source is in `context/explain`); a global id only when no ordinal is known."""
    if not sources:
        return ""
    last = sources[-1]
    n = ordinals.get(last)
    return f"#{n}" if n is not None else f"[msg {last}]"


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
    # archive id -> ordinal of the message in its session, for the sources cited (and
    # covers_to, the anchor the next compaction counts on from)
    ordinals: dict[int, int] = field(default_factory=dict)
    # archive id of a superseded statement -> archive id of the one that replaced it
    supersessions: dict[int, int] = field(default_factory=dict)
    # instruction preambles that left the tail, the latest copy of each: `subject` names
    # it (its heading or tag), `text` is verbatim (up to a bound, see
    # compaction/preambles.py), `sources` the message it was last sent in
    preambles: list[SummaryItem] = field(default_factory=list)

    def items(self) -> list[tuple[str, SummaryItem]]:
        return [(name, item) for name in SECTIONS for item in self.sections.get(name, [])]

    def item_count(self) -> int:
        return sum(len(v) for v in self.sections.values())

    def all_sources(self) -> set[int]:
        return {s for _, item in self.items() for s in item.sources} | {
            s for item in self.preambles for s in item.sources
        }

    def is_empty(self) -> bool:
        return self.item_count() == 0 and not self.preambles

    def render_preambles(self) -> str:
        """The preambles as the model reads them: each under the pointer of the message
        that sent it last, verbatim."""
        return "\n\n".join(
            f"From {_pointer(p.sources, self.ordinals)}:\n{p.text}" for p in self.preambles
        )

    def is_small(self) -> bool:
        """A handful of short lines: the summary of a short context (a few rules, a few
        requests), where the header and a pointer per line would cost more than the
        messages it replaces. Such a summary is written compactly."""
        return bool(self.ordinals) and sum(
            len(i.text) + 8 for _, i in self.items()
        ) <= SMALL_SUMMARY_CHARS

    def render(self) -> str:
        """Plain text the model reads inside the context's summary system message."""
        lines: list[str] = []
        small = self.is_small()
        for name, title in SECTIONS.items():
            items = self.sections.get(name) or []
            if not items:
                continue
            lines.append(f"## {title}")
            # A path, a commit, a PR or a tool tally is its own search key: its line carries
            # no pointer (context/explain has its sources), so pointers stay a small share.
            # Without ordinals (a summary from before them) every line keeps its id.
            bare = bool(self.ordinals) and name in UNPOINTED
            if small and not bare:
                lines.extend(_joined_lines(items, self.ordinals))
            else:
                lines.extend(item.line(self.ordinals, pointer=not bare) for item in items)
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
            "ordinals": {str(k): v for k, v in self.ordinals.items()},
            "supersessions": {str(k): v for k, v in self.supersessions.items()},
            **({"preambles": [p.to_dict() for p in self.preambles]} if self.preambles else {}),
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
            ordinals={int(k): int(v) for k, v in (d.get("ordinals") or {}).items()},
            supersessions={int(k): int(v) for k, v in (d.get("supersessions") or {}).items()},
            preambles=[SummaryItem.from_dict(p) for p in d.get("preambles") or ()],
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
    # archive id -> ordinal in the session, for the messages and the previous summary's
    # sources: the summary renders its pointers with them
    ordinals: dict[int, int] = field(default_factory=dict)
    # a bound below `budget_tokens` from the size of what the summary replaces (the
    # previous summary plus a share of the leaving messages): a summarizer that honours
    # it (`honours_size_limit`) keeps the user's hard constraints whole past it
    size_limit_tokens: int | None = None
    # what the summary message carries word for word anyway (the instruction
    # preambles): an item only repeating a line of one is not needed
    verbatim: list[str] = field(default_factory=list)


class Summarizer(Protocol):
    """Optional attributes: `drifts` (default True: errors can compound over incremental
    summaries, so the compactor re-derives from the archive now and then),
    `summarize_sync(request)` (CPU-bound work the compactor runs in a worker thread) and
    `honours_size_limit` (default False: the compactor then lowers `budget_tokens` to the
    request's `size_limit_tokens` instead)."""

    name: str

    async def summarize(self, request: SummaryRequest) -> Summary:
        """Return the new summary: the previous one extended with the leaving messages."""
        ...


# a summarizer that does not honour `size_limit_tokens` gets it as its budget, but never
# below this: a model asked for a handful of tokens answers nothing useful
MODEL_FLOOR = 200


def as_taken(summarizer: Summarizer, request: SummaryRequest) -> SummaryRequest:
    """`request` as `summarizer` can take it: a size limit below the budget becomes a
    smaller budget (never below MODEL_FLOOR) for one that does not honour it."""
    limit = request.size_limit_tokens
    if limit is None or getattr(summarizer, "honours_size_limit", False):
        return request
    budget = request.budget_tokens
    return replace(request, budget_tokens=min(budget, max(limit, MODEL_FLOOR)),
                   size_limit_tokens=None)
