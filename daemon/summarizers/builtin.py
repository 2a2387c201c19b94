"""The built-in summarizer: extractive, deterministic, offline.

It never writes prose of its own. Every item is an excerpt of a source message (a
sentence, an error line, a path) or a mechanical description of a tool call built from
its name and arguments, and it carries the archive ids it came from. The result is
cruder than a model's summary, but it is free, instant and cannot hallucinate, which
is what the daemon needs as a default and as the fallback when a model summarizer
fails.
"""

from __future__ import annotations

import heapq
import json
import re
import string
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ctxd.daemon.messages import content_text
from ctxd.daemon.summary import SECTIONS, Summary, SummaryItem, SummaryRequest

# --------------------------------------------------------------------------- cues


class _Cue:
    """A cue pattern behind a cheap substring gate.

    Python's `re` tries every alternative at every position, which costs tens of
    microseconds on a paragraph. Almost no text contains any of the trigger
    substrings, so the pattern itself only runs on the little that might match.
    Every match of the pattern must contain one of the (lower-case) triggers.
    """

    __slots__ = ("regex", "triggers")

    def __init__(self, pattern: str, triggers: str, flags: int = re.IGNORECASE) -> None:
        self.regex = re.compile(pattern, flags)
        self.triggers = tuple(triggers.split("|"))

    def gate(self, low: str) -> bool:
        return any(map(low.__contains__, self.triggers))

    def search(self, text: str, low: str | None = None) -> bool:
        if not self.gate(text.lower() if low is None else low):
            return False
        return self.regex.search(text) is not None


class _CueSet:
    """Alternatives of one cue, each behind its own substring gate.

    Tool output is long and, when it is source code, full of "error" and "exception":
    one big alternation would try every branch at every position. Here a branch runs
    only when its own (lower-case) trigger is present. The text is searched with a
    newline in front, so a branch anchored at a line start can begin with a newline and
    the regex engine skips straight from one line to the next.
    """

    __slots__ = ("parts", "triggers")

    def __init__(self, *parts: tuple[str, str]) -> None:
        self.parts = tuple(
            (tuple(triggers.split("|")), re.compile(pattern, re.IGNORECASE | re.MULTILINE))
            for pattern, triggers in parts
        )
        self.triggers = tuple(t for triggers, _ in self.parts for t in triggers)

    def gate(self, low: str) -> bool:
        return any(map(low.__contains__, self.triggers))

    def search(self, text: str, low: str | None = None) -> bool:
        low = text.lower() if low is None else low
        if not self.gate(low):
            return False
        lined: str | None = None
        for triggers, regex in self.parts:
            if any(map(low.__contains__, triggers)):
                if lined is None:
                    lined = "\n" + text
                if regex.search(lined):
                    return True
        return False


# Single-character 别 ("don't") is also part of many ordinary words (特别, 区别, 级别...);
# the look-arounds keep those from reading as instructions. "Don't forget to ..." and
# 别忘了 are reminders of a task, not rules, so they stay with the request. 务必 is not
# the one in 服务必须 ("the service must"): stripped, it would cut the subject in half.
_CONSTRAINT = _Cue(
    r"\b(?:must(?:n[’']?t| not)?|never|always|avoid|only|should(?:n[’']?t| not)|no longer"
    r"|for the record|fyi|keep in mind|bear in mind|note that|remember that)\b"
    r"|\b(?:don[’']?t|dont|do not)\b(?!\s+forget)"
    r"|必须|不要(?!忘)|禁止|务必(?!须)|一定要|不能|只能|不许|不准|请勿|备注|记住"
    r"|(?<![特区分识级类告性个派差鉴辨])别(?![的人名处忘])",
    "must|never|don|do not|always|avoid|only|should|no longer|for the record|fyi"
    "|keep in mind|bear in mind|note that|remember that"
    "|必须|不要|禁止|务必|一定要|不能|只能|不许|不准|请勿|备注|记住|别",
)

# "Make sure the tests still pass" is as often a one-off request as a standing rule, so
# a sentence with no stronger cue is kept as a constraint but is the first to go.
_WEAK_CONSTRAINT = _Cue(r"\b(?:make sure|ensure)\b|确保", "make sure|ensure|确保")

# An imperative that sets a choice ("Use port 8080.", "Set the timeout to 30 s.") is a
# rule about how, where "Add an endpoint" or "Set up CI" is a request for what; only the
# first kind is a constraint.
_IMPERATIVE = re.compile(
    r"(?:please\s+)?(?:use|prefer|set(?!\s+up\b)|keep|store|pin|limit|default to"
    r"|stick (?:to|with)|stay (?:on|with)|target)\b"
    r"|请?(?:使用|用|保持|统一用?)",
    re.IGNORECASE,
)

# Chinese puts the setting verb after its subject ("超时设为 30 秒"), so it is searched
# anywhere rather than matched at the start.
_SETTING = _Cue(r"设为|设置为|设成|设定为|调整为", "设为|设置为|设成|设定为|调整为")

_CORRECTION = _Cue(
    r"\bactually\b|\binstead\b|\bno\s?[,，!]|^\s*nope\b|\bchange\b[^.。!?]{0,60}?\bto\b"
    r"|\bswitch(?:ed)? to\b|\bi meant\b|\brather than\b|\bscratch that\b|\bwrong\b"
    r"|不对|改成|改为|换成|不是[^。]{0,30}而是|应该是|搞错",
    "actually|instead|no,|no ,|no，|no ，|no!|no !|nope|change|switch|i meant|rather than"
    "|scratch that|wrong|不对|改成|改为|换成|而是|应该是|搞错",
)

# A correction that adds to an earlier instruction ("also", "as well") leaves it standing.
_ADDITIVE = re.compile(r"\balso\b|\bas well\b|\bin addition\b|还要|也要|另外", re.IGNORECASE)

