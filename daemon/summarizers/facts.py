"""Kinds of facts: hedged statements, settings (subject -> value) and the agent's artifacts.

Pure functions over text; the draft (draft.py) decides what they mean for the summary.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from ctxd.daemon.summarizers.cues import (
    _CJK_RUN,
    _CJK_STOP,
    _STOP,
    _TOKEN,
    _TOKEN_PARTS,
    _Cue,
    _stem,
    _trim,
)

# ------------------------------------------------------------------------- hedges

# "可能" is not the one in "不可能" (impossible), nor "may" the month in a date.
_HEDGE = _Cue(
    r"\b(?:probably|possibly|perhaps|presumably|likely|unlikely|maybe|might|may(?! \d)"
    r"|could be|seems?|appears? to|i think|i believe|i suspect|i guess|my guess|a guess"
    r"|not sure|unsure|unconfirmed|unverified|hypothes[ie]s"
    r"|not (?:yet )?(?:confirmed|verified|certain|proven)"
    r"|(?:haven[’']?t|have not|hasn[’']?t|has not|didn[’']?t|did not) (?:yet )?"
    r"(?:confirmed|verified|checked|tested)|may not hold|not hold)\b"
    r"|推测|猜测|(?<!不)可能|也许|或许|大概|似乎|好像|估计|不确定|未确认|尚未确认|没确认|还没确认"
    r"|未验证|还没验证|没有验证|尚未验证|不一定|我猜|假设",
    "probab|possib|perhaps|presumabl|likely|maybe|might|may|could be|seem|appear|i think"
    "|i believe|i suspect|i guess|guess|not sure|unsure|unconfirmed|unverified|hypothes"
    "|not confirmed|not yet|not verified|not certain|not proven|confirmed|verified|checked"
    "|tested|not hold|推测|猜测|可能|也许|或许|大概|似乎|好像|估计|不确定|确认|验证|不一定"
    "|我猜|假设",
)
# A sentence that only qualifies the one before it: "I haven't confirmed that.",
# "不过这只是推测。", "This is unconfirmed so far."
_BACK_REFERENCE = re.compile(
    r"^\W*(?:but|though|however|although|that|this|it|not|i|we|so far"
    r"|不过|但|但是|这|那|只是|我|还)",
    re.IGNORECASE,
)
_CONFIRMED = _Cue(
    r"\b(?:confirmed|verified|proven|turns out)\b|已确认|确认了|证实|验证过了|已验证",
    "confirmed|verified|proven|turns out|确认|证实|验证",
)


def is_hedged(text: str) -> bool:
    return _HEDGE.search(text)


def is_hedge_only(sentence: str, hedged: bool | None = None) -> bool:
    """A short sentence whose job is to qualify the previous one."""
    if not (_HEDGE.search(sentence) if hedged is None else hedged):
        return False
    cjk = sum(len(r) for r in _CJK_RUN.findall(sentence))
    short = len(sentence) <= 70 if not cjk else cjk <= 18
    return short and bool(_BACK_REFERENCE.match(sentence))


def is_confirmation(sentence: str, hedged: bool = False) -> bool:
    return not hedged and _CONFIRMED.search(sentence)


def trim_keeping_hedge(text: str, limit: int) -> str:
    """`_trim`, but a hedge past the cut is kept: the middle goes instead."""
    short = _trim(text, limit)
    if short == text or not short.endswith("…") or _HEDGE.search(short[:-1]):
        return short
    hedges = list(_HEDGE.regex.finditer(text))
    if not hedges:
        return short
    at = hedges[-1].start()
    # the clause holding the hedge, or from the hedge on when that clause is long
    start = max(text.rfind(sep, 0, at) for sep in (",", "，", ";", "；", " — "))
    room = max(limit // 2, 24)
    clause = text[start + 1 :].strip(" —") if start >= 0 else text[at:]
    if len(clause) > room:
        clause = text[at:]
    clause = _trim(clause, room)
    head = _trim(text, max(limit - len(clause) - 2, 16))
    return f"{head.rstrip('…').rstrip()} … {clause}"


# ----------------------------------------------------------------------- settings

_WEEKDAY = (
    r"monday|tuesday|wednesday|thursday|friday|saturday|sunday"
    r"|(?:周|星期|礼拜)[一二三四五六日天](?:上午|下午|晚上|早上)?"
)
# a value with its position: numbers, versions, sizes, numbered names, weekdays
_VALUE = re.compile(
    r"(?<![\w.])(?:\d+(?:[.,:]\d+)*(?:\s?(?:%|ms|s|m|h|d|kb|mb|gb|k)\b)?"
    r"|[a-z]+(?:-[a-z0-9]+)*-\d+[a-z]?)(?!\w|\.\d)|" + _WEEKDAY,
    re.IGNORECASE,
)
# what precedes an old value: "45 days, not 30", "instead of 8080", "从原来的 500 调整到"
_OLD_BEFORE = re.compile(
    r"(?:\bnot|instead of|rather than|\bfrom|\bwas|previously|no longer"
    r"|不是|而不是|原来的?|从|之前的?|以前的?)\s*$",
    re.IGNORECASE,
)
# update verbs and copulas: a sentence with one of these and a value sets something
_SETS = re.compile(
    r"\b(?:set|raise|lower|increase|decrease|reduce|bump|make|change|move|use|go with"
    r"|switch|should be|must be|is|are|will be|from now on|limit|cap)\b|:|="
    r"|设为|设置为|设成|定为|定在|安排在|改到|改在|改成|改为|调整|调到|提高到|降低到|应该是|是|用|按"
    r"|换成|放在",
    re.IGNORECASE,
)
# verbs stripped before Chinese bigrams, so "大小改到" does not make the bigram "小改"
_CJK_VERBS = re.compile(
    r"设为|设置为|设成|先定为|定为|定在|安排在|改到|改在|改成|改为|改用|使用|采用|调整到|调整为|调整|调到|"
    r"提高到|降低到|"
    r"应该是|需要|"
    r"从原来的|原来的|用|按|吧|换成|以后|放在|不是|而是|不对|搞错了?|是|了"
)
_CLAUSE = re.compile(r"[，,；;]")
_PUNCT = " 。.！!？?：:，,；;"
_SUBJECT_STOP = _STOP | frozenset(
    """raise lower increase decrease reduce bump go from now on be with after before
    look looking correction update updated ll ve re""".split()
)


# A named value: the choice after "use ... for", "switch ... to", "改用"; or the one a
# sentence says it replaces ("instead of X", "not X", "而不是 X")
_NAME = r"([a-z][\w.+#-]*[\w+#]|[a-z])"
_NAMED = re.compile(
    r"\b(?:use|using|go with|adopt|prefer|pick|choose|switch to|move to)\s+" + _NAME
    + r"(?=\s+(?:for|as|in|on|instead|rather)\b)"
    + r"|\b(?:switch|change|move|migrate)\b[^.。;；]*?\bto\s+" + _NAME + r"\b"
    + r"|(?:改用|换成|改成|改为|使用|采用|用)\s*" + _NAME
    + r"|(?:\binstead of|\brather than|,\s*not)\s+" + _NAME + r"\b"
    + r"|(?:而不是|不是|不用)\s*" + _NAME,
    re.IGNORECASE,
)
_NAMED_OLD = frozenset({4, 5})


@dataclass(frozen=True)
class Setting:
    terms: frozenset[str]  # what is set
    values: frozenset[str]  # the value(s) it is set to
    old: frozenset[str]  # values it names as replaced ("not 30")
    order: tuple[str, ...] = ()  # the terms in the order they were written
    label: str | None = None  # the subject, readable: "importer batch size", "对账任务的批处理大小"


def _norm_value(v: str) -> str:
    return re.sub(r"\s+", "", v.casefold())


@lru_cache(maxsize=4096)
def setting_of(text: str, loose: bool = False) -> Setting | None:
    """The setting a sentence states, or None: it needs a value and a subject, and
    (unless `loose`: the sentence is already known to be a rule) a verb that sets."""
    low = text.casefold()
    values: list[str] = []
    old: list[str] = []
    spans: list[tuple[int, int]] = []
    for m in _VALUE.finditer(low):
        v = _norm_value(m.group(0))
        spans.append(m.span())
        (old if _OLD_BEFORE.search(low[max(0, m.start() - 16) : m.start()]) else values).append(v)
    if not values and not spans:
        # no number or day: a named choice ("use Redis for the job queue", "缓存改用 Redis")
        for m in _NAMED.finditer(low):
            group = next(g for g in range(1, 6) if m.group(g))
            v = m.group(group)
            if v in _STOP or len(v) < 2:
                continue
            spans.append(m.span(group))
            (old if group in _NAMED_OLD else values).append(v)
    if not values or not (loose or _SETS.search(low)):
        return None
    stripped = low
    for a, b in reversed(spans):
        stripped = stripped[:a] + " " + stripped[b:]
    order: list[str] = []
    for token in _TOKEN.findall(stripped):
        for w in _TOKEN_PARTS.split(token):
            if len(w) >= 2 and w not in _SUBJECT_STOP and not w.isdigit():
                order.append(_stem(w))
    if _CJK_RUN.search(low):
        # Chinese states a setting in the clause holding the value; a long sentence's
        # other clauses (reasons, plans) would drown the subject.
        clauses = [c for c in _CLAUSE.split(low) if _VALUE.search(c)]
        # The subject comes before the value ("到期窗口按 60128 天来"): what follows is the
        # unit and particles. A clause that is little more than the value ("应该是重试 2
        # 次，账本客户端改成这样") leaves its subject to the rest of the sentence.
        for scope in ([_before_value(c) for c in clauses], clauses, [low]):
            grams = _bigrams(scope)
            if len(set(grams)) >= 3:
                break
        order += grams
    if not order:
        return None
    if _CJK_RUN.search(low):
        # the subject comes before the value in Chinese: "复盘会改到周二上午"
        first = min(a for a, _ in spans)
        start = max(text.rfind(sep, 0, first) for sep in "，,；;") + 1
        head = text[start:first] if first - start > 1 else text
        label = re.sub(r"\s+", "", _VALUE.sub("", _CJK_VERBS.sub("", head))).strip(_PUNCT)
    else:
        label = " ".join(dict.fromkeys(order))
    return Setting(
        frozenset(order), frozenset(values), frozenset(old), tuple(order), label[:60] or None
    )


def _before_value(clause: str) -> str:
    m = _VALUE.search(clause)
    return clause[: m.start()] if m else clause


def _bigrams(clauses: list[str]) -> list[str]:
    grams: list[str] = []
    for clause in clauses:
        clause = _VALUE.sub(" ", _CJK_VERBS.sub(" ", clause))
        for run in _CJK_RUN.findall(clause):
            grams += (run[i : i + 2] for i in range(len(run) - 1))
    return [g for g in grams if g not in _CJK_STOP]


def _inner_extra(order: tuple[str, ...], shared: frozenset[str]) -> bool:
    """Whether a word the other statement lacks sits among the shared ones: "inventory
    admin service" is another subject than "inventory service"; a reason or a time
    around the subject ("after looking at the dashboards, ...") is not."""
    at = [i for i, w in enumerate(order) if w in shared]
    return bool(at) and any(w not in shared for w in order[at[0] : at[-1]])


def same_subject(old: Setting, new: Setting) -> float:
    """How surely two settings are about the same subject (0: not at all).

    The smaller subject must be (almost) all inside the larger one: "billing batch size"
    is inside a long rephrasing of it, while "billing page size" shares only half.
    """
    shared = len(old.terms & new.terms)
    if not shared:
        return 0.0
    # the closer overall match breaks ties: "port for the inventory service" is the
    # inventory service's port rather than the inventory admin service's
    score = shared / min(len(old.terms), len(new.terms))
    score += 0.1 * shared / max(len(old.terms), len(new.terms))
    # a word swapped for another on both sides ("shipping cache TTL" in one long sentence,
    # "inventory cache TTL" in the same sentence otherwise) names another subject
    only_old, only_new = len(old.terms - new.terms), len(new.terms - old.terms)
    common = old.terms & new.terms
    if (only_old and only_new and max(only_old, only_new) <= 3) or (
        _inner_extra(old.order, common) or _inner_extra(new.order, common)
    ):
        # naming the old value does not make up for it: "instead of Redis" may be the
        # Redis of another subject
        return score * 0.6
    if new.old & old.values:  # "45 days, not 30": it names the value it replaces
        score += 0.5
    return score


# ---------------------------------------------------------------------- artifacts

# what a call produced is read in artifacts.py; summarizers reach it from here too
from ctxd.daemon.summarizers.artifacts import artifacts_of  # noqa: E402, F401
