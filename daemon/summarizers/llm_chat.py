"""One chat completion request: the payload, the options a server turns down, and the
structured output forms tried in turn (see `llm_schema`)."""

from __future__ import annotations

import logging
import os
import ssl
import zlib
from typing import Any

import httpx

from ctxd.daemon.config import OpenAISummarizerConfig
from ctxd.daemon.summarizers.llm_http import (
    LLMHTTP,
    RETRY_STATUSES,
    IdleTimeout,
    SummarizerError,
    _error_detail,
    _HTTPError,
    _read_choice,
    _redact,
)
from ctxd.daemon.summarizers.llm_schema import (
    ACCEPTED_FORMS,
    FORMS,
    is_format_refusal,
    next_form,
    response_format,
)

log = logging.getLogger("ctxd.summarizer.openai")


class ChatCompletions:
    """`POST {base_url}/chat/completions`, streamed, for one summarizer."""

    def __init__(
        self,
        config: OpenAISummarizerConfig,
        url: str,
        endpoint: str,
        *,
        ssl_context: ssl.SSLContext | None,
        max_response_bytes: int,
        retries: int,
        backoff_seconds: float,
        max_retry_wait: float,
    ) -> None:
        self.config = config
        self.url = url
        # the URL without credentials, for messages
        self.endpoint = endpoint
        self._http: LLMHTTP | None = None
        self._http_error = ""
        try:
            self._http = LLMHTTP(
                url,
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

    def _payload(
        self, messages: list[dict[str, str]], form: str, schema: dict[str, Any], max_tokens: int
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {"messages": messages, "stream": True}
        if self.config.model:
            payload["model"] = self.config.model
        if "temperature" not in self._dropped:
            payload["temperature"] = self.config.temperature
        payload[self._max_tokens_key] = max_tokens
        fmt = response_format(form, schema)
        if fmt is not None:
            payload["response_format"] = fmt
        return payload

    def _adapt(self, status: int, detail: str) -> bool:
        """Drop or rename the option a server rejected; False when there is none."""
        if status not in (400, 422):
            return False
        low = detail.lower()
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

    async def complete(
        self, messages: list[dict[str, str]], schema: dict[str, Any], max_tokens: int
    ) -> tuple[str, str | None]:
        """The model's answer text and finish reason."""
        key_name = self.config.api_key_env
        key = os.environ.get(key_name, "").strip() if key_name else ""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        timeout = self.config.timeout_seconds
        idle = self.config.idle_timeout_seconds
        if self._http is None:
            raise SummarizerError(f"{self.endpoint}: request failed: {self._http_error}")
        model = self.config.model
        form = ACCEPTED_FORMS.get(self.url, model)
        # a form that once worked here is known; an error to it is not the form's fault
        known = ACCEPTED_FORMS.known(self.url, model)
        for _ in range(6):
            try:
                response = await self._http.post_json(
                    self._payload(messages, form, schema, max_tokens),
                    headers,
                    timeout=timeout,
                    idle_timeout=idle,
                )
            except IdleTimeout:
                raise SummarizerError(
                    f"{self.endpoint}: the answer stopped: no token for {idle:g} s "
                    "(idle_timeout_seconds)"
                ) from None
            except TimeoutError:
                raise SummarizerError(
                    f"{self.endpoint}: no answer within {timeout:g} s (timeout_seconds)"
                ) from None
            except (OSError, _HTTPError, httpx.HTTPError, ValueError, zlib.error) as exc:
                cause = _redact(f"{type(exc).__name__}: {exc}", key)
                raise SummarizerError(f"{self.endpoint}: request failed: {cause}") from None
            if 200 <= response.status < 300:
                ACCEPTED_FORMS.set(self.url, model, form)
                return _read_choice(response.body, self.endpoint, key)
            detail = _redact(_error_detail(response.body), key)
            if self._adapt(response.status, detail):
                log.info("%s: HTTP %d (%s); retrying without that option",
                         self.endpoint, response.status, detail[:120])
                continue
            if known and response.status in (400, 422) and is_format_refusal(
                response.status, detail
            ):
                # the form this endpoint once took is now refused by name: another server
                # or model answers there now, so its forms are learnt again
                log.info("%s: HTTP %d to response_format %s it took before (%s); trying "
                         "the forms again", self.endpoint, response.status, form, detail[:120])
                ACCEPTED_FORMS.forget(self.url, model)
                known = False
                form = FORMS[0] if form != FORMS[0] else next_form(form) or form
                continue
            following = next_form(form)
            if following and not known and is_format_refusal(response.status, detail):
                log.info("%s: HTTP %d to response_format %s (%s); trying %s",
                         self.endpoint, response.status, form, detail[:120], following)
                form = following
                continue
            hint = ""
            if response.status in RETRY_STATUSES and "retry-after" in response.headers:
                hint = f" (Retry-After: {response.headers['retry-after'][:40]})"
            if response.status == 404:
                hint = " (check openai.base_url: it usually ends in /v1)"
            raise SummarizerError(f"{self.endpoint}: HTTP {response.status}: {detail}{hint}")
        raise SummarizerError(f"{self.endpoint}: the server rejected every request option")
