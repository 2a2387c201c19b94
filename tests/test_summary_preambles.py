"""Instruction preambles (AGENTS.md, CLAUDE.md, user_instructions) sent as a user message
stay verbatim in the model input after they leave the tail, through a real daemon: the
latest copy of each, cited by its #N, bounded by compaction.instructions_max_tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_llm import FakeLLM
from helpers import DaemonProcess

from ctxd.daemon.config import ConfigError, load_config

HEADER = "Context carried over from earlier in this conversation."

CODEX_AGENTS = (
    "# AGENTS.md instructions for /repo\n\n<INSTRUCTIONS>\n"
    "## Workflow\r\n"
    "- Run `make check` before every commit.\r\n"
    "- do NOT activate any existing venv\r\n"
    "Use conventional commit messages.\r\n"
    "</INSTRUCTIONS>\n"
    "<environment_context>\n  <cwd>/repo</cwd>\n  <shell>bash</shell>\n</environment_context>"
)
# what the summary message keeps of it: the heading and the block, line endings plain,
# not the run's environment
CODEX_KEPT = (
    "# AGENTS.md instructions for /repo\n\n<INSTRUCTIONS>\n"
    "## Workflow\n"
    "- Run `make check` before every commit.\n"
    "- do NOT activate any existing venv\n"
    "Use conventional commit messages.\n"
    "</INSTRUCTIONS>"
)
CODEX_AGENTS_V2 = CODEX_AGENTS.replace(
    "Use conventional commit messages.", "Squash commits before merging."
)
OLD_CODEX = (
    "<user_instructions>\n\n# path: AGENTS.md\n- Prefer small diffs.\n\n</user_instructions>"
)

CLAUDE_FIRST = (
    "<system-reminder>\nAs you answer the user's questions, you can use the following "
    "context:\n# claudeMd\nCodebase and user instructions are shown below.\n\n"
    "Contents of /repo/CLAUDE.md (project instructions, checked into the codebase):\n\n"
    "# Project\n- Use pnpm, not npm.\n- Keep functions under 40 lines.\n"
    "</system-reminder>\nPlease add a health endpoint."
)
CLAUDE_KEPT = (
    "As you answer the user's questions, you can use the following "
    "context:\n# claudeMd\nCodebase and user instructions are shown below.\n\n"
    "Contents of /repo/CLAUDE.md (project instructions, checked into the codebase):\n\n"
    "# Project\n- Use pnpm, not npm.\n- Keep functions under 40 lines."
)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def turns(first: int, n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for k in range(first, first + n):
        out += [user(f"Step {k}: please check module m{k}.py and run its tests."),
                {"role": "assistant", "content": f"Checked m{k}.py; its tests pass."}]
    return out


def summary_message(c: Any, sid: str) -> str:
    msgs = c.call("context/get", {"sessionId": sid})["messages"]
    found = [m["content"] for m in msgs
             if m["role"] == "system" and str(m["content"]).startswith(HEADER)]
    assert len(found) == 1, msgs
    return str(found[0])


def kept_blocks(text: str) -> list[str]:
    """The preamble part of a summary message, as "From #N:\\n<block>" pieces."""
    title = "Standing instructions, as the user last sent them (always apply):\n"
    assert title in text, text
    part = text.split(title, 1)[1].split("\n\nSummary of earlier messages", 1)[0]
    return part.split("\n\nFrom #")


def ordinal_of(c: Any, sid: str, message_id: int) -> int:
    page = c.call("archive/read", {"sessionId": sid, "afterId": 0, "limit": 1000})
    return int(page["firstOrdinal"]) + [m["id"] for m in page["messages"]].index(message_id)


def compact(c: Any, sid: str) -> dict[str, Any]:
    r = c.call("context/compact", {"sessionId": sid, "force": True})
    assert r["effective"], r
    # the preamble was in the model input already: a compaction never makes it bigger
    assert r["after"]["tokens"] < r["before"]["tokens"], r
    return r


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("preambles")).start()
    try:
        yield d
    finally:
        d.stop()


def test_codex_agents_md_is_kept_verbatim_through_many_compactions(
    daemon: DaemonProcess,
) -> None:
    with daemon.client(wire="jsonrpc") as c:
        sid = c.call("session/create", {"title": "codex"})["sessionId"]
        c.call("messages/append", {"sessionId": sid,
                                   "messages": [user(CODEX_AGENTS), *turns(1, 8)]})
        for k in range(6):
            compact(c, sid)
            text = summary_message(c, sid)
            assert kept_blocks(text) == ["From #1:\n" + CODEX_KEPT]
            c.call("messages/append", {"sessionId": sid, "messages": turns(10 + 8 * k, 8)})
        # its rules are not filed again as constraints: the block says them already
        assert "- do NOT activate any existing venv #" not in text
        assert "<environment_context>" not in text
        explained = c.call("context/explain", {"sessionId": sid})
        assert explained["brokenPointers"] == 0
        first = explained["items"][0]
        assert first["section"] == "preambles"
        assert first["subject"] == "AGENTS.md instructions for /repo"
        assert [s["ordinal"] for s in first["sources"]] == [1]
        assert first["text"] == CODEX_KEPT

        # sent again unchanged (a resumed session): still one copy, citing both messages
        again = c.call("messages/append", {"sessionId": sid,
                                           "messages": [user(CODEX_AGENTS), *turns(90, 8)]})
        compact(c, sid)
        ordinal = ordinal_of(c, sid, again["messageIds"][0])
        assert ordinal == 2 + 16 * 7  # AGENTS.md, then 7 batches of 8 turns
        assert kept_blocks(summary_message(c, sid)) == [f"From #{ordinal}:\n" + CODEX_KEPT]
        explained = c.call("context/explain", {"sessionId": sid})
        assert [s["ordinal"] for s in explained["items"][0]["sources"]] == [1, ordinal]

        # a new version replaces the old one
        newer = c.call("messages/append", {"sessionId": sid,
                                           "messages": [user(CODEX_AGENTS_V2), *turns(99, 8)]})
        compact(c, sid)
        ordinal = ordinal_of(c, sid, newer["messageIds"][0])
        text = summary_message(c, sid)
        assert kept_blocks(text) == [
            f"From #{ordinal}:\n"
            + CODEX_KEPT.replace("Use conventional commit messages.",
                                 "Squash commits before merging.")
        ]
        assert "conventional commit" not in text
        assert newer["messageIds"][0] in {
            s["id"] for s in c.call("context/explain", {"sessionId": sid})["items"][0]["sources"]
        }


def test_two_preambles_and_a_claude_md_reminder(daemon: DaemonProcess) -> None:
    with daemon.client() as c:
        sid = c.call("session/create", {"title": "claude"})["sessionId"]
        c.call("messages/append", {"sessionId": sid, "messages": [
            user(CLAUDE_FIRST), {"role": "assistant", "content": "Adding it."},
            user(OLD_CODEX), *turns(1, 8)]})
        compact(c, sid)
        text = summary_message(c, sid)
        assert kept_blocks(text) == ["From #1:\n" + CLAUDE_KEPT, "3:\n" + OLD_CODEX]
        # the request after the reminder is the user's own words, not part of the block
        assert "health endpoint" not in text.split("Summary of earlier messages")[0]
        for k in range(5):
            c.call("messages/append", {"sessionId": sid, "messages": turns(20 + 8 * k, 8)})
            compact(c, sid)
        assert kept_blocks(summary_message(c, sid)) == [
            "From #1:\n" + CLAUDE_KEPT, "3:\n" + OLD_CODEX]


def test_a_preamble_over_the_bound_is_kept_up_to_it(tmp_path: Path) -> None:
    lines = [f"- Rule {k}: keep the module m{k} free of side effects." for k in range(60)]
    lines[50] = "- Never push to main without a review."
    big = "# AGENTS.md instructions for /big\n\n<INSTRUCTIONS>\n" + "\n".join(lines) + \
        "\n</INSTRUCTIONS>"
    d = DaemonProcess(tmp_path, env={"CTXD_INSTRUCTIONS_MAX_TOKENS": "200"}).start()
    try:
        with d.client() as c:
            sid = c.call("session/create", {})["sessionId"]
            c.call("messages/append", {"sessionId": sid, "messages": [user(big), *turns(1, 8)]})
            compact(c, sid)
            text = summary_message(c, sid)
            (block,) = kept_blocks(text)
            head, *body = block.split("\n")
            assert head == "From #1:"
            note = body.pop()
            kept = body[3:]  # after the heading, the blank line and <INSTRUCTIONS>
            assert body[:3] == ["# AGENTS.md instructions for /big", "", "<INSTRUCTIONS>"]
            assert 0 < len(kept) < 50 and kept == lines[: len(kept)]
            rest = 60 - len(kept) + 1  # the closing tag is a line of it too
            assert note == (f"[… {rest} more lines of it: the message above holds it whole, "
                            "search_past_messages recalls it]")
            # a rule past the bound is still filed on its own, as a constraint
            assert "- Never push to main without a review. #1" in text
    finally:
        d.stop()


def test_the_bound_is_a_checked_config_key(tmp_path: Path) -> None:
    assert load_config(environ={}).compaction.instructions_max_tokens == 8000
    with pytest.raises(ConfigError, match="compaction.instructions_max_tokens"):
        load_config(environ={"CTXD_INSTRUCTIONS_MAX_TOKENS": "-1"})


def test_with_a_model_summarizer_the_preamble_is_carried_the_same(tmp_path: Path) -> None:
    """The carrying is the compaction's, not the built-in summarizer's: a model writing
    beside the extractor (a loopback fake endpoint) gets the same block, and no item
    repeating one of its lines."""
    with FakeLLM("good") as llm:
        config = tmp_path / "ctxd.toml"
        config.write_text(
            'summarizer = "openai"\n[openai]\n'
            f'base_url = "{llm.base_url}"\nmodel = "fake-model"\ntimeout_seconds = 5\n'
        )
        d = DaemonProcess(tmp_path, "--config", str(config)).start()
        try:
            with d.client() as c:
                sid = c.call("session/create", {})["sessionId"]
                c.call("messages/append", {"sessionId": sid,
                                           "messages": [user(CODEX_AGENTS), *turns(1, 8)]})
                compact(c, sid)
                assert llm.requests, "the model was asked"
                text = summary_message(c, sid)
                assert kept_blocks(text) == ["From #1:\n" + CODEX_KEPT]
                # nothing after the block says one of its lines again
                assert "activate any existing venv" not in text.split(CODEX_KEPT, 1)[1]
                explained = c.call("context/explain", {"sessionId": sid})
                assert explained["brokenPointers"] == 0
                assert explained["items"][0]["section"] == "preambles"
                assert explained["provenance"]["summarizer"].startswith("openai:fake-model")
        finally:
            d.stop()


def test_a_copy_resent_into_the_tail_is_read_once(daemon: DaemonProcess) -> None:
    with daemon.client() as c:
        sid = c.call("session/create", {"title": "resent"})["sessionId"]
        c.call("messages/append", {"sessionId": sid,
                                   "messages": [user(CODEX_AGENTS), *turns(1, 8)]})
        compact(c, sid)
        assert kept_blocks(summary_message(c, sid)) == ["From #1:\n" + CODEX_KEPT]
        # a new version arrives and stays in the tail: the old one is not carried
        # beside it, and the model reads the new one once, in its message
        c.call("messages/append", {"sessionId": sid,
                                   "messages": [user(CODEX_AGENTS_V2), *turns(20, 2)]})
        r = compact(c, sid)
        assert r["after"]["messages"] == 1 + 5  # the summary message, then the tail
        msgs = c.call("context/get", {"sessionId": sid})["messages"]
        assert msgs[1] == {"role": "user", "content": CODEX_AGENTS_V2}
        text = summary_message(c, sid)
        assert "Standing instructions" not in text and "<INSTRUCTIONS>" not in text
        everything = "\n".join(str(m["content"]) for m in msgs)
        assert everything.count("Squash commits before merging.") == 1
        assert "conventional commit" not in everything
        # once that message leaves too, its version is carried
        c.call("messages/append", {"sessionId": sid, "messages": turns(30, 8)})
        compact(c, sid)
        assert kept_blocks(summary_message(c, sid)) == [
            "From #18:\n"  # AGENTS.md, 8 turns, then the new version
            + CODEX_KEPT.replace("Use conventional commit messages.",
                                 "Squash commits before merging.")
        ]
