"""Fitting a draft into the token budget: what goes first when it is too big."""

from __future__ import annotations

import heapq
import re
import string
from collections import deque
from collections.abc import Callable
from functools import lru_cache

from ctxd.daemon.summarizers.cues import _CJK_RUN, _CONSTRAINT, _key_terms, _trim
from ctxd.daemon.summarizers.draft import _SHARES, _Draft, _Entry, _share_class
from ctxd.daemon.summarizers.facts import trim_keeping_hedge
from ctxd.daemon.summarizers.guesses import join_guesses, trim_guess
from ctxd.daemon.summarizers.short_settings import compact_setting
from ctxd.daemon.summary import SECTIONS, UNPOINTED, Summary, SummaryItem, SummaryRequest

_MESSAGE_FRAME_TOKENS = 56
# a long guess is cut to this share of the length a long rule is cut to
_GUESS_SHARE = 0.6
_PLAIN_COST = 1 / 5.2
_DENSE_COST = 0.72
_WIDE_COST = 1.15
_DENSE_CHARS = str.maketrans("", "", string.digits + string.punctuation)

# Most lines are the previous summary's, rendered the same at every compaction.
@lru_cache(maxsize=8192)
def _estimate(text: str) -> float:
    """Rough token count of one rendered line, newline included.

    Prose runs at five to six characters a token, but digits and punctuation (paths,
    source ids, arguments) at little more than one; a CJK character, three UTF-8 bytes,
    is about one token. The caller calibrates against real counts, so this only has to
    be proportionate.
    """
    n = len(text)
    # most lines are ASCII: no need to encode them to learn that no character is wide
    wide = 0 if text.isascii() else (len(text.encode("utf-8")) - n) / 2
    dense = n - len(text.translate(_DENSE_CHARS))
    return (n - dense - wide) * _PLAIN_COST + dense * _DENSE_COST + wide * _WIDE_COST + 1.3