_DECISION = _Cue(
    r"\b(?:i|we)(?:[’']ll| will| am going to|[’']m going to| are going to|[’']re going to)"
    r" (?:use|go with|switch|stick with|keep|adopt|move to|replace)\b"
    r"|\bdecided\b|\bdecision\b|\bwe[’']ll\b|\bwe will\b"
    r"|\blet[’']?s\b|\bgoing with\b|\bopt(?:ed|ing)? (?:for|to)\b|\bchose\b|\bswitching to\b"
    r"|\binstead of\b"
    r"|决定|采用|改用|选用|我们将|我会用",
    "'ll|’ll|will|going to|decided|decision|let's|lets|let’s|going with|opt|chose"
    "|switching to|instead of|决定|采用|改用|选用|我们将|我会用",
)

# A decision that names what was chosen; "let's revisit it later" or "I'll keep looking"
# match the cue above but settle little, so they are the first decisions to go.
_FIRM_DECISION = _Cue(
    r"\b(?:(?:i|we)(?:[’']ll| will| am going to|[’']m going to| are going to|[’']re going to)"
    r"|let[’']?s) (?:use|go with|switch|stick with|adopt|move to|replace)\b"
    r"|\bdecided\b|\bdecision\b|\bgoing with\b|\bopt(?:ed|ing)? (?:for|to)\b|\bchose\b"
    r"|\bswitching to\b|\binstead of\b"
    r"|决定|采用|改用|选用|我会用",
    "use|go with|switch|stick with|adopt|move to|replace|decided|decision|going with|opt"
    "|chose|instead of|决定|采用|改用|选用|我会用",
)

_OPEN = _Cue(
    r"(?-i:\bTODO\b|\bFIXME\b)|\bnext steps?\b|\bstill (?:need|needs|have to|has to)\b"
    r"|\bnot (?:yet )?(?:done|implemented|finished)\b|\bfollow[- ]up\b|\bleft to do\b"
    r"|待办|下一步|还需要|尚未|待完成|待处理",
    "todo|fixme|next step|still need|still have to|still has to|not done|not yet"
    "|not implemented|not finished|follow|left to do|待办|下一步|还需要|尚未|待完成|待处理",
)

_ERROR_ANY = _Cue(
    r"\berrors?\b|\bexceptions?\b|\btraceback\b|\bfail(?:ed|ure|ures|s|ing)?\b"
    r"|\bpanic(?:ked)?\b|\bcrash(?:ed|es)?\b|(?-i:\b[A-Z]\w*(?:Error|Exception)\b)"
    r"|错误|失败|异常|报错|崩溃",
    "error|exception|traceback|fail|panic|crash|错误|失败|异常|报错|崩溃",
)

# Anchored patterns for text that may be code or command output: a source file read by
# a tool mentions "except ValueError" without anything having gone wrong.
_ERROR_LINE = _CueSet(
    (
        r"\n[^\S\n]*(?:traceback \(most recent call last\)|[\w.]*(?:error|exception)\b"
        r"(?::|\s*$)|error(?:\[\w+\])?:|fatal:|panic:|e {2,}\S|failed\b|error\b"
        r"|错误|失败|异常|报错)",
        "traceback|error|exception|fatal:|panic:|e  |failed|错误|失败|异常|报错",
    ),
    (r"\bcommand not found\b", "command not found"),
    (r"no such file or directory|permission denied", "no such file|permission denied"),
    (r"\bexit(?:ed)? (?:with )?(?:code|status) [1-9]\d*", "exit"),
    # \b[1-9], spelt so the pattern starts with a character class the engine can scan for
    (r"[1-9](?<!\w[1-9])\d* (?:failed|errors?)\b", " failed| error"),
    (
        r"[\"'](?:error|is_error)[\"'][ \t]*:[ \t]*(?!null|none|false|\"\"|''|\[\]|\{\}|0\b)\S"
        r"|[\"'](?:ok|success)[\"']\s*:\s*false|[\"']status[\"']\s*:\s*[\"'](?:error|failed)",
        "error|false|failed",
    ),
    (r"(?:错误|异常|失败)\s*[:：]", "错误|异常|失败"),
)

_NAMED_EXCEPTION = re.compile(r"\b[A-Z]\w*(?:Error|Exception)\b:")

_FAILURE_START = re.compile(
    r"\W*(?:(?:error|exception)\s*[:\[(]|fail(?:ed|ure)\b|traceback\b|错误|失败|异常)",
    re.IGNORECASE,
)

_NO_ERROR = re.compile(
    r"\b(?:no|zero|0|without)\s+(?:errors?|failures?|exceptions?)\b|\b0 (?:failed|errors?)\b"
    r"|\b(?:errors?|failed|failures?)\s*[:=]\s*0\b|没有(?:错误|异常|报错)|无(?:错误|异常)",
    re.IGNORECASE,
)

# ------------------------------------------------------------------- text helpers

_FENCE = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)
_SENT_SPLIT = re.compile(r"(?<=[.!?])\s+(?=\S)|(?<=[。！？；;])\s*|\s*\n+\s*")
_BULLET = re.compile(r"^(?:[-*•>]+|\d+[.)])\s+")
_WS = re.compile(r"\s+")
_TRAILING = " .。!！?？;；,，:：…"

