"""Messages cut into the units that have a kind: sentences and clauses, and pasted output.

A message mixes kinds: a rule, a request and a guess can sit in three sentences of one
message, and a traceback pasted under a question is evidence, not something the person
said. The summary files each unit on its own, so the cut comes before any
classification.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ctxd.daemon.summarizers.cues import _CONSTRAINT, _WEAK_CONSTRAINT
from ctxd.daemon.summarizers.facts import is_hedge_only, is_hedged

_FENCE = re.compile(r"^[ \t]*(```|~~~).*?(?:^[ \t]*\1[ \t]*$|\Z)", re.DOTALL | re.MULTILINE)
_SENT_SPLIT = re.compile(r"(?<=[.!?])\s+(?=\S)|(?<=[。！？；;])\s*")
# "具体步骤： 1. 获取改动 2. 做一次 review", "1. gildore arena 2. hackathon judges": a
# numbered list written on one line; its markers are where the items begin
_INLINE_MARKER = re.compile(r"(?:^|(?<=[\s:：;；，,]))(\d{1,2})[.)、](?=\s|$|[^\d\s.])")
_BULLET = re.compile(r"^(?:[-*•>]+|\d+[.)])\s+")

# A line of pasted output: stack frames, log lines, diffs, tables, checklists, JSON,
# code, shell prompts, compiler diagnostics.
_PASTED_LINE = re.compile(
    r"^(?:"
    r"\s*traceback \(most recent call last\)"
    r"|\s*file \"[^\"]+\", line \d+"
    r"|\s+at \S.*(?:\(|:\d+)"
    r"|\s*at [\w.$<>]+ \(.*:\d+(?::\d+)?\)"
    r"|\s*(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Warning)\b(?::|$)"
    r"|\s*\[?\d{4}-\d\d-\d\d[ t]\d\d:\d\d"
    r"|\s*\[?\d\d:\d\d:\d\d(?:[.,]\d+)?\]?\s"
    r"|\s*\[?(?:trace|debug|info|warn|warning|error|fatal|critical)\]?\s*[:\]|-]\s"
    r"|diff --git |index [0-9a-f]{6,}\.\.|@@ -\d|\+\+\+ |--- (?:a/|/dev/null)"
    r"|[+-](?![ +-])\S"
    r"|\s*\|.*\|\s*$|\s*[-+|: =]{6,}$"
    r"|\s*[-*]\s*\[[ xX]\]"
    r"|\s*[\[\]{}(),;]+\s*$|\s*\"[^\"\n]{1,80}\"\s*:\s*\S"
    r"|\s*[{\[]+\s*\"[^\"\n]*\"\s*[:,]"
    # the rest of a JSON line a tag was cut out of: `", "next value", ...`
    r"|\s*\"\s*[,:\]}]+\s*(?:[\"\[{]|$)"
    r"|\s*(?:\\[nrt]\s*)+$"
    r"|\s*(?:\$|>>>|\.\.\.|❯|%|#)\s+\S.*\S$(?<![.!?。！？])"
    r"|\s*[\w.-]+@[\w.-]+:\S*[$#]\s"
    r"|\s*(?:[\w./\\-]+\.\w+):\d+(?::\d+)?(?::|\s+\[)\s*"
    r"|.*\b[A-Z]\w*(?:Error|Exception):\s"
    r"|\s*\{.*\}\s*$|\s*\{\s*\w+:\s"
    r"|\s*(?:error|warning|note|help)(?:\[\w+\])?: "
    # a linter's line: "error 'x' is defined but never used no-unused-vars"
    r"|\s*(?:\d+:\d+\s+)?(?:error|warning)\s+\S.*\s(?:@?[\w-]+/)?[a-z]+(?:-[a-z]+)+\s*$"
    r"|\s*-->\s+\S+:\d+"
    r"|\s*npm (?:err|warn)!"
    r"|\s*<[\w-]+(?:\s[^<>]*)?>.*</[\w-]+>\s*$"
    r"|\t"
    r"|\s{4,}\S"
    r")",
    re.IGNORECASE,
)
# Source code in a line: a keyword at the start and code punctuation after it.
_CODE_LINE = re.compile(
    r"^\s*(?:raise|return|def|class|import|from\s+\S+\s+import|if|elif|else|for|while|try"
    r"|except|with|const|let|var|function|public|private|static|fn|pub|use|package|func"
    r"|assert|print|console\.\w+)\b.*[(){}\[\];=:]\s*$"
    r"|^\s*[\w.\[\]\"']+\s*(?:=|\+=|-=|==|=>|->)\s*\S+.*[;)\]}]?\s*$(?<![.!?。！？])",
)
_MD_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+\S")
_LIST_ITEM = re.compile(r"^(?:[-*•]|\d+[.)])\s+")
_CHECKLIST = re.compile(r"^(?:[-*+]\s*)?\[[ xX]\]\s")
# how much of a line is code punctuation: more than this, and it is not prose
_SYMBOLS = re.compile(r"[{}()\[\];=<>$\\|`]")


def is_pasted_line(line: str) -> bool:
    s = line.strip()
    if not s:
        return False
    if len(s) > 8000:
        # nobody writes a sentence this long: a minified file, a blob, a log dump
        return True
    # what a line is shows at its start; the patterns never need to read a whole blob
    line, s = line[:2000], s[:2000]
    if _CHECKLIST.match(s):
        return True
    if _LIST_ITEM.match(s):
        # a list item is prose, however deep it is indented
        return False
    if _PASTED_LINE.match(line):
        return True
    if _CODE_LINE.match(s) and not re.search(r"[\u4e00-\u9fff]", s):
        return True
    n = len(s)
    # "never .transfer(), never .send()" is a rule that names code, not code
    return n >= 12 and len(_SYMBOLS.findall(s)) >= max(6, n // 8)


@dataclass
class Unit:
    """A sentence or clause of a message, or a run of pasted lines."""

    text: str
    pasted: bool = False
    # an item of a list ("- ...", "2. ..."): under "Do NOT:" it is one of the rules
    item: bool = False
    # a quoted line ("> ..."): someone else's words the person brought in
    quoted: bool = False


# A clause after "but" / "however" / "不过" that carries its own guess: cut off from a
# rule before it, so the hedge marks the guess and the rule stays firm.
_CLAUSE_CUT = re.compile(
    r"(?:,|;|，|；)\s*(?=(?:but|however|though|although|and|while|但是?|不过|可是|而且)\b)"
    r"|(?:,|，)\s*(?=(?:但是?|不过|可是)\S)"
    # "never touch vendor/, I suspect the cache is stale": a guess after a comma
    r"|(?:,|;|，|；)\s*(?=(?:i (?:suspect|think|guess|believe)|maybe|perhaps|probably)\b"
    r"|我猜|我觉得|我怀疑|我估计|可能|也许|或许|估计|好像|似乎|大概|不确定|还没确认|未确认"
    r"|待确认|应该是(?!\s*(?:[0-9A-Za-z]|周|星期|礼拜)))",
    re.IGNORECASE,
)


def _cut_hedged_clause(sentence: str) -> list[str]:
    parts = _CLAUSE_CUT.split(sentence, maxsplit=1)
    if len(parts) != 2:
        return [sentence]
    head, tail = parts[0].strip(), parts[1].strip()
    if not head or not tail or is_hedged(head) or not is_hedged(tail):
        return [sentence]
    if not (_CONSTRAINT.search(head) or _WEAK_CONSTRAINT.search(head)):
        return [sentence]
    # "..., but that is only a guess" is about the rule itself: the sentence stays whole
    if qualifies_previous(_LEAD_CONJ.sub("", tail)):
        return [sentence]
    return [head, _LEAD_CONJ.sub("", tail) or tail]


_LEAD_CONJ = re.compile(
    r"^\W*(?:but|however|though|although|and|while|但是?|不过|可是|而且)\s*,?\s*", re.I
)


_ITEM_GAP = re.compile(r"(?:\s{2,}|[,;:，；：]\s*)$")
_CJK_CHAR = re.compile(r"[\u3400-\u9fff\uff00-\uffef]")


def unwrap(text: str) -> str:
    """A text copied out of a terminal, hard-wrapped at its width (each line padded
    with spaces, the next indented), as the one paragraph it was: a sentence or a
    numbered list cut at the screen's edge is read whole. Chinese joins without a
    space."""
    lines = text.split("\n")
    if len(lines) < 2 or "```" in text:
        return text
    indented = all(line.startswith("  ") or not line.strip() for line in lines[1:])
    padded = sum(1 for line in lines[:-1] if line.endswith(" "))
    if not indented or 2 * padded < len(lines) - 1:
        return text
    out = lines[0].rstrip()
    for line in lines[1:]:
        piece = line.strip()
        if not piece:
            continue
        cjk = _CJK_CHAR.match(piece[0]) and out and _CJK_CHAR.match(out[-1])
        out += piece if cjk else " " + piece
    return out


def units(text: str) -> list[Unit]:
    """Sentences and clauses of a message, in order, with pasted output apart."""
    text = unwrap(text)
    out: list[Unit] = []
    pos = 0
    for m in _FENCE.finditer(text):
        out += _prose_units(text[pos : m.start()])
        out.append(Unit(m.group(0), pasted=True))
        pos = m.end()
    out += _prose_units(text[pos:])
    return out


def inline_items(line: str) -> list[str]:
    """A line cut before the markers of a numbered list written inline, when the
    numbers run 1, 2, 3... (or 2, 3... after an unnumbered first item): "步骤： 1. A 2.
    B" is "步骤：", "A", "B". A lone "version 2. Then" has no run and stays whole."""
    marks = list(_INLINE_MARKER.finditer(line))
    run: list[re.Match[str]] = []
    # the first item may go unnumbered ("yes, a demo. 2. perp markets 3. none yet")
    first = 1 if any(m.group(1) == "1" for m in marks) else 2
    for m in marks:
        if int(m.group(1)) == len(run) + first:
            if not run and first == 2 and not _ITEM_GAP.search(line, 0, m.start()):
                # "It costs 2. Maybe 3." counts; a list is set apart before its "2."
                continue
            run.append(m)
    if len(run) < 2:
        return [line]
    out = [line[: run[0].start()]]
    for m, nxt in zip(run, [*run[1:], None], strict=True):
        out.append(line[m.end() : nxt.start() if nxt else len(line)])
    return [piece.strip() for piece in out if piece.strip()]


