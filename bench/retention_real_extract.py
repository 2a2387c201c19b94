"""What `bench/retention_real.py` looks for in a real transcript and in its summaries.

- Loading: a transcript goes through ctxd's own importer (`ctxd import claude-code|codex`)
  into a scratch engine, exactly as the daemon would take it (including the importer's
  repairs of messages the daemon refuses); the main session's archived messages come out.
- Items to find again in the model input later: user rules (sentences with deontic
  force, EN and ZH, and the lines of an AGENTS.md / CLAUDE.md preamble sent as a user
  message), files the agent's tools wrote (Edit/Write/MultiEdit, Codex `apply_patch`
  headers, shell redirections), ids the tools produced (commits made or pushed, branches
  created, PR URLs, CI run and job ids; not the commits a `git log` lists).
- Summary lines: the sections and items of the summary message the model reads, and the
  tests applied to them (rule cue, boilerplate, superseded marks).
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from ctxd.clients.importers import FORMATS
from ctxd.clients.importers.common import FileImporter, Options, Report
from ctxd.daemon.config import Config
from ctxd.daemon.engine import Engine

# ------------------------------------------------------------------ loading


class EngineClient:
    """The few client calls the importer makes, answered by an engine in this process."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def read(self, session_id: str, before_id: int | None = None, limit: int | None = None,
             after_id: int | None = None) -> dict[str, Any]:
        # as a client gets it
        return msgspec.to_builtins(self.engine.read_archive(
            session_id, after_id=after_id or 0, limit=limit or 200, before_id=before_id))

    def get_session(self, session_id: str) -> dict[str, Any]:
        return msgspec.to_builtins(self.engine.get_session(session_id))  # as a client gets it

    def create_session(self, session_id: str, title: str | None = None,
                       metadata: dict[str, Any] | None = None,
                       created_at: float | None = None) -> dict[str, Any]:
        return msgspec.to_builtins(self.engine.create_session(  # as a client gets it
            session_id, title=title, metadata=metadata, created_at=created_at))

    def append(self, session_id: str, messages: list[dict[str, Any]],
               client_batch_id: str | None = None) -> dict[str, Any]:
        return msgspec.to_builtins(  # as a client gets it
            self.engine.append(session_id, messages, client_batch_id=client_batch_id))


@dataclass
class Transcript:
    name: str  # agent/file stem
    agent: str  # "claude-code" or "codex"
    path: Path
    messages: list[dict[str, Any]] = field(default_factory=list)
    cwd: str = ""
    notes: list[str] = field(default_factory=list)


_MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name", "metadata")


def load(path: Path, scratch: Path) -> Transcript:
    """The transcript's main session as ctxd's importer makes it (sidechains, which the
    importer puts in sessions of their own, are left out)."""
    agent = path.parent.name
    t = Transcript(f"{agent}/{path.stem}", agent, path)
    engine = Engine(Config(data_dir=scratch))
    try:
        mapper = FORMATS[agent][0](path, Options())
        report = Report()
        FileImporter(EngineClient(engine), mapper, path, report, Options()).run()
        sid = mapper.session_id(None)
        after = 0
        while True:
            page = engine.read_archive(sid, after_id=after, limit=500)
            for m in page.messages:
                t.messages.append({k: m[k] for k in _MESSAGE_KEYS if m.get(k) is not None})
            if page.next_after_id is None:
                break
            after = page.next_after_id
        t.cwd = str(mapper.session_info(None)[1].get("cwd") or "")
        for kind, n in report.unmappable.items():
            t.notes.append(f"importer: {n} line(s) unmappable ({kind})")
        for kind, n in report.repaired.items():
            t.notes.append(f"importer: {n} message(s) repaired ({kind})")
    finally:
        engine.close()
    return t


def text_of(m: dict[str, Any]) -> str:
    c = m.get("content")
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        return "\n".join(str(p.get("text", "")) for p in c if isinstance(p, dict))
    return ""


def model_input_text(messages: list[dict[str, Any]]) -> str:
    """Everything the model reads: contents, and the names and arguments of tool calls."""
    out: list[str] = []
    for m in messages:
        out.append(text_of(m))
        for c in m.get("tool_calls") or ():
            fn = c.get("function") or {}
            out.append(f"{fn.get('name', '')} {fn.get('arguments', '')}")
    return "\n".join(out)