_URL = re.compile(r"\bhttps?://[^\s<>\"'`()\[\]{}]+", re.IGNORECASE)
_WIN_PATH = re.compile(r"\b[A-Za-z]:\\[^\s\"'<>|*?`]+")
_EXTENSIONS = (
    "py|pyi|ipynb|md|rst|txt|json|jsonl|yaml|yml|toml|ini|cfg|conf|env|lock|js|mjs|cjs|ts|tsx|"
    "jsx|vue|svelte|html|htm|css|scss|less|go|rs|c|h|cc|cpp|hpp|cs|java|kt|kts|swift|rb|php|pl|"
    "sh|bash|zsh|ps1|bat|sql|db|sqlite|sqlite3|csv|tsv|xml|svg|png|jpe?g|gif|pdf|log|proto|"
    "gradle|mk|cmake|tf|hcl|zip|gz|tgz|tar|whl|so|dll|exe|wasm|lua|r|scala|ex|exs|erl|hs|ml|"
    "clj|dart|patch|diff"
)
# ASCII only: Chinese prose runs straight into a path ("修改src/app.py文件") with no
# space, and Unicode \w would swallow the surrounding words into it.
_PATH = re.compile(
    r"(?<![\w@:/.\\-])(?:~|\.{1,2})?/?(?:[\w.@+-]+/)+[\w.@+-]*"
    r"|(?<![\w./-])(?:[\w-]+\.)+(?:" + _EXTENSIONS + r")\b"
    r"|(?<![\w./-])(?:Dockerfile|Makefile|Procfile|Justfile|\.env|\.gitignore|\.dockerignore)\b",
    re.ASCII,
)
_PATH_TRAILING = ".,;:!?)]}'\"`…"
_HAS_EXT = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,9}$")
_PATH_KEYS = frozenset(
    {"path", "paths", "file", "files", "file_path", "filepath", "filename", "file_name",
     "dir", "directory", "cwd", "target_file", "source", "destination", "src", "dst", "url"}
)
# Arguments worth showing for a call, most telling first.
_KEY_ARGS = (
    "path", "file_path", "filepath", "file", "filename", "paths", "command", "cmd", "query",
    "q", "pattern", "url", "uri", "name", "target", "directory", "dir", "cwd", "sql",
)

_WORD = re.compile(r"[a-z0-9_]+")
# Dotted, dashed or colon-joined runs stay one token, so "eu-west-1" or "3.11" is one value.
_TOKEN = re.compile(r"[a-z0-9_]+(?:[.:\-][a-z0-9_]+)*")
_TOKEN_PARTS = re.compile(r"[.:\-]")
_QUOTED = re.compile(r"[`\"“「]([^`\"”」\n]{1,60})[`\"”」]")
_CJK_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]+")
_STOP = frozenset(
    """a an the and or but if then else of to in on at by for from with without into onto
    as is are was were be been being it its this that these those i me my we our you your he
    she they them their please just also too very so not no yes do does did don't dont use
    using used make sure must never always only avoid should shouldn't instead actually
    change switch rather meant mean want need can could would will shall let lets let's ok
    okay focus about keep all any some there here what which when where how now anymore
    nope wrong set scratch sorry oops correction said told earlier fyi""".split()
)
_CJK_STOP = frozenset(
    "我们 你们 这个 那个 一下 使用 请你 可以 需要 应该 然后 现在 还是 就是 不是 如果 因为 所以 "
    "但是 而是 我要 你要 不对 改成 改为 换成 必须 不要 禁止 务必 一定 定要 不能 只能 这样 "
    "设为 设置 置为 设成 备注 注一 一下".split()
)

_PLAIN_COST = 1 / 5.2
_DENSE_COST = 0.72
_WIDE_COST = 1.15
_DENSE_CHARS = str.maketrans("", "", string.digits + string.punctuation)
_CALL_ID_NOTE = re.compile(r"\(call_id ([^\s()]+)\)\s*$")


def _norm(text: str) -> str:
    return _WS.sub(" ", text).strip().casefold().rstrip(_TRAILING)


def _trim(text: str, limit: int) -> str:
    text = _WS.sub(" ", text).strip()
    if len(text) <= limit:
        return text
    cut = text[: max(limit - 1, 1)]
    space = cut.rfind(" ")
    # Cut at a word boundary when one is near, so the excerpt does not end mid-word.
    if space >= limit * 0.75:
        cut = cut[:space]
    return cut.rstrip() + "…"


def _sentences(text: str) -> Iterator[str]:
    prose = _FENCE.sub("\n", text)
    for part in _SENT_SPLIT.split(prose):
        part = _BULLET.sub("", part.strip()).strip()
        if part:
            yield part


def _is_error_text(text: str, *, anchored: bool, low: str | None = None) -> bool:
    cue = _ERROR_LINE if anchored else _ERROR_ANY
    if not cue.search(text, low):
        return False
    if _NO_ERROR.search(text):
        return cue.search(_NO_ERROR.sub(" ", text))
    return True


def _stem(word: str) -> str:
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def _key_terms(text: str) -> frozenset[str]:
    """Content words and values: what an instruction or a focus talks about."""
    words, values = _subject(text)
    return words | values


# Every compaction reads the previous summary's rules again; their words do not change.
@lru_cache(maxsize=4096)
def _subject(text: str) -> tuple[frozenset[str], frozenset[str]]:
    """The words naming what an instruction is about, and the values it sets apart.

    A value (a port, a count, a region, a version, a quoted name) is what a correction
    replaces; the words around it name the setting and its owner. Only the words decide
    whether two instructions are about the same thing: "retry 2 times" and "timeout 2
    seconds" share a value, not a subject.
    """
    low = text.casefold()
    values = {v.strip() for v in _QUOTED.findall(low) if v.strip()}
    words: set[str] = set()
    for token in _TOKEN.findall(_QUOTED.sub(" ", low)):
        if _is_value(token):
            values.add(token)
        elif any(c.isdigit() for c in token):
            # "service2" or "mod_5" is a name, the subject rather than what is set.
            words.add(token)
        else:
            for w in _TOKEN_PARTS.split(token):
                if len(w) >= 2 and w not in _STOP:
                    words.add(_stem(w))
    # Chinese has no spaces; character bigrams are the usual cheap stand-in for words.
    if _CJK_RUN.search(low):
        stripped = _CORRECTION.regex.sub(" ", _CONSTRAINT.regex.sub(" ", low))
        for run in _CJK_RUN.findall(stripped):
            for i in range(len(run) - 1):
                gram = run[i : i + 2]
                if gram not in _CJK_STOP:
                    words.add(gram)
    return frozenset(words), frozenset(values)


