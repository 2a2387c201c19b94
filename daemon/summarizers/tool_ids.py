"""The ids a tool call's result names: commits, branches, PRs, CI runs and jobs, the
handles of resources a creating call made, and the commits a `git log` lists.

Pure functions over one result (and the shell command that gave it), so nothing can be
credited to a sibling call; ids are kept exactly as written. A listing of existing
commits is evidence, not something the call produced: it becomes one line.
"""

from __future__ import annotations

import json
import re

# how much of a result is read for ids
_RESULT_HEAD = 8000
# the longest path or id kept: a longer one is no path but some pasted text
_MAX_TARGET = 300


def ok_target(value: str) -> bool:
    return 0 < len(value) <= _MAX_TARGET and not value.startswith("\0")


_COMMIT = re.compile(r"^\[[^\]\s]+(?: \(root-commit\))? ([0-9a-f]{7,40})\]", re.MULTILINE)
_COMMIT_WORD = re.compile(r"\bcommit ([0-9a-f]{7,40})\b")
# `git log`: "commit <sha>" lines (the subject further down, indented), or "<sha>
# subject" with --oneline
_COMMIT_LOG = re.compile(r"^commit ([0-9a-f]{40})\b", re.MULTILINE)
_LOG_SUBJECT = re.compile(r"^    (\S[^\n]*)", re.MULTILINE)
_ONELINE = re.compile(r"^(?:[*|/\\ ]+)?([0-9a-f]{7,12}) +(?P<subject>\S[^\n]*)", re.MULTILINE)
# A listing of existing commits is evidence, not something the call produced: it is
# kept as one line, newest first, as many commits as fit in this many characters
_LOG_LINE_CHARS = 720
_LOG_SUBJECT_MIN = 12
_LOG_TARGET = "git:log"
_PUSHED = re.compile(
    r"^\s*[+ ]?\s*([0-9a-f]{7,40})\.\.\.?([0-9a-f]{7,40})\s+(\S+) -> (\S+)", re.M
)
_BRANCH = re.compile(
    r"Switched to a new branch '([^']+)'|Created branch '?([\w./-]+)"
    r"|new branch\]\s+(\S+)(?: +-> +(\S+))?"
)


def _fetched(local: str, remote: str | None) -> bool:
    """"main -> origin/main", "[new branch] x -> origin/x": a remote-tracking ref a
    `git pull` / `git fetch` brought in, the remote's work, not the call's (a push
    reads "main -> main")."""
    return bool(remote) and remote != local and remote.endswith("/" + local)
_PR = re.compile(
    r"https?://[^\s\"'<>)\]]+/(?:pull|pulls|merge_requests)/(\d+)"
    r"|\b(?:pull request|PR|MR) #?(\d+)\b",
    re.IGNORECASE,
)
# CI runs and jobs named by their URL: GitHub Actions, GitLab
_CI_URL = re.compile(
    r"https?://[^\s\"'<>)\]]+/actions/runs/(\d+)(?:/jobs?/(\d+))?"
    r"|https?://[^\s\"'<>)\]]+/-/(pipelines|jobs)/(\d+)"
)
_JOB = re.compile(
    r"\b(job|run|pipeline|build|workflow run|deployment|task)(?:[ _-]?id)?[ \t]*[:=#]?[ \t]*"
    r"([0-9a-f]{6,}|\d{4,})\b",
    re.IGNORECASE,
)
# a created resource's handle in a JSON-ish answer
_RESOURCE_KEY = re.compile(
    r"\"(uid|uuid|run_id|runId|job_id|jobId|build_id|buildId|pipeline_id|deployment_id"
    r"|deploymentId|html_url|web_url|url|id)\"\s*:\s*\"?([^\"\s,}\]]+)\"?"
)
_URL = re.compile(r"https?://[^\s\"'<>`)\]]+")
# substrings without which a result names no commit, branch, PR, job or resource: most
# results (file contents, test output) skip every pattern
_ID_GATES = ("commit", "]", "branch", "pull", "merge_request", "pr ", "pr #", "mr ", "job",
             "run", "pipeline", "build", "deployment", "task", "->", "http", '"')
