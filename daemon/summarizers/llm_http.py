"""The HTTP client a model summarizer posts with, on httpx.

One `LLMHTTP` per summarizer keeps a connection pool per event loop (keep-alive between
the requests of a compaction and across compactions), retries 429 and 502/503/504 with
backoff, honouring `Retry-After`, takes proxy settings from the environment (HTTP_PROXY,
HTTPS_PROXY, ALL_PROXY, NO_PROXY) except for loopback endpoints, which are never proxied,
and bounds the response body after decompression so a gzip bomb cannot exhaust memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import ipaddress
import json
import logging
import random
import ssl
import time
import zlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from ctxd.daemon.messages import content_text

log = logging.getLogger("ctxd.summarizer.http")


class SummarizerError(Exception):
    """The endpoint failed, or answered twice with an unusable summary.

    The message names the endpoint and the cause; it never contains the API key.
    """


# ---------------------------------------------------------------------------- HTTP


@dataclass
class _Response:
    status: int
    headers: dict[str, str]
    body: bytes


class _HTTPError(Exception):
    pass


class IdleTimeout(TimeoutError):
    """A streamed answer stopped: no token for `idle_timeout` seconds."""


# Statuses that say "later" rather than "no": overload, rate limits, a gateway between us
# and the model. A plain 500 is not retried: it is usually the model failing on this very
# prompt, and the same prompt fails again.
RETRY_STATUSES = frozenset({429, 502, 503, 504})


def is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """`Retry-After` as seconds from now: delta-seconds or an HTTP date; None if absent."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    with contextlib.suppress(TypeError, ValueError, IndexError):
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - (time.time() if now is None else now))
    return None