def _is_value(token: str) -> bool:
    """A number, a version, a size ("8080", "3.11", "30s") or a numbered variant
    ("eu-west-1", "tls-1.2"): what a setting is set to."""
    if token[0].isdigit():
        return True
    parts = _TOKEN_PARTS.split(token)
    return len(parts) > 1 and parts[-1].isdigit()


def _similarity(old: _Entry, new: _Entry) -> float:
    """How surely `new` speaks about the same setting as `old` (0: not at all)."""
    shared = len(old.terms & new.terms)
    if not shared:
        return 0.0
    score = shared / min(len(old.terms), len(new.terms))
    # "use port 9090 instead of 8080" names the value it replaces next to its own; one
    # shared value alone ("retry 11 times" twice) is a coincidence, not a reference.
    if score >= 0.5 and old.values & new.values and new.values - old.values:
        score += 0.5
    return score


@lru_cache(maxsize=4096)
def _is_weak(text: str) -> bool:
    low = text.lower()
    if not _WEAK_CONSTRAINT.search(text, low):
        return False
    return not (
        _CONSTRAINT.search(text, low)
        or _CORRECTION.search(text, low)
        or _SETTING.search(text, low)
        or _IMPERATIVE.match(text)
    )


def _merge_sources(a: Iterable[int], b: Iterable[int], cap: int) -> list[int]:
    merged = sorted(set(a) | set(b))
    if len(merged) <= cap:
        return merged
    # Keep where a thing started and where it was last seen; the middle matters least.
    head = cap // 2
    return merged[:head] + merged[len(merged) - (cap - head) :]


def _clean_path(raw: str) -> str | None:
    path = raw.rstrip(_PATH_TRAILING)
    if len(path) < 2 or len(path) > 260:
        return None
    if path.startswith(("./", "../", "~/")):
        return path if len(path) > path.index("/") + 1 else None
    segments = [s for s in path.split("/") if s]
    if not segments or all(s.replace(".", "").isdigit() for s in segments):
        return None
    if "/" not in path:
        return path
    if path.startswith("/"):
        # "/health" or "/tmp" alone are more often routes or words than artifacts.
        return path if len(segments) >= 2 or _HAS_EXT.search(path) else None
    if _HAS_EXT.search(segments[-1]):
        return path
    if path.endswith("/") and len(segments) >= 1 and len(segments[0]) >= 2:
        return path
    return None


# A whitespace-separated token that could hold a path: it has a separator, a dot or
# "file" (Makefile). The look-ahead runs only at token starts, so the scan stays linear.
_PATH_CANDIDATE = re.compile(r"(?<!\S)(?=[^\s/.\\]*(?:[/.\\]|file))\S+")


@lru_cache(maxsize=4096)
def _token_paths(token: str) -> tuple[str, ...]:
    found: dict[str, None] = {}
    if "://" in token:
        for m in _URL.finditer(token):
            found.setdefault(m.group(0).rstrip(_PATH_TRAILING), None)
        token = _URL.sub(" ", token)
    if ":\\" in token:
        for m in _WIN_PATH.finditer(token):
            found.setdefault(m.group(0).rstrip(_PATH_TRAILING), None)
        token = _WIN_PATH.sub(" ", token)
    for m in _PATH.finditer(token):
        path = _clean_path(m.group(0))
        if path:
            found.setdefault(path, None)
    return tuple(found)


def _find_paths(text: str, limit: int) -> list[str]:
    # Tool output (source files, logs, listings) repeats the same tokens over and over,
    # and nearly all of its words hold no path: the candidates are picked out by one
    # regex scan, each distinct one is looked at once, and short ones are remembered
    # across messages.
    if "/" not in text and "." not in text and "\\" not in text and "file" not in text:
        return []
    found: dict[str, None] = {}
    for token in dict.fromkeys(_PATH_CANDIDATE.findall(text)):
        paths = _token_paths(token) if len(token) <= 200 else _token_paths.__wrapped__(token)
        for path in paths:
            found.setdefault(path, None)
        if len(found) >= limit:
            break
    return list(found)[:limit]


def _walk_strings(value: Any, key: str = "", depth: int = 0) -> Iterator[tuple[str, str]]:
    # Tool arguments are model output; a pathological nesting must not cost a stack.
    if depth > 16:
        return
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _walk_strings(v, str(k).lower(), depth + 1)
    elif isinstance(value, list):
        for v in value:
            yield from _walk_strings(v, key, depth + 1)


def _parse_args(raw: Any) -> Any:
    if isinstance(raw, dict | list):
        return raw
    if not isinstance(raw, str) or not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return raw


def _format_value(value: Any, limit: int = 60) -> str:
    if isinstance(value, str):
        return json.dumps(_trim(value, limit), ensure_ascii=False)
    if isinstance(value, bool | int | float) or value is None:
        return json.dumps(value)
    return _trim(json.dumps(value, ensure_ascii=False, sort_keys=True), limit)


def _key_args(args: Any) -> str:
    if isinstance(args, str):
        return _format_value(args)
    if not isinstance(args, dict) or not args:
        return ""
    lowered = {str(k).lower(): k for k in args}
    chosen = [lowered[k] for k in _KEY_ARGS if k in lowered][:2]
    if not chosen:
        chosen = [k for k, v in args.items() if not isinstance(v, dict | list)][:2]
    return ", ".join(f"{k}={_format_value(args[k])}" for k in chosen)


def _estimate(text: str) -> float:
    """Rough token count of one rendered line, newline included.

    Prose runs at five to six characters a token, but digits and punctuation (paths,
    source ids, arguments) at little more than one; a CJK character, three UTF-8 bytes,
    is about one token. The caller calibrates against real counts, so this only has to
    be proportionate.
    """
    n = len(text)
    wide = (len(text.encode("utf-8")) - n) / 2
    dense = n - len(text.translate(_DENSE_CHARS))
    return (n - dense - wide) * _PLAIN_COST + dense * _DENSE_COST + wide * _WIDE_COST + 1.3


# ------------------------------------------------------------------------ budget