def _prose_units(text: str) -> list[Unit]:
    out: list[Unit] = []
    pasted: list[str] = []
    for line in text.splitlines():
        if _MD_HEADING.match(line):
            # "### Step 1: Gather Context" titles what follows; it asks and sets nothing
            continue
        if is_pasted_line(line):
            pasted.append(line)
            continue
        if pasted:
            out.append(Unit("\n".join(pasted), pasted=True))
            pasted = []
        body = _BULLET.sub("", line.strip()).strip()
        item = body != line.strip()
        quoted = line.lstrip().startswith(">")
        pieces = inline_items(line.strip())
        if len(pieces) > 1:
            lead_in = not _INLINE_MARKER.match(line.strip())
            for n, piece in enumerate(pieces):
                out += _sentence_units(piece, item or not (lead_in and n == 0), quoted)
            continue
        out += _sentence_units(body, item, quoted)
    if pasted:
        out.append(Unit("\n".join(pasted), pasted=True))
    return out


def _sentence_units(body: str, item: bool, quoted: bool) -> list[Unit]:
    out: list[Unit] = []
    for sentence in _SENT_SPLIT.split(body):
        sentence = sentence.strip()
        if sentence:
            out += (Unit(c, item=item, quoted=quoted) for c in _cut_hedged_clause(sentence))
    return out