def norm(s: str) -> str:
    """Whitespace collapsed, case folded (NFKC first, so full-width forms match)."""
    return re.sub(r"\s+", " ", unicodedata.normalize("NFKC", s)).strip().casefold()


# ------------------------------------------------------------------ items


@dataclass
class Item:
    """Something said or done in a message that should stay findable in the model input
    after the message left the verbatim tail."""

    kind: str  # rule/sentence, rule/preamble, file, id/commit, id/branch, id/pr, id/ci
    key: str  # what is searched for
    msg_index: int  # index of its (last) message in the transcript
    alts: tuple[str, ...] = ()  # other spellings that count as present
    msg_id: int = -1  # archive id once replayed
    departed: int | None = None  # the compaction (1-based) that took it out of the tail
    seen: dict[int, bool] = field(default_factory=dict)  # age in compactions -> present
    final: bool | None = None  # present at the end of the replay
    final_age: int = 0


# "read-only" names a kind of access and "I never said that" tells what happened: no
# force in either (the same reading as the summarizer's, daemon/summarizers/cues.py)
DEONTIC = re.compile(
    r"\b(?:must|always|(?<!-)only(?!-)|do not|don't|dont|make sure|should not|shouldn't"
    r"|never(?!\s+(?:said|told|asked|meant|wanted|did|had|was|were|knew|saw|got|thought)\b))\b"
    r"|必须|必須|不要|禁止|务必|務必|只能|不得",
    re.IGNORECASE,
)
# The rest of the summarizer's reading of force and correction (daemon/summarizers/cues.py,
# written out here so that another checkout is measured the same way): "avoid", "ensure",
# "no longer", "shouldn't", 不能 / 不准 / 一定要 / 确保..., and the cue words of a correction
# ("no, …", "instead", "actually", 不对, 改成). A constraint item with neither these nor
# DEONTIC nor a correction mark is one that should not be there.
FORCE = re.compile(
    r"(?<!\bto\s)\b(?:avoid|ensure)\b|\bno longer\b|\bshould(?:n[’']?t| not)\b"
    r"|不能|不准|不许|不許|请勿|請勿|一定要|(?<!以)确保|(?<!以)確保|务必|務必|不要|禁止|必须|必須|只能",
    re.IGNORECASE,
)
CORRECTION_CUE = re.compile(
    r"\bactually\b|\binstead\b|\bno\s?[,，!]|^\s*nope\b|\bchange\b[^.。!?]{0,60}?\bto\b"
    r"|\bswitch(?:ed)? to\b|\bi meant\b|\brather than\b|\bscratch that\b|\bwrong\b"
    r"|不对|不對|改成|改为|改為|换成|換成|不是[^。]{0,30}而是|应该是|應該是|搞错|搞錯",
    re.IGNORECASE,
)
PREAMBLE = re.compile(r"AGENTS\.md|CLAUDE\.md|<user_instructions>|<INSTRUCTIONS>")
_SPLIT = re.compile(r"\n+|(?<=[.!?])\s+|(?<=[。！？；])")
_BULLET = re.compile(r"^\s*(?:(?:[-*•+>]|\d+[.)])\s+|#+\s*)")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff]")
MAX_RULE_CHARS = 400


def _substantial(s: str) -> bool:
    return len(s.split()) >= 3 or len(_CJK.findall(s)) >= 6


def _preamble_lines(text: str) -> list[str]:
    """The lines of a preamble that can hold a rule: not headings, not code."""
    out: list[str] = []
    fenced = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
            continue
        if fenced or stripped.startswith(("#", "|", "<", "---")):
            continue
        out.append(line)
    return out


def user_rules(msgs: list[dict[str, Any]]) -> list[Item]:
    """Rules said in user messages: deontic sentences, and every line of a preamble;
    one item per distinct rule, at its last statement."""
    found: dict[str, Item] = {}
    for i, m in enumerate(msgs):
        if m["role"] != "user" or (m.get("metadata") or {}).get("compactSummary"):
            continue
        text = text_of(m)
        if text.lstrip().startswith("<environment_context>"):
            continue
        preamble = bool(PREAMBLE.search(text)) and len(text) > 400
        pieces = _preamble_lines(text) if preamble else _SPLIT.split(text)
        for raw in pieces:
            s = _BULLET.sub("", raw).strip().rstrip(".。;；:：")
            if not s or len(s) > MAX_RULE_CHARS or s.startswith("```") or not _substantial(s):
                continue
            kind = "rule/preamble" if preamble else "rule/sentence"
            if not preamble and not DEONTIC.search(s):
                continue
            found[norm(s)] = Item(kind, norm(s), i)
    return sorted(found.values(), key=lambda it: it.msg_index)


