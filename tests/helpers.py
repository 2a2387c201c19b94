"""Message builders and config shared by the tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ctxd.daemon.config import Config


def make_config(path: Path, **policy: Any) -> Config:
    cfg = Config(data_dir=path)
    for k, v in policy.items():
        if hasattr(cfg.compaction, k):
            setattr(cfg.compaction, k, v)
        else:
            setattr(cfg, k, v)
    return cfg


def tool_turn(i: int, path: str | None = None, result: str = "ok") -> list[dict[str, Any]]:
    """An assistant tool call and its result."""
    args = json.dumps({"path": path or f"src/mod{i}.py"})
    return [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{i}", "type": "function",
             "function": {"name": "read_file", "arguments": args}}]},
        {"role": "tool", "tool_call_id": f"call_{i}", "content": result},
    ]


def agent_turn(i: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"step {i}: look at src/mod{i}.py"},
            *tool_turn(i, result=f"# mod{i}\n" + "def handler(x):\n    return x * 2\n" * 12),
            {"role": "assistant", "content": f"done with step {i}"}]
