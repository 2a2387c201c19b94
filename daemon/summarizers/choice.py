"""The summarizer the configuration asks for, with its fallback, and its status."""

from __future__ import annotations

import logging
import time
from typing import Any

from ctxd.daemon.config import Config
from ctxd.daemon.summarizers.builtin import BuiltinSummarizer
from ctxd.daemon.summarizers.openai import OpenAISummarizer, SummarizerError
from ctxd.daemon.summary import Summarizer, Summary, SummaryRequest, as_taken

__all__ = [
    "BuiltinSummarizer",
    "FallbackSummarizer",
    "OpenAISummarizer",
    "SummarizerError",
    "make_summarizer",
    "summarizer_status",
]

log = logging.getLogger("ctxd.summarizer")


class FallbackSummarizer:
    """`primary`, and `fallback` when it fails.

    A compaction that falls back still shrinks the context; the summary says which
    summarizer wrote it and why, e.g. "builtin (fallback: <reason>)".
    """

    def __init__(self, primary: Summarizer, fallback: Summarizer) -> None:
        self.primary = primary
        self.fallback = fallback
        self.name = f"{primary.name} (fallback {fallback.name})"
        # the size limit reaches each summarizer as it can take it (see summarize)
        self.honours_size_limit = True
        # (time.time(), message) of the primary's last failure, for `ctxd status`
        self.last_failure: tuple[float, str] | None = None

    async def summarize(self, request: SummaryRequest) -> Summary:
        try:
            return await self.primary.summarize(as_taken(self.primary, request))
        except Exception as exc:  # any failure of the primary, not only SummarizerError
            reason = str(exc) or type(exc).__name__
            if not isinstance(exc, SummarizerError):
                reason = f"{type(exc).__name__}: {reason}"
            self.last_failure = (time.time(), reason)
            log.warning("summarizer %s failed, using %s: %s",
                        self.primary.name, self.fallback.name, reason)
        summary = await self.fallback.summarize(as_taken(self.fallback, request))
        summary.summarizer = f"{self.fallback.name} (fallback: {reason[:300]})"
        return summary


def summarizer_status(summarizer: Summarizer) -> dict[str, Any]:
    """The summarizer in use and its last failure, as `context/status` reports them."""
    failure = getattr(summarizer, "last_failure", None)
    return {
        "summarizer": getattr(summarizer, "name", type(summarizer).__name__),
        "summarizerLastFailureAt": failure[0] if failure else None,
        "summarizerLastFailure": failure[1][:500] if failure else None,
    }


def make_summarizer(config: Config) -> Summarizer:
    """The summarizer `config.summarizer` names, with its fallback if one is set."""
    if config.summarizer == "builtin":
        return BuiltinSummarizer()
    if config.summarizer == "openai":
        primary = OpenAISummarizer(config.openai)
        if config.openai.fallback == "builtin":
            return FallbackSummarizer(primary, BuiltinSummarizer())
        if config.openai.fallback:
            raise ValueError(
                f"openai.fallback must be 'builtin' or empty, not {config.openai.fallback!r}"
            )
        return primary
    raise ValueError(f"summarizer must be 'builtin' or 'openai', not {config.summarizer!r}")