# Literal text without which a pattern cannot match, checked before the pattern runs
# (scanning 8000 characters with an alternation that has no literal prefix is most of
# what reading a result costs). The case-insensitive ones are checked on the lowered
# text; re.IGNORECASE also matches "İ" and "ı" to i and "ſ" to s, which str.lower()
# does not, so a text holding one of them skips the gates of words with an i or an s.
_PR_WORDS = ("/pull", "/merge_", "pull reque", "pr ", "mr ")
_JOB_WORDS = ("job", "run", "pipeline", "build", "deployment", "task")
_ODD_FOLDS = ("İ", "ı", "ſ")
_EXIT = re.compile(
    r"\"exit_code\"\s*:\s*(-?\d+)|^Exit code:\s*(-?\d+)|Process exited with code (-?\d+)",
    re.MULTILINE,
)


# literal text each way of writing an exit code holds: most results hold none, and
# checking for them costs far less than scanning every line start for the pattern
_EXIT_WORDS = ('"exit_code"', "Exit code:", "Process exited with code")


def result_failed(result: str) -> bool:
    """A shell result that reports a non-zero exit code (Codex's wrappers)."""
    head = result[:4000]
    if not any(map(head.__contains__, _EXIT_WORDS)):
        return False
    m = _EXIT.search(head)
    if m is None:
        return False
    code = next(g for g in m.groups() if g is not None)
    return code != "0"


def unwrap(result: str) -> str:
    """The output inside a `{"output": ..., "metadata": ...}` wrapper, else the result."""
    head = result.lstrip()[:12]
    if head.startswith('{"output"') or head.startswith('{\n  "output"'):
        try:
            inner = json.loads(result)
        except ValueError:
            return result
        if isinstance(inner, dict) and isinstance(inner.get("output"), str):
            return str(inner["output"])
    return result


def result_ids(result: str, creates: bool, command: str = "") -> list[tuple[str, str]]:
    """(target, text) for the commits, branches, PRs, CI runs and jobs a result names,
    and, for a call that creates something, the handles of what it created. `command`:
    the shell command that gave the result, if any (a `git log` lists commits)."""
    head = result[:_RESULT_HEAD]
    low = head.lower()
    if "git" not in command and not any(map(low.__contains__, _ID_GATES)):
        return []
    out: list[tuple[str, str]] = []
    if "[" in head:
        for m in _COMMIT.finditer(head):
            out.append((m.group(1), f"commit {m.group(1)}"))
    if " -> " in head and ".." in head:
        for m in _PUSHED.finditer(head):
            if _fetched(m.group(3), m.group(4)):
                continue
            out += [(m.group(1), f"commit {m.group(1)}"),
                    (m.group(2), f"commit {m.group(2)}")]
    if "git" in command and ("log" in command or "show" in command):
        logged = _full_log(head)
        if "oneline" in command or "--format" in command or "--pretty" in command:
            logged += [(m.group(1), m.group("subject")) for m in _ONELINE.finditer(head)]
        if len(logged) == 1:
            # `git log -1`, `git show HEAD`: the one commit asked about, named alone
            out.append((logged[0][0], f"commit {logged[0][0]}"))
        elif logged:
            out.append((_LOG_TARGET, log_line(logged)))
    if not out and "commit " in head[:2000]:
        for m in _COMMIT_WORD.finditer(head[:2000]):
            out.append((m.group(1), f"commit {m.group(1)}"))
            break
    if "branch" in head:
        for m in _BRANCH.finditer(head):
            if m.group(3) and _fetched(m.group(3), m.group(4)):
                continue
            branch = next(g for g in m.groups() if g)
            out.append((f"branch:{branch}", f"branch {branch}"))
    urls_named: set[str] = set()
    for m in _PR.finditer(head) if any(map(low.__contains__, _PR_WORDS)) else ():
        url = m.group(0) if m.group(0).lower().startswith("http") else None
        number = m.group(1) or m.group(2)
        if url:
            urls_named.add(url)
        out.append((f"pr:{number}", f"PR {url}" if url else f"PR #{number}"))
    for m in _CI_URL.finditer(head):
        urls_named.add(m.group(0))
        if m.group(1):
            out.append((f"run:{m.group(1)}", f"run {m.group(1)}"))
            if m.group(2):
                out.append((f"job:{m.group(2)}", f"job {m.group(2)}"))
        else:
            kind = "pipeline" if m.group(3) == "pipelines" else "job"
            out.append((f"{kind}:{m.group(4)}", f"{kind} {m.group(4)}"))
    odd = not head.isascii() and any(map(head.__contains__, _ODD_FOLDS))
    jobs = odd or any(map(low[:2000].__contains__, _JOB_WORDS))
    for m in _JOB.finditer(head[:2000]) if jobs else ():
        kind = m.group(1).lower()
        out.append((f"{kind}:{m.group(2)}", f"{kind} {m.group(2)}"))
    if creates:
        out += _created(head, urls_named)
    return out


