"""A summarizer backed by an OpenAI-compatible chat completions endpoint.

It speaks plain `POST {base_url}/chat/completions`, the one API that OpenAI, Ollama,
llama.cpp's server and vLLM all serve, and asks for JSON the portable way: the format is
spelled out in the prompt and `response_format: {"type": "json_object"}` is sent as a
hint, dropped when a server rejects it. The answer is parsed tolerantly (code fences,
prose around the object, reasoning blocks, trailing commas) and then checked strictly:
known sections, items with text and sources, only ids that were shown, within the
budget. A bad answer gets one retry with its problems named; a second bad answer is a
`SummarizerError`, and the engine leaves the context untouched.

Input larger than the model's window is summarized in chunks, oldest first, each chunk
anchored on the summary so far, so a long history never makes compaction fail.

The HTTP client is a small one on asyncio streams (http and https, Content-Length,
chunked and read-to-close bodies): a summary request is one POST with a JSON body, which
does not justify a dependency.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import ssl
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ctxd.daemon.config import OpenAISummarizerConfig
from ctxd.daemon.messages import content_text
from ctxd.daemon.summary import SECTIONS, Summary, SummaryItem, SummaryRequest

from .contract import CONTRACT_PROMPT, contract_problems, reference

log = logging.getLogger("ctxd.summarizer.openai")


class SummarizerError(Exception):
    """The endpoint failed, or answered twice with an unusable summary.

    The message names the endpoint and the cause; it never contains the API key.
    """


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


def _message_id(msg: dict[str, Any]) -> int | None:
    raw = msg.get("id")
    if isinstance(raw, bool):
        return None
    try:
        return int(raw)
    except (TypeError, ValueError):
        return None


def format_messages(
    messages: Sequence[dict[str, Any]], max_tool_chars: int = 2000
) -> list[tuple[int | None, str]]:
    """Each message as one block of prompt text, `[id N] role: text`, with its id."""
    call_names: dict[str, str] = {}
    out: list[tuple[int | None, str]] = []
    for msg in messages:
        mid = _message_id(msg)
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
                "  " + json.dumps(item.to_dict(), ensure_ascii=False) for item in items
            )
            blocks.append(f" {json.dumps(name)}: [\n{rows}\n ]")
    return '{"sections": {\n' + ",\n".join(blocks) + "\n}}"


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


# ------------------------------------------------------------------------ parsing

_THINK = re.compile(r"<think(?:ing)?>.*?(?:</think(?:ing)?>|\Z)", re.DOTALL | re.IGNORECASE)
_FENCED = re.compile(r"```[\w-]*[ \t]*\n?(.*?)```", re.DOTALL)
_TRAILING_COMMA = re.compile(r",(\s*[}\]])")


def _first_object(text: str) -> dict[str, Any] | None:
    decoder = json.JSONDecoder()
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


# ---------------------------------------------------------------------------- HTTP


@dataclass
class _Response:
    status: int
    headers: dict[str, str]
    body: bytes


class _HTTPError(Exception):
    pass


async def _read_headers(reader: asyncio.StreamReader) -> dict[str, str]:
    headers: dict[str, str] = {}
    for _ in range(200):
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            return headers
        key, sep, value = line.decode("latin-1").partition(":")
        if sep:
            headers[key.strip().lower()] = value.strip()
    raise _HTTPError("too many response headers")


async def _read_body(
    reader: asyncio.StreamReader, headers: dict[str, str], max_bytes: int
) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunks: list[bytes] = []
        size_total = 0
        while True:
            size_line = await reader.readline()
            if not size_line:
                raise _HTTPError("the connection closed inside a chunked body")
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                await _read_headers(reader)  # trailers
                return b"".join(chunks)
            size_total += size
            if size_total > max_bytes:
                raise _HTTPError(f"the response is larger than {max_bytes} bytes")
            chunks.append(await reader.readexactly(size))
            await reader.readline()
    length = headers.get("content-length")
    if length is not None:
        n = int(length)
        if n > max_bytes:
            raise _HTTPError(f"the response is larger than {max_bytes} bytes")
        return await reader.readexactly(n)
    body = await reader.read(max_bytes + 1)
    while body and len(body) <= max_bytes:
        more = await reader.read(max_bytes + 1 - len(body))
        if not more:
            break
        body += more
    if len(body) > max_bytes:
        raise _HTTPError(f"the response is larger than {max_bytes} bytes")
    return body


async def post_json(
    url: str,
    payload: dict[str, Any],
    headers: dict[str, str],
    *,
    ssl_context: ssl.SSLContext | None = None,
    max_bytes: int = 32 * 1024 * 1024,
) -> _Response:
    """One HTTP/1.1 POST of a JSON body; the caller bounds it with a timeout."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise _HTTPError(f"unsupported URL {url!r}: expected http:// or https://")
    host = parts.hostname
    port = parts.port or (443 if scheme == "https" else 80)
    host_header = f"[{host}]" if ":" in host else host
    if parts.port and parts.port != (443 if scheme == "https" else 80):
        host_header += f":{parts.port}"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    body = json.dumps(payload, ensure_ascii=False).encode()
    head = {
        "Host": host_header,
        "User-Agent": "ctxd",
        "Content-Type": "application/json",
        "Accept": "application/json",
        # Ask for an unencoded body; gzip and deflate are still decoded below.
        "Accept-Encoding": "identity",
        "Content-Length": str(len(body)),
        "Connection": "close",
        **headers,
    }
    request = f"POST {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in head.items())
    ctx: ssl.SSLContext | None = None
    if scheme == "https":
        ctx = ssl_context or ssl.create_default_context()
    reader, writer = await asyncio.open_connection(
        host, port, ssl=ctx, server_hostname=host if ctx else None, limit=1 << 20
    )
    try:
        writer.write(request.encode("latin-1") + b"\r\n" + body)
        await writer.drain()
        while True:
            status_line = await reader.readline()
            if not status_line:
                raise _HTTPError("the server closed the connection without answering")
            fields = status_line.decode("latin-1").split(None, 2)
            if len(fields) < 2 or not fields[0].startswith("HTTP/") or not fields[1].isdigit():
                raise _HTTPError(f"not an HTTP response: {status_line[:80]!r}")
            status = int(fields[1])
            response_headers = await _read_headers(reader)
            if status >= 200:
                break
            # 100 Continue and other interim responses precede the real one.
        data = b""
        if status not in (204, 304):
            data = await _read_body(reader, response_headers, max_bytes)
        encoding = response_headers.get("content-encoding", "identity").lower()
        if encoding in ("gzip", "x-gzip", "deflate"):
            # wbits 47: zlib detects a gzip or zlib header by itself
            data = zlib.decompress(data, 47)
        return _Response(status, response_headers, data)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            # TLS close_notify can hang on a server that already went away.
            await asyncio.wait_for(writer.wait_closed(), 1.0)


