"""What an OpenAI-compatible endpoint says about itself: is it there, does it serve the
configured model, how large is its context window.

`ctxd serve` and `ctxd config` probe the endpoint once so a wrong `base_url`, a model
that is not loaded or a server that is down is said at start, in words, instead of
surfacing as the first failed compaction. The summarizer reads the context window the
same way: vLLM lists `max_model_len` with each model, llama.cpp's `llama-server` gives
`meta.n_ctx_train` there and `n_ctx` on its `/props`.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from ctxd.daemon.config import Config, OpenAISummarizerConfig
from ctxd.daemon.summarizers.llm_http import is_loopback


@dataclass
class ProbeResult:
    endpoint: str
    reachable: bool = False
    models: list[str] = field(default_factory=list)
    # the window the endpoint reports for the model, when it reports one
    context_window: int | None = None
    # what is wrong, in one sentence; "" when nothing is
    problem: str = ""

    @property
    def ok(self) -> bool:
        return not self.problem

    def line(self) -> str:
        if self.ok:
            window = f", context window {self.context_window}" if self.context_window else ""
            return f"summarizer endpoint {self.endpoint}: ok ({len(self.models)} models{window})"
        return f"summarizer endpoint {self.endpoint}: {self.problem}"


def _plain(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc.rsplit("@", 1)[-1], parts.path, "", ""))


def _window_of(entry: dict[str, Any]) -> int | None:
    for key in ("max_model_len", "context_length", "context_window"):
        value = entry.get(key)
        if isinstance(value, int) and value > 0:
            return value
    meta = entry.get("meta")
    if isinstance(meta, dict):
        value = meta.get("n_ctx")
        if isinstance(value, int) and value > 0:
            return value
    return None


def _trained_window(entry: dict[str, Any]) -> int | None:
    """llama-server's `meta.n_ctx_train`: what the model was trained on, an upper bound
    only (the server may run a smaller window, which its /props says)."""
    meta = entry.get("meta")
    value = meta.get("n_ctx_train") if isinstance(meta, dict) else None
    return value if isinstance(value, int) and value > 0 else None


def probe(
    config: OpenAISummarizerConfig, *, timeout: float = 3.0, api_key: str = ""
) -> ProbeResult:
    """GET {base_url}/models (and llama.cpp's /props); never raises."""
    base = config.base_url.rstrip("/")
    result = ProbeResult(endpoint=_plain(base))
    host = urlsplit(base).hostname or ""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx.Client(
            timeout=timeout, trust_env=not is_loopback(host), follow_redirects=False
        ) as client:
            response = client.get(base + "/models", headers=headers)
            result.reachable = True
            if response.status_code == 404:
                result.problem = (
                    "GET /models answered HTTP 404: check openai.base_url (it usually ends in /v1)"
                )
                return result
            if response.status_code in (401, 403):
                result.problem = (
                    f"GET /models answered HTTP {response.status_code}: the API key in "
                    f"${config.api_key_env} is missing or refused"
                )
                return result
            if response.status_code >= 400:
                result.problem = f"GET /models answered HTTP {response.status_code}"
                return result
            entries = _entries(response)
            result.models = [str(e.get("id")) for e in entries if e.get("id")]
            chosen = next((e for e in entries if e.get("id") == config.model), None)
            if chosen is None and len(entries) == 1 and not config.model:
                chosen = entries[0]
            if chosen is not None:
                result.context_window = _window_of(chosen)
            if result.context_window is None:
                result.context_window = _props_window(client, base)
            if result.context_window is None and chosen is not None:
                result.context_window = _trained_window(chosen)
    except httpx.HTTPError as exc:
        result.problem = f"unreachable ({type(exc).__name__}: {str(exc)[:200] or 'no answer'})"
        return result
    if config.model and config.model not in result.models:
        listed = ", ".join(result.models[:8]) or "none"
        result.problem = (
            f"the model {config.model!r} is not listed by GET /models (listed: {listed}); "
            "check openai.model"
        )
    return result


def _entries(response: httpx.Response) -> list[dict[str, Any]]:
    with contextlib.suppress(ValueError):
        data = response.json()
        listed = data.get("data") if isinstance(data, dict) else None
        if isinstance(listed, list):
            return [e for e in listed if isinstance(e, dict)]
    return []


def _props_window(client: httpx.Client, base: str) -> int | None:
    """llama-server's /props (at the root, beside /v1)."""
    root = base.removesuffix("/v1")
    with contextlib.suppress(httpx.HTTPError, ValueError, AttributeError):
        response = client.get(root + "/props")
        if response.status_code == 200:
            data = response.json()
            settings = data.get("default_generation_settings") or {}
            value = settings.get("n_ctx") or data.get("n_ctx")
            if isinstance(value, int) and value > 0:
                return value
    return None


def summarizer_report(config: Config, *, timeout: float = 3.0) -> tuple[bool, str]:
    """(ok, one line) on the configured summarizer, probing a model endpoint: what
    `ctxd serve` prints at start and `ctxd config` prints after the configuration."""
    if config.summarizer != "openai":
        return True, f"summarizer: {config.summarizer}"
    oa = config.openai
    key = os.environ.get(oa.api_key_env, "").strip() if oa.api_key_env else ""
    found = probe(oa, timeout=timeout, api_key=key)
    name = f"openai:{oa.model or 'default'}"
    if found.ok:
        return True, f"summarizer: {name}; {found.line()}"
    then = (
        "compactions use the built-in summarizer until it answers (fallback = \"builtin\")"
        if oa.fallback == "builtin"
        else "compactions will fail (fallback is off)"
    )
    return False, f"summarizer: {name}; {found.line()}; {then}"
