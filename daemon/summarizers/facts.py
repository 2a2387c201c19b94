"""Kinds of facts: hedged statements, settings (subject -> value) and the agent's artifacts.

Pure functions over text; the draft (draft.py) decides what they mean for the summary.
"""

from __future__ import annotations

import re

from ctxd.daemon.summarizers.cues import (
    _CJK_RUN,
    _Cue,
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
    r"|未验证|还没验证|没有验证|尚未验证|不一定|我猜|假设|待确认|待验证",
    "probab|possib|perhaps|presumabl|likely|maybe|might|may|could be|seem|appear|i think"
    "|i believe|i suspect|i guess|guess|not sure|unsure|unconfirmed|unverified|hypothes"
    "|not confirmed|not yet|not verified|not certain|not proven|confirmed|verified|checked"
    "|tested|not hold|推测|猜测|可能|也许|或许|大概|似乎|好像|估计|不确定|确认|验证|不一定"
    "|我猜|假设|应该是",
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


# "应该是缓存的问题" guesses; "应该是 30 秒", "应该是周二" set a value, and "不对，…应该是…"
# or "负责人应该是张三" correct one: those are firm
_SHOULD_BE = re.compile(r"应该是(?!\s*(?:[0-9A-Za-z]|周[一二三四五六日天]|星期|礼拜))")
_SHOULD_BE_FIRM = re.compile(r"不对|搞错|错了|负责|而是|改成|改为|改到")


def is_hedged(text: str) -> bool:
    if _HEDGE.search(text):
        return True
    return "应该是" in text and bool(_SHOULD_BE.search(text)) and not _SHOULD_BE_FIRM.search(text)


def is_hedge_only(sentence: str, hedged: bool | None = None) -> bool:
    """A short sentence whose job is to qualify the previous one."""
    if not (is_hedged(sentence) if hedged is None else hedged):
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

# what a call produced is read in artifacts.py, what a setting is and when a later
# statement replaces it in settings.py; summarizers reach both from here too
from ctxd.daemon.summarizers.artifacts import artifacts_of, made_commits  # noqa: E402, F401
from ctxd.daemon.summarizers.settings import (  # noqa: E402, F401
    Setting,
    same_subject,
    setting_of,
)