# ------------------------------------------------------------------------ hedges

# A hedge that opens a claim of its own: "I suspect the cache is stale", "我猜是缓存的问题".
_OWN_CLAIM = re.compile(
    r"^\W*(?:(?:but|and|so|also)\s+)?(?:i (?:suspect|think|believe|guess|assume|reckon|feel)"
    r"|(?:i[’']?m |i am )?not sure(?: (?:whether|if))?|unsure whether"
    r"|maybe|perhaps|probably|possibly|presumably|my (?:guess|hunch|theory) is"
    r"|it (?:might|may|could) be(?: that)?"
    r"|我猜|我觉得|我估计|我怀疑|我认为|可能|也许|或许|大概|估计|应该是|好像|似乎|不确定"
    r"|还没确认|未确认|待确认)"
    r"\s*(?:that\s+)?(?!(?:that|this|it|so|这|那|只是)\b)(?P<rest>\S.*)$",
    re.IGNORECASE,
)
_ENGLISH_WORD = re.compile(r"[A-Za-z]{3,}")
_CJK_CHARS = re.compile(r"[\u4e00-\u9fff]+")
_HEDGE_WORDS = re.compile(
    r"\b(?:unconfirmed|unverified|confirmed|verified|guess|sure|certain|yet|only|just"
    r"|checked|tested|proven|hold|but|it|its|it's|that|this|not|haven't|hasn't|didn't"
    r"|have|has|did|so|far|true|right|the)\b"
    r"|推测|猜测|确认|验证|不确定|只是|这|一点|还|没有?|尚未|不过|但是?|是|的|了|过",
    re.IGNORECASE,
)