_EDIT_TOOLS = {"Edit", "Write", "MultiEdit", "NotebookEdit", "write_file", "edit_file"}
_SHELL_TOOLS = {"Bash", "shell", "shell_command", "exec_command", "local_shell",
                "container.exec"}
_PATCH_HEADER = re.compile(r"^\*\*\* (?:Update File|Add File|Move to): (.+?)\s*$", re.MULTILINE)
_REDIRECT = re.compile(r"(?<![0-9&<>=])>{1,2}\s*([^\s;&|<>'\"()]+)"
                       r"|\btee\s+(?:-a\s+)?([^\s;&|<>'\"()]+)"
                       r"|\b(?:Set-Content|Out-File|Add-Content)\s+(?:-(?:Path|FilePath)\s+)?"
                       r"['\"]?([^\s'\";|]+)")


def _arguments(call: dict[str, Any]) -> tuple[str, Any]:
    fn = call.get("function") or {}
    raw = fn.get("arguments") or ""
    try:
        return raw, json.loads(raw)
    except (TypeError, ValueError):
        return raw, None


def _command(args: Any, raw: str) -> str:
    if isinstance(args, dict):
        c = args.get("command", args.get("cmd", ""))
        return " ".join(map(str, c)) if isinstance(c, list) else str(c)
    return raw


def _looks_like_path(p: str) -> bool:
    p = p.strip("'\"")
    return (("/" in p or "\\" in p or "." in p) and bool(re.search(r"\w", p))
            and not p.startswith(("$", "&", "-"))
            and p.lower() not in ("/dev/null", "nul", "$null") and len(p) < 300)


def edited_files(msgs: list[dict[str, Any]], cwd: str) -> list[Item]:
    """Files the agent's own tool calls wrote; one item per path, at its last write."""
    found: dict[str, Item] = {}

    def add(path: str, i: int) -> None:
        path = path.strip().strip("'\"")
        if not _looks_like_path(path):
            return
        alts: list[str] = []
        for base in (cwd, cwd.replace("\\", "/")):
            if base and path.startswith(base):
                alts.append(path[len(base):].lstrip("/\\"))
        found[path] = Item("file", path, i, tuple(a for a in alts if a))

    for i, m in enumerate(msgs):
        for call in m.get("tool_calls") or ():
            name = (call.get("function") or {}).get("name", "")
            raw, args = _arguments(call)
            if name in _EDIT_TOOLS and isinstance(args, dict):
                p = args.get("file_path") or args.get("notebook_path") or args.get("path")
                if isinstance(p, str):
                    add(p, i)
            body = args.get("input", raw) if isinstance(args, dict) else raw
            command = _command(args, raw)
            for text in {str(body), command}:
                if "*** Begin Patch" in text:
                    for p in _PATCH_HEADER.findall(text):
                        add(p, i)
            if name in _SHELL_TOOLS and "*** Begin Patch" not in command:
                for groups in _REDIRECT.findall(command):
                    p = next((g for g in groups if g), "")
                    if p:
                        add(p, i)
    return sorted(found.values(), key=lambda it: it.msg_index)


# Ids a tool produced (the issue's "commits, PRs, branches, job and run ids returned by
# tools"): the commit `git commit` made, the head a push sent, a branch it created, a PR
# URL, a CI run or job. A `git log` / `git show` listing of commits that were already
# there is evidence, not something the call produced: not counted.
_COMMIT_LINE = re.compile(r"^\[[^\]\s]+(?: \([^)]*\))? ([0-9a-f]{7,40})\]", re.MULTILINE)
_PUSH = re.compile(r"\b([0-9a-f]{7,40})\.\.\.?([0-9a-f]{7,40})\s+\S+\s+->\s")
_NEW_BRANCH = re.compile(r"Switched to a new branch '([^']+)'|\[new branch\]\s+(\S+)")
_PR_URL = re.compile(r"https://github\.com/[\w.-]+/[\w.-]+/pull/(\d+)")
_RUN_URL = re.compile(r"https://github\.com/[\w.-]+/[\w.-]+/actions/runs/(\d+)(?:/job/(\d+))?")
_RUN_ID = re.compile(r"\b(?:run|job)(?: ID| id|_id)?[:#]?\s+(\d{7,})\b", re.IGNORECASE)


