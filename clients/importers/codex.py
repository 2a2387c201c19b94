"""Codex CLI rollouts (`~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl`) to ctxd sessions.

Each line is `{timestamp, type, payload}`:

- `session_meta`: `id`, `timestamp`, `cwd`, `cli_version`, `originator`, `git`, `instructions`.
- `response_item`: what the model saw and said, in Responses API shape; `payload.type`:
  `message` (`role` user/assistant/developer/system, `content` parts `input_text`,
  `output_text`, `input_image`), `function_call` (`name`, `arguments`, `call_id`),
  `function_call_output` (`call_id`, `output`: a string, or `{content, success}`),
  `custom_tool_call` / `custom_tool_call_output` (`input` instead of `arguments`),
  `local_shell_call` (`call_id`, `action.command`) and its `function_call_output`,
  `reasoning` (`summary` parts, `content`, `encrypted_content`), `web_search_call`.
- `compacted` (`message`): the summary Codex's own compaction wrote.
- `turn_context` (`cwd`, `model`, policies) and `event_msg` (UI events that repeat the
  response items: `user_message`, `agent_message`, `token_count`, ...): noted, not messages.

Older rollouts have no wrapper: a first line with `id` and `timestamp`, then bare
response items, and `{"record_type": "state"}` lines; they are read too.
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
from ctxd.clients.importers.titles import TitleFinder

SOURCE = "codex"
PATTERN = "rollout-*.jsonl"
_ITEM_TYPES = {
    "message", "function_call", "function_call_output", "custom_tool_call",
    "custom_tool_call_output", "local_shell_call", "reasoning", "web_search_call",
}


def default_paths() -> list[Path]:
    home = os.environ.get("CODEX_HOME")
    return [(Path(home) if home else Path("~/.codex").expanduser()) / "sessions"]


class CodexMapper:
    source = SOURCE

    def __init__(self, path: Path, options: Options) -> None:
        self.path = path
        self.options = options
        stem = path.stem.removeprefix("rollout-")
        self.base_id = safe_id(SOURCE, stem)
        self.meta: dict[str, Any] = {}
        self.titles = TitleFinder()
        # the time of the last line that had one: older rollouts' bare items carry none
        self.last_ts: float | None = None
        self.pending_reasoning: list[str] = []
        # content parts of types this version does not know, by type, for the report
        self.dropped: Counter[str] = Counter()

    def session_id(self, target: str | None) -> str:
        return self.base_id

    def targets(self) -> Iterable[str | None]:
        return (None,)

    def session_info(self, target: str | None) -> tuple[str, dict[str, Any]]:
        meta = {"source": SOURCE, "sourcePath": str(self.path.resolve()), **self.meta}
        return self.titles.title() or self.path.stem, meta

    def merge(self, prev: dict[str, Any], new: dict[str, Any]) -> bool:
        return False

    def incomplete(self, msg: dict[str, Any]) -> bool:
        """A tool call last in the file waits for its output: it is imported with it, so
        a compaction between two imports cannot leave the output without its call."""
        return bool(msg.get("tool_calls"))

    def map_line(self, obj: dict[str, Any], line: int) -> list[Emit]:
        kind = obj.get("type")
        payload = obj.get("payload")
        ts = iso_to_unix(obj.get("timestamp"))
        if ts is None:
            ts = self.last_ts
        self.last_ts = ts
        if kind in _ITEM_TYPES and payload is None:  # an older rollout: a bare item
            kind, payload = "response_item", obj
        elif "record_type" in obj:
            raise Skip(f"record:{obj['record_type']}")
        elif kind is None and "id" in obj and line == 1:  # an older rollout's header
            kind, payload = "session_meta", obj
        if kind == "session_meta" and isinstance(payload, dict):
            self._session_meta(payload)
            raise Skip("session_meta", "kept as session metadata")
        if kind == "turn_context":
            if isinstance(payload, dict) and isinstance(payload.get("model"), str):
                self.meta.setdefault("model", payload["model"])
            raise Skip("turn_context")
        if kind == "event_msg":
            ptype = payload.get("type") if isinstance(payload, dict) else None
            raise Skip(f"event_msg:{ptype or 'other'}")
        if ts is not None:
            self.meta.setdefault("startedAt", ts)
        if kind == "compacted":
            text = payload.get("message") if isinstance(payload, dict) else None
            if not isinstance(text, str) or not text:
                raise Skip("compacted without message", unmappable=True)
            return [Emit(self._msg("user", cut_text(text), ts, compactSummary=True))]
        if kind != "response_item":
            raise Skip(f"unknown line type {kind!r}", "skipped; a newer Codex may write it",
                       unmappable=True)
        if not isinstance(payload, dict):
            raise Skip("response_item without payload", unmappable=True)
        return self._item(payload, ts, line)

    def _session_meta(self, p: dict[str, Any]) -> None:
        for key, name in (("id", "sourceSessionId"), ("cwd", "cwd"),
                          ("cli_version", "clientVersion"), ("originator", "originator")):
            if isinstance(p.get(key), str) and p[key]:
                self.meta.setdefault(name, p[key])
        git = p.get("git")
        if isinstance(git, dict) and isinstance(git.get("branch"), str):
            self.meta.setdefault("gitBranch", git["branch"])
        ts = iso_to_unix(p.get("timestamp"))
        if ts is not None:
            self.meta.setdefault("startedAt", ts)

    def _msg(self, role: str, content: Any, ts: float | None, **meta: Any) -> dict[str, Any]:
        m = {k: v for k, v in meta.items() if v is not None}
        if ts is not None:
            m["timestamp"] = ts
            # the transcript's time, kept as the message's own
            return {"role": role, "content": content, "metadata": m, "createdAt": ts}
        return {"role": role, "content": content, "metadata": m}

    def _take_reasoning(self, msg: dict[str, Any]) -> None:
        if self.pending_reasoning and not self.options.drop_reasoning:
            msg["metadata"]["reasoning"] = cut_text("\n\n".join(self.pending_reasoning))
        self.pending_reasoning = []

    def _call(self, call_id: Any, name: str, arguments: str, ts: float | None,
              line: int) -> list[Emit]:
        msg = self._msg("assistant", None, ts)
        msg["tool_calls"] = [{
            "id": str(call_id or f"line{line}"),
            "type": "function",
            "function": {"name": name, "arguments": cut_text(arguments)},
        }]
        self._take_reasoning(msg)
        return [Emit(msg)]

    def _item(self, p: dict[str, Any], ts: float | None, line: int) -> list[Emit]:
        ptype = p.get("type")
        if ptype == "message":
            role = p.get("role")
            text = _parts_text(p.get("content"), self.path, line, self.dropped)
            if role == "assistant":
                msg = self._msg("assistant", cut_text(text), ts)
                self._take_reasoning(msg)
                return [Emit(msg)]
            if role in ("developer", "system"):
                return [Emit(self._msg("system", cut_text(text), ts, originalRole=role))]
            if role == "user":
                context = text.lstrip().startswith(("<environment_context>",
                                                    "<user_instructions>"))
                if not context:
                    self.titles.see(text)
                return [Emit(self._msg("user", cut_text(text), ts,
                                       context=True if context else None))]
            raise Skip(f"message role {role!r}", unmappable=True)
        if ptype == "function_call":
            return self._call(p.get("call_id"), str(p.get("name") or "unknown"),
                              _as_str(p.get("arguments")), ts, line)
        if ptype == "custom_tool_call":
            return self._call(p.get("call_id"), str(p.get("name") or "unknown"),
                              _as_str(p.get("input")), ts, line)
        if ptype == "local_shell_call":
            action = p.get("action") if isinstance(p.get("action"), dict) else {}
            args = {k: v for k, v in action.items() if k != "type"}
            return self._call(p.get("call_id") or p.get("id"), "local_shell",
                              json.dumps(args, ensure_ascii=False), ts, line)
        if ptype in ("function_call_output", "custom_tool_call_output"):
            output = p.get("output")
            failed = None
            if isinstance(output, dict):  # {content, success}
                failed = True if output.get("success") is False else None
                output = output.get("content")
            if not isinstance(output, str):
                output = _parts_text(output, self.path, line, self.dropped) \
                    if isinstance(output, list) \
                    else json.dumps(output, ensure_ascii=False)
            msg = self._msg("tool", cut_text(output), ts, isError=failed)
            msg["tool_call_id"] = str(p.get("call_id") or "")
            if not msg["tool_call_id"]:
                raise Skip(f"{ptype} without call_id", unmappable=True)
            return [Emit(msg)]
        if ptype == "reasoning":
            parts = [s.get("text", "") for s in p.get("summary") or ()
                     if isinstance(s, dict)]
            parts += [c.get("text", "") for c in p.get("content") or ()
                      if isinstance(c, dict)]
            text = "\n".join(t for t in parts if t)
            if not text:
                raise Skip("reasoning", "encrypted only")
            self.pending_reasoning.append(text)
            raise Skip("reasoning", "kept on the next assistant message"
                       if not self.options.drop_reasoning else "dropped")
        if ptype == "web_search_call":
            action = p.get("action") if isinstance(p.get("action"), dict) else {}
            query = action.get("query")
            if isinstance(query, str) and query:
                return [Emit(self._msg("assistant", f"[web search] {query}", ts))]
            raise Skip("web_search_call")
        if ptype == "ghost_snapshot":
            # Codex's record of the working tree for undo: no conversation
            raise Skip("response_item:ghost_snapshot")
        raise Skip(f"response_item:{ptype}", "skipped; a newer Codex may write it",
                   unmappable=True)


def _as_str(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False) if value is not None else ""


def _parts_text(content: Any, path: Path, line: int, dropped: Counter[str]) -> str:
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for part in content if isinstance(content, list) else ():
        if not isinstance(part, dict):
            continue
        if isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif part.get("type") in ("input_image", "image"):
            url = part.get("image_url")
            if isinstance(url, str) and url.startswith("data:"):
                head, _, data = url.partition(",")
                media = head[5:].split(";")[0]
                parts.append(image_reference(media, data, f"{path.name} line {line}"))
            else:
                parts.append(f"[image {url}]")
        else:
            dropped[f"content part {part.get('type')}"] += 1
    return "\n".join(parts)
