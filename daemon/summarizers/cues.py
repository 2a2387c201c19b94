"""Cue patterns and text helpers the built-in summarizer reads messages with."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from functools import lru_cache

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
    # "…presets to avoid reinventing workflows" says what for, "avoid X" is a rule
    r"\b(?:must(?:n[’']?t| not)?|always|(?<!\bto\s)avoid|should(?:n[’']?t| not)|no longer"
    # "I never said that" tells what happened; "rave-only" names a kind of thing
    r"|never(?!\s+(?:said|told|asked|meant|wanted|did|had|was|were|knew|saw|got|thought)\b)"
    r"|(?<!-)only(?!-)"
    r"|for the record|fyi|keep in mind|bear in mind|note that|remember that|mandatory)\b"
    # "i don't really have any right now" tells about the speaker, it asks nothing
    # "humans let emotions win, agents do not." ends a statement: there is nothing to do
    r"|\b(?<!\bi\s)(?:don[’']?t|dont|do not)\b(?!\s+forget)(?![\s.,!;]*$)"
    r"|\bi\s+(?:don[’']?t|dont|do not)\b(?!\s+(?:forget|(?:really\s+)?(?:have|know|think"
    r"|remember|see|get|understand|recall|mind|care|feel|believe)\b))(?![\s.,!;]*$)"
    r"|必须|必須|不要(?!忘)|禁止|务必(?!须)|務必(?!須)|一定要|不能|只能|不许|不許|不准|请勿|請勿"
    r"|备注|備註|记住|記住"
    # 应该 ("should") that guesses (应该是, 应该可以, 应该没问题) is no rule
    r"|不需要|应该(?!是|可以|没|不会|能|会|就|也|还|在|已|有)"
    r"|(?<![特区分识级类告性个派差鉴辨])别(?![的人名处忘])",
    "must|never|don|do not|always|avoid|only|should|no longer|for the record|fyi"
    "|keep in mind|bear in mind|note that|remember that|mandatory"
    "|必须|必須|不要|禁止|务必|務必|一定要|不能|只能|不许|不許|不准|请勿|請勿|备注|備註|记住|不需要|应该"
    "|記住|别",
)

# "Make sure the tests still pass" is as often a one-off request as a standing rule, so
# a sentence with no stronger cue is kept as a constraint but is the first to go.
# "Read the setup notes to ensure the environment is ready" says what for, not a rule
# "Prefer `type` over `interface`": force without a modal verb.
_WEAK_CONSTRAINT = _Cue(
    r"(?<!\bto\s)\b(?:make sure|ensure)\b|(?<!以)确保|\bprefer\b",
    "make sure|ensure|确保|prefer",
)
# "— no custom CSS files", "No `any` types, ever": a rule when a person writes it; in a
# spec pasted in ("no fee", "yes pool, no pool") it describes the thing to build
NO_X = re.compile(
    r"(?:^|[—–:;,]\s*|\s-\s)no\s+(?!(?:one|idea|problem|worries|thanks|need|matter|doubt"
    r"|way|longer|more)\b)[`*\w]",
    re.IGNORECASE,
)

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

COUNTER_PROPOSAL = (
    r"不是更(?:好|合适|清楚|准确|直观|简单|合理|贴切)(?:一些|一点)?吗|岂不是?更"
    r"|\bwouldn[’']?t\s+(?:it\s+)?(?:\w+\s+){0,4}be\s+(?:better|clearer|simpler)\b"
)

_CORRECTION = _Cue(
    r"\bactually\b|\binstead\b|\bno\s?[,，!]|^\s*nope\b|\bchange\b[^.。!?]{0,60}?\bto\b"
    r"|\bswitch(?:ed)? to\b|\bi meant\b|\brather than\b|\bscratch that\b|\bwrong\b"
    r"|不对|改成|改为|换成|不是[^。]{0,30}而是|应该是|搞错"
    # "不，我希望用旧的": a reply that rejects the choice made; "叫锁定不是更好吗": a
    # counter-proposal naming the value wanted instead
    r"|^\s*不\s*[，,!！]\s*\S|" + COUNTER_PROPOSAL,
    "actually|instead|no,|no ,|no，|no ，|no!|no !|nope|change|switch|i meant|rather than"
    "|scratch that|wrong|不对|改成|改为|换成|而是|应该是|搞错|不，|不,|不!|不！|不 |不是更|岂不"
    "|be better",
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
    # "a TODO app" is a kind of app, not a thing left to do
    r"(?-i:\bTODO\b(?!\s+(?:app|list|item|application|manager)s?\b)|\bFIXME\b)"
    r"|\bnext steps?\b|\bstill (?:need|needs|have to|has to)\b"
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
    # not a time: "17:41 errors" is a directory an `ls -l` lists
    (r"[1-9](?<![\w:.][1-9])\d* (?:failed|errors?)\b", " failed| error"),
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

_CALL_ID_NOTE = re.compile(r"\(call_id ([^\s()]+)\)\s*$")


# The previous summary's items are keyed (_norm) and trimmed to the same lengths again
# at every compaction, and their texts do not change: the results for texts up to this
# long are remembered. Items are shorter (rules are kept up to 400 characters); longer
# texts, a pasted paragraph, are rarely seen twice and would only hold memory.
_CACHED_CHARS = 500


def _norm(text: str) -> str:
    """The key an item is deduplicated by."""
    return _norm_cached(text) if len(text) <= _CACHED_CHARS else _norm_uncached(text)


def _norm_uncached(text: str) -> str:
    return _WS.sub(" ", text).strip().casefold().rstrip(_TRAILING)


_norm_cached = lru_cache(maxsize=8192)(_norm_uncached)


def _trim(text: str, limit: int) -> str:
    if len(text) <= _CACHED_CHARS:
        return _trim_cached(text, limit)
    return _trim_uncached(text, limit)


def _trim_uncached(text: str, limit: int) -> str:
    text = _WS.sub(" ", text).strip()
    if len(text) <= limit:
        return text
    cut = text[: max(limit - 1, 1)]
    space = cut.rfind(" ")
    # Cut at a word boundary when one is near, so the excerpt does not end mid-word.
    if space >= limit * 0.75:
        cut = cut[:space]
    return cut.rstrip() + "…"


_trim_cached = lru_cache(maxsize=8192)(_trim_uncached)


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


def _error_excerpt(text: str, matched: bool = False) -> str | None:
    """The line of `text` that says most about what went wrong, if any. `matched`: the
    caller already found `_ERROR_LINE` in `text`, which a long output need not be
    searched for twice."""
    if not text or not (matched or _ERROR_LINE.search(text)):
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