def tool_ids(msgs: list[dict[str, Any]]) -> list[Item]:
    """Ids tool results produced: commits made or pushed, branches created, PR and CI
    run/job ids (not commits a log merely lists)."""
    commands: dict[str, str] = {}
    found: dict[str, Item] = {}
    for i, m in enumerate(msgs):
        for call in m.get("tool_calls") or ():
            raw, args = _arguments(call)
            commands[call.get("id", "")] = _command(args, raw)
        if m["role"] != "tool":
            continue
        text = text_of(m)
        command = commands.get(m.get("tool_call_id", ""), "")
        if "git" in command:
            hashes = _COMMIT_LINE.findall(text) + [b for _, b in _PUSH.findall(text)]
            for h in hashes:
                alts = (h[:7],) if len(h) > 7 else ()
                found.setdefault(h, Item("id/commit", h, i, alts))
            for a, b in _NEW_BRANCH.findall(text):
                found.setdefault(f"branch:{a or b}", Item("id/branch", a or b, i))
        for url in re.finditer(_PR_URL, text):
            n = url.group(1)
            found.setdefault(url.group(0), Item("id/pr", url.group(0), i, (f"pull/{n}",)))
        for url in re.finditer(_RUN_URL, text):
            key = url.group(2) or url.group(1)
            found.setdefault(key, Item("id/ci", key, i, (url.group(0),)))
        if "gh run" in command or "ci" in command.split()[:2]:
            for n in _RUN_ID.findall(text):
                found.setdefault(n, Item("id/ci", n, i))
    return sorted(found.values(), key=lambda it: it.msg_index)


# ------------------------------------------------------------------ summary lines

POINTER = re.compile(r" ?\[(?:msg [^\]]*|#[^\]]*)\]| #\d+(?:[-,]\d+)*$")
MARKS = re.compile(r"^(?:\[(?:superseded|unconfirmed|推测)\]\s*)+")
BOILERPLATE = re.compile(
    r"<environment_context>|</?command-(?:name|message|args)>|<local-command-stdout>"
    r"|<task-notification>|<system-reminder>|# Context from my IDE setup"
    r"|This session is being continued from a previous conversation|<user_instructions>"
    r"|\[Image #\d+\]|\blen=\d+|\[image [^\]]*sha256:|<permissions instructions>"
    r"|\[Request interrupted by user",
    re.IGNORECASE,
)
SUPERSEDED = re.compile(r"\[superseded\]|\(was |\(原为|\s→\s")
CORRECTION = SUPERSEDED
# sections where " → " is a call and its result, not an old and a new value
_ARROW_IS_RESULT = ("tool", "artifact", "file")


def marks_superseded(line: SummaryLine, source: str = "") -> bool:
    """`source`: the transcript's text, normalised; an arrow or "(was" the transcript
    itself wrote on that line is not the summarizer's mark."""
    if "[superseded]" in line.raw:
        return True
    if line.section.lower().startswith(_ARROW_IS_RESULT) and " → " in line.raw:
        return bool(re.search(r"\(was |\(原为", line.raw))
    if not SUPERSEDED.search(line.raw):
        return False
    # guesses joined on one line ("A #37; B #41") are each a statement of their own: an
    # arrow one of them quotes from the transcript ("Intake → Plan → Deliver") is no
    # mark, whatever the other one says; an excerpt cut short ("…") is checked as far as
    # it goes
    return any(
        SUPERSEDED.search(piece) and norm(piece.rstrip().rstrip("…")) not in source
        for piece in _JOINED.split(line.text)
    )


# where two joined guesses meet on a summary line: the first one's pointer and a ";"
_JOINED = re.compile(r"\s#\d+(?:-\d+)?;\s*")
PASTED = re.compile(
    r"Traceback|^\s*at \S+ \(|File \"[^\"]+\", line \d+|\[Image #?\d+\]|\blen=\d+"
    r"|\[image [^\]]*sha256|```|\bERROR\b|Exit code:? \d|^\s*\d+\s*[|→]|\$ \S|<\w+>.*</\w+>"
    r"|^\s*[+-]{3} |\bat line \d+|:\d+:\d+\b|<[a-z][\w-]*>",
    re.MULTILINE,
)


