"""Streamed answers, the idle timeout, the structured output forms and the endpoint
probe, against the scripted loopback server (tests/fake_llm.py)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from fake_llm import FakeLLM
from test_openai_summarizer import given_ids, request, settings, summarize

from ctxd.daemon.summarizers import OpenAISummarizer, SummarizerError
from ctxd.daemon.summarizers.llm_probe import probe


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with FakeLLM("sse") as server:
        yield server


def test_a_streamed_answer_is_read_event_by_event(llm: FakeLLM) -> None:
    req = request()
    summary = summarize(OpenAISummarizer(settings(llm.base_url)), req)
    assert summary.all_sources() == given_ids(req)
    assert llm.requests[0].body["stream"] is True


def test_a_stalled_stream_fails_after_the_idle_timeout_not_the_total_one(llm: FakeLLM) -> None:
    llm.slow_seconds = 20
    llm.default = "sse_stall"
    config = settings(llm.base_url, timeout_seconds=30, idle_timeout_seconds=0.5)
    started = time.monotonic()
    with pytest.raises(SummarizerError) as err:
        summarize(OpenAISummarizer(config), request())
    assert "no token for 0.5 s (idle_timeout_seconds)" in str(err.value)
    # keep-alive comments do not count as tokens: it gave up long before the stall ended
    assert time.monotonic() - started < llm.slow_seconds


def test_a_slow_steady_stream_outlives_the_idle_timeout(llm: FakeLLM) -> None:
    # 40 events 0.1 s apart: 4 s in all, each gap well under the idle timeout of 1 s
    llm.default = "sse_slow_steady"
    llm.token_gap = 0.1
    config = settings(llm.base_url, timeout_seconds=1, idle_timeout_seconds=1)
    req = request()
    summary = summarize(OpenAISummarizer(config), req)
    assert summary.all_sources() == given_ids(req)


def test_a_server_refusing_json_schema_with_500_gets_the_json_object_form(llm: FakeLLM) -> None:
    llm.default = "refuse_json_schema"
    req = request()
    summary = summarize(OpenAISummarizer(settings(llm.base_url)), req)
    assert summary.all_sources() == given_ids(req)
    forms = [r.body["response_format"]["type"] for r in llm.requests]
    assert forms == ["json_schema", "json_object"]
    second = llm.requests[1].body["response_format"]
    assert second["schema"]["required"] == ["sections"]
    # remembered: the next summary sends the accepted form first
    summarize(OpenAISummarizer(settings(llm.base_url)), req)
    assert llm.requests[2].body["response_format"]["type"] == "json_object"
    assert len(llm.requests) == 3


def test_max_tokens_follows_the_summary_budget(llm: FakeLLM) -> None:
    summarizer = OpenAISummarizer(settings(llm.base_url, max_output_tokens=4000))
    summarize(summarizer, request(budget=300))
    summarize(summarizer, request(budget=3000))
    small, large = (r.body["max_tokens"] for r in llm.requests)
    assert small < large <= 4000


def test_the_window_the_endpoint_reports_bounds_the_chunks() -> None:
    # vLLM lists max_model_len with each model: a 1,024-token window splits the input
    models = [{"id": "fake-model", "object": "model", "max_model_len": 1024}]
    with FakeLLM("sse", models=models) as llm:
        summarizer = OpenAISummarizer(settings(llm.base_url, context_window_tokens=100_000))
        req = request()
        req.messages = [
            {"id": 100 + i, "role": "tool", "tool_call_id": f"c{i}", "content": "word " * 200}
            for i in range(12)
        ]
        summary = summarize(summarizer, req)
        assert summarizer.context_window == 1024
        assert len(llm.requests) > 1
        assert {m["id"] for m in req.messages} <= summary.all_sources()


def test_probe_says_what_is_wrong() -> None:
    with FakeLLM("sse") as llm:
        good = probe(settings(llm.base_url))
        assert good.ok and good.models == ["fake-model"], good.line()
        missing = probe(settings(llm.base_url, model="qwen2.5:7b"))
        assert not missing.ok
        assert "'qwen2.5:7b' is not listed" in missing.problem and "fake-model" in missing.problem
        wrong_path = probe(settings(llm.base_url.removesuffix("/v1")))
        assert "HTTP 404" in wrong_path.problem and "/v1" in wrong_path.problem
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = probe(settings(f"http://127.0.0.1:{port}/v1"), timeout=1.0)
    assert not down.reachable and down.problem.startswith("unreachable")
    assert f"127.0.0.1:{port}" in down.line()
