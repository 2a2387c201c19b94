"""Effective configuration: defaults, then a TOML file, then CTXD_* variables, then flags."""

from __future__ import annotations

import os
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ctxd.protocol.connection import default_data_dir


@dataclass
class CompactionPolicy:
    # auto-compact when the active context has more messages or tokens than this
    max_active_messages: int = 80
    max_active_tokens: int = 120_000
    # recent messages kept verbatim as the tail
    keep_messages: int = 24
    # the rendered summary must fit this many tokens
    summary_budget_tokens: int = 2_000
    # rebuild summarizes the archive in chunks of this many messages
    rebuild_chunk_messages: int = 200
    # drift bound: after this many incremental compactions the next one re-derives the
    # summary from the archive (0 turns it off)
    rederive_after: int = 8
    # a manual compaction or rebuild asked for while another runs waits this long for
    # it, then fails with COMPACTION_IN_PROGRESS
    wait_seconds: float = 300.0


@dataclass
class OpenAISummarizerConfig:
    """An OpenAI-compatible chat completions endpoint (OpenAI, Ollama, llama.cpp, vLLM)."""

    base_url: str = "http://127.0.0.1:11434/v1"
    model: str = ""
    # the name of the environment variable holding the API key, never the key itself
    api_key_env: str = "OPENAI_API_KEY"
    timeout_seconds: float = 60.0
    max_output_tokens: int = 1500
    temperature: float = 0.2
    # the summarizer's own window: larger input is summarized in chunks
    context_window_tokens: int = 8192
    # "builtin": use the built-in summarizer when the endpoint fails; "": fail
    fallback: str = ""


@dataclass
class Config:
    data_dir: Path = field(default_factory=default_data_dir)
    connection_file: Path | None = None
    host: str = "127.0.0.1"
    port: int = 0  # 0 picks free ports for every TCP endpoint
    zmq_transport: str = "ipc"  # "ipc" (Unix socket in the runtime dir) or "tcp"
    encoding: str = "cl100k_base"
    max_message_bytes: int = 8 * 1024 * 1024
    max_request_bytes: int = 64 * 1024 * 1024
    max_batch_messages: int = 10_000
    max_connections: int = 256
    # a connection that has not proven the token by then is closed
    auth_timeout_seconds: float = 5.0
    # a search running longer is stopped with SEARCH_TOO_BROAD (it runs beside the event
    # loop, so other clients are served meanwhile)
    search_budget_seconds: float = 2.0
    # "normal": survives a process crash; "full": also survives power loss (fsync per commit)
    durability: str = "normal"
    summarizer: str = "builtin"  # "builtin" or "openai"
    openai: OpenAISummarizerConfig = field(default_factory=OpenAISummarizerConfig)
    compaction: CompactionPolicy = field(default_factory=CompactionPolicy)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["data_dir"] = str(self.data_dir)
        out["connection_file"] = str(self.connection_file) if self.connection_file else None
        return out

    @property
    def db_path(self) -> Path:
        return self.data_dir / "ctxd.db"


def _coerce(value: Any, current: Any, name: str) -> Any:
    if isinstance(current, bool):
        if isinstance(value, str):
            return value.lower() in ("1", "true", "yes", "on")
        return bool(value)
    if isinstance(current, int | float):
        try:
            return type(current)(value)
        except (TypeError, ValueError):
            kind = "an integer" if isinstance(current, int) else "a number"
            raise ValueError(f"config {name}: expected {kind}, got {value!r}") from None
    if isinstance(current, Path) or name in ("data_dir", "connection_file"):
        return Path(str(value)).expanduser()
    return value


def _apply(target: Any, values: dict[str, Any], prefix: str = "") -> None:
    known = {f.name: f for f in fields(target)}
    for key, value in values.items():
        name = key.replace("-", "_")
        if name not in known:
            raise ValueError(f"unknown config key {prefix}{key!r}")
        current = getattr(target, name)
        if isinstance(current, CompactionPolicy | OpenAISummarizerConfig):
            if not isinstance(value, dict):
                raise ValueError(f"config {prefix}{key} must be a table")
            _apply(current, value, prefix=f"{name}.")
        else:
            setattr(target, name, _coerce(value, current, prefix + name))


def load_config(
    config_file: Path | str | None = None,
    overrides: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
) -> Config:
    cfg = Config()
    env = os.environ if environ is None else environ
    path = config_file or env.get("CTXD_CONFIG")
    if path:
        with open(path, "rb") as f:
            _apply(cfg, tomllib.load(f))
    env_values: dict[str, Any] = {}
    policy_values: dict[str, Any] = {}
    policy_names = {f.name for f in fields(CompactionPolicy)}
    for f in fields(Config):
        key = "CTXD_" + f.name.upper()
        if key in env and f.name not in ("compaction", "openai"):
            env_values[f.name] = env[key]
    openai_values = {f.name: env[f"CTXD_OPENAI_{f.name.upper()}"]
                     for f in fields(OpenAISummarizerConfig)
                     if f"CTXD_OPENAI_{f.name.upper()}" in env}
    if openai_values:
        env_values["openai"] = openai_values
    for name in policy_names:
        key = "CTXD_" + name.upper()
        if key in env:
            policy_values[name] = env[key]
    if policy_values:
        env_values["compaction"] = policy_values
    _apply(cfg, env_values)
    if overrides:
        _apply(cfg, {k: v for k, v in overrides.items() if v is not None})
    if cfg.durability not in ("normal", "full"):
        raise ValueError("durability must be 'normal' or 'full'")
    if cfg.summarizer not in ("builtin", "openai"):
        raise ValueError("summarizer must be 'builtin' or 'openai'")
    if cfg.openai.fallback not in ("", "builtin"):
        raise ValueError("openai.fallback must be 'builtin' or empty")
    cfg.data_dir = Path(cfg.data_dir).expanduser().resolve()
    return cfg
