"""The prompt a model summarizer is sent, and how its answer is read."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from ctxd.daemon.messages import content_text, message_id
from ctxd.daemon.summarizers.contract import CONTRACT_PROMPT
from ctxd.daemon.summary import SECTIONS, Summary, SummaryItem

# ------------------------------------------------------------------------- prompt

SYSTEM_PROMPT = """\
You write handoff summaries for an AI agent. The agent's conversation has grown too long, \
so its older messages are leaving its context window. Your summary replaces them: the \
agent will carry on the work reading only the pinned facts, your summary and the most \
recent messages. Whatever you leave out is lost to it, so keep what it needs to continue \
correctly: what the user wants, the rules the user set, what was decided and why, which \
files and artifacts were touched, what the tools did and returned, what failed, and what \
is still open.

Every message is shown with its archive id as [id N]. Every item you write cites in \
"sources" the ids of the messages it comes from (at least one): ids shown as [id N] or \
ids already cited by the previous summary, and no other numbers.

Answer with one JSON object and nothing else (no prose, no code fences), in this shape:
{"sections": {
  "goals": [{"text": "...", "sources": [12, 15]}],
  "constraints": [{"text": "...", "sources": [13]}, \
{"text": "...", "sources": [4], "status": "superseded"}],
  "decisions": [{"text": "...", "sources": [20], "unconfirmed": true}],
  "artifacts": [{"text": "created src/report.py", "sources": [31], "subject": "src/report.py"}],
  "files": [...],
  "tool_activity": [...],
  "errors": [...],
  "open_items": [...]
}}

Sections:
- goals: what the user asked for: the task and its parts.
- constraints: the user's rules, preferences and corrections.
- decisions: choices made, and why.
- artifacts: what the agent's own tool calls produced (rule 9), newest first.
- files: other files, directories and URLs read or mentioned, and their state.
- tool_activity: what tool calls did and returned; group repetitive calls.
- errors: failures and error messages, and whether they were fixed.
- open_items: unfinished work, next steps, tool calls still waiting for a result.
Leave out a section that has nothing.

