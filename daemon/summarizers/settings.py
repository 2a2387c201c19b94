"""Settings: a subject set to a value ("importer batch size -> 2000", "复盘会 -> 周二"), and
whether a later statement sets the same subject to another value.

A correction is a value that really changes. What only looks like one is kept apart:
a number that names the thing talked about ("turn 53", "worker number 53", "第 3 步") is
part of the subject, so a numbered series of tasks is a series of subjects; text pasted
into a message (log lines, stack frames, screenshots, placeholders like `len=335`, tool
output) sets nothing; and `key=value` alone is evidence, not an instruction.

Pure functions over text; the draft (draft.py) decides what they mean for the summary.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from ctxd.daemon.summarizers.cues import (
    _CJK_RUN,
    _CJK_STOP,
    _CONSTRAINT,
    _STOP,
    _TOKEN,
    _TOKEN_PARTS,
    _stem,
)
from ctxd.daemon.summarizers.pasted import KEY_EQ as _KEY_EQ
from ctxd.daemon.summarizers.pasted import URL as _URL
from ctxd.daemon.summarizers.pasted import is_pasted

_WEEKDAY = (
    r"monday|tuesday|wednesday|thursday|friday|saturday|sunday"
    r"|(?:周|星期|礼拜)[一二三四五六日天](?:上午|下午|晚上|早上)?"
)
_WEEKDAY_ONLY = re.compile(rf"(?:{_WEEKDAY})$", re.IGNORECASE)
# a value with its position: numbers, versions, sizes, numbered names, weekdays; Chinese
# writes them against the characters around them ("用8080", "重试2次")
_VALUE = re.compile(
    r"(?<![a-z0-9_.])\d{4}([-/])\d\d\1\d\d(?:(?:\.\.|/|~| to )\d{4}[-/]\d\d[-/]\d\d)?"
    r"(?![\w-])"
    r"|\d{1,2}\s*月\s*\d{1,2}\s*[日号]"
    r"|(?<![a-z0-9_.])(?:\d+(?:[.,:]\d+)*(?:\s?(?:%|ms|s|m|h|d|kb|mb|gb|k|am|pm)(?![a-z]))?"
    r"|[a-z]+(?:-[a-z0-9]+)*-\d+[a-z]?)(?![a-z0-9_]|\.\d)|" + _WEEKDAY,
    re.IGNORECASE,
)
# A number right after one of these names what is talked about, not what it is set to:
# "turn 53", "step 74", "worker number 53", "PR #12", "line 335", "第 3 步".
_LABEL_BEFORE = re.compile(
    r"(?:\b(?:turn|step|task|item|stage|phase|round|iteration|part|chapter|section|ticket"
    r"|issue|case|question|problem|exercise|worker|agent|request|message|number|no\.|pr"
    r"|mr|line|lines|page|module|test|example|figure|fig\.?|table|row|column|col|attempt"
    r"|job|build|commit|episode|day|week|sprint|milestone|slide|screen|image|img|frame"
    r"|shard|instance|host|server|epoch|room|lesson|bug|story|trial|sample|chunk"
    r"|batch no\.?)\s*#?\s*"
    r"|#\s*|第\s*)$",
    re.IGNORECASE,
)
_LABEL_AFTER = re.compile(r"^\s*(?:号|步|轮|章|节|题|楼)")
# what precedes an old value: "45 days, not 30", "instead of 8080", "从原来的 500 调整到",
# "不是放 eu-west-1"
_OLD_BEFORE = re.compile(
    r"(?:\bnot|instead of|rather than|\bfrom|\bwas|previously|no longer"
    r"|不是[\u4e00-\u9fff]{0,2}|而不是|原来的?|从|之前的?|以前的?)\s*$",
    re.IGNORECASE,
)
# update verbs and copulas: a sentence with one of these and a value sets something.
# "=" and ":" are not among them: `len=335` or "turn 53:" is evidence or a label (a
# "subject: value" line is read by _COLON_VALUE).
_SETS = re.compile(
    r"\b(?:set|raise|lower|increase|decrease|reduce|bump|make|change|move|use|go with"
    r"|switch|be|is|are|from now on|limit|cap|let[’']?s do"
    r"|let[’']?s (?:go|have|keep)|keep|own|owns"
    r"|(?:moved|moves|changed|switched|pushed|postponed|brought forward|bumped) to)\b"
    r"|推迟到|提前到|挪到|延到|延期到"
    r"|设为|设置为|设成|定为|定在|安排在|改到|改在|改成|改为|调整|调到|提高到|降低到|应该是"
    r"|换成|放在|上限|下限|负责",
    re.IGNORECASE,
)
# Chinese copulas and "use" are everywhere in prose ("更穩健的做法是用 AST-level diff"):
# they set something only right before the value ("端口是 8080", "缓存用 Redis")
_SETS_NEAR = re.compile(r"(?:是|用|按|为)\s*(?:[\u4e00-\u9fff]{0,2}\s*)?$")
# "svc batch size: 500 records from now on": a short subject, a colon, the value
_COLON_VALUE = re.compile(r"^[^:：]{1,60}[:：]\s*$")
_PAST = re.compile(
    r"\b(?:was|were|did|had|took|got|ran|went|came|saw|found|broke|hit|[a-z]{3,}ed)\b"
    r"|[\u4e00-\u9fff]了|过了|已经|昨天|上周|刚才"
)
_PATHISH = re.compile(r"[\w-]+[/\\][\w.-]|\b[\w-]+\.[a-z]{1,5}\b")
_WHEN_BEFORE = re.compile(r"(?:\b(?:at|on|by|before|until|from|to|every)|在|到|于|从|每)\s*$")
# requests and questions: "Please check the 3 tests", "Can you look at ...", "看看…"
_REQUEST_START = re.compile(
    r"^\W*(?:please|pls|can|could|would|will you|why|how|what|when|where|which|who|look"
    r"|check|see|run|fix|tidy|read|open|find|show|tell|explain|review|try|add|remove"
    r"|delete|write|create|update|implement|test|debug|investigate|here|this|that|there"
    r"|thanks|thank|ok|okay|great|good|done|i|we|you|it)\b"
    r"|^\W*(?:请|看看|看一下|帮我?|能不能|为什么|怎么|查一下|检查|谢谢|好的|我|你|这|那)",
    re.IGNORECASE,
)
# verbs stripped before Chinese bigrams, so "大小改到" does not make the bigram "小改"
_CJK_VERBS = re.compile(
    r"设为|设置为|设成|先定为|定为|定在|安排在|改到|改在|改成|改为|改用|使用|采用|调整到|调整为|调整|调到|"
    r"提高到|降低到|"
    r"应该是|需要|"
    r"从原来的|原来的|用|按|吧|换成|以后|放在|不是|而是|不对|搞错了?|是|了"
)
# particles and modal verbs between the words of a subject: "账本客户端必须重试" and
# "账本客户端的重试" name the same thing, so neither "端必" nor "的重" is a bigram of it
_CJK_GLUE = re.compile(
    r"必须|(?<!服)务必|一定要|一定|应该|不要|禁止|只能|不能|的|得|地|都|也|就|再|先"
)
_CLAUSE = re.compile(r"[，,；;]")
_PUNCT = " 。.！!？?：:，,；;"
_SUBJECT_STOP = _STOP | frozenset(
    """raise lower increase decrease reduce bump go from now on be with after before
    look looking correction update updated ll ve re do have has hold held move moved bump
    wait need needs want put schedule scheduled get got stay remain plan planned meant mean
    sorry again still already""".split()
)
# A statement that names no subject and points back at the last setting: "Make it 2000.",
# "No, 4.", "改成 200。"
_ELIDED = re.compile(
    r"^\W*(?:no\W+|actually\W+|sorry\W+|oops\W+)*(?:make it|change it to|set it to|bump it to"
    r"|raise it to|lower it to|let[’']?s (?:do|go with|say)|use|go with|no|actually)\b"
    r"|^\W*(?:不对\W*|不\W*)?(?:改成|改为|改到|换成|调到|调整到|用)",
    re.IGNORECASE,
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
# substrings without which neither pattern can match: most sentences skip both
_NAMED_GATE = re.compile(
    r"use|go with|adopt|prefer|pick|choose|switch|move|change|migrate|instead|rather|not"
    r"|用|换成|改成|改为|不是"
)
_OWNER_GATE = re.compile(r"own|responsible|in charge|handle|review|lead|负责", re.IGNORECASE)
# a longer "sentence" is pasted text that no sentence split could cut
_MAX_SENTENCE = 1000
_NEGATED = re.compile(r"不是|不再|\bnot\b|\bno longer\b")

# Who owns a piece of work: "Alice owns the billing migration", "Bob will review the
# schema change", "熊猫团队负责审核", "审核改由老虎团队负责".
_OWNER_EN = re.compile(
    r"(?:^|(?<=\W))(?P<who>@?[A-Z][\w-]*(?: [A-Z][\w-]*)?(?: team)?)\s+"
    r"(?:now |will |should |is going to )?"
    r"(?P<verb>owns?|is responsible for|is in charge of|handles?|reviews?|leads?)\s+"
    r"(?P<what>[^.;!?]{3,80})"
)
_OWNER_ZH = re.compile(
    r"(?:(?P<what1>[\u4e00-\u9fff\w]{2,12}?)(?:改由|由|交给|换成|改成)(?P<who1>[\u4e00-\u9fff\w]{1,8}?)"
    r"(?:来)?负责)"
    r"|(?:(?P<who2>[\u4e00-\u9fff\w]{1,8}?)(?:来)?负责(?P<what2>[\u4e00-\u9fff\w]{1,12}))"
)
_OWNER_PREFIX = re.compile(r"^(?:而是|不是|改由|由|让|请|是|应该是|应该由|现在|以后|其实)+")
_NOT_NAMES = frozenset(
    """i we you he she they it this that the a an who which what actually also then please
    let make now so but and if when while no yes ok okay thanks everyone someone nobody
    check run see look fix add use set keep always never only just maybe here there""".split()
)

# ---------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Setting:
    terms: frozenset[str]  # what is set
    values: frozenset[str]  # the value(s) it is set to
    old: frozenset[str]  # values it names as replaced ("not 30")
    order: tuple[str, ...] = ()  # the terms in the order they were written
    label: str | None = None  # the subject, readable: "importer batch size", "对账任务的批处理大小"
    # numbers that name the subject ("turn53", "第3"): a series of them is many subjects
    ids: frozenset[str] = frozenset()


def _norm_value(v: str) -> str:
    return re.sub(r"\s+", "", v.casefold())


def value_kind(value: str) -> str:
    """"day", "number" or "name": a weekday does not replace a port."""
    if _WEEKDAY_ONLY.match(value):
        return "day"
    return "number" if value[:1].isdigit() else "name"


def _is_label(low: str, start: int, end: int, text: str = "") -> str | None:
    number = low[start:end]
    if text[start:end].isupper() and re.fullmatch(r"[A-Z]{2,}-\d+", text[start:end]):
        return number  # a ticket: FW-005, JIRA-123
    if low[end : end + 1] == ")" and "(" not in low[max(0, start - 12) : start]:
        return f"item{number}"  # an enumeration: "1) ..., 2) ..."
    if number.isdigit() and re.search(rf"[a-z_]{number}(?!\d)|(?<!\d){number}[_]", low):
        # "batch 201" of "src/mod_201.py": the number of a numbered thing
        return f"n{number}"
    before = _LABEL_BEFORE.search(low[max(0, start - 24) : start])
    if before is not None:
        word = re.sub(r"[\s#.]+", "", before.group(0))
        return f"{word}{_norm_value(low[start:end])}"
    if _LABEL_AFTER.match(low[end : end + 3]):
        return f"{_norm_value(low[start:end])}{low[end:end + 3].strip()[:1]}"
    return None


@lru_cache(maxsize=4096)
def setting_of(text: str, loose: bool = False) -> Setting | None:
    """The setting a sentence states, or None: it needs a value and a subject, and
    (unless `loose`: the sentence is already known to be a rule) a verb that sets, a
    "subject: value" shape or the bare "subject value" of a short line ("export batch
    500", "连接池上限 100")."""
    if len(text) > _MAX_SENTENCE or is_pasted(text):
        return None
    low = text.casefold()
    if "://" in low:
        # the numbers of a URL (hosts, ports, paths) are part of an address, not values
        low = _URL.sub(lambda m: " " * len(m.group(0)), low)
    values: list[str] = []
    old: list[str] = []
    ids: list[str] = []
    spans: list[tuple[int, int]] = []
    value_spans: list[tuple[int, int]] = []
    for m in _VALUE.finditer(low):
        spans.append(m.span())
        label = _is_label(low, *m.span(), text)
        if label is not None:
            ids.append(label)
            continue
        v = _norm_value(m.group(0))
        if _OLD_BEFORE.search(low[max(0, m.start() - 16) : m.start()]):
            old.append(v)
        else:
            values.append(v)
            value_spans.append(m.span())
    if not values and not old and _NAMED_GATE.search(low):
        # no number or day: a named choice ("use Redis for the job queue", "缓存改用 Redis")
        for m in _NAMED.finditer(low):
            group = next(g for g in range(1, 6) if m.group(g))
            v = m.group(group)
            if v in _STOP or len(v) < 2:
                continue
            spans.append(m.span(group))
            # "部署不是用 Docker，而是用 Podman", "not with Redis but ...": the value in the
            # "not" part is the one replaced
            negated = _NEGATED.search(low[max(0, m.start() - 6) : m.start(group)])
            if group in _NAMED_OLD or negated:
                old.append(v)
            else:
                values.append(v)
                value_spans.append(m.span(group))
    if not values and not old:
        # who owns a piece of work, when no number or day is set
        return _owner(text)
    if not values:
        return None
    # `len=335`, `workers=4`: a value after "=" sets something only with a verb that sets
    keyed = all(low[max(0, a - 1) : a] == "=" for a, _ in value_spans)
    if keyed and not _SETS.search(_KEY_EQ.sub(" ", low)):
        return None
    if not (loose or _sets(low, value_spans)):
        return None
    stripped = low
    for a, b in sorted(spans, reverse=True):
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
        grams: list[str] = []
        for scope in ([_before_value(c) for c in clauses], clauses, [low]):
            grams = _bigrams(scope)
            if len(set(grams)) >= 3:
                break
        order += grams
    order += ids
    if not order:
        # "Make it 2000.", "改成 200。": the subject is the one just set (draft.py)
        if _ELIDED.search(low) and _short(low, 6, 12):
            return Setting(frozenset(), frozenset(values), frozenset(old), (), None)
        return None
    if _CJK_RUN.search(low):
        # the subject comes before the value in Chinese: "复盘会改到周二上午"
        first = min(a for a, _ in spans)
        start = max(text.rfind(sep, 0, first) for sep in "，,；;") + 1
        head = text[start:first] if first - start > 1 else text
        label = re.sub(r"\s+", "", _VALUE.sub("", _CJK_VERBS.sub("", head))).strip(_PUNCT)
    else:
        label = " ".join(dict.fromkeys(w for w in order if w not in ids))
    return Setting(
        frozenset(order), frozenset(values), frozenset(old), tuple(order), label[:60] or None,
        frozenset(ids),
    )


def _short(low: str, words: int, cjk: int) -> bool:
    n_cjk = sum(len(r) for r in _CJK_RUN.findall(low))
    return (n_cjk <= cjk) if n_cjk else len(low.split()) <= words


def _sets(low: str, value_spans: list[tuple[int, int]]) -> bool:
    """Whether a sentence with values sets something: a setting verb, "subject: value",
    or a short line that is only a subject and its value."""
    if _SETS.search(low):
        return True
    if not value_spans or low.rstrip().endswith(("?", "？")):
        return False
    if any(_SETS_NEAR.search(low[max(0, a - 8) : a]) for a, _ in value_spans):
        return True
    start = value_spans[0][0]
    if _COLON_VALUE.match(low[:start]):
        return True
    if _PAST.search(low):
        # "at 10:32 the job failed", "the test took 30 seconds": what happened, not a setting
        return False
    # "run the cleanup at 04:00", "the retro is on thursday": when something happens
    for a, b in value_spans:
        value = low[a:b]
        if (":" in value or value_kind(value) == "day") and _WHEN_BEFORE.search(low[:a]):
            return True
    if _REQUEST_START.match(low) or not _short(low, 10, 20):
        return False
    # "export batch 500", "retries 2 for the upload client", "复盘会周四开"
    before = low[:start].rstrip()
    if not before:
        return False
    if _CJK_RUN.search(before[-1]):
        return before[-1] not in "的了是在和与或就也都"
    word = re.findall(r"[a-z][a-z0-9_-]*$", before)
    if not word or word[0] in _STOP or "=" in low[max(0, start - 2) : start]:
        return False
    # a subject and its value, little around them: not "Refactor src/mod_201.py for
    # batch 201", a request that happens to end in a number
    return len(before.split()) <= 4 and not _PATHISH.search(low)


def _owner(text: str) -> Setting | None:
    """An owner statement as a setting: the work is the subject, the person its value."""
    if not _OWNER_GATE.search(text):
        return None
    for m in _OWNER_EN.finditer(text):
        words = m.group("who").split()
        while words and words[0].casefold() in _NOT_NAMES:
            words.pop(0)
        if not words or words[0].casefold() == "team":
            continue
        what = m.group("what").casefold()
        order = [
            _stem(w)
            for token in _TOKEN.findall(what)
            for w in _TOKEN_PARTS.split(token)
            if len(w) >= 2 and w not in _SUBJECT_STOP
        ]
        if order:
            order.append("owner")
            who = " ".join(words).casefold()
            return Setting(
                frozenset(order), frozenset({who}), frozenset(), tuple(order),
                f"owner of {' '.join(order[:-1])}"[:60],
            )
    for clause in _CLAUSE.split(text):
        z = _OWNER_ZH.search(clause)
        if z is None:
            continue
        what = z.group("what1") or z.group("what2") or ""
        who = _OWNER_PREFIX.sub("", z.group("who1") or z.group("who2") or "")
        what = _OWNER_PREFIX.sub("", what)
        if not who or not what:
            continue
        grams = [what[i : i + 2] for i in range(len(what) - 1)] or [what]
        order = [*grams, "负责"]
        return Setting(
            frozenset(order), frozenset({who}), frozenset(), tuple(order), f"{what}负责人"
        )
    return None


def _before_value(clause: str) -> str:
    m = _VALUE.search(clause)
    return clause[: m.start()] if m else clause


def _bigrams(clauses: list[str]) -> list[str]:
    grams: list[str] = []
    for clause in clauses:
        clause = _VALUE.sub(" ", _CJK_GLUE.sub(" ", _CJK_VERBS.sub(" ", clause)))
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
    Numbered subjects ("turn 52", "turn 53") are different subjects.
    """
    if old.ids and new.ids and old.ids != new.ids:
        return 0.0
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


def changes_value(old: Setting, new: Setting) -> bool:
    """Whether `new` gives the subject another value of the same kind (not the same
    value again, and not a weekday where a number was)."""
    if old.values <= new.values:
        return False
    kinds = {value_kind(v) for v in new.values}
    return any(value_kind(v) in kinds for v in old.values)


# the joints of a statement with more than one part: "…完成，熊猫团队负责审核", "use port
# 8080; never expose it", "…, and never expose it"
_PARTS = re.compile(r"[，；;]\s*|,\s+(?=(?:and|but)\b)|\s+(?:and|but)\s+(?=(?:never|always|do not"
                    r"|don[’']t|must|only)\b)")
_JOINER = re.compile(r"^(?:and|but|also|然后|并且|而且|同时)\s*", re.IGNORECASE)


def other_parts(text: str, setting: Setting) -> list[str]:
    """The parts of a statement besides the one its setting is in, when they hold a rule
    or a setting of their own: when "数据库迁移必须在周五之前完成，熊猫团队负责审核" has its
    day corrected, who reviews is still true."""
    parts = [_JOINER.sub("", p.strip(_PUNCT)) for p in _PARTS.split(text)]
    if len(parts) < 2:
        return []
    out: list[str] = []
    for part in parts:
        low = _norm_value(part)
        if not part or any(v in low for v in setting.values | setting.old):
            continue
        if setting_of(part) is not None or _CONSTRAINT.search(part):
            out.append(part)
    return out