@dataclass
class SummaryLine:
    section: str  # the section title as rendered
    raw: str  # the line as the model reads it
    text: str  # without marks and pointer


def summary_lines(summary_message: str) -> list[SummaryLine]:
    out: list[SummaryLine] = []
    section = ""
    body = summary_message.split("Summary of earlier messages", 1)[-1]
    for line in body.splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        elif line.startswith("- ") and section:
            text = MARKS.sub("", POINTER.sub("", line[2:]).strip())
            out.append(SummaryLine(section, line, text))
    return out


def in_section(ln: SummaryLine, key: str) -> bool:
    """The line is in the summary section `key` (goals, constraints...): by the title
    the measured ctxd gives that section, or by the title's first word."""
    try:
        from ctxd.daemon.summary import SECTIONS

        title = SECTIONS.get(key)
    except ImportError:  # a ctxd that names them elsewhere
        title = None
    if title is not None and ln.section == title:
        return True
    return ln.section.lower().startswith(key)


def superseded_parts(line: SummaryLine, same_section: list[SummaryLine]) -> tuple[str, str]:
    """(old, new) of a line that marks a replaced value, as far as the text tells."""
    t = line.text
    if " → " in t:
        old, new = t.split(" → ", 1)
        return old, new
    was = re.search(r"\((?:was|原为) ?([^)]*)\)", t)
    if was and "[superseded]" not in line.raw:
        return was.group(1), t[: was.start()].strip()
    # "[superseded] X": the replacing item is the next current line of the section
    later = same_section[same_section.index(line) + 1:] if line in same_section else []
    new = next((x.text for x in later if "[superseded]" not in x.raw), "")
    return t, new


_COUNTER = re.compile(
    r"(?:step|turn|page|chunk|task|item|line|worker|module|part|phase|round|iteration|"
    r"number|no\.|#|第|m)\s*$", re.IGNORECASE)


def _numbered_series(a: str, b: str) -> bool:
    """The texts differ only in numbers, and each differing number counts something
    (step 74 / step 75) or moves by one: a series of requests, not a changed value."""
    if a == b or re.sub(r"\d+", "#", a) != re.sub(r"\d+", "#", b):
        return False
    pa, pb = list(re.finditer(r"\d+", a)), list(re.finditer(r"\d+", b))
    for x, y in zip(pa, pb, strict=True):
        if x.group() == y.group():
            continue
        counted = bool(_COUNTER.search(a[: x.start()]))
        if not counted and abs(int(x.group()) - int(y.group())) != 1:
            return False
    return True


def not_a_correction(old: str, new: str) -> str | None:
    """Why a superseded pair is not a real correction, or None when it may be one."""
    a, b = norm(POINTER.sub("", old)), norm(POINTER.sub("", new))
    if not b:
        return None  # no replacing text shown: left to the person judging the sample
    if a == b:
        return "identical"
    if _numbered_series(a, b):
        return "numbered series"
    if PASTED.search(old) or PASTED.search(new):
        return "pasted output"
    return None


def supersession_pairs(summary: Any, old_text: Callable[[int], str]) -> list[tuple[str, str, str]]:
    """(item text, old statement, new statement) of the summary's items that show a
    replaced value, from its structure; `old_text(id)` reads an archived message.
    Empty when the summary has no such structure."""
    out: list[tuple[str, str, str]] = []
    try:
        items = [item for _, item in summary.items()]
        supersessions = dict(getattr(summary, "supersessions", {}) or {})
        for item in items:
            was, value = getattr(item, "was", None), getattr(item, "value", None)
            if was and getattr(item, "status", "current") == "current":
                before = item.text.replace(value, was, 1) if value and value in item.text else was
                out.append((item.text, before, item.text))
            elif getattr(item, "status", "") == "superseded":
                new_ids = [supersessions[s] for s in item.sources if s in supersessions]
                new = next((other.text for other in items for n in new_ids
                            if n in other.sources and other is not item), "")
                if not new and new_ids:
                    new = old_text(new_ids[-1])
                out.append((item.text, item.text, new))
    except (AttributeError, TypeError, KeyError):
        return []
    return out