Rules:
1. Keep word for word: the user's constraints and corrections, file paths, identifiers \
(names of functions, classes, variables, tables, branches, ids, URLs, commands, config \
keys, versions), exact error messages, and tool calls still waiting for a result. Do not \
paraphrase them.
2. When the user corrects or replaces an earlier constraint, keep the old item with \
"status": "superseded" and add the new one as a current item. Items without "status" are \
current.
3. Keep every item of the previous summary with its sources. You may merge items about \
the same thing (citing the union of their sources), update them with what the new \
messages say (an open item now done, an error now fixed) and shorten them, but never drop \
a constraint, and drop nothing else that still matters.
4. The pinned facts always apply. Do not repeat them as items, and never write an item \
that contradicts them.
5. Write only what the messages say. Do not guess or invent.
6. Be terse: short items, no filler.
""" + CONTRACT_PROMPT

_PART_NOTE = (
    "These messages are part {part} of a history too long for one request; the previous "
    "summary already covers everything before them."
)


def trim_middle(text: str, limit: int) -> str:
    """`text` cut to about `limit` characters, saying how much was left out.

    Head and tail are kept: command output and tracebacks put the cause at the end.
    """
    if len(text) <= limit:
        return text
    limit = max(limit, 40)
    head = limit * 3 // 4
    tail = limit - head
    omitted = len(text) - head - tail
    return f"{text[:head]}\n… {omitted} chars omitted …\n{text[len(text) - tail:]}"



def format_messages(
    messages: Sequence[dict[str, Any]], max_tool_chars: int = 2000
) -> list[tuple[int | None, str]]:
    """Each message as one block of prompt text, `[id N] role: text`, with its id."""
    call_names: dict[str, str] = {}
    out: list[tuple[int | None, str]] = []
    for msg in messages:
        mid = message_id(msg)
        role = str(msg.get("role") or "unknown")
        text = content_text(msg.get("content"), mark_other_parts=True)
        label = role
        if role == "tool":
            call_id = msg.get("tool_call_id")
            name = msg.get("name") or call_names.get(str(call_id))
            label = "tool" + (f" {name}" if name else "")
            if call_id is not None:
                label += f" [call_id {call_id}]"
            # Tool output is the bulk of an agent's history and mostly noise once read.
            text = trim_middle(text, max_tool_chars)
        elif msg.get("name"):
            label += f" ({msg['name']})"
        lines = [f"[id {mid if mid is not None else '?'}] {label}: {text}".rstrip()]
        for call in msg.get("tool_calls") or ():
            if not isinstance(call, dict):
                continue
            fn = call.get("function") if isinstance(call.get("function"), dict) else {}
            name = str(fn.get("name") or call.get("name") or "?")
            args = fn.get("arguments", call.get("arguments", ""))
            if not isinstance(args, str):
                args = json.dumps(args, ensure_ascii=False)
            call_id = call.get("id")
            if call_id is not None:
                call_names[str(call_id)] = name
            note = f" [call_id {call_id}]" if call_id is not None else ""
            lines.append(f"  tool call: {name}({trim_middle(args, max_tool_chars)}){note}")
        out.append((mid, "\n".join(lines)))
    return out


def _summary_json(summary: Summary) -> str:
    """The summary as the JSON the model answers with, one item a line.

    Indenting every level would spend a good part of the window on whitespace; one
    line per item stays readable for the model.
    """
    blocks: list[str] = []
    for name in SECTIONS:
        items = summary.sections.get(name) or []
        if items:
            rows = ",\n".join(
                "  " + json.dumps(_without_origin(item.to_dict()), ensure_ascii=False)
                for item in items
            )
            blocks.append(f" {json.dumps(name)}: [\n{rows}\n ]")
    return '{"sections": {\n' + ",\n".join(blocks) + "\n}}"


def _without_origin(item: dict[str, Any]) -> dict[str, Any]:
    # who wrote an item is bookkeeping, not something the model should copy
    item.pop("origin", None)
    return item


def build_prompt(
    *,
    previous: Summary,
    pins: Sequence[str],
    instructions: str | None,
    blocks: Sequence[str],
    target_tokens: int,
    part: int | None = None,
) -> list[dict[str, str]]:
    """The system and user messages asking for the summary of `blocks`."""
    anchor = "(none: this is the first summary)" if previous.is_empty() else _summary_json(
        previous
    )
    sections: list[str] = [f"<previous_summary>\n{anchor}\n</previous_summary>"]
    if pins:
        pinned = "\n".join(f"- {p}" for p in pins)
        sections.append(f"<pinned_facts>\n{pinned}\n</pinned_facts>")
    if instructions and instructions.strip():
        sections.append(
            "<focus>\nThe user asked this summary to focus on: "
            f"{instructions.strip()}\n</focus>"
        )
    intro = "Messages leaving the context, oldest first:"
    if part is not None:
        intro = _PART_NOTE.format(part=part) + "\n" + intro
    sections.append(f"{intro}\n<messages>\n" + "\n".join(blocks) + "\n</messages>")
    sections.append(
        "Write the new summary: the previous summary extended with these messages, every "
        f"item citing its ids. Keep it under about {target_tokens} tokens of text "
        f"(about {target_tokens * 4} characters). Answer with the JSON object only."
    )
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "\n\n".join(sections)},
    ]


MODEL_PROMPT = """\
You summarize part of an AI agent's conversation for the agent itself: these messages \
are leaving its context. The user's rules, the files, the artifacts, the errors and the \
tool calls are recorded separately, word for word. Write only what needs understanding:
- goals: what the user wants, and the state of the work (done, in progress, blocked).
- decisions: what was decided, with the reason when the messages give one.
- open_items: open questions and the next steps.
Each item is {"text": "...", "sources": [N]}, citing the [id N] of the messages it comes \
from. Write only what the messages say. Be terse. Copy names, paths and numbers exactly.
Answer with one JSON object: {"sections": {"goals": [...], "decisions": [...], \
"open_items": [...]}}"""


def build_model_prompt(
    *,
    previous: Summary,
    sections: Sequence[str],
    pins: Sequence[str],
    instructions: str | None,
    blocks: Sequence[str],
    target_tokens: int,
    part: int | None = None,
) -> list[dict[str, str]]:
    """The request when the built-in extractor writes the rest of the summary: a short
    prompt asking for `sections` only, and the previous summary's items of those
    sections only (the extractor carries the others).

    One user message: Gemma's chat template, among others, has no system role and
    drops a system message, and a user message reads the same on every server.
    """
    kept = Summary(sections={k: v for k, v in previous.sections.items() if k in sections})
    parts = [MODEL_PROMPT]
    if not kept.is_empty():
        parts.append(f"<previous_summary>\n{_summary_json(kept)}\n</previous_summary>")
    if pins:
        parts.append("<pinned_facts>\n" + "\n".join(f"- {p}" for p in pins) + "\n</pinned_facts>")
    if instructions and instructions.strip():
        parts.append(f"<focus>\nFocus on: {instructions.strip()}\n</focus>")
    intro = "Messages, oldest first:"
    if part is not None:
        intro = _PART_NOTE.format(part=part) + "\n" + intro
    parts.append(f"{intro}\n<messages>\n" + "\n".join(blocks) + "\n</messages>")
    parts.append(
        f"Keep it under about {target_tokens} tokens. Answer with the JSON object only."
    )
    return [{"role": "user", "content": "\n\n".join(parts)}]


# ------------------------------------------------------------------------ parsing

_THINK = re.compile(r"<think(?:ing)?>.*?(?:</think(?:ing)?>|\Z)", re.DOTALL | re.IGNORECASE)
_FENCED = re.compile(r"```[\w-]*[ \t]*\n?(.*?)```", re.DOTALL)
_TRAILING_COMMA = re.compile(r",(\s*[}\]])")


def _first_object(text: str) -> dict[str, Any] | None:
    # strict=False: a raw newline or tab inside a string, which small models write
    decoder = json.JSONDecoder(strict=False)
    first: dict[str, Any] | None = None
    i = text.find("{")
    while i != -1:
        try:
            obj, _ = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            i = text.find("{", i + 1)
            continue
        if isinstance(obj, dict):
            # Scanning left to right, the first object that decodes is the outermost
            # one; a summary-shaped one wins over, say, a lone item quoted in prose.
            if "sections" in obj or any(k in SECTIONS for k in obj):
                return obj
            if first is None:
                first = obj
        i = text.find("{", i + 1)
    return first


def parse_json_object(text: str) -> dict[str, Any] | None:
    """The JSON object in a model's answer, or None.

    Tolerates reasoning blocks, ``` fences, prose around the object and trailing
    commas: small local models produce all of them even when asked not to.
    """
    text = _THINK.sub("", text)
    candidates = [m.group(1) for m in _FENCED.finditer(text)] + [text]
    for candidate in candidates:
        found = _first_object(candidate)
        if found is None:
            found = _first_object(_TRAILING_COMMA.sub(r"\1", candidate))
        if found is not None:
            return found
    return None


def _int_source(raw: Any) -> int | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    if isinstance(raw, str):
        m = re.fullmatch(r"\s*(?:\[?(?:id|msg)\s*)?(\d+)\]?\s*", raw, re.IGNORECASE)
        if m:
            return int(m.group(1))
    return None


def read_sections(
    obj: dict[str, Any], allowed: set[int]
) -> tuple[dict[str, list[SummaryItem]], list[str]]:
    """The sections of a parsed answer, and what is wrong with them."""
    problems: list[str] = []
    raw = obj.get("sections", obj if any(k in SECTIONS for k in obj) else None)
    if not isinstance(raw, dict):
        return {}, ['the object has no "sections" object']
    out: dict[str, list[SummaryItem]] = {}
    unknown_ids: set[int] = set()
    for name, items in raw.items():
        if name not in SECTIONS:
            problems.append(
                f"unknown section {name!r}; use only: {', '.join(SECTIONS)}"
            )
            continue
        if items is None:
            continue
        if not isinstance(items, list):
            problems.append(f"sections.{name} must be a list of items")
            continue
        for n, item in enumerate(items):
            where = f"sections.{name}[{n}]"
            if not isinstance(item, dict):
                problems.append(f'{where} must be an object with "text" and "sources"')
                continue
            text = item.get("text")
            if not isinstance(text, str) or not text.strip():
                problems.append(f"{where} has no text")
                continue
            short = text.strip()[:40]
            sources_raw = item.get("sources")
            if isinstance(sources_raw, int | str) and not isinstance(sources_raw, bool):
                sources_raw = [sources_raw]
            if not isinstance(sources_raw, list) or not sources_raw:
                problems.append(f"{where} ({short!r}) cites no sources")
                continue
            sources: list[int] = []
            for s in sources_raw:
                value = _int_source(s)
                if value is None:
                    problems.append(f"{where} ({short!r}) has a source that is not an id: {s!r}")
                elif value not in sources:
                    sources.append(value)
            bad = [s for s in sources if s not in allowed]
            if bad:
                unknown_ids.update(bad)
                problems.append(f"{where} ({short!r}) cites ids that were not given: {bad[:8]}")
            status = str(item.get("status") or "current").strip().lower()
            extra = {
                k: str(item[k]).strip()[:200]
                for k in ("subject", "value", "was")
                if isinstance(item.get(k), str | int | float) and str(item[k]).strip()
            }
            out.setdefault(name, []).append(
                SummaryItem(
                    text=text.strip(),
                    sources=sources,
                    status="superseded" if status == "superseded" else "current",
                    unconfirmed=item.get("unconfirmed") is True,
                    **extra,
                )
            )
    if unknown_ids:
        # First, so it survives when a long list of problems is cut short.
        problems.insert(
            0, "cite only ids shown as [id N] in <messages> or cited in <previous_summary>"
        )
    return out, problems