def _full_log(head: str) -> list[tuple[str, str]]:
    """(sha, subject) of each "commit <sha>" entry of a full `git log` / `git show`."""
    found = list(_COMMIT_LOG.finditer(head))
    out = []
    for i, m in enumerate(found):
        body = head[m.end() : found[i + 1].start() if i + 1 < len(found) else len(head)]
        subject = _LOG_SUBJECT.search(body)
        out.append((m.group(1), subject.group(1) if subject else ""))
    return out


def log_line(commits: list[tuple[str, str]]) -> str:
    """"git log: 2406dea fix(ui): updated dashboard…; ac184b8 covers keep…": the commits
    a listing shows, newest first, short hashes exact and subjects cut so that as many
    as can be fit in one line; those past it are counted."""
    room = _LOG_LINE_CHARS - len("git log: ")
    shown = commits
    while len(shown) > 1 and len(shown) * (7 + 2 + _LOG_SUBJECT_MIN) > room:
        shown = shown[:-1]
    per = max(room // len(shown) - 9, 0)
    parts = []
    for sha, subject in shown:
        subject = " ".join(subject.split())
        if len(subject) > per:
            subject = subject[: max(per - 1, 0)].rstrip() + "…" if per > 1 else ""
        parts.append(f"{sha[:7]} {subject}".rstrip())
    more = len(commits) - len(shown)
    return "git log: " + "; ".join(parts) + (f"; +{more} older" if more else "")


def _created(head: str, urls_named: set[str]) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for m in _RESOURCE_KEY.finditer(head[:4000]):
        key, value = m.group(1), m.group(2)
        if value in ("null", "true", "false") or not ok_target(value):
            continue
        if key == "id" and not (len(value) >= 4 and any(c.isalnum() for c in value)):
            continue  # "id": 1 is a row number, not a handle worth keeping
        if key in ("html_url", "web_url", "url"):
            if value in urls_named:
                continue
            urls_named.add(value)
            found.append((f"url:{value}", f"url {value}"))
        else:
            found.append((f"{key}:{value}", f"{key} {value}"))
        if len(found) >= 4:
            return found
    if not found:
        for m in _URL.finditer(head[:2000]):
            url = m.group(0).rstrip(".,;:!?'\"")
            if url not in urls_named and ok_target(url):
                found.append((f"url:{url}", f"url {url}"))
                break
    return found


def made_commits(result: str) -> list[tuple[str, str]]:
    """The commits a failed call made all the same: "git commit && git push" whose push
    was rejected still made the commit its "[main c83eea1] …" line names."""
    head = unwrap(result)[:_RESULT_HEAD]
    shas = dict.fromkeys(m.group(1) for m in _COMMIT.finditer(head))
    return [(sha, f"commit {sha}") for sha in shas]
