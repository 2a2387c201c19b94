"""Claude Code transcripts (`~/.claude/projects/<project>/<session>.jsonl`) to ctxd sessions.

Each line is one JSON object with a `type`:

- `user` / `assistant`: `message` is an Anthropic Messages API message whose `content` is
  a string or a list of blocks: `text`, `tool_use` (`id`, `name`, `input`),
  `tool_result` (`tool_use_id`, `content`, `is_error`), `thinking`, `redacted_thinking`,
  `image` (base64 `source`). One API message may be split over several lines sharing
  `message.id`; they are merged back. Tool results arrive in `user` lines and become
  `tool` messages linked to their calls by `tool_call_id`.
- `summary` (`summary`, `leafUuid`): a title for the conversation; `system` (with a
  `subtype` such as `compact_boundary`): Claude Code's own markers; both are noted,
  not messages. A `user` line with `isCompactSummary` is the summary Claude Code's own
  compaction wrote; it is kept, marked `compactSummary`.
- Every line carries `sessionId`, `cwd`, `timestamp`, `uuid`, `isSidechain`; subagent
  transcripts (`agent-<id>.jsonl`, also under `<session>/subagents/`) have `agentId`.

Sidechain lines (a subagent's conversation) go to their own session, whose metadata
names the parent session; with `--sidechains mark` they stay in the main session,
marked `sidechain: true`.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ctxd.clients.importers.common import (
    Emit,
    Options,
    Skip,
    cut_text,
    image_reference,
    iso_to_unix,
    safe_id,
)
from ctxd.clients.importers.lines import parse_line
from ctxd.clients.importers.titles import TitleFinder

SOURCE = "claude-code"
DEFAULT_ROOT = Path("~/.claude/projects")
PATTERN = "*.jsonl"
# line types that carry no conversation: Claude Code's own bookkeeping (attachments
# repeat what the hooks and the IDE added; the prompt, mode and title lines are UI state)
_BOOKKEEPING = {"file-history-snapshot", "queue-operation", "progress", "attachment",
                "last-prompt", "permission-mode", "mode", "custom-title"}


def default_paths() -> list[Path]:
    base = os.environ.get("CLAUDE_CONFIG_DIR")
    root = Path(base) / "projects" if base else DEFAULT_ROOT
    return [root.expanduser()]


class ClaudeCodeMapper:
    source = SOURCE

    def __init__(self, path: Path, options: Options) -> None:
        self.path = path
        self.options = options
        stem = path.stem
        if path.parent.name == "subagents":  # <session>/subagents/agent-<id>.jsonl
            stem = f"{path.parent.parent.name}-{stem}"
        self.base_id = safe_id(SOURCE, stem)
        self.is_agent_file = path.stem.startswith("agent-") or _opens_as_subagent(path)
        self.meta: dict[str, Any] = {}
        self.title: str | None = None
        # the first request of each session of the file (its main one and its sidechain)
        self.titles = TitleFinder()
        # content blocks of types this version does not know, by type, for the report
        self.dropped: Counter[str] = Counter()

    # sessions

    def session_id(self, target: str | None) -> str:
        return self.base_id if target is None else safe_id(self.base_id, target)

    def targets(self) -> Iterable[str | None]:
        return (None, "sidechain")

    def session_info(self, target: str | None) -> tuple[str, dict[str, Any]]:
        meta: dict[str, Any] = {"source": SOURCE, "sourcePath": str(self.path.resolve()),
                                **self.meta}
        title = self.title or self.titles.title(target) or self.path.stem
        if target is not None or self.is_agent_file:
            meta["sidechain"] = True
            parent = self.meta.get("sourceSessionId")
            if parent:
                meta["parentSessionId"] = safe_id(SOURCE, parent)
            title = f"subagent: {title}"
        return title, meta

    def _remember(self, obj: dict[str, Any]) -> None:
        for key, name in (("cwd", "cwd"), ("sessionId", "sourceSessionId"),
                          ("gitBranch", "gitBranch"), ("version", "clientVersion"),
                          ("agentId", "agentId")):
            value = obj.get(key)
            if isinstance(value, str) and value and name not in self.meta:
                self.meta[name] = value
        ts = iso_to_unix(obj.get("timestamp"))
        if ts is not None and "startedAt" not in self.meta:
            self.meta["startedAt"] = ts

    # lines

    def map_line(self, obj: dict[str, Any], line: int) -> list[Emit]:
        kind = obj.get("type")
        if kind == "summary":
            if isinstance(obj.get("summary"), str) and self.title is None:
                self.title = obj["summary"]
            raise Skip("summary", "used as the session title" if self.title else "")
        if kind == "ai-title":
            if isinstance(obj.get("aiTitle"), str) and obj["aiTitle"]:
                self.meta["aiTitle"] = obj["aiTitle"][:1000]
            raise Skip("ai-title", "kept as session metadata (aiTitle)")
        if kind == "system":
            raise Skip(f"system:{obj.get('subtype') or 'other'}")
        if kind in _BOOKKEEPING:
            raise Skip(str(kind))
        if kind not in ("user", "assistant"):
            raise Skip(f"unknown line type {kind!r}", "skipped; a newer Claude Code may "
                       "write it", unmappable=True)
        msg = obj.get("message")
        if not isinstance(msg, dict):
            raise Skip(f"{kind} without message", unmappable=True)
        self._remember(obj)
        meta: dict[str, Any] = {}
        ts = iso_to_unix(obj.get("timestamp"))
        if ts is not None:
            meta["timestamp"] = ts
        if isinstance(obj.get("uuid"), str):
            meta["uuid"] = obj["uuid"]
        if obj.get("isCompactSummary"):
            meta["compactSummary"] = True
        if obj.get("isMeta"):
            meta["meta"] = True
        sidechain = bool(obj.get("isSidechain"))
        target = None
        if sidechain and not self.is_agent_file:
            if self.options.sidechains == "mark":
                meta["sidechain"] = True
            else:
                target = "sidechain"
        if kind == "assistant":
            out = self._assistant(msg, meta, line)
        else:
            out = self._user(msg, meta, line, target)
        if not out:
            raise Skip(f"{kind} without content")
        if ts is not None:
            for m in out:
                m["createdAt"] = ts  # the transcript's time, kept as the message's own
        return [Emit(m, target) for m in out]

    def _assistant(self, msg: dict[str, Any], meta: dict[str, Any],
                   line: int) -> list[dict[str, Any]]:
        content = msg.get("content")
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        reasoning: list[str] = []
        if isinstance(content, str):
            texts.append(content)
        for block in content if isinstance(content, list) else ():
            if not isinstance(block, dict):
                continue
            btype = block.get("type")
            if btype == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif btype == "tool_use":
                args = block.get("input")
                calls.append({
                    "id": str(block.get("id") or f"line{line}-{len(calls)}"),
                    "type": "function",
                    "function": {
                        "name": str(block.get("name") or "unknown"),
                        "arguments": cut_text(json.dumps(args, ensure_ascii=False)
                                              if args is not None else "{}"),
                    },
                })
            elif btype == "thinking" and isinstance(block.get("thinking"), str):
                reasoning.append(block["thinking"])
            elif btype == "redacted_thinking":
                reasoning.append("[redacted thinking]")
            elif btype == "image":
                texts.append(_image(block, self.path, line))
            else:
                self.dropped[f"content block {btype}"] += 1
        if not texts and not calls and not reasoning:
            return []
        out: dict[str, Any] = {"role": "assistant",
                               "content": cut_text("\n".join(texts)) if texts else None}
        if calls:
            out["tool_calls"] = calls
        if isinstance(msg.get("id"), str):
            meta["messageId"] = msg["id"]
        if isinstance(msg.get("model"), str):
            meta["model"] = msg["model"]
        if reasoning and not self.options.drop_reasoning:
            meta["reasoning"] = cut_text("\n\n".join(reasoning))
        if out["content"] is None and not calls:
            out["content"] = ""  # thinking only: kept for its reasoning metadata
            if self.options.drop_reasoning:
                return []
        out["metadata"] = meta
        return [out]

    def _user(self, msg: dict[str, Any], meta: dict[str, Any],
              line: int, target: str | None = None) -> list[dict[str, Any]]:
        content = msg.get("content")
        titled = not meta.get("meta") and not meta.get("compactSummary")
        if isinstance(content, str):
            if titled:
                self.titles.see(content, target)
            return [{"role": "user", "content": cut_text(content), "metadata": meta}]
        out: list[dict[str, Any]] = []
        texts: list[str] = []
        for block in content if isinstance(content, list) else ():
            if not isinstance(block, dict):
                continue
            btype = block.get("type")
            if btype == "tool_result":
                result_meta = dict(meta)
                if block.get("is_error"):
                    result_meta["isError"] = True
                out.append({
                    "role": "tool",
                    "tool_call_id": str(block.get("tool_use_id") or ""),
                    "content": cut_text(_result_text(block.get("content"), self.path, line)),
                    "metadata": result_meta,
                })
            elif btype == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif btype == "image":
                texts.append(_image(block, self.path, line))
            else:
                self.dropped[f"content block {btype}"] += 1
        if texts:
            text = "\n".join(texts)
            if titled:
                self.titles.see(text, target)
            out.append({"role": "user", "content": cut_text(text), "metadata": meta})
        return [m for m in out if m["role"] != "tool" or m["tool_call_id"]]

    def incomplete(self, msg: dict[str, Any]) -> bool:
        """An assistant message with only thinking, or with tool calls, is not finished:
        its text or further parallel calls come on the next lines."""
        if msg["role"] != "assistant" or not (msg.get("metadata") or {}).get("messageId"):
            return False
        return bool(msg.get("tool_calls")) or msg.get("content") == ""

    def merge(self, prev: dict[str, Any], new: dict[str, Any]) -> bool:
        """Claude Code writes each block of one API message on its own line."""
        pid = (prev.get("metadata") or {}).get("messageId")
        if prev["role"] != "assistant" or new["role"] != "assistant" or not pid:
            return False
        if pid != (new.get("metadata") or {}).get("messageId"):
            return False
        texts = [t for t in (prev.get("content"), new.get("content")) if t]
        prev["content"] = "\n".join(texts) if texts else None
        calls = (prev.get("tool_calls") or []) + (new.get("tool_calls") or [])
        if calls:
            prev["tool_calls"] = calls
        if prev["content"] is None and not calls:
            prev["content"] = ""
        pr, nr = prev["metadata"].get("reasoning"), new["metadata"].get("reasoning")
        if nr:
            prev["metadata"]["reasoning"] = f"{pr}\n\n{nr}" if pr else nr
        return True


def _image(block: dict[str, Any], path: Path, line: int) -> str:
    src = block.get("source") if isinstance(block.get("source"), dict) else {}
    if src.get("type") == "url":
        return f"[image {src.get('url')}]"
    return image_reference(src.get("media_type"), src.get("data"), f"{path.name} line {line}")


def _result_text(content: Any, path: Path, line: int) -> str:
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content if isinstance(content, list) else ():
        if isinstance(block, dict):
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                parts.append(block["text"])
            elif block.get("type") == "image":
                parts.append(_image(block, path, line))
    return "\n".join(parts)


def _opens_as_subagent(path: Path) -> bool:
    """A file whose first line is a subagent's is a subagent transcript, however named."""
    try:
        with open(path, "rb") as f:
            first = parse_line(f.readline(1 << 20) or b"{}")
    except (OSError, ValueError):
        return False
    return isinstance(first, dict) and bool(first.get("isSidechain") and first.get("agentId"))
