"""Where the real agent CLIs are (installed by `npm ci` in tests/agents, which .ci/run
does) and the environment that keeps them off the user's config and the network."""

from __future__ import annotations

import os
import platform
from pathlib import Path

NODE_MODULES = Path(__file__).parent / "agents" / "node_modules"
_ARCH = {"x86_64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine(), "x64")
_MISSING = "not installed: run `npm ci` in tests/agents (`bash .ci/run` does)"


def claude_binary() -> Path:
    # npm may skip the wrapper's postinstall (which copies this binary over its stub):
    # the platform package holds the same native program
    path = NODE_MODULES / "@anthropic-ai" / f"claude-code-linux-{_ARCH}" / "claude"
    if not path.is_file():
        raise AssertionError(f"Claude Code CLI {path} {_MISSING}")
    return path


def codex_binary() -> Path:
    path = NODE_MODULES / ".bin" / "codex"
    if not path.exists():
        raise AssertionError(f"Codex CLI {path} {_MISSING}")
    return path


def agent_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of an agent run: a temp HOME (so the real home config is never
    read or written), no inherited agent credentials, no telemetry, no auto-update."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ANTHROPIC_", "CLAUDE", "OPENAI_", "CODEX_"))}
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        CLAUDE_CONFIG_DIR=str(home / ".claude"),
        CODEX_HOME=str(home / ".codex"),
        DISABLE_AUTOUPDATER="1",
        DISABLE_TELEMETRY="1",
        DISABLE_ERROR_REPORTING="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        CODEX_DISABLE_UPDATE_CHECK="1",
        NO_PROXY="127.0.0.1,localhost",
    )
    env.update(extra)
    return env
