"""Counting long texts: in bounded pieces, exact for ordinary text, linear on long runs."""

from __future__ import annotations

import random
import string

from hypothesis import given, settings
from hypothesis import strategies as st

from ctxd.daemon.tokens import PIECE_CHARS, TokenCounter, pieces

ENC = TokenCounter("cl100k_base")


def whole(text: str) -> int:
    return len(ENC._enc.encode_ordinary(text))


class _Longest:
    """tiktoken's encoder, noting the longest text it was handed."""

    def __init__(self, enc: object) -> None:
        self.enc = enc
        self.longest = 0

    def encode_ordinary(self, text: str) -> list[int]:
        self.longest = max(self.longest, len(text))
        return self.enc.encode_ordinary(text)  # type: ignore[attr-defined]


def test_a_megabyte_run_of_one_character_is_counted_in_bounded_pieces() -> None:
    counter = TokenCounter("cl100k_base")
    spy = _Longest(counter._enc)
    counter._enc = spy  # type: ignore[assignment]
    run = "a" * (1 << 20)
    # cl100k packs eight a's per token, and the pieces are cut at multiples of eight
    assert counter.count_text(run) == (1 << 20) // 8
    assert 0 < spy.longest <= PIECE_CHARS
    spy.longest = 0
    assert counter.count_text(" " * (1 << 20)) > 0
    assert 0 < spy.longest <= PIECE_CHARS
    message = {"role": "tool", "tool_call_id": "c1", "content": "=" * (1 << 20)}
    assert counter.count_message(message) > 0
    assert spy.longest <= PIECE_CHARS


def test_long_ordinary_text_is_counted_exactly() -> None:
    rng = random.Random(7)
    words = ["the", "context", "daemon", "  indented", "x\n", "foo.bar(1)", "\t\n  ", "缓存",
             "café", "don't", "12345", "—", "\r\n", "!!", "   "]
    text = " ".join(rng.choice(words) for _ in range(60_000))
    assert len(text) > 50 * PIECE_CHARS
    assert ENC.count_text(text) == whole(text)


def test_a_run_without_spaces_is_a_close_estimate() -> None:
    rng = random.Random(3)
    text = "".join(rng.choice(string.ascii_lowercase) for _ in range(64 * 1024))
    exact = whole(text)
    assert abs(ENC.count_text(text) - exact) <= exact * 0.01


def test_pieces_are_bounded_and_give_the_text_back() -> None:
    for text in ("", "a" * 5000, " " * 5000, "ab " * 3000, "x" + " " * 4000 + "y z" * 900):
        parts = pieces(text)
        assert "".join(parts) == text
        assert all(len(p) <= PIECE_CHARS for p in parts)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(
    ["a", "bc", " ", "  ", "\n", "\t", "'s", "Word", "42", "1234", ".", "!?", "é", "中文", "\r\n",
     " -", "/", "__"]), max_size=80))
def test_cutting_at_safe_places_never_changes_the_count(parts: list[str]) -> None:
    text = "".join(parts)
    cut = pieces(text, size=8)
    assert "".join(cut) == text
    # a cut at a safe place (a non-space, then a space) never changes the count; a
    # forced cut (8 characters without a safe place) may
    safe = all(
        cut[i + 1].startswith(" ") and not p[-1].isspace() for i, p in enumerate(cut[:-1])
    )
    if safe:
        assert sum(whole(p) for p in cut) == whole(text)
