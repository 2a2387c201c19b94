"""Kinds of facts: hedged statements, settings (subject -> value) and the agent's artifacts.

Pure functions over text; the draft (draft.py) decides what they mean for the summary.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

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

# what a setting is and when a later statement replaces it: settings.py
from ctxd.daemon.summarizers.settings import Setting, same_subject, setting_of  # noqa: E402,F401

# ---------------------------------------------------------------------- artifacts

_OPS = (
    ("deleted", re.compile(r"delete|remove|unlink|(?:^|_)rm(?:_|$)")),
    ("moved", re.compile(r"move|rename|(?:^|_)mv(?:_|$)")),
    ("created", re.compile(r"write|create|save|new_file|touch")),
    ("edited", re.compile(r"edit|patch|replace|apply|update|modify|append|insert")),
)
_SRC_KEYS = ("source", "src", "from", "old_path", "path", "file_path", "file")
_DST_KEYS = ("destination", "dst", "to", "new_path", "target")
_PATH_ARG_KEYS = ("path", "file_path", "filepath", "file", "filename", "target_file")
# "*** Update File: src/app.py" (apply_patch), "+++ b/src/app.py" (unified diff)
_PATCH_FILE = re.compile(
    r"^\*\*\* (Add|Update|Delete) File: (\S+)|^\+\+\+ (?:b/)?(?!/dev/null)(\S+)", re.MULTILINE
)
_COMMIT = re.compile(r"^\[[\w./-]+(?: \(root-commit\))? ([0-9a-f]{7,40})\]", re.MULTILINE)
_COMMIT_WORD = re.compile(r"\bcommit ([0-9a-f]{7,40})\b")
_BRANCH = re.compile(
    r"Switched to a new branch '([^']+)'|Created branch '?([\w./-]+)|new branch\]\s+(\S+)"
)
_PR = re.compile(
    r"https?://\S+/(?:pull|pulls|merge_requests)/(\d+)|\b(?:pull request|PR|MR) #?(\d+)\b",
    re.IGNORECASE,
)
_JOB = re.compile(
    r"\b(job|run|pipeline|build|workflow run|deployment|task)(?:[ _-]?id)?\s*[:=#]?\s*"
    r"([0-9a-f]{6,}|\d{4,})\b",
    re.IGNORECASE,
)


_SPACE = re.compile(r"\s")
# substrings without which a result names no commit, branch, PR or job: most results
# (file contents, test output) skip every pattern
_ID_GATES = ("commit", "]", "branch", "pull", "merge_request", "pr ", "pr #", "mr ", "job",
             "run", "pipeline", "build", "deployment", "task")


def _arg(args: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    lowered = {str(k).lower(): v for k, v in args.items()}
    for k in keys:
        v = lowered.get(k)
        if isinstance(v, str) and 0 < len(v) <= 260 and v.strip() and not _SPACE.search(v.strip()):
            return v.strip()
    return None


def _shell_ops(command: str) -> list[tuple[str, str, str]]:
    try:
        words = shlex.split(command)
    except ValueError:
        return []
    if words[:1] == ["git"] and len(words) > 1 and words[1] in ("mv", "rm"):
        words = words[1:]
    if not words:
        return []
    args = [w for w in words[1:] if not w.startswith("-")]
    if words[0] == "mv" and len(args) == 2:
        return [("moved", args[1], f"moved {args[0]} → {args[1]}")]
    if words[0] == "rm":
        return [("deleted", a, f"deleted {a}") for a in args[:4]]
    if words[0] in ("touch", "mkdir"):
        return [("created", a, f"created {a}") for a in args[:4]]
    return []


def artifacts_of(name: str, args: Any, result: str) -> list[tuple[str, str]]:
    """(target, text) for what a successful call produced: files it wrote, moved or
    deleted; commits, branches, PRs, job and run ids its result names."""
    out: list[tuple[str, str]] = []
    low = name.lower()
    if isinstance(args, dict):
        command = args.get("command") if isinstance(args.get("command"), str) else None
        op = next((op for op, pattern in _OPS if pattern.search(low)), None)
        if command and op is None and low.endswith(("edit", "editor", "tool", "file")):
            # str_replace_based_edit_tool: the command says what it does
            op = {"create": "created", "str_replace": "edited", "insert": "edited"}.get(command)
        if op == "moved":
            src, dst = _arg(args, _SRC_KEYS), _arg(args, _DST_KEYS)
            if dst:
                out.append((dst, f"moved {src} → {dst}" if src else f"moved to {dst}"))
        elif op is not None:
            path = _arg(args, _PATH_ARG_KEYS)
            if path:
                out.append((path, f"{op} {path}"))
            else:  # a patch names its files in its headers
                patch = next((v for v in args.values() if isinstance(v, str) and "\n" in v), "")
                for m in _PATCH_FILE.finditer(patch[:20000]):
                    kind, target = m.group(1) or "", m.group(2) or m.group(3)
                    what = {"Add": "created", "Delete": "deleted"}.get(kind, "edited")
                    out.append((target, f"{what} {target}"))
        cmd = args.get("command") or args.get("cmd")
        if op is None and isinstance(cmd, str):
            out += [(target, text) for _, target, text in _shell_ops(cmd.strip())]
    head = result[:2000]
    low = head.lower()
    if not any(map(low.__contains__, _ID_GATES)):
        return _unique(out)
    for m in _COMMIT.finditer(head):
        out.append((m.group(1), f"commit {m.group(1)}"))
    if not any(t.startswith("commit ") for _, t in out):
        for m in _COMMIT_WORD.finditer(head):
            out.append((m.group(1), f"commit {m.group(1)}"))
            break
    for m in _BRANCH.finditer(head):
        branch = next(g for g in m.groups() if g)
        out.append((f"branch:{branch}", f"branch {branch}"))
    for m in _PR.finditer(head):
        url = m.group(0) if m.group(0).startswith("http") else None
        number = m.group(1) or m.group(2)
        out.append((f"pr:{number}", f"PR {url}" if url else f"PR #{number}"))
    for m in _JOB.finditer(head):
        out.append((f"{m.group(1).lower()}:{m.group(2)}", f"{m.group(1).lower()} {m.group(2)}"))
    return _unique(out)


def _unique(found: list[tuple[str, str]]) -> list[tuple[str, str]]:
    seen: dict[str, str] = {}
    for target, text in found:
        seen[target] = text
    return list(seen.items())[:8]