# What each kind of item may claim of an overfull summary, least important first. Rules
# the user set get the most room; a "make sure" sentence and the superseded history of
# a rule get little, because a model can work without them.
_SHARES: dict[str, float] = {
    "superseded": 0.015,
    "weak": 0.02,
    "tentative": 0.015,
    "tool_activity": 0.025,
    "errors": 0.025,
    "files": 0.04,
    "open_items": 0.03,
    "goals": 0.04,
    "specific": 0.04,
    "decisions": 0.10,
    "constraints": 0.70,
}

# A number standing on its own ("about 4679 records", "30 seconds"), not part of a name
# or a path ("p99", "mod_5.py", "eu-west-1").
_QUANTITY = re.compile(r"(?<![\w./:-])\d+(?:[.,]\d+)*(?![\w/-]|[.,:]\w)", re.ASCII)


def _share_class(e: _Entry) -> str:
    if e.section == "decisions":
        return "tentative" if e.weak else "decisions"
    if e.section == "goals":
        # A request that states a quantity (a size, a limit, a budget) holds a detail the
        # model cannot get back elsewhere; plain requests are replaced by newer ones.
        return "goals" if e.weak else "specific"
    if e.section != "constraints":
        return e.section
    if e.status != "current":
        return "superseded"
    return "weak" if e.weak else "constraints"


# ------------------------------------------------------------------------- draft


@dataclass(eq=False)
class _Entry:
    section: str
    text: str
    sources: list[int]
    seq: int
    status: str = "current"
    terms: frozenset[str] = frozenset()
    values: frozenset[str] = frozenset()
    # the lesser kind of its section, the first to go under the budget (_share_class): a
    # constraint whose only cue is "make sure", a decision that names no choice, a
    # request without a quantity
    weak: bool = False

    def recency(self) -> tuple[int, int]:
        # Sources are kept sorted (_merge_sources), so the last is the most recent.
        return (self.sources[-1] if self.sources else -1, self.seq)


class _Draft:
    """Items under construction, deduplicated per section by normalised text."""

    def __init__(self, pins: list[str], max_sources: int) -> None:
        self.sections: dict[str, list[_Entry]] = {name: [] for name in SECTIONS}
        self._by_key: dict[tuple[str, str], _Entry] = {}
        # rules by their subject words, for restatements with a new value
        self._by_terms: dict[frozenset[str], list[_Entry]] = {}
        self._pins = [k for k in (_norm(p) for p in pins if isinstance(p, str)) if k]
        self._max_sources = max_sources
        self._seq = 0

    def _pinned(self, key: str) -> bool:
        # Near-equal only: a file item "app.py" is not a copy of the pin "never edit app.py".
        for pin in self._pins:
            short, long = (key, pin) if len(key) <= len(pin) else (pin, key)
            if short in long and len(short) >= 0.8 * len(long):
                return True
        return False

    def add(
        self, section: str, text: str, sources: Iterable[int], status: str = "current"
    ) -> _Entry | None:
        text = text.strip()
        src = list(sources)
        key = _norm(text)
        if not key or self._pinned(key):
            return None
        existing = self._by_key.get((section, key))
        if existing is not None:
            existing.sources = _merge_sources(existing.sources, src, self._max_sources)
            # Repeating an instruction makes it current again even if it was corrected.
            if status == "current":
                existing.status = "current"
            return existing
        self._seq += 1
        entry = _Entry(
            section=section,
            text=text,
            sources=_merge_sources(src, (), self._max_sources),
            seq=self._seq,
            status=status,
        )
        if section == "constraints":
            entry.terms, entry.values = _subject(text)
            entry.weak = _is_weak(text)
            self._by_terms.setdefault(entry.terms, []).append(entry)
        elif section == "decisions":
            entry.weak = not _FIRM_DECISION.search(text)
        elif section == "goals":
            entry.weak = _QUANTITY.search(text) is None
        self.sections[section].append(entry)
        self._by_key[(section, key)] = entry
        return entry

    def supersede(self, new: _Entry, message_id: int, *, correction: bool) -> None:
        """Mark the earlier instructions `new` replaces as superseded.

        A correction replaces the instruction it matches best, not every one it resembles:
        "the ledger client should retry 2 times" shares most words with the catalog
        client's retry rule, but all of them with the ledger's own. The best match may
        be one already superseded (a second correction of the ledger's retries); then
        only the current instructions that match as well go. An instruction without a
        correction cue replaces only one with the same words and another value ("Set
        the timeout to 30 seconds" after "Set the timeout to 20 seconds").
        """
        if not new.terms or not (correction or new.values):
            return
        candidates = (
            self.sections["constraints"] if correction else self._by_terms.get(new.terms, ())
        )
        scored: list[tuple[float, _Entry]] = []
        for entry in candidates:
            if entry is new:
                continue
            # Sentences of the same message are read together, not as a correction chain.
            if entry.sources and entry.sources[-1] >= message_id:
                continue
            if correction:
                score = _similarity(entry, new)
            elif entry.terms == new.terms and entry.values and new.values:
                score = 0.0 if entry.values == new.values else 1.0
            else:
                continue
            if score >= 0.5:
                scored.append((score, entry))
        if not scored:
            return
        best = max(score for score, _ in scored)
        for score, entry in scored:
            if score >= best - 0.01:
                entry.status = "superseded"


@dataclass
class _Call:
    name: str
    args: str
    sources: list[int]
    call_id: str | None
    outcome: str = "no result yet"
    paths: list[str] = field(default_factory=list)


# -------------------------------------------------------------------- summarizer


