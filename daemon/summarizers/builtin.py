"""The built-in summarizer: extractive, deterministic, offline.

It never writes prose of its own. Every item is an excerpt of a source message (a
sentence, an error line, a path) or a mechanical description of a tool call built from
its name and arguments, and it carries the archive ids it came from. The result is
cruder than a model's summary, but it is free, instant and cannot hallucinate, which
is what the daemon needs as a default and as the fallback when a model summarizer
fails.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ctxd.daemon.messages import content_text, message_id
from ctxd.daemon.summarizers.artifacts_fold import fold_unlisted
from ctxd.daemon.summarizers.boilerplate import clean, is_injected, repeats
from ctxd.daemon.summarizers.cues import (
    _CALL_ID_NOTE,
    _CJK_RUN,
    _CORRECTION,
    _DECISION,
    _ERROR_ANY,
    _ERROR_LINE,
    _FAILURE_START,
    _OPEN,
    _SETTING,
    _error_excerpt,
    _is_error_text,
    _trim,
)
from ctxd.daemon.summarizers.draft import _Call, _Draft, _Entry
from ctxd.daemon.summarizers.facts import (
    _HEDGE,
    artifacts_of,
    is_confirmation,
    is_hedged,
    made_commits,
    trim_keeping_hedge,
)
from ctxd.daemon.summarizers.fit import fit
from ctxd.daemon.summarizers.folding import Folds
from ctxd.daemon.summarizers.guesses import split_guesses
from ctxd.daemon.summarizers.kinds import is_deontic, is_document, user_kind
from ctxd.daemon.summarizers.paths import (
    _PATH_KEYS,
    _find_paths,
    _key_args,
    _parse_args,
    _walk_strings,
)
from ctxd.daemon.summarizers.sentences import (
    hedge_follows,
    introduces_list,
    is_heading,
    is_request,
    qualifies_previous,
    units,
)
from ctxd.daemon.summary import SECTIONS, Summary, SummaryRequest

# -------------------------------------------------------------------- summarizer

# superseded statements remembered for search (`supersededBy`), the most recent kept
_MAX_SUPERSESSIONS = 2000


class BuiltinSummarizer:
    """Extractive summarizer used by default and whenever a model summarizer fails.

    max_item_chars: excerpt length for goals, decisions, errors and open items.
    max_constraint_chars: user instructions are kept whole up to this length.
    max_sources: archive ids kept per item (the first and the most recent).
    fold_threshold: more calls than this to one tool in a batch fold into one item.
    max_paths_per_message: bounds the files a single message (a directory listing,
    a traceback) can contribute.
    max_artifacts: artifacts listed, newest first; older ones are counted on one line.
    """

    name = "builtin"
    # extractive and deterministic: incremental summaries do not compound errors, so the
    # drift bound (periodic re-derivation from the archive) does not apply
    drifts = False
    # messages per call when a compaction or rebuild has many to summarize
    chunk_messages = 5000
    # fits the request's size_limit_tokens, keeping hard constraints whole past it
    honours_size_limit = True

    def __init__(
        self,
        *,
        max_item_chars: int = 240,
        max_constraint_chars: int = 400,
        max_sources: int = 16,
        fold_threshold: int = 3,
        max_paths_per_message: int = 12,
        truncated_constraint_chars: int = 100,
        max_artifacts: int = 60,
    ) -> None:
        self.max_artifacts = max(1, max_artifacts)
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
            mid = message_id(m)
            if mid is not None:
                messages.append((mid, m))
        answered = {
            str(m.get("tool_call_id"))
            for _, m in messages
            if m.get("role") == "tool" and m.get("tool_call_id") is not None
        }
        # rules the summary message carries word for word in a preamble need no item
        said = repeats(request.verbatim)
        self._load_previous(draft, request.previous, answered, said)
        folds = Folds()
        folds.load(draft)

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
                if is_injected(msg):
                    # a skill's text or a caveat the front end sent in the user's name
                    continue
                # boilerplate (the run's environment, IDE tabs) names no file of the work
                text = self._read_user(draft, mid, text, folds, said)
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
        draft.fold_artifacts(self.max_artifacts)
        self._add_activity(draft, activity)

        prev = request.previous
        covers_from = prev.covers_from
        covers_to = prev.covers_to
        if messages:
            first = min(mid for mid, _ in messages)
            last = max(mid for mid, _ in messages)
            covers_from = first if covers_from is None else min(covers_from, first)
            covers_to = last if covers_to is None else max(covers_to, last)

        sections = fit(draft, request, self.truncated_constraint_chars)
        fold_unlisted(draft, sections, request.count_tokens, self.max_sources)
        summary = Summary(
            sections=sections,
            covers_from=covers_from,
            covers_to=covers_to,
            compaction_ids=list(prev.compaction_ids),
            summarizer=self.name,
            supersessions=dict(list(draft.supersessions.items())[-_MAX_SUPERSESSIONS:]),
        )
        cited = summary.all_sources()
        summary.ordinals = {k: v for k, v in request.ordinals.items() if k in cited}
        return summary

    # ------------------------------------------------------------------ reading

    def _load_previous(
        self, draft: _Draft, previous: Summary, answered: set[str], said: Callable[[str], bool]
    ) -> None:
        for name in SECTIONS:
            for item in previous.sections.get(name) or []:
                if name == "constraints" and item.status == "current" and said(item.text):
                    continue
                if name == "open_items":
                    note = _CALL_ID_NOTE.search(item.text)
                    # The call this item waited on has its result now; it is no longer open.
                    if note and note.group(1) in answered:
                        continue
                if name == "artifacts":
                    draft.add_artifact(item.subject or item.text, item.text, item.sources)
                    continue
                # a line of joined guesses is read back as the guesses it holds
                for text, sources in split_guesses(item, previous.ordinals):
                    draft.add(
                        name, text, sources, item.status,
                        unconfirmed=item.unconfirmed, was=item.was, subject=item.subject,
                    )
        draft.supersessions.update(previous.supersessions)

    def _read_user(
        self, draft: _Draft, mid: int, text: str, folds: Folds | None = None,
        said: Callable[[str], bool] | None = None,
    ) -> str:
        """File the sentences of a user message; returns the text that is not
        boilerplate."""
        cleaned = clean(text)
        for rule in cleaned.rules:
            # a rule of an AGENTS.md / CLAUDE.md block: verbatim, one item per line
            if is_deontic(rule) and not (said and said(rule)):
                draft.add(
                    "constraints", trim_keeping_hedge(rule, self.max_constraint_chars), [mid]
                )
        text = cleaned.prose
        if not text:
            return "\n".join(cleaned.rules)
        low = text.lower()
        may_correct = _CORRECTION.gate(low)
        may_set = _SETTING.gate(low)
        may_open = _OPEN.gate(low)
        may_fail = _ERROR_ANY.gate(low)
        goal: list[str] = []
        goal_hedged = False
        # the item the previous sentence went into: a hedge or a confirmation that
        # follows ("I haven't confirmed that", "不过这只是推测") is about it
        last: _Entry | None = None
        # "Do NOT:" or "必须：" before a list: each item of the list is one of its rules
        lead: str | None = None
        # the unit index of the sentence last added to `goal`: a hedge right after a
        # statement ("X is caused by Y. I haven't confirmed that.") binds to it alone
        goal_unit = -2
        pieces = units(text)
        document = is_document(text, pieces)
        for index, unit in enumerate(pieces):
            if unit.pasted:
                # pasted output is evidence: its error line is kept below, nothing of it
                # is a rule, a request or a decision
                last = lead = None
                continue
            sentence = unit.text
            if lead is not None and unit.item:
                last = draft.add(
                    "constraints",
                    trim_keeping_hedge(f"{lead} {sentence}", self.max_constraint_chars),
                    [mid],
                )
                continue
            lead = None
            slow = sentence.lower()
            if introduces_list(sentence) and is_deontic(sentence):
                if len(sentence.split()) <= 3:
                    lead = sentence
                    continue
            hedged = is_hedged(sentence)
            if hedged and qualifies_previous(sentence, hedged):
                if last is not None:
                    last.unconfirmed = True
                elif goal and goal_unit == index - 1 and not is_request(goal[-1]):
                    # a statement, not a request: it and its hedge are a guess of their
                    # own, kept apart from the requests around them
                    last = draft.add(
                        "open_items",
                        trim_keeping_hedge(f"{goal.pop()} {sentence}", self.max_item_chars),
                        [mid],
                        unconfirmed=True,
                    )
                else:
                    goal_hedged = goal_hedged or bool(goal)
                    goal.append(sentence)
                continue
            if is_confirmation(sentence, hedged):
                draft.confirm(sentence, last)
            # a quoted line is someone else's words: part of the request, no rule
            kind = None if unit.quoted else user_kind(
                sentence, slow, may_correct, may_set, document)
            if kind is not None:
                is_correction = kind == "correction"
                entry = draft.add(
                    "constraints",
                    trim_keeping_hedge(sentence, self.max_constraint_chars),
                    [mid],
                    # "X must stay on Y. This is unconfirmed so far.": a guess from the
                    # start, so it replaces no rule or setting stated before
                    unconfirmed=hedged or hedge_follows(pieces, index),
                )
                if entry is not None and not (entry.unconfirmed and not is_correction) \
                        and not draft.supersede(entry, mid, correction=is_correction):
                    draft.supersede_setting(entry, mid)
                last = entry
                continue
            if may_open and _OPEN.search(sentence, slow) and not is_heading(sentence):
                last = draft.add("open_items", _trim(sentence, self.max_item_chars), [mid])
                continue
            if hedged and not is_request(sentence):
                # a guess of its own ("I suspect the cache is stale"): kept with its hedge,
                # apart from the requests and rules around it
                last = draft.add(
                    "open_items",
                    trim_keeping_hedge(sentence, self.max_item_chars),
                    [mid],
                    unconfirmed=True,
                )
                continue
            last = None
            # Lines of pasted output are covered by the one excerpt below; a traceback
            # would otherwise become an error item per line.
            if (
                may_fail
                and _is_error_text(sentence, anchored=False, low=slow)
                and not _ERROR_LINE.search(sentence, slow)
            ):
                draft.add("errors", _trim(sentence, self.max_item_chars), [mid])
            goal_hedged = goal_hedged or hedged
            goal.append(sentence)
            goal_unit = index
        pasted = _error_excerpt(text) if may_fail else None
        if pasted:
            draft.add("errors", _trim(pasted, self.max_item_chars), [mid])
        request = " ".join(goal)
        # "ok", "thanks", "继续" carry no request worth keeping.
        if len(request) >= 12 or (len(request) >= 4 and _CJK_RUN.search(request)):
            request = trim_keeping_hedge(request, self.max_item_chars)
            if folds is None:
                draft.add("goals", request, [mid], unconfirmed=goal_hedged)
            else:
                folds.add(draft, request, mid, unconfirmed=goal_hedged, sentences=goal)
        return "\n".join([*cleaned.rules, text])

    def _read_assistant(self, draft: _Draft, mid: int, text: str) -> None:
        if not text:
            return
        low = text.lower()
        may_open = _OPEN.gate(low)
        may_decide = _DECISION.gate(low)
        may_hedge = _HEDGE.gate(low)
        decisions = 0
        guesses = 0
        last: _Entry | None = None
        pieces = units(text) if may_open or may_decide or may_hedge else []
        for index, unit in enumerate(pieces):
            if unit.pasted:
                # quoted output, a diff, a table: evidence, never a decision
                last = None
                continue
            sentence = unit.text
            slow = sentence.lower()
            hedged = is_hedged(sentence)
            if hedged and qualifies_previous(sentence, hedged):
                if last is not None:
                    last.unconfirmed = True
                continue
            if is_confirmation(sentence, hedged):
                draft.confirm(sentence, last)
            last = None
            if is_heading(sentence):
                # "**Next Steps**": what follows is the content
                continue
            if may_open and _OPEN.search(sentence, slow):
                last = draft.add("open_items", _trim(sentence, self.max_item_chars), [mid])
            elif (
                may_decide
                and decisions < 3
                and not sentence.endswith(("?", "？"))
                and _DECISION.search(sentence, slow)
            ):
                decisions += 1
                last = draft.add(
                    "decisions",
                    trim_keeping_hedge(sentence, self.max_item_chars),
                    [mid],
                    unconfirmed=hedged or hedge_follows(pieces, index),
                )
                if last is not None:
                    draft.supersede_setting(last, mid)
            elif (
                (hedged or hedge_follows(pieces, index))
                and guesses < 1
                and not sentence.endswith(("?", "？"))
            ):
                # "The workers must stay on the replica. This is unconfirmed so far.":
                # the statement is the guess its next sentence hedges
                # a conclusion the agent drew but did not confirm: kept as such
                guesses += 1
                last = draft.add(
                    "open_items",
                    trim_keeping_hedge(sentence, self.max_item_chars),
                    [mid],
                    unconfirmed=True,
                )
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
            raw=args,
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
        error_text = _is_error_text(text, anchored=True)
        failed = error_text or bool(_FAILURE_START.match(first_line))
        record.outcome = "error" if failed else "ok"
        # exact: a path or an id cut short names something else; a failed call still
        # made the commits its output names
        made = made_commits(text) if failed else artifacts_of(record.name, record.raw, text)
        for target, what in made:
            draft.add_artifact(target, what, [*record.sources])
        if failed:
            line = _error_excerpt(text, matched=error_text) or first_line
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

