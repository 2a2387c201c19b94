"""The OpenAI-compatible summarizer against a real loopback HTTP server.

Nothing is patched: the summarizer's own HTTP client talks to `fake_llm.FakeLLM` over a
socket, and the server plays the good and bad behaviours of real endpoints and models.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_llm import FakeLLM
from helpers import agent_turn

from ctxd.daemon.compaction.rules import check_summary
from ctxd.daemon.config import Config, OpenAISummarizerConfig
from ctxd.daemon.engine import Engine
from ctxd.daemon.summarizers import (
    BuiltinSummarizer,
    FallbackSummarizer,
    OpenAISummarizer,
    SummarizerError,
    make_summarizer,
)
from ctxd.daemon.summarizers.openai import parse_json_object, trim_middle
from ctxd.daemon.summary import SECTIONS, Summary, SummaryItem, SummaryRequest
from ctxd.daemon.tokens import TokenCounter
from ctxd.protocol.errors import SummarizerFailed

count_tokens = TokenCounter("cl100k_base").count_text

KEY_ENV = "CTXD_TEST_SUMMARIZER_KEY"


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        yield server


@pytest.fixture(autouse=True)
def _no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)


def settings(base_url: str, **kw: Any) -> OpenAISummarizerConfig:
    """The model alone writes the summary unless a test asks for the extractor beside it:
    these tests are about what is asked of the model and how its answer is held."""
    kw.setdefault("timeout_seconds", 5.0)
    kw.setdefault("with_extractor", False)
    kw.setdefault("model", "fake-model")
    return OpenAISummarizerConfig(base_url=base_url, api_key_env=KEY_ENV, **kw)


def conversation(start: int = 10) -> list[dict[str, Any]]:
    """A short agent exchange with archive ids from `start`."""
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": "Migrate the users table to Postgres. Never drop data."},
        {"role": "assistant", "content": "I'll read the schema first.", "tool_calls": [
            {"id": "call_a", "type": "function",
             "function": {"name": "read_file", "arguments": '{"path": "db/schema.sql"}'}}]},
        {"role": "tool", "tool_call_id": "call_a",
         "content": "CREATE TABLE users (id int);\n" + "-- filler line\n" * 400 + "-- end"},
        {"role": "assistant", "content": "We'll use alembic for the migration."},
        {"role": "user", "content": "Actually, keep the table name `accounts`."},
    ]
    return [{**m, "id": start + i} for i, m in enumerate(msgs)]


ANCHOR = Summary(
    sections={
        "constraints": [SummaryItem("Use port 8080 for the dev server", [3])],
        "files": [SummaryItem("src/server.py created", [4, 5])],
    },
    covers_from=1,
    covers_to=5,
    compaction_ids=["cmp_old"],
    summarizer="openai:fake-model",
)


def request(
    messages: list[dict[str, Any]] | None = None,
    *,
    previous: Summary | None = None,
    pins: list[str] | None = None,
    instructions: str | None = None,
    budget: int = 2000,
) -> SummaryRequest:
    return SummaryRequest(
        session_id="ses_test",
        previous=previous if previous is not None else ANCHOR,
        messages=messages if messages is not None else conversation(),
        pins=pins or [],
        instructions=instructions,
        budget_tokens=budget,
        count_tokens=count_tokens,
    )


def summarize(summarizer: Any, req: SummaryRequest) -> Summary:
    return asyncio.run(summarizer.summarize(req))


def given_ids(req: SummaryRequest) -> set[int]:
    return {m["id"] for m in req.messages} | req.previous.all_sources()


# ----------------------------------------------------------------- good answers


def test_good_answer_gives_a_valid_summary_citing_given_ids(llm: FakeLLM) -> None:
    req = request()
    summary = summarize(OpenAISummarizer(settings(llm.base_url)), req)
    assert summary.summarizer == "openai:fake-model"
    assert check_summary(summary, given_ids(req)) == []
    # every leaving message and every anchor item is covered
    assert summary.all_sources() == given_ids(req)
    assert summary.sections["constraints"][0].text == "Use port 8080 for the dev server"
    assert (summary.covers_from, summary.covers_to) == (1, 14)
    assert summary.compaction_ids == ["cmp_old"]
    assert summary.render().count("[msg") == summary.item_count()
    assert len(llm.requests) == 1
    sent = llm.requests[0]
    assert sent.path == "/v1/chat/completions"
    assert sent.body["model"] == "fake-model"
    # structured output: the summary's schema, in the first form a server may take
    fmt = sent.body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
    schema = fmt["json_schema"]["schema"]
    assert schema["required"] == ["sections"]
    assert set(schema["properties"]["sections"]["properties"]) == set(SECTIONS)
    assert 64 <= sent.body["max_tokens"] <= 1500
    assert sent.body["stream"] is True


def test_fenced_json_with_prose_is_parsed_without_a_retry(llm: FakeLLM) -> None:
    llm.script("fenced")
    req = request()
    summary = summarize(OpenAISummarizer(settings(llm.base_url)), req)
    assert summary.all_sources() == given_ids(req)
    assert len(llm.requests) == 1


def test_chunked_response_body_is_read(llm: FakeLLM) -> None:
    llm.script("chunked")
    req = request()
    summary = summarize(OpenAISummarizer(settings(llm.base_url)), req)
    assert summary.all_sources() == given_ids(req)


def test_parse_json_object_tolerates_what_models_write() -> None:
    obj = {"sections": {"goals": [{"text": "x", "sources": [1]}]}}
    text = json.dumps(obj)
    assert parse_json_object(text) == obj
    assert parse_json_object(f"Here you go:\n```json\n{text}\n```\nDone.") == obj
    assert parse_json_object(f"<think>maybe {{not this}}</think>\n{text}") == obj
    assert parse_json_object(f"Sure. {text} Hope it helps {{x}}.") == obj
    assert parse_json_object('{"sections": {"goals": [{"text": "x", "sources": [1],},],}}') == obj
    assert parse_json_object("no json here {at all") is None


def test_trim_middle_says_how_much_was_left_out() -> None:
    text = "a" * 3000 + "TAIL"
    out = trim_middle(text, 1000)
    assert len(out) < 1100 and out.endswith("TAIL")
    assert "… 2004 chars omitted …" in out
    assert trim_middle("short", 1000) == "short"


# ----------------------------------------------------------------- bad answers


def test_wrong_ids_are_retried_once_with_the_problem_shown(llm: FakeLLM) -> None:
    llm.script("wrong_ids", "good")
    req = request()
    summary = summarize(OpenAISummarizer(settings(llm.base_url)), req)
    assert check_summary(summary, given_ids(req)) == []
    assert 99999 not in summary.all_sources()
    assert len(llm.requests) == 2
    retry = llm.requests[1].messages
    assert [m["role"] for m in retry] == ["system", "user", "assistant", "user"]
    assert "99999" in retry[2]["content"]  # the bad answer itself
    assert "99999" in retry[3]["content"] and "not given" in retry[3]["content"]


def test_wrong_ids_twice_is_an_error(llm: FakeLLM) -> None:
    llm.script("wrong_ids", "wrong_ids")
    with pytest.raises(SummarizerError) as err:
        summarize(OpenAISummarizer(settings(llm.base_url)), request())
    assert "99999" in str(err.value)
    assert llm.base_url in str(err.value)
    assert len(llm.requests) == 2


@pytest.mark.parametrize("behaviour", ["malformed", "truncated"])
def test_malformed_twice_is_an_error(llm: FakeLLM, behaviour: str) -> None:
    llm.default = behaviour
    with pytest.raises(SummarizerError) as err:
        summarize(OpenAISummarizer(settings(llm.base_url)), request())
    assert "no valid JSON" in str(err.value)
    assert len(llm.requests) == 2
    if behaviour == "truncated":
        assert "cut off" in llm.requests[1].messages[-1]["content"]


def test_malformed_then_good_recovers(llm: FakeLLM) -> None:
    llm.script("malformed", "good")
    req = request()
    summary = summarize(OpenAISummarizer(settings(llm.base_url)), req)
    assert summary.all_sources() == given_ids(req)
    assert len(llm.requests) == 2


def test_dropping_a_previous_constraint_is_retried(llm: FakeLLM) -> None:
    llm.script("drop_anchor", "good")
    req = request()
    summary = summarize(OpenAISummarizer(settings(llm.base_url)), req)
    assert 3 in summary.all_sources()
    assert len(llm.requests) == 2
    assert "Use port 8080" in llm.requests[1].messages[-1]["content"]


def test_over_budget_is_retried_then_cut_to_fit(llm: FakeLLM) -> None:
    llm.script("huge", "good")
    req = request(budget=300)
    summary = summarize(OpenAISummarizer(settings(llm.base_url)), req)
    assert count_tokens(summary.render()) <= 300
    assert "limit is 300" in llm.requests[1].messages[-1]["content"]

    llm.script("huge", "huge")
    summary = summarize(OpenAISummarizer(settings(llm.base_url)), req)
    rendered = count_tokens(summary.render())
    assert 0 < rendered <= 300
    # the least important items go first: the anchor's constraint survives
    assert summary.sections["constraints"][0].sources == [3]
    assert check_summary(summary, given_ids(req)) == []


# ----------------------------------------------------------------- transport


def test_timeout_is_an_error_within_about_the_timeout() -> None:
    with FakeLLM("slow", slow_seconds=10) as llm:
        start = time.monotonic()
        with pytest.raises(SummarizerError) as err:
            summarize(OpenAISummarizer(settings(llm.base_url, timeout_seconds=0.5)), request())
        elapsed = time.monotonic() - start
    assert 0.4 < elapsed < 2.0
    assert "no answer within 0.5 s" in str(err.value)
    assert llm.base_url in str(err.value)


def test_http_500_is_an_error_naming_endpoint_and_cause(llm: FakeLLM) -> None:
    llm.default = "http500"
    with pytest.raises(SummarizerError) as err:
        summarize(OpenAISummarizer(settings(llm.base_url)), request())
    assert str(err.value) == f"{llm.base_url}/chat/completions: HTTP 500: model crashed"
    # a server never heard from may be refusing the schema (llama-cpp-python answers an
    # unknown response_format with 500): each form, then the prompt alone
    assert [r.body.get("response_format", {}).get("type") for r in llm.requests] == [
        "json_schema", "json_object", None]


def test_wrong_base_url_gets_a_hint(llm: FakeLLM) -> None:
    root = llm.base_url.removesuffix("/v1")
    with pytest.raises(SummarizerError) as err:
        summarize(OpenAISummarizer(settings(root)), request())
    assert f"{root}/chat/completions: HTTP 404" in str(err.value)
    assert "ends in /v1" in str(err.value)


def test_connection_refused_is_an_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(SummarizerError) as err:
        summarize(OpenAISummarizer(settings(url)), request())
    assert url in str(err.value) and "request failed" in str(err.value)


def test_400_on_response_format_is_retried_without_it(llm: FakeLLM) -> None:
    llm.default = "reject_response_format"
    summarizer = OpenAISummarizer(settings(llm.base_url))
    req = request()
    summary = summarize(summarizer, req)
    assert summary.all_sources() == given_ids(req)
    assert len(llm.requests) == 3
    assert llm.requests[0].body["response_format"]["type"] == "json_schema"
    assert llm.requests[1].body["response_format"]["type"] == "json_object"
    assert "schema" in llm.requests[1].body["response_format"]
    assert "response_format" not in llm.requests[2].body
    assert llm.requests[0].messages == llm.requests[2].messages
    # remembered for the endpoint: the next summary goes straight to the plain request,
    # even from another summarizer in the process
    summarize(summarizer, req)
    summarize(OpenAISummarizer(settings(llm.base_url)), req)
    assert len(llm.requests) == 5
    assert "response_format" not in llm.requests[3].body
    assert "response_format" not in llm.requests[4].body


def test_options_newer_openai_models_reject_are_adapted(llm: FakeLLM) -> None:
    llm.default = "newer_openai_model"
    req = request()
    summary = summarize(OpenAISummarizer(settings(llm.base_url)), req)
    assert summary.all_sources() == given_ids(req)
    assert len(llm.requests) == 3
    last = llm.requests[-1].body
    assert "max_tokens" not in last and 64 <= last["max_completion_tokens"] <= 1500
    assert "temperature" not in last
    assert last["response_format"]["type"] == "json_schema"


def test_api_key_from_the_named_variable_reaches_the_server(
    llm: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    summarizer = OpenAISummarizer(settings(llm.base_url))
    summarize(summarizer, request())
    assert "authorization" not in llm.requests[0].headers

    monkeypatch.setenv(KEY_ENV, "sk-test-0123456789")
    summarize(summarizer, request())
    assert llm.requests[1].headers["authorization"] == "Bearer sk-test-0123456789"

    # a server echoing the key in its error does not put it in the message
    llm.script("http401")
    with pytest.raises(SummarizerError) as err:
        summarize(summarizer, request())
    assert "HTTP 401" in str(err.value)
    assert "sk-test-0123456789" not in str(err.value)
    assert "[redacted]" in str(err.value)


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=30,
    )
    return cert, key


def test_https_endpoint(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    with FakeLLM(tls=server_ctx) as llm:
        assert llm.base_url.startswith("https://")
        # the default context verifies certificates: a self-signed one is refused
        with pytest.raises(SummarizerError) as err:
            summarize(OpenAISummarizer(settings(llm.base_url)), request())
        assert "CERTIFICATE_VERIFY_FAILED" in str(err.value)
        trusting = ssl.create_default_context(cafile=str(cert))
        req = request()
        summary = summarize(OpenAISummarizer(settings(llm.base_url), ssl_context=trusting), req)
        assert summary.all_sources() == given_ids(req)
        assert llm.requests[-1].path == "/v1/chat/completions"


# ----------------------------------------------------------------- the prompt


def test_prompt_holds_anchor_pins_instructions_and_ids(llm: FakeLLM) -> None:
    req = request(
        pins=["Deploy only from the release branch."],
        instructions="focus on the database migration",
    )
    summarize(OpenAISummarizer(settings(llm.base_url)), req)
    sent = llm.requests[0]
    prompt = sent.prompt
    assert sent.anchor() == {
        "sections": {
            "constraints": [{"text": "Use port 8080 for the dev server", "sources": [3]}],
            "files": [{"text": "src/server.py created", "sources": [4, 5]}],
        }
    }
    assert "Deploy only from the release branch." in prompt
    assert "focus on the database migration" in prompt
    assert sent.ids() == [10, 11, 12, 13, 14]
    assert "[id 10] user: Migrate the users table to Postgres. Never drop data." in prompt
    assert 'tool call: read_file({"path": "db/schema.sql"}) [call_id call_a]' in prompt
    assert "[id 12] tool read_file [call_id call_a]: CREATE TABLE users" in prompt
    assert "chars omitted" in prompt and "-- end" in prompt
    assert "-- filler line\n" * 400 not in prompt
    system = sent.system
    assert "superseded" in system and '"sources"' in system
    assert "word for word" in system and "file paths" in system
    assert "Keep every item of the previous summary" in system
    for section in ("goals", "constraints", "decisions", "files", "tool_activity",
                    "errors", "open_items"):
        assert f'"{section}"' in system


def test_first_summary_says_there_is_no_anchor(llm: FakeLLM) -> None:
    summarize(OpenAISummarizer(settings(llm.base_url)), request(previous=Summary()))
    assert llm.requests[0].anchor() is None
    assert "(none: this is the first summary)" in llm.requests[0].prompt
    assert "<pinned_facts>" not in llm.requests[0].prompt
    assert "<focus>" not in llm.requests[0].prompt


# ----------------------------------------------------------------- chunking


def _long_history(n: int, start: int = 100) -> list[dict[str, Any]]:
    words = "the quick brown fox jumps over the lazy dog near src/app.py again "
    return [
        {"id": start + i, "role": "user" if i % 2 == 0 else "assistant",
         "content": f"step {i}: " + words * 8}
        for i in range(n)
    ]


def test_input_larger_than_the_window_is_summarized_in_anchored_chunks(llm: FakeLLM) -> None:
    window = 4000
    cfg = settings(llm.base_url, context_window_tokens=window, max_output_tokens=400)
    msgs = _long_history(60)
    req = request(msgs, budget=4000)
    summary = summarize(OpenAISummarizer(cfg), req)

    requests = llm.requests
    assert len(requests) >= 3
    seen: list[int] = []
    for i, rec in enumerate(requests):
        ids = rec.ids()
        assert ids, "every chunk carries messages"
        seen.extend(ids)
        # each request fits the window, its answer included
        prompt_tokens = sum(count_tokens(m["content"]) for m in rec.messages)
        assert prompt_tokens + 400 <= window
        anchored = {s for items in (rec.anchor() or {}).get("sections", {}).values()
                    for item in items for s in item["sources"]}
        # anchored on the running summary: the first on the caller's, later ones on
        # everything summarized before them
        assert anchored == ANCHOR.all_sources() | set(seen[: len(seen) - len(ids)])
        assert f"part {i + 1} " in rec.prompt
    assert seen == [m["id"] for m in msgs]  # oldest first, each once
    assert summary.all_sources() == given_ids(req)
    assert (summary.covers_from, summary.covers_to) == (1, msgs[-1]["id"])


def test_a_retry_in_a_chunk_still_fits_the_window(llm: FakeLLM) -> None:
    window = 6000
    cfg = settings(llm.base_url, context_window_tokens=window, max_output_tokens=1500)
    llm.script("huge")
    req = request(_long_history(60), budget=1000)
    summary = summarize(OpenAISummarizer(cfg), req)
    assert summary.all_sources() == given_ids(req)
    retry = llm.requests[1]
    assert [m["role"] for m in retry.messages] == ["system", "user", "assistant", "user"]
    assert retry.ids() == llm.requests[0].ids()
    assert "chars omitted" in retry.messages[2]["content"]  # the bad answer, trimmed
    assert len(llm.requests) > 2
    for rec in llm.requests:
        assert sum(count_tokens(m["content"]) for m in rec.messages) + 1500 <= window


def test_a_single_message_larger_than_the_window_is_trimmed_not_fatal(llm: FakeLLM) -> None:
    cfg = settings(llm.base_url, context_window_tokens=2000, max_output_tokens=300)
    huge = {"id": 50, "role": "user", "content": "line of pasted log output\n" * 3000}
    req = request([huge], previous=Summary())
    summary = summarize(OpenAISummarizer(cfg), req)
    assert summary.all_sources() == {50}
    assert len(llm.requests) == 1
    prompt = llm.requests[0].prompt
    assert "chars omitted" in prompt
    assert count_tokens(prompt) < 2000
    assert "part " not in prompt


# ----------------------------------------------------------------- fallback, factory


def test_fallback_returns_the_builtin_summary_on_failure(llm: FakeLLM) -> None:
    llm.default = "http500"
    wrapped = FallbackSummarizer(OpenAISummarizer(settings(llm.base_url)), BuiltinSummarizer())
    req = request()
    summary = summarize(wrapped, req)
    assert summary.summarizer.startswith("builtin (fallback: ")
    assert "HTTP 500" in summary.summarizer and llm.base_url in summary.summarizer
    assert not summary.is_empty()
    assert check_summary(summary, given_ids(req)) == []
    expected = summarize(BuiltinSummarizer(), req)
    assert summary.to_dict()["sections"] == expected.to_dict()["sections"]


def test_fallback_passes_a_good_summary_through(llm: FakeLLM) -> None:
    wrapped = FallbackSummarizer(OpenAISummarizer(settings(llm.base_url)), BuiltinSummarizer())
    summary = summarize(wrapped, request())
    assert summary.summarizer == "openai:fake-model"


def test_make_summarizer_builds_what_the_config_names() -> None:
    cfg = Config()
    assert isinstance(make_summarizer(cfg), BuiltinSummarizer)
    cfg.summarizer = "openai"
    cfg.openai.model = "llama3.1:8b"
    # the fallback is the built-in summarizer unless turned off
    assert isinstance(make_summarizer(cfg), FallbackSummarizer)
    cfg.openai.fallback = ""
    plain = make_summarizer(cfg)
    assert isinstance(plain, OpenAISummarizer)
    assert plain.name == "openai:llama3.1:8b"
    cfg.openai.fallback = "builtin"
    wrapped = make_summarizer(cfg)
    assert isinstance(wrapped, FallbackSummarizer)
    assert isinstance(wrapped.primary, OpenAISummarizer)
    assert isinstance(wrapped.fallback, BuiltinSummarizer)
    cfg.summarizer = "other"
    with pytest.raises(ValueError):
        make_summarizer(cfg)


# ----------------------------------------------------------------- with the engine


def _engine(tmp_path: Path, base_url: str, fallback: str = "") -> Engine:
    config = Config(data_dir=tmp_path / "data")
    config.summarizer = "openai"
    config.openai = settings(base_url, fallback=fallback, timeout_seconds=2.0)
    return Engine(config, summarizer=make_summarizer(config))


def _fill(engine: Engine) -> str:
    sid = engine.create_session().session_id
    for i in range(8):
        engine.append(sid, agent_turn(i))
    return sid


def test_engine_commits_a_model_summary_citing_archive_ids(
    llm: FakeLLM, tmp_path: Path
) -> None:
    engine = _engine(tmp_path, llm.base_url)
    try:
        sid = _fill(engine)
        archive_ids = {m["id"] for m in engine.read_archive(sid, limit=1000).messages}
        before = engine.context_messages(sid)
        asyncio.run(engine.compact(sid, force=True))
        summary = engine.context_state(sid).summary
        assert summary.summarizer == "openai:fake-model"
        assert not summary.is_empty()
        assert summary.all_sources() <= archive_ids
        assert summary.all_sources() == set(llm.requests[0].ids())
        after = engine.context_messages(sid)
        assert len(after) < len(before)
        assert "user message" in after[0]["content"]  # the model's items are in the context
    finally:
        engine.close()


def test_engine_failure_leaves_the_context_as_it_was(llm: FakeLLM, tmp_path: Path) -> None:
    llm.default = "http500"
    engine = _engine(tmp_path, llm.base_url)
    try:
        sid = _fill(engine)
        before = engine.context_messages(sid)
        with pytest.raises(SummarizerFailed) as err:
            asyncio.run(engine.compact(sid, force=True))
        assert err.value.code == -32016
        assert "HTTP 500" in str(err.value)
        assert engine.context_messages(sid) == before
        assert len(llm.requests) == 3  # the schema's two forms, then the prompt alone
    finally:
        engine.close()


def test_engine_with_fallback_still_compacts(llm: FakeLLM, tmp_path: Path) -> None:
    llm.default = "http500"
    engine = _engine(tmp_path, llm.base_url, fallback="builtin")
    try:
        sid = _fill(engine)
        before = engine.context_messages(sid)
        asyncio.run(engine.compact(sid, force=True))
        summary = engine.context_state(sid).summary
        assert summary.summarizer.startswith("builtin (fallback: ")
        assert len(engine.context_messages(sid)) < len(before)
    finally:
        engine.close()


def test_a_form_refused_by_name_after_it_worked_is_learnt_again(llm: FakeLLM) -> None:
    # the endpoint took the first form; then another server (or model) answers there and
    # refuses any response_format by name: the forms are tried again, not given up on
    summarizer = OpenAISummarizer(settings(llm.base_url))
    summarize(summarizer, request())
    assert llm.requests[0].body["response_format"]["type"] == "json_schema"
    llm.default = "reject_response_format"
    req = request()
    summary = summarize(summarizer, req)
    assert summary.all_sources() == given_ids(req)
    assert [r.body.get("response_format", {}).get("type") for r in llm.requests[1:]] == [
        "json_schema", "json_object", None]
