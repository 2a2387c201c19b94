"""The summary contract a model's answer is held to, checked against the built-in
summarizer's reading of the same messages.

The built-in summarizer is deterministic and cites its evidence, so it serves as the
reference: a value it found superseded must not appear as current, a statement it found
hedged must not lose its hedge, and the artifacts the agent's tools produced in these
messages must be listed. A model answer that breaks one of them is retried with the
problems spelt out, like any other invalid answer.
"""

from __future__ import annotations

import re

from ctxd.daemon.messages import message_id
from ctxd.daemon.summarizers.builtin import BuiltinSummarizer
from ctxd.daemon.summarizers.draft import FOLDED_ARTIFACTS
from ctxd.daemon.summarizers.facts import is_hedged
from ctxd.daemon.summary import Summary, SummaryItem, SummaryRequest

# artifacts checked per chunk, newest first: a chunk of bulk tool work could name more
# than a summary has room for
_MAX_ARTIFACTS = 12
# below this budget a summary cannot be asked to list artifacts on top of the rest
_ARTIFACT_BUDGET = 600

CONTRACT_PROMPT = """\
Kinds of facts:
7. A setting or decision that sets a value (a size, a port, a day, a version) may carry \
"subject" (what is set) and "value". When a later message gives the same subject another \
value, in any wording ("raise the batch size to 2000", "改到周二上午", "45 days, not 30"), \
the old value is no longer current: mark the old item "status": "superseded" (or drop it) \
and write the new one, optionally with "was": the old value. Never state a replaced value \
as current. Only a changed value of the same subject is a correction: a numbered series \
of tasks ("step 74", "step 75"), the same statement repeated, numbers in pasted logs, \
stack frames, screenshots or tool output (`len=335`, `workers=4`) and similar subjects \
("upload retries", "download retries") supersede nothing.
8. A conclusion stated with a hedge ("probably", "may not hold", "I haven't confirmed \
that", "推测", "不一定") keeps the hedge: keep the hedging words or add "unconfirmed": true. \
An item of the previous summary with "unconfirmed": true keeps it unless a message \
confirms it.
9. "artifacts" lists, newest first, what the agent's own tool calls produced: files \
created, edited, moved or deleted, and the commits, branches, PR numbers or URLs, job and \
run ids the tools returned, each word for word with "subject": the path or id. Files only \
mentioned go in "files"."""


def reference(request: SummaryRequest, anchor: Summary, ids: list[int]) -> Summary:
    """The built-in summarizer's summary of the chunk, with room for everything."""
    wanted = set(ids)
    messages = [m for m in request.messages if message_id(m) in wanted]
    return BuiltinSummarizer().summarize_sync(
        SummaryRequest(
            session_id=request.session_id,
            previous=anchor,
            messages=messages,
            pins=list(request.pins),
            instructions=None,
            budget_tokens=1 << 30,
            count_tokens=lambda text: len(text) // 4,
        )
    )


def contract_problems(
    ref: Summary,
    sections: dict[str, list[SummaryItem]],
    ids: list[int],
    budget_tokens: int,
) -> list[str]:
    chunk = set(ids)
    answer = [item for items in sections.values() for item in items]
    problems: list[str] = []
    # 1. a superseded value stated as current
    for _, old in ref.items():
        if old.status != "superseded" or not old.value or not old.sources:
            continue
        newer = ref.supersessions.get(old.sources[-1])
        if newer is None or newer not in chunk:
            continue
        values = [v.strip() for v in old.value.split(",") if v.strip()]
        for item in answer:
            if (
                item.status == "current"
                and set(item.sources) & set(old.sources)
                and newer not in item.sources
                and any(_mentions(item.text, v) for v in values)
            ):
                problems.append(
                    f"item {item.text[:60]!r} states {old.value}, which message {newer} "
                    'replaced: mark it "status": "superseded" or give the new value'
                )
    # 2. a hedged statement without its hedge
    for _, hedged in ref.items():
        if not hedged.unconfirmed or hedged.status != "current":
            continue
        for item in answer:
            if (
                set(item.sources) & set(hedged.sources)
                and _same_statement(item.text, hedged.text)
                and not item.unconfirmed
                and not is_hedged(item.text)
            ):
                problems.append(
                    f"item {item.text[:60]!r} states a hedged conclusion as fact: keep the "
                    'hedge or add "unconfirmed": true'
                )
    # 3. what the agent's tools produced in these messages
    if budget_tokens >= _ARTIFACT_BUDGET:
        text = "\n".join(item.text for item in answer)
        produced = [a for a in ref.sections.get("artifacts") or []
                    if set(a.sources) & chunk and a.subject != FOLDED_ARTIFACTS]
        for artifact in produced[:_MAX_ARTIFACTS]:
            key = (artifact.subject or artifact.text).split(":", 1)[-1]
            if key not in text:
                problems.append(
                    f"the artifact {artifact.text[:80]!r} (message {artifact.sources[-1]}) is "
                    'missing: list it in "artifacts"'
                )
    return problems


def _mentions(text: str, value: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(value)}(?![\w]|\.\d)", text, re.IGNORECASE) is not None


def _same_statement(a: str, b: str) -> bool:
    """Whether an answer's item restates a reference statement: most of the shorter
    one's words (or Chinese characters) are in the other."""
    wa, wb = _words(a), _words(b)
    if not wa or not wb:
        return False
    return len(wa & wb) >= 0.5 * min(len(wa), len(wb))


def _words(text: str) -> set[str]:
    low = text.casefold()
    return set(re.findall(r"[a-z0-9_]{3,}", low)) | set(re.findall(r"[\u4e00-\u9fff]", low))

