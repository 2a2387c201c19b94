"""The model summarizer is held to the same contract as the built-in one: a superseded
value must not appear as current, hedges are carried, the agent's artifacts are listed.
A real HTTP server on loopback plays the model (tests/fake_llm.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from fake_llm import FakeLLM, Recorded

from ctxd.daemon.config import OpenAISummarizerConfig
from ctxd.daemon.summarizers import OpenAISummarizer, SummarizerError
from ctxd.daemon.summary import Summary, SummaryRequest


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        yield server


def summarize(base_url: str, messages: list[dict[str, Any]]) -> Summary:
    config = OpenAISummarizerConfig(
        base_url=base_url, model="fake-model", api_key_env="CTXD_TEST_NO_KEY", timeout_seconds=5,
        # the model's answer alone is held to the contract here (tests/test_llm_merge.py
        # has the extractor beside it)
        with_extractor=False,
    )
    request = SummaryRequest(
        session_id="s",
        previous=Summary(),
        messages=messages,
        pins=[],
        instructions=None,
        budget_tokens=2000,
        count_tokens=lambda text: len(text) // 4,
    )
    return asyncio.run(OpenAISummarizer(config).summarize(request))


def answer(**sections: list[dict[str, Any]]) -> Any:
    return lambda rec: json.dumps({"sections": sections})


def retry_note(rec: Recorded) -> str:
    """The problems the summarizer sent back with its retry."""
    return rec.messages[-1]["content"]


SETTINGS = [
    {"id": 1, "role": "user", "content": "Set the importer batch size to 500."},
    {"id": 2, "role": "assistant", "content": "Done."},
    {"id": 3, "role": "user", "content": "Raise the importer batch size to 2000."},
]


def test_the_prompt_states_the_contract(llm: FakeLLM) -> None:
    summarize(llm.base_url, SETTINGS)
    system = llm.requests[0].system
    assert '"artifacts"' in system and '"unconfirmed": true' in system
    assert "Never state a replaced value as current" in system


def test_a_superseded_value_stated_as_current_is_retried(llm: FakeLLM) -> None:
    llm.script(
        answer(constraints=[
            {"text": "Importer batch size 500", "sources": [1]},
            {"text": "Importer batch size 2000", "sources": [3]},
            {"text": "Done", "sources": [2]},
        ]),
        answer(constraints=[
            {"text": "Importer batch size 500", "sources": [1], "status": "superseded"},
            {"text": "Importer batch size 2000", "sources": [3], "was": "500"},
            {"text": "Done", "sources": [2]},
        ]),
    )
    summary = summarize(llm.base_url, SETTINGS)
    assert len(llm.requests) == 2
    assert "states 500, which message 3 replaced" in retry_note(llm.requests[1])
    assert [(i.text, i.status, i.was) for i in summary.sections["constraints"]] == [
        ("Importer batch size 500", "superseded", None),
        ("Importer batch size 2000", "current", "500"),
        ("Done", "current", None),
    ]
    # search can mark the superseded statement whichever summarizer wrote the items
    assert summary.supersessions == {1: 3}


HEDGED = [
    {"id": 1, "role": "user", "content": "导出为什么这么慢？"},
    {"id": 2, "role": "assistant", "content":
        "We'll switch the exports to the read replica. I haven't confirmed that it is faster."},
]


def test_a_dropped_hedge_is_retried_then_refused(llm: FakeLLM) -> None:
    bad = answer(
        goals=[{"text": "导出为什么这么慢", "sources": [1]}],
        decisions=[{"text": "Switch the exports to the read replica", "sources": [2]}],
    )
    llm.script(bad, bad)
    with pytest.raises(SummarizerError, match="hedged conclusion as fact"):
        summarize(llm.base_url, HEDGED)
    assert "keep the hedge" in retry_note(llm.requests[1])


def test_a_hedge_carried_as_unconfirmed_passes(llm: FakeLLM) -> None:
    llm.script(answer(
        goals=[{"text": "导出为什么这么慢", "sources": [1]}],
        decisions=[{"text": "Switch the exports to the read replica", "sources": [2],
                    "unconfirmed": True}],
    ))
    summary = summarize(llm.base_url, HEDGED)
    assert len(llm.requests) == 1
    [decision] = summary.sections["decisions"]
    assert decision.unconfirmed
    assert summary.render().startswith("## Goals\n- 导出为什么这么慢 [msg 1]\n## Decisions\n"
                                       "- [unconfirmed] Switch the exports")


def _call(cid: str, name: str, **args: Any) -> dict[str, Any]:
    return {"id": cid, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}


WORK = [
    {"id": 1, "role": "user", "content": "Add the report module and commit it."},
    {"id": 2, "role": "assistant", "content": None, "tool_calls": [
        _call("c1", "write_file", path="src/report.py", content="x = 1"),
        _call("c2", "run_shell", command="git commit -am report")]},
    {"id": 3, "role": "tool", "tool_call_id": "c1", "content": "ok"},
    {"id": 4, "role": "tool", "tool_call_id": "c2", "content": "[main 3f9a2c1] report"},
]


def test_missing_artifacts_are_asked_for(llm: FakeLLM) -> None:
    llm.script(
        answer(goals=[{"text": "Add the report module and commit it", "sources": [1]}],
               tool_activity=[{"text": "write_file, run_shell: ok", "sources": [2, 3, 4]}]),
        answer(goals=[{"text": "Add the report module and commit it", "sources": [1]}],
               artifacts=[{"text": "commit 3f9a2c1", "sources": [4], "subject": "3f9a2c1"},
                          {"text": "created src/report.py", "sources": [2, 3],
                           "subject": "src/report.py"}],
               tool_activity=[{"text": "write_file, run_shell: ok", "sources": [2, 3, 4]}]),
    )
    summary = summarize(llm.base_url, WORK)
    note = retry_note(llm.requests[1])
    assert "'created src/report.py' (message 3) is missing" in note
    assert "'commit 3f9a2c1' (message 4) is missing" in note
    assert [(i.text, i.subject) for i in summary.sections["artifacts"]] == [
        ("commit 3f9a2c1", "3f9a2c1"),
        ("created src/report.py", "src/report.py"),
    ]
