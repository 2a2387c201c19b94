"""The model summarizer's HTTP client (httpx) against the real loopback fake endpoint.

Retries on 429 and 503 honouring `Retry-After`, proxies from the environment (never for
loopback), keep-alive and the bound on a decompressed answer. Nothing is patched: the
summarizer talks to `fake_llm.FakeLLM` over a socket.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from fake_llm import FakeLLM
from test_openai_summarizer import KEY_ENV, given_ids, request, settings, summarize

from ctxd.daemon.summarizers import OpenAISummarizer, SummarizerError
from ctxd.daemon.summarizers.llm_http import is_loopback, retry_after_seconds

PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        yield server


def summarizer(base_url: str, **kw: Any) -> OpenAISummarizer:
    kw.setdefault("backoff_seconds", 0.01)
    return OpenAISummarizer(settings(base_url), **kw)


def test_429_waits_as_long_as_retry_after_says_then_succeeds(llm: FakeLLM) -> None:
    llm.retry_after = "1"
    llm.script("http429", "good")
    req = request()
    summary = summarize(summarizer(llm.base_url), req)
    assert summary.all_sources() == given_ids(req)
    assert len(llm.requests) == 2
    # the own backoff is 10 ms: only Retry-After explains a second's wait
    assert llm.requests[1].at - llm.requests[0].at >= 1.0


def test_503_without_retry_after_is_retried_with_backoff_then_reported(llm: FakeLLM) -> None:
    llm.script("http503", "good")
    summary = summarize(summarizer(llm.base_url), request())
    assert summary.sections and len(llm.requests) == 2

    llm.default = "http503"
    with pytest.raises(SummarizerError) as err:
        summarize(summarizer(llm.base_url, retries=2), request())
    assert str(err.value) == (
        f"{llm.base_url}/chat/completions: HTTP 503: The server is overloaded"
    )
    assert len(llm.requests) == 2 + 3  # the first try and two retries


def test_retry_after_longer_than_allowed_is_reported_without_waiting(llm: FakeLLM) -> None:
    llm.retry_after = "3600"
    llm.default = "http429"
    with pytest.raises(SummarizerError) as err:
        summarize(summarizer(llm.base_url), request())
    assert "HTTP 429: Rate limit reached (Retry-After: 3600)" in str(err.value)
    assert len(llm.requests) == 1


def test_500_is_not_retried(llm: FakeLLM) -> None:
    # once the endpoint has answered, its structured output form is known, and a 500 is
    # the model failing on this prompt: not retried, not put down to the schema
    client = summarizer(llm.base_url)
    summarize(client, request())
    llm.default = "http500"
    with pytest.raises(SummarizerError):
        summarize(client, request())
    assert len(llm.requests) == 2


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after_seconds("7") == 7.0
    assert retry_after_seconds(None) is None and retry_after_seconds("soon") is None
    date = "Wed, 21 Oct 2015 07:28:00 GMT"
    assert retry_after_seconds(date, now=1445412480 - 30) == 30.0
    assert retry_after_seconds(date, now=1445412480 + 30) == 0.0


def test_gzip_answer_is_decoded(llm: FakeLLM) -> None:
    llm.default = "gzip"
    req = request()
    assert summarize(summarizer(llm.base_url), req).all_sources() == given_ids(req)


def test_gzip_bomb_stops_at_the_bound_and_the_next_answer_is_read() -> None:
    # 64 MiB of zeros in about 64 KiB on the wire; the client keeps at most 1 MiB
    with FakeLLM(bomb_bytes=64 << 20) as llm:
        s = summarizer(llm.base_url, max_response_bytes=1 << 20)
        llm.script("gzip_bomb")
        with pytest.raises(SummarizerError) as err:
            summarize(s, request())
        assert "larger than 1048576 bytes decompressed" in str(err.value)
        req = request()
        assert summarize(s, req).all_sources() == given_ids(req)


def test_requests_of_one_compaction_share_a_kept_alive_connection(llm: FakeLLM) -> None:
    llm.script("malformed", "good")  # a retry: two requests in one summary
    summarize(summarizer(llm.base_url), request())
    assert len(llm.requests) == 2
    assert llm.requests[0].client_port == llm.requests[1].client_port


def test_proxy_from_the_environment_is_used_for_a_remote_endpoint(
    llm: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fake answers absolute-form requests, so it is the proxy; the name never resolves.
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{llm.port}")
    req = request()
    summary = summarize(summarizer("http://llm.invalid/v1"), req)
    assert summary.all_sources() == given_ids(req)
    assert llm.requests[0].target == "http://llm.invalid/v1/chat/completions"

    # NO_PROXY is honoured: the name is then looked up and fails
    monkeypatch.setenv("NO_PROXY", "llm.invalid")
    with pytest.raises(SummarizerError) as err:
        summarize(summarizer("http://llm.invalid/v1"), request())
    assert "request failed" in str(err.value)
    assert len(llm.requests) == 1


def test_loopback_is_never_proxied(llm: FakeLLM, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{dead}")
    req = request()
    assert summarize(summarizer(llm.base_url), req).all_sources() == given_ids(req)
    assert llm.requests[0].target == f"{llm.prefix}/v1/chat/completions"
    assert is_loopback("127.0.0.1") and is_loopback("[::1]") and is_loopback("localhost")
    assert not is_loopback("10.0.0.1") and not is_loopback("llm.invalid")


def test_one_summarizer_serves_several_event_loops(llm: FakeLLM) -> None:
    s = summarizer(llm.base_url)
    for _ in range(3):
        asyncio.run(s.summarize(request()))
    assert len(llm.requests) == 3
