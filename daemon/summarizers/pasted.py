"""Text pasted into a message (placeholders, screenshots, stack frames, log lines, markup,
tool output) rather than written by a person: evidence, never an instruction."""

from __future__ import annotations

import re

# Lines that are evidence pasted into a message, never an instruction: placeholders,
# screenshots, stack frames, log lines, shell prompts, diff headers.
_PASTED = re.compile(
    r"^\W{0,3}(?:\[(?:pasted text|pasted|image|file|screenshot|attachment)\b"
    r"|<[a-z_-]+[ >/]|file \"[^\"]+\", line \d+|at [\w$.<>/]+\s?\(|#\d+\s+0x[0-9a-f]+"
    r"|\d{4}-\d\d-\d\d[ t]\d\d:\d\d|\d\d:\d\d:\d\d|\[\d\d:\d\d"
    r"|\[?(?:info|debug|warn|warning|error|trace|fatal|notice|critical)\]?[\s:]"
    r"|\$ |>>> |[+\-]{3} |@@ |traceback\b|caused by:)"
    r"|\[(?:image|pasted text|pasted|file) #?\d+|screenshot|screen shot|截图|截屏"
    r"|</?[a-z][\w-]*>|&(?:gt|lt|amp|quot);|:\d+:\d+\)"
    r"|\.(?:png|jpe?g|gif|webp|bmp|svg)\b"
    r"|\b[\w-]+\.(?:py|js|mjs|ts|tsx|jsx|go|rs|java|rb|c|cc|cpp|h|hpp|kt|swift|php|cs|scala)"
    r":\d+",
    re.IGNORECASE,
)
URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+")
KEY_EQ = re.compile(r"\b[\w.-]+=\S")
_JSON_KEY = re.compile(r"[\"'][\w.-]+[\"']\s*:")
# "Set max_connections=200 and pool_timeout=30." is written, not pasted
_SETS_START = re.compile(
    r"^\W*(?:please\s+)?(?:set|use|make|change|raise|lower|bump|switch|keep|把|设|改|请)",
    re.IGNORECASE,
)
# what prose is written with; the rest ({}[]<>=|\\$~^, box drawing) is code or output
_ODD = re.compile(r"[{}\[\]<>=|\\$~^\u2500-\u257f]")


def is_pasted(text: str) -> bool:
    """Whether a sentence is pasted evidence rather than something a person wrote."""
    if _PASTED.search(text):
        return True
    pairs = len(KEY_EQ.findall(text))
    if (pairs >= 2 and not _SETS_START.match(text)) or pairs >= 4:
        return True
    if text.count("|") >= 2 or len(_JSON_KEY.findall(text)) >= 2:
        return True
    return len(text) >= 12 and len(_ODD.findall(text)) > 0.08 * len(text)