class BuiltinSummarizer:
    """Extractive summarizer used by default and whenever a model summarizer fails.

    max_item_chars: excerpt length for goals, decisions, errors and open items.
    max_constraint_chars: user instructions are kept whole up to this length.
    max_sources: archive ids kept per item (the first and the most recent).
    fold_threshold: more calls than this to one tool in a batch fold into one item.
    max_paths_per_message: bounds the files a single message (a directory listing,
    a traceback) can contribute.
    """

    name = "builtin"
    # extractive and deterministic: incremental summaries do not compound errors, so the
    # drift bound (periodic re-derivation from the archive) does not apply
    drifts = False
    # messages per call when a compaction or rebuild has many to summarize
    chunk_messages = 5000

    def __init__(
        self,
        *,
        max_item_chars: int = 240,
        max_constraint_chars: int = 400,
        max_sources: int = 16,
        fold_threshold: int = 3,
        max_paths_per_message: int = 12,
        truncated_constraint_chars: int = 100,
    ) -> None:
        self.max_item_chars = max_item_chars
        self.max_constraint_chars = max_constraint_chars
        self.max_sources = max(1, max_sources)
        self.fold_threshold = max(1, fold_threshold)
        self.max_paths_per_message = max(1, max_paths_per_message)
        self.truncated_constraint_chars = max(8, truncated_constraint_chars)

    async def summarize(self, request: SummaryRequest) -> Summary:
        return self.summarize_sync(request)

    def summarize_sync(self, request: SummaryRequest) -> Summary:
        draft = _Draft(list(request.pins or []), self.max_sources)
        # A message without an archive id could not be cited, so it cannot be summarized.
        messages: list[tuple[int, dict[str, Any]]] = []
        for m in request.messages:
            mid = _message_id(m)
            if mid is not None:
                messages.append((mid, m))
        answered = {
            str(m.get("tool_call_id"))
            for _, m in messages
            if m.get("role") == "tool" and m.get("tool_call_id") is not None
        }
        self._load_previous(draft, request.previous, answered)

        files: dict[str, list[int]] = {}
        calls: dict[str, _Call] = {}
        activity: list[_Call] = []
        for mid, msg in messages:
            role = msg.get("role")
            text = content_text(msg.get("content"))
            # Prose names the files it means; tool output (listings, tracebacks) names
            # many in passing, so it gets a tighter bound.
            limit = self.max_paths_per_message * 2
            if role == "user":
                self._read_user(draft, mid, text)
            elif role == "assistant":
                self._read_assistant(draft, mid, text)
                for n, call in enumerate(msg.get("tool_calls") or []):
                    record = self._read_call(call, mid, n)
                    if record.call_id is not None:
                        calls[record.call_id] = record
                    activity.append(record)
                    for path in record.paths:
                        files.setdefault(path, []).append(mid)
            elif role == "tool":
                self._read_result(draft, msg, mid, text, calls, activity)
                limit = self.max_paths_per_message
            for path in _find_paths(text, limit) if text else ():
                files.setdefault(path, []).append(mid)

        for path, ids in files.items():
            draft.add("files", path, ids)
        self._add_activity(draft, activity)

        prev = request.previous
        covers_from = prev.covers_from
        covers_to = prev.covers_to
        if messages:
            first = min(mid for mid, _ in messages)
            last = max(mid for mid, _ in messages)
            covers_from = first if covers_from is None else min(covers_from, first)
            covers_to = last if covers_to is None else max(covers_to, last)

        sections = self._fit(draft, request)
        return Summary(
            sections=sections,
            covers_from=covers_from,
            covers_to=covers_to,
            compaction_ids=list(prev.compaction_ids),
            summarizer=self.name,
        )

    # ------------------------------------------------------------------ reading

    def _load_previous(self, draft: _Draft, previous: Summary, answered: set[str]) -> None:
        for name in SECTIONS:
            for item in previous.sections.get(name) or []:
                if name == "open_items":
                    note = _CALL_ID_NOTE.search(item.text)
                    # The call this item waited on has its result now; it is no longer open.
                    if note and note.group(1) in answered:
                        continue
                draft.add(name, item.text, item.sources, item.status)

    def _read_user(self, draft: _Draft, mid: int, text: str) -> None:
        low = text.lower()
        may_correct = _CORRECTION.gate(low)
        may_constrain = _CONSTRAINT.gate(low) or _WEAK_CONSTRAINT.gate(low)
        may_set = _SETTING.gate(low)
        may_open = _OPEN.gate(low)
        may_fail = _ERROR_ANY.gate(low)
        goal: list[str] = []
        for sentence in _sentences(text):
            slow = sentence.lower()
            is_correction = bool(
                may_correct
                and _CORRECTION.search(sentence, slow)
                and not _ADDITIVE.search(sentence)
            )
            if (
                is_correction
                or _IMPERATIVE.match(sentence)
                or (may_set and _SETTING.search(sentence, slow))
                or (
                    may_constrain
                    and (
                        _CONSTRAINT.search(sentence, slow)
                        or _WEAK_CONSTRAINT.search(sentence, slow)
                    )
                )
            ):
                entry = draft.add(
                    "constraints", _trim(sentence, self.max_constraint_chars), [mid]
                )
                if entry is not None:
                    draft.supersede(entry, mid, correction=is_correction)
                continue
            if may_open and _OPEN.search(sentence, slow):
                draft.add("open_items", _trim(sentence, self.max_item_chars), [mid])
                continue
            # Lines of pasted output are covered by the one excerpt below; a traceback
            # would otherwise become an error item per line.
            if (
                may_fail
                and _is_error_text(sentence, anchored=False, low=slow)
                and not _ERROR_LINE.search(sentence, slow)
            ):
                draft.add("errors", _trim(sentence, self.max_item_chars), [mid])
            goal.append(sentence)
        pasted = _error_excerpt(text) if may_fail else None
        if pasted:
            draft.add("errors", _trim(pasted, self.max_item_chars), [mid])
        request = " ".join(goal)
        # "ok", "thanks", "继续" carry no request worth keeping.
        if len(request) >= 12 or (len(request) >= 4 and _CJK_RUN.search(request)):
            draft.add("goals", _trim(request, self.max_item_chars), [mid])

    def _read_assistant(self, draft: _Draft, mid: int, text: str) -> None:
        if not text:
            return
        low = text.lower()
        may_open = _OPEN.gate(low)
        may_decide = _DECISION.gate(low)
        decisions = 0
        for sentence in _sentences(text) if may_open or may_decide else ():
            slow = sentence.lower()
            if may_open and _OPEN.search(sentence, slow):
                draft.add("open_items", _trim(sentence, self.max_item_chars), [mid])
            elif may_decide and decisions < 3 and _DECISION.search(sentence, slow):
                decisions += 1
                draft.add("decisions", _trim(sentence, self.max_item_chars), [mid])
        # The assistant talks about errors it fixed; only quoted error output counts.
        line = _error_excerpt(text)
        if line:
            draft.add("errors", _trim(line, self.max_item_chars), [mid])

    def _read_call(self, call: Any, mid: int, index: int) -> _Call:
        if not isinstance(call, dict):
            return _Call(name="?", args="", sources=[mid], call_id=None)
        fn = call.get("function") if isinstance(call.get("function"), dict) else {}
        name = str(fn.get("name") or call.get("name") or "?")
        args = _parse_args(fn.get("arguments", call.get("arguments")))
        paths: dict[str, None] = {}
        if isinstance(args, str):
            for p in _find_paths(args, self.max_paths_per_message):
                paths.setdefault(p, None)
        else:
            for key, value in _walk_strings(args):
                value = value.strip()
                if (
                    key in _PATH_KEYS
                    and value
                    and len(value) <= 260
                    and not any(c.isspace() for c in value)
                ):
                    path = value.rstrip(",;")
                    if len(path.strip("./")) >= 2:
                        paths.setdefault(path, None)
                else:
                    for p in _find_paths(value, self.max_paths_per_message):
                        paths.setdefault(p, None)
        call_id = call.get("id")
        return _Call(
            name=name,
            args=_key_args(args),
            sources=[mid],
            call_id=str(call_id) if call_id is not None else f"#{mid}.{index}",
            paths=list(paths)[: self.max_paths_per_message],
        )

    def _read_result(
        self,
        draft: _Draft,
        msg: dict[str, Any],
        mid: int,
        text: str,
        calls: dict[str, _Call],
        activity: list[_Call],
    ) -> None:
        call_id = msg.get("tool_call_id")
        record = calls.get(str(call_id)) if call_id is not None else None
        if record is None:
            # The call was compacted earlier; the result still says what happened.
            record = _Call(
                name=str(msg.get("name") or "tool"), args="", sources=[], call_id=None
            )
            activity.append(record)
        record.sources.append(mid)
        first_line = text.lstrip().split("\n", 1)[0] if text else ""
        # Tool frameworks often report failure as a bare first line ("Failed to ...").
        failed = _is_error_text(text, anchored=True) or bool(_FAILURE_START.match(first_line))
        record.outcome = "error" if failed else "ok"
        if failed:
            line = _error_excerpt(text) or first_line
            draft.add(
                "errors", _trim(f"{record.name}: {line.strip()}", self.max_item_chars),
                record.sources,
            )

    def _add_activity(self, draft: _Draft, activity: list[_Call]) -> None:
        by_name: dict[str, list[_Call]] = {}
        for record in activity:
            by_name.setdefault(record.name, []).append(record)
        done: set[str] = set()
        for record in activity:
            if record.outcome == "no result yet" and record.call_id is not None:
                label = f"{record.name}({record.args})" if record.args else record.name
                draft.add(
                    "open_items",
                    f"{_trim(label, self.max_item_chars)} — no result yet "
                    f"(call_id {record.call_id})",
                    record.sources,
                )
            group = by_name[record.name]
            if len(group) <= self.fold_threshold:
                label = f"{record.name}({record.args})" if record.args else record.name
                draft.add(
                    "tool_activity",
                    _trim(f"{label} → {record.outcome}", self.max_item_chars),
                    record.sources,
                )
                continue
            if record.name in done:
                continue
            done.add(record.name)
            draft.add("tool_activity", self._fold(group), [s for r in group for s in r.sources])

    def _fold(self, group: list[_Call]) -> str:
        outcomes: dict[str, int] = {}
        shown: dict[str, None] = {}
        for record in group:
            outcomes[record.outcome] = outcomes.get(record.outcome, 0) + 1
            if record.args:
                shown.setdefault(record.args, None)
        tally = ", ".join(f"{n} {outcome}" for outcome, n in outcomes.items())
        args = list(shown)
        listed = "; ".join(args[:3]) + ("; …" if len(args) > 3 else "")
        text = f"{group[0].name} ×{len(group)} ({tally})"
        if listed:
            text += f": {listed}"
        return _trim(text, self.max_item_chars)

    # ------------------------------------------------------------------- budget

    def _fit(self, draft: _Draft, request: SummaryRequest) -> dict[str, list[SummaryItem]]:
        budget = request.budget_tokens
        if budget <= 0:
            return {}
        entries = {name: list(draft.sections[name]) for name in SECTIONS}
        if not any(entries.values()):
            return {}
        texts: dict[int, str] = {id(e): e.text for es in entries.values() for e in es}

        # Estimated size after applying each prefix of the plan, so a cut point can be
        # chosen without counting tokens for every candidate.
        line_est: dict[int, float] = {}
        alive: dict[str, int] = {name: len(es) for name, es in entries.items()}
        header_est = {name: _estimate(f"## {title}") for name, title in SECTIONS.items()}
        total = 0.0
        for name, es in entries.items():
            if es:
                total += header_est[name]
            for e in es:
                est = _estimate(_line(e, e.text))
                line_est[id(e)] = est
                total += est
        ops = self._drop_plan(entries, request.instructions, dict(line_est))
        after = [total]
        for kind, e, new_text in ops:
            if kind == "drop":
                total -= line_est[id(e)]
                alive[e.section] -= 1
                if alive[e.section] == 0:
                    total -= header_est[e.section]
            else:
                est = _estimate(_line(e, new_text))
                total += est - line_est[id(e)]
                line_est[id(e)] = est
            after.append(max(total, 0.0))

        def build(k: int) -> dict[str, list[SummaryItem]]:
            dropped: set[int] = set()
            changed = dict(texts)
            for kind, e, new_text in ops[:k]:
                if kind == "drop":
                    dropped.add(id(e))
                else:
                    changed[id(e)] = new_text
            out: dict[str, list[SummaryItem]] = {}
            for name, es in entries.items():
                items = [
                    SummaryItem(text=changed[id(e)], sources=list(e.sources), status=e.status)
                    for e in es
                    if id(e) not in dropped
                ]
                if items:
                    out[name] = items
            return out

        count: Callable[[str], int] = request.count_tokens
        # lo: a prefix known to be too big; hi: one known to fit (the whole plan leaves
        # nothing, which always fits).
        lo, hi = -1, len(ops)
        best: dict[str, list[SummaryItem]] | None = None
        # The estimate runs a few percent high on typical summaries; starting from that
        # ratio, the first probe usually lands within the budget and close to it.
        ratio = 0.94
        target = budget * 0.97
        probes = 0
        while hi - lo > 1 and probes < 16:
            if probes < 4:
                k = next((i for i in range(lo + 1, hi) if after[i] * ratio <= target), hi - 1)
            else:
                k = (lo + hi) // 2
            k = min(max(k, lo + 1), hi - 1)
            sections = build(k)
            measured = count(Summary(sections=sections).render())
            probes += 1
            if measured <= budget:
                hi, best = k, sections
                if measured >= budget * 0.9:
                    break
            else:
                lo = k
            if after[k] > 0 and measured > 0:
                ratio = measured / after[k]
        # Nothing measured fits: only the empty summary (the whole plan applied) is left.
        return best if best is not None else {}

    def _drop_plan(
        self, entries: dict[str, list[_Entry]], instructions: str | None, est: dict[int, float]
    ) -> list[tuple[str, _Entry, str]]:
        """The order items go in when the summary is over budget; a prefix is applied.

        Each kind of item may claim its share of what is left (`_SHARES`): the kind
        furthest over its share loses its oldest item next, and what a kind does not
        use goes to the others. So a long session keeps its recent decisions and files
        next to its rules instead of dropping whole sections in turn. Every section
        keeps its most recent item until everything else is gone, and items the
        instructions ask to focus on go after all others of their kind. `est` holds
        each item's estimated size; it is updated as long rules are shortened.
        """
        focus = _key_terms(instructions) if instructions else frozenset()

        def favoured(e: _Entry) -> bool:
            if not focus:
                return False
            terms = (e.terms | e.values) or _key_terms(e.text)
            return bool(terms & focus)

        order = {name: i for i, name in enumerate(_SHARES)}
        size: dict[str, float] = dict.fromkeys(_SHARES, 0.0)
        floors: list[_Entry] = []
        by_class: dict[str, list[_Entry]] = {name: [] for name in _SHARES}
        for name, es in entries.items():
            for e in es:
                cls = _share_class(e)
                size[cls] += est[id(e)]
                by_class[cls].append(e)
            pool = [e for e in es if e.status == "current"] if name == "constraints" else es
            if pool:
                floors.append(max(pool, key=_Entry.recency))
        floor_ids = {id(e) for e in floors}
        for members in by_class.values():
            members.sort(key=_Entry.recency)
        # A long rule loses its tail before any rule is lost.
        trims: deque[tuple[_Entry, str]] = deque()
        for e in by_class["constraints"]:
            short = _trim(e.text, self.truncated_constraint_chars)
            if short != e.text:
                trims.append((e, short))

        ops: list[tuple[str, _Entry, str]] = []
        for keep_focus in (False, True):
            queues = {
                cls: deque(
                    e for e in members if id(e) not in floor_ids and favoured(e) == keep_focus
                )
                for cls, members in by_class.items()
            }
            # The kind furthest over its share first; ties go to the one listed first in
            # _SHARES, the one that matters least. Only the chosen kind's size changes,
            # so its heap entry is the only one to renew.
            heap = [
                (-size[cls] / _SHARES[cls], order[cls], cls)
                for cls in _SHARES
                if queues[cls] or (cls == "constraints" and trims)
            ]
            heapq.heapify(heap)
            while heap:
                _, _, cls = heapq.heappop(heap)
                if cls == "constraints" and trims:
                    e, short = trims.popleft()
                    saved = est[id(e)] - _estimate(_line(e, short))
                    est[id(e)] -= saved
                    size[cls] -= saved
                    ops.append(("trim", e, short))
                else:
                    e = queues[cls].popleft()
                    size[cls] -= est[id(e)]
                    ops.append(("drop", e, ""))
                if queues[cls] or (cls == "constraints" and trims):
                    heapq.heappush(heap, (-size[cls] / _SHARES[cls], order[cls], cls))
        floors.sort(key=lambda e: (favoured(e), order[_share_class(e)]))
        ops.extend(("drop", e, "") for e in floors)
        return ops


def _line(entry: _Entry, text: str) -> str:
    refs = ",".join(str(s) for s in entry.sources[:8])
    mark = "[superseded] " if entry.status == "superseded" else ""
    return f"- {mark}{text} [msg {refs}]"


def _message_id(msg: Any) -> int | None:
    if not isinstance(msg, dict):
        return None
    raw = msg.get("id")
    if isinstance(raw, bool):
        return None
    try:
        return int(raw)
    except (TypeError, ValueError):
        return None


def _error_excerpt(text: str) -> str | None:
    if not text or not _ERROR_LINE.search(text):
        return None
    best: str | None = None
    best_score = 0
    for line in text.splitlines():
        if not _is_error_text(line, anchored=True):
            continue
        # A named exception with its message says the most; in a traceback the last
        # one is the cause that surfaced, so later lines win ties among those.
        score = 3 if _NAMED_EXCEPTION.search(line) else 2 if _FAILURE_START.match(line) else 1
        if score > best_score or (score == 3 and score == best_score):
            best, best_score = line.strip(), score
    return best
