"""The kind of a sentence a user wrote: a rule, a correction, or neither.

A rule has deontic force (must, never, only, do not, 必须, 不要...) or sets how something
is (a setting, "use port 8080"); a request to do something is a task, whatever numbers
it names; a question sets nothing.
"""

from __future__ import annotations

import re

from ctxd.daemon.summarizers.cues import (
    _ADDITIVE,
    _CONSTRAINT,
    _CORRECTION,
    _IMPERATIVE,
    _SETTING,
    _WEAK_CONSTRAINT,
    COUNTER_PROPOSAL,
    NO_X,
)
from ctxd.daemon.summarizers.facts import setting_of
from ctxd.daemon.summarizers.sentences import Unit, introduces_list, is_request, strip_series

# a verb that sets a value: a request that has one ("please raise the batch size to
# 2000") still changes a setting
_SETS_VALUE = re.compile(
    r"\b(?:set|raise|lower|increase|decrease|reduce|bump|change|switch|limit|cap|use"
    r"|should (?:now )?be|must be|needs? to be|has to be|go with|from now on)\b"
    r"|设为|设置为|设成|改到|改成|改为|调整|调到|换成|改用|使用|用|统一",
    re.IGNORECASE,
)


_COUNTER = re.compile(COUNTER_PROPOSAL, re.IGNORECASE)

# a path or a file name: the numbers in it name the file, they set no value
# (and a quoted text: "更新"报价锁定5分钟"文案" asks for new words, it sets no number)
_PATHS = re.compile(
    r"[\w.~-]*/[\w./~-]+|\b[\w-]+\.[a-z]{1,5}\b|\"[^\"\n]{1,80}\"|“[^”\n]{1,80}”"
    r"|「[^」\n]{1,80}」|'[^'\n]{1,80}'",
    re.IGNORECASE,
)
# "use the <idea> and suggest me some ideas": a request to do the second thing with the
# first, not a choice of how things are
_USE_AND_DO = re.compile(
    r"\band\s+(?:then\s+)?(?:suggest|give|tell|show|write|make|create|find|build|draft"
    r"|list|generate|come up|explain|summari[sz]e|help)\b",
    re.IGNORECASE,
)


# a user message with this many lines is a document (a spec, a plan, a review pasted
# in): what its lines set describes the work, it is no standing setting of the user's
DOCUMENT_LINES = 12


def is_document(text: str, pieces: list[Unit] | None = None) -> bool:
    """A spec, a plan, a review, or a report pasted with its data: a message of many
    lines, or one that is more pasted output (JSON, logs, tables) than prose. The prose
    lines of a pasted report ("今日有 4 个会话文件被修改。") describe it; they set nothing."""
    if sum(1 for line in text.splitlines() if line.strip()) >= DOCUMENT_LINES:
        return True
    if not pieces:
        return False
    pasted = sum(len(u.text) for u in pieces if u.pasted)
    return pasted >= _PASTED_SHARE * sum(len(u.text) for u in pieces) and pasted >= 200


# the share of a message's text that makes it a pasted document (with 200 characters of
# pasted output at least: a stack frame under a rule leaves the rule a rule)
_PASTED_SHARE = 0.5


# the longest sentence read as a bare setting (words; CJK characters count one each)
_SETTING_WORDS = 10
_SETTING_CJK = 24
_CJK_CHAR = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")


def _short(sentence: str) -> bool:
    cjk = len(_CJK_CHAR.findall(sentence))
    if cjk:
        return cjk + len(_CJK_CHAR.sub(" ", sentence).split()) <= _SETTING_CJK
    return len(sentence.split()) <= _SETTING_WORDS


def is_deontic(rule: str) -> bool:
    low = rule.lower()
    return _CONSTRAINT.search(rule, low) or _WEAK_CONSTRAINT.search(rule, low)


def user_kind(
    sentence: str, slow: str, may_correct: bool, may_set: bool, document: bool = False
) -> str | None:
    """"correction" or "rule" when a sentence of the user is a constraint, else None.

    A rule has deontic force (must, never, only, do not, 必须, 不要...) or sets how
    something is (a setting, "use port 8080"); a request to do something ("please
    check X", "Step 74: run the tests", "请看一下…") is a task, whatever numbers it
    names. In a `document` (see is_document) only deontic force makes a rule: "Set
    market.status = PROPOSED", "chainId: 420420417" or "不是太弱，而是太强" there
    describe what to build or argue a point; they set and correct nothing.
    """
    if sentence.endswith(("?", "？")) and not _COUNTER.search(sentence):
        # "why don't they show in the viewer?" asks; it sets no rule ("叫锁定不是更好吗？"
        # asks for the value it names)
        return None
    if document:
        return "rule" if is_deontic(sentence) else None
    body = strip_series(sentence)
    if is_request(sentence):
        # "run the cleanup at 04:00" sets when it runs; "please check m74.py" sets
        # nothing (setting_of reads a numbered series as the subject, not a value)
        # a number inside a path ("./ai/intent/20260112-price.md") is part of a name
        sets = setting_of(_PATHS.sub(" ", body)) is not None
        if not sets:
            # a task; "please never push to main" is still a rule, "please check
            # m74.py and make sure its tests pass" is the request itself
            return "rule" if _CONSTRAINT.search(sentence, slow) else None
    if (
        may_correct
        and _CORRECTION.search(sentence, slow)
        and not _ADDITIVE.search(sentence)
    ):
        return "correction"
    if _CONSTRAINT.search(sentence, slow):
        return "rule"
    if _WEAK_CONSTRAINT.search(sentence, slow):
        return "rule"
    if NO_X.search(sentence):
        return "rule"
    if introduces_list(sentence):
        return None
    if _IMPERATIVE.match(body) and not _USE_AND_DO.search(body):
        return "rule"
    if setting_of(body) is not None and (_SETS_VALUE.search(sentence) or _short(body)):
        # a bare "subject value" ("export batch 500", "连接池上限 100") is a setting
        # only as a short line: in a long sentence a number is part of what it tells
        # ("Most people can't invest because the minimum is 10,000+")
        return "rule"
    if may_set and _SETTING.search(sentence, slow):
        return "rule"
    return None