_CJK_REFERENCE = re.compile(r"^\W*(?:这|那)(?:个|些|种|次)?(?P<rest>[\u4e00-\u9fff].*)$", re.S)
# what a sentence that qualifies the one before names: the claim itself
_CJK_META = re.compile(
    r"^\W*(?:这|那)(?:个|些|种)?(?:结论|说法|推测|判断|猜测|假设|结果|想法|分析|观点|数据|点"
    r"|一点|只是|是|也|还|并|其实|个?问题还)"
)


def qualifies_previous(sentence: str, hedged: bool | None = None) -> bool:
    """Whether a hedged sentence is about the one before it ("I haven't confirmed
    that.", "不过这只是推测。") rather than a guess of its own ("I suspect the cache is
    stale, but it's unconfirmed.")."""
    if not is_hedge_only(sentence, hedged):
        return False
    ref = _CJK_REFERENCE.match(sentence)
    if ref is not None and not _CJK_META.match(sentence):
        # "这个超时可能是连接池导致的" names a thing of its own: a guess, not a hedge on
        # the sentence before ("这一点尚未确认", "这个结论不一定成立" are)
        rest = _HEDGE_WORDS.sub(" ", ref.group("rest"))
        if sum(len(r) for r in _CJK_CHARS.findall(rest)) >= 4:
            return False
    m = _OWN_CLAIM.match(sentence)
    if m is None:
        return True
    rest = _HEDGE_WORDS.sub(" ", m.group("rest"))
    # two words of its own in English, three characters in Chinese: a claim of its own
    words = len(_ENGLISH_WORD.findall(rest))
    chars = sum(len(r) for r in _CJK_CHARS.findall(rest))
    return words < 2 and chars < 3


# The last clause or sentence of an item, with the punctuation before it.
_LAST_PIECE = re.compile(
    r"(?:[,，;；]\s*|(?<=[.!?。！？])\s*)(?P<piece>[^,，;；.!?。！？]+[.!?。！？]*)\s*$"
)
_HEDGE_ONLY_WORDS = re.compile(
    r"\b(?:may|might|maybe|perhaps|probably|possibly|likely|seems?|guess|though|although"
    r"|however|still|is|was|i|we|a|an)\b|可能|也许|或许|大概|似乎|好像|估计|不一定|只|我们?|猜",
    re.IGNORECASE,
)


def is_bare_hedge(piece: str) -> bool:
    """A clause that says only that what it follows is unconfirmed ("but that is only
    a guess", "不过这只是推测", "I haven't confirmed that"), with no words of its own."""
    if not is_hedged(piece):
        return False
    rest = _HEDGE_ONLY_WORDS.sub(" ", _HEDGE_WORDS.sub(" ", piece))
    words = len(_ENGLISH_WORD.findall(rest))
    chars = sum(len(r) for r in _CJK_CHARS.findall(rest))
    return words == 0 and chars <= 1


def bare_claim(text: str) -> str:
    """A hedged item without the clauses that only repeat its hedge: the item is shown
    with an unconfirmed mark, so "X is caused by Y. 不过这只是推测，还没验证。" costs the
    words of the claim alone. A clause with words of its own ("though the gain may not
    hold at production scale") is kept."""
    out = text.strip()
    while True:
        m = _LAST_PIECE.search(out)
        if m is None or m.start() == 0 or not is_bare_hedge(m.group("piece")):
            return out
        head = out[: m.start()].rstrip(" ,，;；")
        if not head or len(head) < 4:
            return out
        stop = "。" if _CJK_CHARS.search(head[-1:]) else "."
        out = head if head.endswith((".", "!", "?", "。", "！", "？", "…")) else head + stop


