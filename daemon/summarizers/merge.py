"""A model's summary and the built-in extractor's, merged under one contract.

The extractor is deterministic and cites its evidence: the user's rules and their
corrections, the artifacts the agent's tools produced, the files, the errors and the
tool activity come from it, word for word. The model writes what an extractor cannot:
the state of the work (goals), decisions with their reasons, and open questions. So a
small or careless model can add to a summary but never take a rule, an id, a path or a
pointer out of it:

- a model item must cite messages of this span (or of the previous summary); ids it
  invented are dropped, and an item left with none cites the span's first and last
  message;
- a model item restating an extractor item replaces its wording and cites the union of
  both; one that states a value a later message replaced is dropped, and one that
  drops the hedge of a hedged conclusion is marked unconfirmed;
- the model's share is at most half the budget; past the budget, the extractor's own
  excerpts of goals, decisions and open items and its tool activity go first, the
  model's items next, and rules last.

Every item says where it came from (`origin`: "extractor", "model", or
"model+extractor" for a model rewording of an extracted item), and the summary's
`summarizer` counts them, which the compaction log records.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ctxd.daemon.summarizers.contract import _same_statement, contract_problems
from ctxd.daemon.summarizers.facts import is_hedged
from ctxd.daemon.summarizers.guesses import split_guesses
from ctxd.daemon.summarizers.llm_prompt import _int_source, parse_json_object
from ctxd.daemon.summarizers.llm_schema import MODEL_SECTIONS
from ctxd.daemon.summary import SECTIONS, Summary, SummaryItem, SummaryRequest

EXTRACTOR = "extractor"
MODEL = "model"
BOTH = "model+extractor"


def read_answer(content: str) -> dict[str, Any] | None:
    """The answer's JSON object; a reply cut off at the output limit is closed after
    its last complete item, so the items written before the cut are kept."""
    for text in (content, close_truncated(content)):
        obj = parse_json_object(text)
        # a lone item of a cut-off answer decodes too: only a summary's shape counts
        if obj is not None and ("sections" in obj or any(k in SECTIONS for k in obj)):
            return obj
    return None


def close_truncated(text: str) -> str:
    """`text` cut after its last complete object inside an array, brackets closed."""
    start = text.find("{")
    if start < 0:
        return text
    text = text[start:]
    stack: list[str] = []
    in_string = escaped = False
    last_good = ""
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]":
            if not stack:
                break
            stack.pop()
            if ch == "}" and stack and stack[-1] == "]":
                # an item just closed: the text up to here, with the open brackets closed
                last_good = text[: i + 1] + "".join(reversed(stack))
    return last_good or text


# a path or a file name: a model item naming one the messages never named made it up
_PATHLIKE = re.compile(
    r"[\w.-]*/[\w./-]*\w|\b[\w-]+\.(?:py|js|ts|tsx|md|json|toml|ya?ml|txt|csv|sql|sh|go|rs"
    r"|java|c|h|cpp|html|css|lock|cfg|ini)\b"
)


def model_items(
    obj: dict[str, Any], span: list[int], anchor: Summary, evidence: str = ""
) -> dict[str, list[SummaryItem]]:
    """The model's goals, decisions and open items, each citing ids that exist.

    Items without a word ("...") are dropped, and so are items naming a path that is
    not in `evidence` (the messages and the previous summary), which small models copy
    from the prompt's examples or invent."""
    raw = obj.get("sections", obj)
    if not isinstance(raw, dict):
        return {}
    allowed = set(span) | anchor.all_sources()
    fallback = sorted({span[0], span[-1]}) if span else []
    out: dict[str, list[SummaryItem]] = {}
    for name in MODEL_SECTIONS:
        items = raw.get(name)
        if not isinstance(items, list):
            continue
        seen: set[str] = set()
        for item in items:
            if not isinstance(item, dict):
                continue
            text = item.get("text")
            if not isinstance(text, str) or not text.strip():
                continue
            text = re.sub(r"\s+", " ", text).strip()[:600]
            if len(re.findall(r"\w{2,}", text)) < 2:
                continue
            if evidence and any(p not in evidence for p in _PATHLIKE.findall(text)):
                continue
            if text.casefold() in seen:
                continue  # small models repeat themselves
            seen.add(text.casefold())
            listed = item.get("sources")
            if not isinstance(listed, list):
                listed = [listed]
            sources: list[int] = []
            for s in listed:
                value = _int_source(s)
                if value is not None and value in allowed and value not in sources:
                    sources.append(value)
            if not sources:
                if not fallback:
                    continue
                sources = list(fallback)
            out.setdefault(name, []).append(
                SummaryItem(text=text, sources=sorted(sources), origin=MODEL)
            )
    return out