def _error_detail(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip()
    with contextlib.suppress(ValueError):
        data = json.loads(text)
        if isinstance(data, dict):
            err = data.get("error", data.get("detail", data.get("message")))
            if isinstance(err, dict):
                err = err.get("message") or err
            if err:
                text = err if isinstance(err, str) else json.dumps(err)
    return text[:300]


# -------------------------------------------------------------------- summarizer


@dataclass
class _Verdict:
    sections: dict[str, list[SummaryItem]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    # the only problem is size: the summary is valid but renders over the budget
    over_budget_only: bool = False


# What the budget gives up first when a valid answer is still too long after the
# retry: the same order as the built-in summarizer, current constraints last.
_DROP_ORDER = ("tool_activity", "errors", "files", "decisions", "goals", "open_items")


class OpenAISummarizer:
    """Summaries written by a model behind an OpenAI-compatible endpoint."""

    def __init__(
        self,
        config: OpenAISummarizerConfig,
        *,
        ssl_context: ssl.SSLContext | None = None,
        max_tool_chars: int = 2000,
    ) -> None:
        self.config = config
        self.name = f"openai:{config.model or 'default'}"
        self.ssl_context = ssl_context
        self.max_tool_chars = max_tool_chars
        base = config.base_url.rstrip("/")
        self.url = base + "/chat/completions"
        parts = urlsplit(self.url)
        # For messages: credentials embedded in the URL must not leak into logs.
        netloc = parts.netloc.rsplit("@", 1)[-1]
        self.endpoint = urlunsplit((parts.scheme, netloc, parts.path, "", ""))
        # Request options a server turned down; remembered so later requests skip them.
        self._dropped: set[str] = set()
        self._max_tokens_key = "max_tokens"

    # ------------------------------------------------------------ public API

    async def summarize(self, request: SummaryRequest) -> Summary:
        previous = request.previous
        if request.budget_tokens <= 0:
            return self._finish(request, previous, {}, [])
        blocks = format_messages(request.messages, self.max_tool_chars)
        if not blocks:
            return self._finish(request, previous, previous.sections, [])
        count = request.count_tokens
        sized = [(mid, text, count(text) + 1) for mid, text in blocks]
        summary = previous
        pending = sized
        part = 0
        while pending:
            part += 1
            room = self._room(request, summary)
            chunk, pending = self._take(pending, room, count)
            if part == 1 and pending:
                log.info(
                    "%s: %d messages exceed the window of %d tokens; summarizing in chunks",
                    self.endpoint,
                    len(blocks),
                    self.config.context_window_tokens,
                )
            numbered = part if (part > 1 or pending) else None
            summary = await self._summarize_chunk(request, summary, chunk, numbered)
        return summary

    # ------------------------------------------------------------- chunking

    def _target_tokens(self, request: SummaryRequest) -> int:
        # The JSON answer is longer than the rendered text; asking for a rendered size
        # the output limit cannot hold would get a cut-off answer.
        return max(50, min(request.budget_tokens, int(self.config.max_output_tokens * 0.7)))

    def _room(self, request: SummaryRequest, anchor: Summary) -> int:
        """Tokens left for message text in one request anchored on `anchor`."""
        prompt = build_prompt(
            previous=anchor,
            pins=request.pins,
            instructions=request.instructions,
            blocks=[],
            target_tokens=self._target_tokens(request),
            part=1,
        )
        overhead = sum(request.count_tokens(m["content"]) + 4 for m in prompt) + 3
        # The server's tokenizer is not ours: keep a tenth in reserve. A retry appends
        # the bad answer (trimmed) and the list of its problems.
        window = int(self.config.context_window_tokens * 0.9)
        room = window - overhead - self.config.max_output_tokens - _RETRY_RESERVE
        if room < _MIN_ROOM:
            log.warning(
                "%s: the prompt and previous summary leave %d tokens of a %d-token window "
                "for messages; using %d, which may exceed the window",
                self.endpoint,
                room,
                self.config.context_window_tokens,
                _MIN_ROOM,
            )
            room = _MIN_ROOM
        return room

    @staticmethod
    def _take(
        pending: list[tuple[int | None, str, int]],
        room: int,
        count: Callable[[str], int],
    ) -> tuple[list[tuple[int | None, str]], list[tuple[int | None, str, int]]]:
        """The next chunk (at least one message, trimmed if it alone is too big)."""
        chunk: list[tuple[int | None, str]] = []
        used = 0
        i = 0
        while i < len(pending):
            mid, text, tokens = pending[i]
            if tokens <= room - used:
                chunk.append((mid, text))
                used += tokens
                i += 1
                continue
            if not chunk:
                chunk.append((mid, _fit_text(text, room, count)))
                i += 1
            break
        return chunk, pending[i:]

    # ------------------------------------------------------------ one request

    async def _summarize_chunk(
        self,
        request: SummaryRequest,
        anchor: Summary,
        chunk: list[tuple[int | None, str]],
        part: int | None,
    ) -> Summary:
        ids = [mid for mid, _ in chunk if mid is not None]
        allowed = anchor.all_sources() | set(ids)
        messages: list[dict[str, str]] = build_prompt(
            previous=anchor,
            pins=request.pins,
            instructions=request.instructions,
            blocks=[text for _, text in chunk],
            target_tokens=self._target_tokens(request),
            part=part,
        )
        verdict = _Verdict()
        # the built-in reading of the same messages: what the answer is held to
        ref = reference(request, anchor, ids)
        for attempt in (1, 2):
            content, finish_reason = await self._complete(messages)
            verdict = self._check(content, finish_reason, allowed, anchor, request)
            if not verdict.problems or verdict.over_budget_only:
                broken = contract_problems(ref, verdict.sections, ids, request.budget_tokens)
                if broken:
                    verdict = _Verdict(verdict.sections, [*verdict.problems, *broken])
            if not verdict.problems:
                return self._finish(request, anchor, verdict.sections, ids, ref)
            if attempt == 1:
                log.warning(
                    "%s: the summary was rejected, retrying once: %s",
                    self.endpoint,
                    "; ".join(verdict.problems[:3]),
                )
                # Trimmed to what _room reserved for a retry, so it fits the window too.
                shown = (
                    _fit_text(content, _RETRY_RESERVE // 2, request.count_tokens)
                    if content.strip()
                    else "(an empty answer)"
                )
                messages = [
                    *messages,
                    {"role": "assistant", "content": shown},
                    {
                        "role": "user",
                        "content": "That answer cannot be used:\n"
                        + "\n".join(f"- {p}" for p in verdict.problems[:8])
                        + "\nAnswer again with the complete corrected JSON object only.",
                    },
                ]
        if verdict.over_budget_only:
            # Twice valid but too long: cutting the least important items keeps the
            # model's work, which beats failing the compaction over size alone.
            sections = _fit_budget(verdict.sections, request)
            log.warning("%s: the summary was over budget twice; dropped items", self.endpoint)
            return self._finish(request, anchor, sections, ids, ref)
        raise SummarizerError(
            f"{self.endpoint}: the model's summary was invalid twice: "
            + "; ".join(verdict.problems[:5])
        )

    def _check(
        self,
        content: str,
        finish_reason: str | None,
        allowed: set[int],
        anchor: Summary,
        request: SummaryRequest,
    ) -> _Verdict:
        cut = finish_reason == "length"
        if not content.strip():
            return _Verdict(problems=["the answer was empty"])
        obj = parse_json_object(content)
        if obj is None or not ("sections" in obj or any(k in SECTIONS for k in obj)):
            problems = ['the answer holds no valid JSON object with "sections"']
            if cut:
                problems.append(
                    "the answer was cut off at the output limit: write a shorter summary"
                )
            return _Verdict(problems=problems)
        sections, problems = read_sections(obj, allowed)
        problems += _lost_constraints(anchor, sections, request)
        size = request.count_tokens(Summary(sections=sections).render())
        if size > request.budget_tokens:
            over = (
                f"the summary is {size} tokens long; the limit is {request.budget_tokens}: "
                "merge related items and shorten them"
            )
            return _Verdict(sections, [*problems, over], over_budget_only=not problems)
        return _Verdict(sections, problems)

    def _finish(
        self,
        request: SummaryRequest,
        anchor: Summary,
        sections: dict[str, list[SummaryItem]],
        ids: list[int],
        ref: Summary | None = None,
    ) -> Summary:
        covers_from, covers_to = anchor.covers_from, anchor.covers_to
        if ids:
            covers_from = min(ids) if covers_from is None else min(covers_from, min(ids))
            covers_to = max(ids) if covers_to is None else max(covers_to, max(ids))
        return Summary(
            sections={k: list(v) for k, v in sections.items() if v},
            covers_from=covers_from,
            covers_to=covers_to,
            compaction_ids=list(request.previous.compaction_ids),
            summarizer=self.name,
            # which statement superseded which, as the built-in reading found it: search
            # marks superseded hits with it whichever summarizer wrote the items
            supersessions={**anchor.supersessions, **(ref.supersessions if ref else {})},
        )

    # ---------------------------------------------------------------- HTTP

    def _payload(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        payload: dict[str, Any] = {"messages": messages, "stream": False}
        if self.config.model:
            payload["model"] = self.config.model
        if "temperature" not in self._dropped:
            payload["temperature"] = self.config.temperature
        payload[self._max_tokens_key] = self.config.max_output_tokens
        if "response_format" not in self._dropped:
            payload["response_format"] = {"type": "json_object"}
        return payload

    def _adapt(self, status: int, detail: str) -> bool:
        """Drop or rename the option a server rejected; False when there is none."""
        if status not in (400, 422):
            return False
        low = detail.lower()
        if "response_format" in low and "response_format" not in self._dropped:
            self._dropped.add("response_format")
            return True
        unsupported = "unsupported" in low or "not supported" in low
        # Newer OpenAI models take max_completion_tokens and only the default temperature.
        if (
            unsupported
            and "max_tokens" in low
            and "max_completion_tokens" in low
            and self._max_tokens_key == "max_tokens"
        ):
            self._max_tokens_key = "max_completion_tokens"
            return True
        if unsupported and "temperature" in low and "temperature" not in self._dropped:
            self._dropped.add("temperature")
            return True
        return False

    async def _complete(self, messages: list[dict[str, str]]) -> tuple[str, str | None]:
        """The model's answer text and finish reason."""
        key_name = self.config.api_key_env
        key = os.environ.get(key_name, "").strip() if key_name else ""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        timeout = self.config.timeout_seconds
        for _ in range(4):
            try:
                async with asyncio.timeout(timeout):
                    response = await post_json(
                        self.url, self._payload(messages), headers, ssl_context=self.ssl_context
                    )
            except TimeoutError:
                raise SummarizerError(
                    f"{self.endpoint}: no answer within {timeout:g} s (timeout_seconds)"
                ) from None
            except (OSError, _HTTPError, ValueError, EOFError, zlib.error) as exc:
                cause = _redact(f"{type(exc).__name__}: {exc}", key)
                raise SummarizerError(f"{self.endpoint}: request failed: {cause}") from None
            if 200 <= response.status < 300:
                return _read_choice(response.body, self.endpoint, key)
            detail = _redact(_error_detail(response.body), key)
            if self._adapt(response.status, detail):
                log.info("%s: HTTP %d (%s); retrying without that option",
                         self.endpoint, response.status, detail[:120])
                continue
            hint = ""
            if response.status == 404:
                hint = " (check openai.base_url: it usually ends in /v1)"
            raise SummarizerError(f"{self.endpoint}: HTTP {response.status}: {detail}{hint}")
        raise SummarizerError(f"{self.endpoint}: the server rejected every request option")


# Room a retry adds to the conversation: the trimmed bad answer and the problems.
_RETRY_RESERVE = 600
# Never fewer tokens of messages per request than this, whatever the window says.
_MIN_ROOM = 256


def _redact(text: str, key: str) -> str:
    if key and len(key) >= 4:
        text = text.replace(key, "[redacted]")
    return text


def _read_choice(body: bytes, endpoint: str, key: str) -> tuple[str, str | None]:
    try:
        data = json.loads(body)
        choice = data["choices"][0]
        message = choice.get("message") or {}
        content = content_text(message.get("content"), mark_other_parts=True)
        return content, choice.get("finish_reason")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        snippet = _redact(body[:200].decode("utf-8", "replace"), key)
        raise SummarizerError(
            f"{endpoint}: not a chat completion response: {snippet!r}"
        ) from None


def _fit_text(text: str, room: int, count: Callable[[str], int]) -> str:
    """`text` trimmed in the middle until it counts at most `room` tokens."""
    limit = len(text)
    for _ in range(8):
        tokens = count(text)
        if tokens <= room:
            return text
        limit = max(40, int(min(limit, len(text)) * room / tokens * 0.9))
        text = trim_middle(text, limit)
    return text


def _lost_constraints(
    anchor: Summary, sections: dict[str, list[SummaryItem]], request: SummaryRequest
) -> list[str]:
    """Current constraints of the anchor that no item cites any more.

    A user's rule dropped from the summary is the most harmful loss; the check is
    skipped when those constraints alone would take half the budget.
    """
    kept = [i for i in anchor.sections.get("constraints") or [] if i.status == "current"]
    if not kept:
        return []
    alone = Summary(sections={"constraints": kept}).render()
    if request.count_tokens(alone) * 2 > request.budget_tokens:
        return []
    cited = {s for items in sections.values() for item in items for s in item.sources}
    return [
        f"the previous summary's constraint {item.text[:60]!r} (sources {item.sources[:5]}) "
        "is missing: keep it with its sources"
        for item in kept
        if not set(item.sources) & cited
    ]


def _newest_source(item: SummaryItem) -> int:
    return max(item.sources, default=0)


def _fit_budget(
    sections: dict[str, list[SummaryItem]], request: SummaryRequest
) -> dict[str, list[SummaryItem]]:
    """Drop items, least important and oldest first, until the render fits."""
    out = {name: list(items) for name, items in sections.items()}
    order: list[tuple[str, SummaryItem]] = []
    for name in _DROP_ORDER:
        order.extend((name, item) for item in sorted(out.get(name, []), key=_newest_source))
    constraints = sorted(out.get("constraints", []), key=_newest_source)
    order.extend(("constraints", i) for i in constraints if i.status != "current")
    order.extend(("constraints", i) for i in constraints if i.status == "current")
    for name, item in order:
        if request.count_tokens(Summary(sections=out).render()) <= request.budget_tokens:
            break
        out[name] = [i for i in out[name] if i is not item]
    return {name: items for name, items in out.items() if items}