def fit(
    draft: _Draft, request: SummaryRequest, truncated_chars: int
) -> dict[str, list[SummaryItem]]:
    """The draft's items that fit: within `budget_tokens` always, and within
    `size_limit_tokens` (when given) except for the hard constraints and the latest
    request, which are kept whole past it."""
    # the message the summary goes out in opens with a header and a legend of about
    # this many tokens; the budget bounds that message, so they come off it (a small
    # budget makes a small summary, which gets the short legend)
    budget = request.budget_tokens - min(_MESSAGE_FRAME_TOKENS, request.budget_tokens // 40)
    if budget <= 0:
        return {}
    entries = {name: list(draft.sections[name]) for name in SECTIONS}
    if not any(entries.values()):
        return {}
    line_est: dict[int, float] = {
        id(e): _estimate(_line(e, e.text, request.ordinals)) for es in entries.values() for e in es
    }
    routine = _routine(entries)
    ops = _drop_plan(entries, request.instructions, dict(line_est), truncated_chars, routine)
    limit = request.size_limit_tokens
    if limit is not None and limit < budget:
        kept = {id(e) for e in entries["constraints"] if _hard(e) and id(e) not in routine}
        # the latest request too: when a forced compaction summarizes it (one request,
        # then a long tool chain), the summary is all that is left of it
        if entries["goals"]:
            kept.add(id(max(entries["goals"], key=_Entry.recency)))
        soft = [op for op in ops if id(op[1]) not in kept]
        found = _search(entries, soft, line_est, request, limit)
        if found is not None:
            return found
        # even those alone do not fit the limit: they alone, within the budget
        alone = _Plan(entries, soft, line_est, request).build(len(soft))
        if _measure(alone, request) <= budget:
            return alone
    found = _search(entries, ops, line_est, request, budget)
    # Nothing measured fits: only the empty summary (the whole plan applied) is left.
    return found if found is not None else {}


def _hard(e: _Entry) -> bool:
    """A rule the user set and nothing replaced: kept whole whatever the span's size."""
    # a rule stated with a hedge ("X must stay on Y. 这一点尚未确认。") is a guess, kept
    # and shortened with the other guesses, not whole as a rule in force
    return e.section == "constraints" and e.status == "current" and not e.weak \
        and not e.unconfirmed


def _measure(sections: dict[str, list[SummaryItem]], request: SummaryRequest) -> int:
    if not sections:
        return 0
    return request.count_tokens(Summary(sections=sections, ordinals=request.ordinals).render())


class _Plan:
    """A drop plan over the draft's entries: the estimated size after each prefix of it,
    and the sections a prefix leaves."""

    def __init__(
        self,
        entries: dict[str, list[_Entry]],
        ops: list[tuple[str, _Entry, str]],
        line_est: dict[int, float],
        request: SummaryRequest,
    ) -> None:
        self.entries, self.ops = entries, ops
        self.ordinals = request.ordinals or {}
        est = dict(line_est)
        alive = {name: len(es) for name, es in entries.items()}
        header = {name: _estimate(f"## {title}") for name, title in SECTIONS.items()}
        total = sum(est.values()) + sum(header[n] for n, es in entries.items() if es)
        # Estimated size after applying each prefix of the plan, so a cut point can be
        # chosen without counting tokens for every candidate.
        self.after = [total]
        for kind, e, new_text in ops:
            if kind == "drop":
                total -= est[id(e)]
                alive[e.section] -= 1
                if alive[e.section] == 0:
                    total -= header[e.section]
            else:
                new_est = _estimate(_line(e, new_text, request.ordinals))
                total += new_est - est[id(e)]
                est[id(e)] = new_est
            self.after.append(max(total, 0.0))

    def build(self, k: int) -> dict[str, list[SummaryItem]]:
        dropped: set[int] = set()
        changed: dict[int, str] = {}
        for kind, e, new_text in self.ops[:k]:
            if kind == "drop":
                dropped.add(id(e))
            else:
                changed[id(e)] = new_text
        out: dict[str, list[SummaryItem]] = {}
        for name, es in self.entries.items():
            kept = [e for e in es if id(e) not in dropped]
            if name == "artifacts":  # newest first
                kept = sorted(kept, key=_Entry.recency, reverse=True)
            if kept:
                items = [_item(e, changed.get(id(e), e.text)) for e in kept]
                out[name] = join_guesses(items, self.ordinals)
        return out


def _search(
    entries: dict[str, list[_Entry]],
    ops: list[tuple[str, _Entry, str]],
    line_est: dict[int, float],
    request: SummaryRequest,
    limit: int,
) -> dict[str, list[SummaryItem]] | None:
    """The sections of the shortest prefix of `ops` whose summary measures within
    `limit` (close to it), or None when none measured does."""
    plan = _Plan(entries, ops, line_est, request)
    after = plan.after
    # lo: a prefix known to be too big; hi: one known to fit or the whole plan.
    lo, hi = -1, len(ops)
    best: dict[str, list[SummaryItem]] | None = None
    # The estimate runs a few percent high on typical summaries; starting from that
    # ratio, the first probe usually lands within the limit and close to it.
    ratio = 0.94
    target = limit * 0.97
    probes = 0
    while hi - lo > 1 and probes < 16:
        if probes < 4:
            k = next((i for i in range(lo + 1, hi) if after[i] * ratio <= target), hi - 1)
        else:
            k = (lo + hi) // 2
        k = min(max(k, lo + 1), hi - 1)
        sections = plan.build(k)
        measured = _measure(sections, request)
        probes += 1
        if measured <= limit:
            hi, best = k, sections
            if measured >= limit * 0.9:
                break
        else:
            lo = k
        if after[k] > 0 and measured > 0:
            ratio = measured / after[k]
    if best is None and hi == len(ops):
        whole = plan.build(len(ops))
        if _measure(whole, request) <= limit:
            best = whole
    return best


# What each kind may claim of an overfull summary, least important first: the kinds of
# the drafts (`_SHARES`) and hedged conclusions, which are kept with their hedge rather
# than lost with the plain requests and tentative decisions they were filed with. Shares
# weigh kinds of one tier against each other: hedged conclusions share theirs with the
# artifacts, which need fewer lines (the newest few are what the next turns use).
_CLASS_SHARES: dict[str, float] = {**_SHARES, "hedged": 0.45}
_CLASS_ORDER = [*_SHARES][:-3] + ["hedged"] + [*_SHARES][-3:]

# tiers: what goes first when the summary must shrink (0), then (1) and (2), last (3)
_ROUTINE_SECTIONS = frozenset({"tool_activity", "files"})
# requests of one shape ("Step 12: check module m12.py") repeated this often are routine
_ROUTINE_REPEATS = 3
_DIGITS = re.compile(r"\d+")


def _class(e: _Entry) -> str:
    if e.unconfirmed and e.status == "current" and e.section in (
        "goals", "decisions", "open_items", "constraints"
    ):
        return "hedged"
    return _share_class(e)


# Every compaction reads the previous summary's items again, and their texts do not
# change: what these two say of a text is remembered.
@lru_cache(maxsize=4096)
def _has_force(text: str) -> bool:
    return _CONSTRAINT.search(text)


@lru_cache(maxsize=4096)
def _shape(text: str) -> str:
    """The text with its numbers as "#": the items of a series share it."""
    return _DIGITS.sub("#", text.casefold())


def _routine(entries: dict[str, list[_Entry]]) -> set[int]:
    """Entries of a shape repeated at least `_ROUTINE_REPEATS` times in their section
    (numbers aside), but the newest of each shape: a series of requests, not rules."""
    groups: dict[tuple[str, str], list[_Entry]] = {}
    for name, es in entries.items():
        if name == "artifacts":  # each names its own file or id
            continue
        for e in es:
            # a series changes its numbers; a hedged statement or a correction is a
            # fact of its own even when worded like its neighbours
            if e.unconfirmed or e.was:
                continue
            # a rule with deontic force ("Never deploy service7 on Fridays") stays a
            # rule however many siblings it has
            if name == "constraints" and _has_force(e.text):
                continue
            groups.setdefault((name, _shape(e.text)), []).append(e)
    out: set[int] = set()
    for members in groups.values():
        if len(members) >= _ROUTINE_REPEATS:
            members.sort(key=_Entry.recency)
            out.update(id(e) for e in members[:-1])
    return out


def _drop_plan(
    entries: dict[str, list[_Entry]], instructions: str | None, est: dict[int, float],
    truncated_chars: int, routine: set[int],
) -> list[tuple[str, _Entry, str]]:
    """The order items go in when the summary is over budget; a prefix is applied.

    Tiers first: routine lines (tool activity, files merely mentioned, plain requests,
    a repeated series of requests) go before everything else; then the other excerpts;
    then the agent's own artifacts and its hedged conclusions; the user's rules in force
    and live corrections go last of all.
    Within a tier each kind of item may claim its share of what is left
    (`_CLASS_SHARES`): the kind furthest over its share loses its oldest item next, and
    what a kind does not use goes to the others. So a long session keeps its recent
    decisions and files next to its rules instead of dropping whole sections in turn.
    Every section keeps its most recent item until everything else is gone, and items
    the instructions ask to focus on go after all others. `est` holds each item's
    estimated size; it is updated as long rules are shortened.
    """
    focus = _key_terms(instructions) if instructions else frozenset()

    def favoured(e: _Entry) -> bool:
        if not focus:
            return False
        terms = (e.terms | e.values) or _key_terms(e.text)
        return bool(terms & focus)

    # an entry's class and tier do not change while the plan is made: each is worked
    # out once, not again in every tier's pass over all entries
    classes = {id(e): _class(e) for es in entries.values() for e in es}

    def tier(e: _Entry) -> int:
        if id(e) in routine or e.section in _ROUTINE_SECTIONS:
            return 0
        cls = classes[id(e)]
        if e.section == "goals" and cls == "goals":
            return 0
        if _hard(e) or (e.was and e.status == "current"):
            # the user's rules in force and live corrections go last of all
            return 3
        # the agent's own changes and the ids its tools returned, and the conclusions
        # not yet confirmed, come right before the rules: nothing else in the context
        # says what was done and what is still a guess
        if e.section == "artifacts" or cls == "hedged":
            return 2
        return 1

    order = {name: i for i, name in enumerate(_CLASS_ORDER)}
    floors: list[_Entry] = []
    for name, es in entries.items():
        pool = [e for e in es if e.status == "current"] if name == "constraints" else es
        if pool:
            floors.append(max(pool, key=_Entry.recency))
    floor_ids = {id(e) for e in floors}
    # A long rule loses its tail before any rule of its tier is lost, and a long hedged
    # statement its middle (the hedge stays) before any of them is lost.
    trims: dict[int, dict[str, deque[tuple[_Entry, str]]]] = {
        level: {"constraints": deque(), "hedged": deque()} for level in (0, 1, 2, 3)
    }
    for e in sorted((e for es in entries.values() for e in es), key=_Entry.recency):
        cls = classes[id(e)]
        if cls in ("constraints", "hedged"):
            if cls == "hedged" and e.unconfirmed:
                # shown with its unconfirmed mark, a guess needs no hedge words to stay
                # a guess: its opening (what it is about) is what is kept
                short = trim_guess(e.text, _trim_chars(e.text, int(truncated_chars * _GUESS_SHARE)))
            else:
                chars = _trim_chars(e.text, truncated_chars)
                short = (_trim(e.text, chars) if cls == "constraints"
                         else trim_keeping_hedge(e.text, chars))
            if short != e.text:
                trims[tier(e)][cls].append((e, short))

    ops: list[tuple[str, _Entry, str]] = []

    def drain(members: list[_Entry], cuts: dict[str, deque[tuple[_Entry, str]]]) -> None:
        """Drop `members` (and shorten `cuts`' items first, within their kind): the kind
        furthest over its share first; ties go to the one listed first in
        _CLASS_ORDER, the one that matters least."""
        size: dict[str, float] = dict.fromkeys(_CLASS_SHARES, 0.0)
        queues: dict[str, deque[_Entry]] = {cls: deque() for cls in _CLASS_SHARES}
        for e in sorted(members, key=_Entry.recency):
            cls = classes[id(e)]
            size[cls] += est[id(e)]
            queues[cls].append(e)
        heap = [
            (-size[cls] / _CLASS_SHARES[cls], order[cls], cls)
            for cls in _CLASS_SHARES
            if queues[cls] or cuts.get(cls)
        ]
        heapq.heapify(heap)
        while heap:
            _, _, cls = heapq.heappop(heap)
            cut = cuts.get(cls)
            if cut:
                e, short = cut.popleft()
                saved = est[id(e)] - _estimate(_line(e, short))
                est[id(e)] -= saved
                size[cls] -= saved
                ops.append(("trim", e, short))
            else:
                e = queues[cls].popleft()
                size[cls] -= est[id(e)]
                ops.append(("drop", e, ""))
            if queues[cls] or cuts.get(cls):
                heapq.heappush(heap, (-size[cls] / _CLASS_SHARES[cls], order[cls], cls))

    # every entry but the floors, by whether the instructions favour it and its tier
    # (in the order of `entries`)
    groups: dict[tuple[bool, int], list[_Entry]] = {}
    for es in entries.values():
        for e in es:
            if id(e) not in floor_ids:
                groups.setdefault((favoured(e), tier(e)), []).append(e)
    floors.sort(key=lambda e: (tier(e), order[classes[id(e)]]))
    # the newest item of each section goes after every other item, but before the
    # items the instructions ask for: those are kept first
    for keep_focus in (False, True):
        for level in (0, 1, 2, 3):
            if level == 1 and not keep_focus:
                # past the routine lines, a long sentence that sets a value gives up its
                # reasons (subject and value stay, the archive has the rest) before any
                # excerpt, artifact or guess is lost
                ops.extend(_compact_settings(entries, est, favoured))
            drain(groups.get((keep_focus, level), []), trims[level] if not keep_focus else {})
        ops.extend(("drop", e, "") for e in floors if favoured(e) == keep_focus)
    return ops


def _compact_settings(
    entries: dict[str, list[_Entry]], est: dict[int, float],
    favoured: Callable[[_Entry], bool],
) -> list[tuple[str, _Entry, str]]:
    """Trims that write long settings in force as subject and value, oldest first; not
    those the instructions ask for, which stay whole."""
    ops: list[tuple[str, _Entry, str]] = []
    for e in sorted(entries["constraints"], key=_Entry.recency):
        if e.status != "current" or e.unconfirmed or favoured(e):
            continue
        short = compact_setting(e.text, e.setting)
        if short is None:
            continue
        est[id(e)] = _estimate(_line(e, short))
        ops.append(("trim", e, short))
    return ops


def _trim_chars(text: str, chars: int) -> int:
    """The length a long item is shortened to: about the same number of tokens whatever
    the script, so Chinese (a token a character, against four or five for English) is
    cut to fewer characters."""
    cjk = sum(len(r) for r in _CJK_RUN.findall(text))
    if cjk * 3 < len(text):
        return chars
    return max(24, chars * 2 // 5)


def _item(e: _Entry, text: str) -> SummaryItem:
    value = subject = None
    if e.setting is not None and e.section in ("constraints", "decisions"):
        value = ", ".join(sorted(e.setting.values)[:3])
        subject = e.setting.label
    return SummaryItem(
        text=text,
        sources=list(e.sources),
        status=e.status,
        unconfirmed=e.unconfirmed,
        subject=e.subject or subject,
        value=value,
        was=e.was,
    )


def _line(entry: _Entry, text: str, ordinals: dict[int, int] | None = None) -> str:
    bare = bool(ordinals) and entry.section in UNPOINTED
    return _item(entry, text).line(ordinals, pointer=not bare)