def merge(
    extracted: Summary,
    model: dict[str, list[SummaryItem]],
    request: SummaryRequest,
    anchor: Summary,
    reference: Summary,
    span: list[int],
    size_limit: int | None = None,
) -> Summary:
    """`extracted` with the model's items merged in, within the request's budget and
    within `size_limit` (when given) but for the user's rules in force, which are kept
    whole past it as the extractor keeps them.

    `reference` is the extractor's reading of the span with room for everything: what
    a model item is held to (superseded values, hedges).
    """
    known = {(name, item.text): item.origin for name, item in anchor.items() if item.origin}
    sections: dict[str, list[SummaryItem]] = {}
    for name, joined in extracted.items():
        # guesses the extractor joined on one line are merged one by one: a model's
        # wording of one of them must not replace the others
        parts = split_guesses(joined, extracted.ordinals)
        for text, sources in parts:
            item = joined if len(parts) == 1 else replace(
                joined, text=text, sources=sources, subject=None
            )
            item.origin = known.get((name, item.text)) or item.origin or EXTRACTOR
            sections.setdefault(name, []).append(item)
    for name in MODEL_SECTIONS:
        for item in model.get(name, []):
            problems = contract_problems(reference, {name: [item]}, span, 0)
            if any("replaced" in p for p in problems):
                continue  # states a value a later message replaced
            existing = sections.setdefault(name, [])
            same = next((e for e in existing if _same_statement(e.text, item.text)), None)
            if problems or (same is not None and same.unconfirmed):
                item.unconfirmed = not is_hedged(item.text)
            if same is None:
                existing.append(item)
                continue
            same.sources = sorted(set(same.sources) | set(item.sources))
            same.text = item.text
            same.origin = MODEL if same.origin == MODEL else BOTH
            same.unconfirmed = same.unconfirmed or item.unconfirmed
    merged = Summary(
        sections=sections,
        covers_from=extracted.covers_from,
        covers_to=extracted.covers_to,
        compaction_ids=list(extracted.compaction_ids),
        supersessions=dict(extracted.supersessions),
        ordinals=dict(request.ordinals),
    )
    _fit(merged, request.budget_tokens, request.count_tokens)
    if size_limit is not None and size_limit < request.budget_tokens:
        _fit(merged, size_limit, request.count_tokens, keep_rules=True)
    cited = merged.all_sources()
    merged.ordinals = {k: v for k, v in request.ordinals.items() if k in cited}
    return merged


def origin_counts(summary: Summary) -> dict[str, int]:
    counts: dict[str, int] = {}
    for _, item in summary.items():
        key = item.origin or EXTRACTOR
        counts[key] = counts.get(key, 0) + 1
    return counts


def describe(counts: dict[str, int]) -> str:
    """Where the items came from, for the summary's `summarizer` and the log."""
    return json.dumps(dict(sorted(counts.items())), separators=(",", ":"))


def _newest(item: SummaryItem) -> int:
    return max(item.sources, default=0)


def _fit(
    summary: Summary, budget: int, count: Callable[[str], int], keep_rules: bool = False
) -> None:
    """Drop items until the summary renders within `budget` (see the module's doc);
    with `keep_rules`, the current constraints are never dropped (a size limit below
    the budget: the rules in force are kept whole past it)."""

    def size() -> int:
        return count(summary.render())

    def drop(name: str, item: SummaryItem) -> None:
        summary.sections[name] = [i for i in summary.sections[name] if i is not item]
        if not summary.sections[name]:
            del summary.sections[name]

    # the model's share: at most half the budget, its oldest items out first
    mine = sorted(
        ((n, i) for n, i in summary.items() if i.origin in (MODEL, BOTH)),
        key=lambda p: _newest(p[1]),
    )
    while mine and count("\n".join(i.line() for _, i in mine)) > budget // 2:
        name, item = mine.pop(0)
        drop(name, item)
    if size() <= budget:
        return
    tiers: list[list[tuple[str, SummaryItem]]] = [
        [("tool_activity", i) for i in summary.sections.get("tool_activity", [])],
        [
            (n, i)
            for n in MODEL_SECTIONS
            for i in summary.sections.get(n, [])
            if i.origin not in (MODEL, BOTH)
        ],
        [(n, i) for n, i in summary.items() if i.origin in (MODEL, BOTH)],
        [("errors", i) for i in summary.sections.get("errors", [])],
        [("files", i) for i in summary.sections.get("files", [])],
        [("artifacts", i) for i in summary.sections.get("artifacts", [])],
        [("constraints", i) for i in summary.sections.get("constraints", [])
         if i.status != "current"],
    ]
    if not keep_rules:
        tiers.append([("constraints", i) for i in summary.sections.get("constraints", [])
                      if i.status == "current"])
    for tier in tiers:
        for name, item in sorted(tier, key=lambda p: _newest(p[1])):
            if size() <= budget:
                return
            drop(name, item)
