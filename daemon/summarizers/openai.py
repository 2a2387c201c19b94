"""A summarizer backed by an OpenAI-compatible chat completions endpoint.

It speaks plain `POST {base_url}/chat/completions`, the one API that OpenAI, Ollama,
llama.cpp's server and vLLM all serve. The summary's JSON Schema goes as
`response_format` (structured output: even a small model answers in the contract's
shape), in the first of the forms of `llm_schema` the endpoint accepts, and the format
is spelled out in the prompt for servers that take none. The answer is streamed:
`max_tokens` is derived from the summary budget, and the request fails when no token
comes for `idle_timeout_seconds`, however long a steady answer takes.

With `with_extractor` (the default) the built-in extractor reads the same messages and
`merge` combines both: the model adds goals, decisions and open items, and cannot lose a
rule, an artifact, a path or a pointer. Without it the answer is the whole summary,
parsed tolerantly (code fences, prose around the object, reasoning blocks, trailing
commas) and then checked strictly: known sections, items with text and sources, only
ids that were shown, within the budget. A bad answer gets one retry with its problems
named; a second bad answer is a `SummarizerError`, and the engine leaves the context
untouched (or the fallback summarizes).

Input larger than the model's window (the smaller of `context_window_tokens` and what
the endpoint reports) is summarized in chunks, oldest first, each chunk anchored on the
summary so far, so a long history never makes compaction fail.

HTTP goes through httpx (`llm_http.LLMHTTP`): keep-alive, retries with backoff on 429
and 502/503/504 honouring `Retry-After`, proxies from the environment (never for a
loopback endpoint) and a bound on the decompressed answer.
"""
from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ctxd.daemon.config import OpenAISummarizerConfig
from ctxd.daemon.messages import message_id
from ctxd.daemon.summarizers.builtin import BuiltinSummarizer
from ctxd.daemon.summarizers.contract import contract_problems, reference
from ctxd.daemon.summarizers.llm_chat import ChatCompletions
from ctxd.daemon.summarizers.llm_fit import (
    MIN_ROOM,
    RETRY_RESERVE,
    fit_budget,
    fit_text,
    lost_constraints,
)
from ctxd.daemon.summarizers.llm_http import (
    SummarizerError,
)
from ctxd.daemon.summarizers.llm_probe import probe
from ctxd.daemon.summarizers.llm_prompt import (
    build_model_prompt,
    build_prompt,
    format_messages,
    parse_json_object,
    read_sections,
)
from ctxd.daemon.summarizers.llm_prompt import trim_middle as trim_middle  # re-exported
from ctxd.daemon.summarizers.llm_schema import (
    MODEL_SECTIONS,
    summary_schema,
)
from ctxd.daemon.summarizers.merge import (
    describe,
    merge,
    model_items,
    origin_counts,
    read_answer,
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
        self._chat = ChatCompletions(
            config,
            self.url,
            self.endpoint,
            ssl_context=ssl_context,
            max_response_bytes=max_response_bytes,
            retries=retries,
            backoff_seconds=backoff_seconds,
            max_retry_wait=max_retry_wait,
        )
        # (time.time(), message) of the last failure, for `ctxd status`
        self.last_failure: tuple[float, str] | None = None
        # the window the endpoint reports, read once (None: it reports none)
        self._reported_window: int | None = None
        self._window_read = False
        self._extractor = BuiltinSummarizer()
        self._full_schema = summary_schema()
        self._model_schema = summary_schema(MODEL_SECTIONS, full_items=False)

    @property
    def honours_size_limit(self) -> bool:
        """Beside the extractor, the merged summary is fitted to `size_limit_tokens` as
        the built-in one is: the user's rules in force whole past it, the rest within
        it. A model alone gets the limit as a smaller budget instead."""
        return self.config.with_extractor

    # ------------------------------------------------------------ public API

    async def summarize(self, request: SummaryRequest) -> Summary:
        try:
            return await self._summarize(request)
        except Exception as exc:
            self.last_failure = (time.time(), str(exc) or type(exc).__name__)
            raise

    @property
    def context_window(self) -> int:
        reported = self._reported_window
        configured = self.config.context_window_tokens
        return min(configured, reported) if reported else configured

    async def _read_window(self) -> None:
        if self._window_read:
            return
        self._window_read = True
        env = self.config.api_key_env
        key = os.environ.get(env, "").strip() if env else ""
        found = await asyncio.to_thread(probe, self.config, timeout=3.0, api_key=key)
        self._reported_window = found.context_window
        if found.context_window:
            log.info("%s: the endpoint reports a context window of %d tokens",
                     self.endpoint, found.context_window)

    async def _summarize(self, request: SummaryRequest) -> Summary:
        previous = request.previous
        if request.budget_tokens <= 0:
            return self._finish(request, previous, {}, [])
        blocks = format_messages(request.messages, self.max_tool_chars)
        if not blocks:
            return self._finish(request, previous, previous.sections, [])
        await self._read_window()
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
                    self.context_window,
                )
            numbered = part if (part > 1 or pending) else None
            summary = await self._summarize_chunk(
                request, summary, chunk, numbered, last=not pending
            )
        return summary

    # ------------------------------------------------------------- chunking

    def _target_tokens(self, request: SummaryRequest) -> int:
        # The JSON answer is longer than the rendered text; asking for a rendered size
        # the output limit cannot hold would get a cut-off answer. Beside the extractor
        # the model's share is half the budget.
        budget = request.budget_tokens
        if self.config.with_extractor:
            # the size limit bounds the merged summary: the model is asked for its half
            limit = request.size_limit_tokens
            if limit is not None:
                budget = min(budget, limit)
            budget //= 2
        return max(50, min(budget, int(self.config.max_output_tokens * 0.7)))

    def _max_tokens(self, request: SummaryRequest) -> int:
        """The answer's bound: the target as JSON (about 1.5 tokens of JSON per token of
        rendered text, plus the frame), never more than `max_output_tokens`."""
        wanted = int(self._target_tokens(request) * 1.5) + 100
        return max(64, min(self.config.max_output_tokens, wanted))

    def _prompt(
        self, request: SummaryRequest, anchor: Summary, blocks: list[str], part: int | None
    ) -> list[dict[str, str]]:
        build = build_model_prompt if self.config.with_extractor else build_prompt
        extra = {"sections": MODEL_SECTIONS} if self.config.with_extractor else {}
        return build(
            previous=anchor,
            pins=request.pins,
            instructions=request.instructions,
            blocks=blocks,
            target_tokens=self._target_tokens(request),
            part=part,
            **extra,  # type: ignore[arg-type]
        )

    def _room(self, request: SummaryRequest, anchor: Summary) -> int:
        """Tokens left for message text in one request anchored on `anchor`."""
        prompt = self._prompt(request, anchor, [], 1)
        overhead = sum(request.count_tokens(m["content"]) + 4 for m in prompt) + 3
        # The server's tokenizer is not ours: keep a tenth in reserve. A retry appends
        # the bad answer (trimmed) and the list of its problems.
        window = int(self.context_window * 0.9)
        room = window - overhead - self._max_tokens(request) - RETRY_RESERVE
        if room < MIN_ROOM:
            log.warning(
                "%s: the prompt and previous summary leave %d tokens of a %d-token window "
                "for messages; using %d, which may exceed the window",
                self.endpoint,
                room,
                self.context_window,
                MIN_ROOM,
            )
            room = MIN_ROOM
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
                chunk.append((mid, fit_text(text, room, count)))
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
        last: bool = True,
    ) -> Summary:
        ids = [mid for mid, _ in chunk if mid is not None]
        if self.config.with_extractor:
            return await self._summarize_beside_extractor(
                request, anchor, chunk, ids, part, last
            )
        allowed = anchor.all_sources() | set(ids)
        messages = self._prompt(request, anchor, [text for _, text in chunk], part)
        verdict = _Verdict()
        # the built-in reading of the same messages: what the answer is held to
        ref = reference(request, anchor, ids)
        for attempt in (1, 2):
            content, finish_reason = await self._complete(
                messages, self._full_schema, self._max_tokens(request)
            )
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
                    fit_text(content, RETRY_RESERVE // 2, request.count_tokens)
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
            sections = fit_budget(verdict.sections, request)
            log.warning("%s: the summary was over budget twice; dropped items", self.endpoint)
            return self._finish(request, anchor, sections, ids, ref)
        raise SummarizerError(
            f"{self.endpoint}: the model's summary was invalid twice: "
            + "; ".join(verdict.problems[:5])
        )

    async def _summarize_beside_extractor(
        self,
        request: SummaryRequest,
        anchor: Summary,
        chunk: list[tuple[int | None, str]],
        ids: list[int],
        part: int | None,
        last: bool = True,
    ) -> Summary:
        """The extractor's summary of the chunk with the model's items merged in; the
        last chunk's within the request's size limit too."""
        limit = request.size_limit_tokens if last else None
        messages = self._prompt(request, anchor, [text for _, text in chunk], part)
        content, finish_reason = await self._complete(
            messages, self._model_schema, self._max_tokens(request)
        )
        obj = read_answer(content)
        if obj is None:
            cut = " (cut off at max_tokens)" if finish_reason == "length" else ""
            text = content.strip()
            shown = (text if len(text) <= 240 else f"{text[:120]} … {text[-120:]}") or (
                "an empty answer"
            )
            raise SummarizerError(
                f"{self.endpoint}: the answer holds no JSON summary{cut}: {shown!r}"
            )
        wanted = set(ids)
        span_messages = [m for m in request.messages if message_id(m) in wanted]
        extracted = self._extractor.summarize_sync(
            SummaryRequest(
                session_id=request.session_id,
                previous=anchor,
                messages=span_messages,
                pins=list(request.pins),
                instructions=request.instructions,
                budget_tokens=request.budget_tokens,
                count_tokens=request.count_tokens,
                ordinals=dict(request.ordinals),
                size_limit_tokens=limit,
            )
        )
        ref = reference(request, anchor, ids)
        evidence = "\n".join(text for _, text in chunk) + "\n" + anchor.render()
        found = model_items(obj, ids, anchor, evidence)
        merged = merge(extracted, found, request, anchor, ref, ids, limit)
        summary = self._finish(request, anchor, merged.sections, ids, ref)
        summary.supersessions = {**extracted.supersessions, **summary.supersessions}
        counts = origin_counts(summary)
        summary.summarizer = f"{self.name} + builtin {describe(counts)}"
        log.info("%s: merged summary of %d messages, items by origin %s",
                 self.endpoint, len(ids), describe(counts))
        return summary

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
        problems += lost_constraints(anchor, sections, request)
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

    async def _complete(
        self, messages: list[dict[str, str]], schema: dict[str, Any], max_tokens: int
    ) -> tuple[str, str | None]:
        return await self._chat.complete(messages, schema, max_tokens)
