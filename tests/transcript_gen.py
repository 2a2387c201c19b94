"""Synthetic Claude Code and Codex transcripts, line by line, for tests and benchmarks.

The lines follow the published formats (see ctxd.clients.importers.claude_code and
.codex); every turn is a user request, a tool call, its result (some failing) and an
answer, in English and Chinese, so search and compaction have real work to do.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

_WORDS = ("checkout", "invoice", "数据库", "迁移", "cache", "部署", "retry", "配置")


def claude_code_lines(session: str, turns: int, pad: int = 400, start: int = 0) -> Iterator[str]:
    base = {"parentUuid": None, "isSidechain": False, "userType": "external",
            "cwd": f"/home/dev/{session[:8]}", "sessionId": session, "version": "2.0.14"}
    for i in range(start, start + turns):
        ts = f"2025-10-29T{(i // 3600) % 24:02d}:{(i // 60) % 60:02d}:{i % 60:02d}.000Z"
        w = _WORDS[i % len(_WORDS)]

        def line(type_: str, message: dict, n: int, i: int = i, ts: str = ts,
                 **extra: object) -> str:
            d = {**base, "type": type_, "uuid": f"{session}-{i}-{n}", "timestamp": ts,
                 "message": message, **extra}
            return json.dumps(d, ensure_ascii=False)

        mid = f"msg_{session[:8]}_{i}"
        yield line("user", {"role": "user", "content": f"step {i}: look at the {w} module"}, 0)
        yield line("assistant", {"id": mid, "role": "assistant", "content": [
            {"type": "thinking", "thinking": f"I should inspect {w} number {i}."}]}, 1)
        yield line("assistant", {"id": mid, "role": "assistant", "content": [
            {"type": "tool_use", "id": f"toolu_{session[:8]}_{i}", "name": "Read",
             "input": {"file_path": f"src/{w}_{i}.py"}}]}, 2)
        body = (f"# {w} {i}\n" + "def handler(x):\n    return x * 2\n" * (pad // 32))[:pad]
        yield line("user", {"role": "user", "content": [
            {"tool_use_id": f"toolu_{session[:8]}_{i}", "type": "tool_result", "content": body,
             "is_error": i % 7 == 0}]}, 3)
        yield line("assistant", {"id": mid + "b", "role": "assistant", "content": [
            {"type": "text", "text": f"step {i} done: {w} 已检查"}]}, 4)


def codex_lines(session: str, turns: int, pad: int = 400) -> Iterator[str]:
    def line(type_: str, payload: dict, i: int) -> str:
        ts = f"2025-10-29T{(i // 3600) % 24:02d}:{(i // 60) % 60:02d}:{i % 60:02d}.000Z"
        return json.dumps({"timestamp": ts, "type": type_, "payload": payload},
                          ensure_ascii=False)

    yield line("session_meta", {"id": session, "cwd": f"/home/dev/{session[:8]}",
                                "cli_version": "0.46.0"}, 0)
    for i in range(turns):
        w = _WORDS[i % len(_WORDS)]
        yield line("response_item", {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": f"step {i}: look at the {w} module"}]}, i)
        yield line("response_item", {"type": "function_call", "name": "shell",
                                     "arguments": json.dumps({"command": ["cat", f"{w}.py"]}),
                                     "call_id": f"call_{i}"}, i)
        yield line("response_item", {"type": "function_call_output", "call_id": f"call_{i}",
                                     "output": ("x = 1\n" * (pad // 6))[:pad]}, i)
        yield line("response_item", {"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": f"step {i} done: {w} 已检查"}]}, i)


def write_claude_code(path: Path, session: str, turns: int, pad: int = 400) -> int:
    """Write a transcript; returns the number of messages an import makes of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for ln in claude_code_lines(session, turns, pad):
            f.write(ln + "\n")
    return turns * 4  # user, assistant (thinking + call merged), tool, assistant
