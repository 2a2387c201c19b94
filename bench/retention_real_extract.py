"""What `bench/retention_real.py` looks for in a real transcript and in its summaries.

- Loading: a transcript goes through ctxd's own importer (`ctxd import claude-code|codex`)
  into a scratch engine, exactly as the daemon would take it (including the importer's
  repairs of messages the daemon refuses); the main session's archived messages come out.
- Items to find again in the model input later: user rules (sentences with deontic
  force, EN and ZH, and the lines of an AGENTS.md / CLAUDE.md preamble sent as a user
  message), files the agent's tools wrote (Edit/Write/MultiEdit, Codex `apply_patch`
  headers, shell redirections), ids the tools produced (commits made or pushed, branches
  created, PR URLs, CI run and job ids; not the commits a `git log` lists).

The summary lines the model reads, and the tests applied to them (rule cue,
boilerplate, superseded marks), are in `bench/retention_real_lines.py`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import unicodedata
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
    # A finished file, whenever it was checked out: the importer leaves a trailing call
    # without its result for a later import while the file is younger than an hour, so
    # a fresh checkout would count one message fewer. A copy dated long ago is read whole.
    scratch.mkdir(parents=True, exist_ok=True)
    at_rest = scratch / path.name
    shutil.copyfile(path, at_rest)
    os.utime(at_rest, (0, 0))
    try:
        mapper = FORMATS[agent][0](at_rest, Options())
        report = Report()
        FileImporter(EngineClient(engine), mapper, at_rest, report, Options()).run()
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
    # "i don't really have any" tells about the speaker; "agents do not." ends a statement
    r"\b(?:must|always|(?<!-)only(?!-)|make sure|should not|shouldn't"
    r"|(?<!\bi\s)(?:do not|don't|dont)(?![\s.,!;]*$)"
    r"|(?<=\bi\s)(?:do not|don't|dont)(?!\s+(?:really\s+)?(?:have|know|think|remember|see|get"
    r"|understand|recall|mind|care|feel|believe)\b)(?![\s.,!;]*$)"
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
    r"|不对|不對|改成|改为|改為|换成|換成|不是[^。]{0,30}而是|应该是|應該是|搞错|搞錯"
    # a reply rejecting a choice ("不，我希望用旧的"), a counter-proposal ("叫锁定不是更好吗")
    r"|^\s*不\s*[，,!！]\s*\S|不是更\S{1,4}吗|wouldn[’']?t\s+(?:it\s+)?(?:\w+\s+){0,4}be\s+better",
    re.IGNORECASE,
)
# Cue words a rule states its force with besides DEONTIC, counted only in a sentence that
# asks nothing (not a question): "Prefer `type` over `interface`", "**Push to remote** -
# This is mandatory", "Tailwind CSS for all styling — no custom CSS files", 不需要加注释,
# 别用新的, 格式应该用旧的 ("应该是…" guesses, it sets nothing). "no X" counts at the
# start of a sentence or clause only: "there is no test for it" tells, "no `any` types"
# rules; "no, …" is a correction's cue, "no idea" / "no problem" are neither.
MORE_FORCE = re.compile(
    r"\bmandatory\b|\bprefer\b"
    r"|不需要|(?<![特区分识级类告性个派差鉴辨])别(?![的人名处忘])|应该(?!是)",
    re.IGNORECASE,
)
# in a document pasted as a message (a spec: "no fee", "yes pool, no pool") "no X"
# describes what to build; in a preamble line or a short message it is a rule
NO_X = re.compile(
    r"(?:^|[—–:;,]\s*|\s-\s)no\s+(?!(?:one|idea|problem|worries|thanks|need|matter|doubt"
    r"|way|longer|more)\b)[`*\w]",
    re.IGNORECASE,
)
DOCUMENT_LINES = 12


def has_force(sentence: str, document: bool = False) -> bool:
    """A sentence states a rule: a DEONTIC cue, or one of MORE_FORCE (or, outside a
    document, NO_X) outside a question."""
    if DEONTIC.search(sentence):
        return True
    if sentence.rstrip().endswith(("?", "？")):
        return False
    return bool(MORE_FORCE.search(sentence)) or (not document and bool(NO_X.search(sentence)))


PREAMBLE = re.compile(r"AGENTS\.md|CLAUDE\.md|<user_instructions>|<INSTRUCTIONS>")
_SPLIT = re.compile(r"\n+|(?<=[.!?])\s+|(?<=[。！？；])")
# "1. A 2. B 3. C" on one line: a list, cut before its numbers when they run 1, 2, 3
_INLINE = re.compile(r"(?:^|(?<=[\s:：;；，,]))(\d{1,2})[.)、](?=\s|[^\d\s.])", re.MULTILINE)
# a piece of JSON (a pasted report's data), no sentence of the user's
_JSONISH = re.compile(r'^\s*(?:[\[{]+\s*"|"\s*[,:\]}])|"\s*,\s*"|"\s*:\s*[\["{\d]')


def _sentences(text: str) -> list[str]:
    cuts: list[int] = []
    for line in re.finditer(r"[^\n]+", text):
        run: list[int] = []
        marks = list(_INLINE.finditer(line.group(0)))
        first = 1 if any(m.group(1) == "1" for m in marks) else 2
        for m in marks:
            if int(m.group(1)) == len(run) + first:
                if not run and first == 2 and not re.search(
                        r"(?:\s{2,}|[,;:，；：]\s*)$", line.group(0)[: m.start()]):
                    continue
                run.append(line.start() + m.start())
        if len(run) >= 2:
            cuts += run
    pieces, start = [], 0
    for cut in cuts:
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return [s for piece in pieces for s in _SPLIT.split(piece)]
_BULLET = re.compile(r"^\s*(?:(?:[-*•+>]|\d+[.)])\s+|#+\s*)")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff]")
MAX_RULE_CHARS = 400
_COMMAND_MARKUP = re.compile(r"<(command-(?:name|message))>.*?</\1>", re.DOTALL)
_COMMAND_ARGS = re.compile(r"</?command-args>")


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
        if (m.get("metadata") or {}).get("meta") or SKILL.match(text):
            # a skill's text (Claude Code sends it in the user's name, tagged isMeta):
            # the skill's rules, not the user's
            continue
        # a slash command's name is markup, what the person typed after it their words
        text = _COMMAND_ARGS.sub("\n", _COMMAND_MARKUP.sub("\n", text))
        preamble = bool(PREAMBLE.search(text)) and len(text) > 400
        pieces = _preamble_lines(text) if preamble else _sentences(text)
        document = sum(1 for line in text.splitlines() if line.strip()) >= DOCUMENT_LINES
        for raw in pieces:
            s = _BULLET.sub("", raw).strip().rstrip(".。;；:：")
            if not s or len(s) > MAX_RULE_CHARS or s.startswith("```") or not _substantial(s):
                continue
            if _JSONISH.search(s):
                continue
            kind = "rule/preamble" if preamble else "rule/sentence"
            if not preamble and not has_force(s, document):
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


# a skill's instructions sent as a user message
SKILL = re.compile(r"\s*Base directory for this skill:", re.IGNORECASE)
_HEREDOC = re.compile(r"<<-?\s*(?:'([^'\n]+)'|\"([^\"\n]+)\"|\\?([A-Za-z_][\w.-]*))")


def _without_heredoc_bodies(command: str) -> str:
    """The command with the bodies of its here-documents left out: a script or a
    README a heredoc carries is data, its `>` are not redirections."""
    lines = command.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        for m in _HEREDOC.finditer(line):
            end = m.group(1) or m.group(2) or m.group(3)
            j = i
            while j < len(lines) and lines[j].strip() != end:
                j += 1
            if j < len(lines):
                i = j + 1
    return "\n".join(out)


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

    # a call that never got a result (an interrupt, a crash) may have changed nothing
    answered = {m.get("tool_call_id") for m in msgs if m["role"] == "tool"}
    for i, m in enumerate(msgs):
        for call in m.get("tool_calls") or ():
            if call.get("id") not in answered:
                continue
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
                for groups in _REDIRECT.findall(_without_heredoc_bodies(command)):
                    p = next((g for g in groups if g), "")
                    if p:
                        add(p, i)
    return sorted(found.values(), key=lambda it: it.msg_index)


# Ids a tool produced (the issue's "commits, PRs, branches, job and run ids returned by
# tools"): the commit `git commit` made, the head a push sent, a branch it created, a PR
# URL, a CI run or job. A `git log` / `git show` listing of commits that were already
# there is evidence, not something the call produced: not counted.
_COMMIT_LINE = re.compile(r"^\[[^\]\s]+(?: \([^)]*\))? ([0-9a-f]{7,40})\]", re.MULTILINE)
_PUSH = re.compile(r"\b([0-9a-f]{7,40})\.\.\.?([0-9a-f]{7,40})\s+(\S+)\s+->\s+(\S+)")
_NEW_BRANCH = re.compile(
    r"Switched to a new branch '([^']+)'|\[new branch\]\s+(\S+)(?:\s+->\s+(\S+))?"
)


def _fetched(local: str, remote: str) -> bool:
    """"main -> origin/main", "[new branch] x -> origin/x": what a `git pull` / `git
    fetch` brought in from the remote, not something the call produced."""
    return bool(remote) and remote != local and remote.endswith("/" + local)
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
            hashes = _COMMIT_LINE.findall(text) + [
                b for _, b, local, remote in _PUSH.findall(text) if not _fetched(local, remote)
            ]
            for h in hashes:
                alts = (h[:7],) if len(h) > 7 else ()
                found.setdefault(h, Item("id/commit", h, i, alts))
            for a, b, remote in _NEW_BRANCH.findall(text):
                if b and _fetched(b, remote):
                    continue
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