class LLMHTTP:
    """POSTs JSON to one URL; a summarizer holds one."""

    def __init__(
        self,
        url: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        max_bytes: int = 32 * 1024 * 1024,
        retries: int = 3,
        backoff_seconds: float = 0.5,
        max_retry_wait: float = 30.0,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            raise _HTTPError(f"unsupported URL {url!r}: expected http:// or https://")
        self.url = url
        self.ssl_context = ssl_context
        self.max_bytes = max_bytes
        self.retries = retries
        self.backoff_seconds = backoff_seconds
        self.max_retry_wait = max_retry_wait
        # A local model server is reached directly even when the environment names a
        # proxy for everything else (NO_PROXY rarely lists 127.0.0.1 and ::1).
        self.trust_env = not is_loopback(parts.hostname)
        self._clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            # A pool belongs to the loop it was opened on; pools of closed loops are dropped.
            for old in [lp for lp in self._clients if lp.is_closed()]:
                del self._clients[old]
            client = httpx.AsyncClient(
                verify=self.ssl_context if self.ssl_context is not None else True,
                trust_env=self.trust_env,
                # timeouts are the caller's (one asyncio deadline per attempt)
                timeout=None,
                follow_redirects=False,
                headers={"User-Agent": "ctxd"},
            )
            self._clients[loop] = client
        return client

    async def aclose(self) -> None:
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    async def post_json(
        self,
        payload: dict[str, Any],
        headers: dict[str, str],
        *,
        timeout: float,
        idle_timeout: float | None = None,
    ) -> _Response:
        """The answer to one POST, after retrying statuses that say "later".

        Each attempt is bounded by `timeout` (TimeoutError past it). The last answer is
        returned as it is when retries run out or the server asks for a longer wait than
        `max_retry_wait`.

        With `idle_timeout`, a streamed answer (`text/event-stream`) is read token by
        token: `timeout` bounds the wait for the first one (the server reads the prompt
        first), `idle_timeout` every gap after it (`IdleTimeout`), and nothing bounds
        the whole, which `max_tokens` does. The events are folded into one chat
        completion body, so callers read both kinds of answer alike.
        """
        body = json.dumps(payload, ensure_ascii=False).encode()
        head = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "Accept-Encoding": "gzip, deflate",
            **headers,
        }
        if idle_timeout is not None:
            head["Accept"] = "text/event-stream, application/json"
        attempt = 0
        while True:
            if idle_timeout is None:
                async with asyncio.timeout(timeout):
                    response = await self._once(body, head)
            else:
                response = await self._once_streamed(body, head, timeout, idle_timeout)
            if response.status not in RETRY_STATUSES or attempt >= self.retries:
                return response
            asked = retry_after_seconds(response.headers.get("retry-after"))
            if asked is not None and asked > self.max_retry_wait:
                log.warning("%s: HTTP %d asks to retry after %.0f s, longer than %.0f s",
                            self.url, response.status, asked, self.max_retry_wait)
                return response
            wait = asked
            if wait is None:
                # jittered so that many daemons behind one limit do not retry in step
                wait = self.backoff_seconds * (2**attempt) * random.uniform(0.75, 1.25)
            attempt += 1
            log.info("%s: HTTP %d; retry %d of %d in %.2f s",
                     self.url, response.status, attempt, self.retries, wait)
            await asyncio.sleep(wait)

    async def _once(self, body: bytes, head: dict[str, str]) -> _Response:
        client = self._client()
        async with client.stream("POST", self.url, content=body, headers=head) as response:
            data = await self._read_body(response)
            return _Response(
                response.status_code, {k.lower(): v for k, v in response.headers.items()}, data
            )

    async def _once_streamed(
        self, body: bytes, head: dict[str, str], first: float, idle: float
    ) -> _Response:
        client = self._client()
        deadline = asyncio.get_running_loop().time() + first
        async with contextlib.AsyncExitStack() as stack:
            async with asyncio.timeout_at(deadline):
                response = await stack.enter_async_context(
                    client.stream("POST", self.url, content=body, headers=head)
                )
            headers = {k.lower(): v for k, v in response.headers.items()}
            kind = headers.get("content-type", "").split(";")[0].strip().lower()
            if kind != "text/event-stream":
                # an error, or a server that answers in one piece despite `stream`
                async with asyncio.timeout_at(deadline + idle):
                    data = await self._read_body(response)
                return _Response(response.status_code, headers, data)
            folded = await self._read_events(response, deadline, idle)
            return _Response(response.status_code, headers, folded)

    async def _read_events(
        self, response: httpx.Response, deadline: float, idle: float
    ) -> bytes:
        """Server-sent chat completion chunks folded into one completion body."""
        loop = asyncio.get_running_loop()
        lines = response.aiter_lines()
        parts: list[str] = []
        size = 0
        finish: str | None = None
        model = ""
        started = False
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    line = await anext(lines)
            except StopAsyncIteration:
                break
            except TimeoutError:
                if started:
                    raise IdleTimeout(f"no token for {idle:g} s") from None
                raise
            line = line.strip()
            if not line.startswith("data:"):
                continue  # comments (keep-alive pings), event names, blank separators
            data = line[5:].strip()
            if data == "[DONE]":
                break
            try:
                event = json.loads(data)
                choice = (event.get("choices") or [{}])[0]
            except (ValueError, AttributeError, TypeError, IndexError):
                raise _HTTPError(f"not a chat completion stream event: {data[:200]!r}") from None
            if isinstance(event, dict) and event.get("error"):
                # some servers report a failure mid-stream as an event
                raise _HTTPError(f"the stream reported an error: {str(event['error'])[:300]}")
            model = str(event.get("model") or model)
            delta = choice.get("delta") or {}
            piece = delta.get("content") if isinstance(delta, dict) else None
            if isinstance(piece, str) and piece:
                parts.append(piece)
                size += len(piece)
                if size > self.max_bytes:
                    raise _HTTPError(f"the response is larger than {self.max_bytes} bytes")
                started = True
                deadline = loop.time() + idle
            elif started:
                deadline = loop.time() + idle
            if choice.get("finish_reason"):
                finish = str(choice["finish_reason"])
        folded = {
            "object": "chat.completion",
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(parts)},
                    "finish_reason": finish,
                }
            ],
        }
        return json.dumps(folded, ensure_ascii=False).encode()

    async def _read_body(self, response: httpx.Response) -> bytes:
        """The body, decoded, never more than `max_bytes` in memory after decompression."""
        limit = self.max_bytes
        too_large = f"the response is larger than {limit} bytes"
        length = response.headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            raise _HTTPError(too_large)
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        decoder: Any = None
        if encoding in ("gzip", "x-gzip", "deflate"):
            # wbits 47: zlib detects a gzip or zlib header by itself
            decoder = zlib.decompressobj(47)
        elif encoding not in ("", "identity"):
            raise _HTTPError(f"unsupported Content-Encoding {encoding!r}")
        out = bytearray()
        raw = 0
        # raw bytes, decoded here: httpx's own decoders have no output bound
        async for chunk in response.aiter_raw():
            raw += len(chunk)
            if raw > limit:
                raise _HTTPError(too_large)
            if decoder is None:
                out += chunk
            else:
                data = chunk
                while data:
                    out += decoder.decompress(data, limit - len(out) + 1)
                    if len(out) > limit:
                        raise _HTTPError(too_large + " decompressed")
                    data = decoder.unconsumed_tail
            if len(out) > limit:
                raise _HTTPError(too_large)
        if decoder is not None:
            out += decoder.flush()  # the input is consumed: only a tail is left
            if len(out) > limit:
                raise _HTTPError(too_large + " decompressed")
        return bytes(out)


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
