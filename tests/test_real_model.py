"""The model summarizer with a real model: a real daemon process configured with
`summarizer = "openai"` against llama-cpp-python's server running Gemma 3 270M
(tests/llm_server.py), automatic and manual compaction over the daemon's wires.

The model is small and the machine may be too: spans are short and the answer is
bounded (`max_output_tokens`), and the fallback is off, so a summary committed here was
written through the model, never by the fallback in its place.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import DaemonProcess, wait_for
from llm_server import N_CTX, RealLLM, real_llm  # noqa: F401  (the fixture)

from ctxd.daemon.compaction.rules import check_summary
from ctxd.daemon.summary import Summary, SummaryItem

RULE = "Never push to the main branch, always open a pull request."
ARTIFACT = "src/billing/invoice.py"
BUDGET = 600
TEST_OUTPUT = "\n".join(
    f"tests/billing/test_invoice.py::test_case_{n} PASSED  [{n * 4}%]" for n in range(1, 26)
) + "\n25 passed in 0.42s"

# every test here waits for a model on a machine it shares
pytestmark = pytest.mark.timeout(1800)


def session_messages() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"Add invoice totals to the billing module. {RULE}"},
        {"role": "assistant", "content": "I will add a totals function to the invoice module.",
         "tool_calls": [{"id": "call_1", "type": "function", "function": {
             "name": "write_file",
             "arguments": json.dumps({"path": ARTIFACT, "content": "def total(lines): ..."})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": f"wrote {ARTIFACT} (12 lines)"},
        # bulk, as agents' histories are: a compaction is committed only if it shrinks
        {"role": "assistant", "content": "Running the billing tests.",
         "tool_calls": [{"id": "call_2", "type": "function", "function": {
             "name": "run_shell", "arguments": json.dumps({"cmd": "pytest tests/billing"})}}]},
        {"role": "tool", "tool_call_id": "call_2", "content": TEST_OUTPUT},
        {"role": "user", "content": "Run the dev server on port 8080."},
        {"role": "assistant", "content": "Decided: amounts use Decimal, because floats round "
                                         "cents wrongly."},
        {"role": "user", "content": "Actually use port 8081, not 8080."},
        {"role": "assistant", "content": "Port set to 8081. Should tax be included in totals?"},
        {"role": "user", "content": "Good question, I will check with finance."},
        {"role": "assistant", "content": "Waiting for the tax answer; next I will add tests."},
        {"role": "user", "content": "Thanks, carry on."},
        {"role": "assistant", "content": "Writing the tests now."},
    ]


def daemon(tmp_path: Path, llm: RealLLM, **compaction: int) -> DaemonProcess:
    config = tmp_path / "ctxd.toml"
    policy = {"summary_budget_tokens": BUDGET, "keep_messages": 2,
              "max_active_messages": 1000, **compaction}
    config.write_text(
        'summarizer = "openai"\n'
        "[openai]\n"
        f'base_url = "{llm.base_url}"\n'
        f'model = "{llm.model}"\n'
        f"context_window_tokens = {N_CTX}\n"
        # a short answer: the model's part of the summary, and a bounded wait
        "max_output_tokens = 160\n"
        "timeout_seconds = 900\n"
        "idle_timeout_seconds = 300\n"
        # off: the summary must come through the model, not the fallback
        'fallback = ""\n'
        "[compaction]\n"
        + "".join(f"{k} = {v}\n" for k, v in policy.items())
    )
    return DaemonProcess(tmp_path, "--config", str(config)).start()


def check_committed(c: Any, sid: str, llm: RealLLM) -> None:
    """What every compaction through the model must give."""
    explained = c.call("context/explain", {"sessionId": sid})
    written_by = explained["provenance"]["summarizer"]
    # the model answered in the schema's shape: no fallback, the merge counted its items
    assert written_by.startswith(f"openai:{llm.model} + builtin {{"), written_by
    counts = json.loads(written_by.split(" + builtin ", 1)[1])
    assert counts.get("extractor", 0) > 0
    # every pointer resolves to an archive message
    assert explained["brokenPointers"] == 0
    assert explained["items"]
    assert all(item["origin"] in ("extractor", "model", "model+extractor")
               for item in explained["items"])
    # the merged summary meets the contract the built-in summarizer meets
    archive = c.call("archive/read", {"sessionId": sid, "limit": 200})["messages"]
    ids = {m["id"] for m in archive}
    summary = Summary(sections={})
    for item in explained["items"]:
        summary.sections.setdefault(item["section"], []).append(
            SummaryItem(item["text"], [s["id"] for s in item["sources"]], item["status"]))
    assert check_summary(summary, ids) == []
    # planted rules and artifacts survive word for word
    context = c.call("context/get", {"sessionId": sid})["messages"]
    carried = "\n".join(m["content"] for m in context if m["role"] == "system")
    assert RULE in carried
    assert ARTIFACT in carried
    # the corrected port is in what the model reads next: in the summary, or still in
    # the kept tail (a forced compaction keeps the last few messages), never as 8080 only
    model_input = "\n".join(str(m.get("content") or "") for m in context)
    assert "8081" in model_input
    status = c.call("context/status", {"sessionId": sid})
    assert status["summarizer"] == f"openai:{llm.model}"
    assert status["summarizerLastFailure"] is None, llm.log_tail()


def test_manual_compaction_through_a_real_model(tmp_path: Path, real_llm: RealLLM) -> None:  # noqa: F811
    d = daemon(tmp_path, real_llm)
    try:
        with d.client("jsonrpc", timeout=1200) as c:
            sid = c.call("session/create", {})["sessionId"]
            c.call("messages/append", {"sessionId": sid, "messages": session_messages()})
            result = c.call("context/compact", {"sessionId": sid, "force": True,
                                                "instructions": "keep the billing decisions"})
            assert result["effective"] is True, result
            check_committed(c, sid, real_llm)
    finally:
        d.stop()


def test_automatic_compaction_through_a_real_model(tmp_path: Path, real_llm: RealLLM) -> None:  # noqa: F811
    d = daemon(tmp_path, real_llm, max_active_messages=8)
    try:
        with d.client("zmq", timeout=1200) as c:
            sid = c.call("session/create", {})["sessionId"]
            c.subscribe(sid)
            events = c.notifications(timeout=1.0)
            # one append over the limit: the daemon compacts by itself after it
            c.call("messages/append", {"sessionId": sid, "messages": session_messages()})
            done = wait_for(events, "context/didCompact", timeout=1500)
            assert done["sessionId"] == sid
            logged = c.call("context/compactions", {"sessionId": sid})["compactions"]
            assert logged[0]["trigger"] == "auto" and logged[0]["committed"] is True
            check_committed(c, sid, real_llm)
            assert logged[0]["summarizer"] == c.call(
                "context/explain", {"sessionId": sid})["provenance"]["summarizer"]
    finally:
        d.stop()