def hedge_follows(pieces: list[Unit], index: int) -> bool:
    """Whether the unit after `index` only hedges it ("I haven't confirmed that.")."""
    if index + 1 >= len(pieces) or pieces[index + 1].pasted:
        return False
    following = pieces[index + 1].text
    return is_hedged(following) and qualifies_previous(following, True)


# ---------------------------------------------------------------------- requests

# "Step 74:", "Task #3 -", "turn 53:", "第 74 步：", "3)" : the label of a numbered series
SERIES = re.compile(
    r"^\s*(?:(?P<word>step|task|subtask|turn|item|part|phase|stage|round|iteration|ticket"
    r"|question|case|batch|chunk|job|change|milestone)\s*#?\s*(?P<n>\d+)\s*[:：.)\-–—]\s*"
    r"|第\s*(?P<zn>\d+)\s*(?P<zw>[步项个轮题条批])\s*[:：、，,.]?\s*)",
    re.IGNORECASE,
)
# A request to do something: a task for the agent, never a standing rule.
_REQUEST = re.compile(
    r"^\W*(?:(?:ok(?:ay)?|now|next|then|also|and|so|first|finally|great|thanks|right"
    r"|after that|afterwards|after this)\b[,!.]?\s*)*"
    r"(?:(?:please|pls|kindly)\b\s*|(?:can|could|would|will) you\b\s*(?:please\s+)?"
    r"|i(?:[’']d| would) like you to\s+|i (?:want|need) you to\s+|go ahead and\s+"
    r"|let[’']?s\s+(?=check|look|run|review|see|try|start|continue|fix|test)"
    r"|(?:check|look(?: at| into| over)?|run|review|investigate|read|open|show|find|explain"
    r"|fix|add|implement|create|write|refactor|test|debug|tidy|clean up|summari[sz]e"
    r"|analy[sz]e|commit|push|deploy|build|install|try|continue|proceed|help|rename"
    r"|delete|remove|start|finish|complete|verify|compare|list|print|search|generate"
    r"|draft|document|inspect|audit|profile|benchmark|measure|go through|walk through"
    r"|take a look|have a look|resume)\b)"
    r"|^\W*(?:请|麻烦|帮我|帮忙|劳驾|你(?:能|可以)|能不能|可以帮|看一下|看看|再看|检查|运行|跑一下|修复"
    r"|实现|添加|整理|查一下|排查|调查|继续|接下来|更新|补充|完善|重构|优化)",
    re.IGNORECASE,
)
# "Use Task Master MCP to set task status": a tool to use for a task, not a rule of how.
_USE_FOR_TASK = re.compile(
    r"^\W*(?:please\s+)?use\s+(?:the\s+)?[\w .:/-]{1,60}?\s+(?:to|for)\s+"
    r"(?!the\b)(?:\w+\s+){0,1}\w+", re.IGNORECASE
)


def strip_series(sentence: str) -> str:
    m = SERIES.match(sentence)
    return sentence[m.end() :] if m else sentence


def is_request(sentence: str) -> bool:
    """A request for the agent to do something ("please check X", "Step 74: run the
    tests", "请看一下…"), as opposed to a rule about how things must be."""
    body = strip_series(sentence)
    return bool(_REQUEST.match(body)) or bool(SERIES.match(sentence)) or bool(
        _USE_FOR_TASK.match(body) and body.rstrip().endswith((":", "："))
    )


def introduces_list(sentence: str) -> bool:
    """"Use Task Master MCP to set task status:": a lead-in to what follows."""
    return sentence.rstrip().endswith((":", "："))


_HEADING_MARKS = re.compile(r"^[#*_\s]+|[*_:：\s]+$")


def is_heading(sentence: str) -> bool:
    """"**Next Steps**", "### Follow-up", "next steps:": a title over what follows, not
    an item of its own."""
    s = sentence.strip()
    bare = _HEADING_MARKS.sub("", s)
    marked = s.startswith(("#", "**", "__")) or s.endswith((":", "："))
    if not marked and bare == s:
        return False
    return len(bare.split()) <= 6 and len(bare) <= 60 and not bare.endswith((".", "。"))
