"""The model beside the built-in extractor (`with_extractor`, the default): a careless
model cannot lose a rule, an artifact, a path or a pointer. A scripted loopback server
plays the careless model (tests/fake_llm.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from fake_llm import FakeLLM
from test_openai_summarizer import settings

from ctxd.daemon.compaction.rules import check_summary
from ctxd.daemon.summarizers import (
    BuiltinSummarizer,
    FallbackSummarizer,
    OpenAISummarizer,
    SummarizerError,
    summarizer_status,
)
from ctxd.daemon.summarizers.merge import close_truncated
from ctxd.daemon.summary import Summary, SummaryRequest

RULE = "Never run migrations against the production database."
WORK: list[dict[str, Any]] = [
    {"id": 1, "role": "user", "content": f"Add a CSV export to the report page. {RULE}"},
    {"id": 2, "role": "assistant", "content": "I will write src/export/csv_writer.py.",
     "tool_calls": [{"id": "c1", "type": "function", "function": {
         "name": "write_file",
         "arguments": json.dumps({"path": "src/export/csv_writer.py", "content": "x"})}}]},
    {"id": 3, "role": "tool", "tool_call_id": "c1", "content": "wrote src/export/csv_writer.py"},
    {"id": 4, "role": "user", "content": "Set the export batch size to 500."},
    {"id": 5, "role": "assistant", "content": "Batch size set to 500."},
    {"id": 6, "role": "user", "content": "Actually, raise the export batch size to 2000."},
    {"id": 7, "role": "assistant", "content": "Raised to 2000. Should empty rows be skipped?"},
]
SPAN = [m["id"] for m in WORK]


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with FakeLLM("sse") as server:
        yield server


def req(budget: int = 2000, messages: list[dict[str, Any]] | None = None) -> SummaryRequest:
    return SummaryRequest(
        session_id="s",
        previous=Summary(),
        messages=messages or WORK,
        pins=[],
        instructions=None,
        budget_tokens=budget,
        count_tokens=lambda text: len(text) // 4,
    )


def run(summarizer: Any, request: SummaryRequest) -> Summary:
    return asyncio.run(summarizer.summarize(request))


def merged(base_url: str) -> OpenAISummarizer:
    return OpenAISummarizer(settings(base_url, with_extractor=True))


def answer(**sections: Any) -> Any:
    return lambda rec: json.dumps({"sections": sections})


def test_a_careless_model_loses_nothing_the_extractor_found(llm: FakeLLM) -> None:
    llm.script(answer(
        # invented ids, a lost rule, no artifacts, a stale value stated as current
        goals=[{"text": "Deliver the spreadsheet download", "sources": [9999]}],
        decisions=[
            {"text": "Export batch size 500", "sources": [4]},
            {"text": "csv_writer streams rows instead of building the file in memory",
             "sources": [2, 3]},
        ],
        open_items=[
            {"text": "Ask whether empty rows are skipped", "sources": [7]},
            # what small models write: a placeholder, and a path from nowhere
            {"text": "...", "sources": [7]},
            {"text": "created src/report.py", "sources": [7]},
        ],
    ))
    summary = run(merged(llm.base_url), req())
    assert check_summary(summary, set(SPAN)) == []
    text = summary.render()
    assert RULE in text
    assert "src/export/csv_writer.py" in text
    by_text = {item.text: item for _, item in summary.items()}
    # the invented id: the item cites the span's first and last message instead
    assert by_text["Deliver the spreadsheet download"].sources == [SPAN[0], SPAN[-1]]
    assert by_text["Deliver the spreadsheet download"].origin == "model"
    # a value message 6 replaced is not stated as current by the model's item
    assert "Export batch size 500" not in by_text
    assert by_text["Ask whether empty rows are skipped"].origin in ("model", "model+extractor")
    assert "..." not in by_text and "src/report.py" not in text
    constraints = summary.sections["constraints"]
    assert all(item.origin == "extractor" for item in constraints)
    # every item says where it came from, and the summary counts them
    assert all(item.origin for _, item in summary.items())
    assert summary.summarizer.startswith("openai:fake-model + builtin {")
    assert '"model":' in summary.summarizer and '"extractor":' in summary.summarizer
    # only the sections a model writes well were asked for, by schema
    schema = llm.requests[0].body["response_format"]["json_schema"]["schema"]
    assert set(schema["properties"]["sections"]["properties"]) == {
        "goals", "decisions", "open_items"}


def test_the_merged_summary_stays_within_the_budget(llm: FakeLLM) -> None:
    long_items = [{"text": f"decision {n} " + "because " * 40, "sources": [5]} for n in range(30)]
    llm.script(answer(decisions=long_items))
    request = req(budget=300)
    summary = run(merged(llm.base_url), request)
    assert request.count_tokens(summary.render()) <= 300
    assert RULE in summary.render()


def test_an_answer_cut_off_at_max_tokens_keeps_its_complete_items(llm: FakeLLM) -> None:
    full = json.dumps({"sections": {"goals": [
        {"text": "Ship the CSV export", "sources": [1]},
        {"text": "Keep the batch size at 2000", "sources": [6]},
    ]}})
    llm.script(lambda rec: full[: full.index("Keep the batch") + 6])
    summary = run(merged(llm.base_url), req())
    texts = [item.text for _, item in summary.items()]
    assert "Ship the CSV export" in texts
    assert not any(t.startswith("Keep th") for t in texts)
    assert json.loads(close_truncated('{"a": [{"b": 1}, {"c": "x')) == {"a": [{"b": 1}]}


def test_an_answer_without_json_falls_back_and_is_reported(llm: FakeLLM) -> None:
    llm.default = "malformed"
    with pytest.raises(SummarizerError, match="holds no JSON summary"):
        run(merged(llm.base_url), req())
    fallback = FallbackSummarizer(merged(llm.base_url), BuiltinSummarizer())
    assert summarizer_status(fallback)["summarizerLastFailure"] is None
    summary = run(fallback, req())
    assert summary.summarizer.startswith("builtin (fallback:")
    assert RULE in summary.render()
    status = summarizer_status(fallback)
    assert status["summarizer"] == "openai:fake-model (fallback builtin)"
    assert "holds no JSON summary" in status["summarizerLastFailure"]
    assert status["summarizerLastFailureAt"] > 0


def test_a_model_rewording_one_joined_guess_keeps_the_others(llm: FakeLLM) -> None:
    guesses = [
        {"id": 1, "role": "assistant",
         "content": "The checkout slowdown is probably due to the connection pool."},
        {"id": 2, "role": "assistant",
         "content": "I think the billing duplicate events come from the job queue retrying."},
        {"id": 3, "role": "assistant",
         "content": "The ledger memory growth may come from the read replica."},
    ]
    llm.script(answer(open_items=[
        {"text": "The checkout slowdown is probably due to the connection pool.",
         "sources": [1]},
    ]))
    request = req(messages=guesses)
    request = SummaryRequest(**{**request.__dict__, "ordinals": {1: 1, 2: 2, 3: 3}})
    summary = run(merged(llm.base_url), request)
    assert check_summary(summary, {1, 2, 3}) == []
    items = summary.sections["open_items"]
    # each guess is an item of its own with its own message, all still marked
    assert sorted(s for item in items for s in item.sources) == [1, 2, 3]
    assert all(item.unconfirmed and len(item.sources) == 1 for item in items)
    text = summary.render()
    for message in guesses:
        assert message["content"] in text
