"""Summarizers, and the one the configuration asks for.

The names below load on first use: the importers (and so the agent hooks, which must
start fast) read `summarizers.boilerplate` alone, without the model client and its HTTP
stack that `choice` brings in.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "BuiltinSummarizer",
    "FallbackSummarizer",
    "OpenAISummarizer",
    "SummarizerError",
    "make_summarizer",
    "summarizer_status",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("ctxd.daemon.summarizers.choice"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
