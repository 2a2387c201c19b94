"""What a tool call produced: files it created, edited, moved or deleted, and the ids its
result names (commits, branches, PRs, CI jobs and runs, created resources).

Pure functions over one call and its result, so nothing can be credited to a sibling
call. Paths and ids are kept exactly as written (never cut inside); a read (`cat`, a
Read tool, an editor's `view`) is not an edit.

Call shapes understood:

- a tool with a path argument whose name says what it does (`write_file`, `Edit`,
  `MultiEdit`, `NotebookEdit`, `delete_file`, `move_file`, an editor tool's `command`);
- a patch: `*** Add File:` / `*** Update File:` / `*** Delete File:` / `*** Move to:`
  headers (an `apply_patch` tool's raw input or argument, `apply_patch <<'EOF'` in a
  shell script, `["apply_patch", patch]` as argv) and unified diff headers;
- a shell command, as a string or an argv list (`["bash", "-lc", script]`): output
  redirections (`> f`, `>> f`, `&> f`), `tee`, `mv`, `git mv`, `cp`, `rm`, `git rm`,
  `touch`, `sed -i`, PowerShell's `Set-Content` / `Out-File` / `Add-Content`,
  `git checkout -b` / `git switch -c` / `git branch`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from ctxd.daemon.summarizers.tool_ids import (  # noqa: F401 (made_commits: re-exported)
    made_commits,
    result_failed,
    result_ids,
    unwrap,
)
from ctxd.daemon.summarizers.tool_ids import ok_target as _ok_target

# artifacts one call may produce; a patch touching more names the rest in its result
MAX_PER_CALL = 32

# ------------------------------------------------------------------ file operations

_OPS = (
    ("deleted", re.compile(r"delete|remove|unlink|(?:^|_)rm(?:_|$)")),
    ("moved", re.compile(r"move|rename|(?:^|_)mv(?:_|$)")),
    ("created", re.compile(r"create|new_file|touch")),
    ("wrote", re.compile(r"write|save")),
    ("edited", re.compile(r"edit|patch|replace|apply|update|modify|append|insert")),
)
# tools whose name says "edit" but whose `command` argument says what the call does
_EDITOR_COMMANDS = {
    "create": "created", "str_replace": "edited", "insert": "edited", "undo_edit": "edited",
    "write": "wrote", "append": "edited", "delete": "deleted",
}
_SRC_KEYS = ("source", "src", "from", "old_path", "source_path", "path", "file_path", "file")
_DST_KEYS = ("destination", "dst", "to", "new_path", "destination_path", "target")
_PATH_ARG_KEYS = (
    "path", "file_path", "filepath", "file", "filename", "target_file", "notebook_path",
)
_SHELL_KEYS = ("command", "cmd", "script")
_SHELLS = frozenset({"bash", "sh", "zsh", "dash", "ksh", "fish"})
_SPACE = re.compile(r"\s")

# apply_patch headers and unified diff headers
_PATCH_HEADER = re.compile(
    r"^\*\*\* (Add|Update|Delete) File: (.+?)[ \t]*$|^\*\*\* Move to: (.+?)[ \t]*$"
    r"|^--- (?:a/)?(\S+)[^\n]*\n\+\+\+ (?:b/)?(\S+)",
    re.MULTILINE,
)
_DEV_NULL = "/dev/null"


def patch_files(patch: str) -> list[tuple[str, str]]:
    """(target, text) for each file a patch adds, updates, deletes or moves, in order."""
    out: list[tuple[str, str]] = []
    updating: str | None = None
    for m in _PATCH_HEADER.finditer(patch[:200_000]):
        if m.group(1):
            kind, path = m.group(1), m.group(2)
            updating = path if kind == "Update" else None
            what = {"Add": "created", "Delete": "deleted"}.get(kind, "edited")
            out.append((path, f"{what} {path}"))
        elif m.group(3):
            dst = m.group(3)
            if updating is not None:
                # "*** Update File: a" then "*** Move to: b": a moved, maybe edited
                out = [o for o in out if o != (updating, f"edited {updating}")]
                out.append((dst, f"moved {updating} → {dst}"))
            updating = None
        else:
            old, new = m.group(4), m.group(5)
            if new == _DEV_NULL:
                out.append((old, f"deleted {old}"))
            elif old == _DEV_NULL:
                out.append((new, f"created {new}"))
            else:
                out.append((new, f"edited {new}"))
    return [(t, text) for t, text in out if _ok_target(t)]


# ------------------------------------------------------------------------ shell

_HEREDOC = re.compile(r"(?<!<)<<-?(?!<)[ \t]*(?:'([^'\n]+)'|\"([^\"\n]+)\"|\\?([A-Za-z_][\w.-]*))")
_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "(", ")", ";;", "|&", "\n"})
_SKIP_TARGETS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty", "-"})
_PREFIXES = frozenset({"sudo", "command", "time", "nohup", "exec", "builtin", "doas"})
_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")
_PLACEHOLDER = "\0heredoc"


def _heredocs(script: str) -> tuple[str, list[str]]:
    """The script with each here-document body taken out (its marker replaced by a
    placeholder word naming the body), and the bodies. A marker whose delimiter never
    comes (`<<` inside a quoted program) is left as it is."""
    lines = script.split("\n")
    out: list[str] = []
    bodies: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        markers = list(_HEREDOC.finditer(line))
        if not markers or line.lstrip().startswith("#"):
            out.append(line)
            continue
        found: list[str] = []
        at = i
        for m in markers:
            delimiter = m.group(1) or m.group(2) or m.group(3)
            strip_tabs = m.group(0).startswith("<<-")
            body: list[str] = []
            while at < len(lines):
                text = lines[at].lstrip("\t") if strip_tabs else lines[at]
                at += 1
                if text.strip() == delimiter:
                    found.append("\n".join(body))
                    break
                body.append(lines[at - 1])
            else:
                break
        if len(found) != len(markers):
            out.append(line)
            continue
        base = len(bodies)
        for idx, m in reversed(list(enumerate(markers))):
            line = line[: m.start()] + f" {_PLACEHOLDER}{base + idx} " + line[m.end() :]
        out.append(line)
        bodies += found
        i = at
    return "\n".join(out), bodies


def _words(line: str) -> list[str] | None:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        return list(lexer)
    except ValueError:  # an unbalanced quote: not a command line we can read
        return None


def _simple_commands(words: list[str]) -> Iterator[list[str]]:
    current: list[str] = []
    for w in words:
        if w in _SEPARATORS:
            if current:
                yield current
            current = []
        else:
            current.append(w)
    if current:
        yield current


def _is_redirect(word: str) -> bool:
    return bool(word) and set(word) <= set("<>&|") and ">" in word


def _argv_script(argv: list[Any]) -> str | None:
    """The script an argv list runs: `["bash", "-lc", script]` gives the script,
    anything else the words joined as a shell would read them."""
    if not argv or not all(isinstance(a, str) for a in argv):
        return None
    words: list[str] = list(argv)
    if words[0].rsplit("/", 1)[-1] in _SHELLS and len(words) >= 3 and words[-2].startswith("-") \
            and "c" in words[-2]:
        return words[-1]
    if words[0] in ("apply_patch", "applypatch") and len(words) == 2:
        return None  # the patch itself, read by the caller
    return shlex.join(words)


def _options_and_args(args: list[str]) -> tuple[list[str], list[str]]:
    opts, rest = [], []
    after_dashes = False
    for a in args:
        if a == "--" and not after_dashes:
            after_dashes = True
        elif a.startswith("-") and len(a) > 1 and not after_dashes:
            opts.append(a)
        else:
            rest.append(a)
    return opts, rest


def _command_ops(words: list[str], bodies: list[str]) -> list[tuple[str, str]]:
    """What one simple command does to files and branches."""
    out: list[tuple[str, str]] = []
    plain: list[str] = []
    heredoc: str | None = None
    i = 0
    while i < len(words):
        w = words[i]
        if w.startswith(_PLACEHOLDER):
            n = w[len(_PLACEHOLDER) :]
            heredoc = bodies[int(n)] if n.isdigit() and int(n) < len(bodies) else None
        elif _is_redirect(w):
            target = words[i + 1] if i + 1 < len(words) else ""
            i += 1
            # "2>&1", "> /dev/null": no file; a file descriptor number before ">" is
            # no argument of the command
            if plain and plain[-1].isdigit() and len(plain[-1]) == 1:
                plain.pop()
            if w.endswith("&") or target in _SKIP_TARGETS or target.startswith(_PLACEHOLDER):
                pass
            elif w.startswith("<") and w != "<>":
                pass
            elif _ok_target(target):
                verb = "edited" if w.endswith(">>") else "wrote"
                out.append((target, f"{verb} {target}"))
        elif w.startswith("<"):
            i += 1  # an input redirection and its source
        else:
            plain.append(w)
        i += 1
    while plain and (plain[0] in _PREFIXES or _ASSIGNMENT.match(plain[0])):
        plain = plain[1:]
    if plain[:1] == ["env"]:
        plain = [w for w in plain[1:] if not _ASSIGNMENT.match(w)]
    if not plain:
        return out
    prog, args = plain[0].rsplit("/", 1)[-1], plain[1:]
    if prog == "git" and args:
        sub, args = args[0], args[1:]
        opts, rest = _options_and_args(args)
        if sub == "mv" and len(rest) >= 2:
            out += _moves(rest)
        elif sub == "rm" and "--cached" not in opts:
            out += [(a, f"deleted {a}") for a in rest if _ok_target(a)]
        elif sub in ("checkout", "switch") and any(o in ("-b", "-B", "-c", "-C") for o in opts):
            if rest:
                out.append((f"branch:{rest[0]}", f"branch {rest[0]}"))
        elif sub == "branch" and not opts and len(rest) in (1, 2):
            out.append((f"branch:{rest[0]}", f"branch {rest[0]}"))
        elif sub == "apply" and heredoc:
            out += patch_files(heredoc)
        return out
    opts, rest = _options_and_args(args)
    if prog in ("apply_patch", "applypatch"):
        patch = heredoc if heredoc is not None else (rest[0] if rest else "")
        out += patch_files(patch)
    elif prog == "patch" and heredoc:
        out += patch_files(heredoc)
    elif prog == "mv" and len(rest) >= 2:
        out += _moves(rest)
    elif prog == "cp" and len(rest) >= 2:
        out += _moves(rest, "copied")
    elif prog in ("rm", "unlink", "rmdir", "shred"):
        out += [(a, f"deleted {a}") for a in rest if _ok_target(a)]
    elif prog == "touch":  # a directory made for files is named by the files
        out += [(a, f"created {a}") for a in rest if _ok_target(a)]
    elif prog == "tee":
        verb = "edited" if any(o in ("-a", "--append") for o in opts) else "wrote"
        out += [(a, f"{verb} {a}") for a in rest if _ok_target(a) and a not in _SKIP_TARGETS]
    elif prog in ("sed", "gsed", "perl"):
        out += [(a, f"edited {a}") for a in _in_place_files(prog, args)]
    elif prog.lower() in _POWERSHELL_WRITES:
        path = _powershell_path(args)
        if path:
            verb = "edited" if prog.lower() == "add-content" else "wrote"
            out.append((path, f"{verb} {path}"))
    return out


# PowerShell's file writers (Windows agents): `Set-Content -Path f`, `Out-File f`
_POWERSHELL_WRITES = frozenset({"set-content", "out-file", "add-content"})


def _powershell_path(args: list[str]) -> str | None:
    for i, a in enumerate(args):
        if a.lower() in ("-path", "-filepath", "-literalpath") and i + 1 < len(args):
            return args[i + 1] if _ok_target(args[i + 1]) else None
    positional = [a for a in args if not a.startswith("-")]
    return positional[0] if positional and _ok_target(positional[0]) else None


def _moves(rest: list[str], verb: str = "moved") -> list[tuple[str, str]]:
    dst = rest[-1]
    if not _ok_target(dst):
        return []
    srcs = [s for s in rest[:-1] if _ok_target(s)]
    if len(srcs) == 1:
        return [(dst, f"{verb} {srcs[0]} → {dst}")]
    # several sources into a directory: each keeps its own line
    return [(f"{s} → {dst}", f"{verb} {s} → {dst}") for s in srcs]


def _in_place_files(prog: str, args: list[str]) -> list[str]:
    """The files `sed -i` or `perl -pi` edits in place (none without `-i`)."""
    in_place = False
    script_given = False
    files: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-e", "-f", "--expression", "--file") or (
            prog == "perl" and a.startswith("-") and not a.startswith("--") and a.endswith("e")
        ):
            script_given = True
            if prog == "perl" and "i" in a[1:]:
                in_place = True
            i += 2
            continue
        if a.startswith("-i") or a.startswith("--in-place") or (
            prog == "perl" and a.startswith("-") and not a.startswith("--") and "i" in a
        ):
            in_place = True
            # BSD sed: "-i ''" gives an empty backup suffix as a word of its own
            if a == "-i" and prog != "perl" and i + 1 < len(args) and args[i + 1] == "":
                i += 1
        elif not a.startswith("-") or a == "-":
            files.append(a)
        i += 1
    if not in_place:
        return []
    if not script_given:
        files = files[1:]
    return [f for f in files if f and _ok_target(f)]


# words without which a script changes no file and names no branch: most commands
# (tests, builds, listings) are ruled out before any parsing
_MAY_CHANGE = re.compile(
    r">|\b(?:mv|rm|tee|cp|touch|sed|gsed|perl|apply_?patch|git|patch|unlink|rmdir"
    r"|shred|Set-Content|Out-File|Add-Content)\b",
    re.IGNORECASE,
)


def shell_ops(script: str) -> list[tuple[str, str]]:
    """(target, text) for what a shell script does to files and branches, in order."""
    if not _MAY_CHANGE.search(script):
        return []
    if len(script) <= 2000:
        return list(_shell_ops_cached(script))
    return _shell_ops(script)


@lru_cache(maxsize=2048)
def _shell_ops_cached(script: str) -> tuple[tuple[str, str], ...]:
    # agents run the same short commands again and again
    return tuple(_shell_ops(script))


def _shell_ops(script: str) -> list[tuple[str, str]]:
    if len(script) > 400_000:
        script = script[:400_000]
    text, bodies = _heredocs(script.replace("\\\n", " "))
    out: list[tuple[str, str]] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip():
            continue
        words = _words(line)
        # a quoted string over several lines (`python -c "..."`): read on to its end;
        # only a line with a quote can end it, and a few tries bound the cost
        tries = 0
        while words is None and i < len(lines) and len(line) < 100_000 and tries < 40:
            line += "\n" + lines[i]
            i += 1
            if "'" in lines[i - 1] or '"' in lines[i - 1]:
                tries += 1
                words = _words(line)
        if words is None:
            continue
        for command in _simple_commands(words):
            out += _command_ops(command, bodies)
    return out


# a tool whose name says it makes something: "create_dashboard", "deploy", "newIssue"
_CREATES = re.compile(
    r"(?:^|[_\-.\s])(?:create|new|post|deploy|publish|release|upload|trigger|dispatch"
    r"|submit|provision|import|launch|register)"
)
_CREATES_SHELL = re.compile(
    r"\b(?:create|deploy|publish|release|upload|trigger|dispatch|submit|provision|launch)\b"
    r"|\bcurl\b[^\n]*(?:-X\s*['\"]?(?:POST|PUT|PATCH)|--data|\s-d\s|--json|\s-F\s)"
    r"|\bhttps?\s+(?:POST|PUT|PATCH)\b"
    r"|\bgh\s+(?:(?:pr|issue|release|repo|gist)\s+create|workflow\s+run|run\s+rerun)\b",
    re.IGNORECASE,
)

# ------------------------------------------------------------------------ calls


def _arg(args: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    lowered = {str(k).lower(): v for k, v in args.items()}
    for k in keys:
        v = lowered.get(k)
        if isinstance(v, str) and v.strip() and _ok_target(v.strip()) \
                and not _SPACE.search(v.strip()):
            return v.strip()
    return None


def _shell_script(args: dict[str, Any]) -> str | None:
    lowered = {str(k).lower(): v for k, v in args.items()}
    for key in _SHELL_KEYS:
        v = lowered.get(key)
        if isinstance(v, str) and v.strip():
            return v
        if isinstance(v, list):
            if len(v) == 2 and v[0] in ("apply_patch", "applypatch") and isinstance(v[1], str):
                return None
            return _argv_script(v)
    return None


def _argv_patch(args: dict[str, Any]) -> str | None:
    for key in _SHELL_KEYS:
        v = args.get(key)
        if isinstance(v, list) and len(v) == 2 and v[0] in ("apply_patch", "applypatch") \
                and isinstance(v[1], str):
            return v[1]
    return None


def _file_ops(name: str, args: Any, result: str, script: str | None) -> list[tuple[str, str]]:
    low = name.lower()
    if isinstance(args, str):
        # a custom tool's raw input: apply_patch's patch, or a shell's script
        if "*** Begin Patch" in args or "patch" in low:
            return patch_files(args)
        if any(s in low for s in ("shell", "bash", "exec", "terminal", "command")):
            return shell_ops(args)
        return []
    if not isinstance(args, dict):
        return []
    command = args.get("command") if isinstance(args.get("command"), str) else None
    op: str | None
    if command is not None and "edit" in low and " " not in command.strip():
        # an editor tool (str_replace_based_edit_tool): its command says what it does,
        # and "view" is a read
        op = _EDITOR_COMMANDS.get(command.strip())
        if op is None:
            return []
    else:
        op = next((op for op, pattern in _OPS if pattern.search(low)), None)
    if op == "wrote":
        # "The file ... has been updated": it was there before; otherwise a write makes it
        head = result[:300].lower()
        op = "wrote" if "updated" in head or "overwr" in head else "created"
    out: list[tuple[str, str]] = []
    if op == "moved":
        src, dst = _arg(args, _SRC_KEYS), _arg(args, _DST_KEYS)
        if dst:
            out.append((dst, f"moved {src} → {dst}" if src else f"moved to {dst}"))
        return out
    if op is not None:
        path = _arg(args, _PATH_ARG_KEYS)
        if path:
            return [(path, f"{op} {path}")]
    patch = _argv_patch(args)
    if patch is None and (op is not None or "patch" in low):
        patch = next(
            (v for v in args.values() if isinstance(v, str) and ("\n" in v)), None
        )
    if patch is not None:
        out += patch_files(patch)
        if out:
            return out
    if script is not None and op is None:
        out += shell_ops(script)
    return out


def _creates(name: str, script: str | None) -> bool:
    if script is not None:
        return bool(_CREATES_SHELL.search(script[:4000]))
    # a tool's own name: "create_dashboard", "mcp__github__create_pull_request"
    return bool(_CREATES.search(name.rsplit("__", 1)[-1].lower()))


def artifacts_of(name: str, args: Any, result: str) -> list[tuple[str, str]]:
    """(target, text) for what a successful call produced: files it wrote, moved or
    deleted; commits, branches, PRs, CI runs and jobs, and created resources its result
    names. For a call whose result reports a non-zero exit, only the commits it made."""
    if result_failed(result):
        return made_commits(result)
    result = unwrap(result)
    script = _shell_script(args) if isinstance(args, dict) else None
    out = _file_ops(name, args, result, script)
    out += result_ids(result, _creates(name, script), script or "")
    return _unique(out)


def _unique(found: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """One entry per target, the last word on it kept, at the place it was last named."""
    seen: dict[str, str] = {}
    for target, text in found:
        seen.pop(target, None)
        seen[target] = text
    return list(seen.items())[-MAX_PER_CALL:]
