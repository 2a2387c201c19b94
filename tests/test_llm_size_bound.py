"""A model writing beside the built-in extractor obeys the same size bound as the
built-in summarizer: the merged summary grows by at most `summary_share` of what leaves
the context (the user's rules in force kept whole past it), and no compaction makes the
context bigger. A scripted loopback server plays a verbose model (tests/fake_llm.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_llm import FakeLLM, Recorded, good_summary
from helpers import make_config
from test_openai_summarizer import settings

from ctxd.daemon.config import OpenAISummarizerConfig
from ctxd.daemon.engine import Engine
from ctxd.daemon.summarizers import BuiltinSummarizer, FallbackSummarizer, OpenAISummarizer
from ctxd.daemon.summary import Summary, SummaryRequest

RULES = ["Never run migrations on Mondays.", "数据库迁移必须在周五之前完成。"]


def count(text: str) -> int:
    return len(text) // 4


def verbose(rec: Recorded) -> str:
    """The good summary, each item padded far past any share of a short span."""
    summary = good_summary(rec)
    for items in summary["sections"].values():
        for item in items:
            item["text"] += " — " + "and because of the earlier discussion " * 8
    return json.dumps(summary)


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with FakeLLM("good") as server:
        server.default = verbose  # type: ignore[assignment]
        yield server


def span(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"id": 1, "role": "user", "content": f"{RULES[0]} {RULES[1]}"}]
    for i in range(2, n + 1):
        role = "user" if i % 2 else "assistant"
        out.append({"id": i, "role": role, "content": f"step {i} of the export looks fine"})
    return out


def request(limit: int | None, budget: int = 2000) -> SummaryRequest:
    return SummaryRequest(
        session_id="s", previous=Summary(), messages=span(12), pins=[], instructions=None,
        budget_tokens=budget, count_tokens=count, size_limit_tokens=limit,
        ordinals={i: i for i in range(1, 13)},
    )


@pytest.mark.parametrize("limit", [60, 150, 400])
def test_the_merged_summary_is_fitted_to_the_size_limit(llm: FakeLLM, limit: int) -> None:
    model = OpenAISummarizer(settings(llm.base_url, with_extractor=True))
    assert model.honours_size_limit
    for summarizer in (model, FallbackSummarizer(model, BuiltinSummarizer())):
        summary = asyncio.run(summarizer.summarize(request(limit)))
        text = summary.render()
        # the rules in force are whole, whatever the limit
        assert all(rule in text for rule in RULES), text
        rules_alone = Summary(sections={"constraints": summary.sections["constraints"]})
        # everything else fits within the limit beside them
        assert count(text) <= max(limit, count(rules_alone.render())), (limit, text)
        # the model was asked for its half of the limit, not of the whole budget
        asked = llm.requests[-1].body["max_tokens"]
        assert asked <= int(max(50, limit // 2) * 1.5) + 100
        if limit >= 400:
            assert any(item.origin in ("model", "model+extractor") for _, item in summary.items())


def test_a_model_alone_gets_the_limit_as_its_budget(llm: FakeLLM) -> None:
    """Without the extractor the model's answer is held to a smaller budget (never
    below the floor a model can use), through the fallback wrapper too."""
    alone = OpenAISummarizer(settings(llm.base_url, with_extractor=False))
    assert not alone.honours_size_limit
    llm.default = "good"
    summary = asyncio.run(FallbackSummarizer(alone, BuiltinSummarizer()).summarize(request(300)))
    assert count(summary.render()) <= 300
    assert summary.summarizer == "openai:fake-model"


def test_no_compaction_through_the_model_makes_the_context_bigger(
    tmp_path: Path, llm: FakeLLM
) -> None:
    config = make_config(tmp_path, keep_messages=6, max_active_messages=14)
    config.summarizer = "openai"
    config.openai = OpenAISummarizerConfig(
        base_url=llm.base_url, model="fake-model", timeout_seconds=5.0, fallback="builtin")
    share = config.compaction.summary_share
    engine = Engine(config)
    try:
        sid = engine.create_session().session_id
        engine.append(sid, [{"role": "user", "content": " ".join(RULES)}])
        grew = 0
        compactions = 0
        for turn in range(40):
            engine.append(sid, [{"role": "user", "content": f"check step {turn}"},
                                {"role": "assistant", "content": f"step {turn} is fine"}])
            force = turn % 5 == 4
            if not (force or engine.auto_compaction_due(sid)):
                continue
            st = engine.context_state(sid)
            old = st.summary_tokens
            result = asyncio.run(engine.compact(sid, force=force))
            assert result.after.tokens <= result.before.tokens, result
            if not result.effective:
                continue
            compactions += 1
            grew += result.after.tokens > result.before.tokens
            lo, hi = result.summarized_from, result.summarized_to
            read = engine.read_archive(sid, after_id=lo - 1, before_id=hi + 1, limit=1000)
            start = st.tail_start_id or 0
            departing = sum(m["tokens"] for m in read.messages if m["id"] >= start)
            new = engine.context_state(sid)
            rules = sum(engine.tokens.count_text(i.line(new.summary.ordinals))
                        for i in new.summary.sections.get("constraints", []))
            # the summary message grew by at most its share of what left, the rules aside
            assert new.summary_tokens <= old + share * departing + rules + 8, (
                old, departing, new.summary_tokens)
            text = "\n".join(str(m.get("content") or "") for m in engine.context_messages(sid))
            assert all(rule in text for rule in RULES)
            assert new.summary.summarizer.startswith("openai:fake-model + builtin")
        assert compactions >= 5 and grew == 0
        assert llm.requests, "the model was never asked"
    finally:
        engine.close()
