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

HTTP goes through httpx (`llm_http.LLMHTTP`): keep-alive, retries with backoff on 429
and 502/503/504 honouring `Retry-After`, proxies from the environment (never for a
loopback endpoint) and a bound on the decompressed answer.
"""
from __future__ import annotations

import logging
import os
import ssl
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from ctxd.daemon.config import OpenAISummarizerConfig
from ctxd.daemon.summarizers.contract import contract_problems, reference
from ctxd.daemon.summarizers.llm_http import (
    LLMHTTP,
    RETRY_STATUSES,
    SummarizerError,
    _error_detail,
    _HTTPError,
    _read_choice,
    _redact,
)
from ctxd.daemon.summarizers.llm_prompt import (
    build_prompt,
    format_messages,
    parse_json_object,
    read_sections,
    trim_middle,
)
from ctxd.daemon.summary import SECTIONS, Summary, SummaryItem, SummaryRequest

log = logging.getLogger("ctxd.summarizer.openai")


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
        max_response_bytes: int = 32 * 1024 * 1024,
        retries: int = 3,
        backoff_seconds: float = 0.5,
        max_retry_wait: float = 30.0,
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
        self._http: LLMHTTP | None = None
        self._http_error = ""
        try:
            self._http = LLMHTTP(
                self.url,
                ssl_context=ssl_context,
                max_bytes=max_response_bytes,
                retries=retries,
                backoff_seconds=backoff_seconds,
                max_retry_wait=max_retry_wait,
            )
        except _HTTPError as exc:  # reported on the first summary, like a refused connection
            self._http_error = str(exc)
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
        if self._http is None:
            raise SummarizerError(f"{self.endpoint}: request failed: {self._http_error}")
        for _ in range(4):
            try:
                response = await self._http.post_json(
                    self._payload(messages), headers, timeout=timeout
                )
            except TimeoutError:
                raise SummarizerError(
                    f"{self.endpoint}: no answer within {timeout:g} s (timeout_seconds)"
                ) from None
            except (OSError, _HTTPError, httpx.HTTPError, ValueError, zlib.error) as exc:
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
            if response.status in RETRY_STATUSES and "retry-after" in response.headers:
                hint = f" (Retry-After: {response.headers['retry-after'][:40]})"
            if response.status == 404:
                hint = " (check openai.base_url: it usually ends in /v1)"
            raise SummarizerError(f"{self.endpoint}: HTTP {response.status}: {detail}{hint}")
        raise SummarizerError(f"{self.endpoint}: the server rejected every request option")


# Room a retry adds to the conversation: the trimmed bad answer and the problems.
_RETRY_RESERVE = 600
# Never fewer tokens of messages per request than this, whatever the window says.
_MIN_ROOM = 256


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
