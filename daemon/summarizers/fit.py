"""Fitting a draft into the token budget: what goes first when it is too big."""

from __future__ import annotations

import heapq
import string
from collections import deque
from collections.abc import Callable

from ctxd.daemon.summarizers.cues import _key_terms, _trim
from ctxd.daemon.summarizers.draft import _SHARES, _Draft, _Entry, _share_class
from ctxd.daemon.summary import SECTIONS, UNPOINTED, Summary, SummaryItem, SummaryRequest

_PLAIN_COST = 1 / 5.2
_DENSE_COST = 0.72
_WIDE_COST = 1.15
_DENSE_CHARS = str.maketrans("", "", string.digits + string.punctuation)

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



def fit(
    draft: _Draft, request: SummaryRequest, truncated_chars: int
) -> dict[str, list[SummaryItem]]:
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
            est = _estimate(_line(e, e.text, request.ordinals))
            line_est[id(e)] = est
            total += est
    ops = _drop_plan(entries, request.instructions, dict(line_est), truncated_chars)
    after = [total]
    for kind, e, new_text in ops:
        if kind == "drop":
            total -= line_est[id(e)]
            alive[e.section] -= 1
            if alive[e.section] == 0:
                total -= header_est[e.section]
        else:
            est = _estimate(_line(e, new_text, request.ordinals))
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
            items = [_item(e, changed[id(e)]) for e in es if id(e) not in dropped]
            if name == "artifacts":  # newest first
                kept = sorted((e for e in es if id(e) not in dropped), key=_Entry.recency)
                items = [_item(e, changed[id(e)]) for e in reversed(kept)]
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
        measured = count(Summary(sections=sections, ordinals=request.ordinals).render())
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
    entries: dict[str, list[_Entry]], instructions: str | None, est: dict[int, float],
    truncated_chars: int,
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
        short = _trim(e.text, truncated_chars)
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
