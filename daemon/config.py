"""Effective configuration: defaults, then a TOML file, then CTXD_* variables, then flags."""

from __future__ import annotations

import difflib
import math
import os
import tomllib
from dataclasses import asdict, dataclass, field, fields, is_dataclass
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
    # ...and grow by at most this share of the tokens of the messages it replaces, so a
    # compaction never makes the model input bigger (hard constraints are kept verbatim
    # even past it; 0 < share <= 1)
    summary_share: float = 0.4
    # a forced (manual) compaction keeps at most this many recent messages, and at most
    # half the context, so a short context can be compacted before a new phase of work
    force_keep_messages: int = 6
    # rebuild summarizes the archive in chunks of this many messages
    rebuild_chunk_messages: int = 200
    # an instruction preamble sent as a user message (AGENTS.md, CLAUDE.md,
    # user_instructions) is kept verbatim after it leaves the tail, up to this many
    # tokens (Codex itself reads at most 32 KiB of AGENTS.md, about 8,000 tokens; 0:
    # kept only as the rules the summary files)
    instructions_max_tokens: int = 8_000
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
    # the wait for the answer to start: connecting, and the server reading the prompt
    timeout_seconds: float = 60.0
    # the answer is streamed: no token for this long fails the request (a whole answer
    # is bounded by max_tokens, derived from the summary budget, not by a clock)
    idle_timeout_seconds: float = 30.0
    max_output_tokens: int = 1500
    temperature: float = 0.2
    # the summarizer's own window: larger input is summarized in chunks (the smaller
    # of this and what the endpoint reports, when it reports one)
    context_window_tokens: int = 8192
    # run the built-in extractor on the same messages and merge: rules, corrections,
    # artifacts, files and errors come from it word for word, the model adds the state
    # of the work, decisions with reasons and open questions
    with_extractor: bool = True
    # "builtin": use the built-in summarizer when the endpoint fails; "": fail
    fallback: str = "builtin"


@dataclass
class PostgresConfig:
    """The PostgreSQL store (`store = "postgres"`): several daemons share one archive."""

    # a libpq connection string or URI, without the password
    dsn: str = ""
    # the name of the environment variable holding the password, never the password
    # itself ("" : none, e.g. a Unix socket with peer auth, or ~/.pgpass)
    password_env: str = ""
    # the longest a request waits for a lock another connection holds (a session being
    # written through another daemon): then it fails with STORAGE_ERROR, reason
    # LockNotAvailable; the wait never holds the event loop
    lock_timeout_seconds: float = 5.0
    # the longest any statement of ctxd's may run on the server (searches have their own,
    # shorter budget): then the request fails with STORAGE_ERROR, reason QueryCanceled
    statement_timeout_seconds: float = 30.0


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
    # clients that logged in, per JSON-RPC wire
    max_connections: int = 256
    # connections that have not logged in yet, per JSON-RPC wire: while this many are
    # open the wire accepts nothing more (see docs/reliability.md)
    max_unauthenticated_connections: int = 32
    # a connection that has not proven the token by then is closed
    auth_timeout_seconds: float = 5.0
    # a search running longer is stopped with SEARCH_TOO_BROAD (it runs beside the event
    # loop, so other clients are served meanwhile)
    search_budget_seconds: float = 2.0
    # a run opened over ZeroMQ is interrupted when its client sends nothing (no request,
    # no heartbeat) for this long: ZeroMQ never says when a client goes away
    run_lease_seconds: float = 30.0
    # the daemon's log file (stderr when unset): rotated at log_max_bytes, keeping
    # log_backups older files, created 0600
    log_file: Path | None = None
    log_max_bytes: int = 10 * 1024 * 1024
    log_backups: int = 3
    # "normal": survives a process crash; "full": also survives power loss (fsync per commit)
    durability: str = "normal"
    summarizer: str = "builtin"  # "builtin" or "openai"
    # where the archive lives: "sqlite" (the embedded file in data_dir) or "postgres"
    store: str = "sqlite"
    postgres: PostgresConfig = field(default_factory=PostgresConfig)
    openai: OpenAISummarizerConfig = field(default_factory=OpenAISummarizerConfig)
    compaction: CompactionPolicy = field(default_factory=CompactionPolicy)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["data_dir"] = str(self.data_dir)
        out["connection_file"] = str(self.connection_file) if self.connection_file else None
        out["log_file"] = str(self.log_file) if self.log_file else None
        return out

    @property
    def db_path(self) -> Path:
        return self.data_dir / "ctxd.db"


class StartupError(Exception):
    """What keeps the daemon or a command from starting, said in one line: where (file,
    variable or flag), which key, and what is expected. The CLI prints it and exits 2."""


class ConfigError(StartupError, ValueError):
    """A configuration mistake (a ValueError too, for callers that caught those)."""


_TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _coerce(value: Any, current: Any, name: str, source: str) -> Any:
    def wrong(expected: str) -> ConfigError:
        return ConfigError(f"{source}: {name}: expected {expected}, got {value!r}")

    if isinstance(current, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _BOOL_WORDS:
            return _BOOL_WORDS[value.lower()]
        raise wrong("true or false")
    if isinstance(current, int | float):
        if isinstance(value, bool):
            raise wrong(_TYPE_WORDS[type(current)])
        try:
            out = type(current)(value)
        except (TypeError, ValueError, OverflowError):
            raise wrong(_TYPE_WORDS[type(current)]) from None
        if isinstance(out, float) and not math.isfinite(out):
            raise wrong("a finite number")
        if isinstance(current, int) and isinstance(value, float) and value != out:
            raise wrong("an integer")
        if out < 0 and name.rpartition(".")[2] not in _SIGNED:
            raise wrong("a number of at least 0")
        return out
    if isinstance(current, Path) or name in ("data_dir", "connection_file", "log_file"):
        if not isinstance(value, str | Path):
            raise wrong("a path (a string)")
        return Path(str(value)).expanduser()
    if isinstance(current, str) and not isinstance(value, str):
        raise wrong("a string")
    return value


_BOOL_WORDS = {"1": True, "true": True, "yes": True, "on": True,
               "0": False, "false": False, "no": False, "off": False}
# numeric keys that may be negative (none today: every count, size and time is >= 0)
_SIGNED: frozenset[str] = frozenset()


def _apply(target: Any, values: dict[str, Any], source: str, prefix: str = "") -> None:
    known = {f.name: f for f in fields(target)}
    for key, value in values.items():
        name = key.replace("-", "_")
        if name not in known:
            close = difflib.get_close_matches(name, list(known), n=1)
            hint = f"did you mean {prefix}{close[0]}? " if close else ""
            raise ConfigError(
                f"{source}: unknown key {prefix}{key}; {hint}known keys"
                + (f" of [{prefix.rstrip('.')}]" if prefix else "")
                + f": {', '.join(sorted(known))}"
            )
        current = getattr(target, name)
        if is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(
                    f"{source}: {prefix}{name}: expected a table ([{prefix}{name}]), "
                    f"got {value!r}"
                )
            _apply(current, value, source, prefix=f"{prefix}{name}.")
        else:
            setattr(target, name, _coerce(value, current, prefix + name, source))


def _read_toml(path: Path | str, given_by: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such configuration file (given by {given_by})") from None
    except IsADirectoryError:
        raise ConfigError(
            f"{path}: is a directory; expected a TOML configuration file (given by {given_by})"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror}; given by {given_by})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not valid TOML: the file is not UTF-8 text") from None


def _choice(cfg: Config, name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(
            f"{cfg_source(cfg, name)}{name}: expected one of "
            f"{', '.join(repr(c) for c in choices)}, got {value!r}"
        )


def cfg_source(cfg: Config, name: str) -> str:
    where = getattr(cfg, "_sources", {}).get(name)
    return f"{where}: " if where else ""


def load_config(
    config_file: Path | str | None = None,
    overrides: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
) -> Config:
    """Raises `ConfigError` naming the file, variable or flag, the key and what it expects."""
    cfg = Config()
    sources: dict[str, str] = {}
    env = os.environ if environ is None else environ
    path = config_file or env.get("CTXD_CONFIG")
    if path:
        given_by = "--config" if config_file else "the environment variable CTXD_CONFIG"
        values = _read_toml(path, given_by)
        _apply(cfg, values, str(path))
        sources.update(_flatten(values, str(path)))
    # each variable on its own, so a mistake names the variable
    for f in fields(Config):
        key = "CTXD_" + f.name.upper()
        if key in env and f.name not in ("compaction", "openai", "postgres"):
            _apply(cfg, {f.name: env[key]}, f"environment variable {key}")
            sources[f.name] = f"environment variable {key}"
    for f in fields(OpenAISummarizerConfig):
        key = f"CTXD_OPENAI_{f.name.upper()}"
        if key in env:
            _apply(cfg, {"openai": {f.name: env[key]}}, f"environment variable {key}")
            sources[f"openai.{f.name}"] = f"environment variable {key}"
    for f in fields(PostgresConfig):
        key = f"CTXD_POSTGRES_{f.name.upper()}"
        if key in env:
            _apply(cfg, {"postgres": {f.name: env[key]}}, f"environment variable {key}")
            sources[f"postgres.{f.name}"] = f"environment variable {key}"
    for f in fields(CompactionPolicy):
        key = "CTXD_" + f.name.upper()
        if key in env:
            _apply(cfg, {"compaction": {f.name: env[key]}}, f"environment variable {key}")
            sources[f"compaction.{f.name}"] = f"environment variable {key}"
    if overrides:
        given = {k: v for k, v in overrides.items() if v is not None}
        _apply(cfg, given, "command line")
        sources.update(_flatten(given, "command line"))
    cfg._sources = sources  # type: ignore[attr-defined]
    _choice(cfg, "durability", cfg.durability, ("normal", "full"))
    _choice(cfg, "summarizer", cfg.summarizer, ("builtin", "openai"))
    _choice(cfg, "zmq_transport", cfg.zmq_transport, ("ipc", "tcp"))
    _choice(cfg, "openai.fallback", cfg.openai.fallback, ("", "builtin"))
    _choice(cfg, "store", cfg.store, ("sqlite", "postgres"))
    if cfg.store == "postgres":
        _check_postgres(cfg, env)
    policy = cfg.compaction
    if policy.max_active_messages < policy.keep_messages:
        where = sources.get("compaction.max_active_messages") or sources.get(
            "compaction.keep_messages", "defaults"
        )
        raise ConfigError(
            f"{where}: compaction.max_active_messages ({policy.max_active_messages}) is "
            f"below compaction.keep_messages ({policy.keep_messages}): a compaction keeps "
            "keep_messages, so the context could never get under the limit; expected "
            "max_active_messages >= keep_messages"
        )
    _check_sizes(policy, sources)
    cfg.data_dir = Path(cfg.data_dir).expanduser().resolve()
    return cfg


def _check_sizes(policy: CompactionPolicy, sources: dict[str, str]) -> None:
    if not 0 < policy.summary_share <= 1:
        where = sources.get("compaction.summary_share", "defaults")
        raise ConfigError(
            f"{where}: compaction.summary_share: expected a number above 0 and at most 1 "
            f"(the share of the replaced messages' tokens a summary may take), got "
            f"{policy.summary_share!r}"
        )
    if policy.instructions_max_tokens < 0:
        where = sources.get("compaction.instructions_max_tokens", "defaults")
        raise ConfigError(
            f"{where}: compaction.instructions_max_tokens: expected an integer of at least "
            f"0 (the tokens of an instruction preamble kept verbatim), got "
            f"{policy.instructions_max_tokens!r}"
        )
    if policy.force_keep_messages < 1:
        where = sources.get("compaction.force_keep_messages", "defaults")
        raise ConfigError(
            f"{where}: compaction.force_keep_messages: expected an integer of at least 1 "
            f"(a forced compaction keeps the latest messages), got "
            f"{policy.force_keep_messages!r}"
        )


def _check_postgres(cfg: Config, env: Any) -> None:
    pg = cfg.postgres
    if not pg.dsn.strip():
        raise ConfigError(
            f"{cfg_source(cfg, 'store')}store is \"postgres\" but postgres.dsn is empty; "
            "expected a connection string such as \"host=db.internal dbname=ctxd user=ctxd\""
        )
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        raise ConfigError(
            f"{cfg_source(cfg, 'store')}store is \"postgres\" but psycopg is not installed; "
            "install the extra: pip install 'ctxd[postgres]'"
        ) from None
    try:
        params = conninfo_to_dict(pg.dsn)
    except Exception as exc:  # psycopg.ProgrammingError: a malformed string
        raise ConfigError(
            f"{cfg_source(cfg, 'postgres.dsn')}postgres.dsn: not a valid connection "
            f"string ({exc})"
        ) from None
    if params.get("password"):
        raise ConfigError(
            f"{cfg_source(cfg, 'postgres.dsn')}postgres.dsn contains a password; keep it "
            "out of the configuration: put it in an environment variable and name that "
            "variable in postgres.password_env"
        )
    for name in ("lock_timeout_seconds", "statement_timeout_seconds"):
        if not getattr(pg, name) > 0:
            raise ConfigError(
                f"{cfg_source(cfg, 'postgres.' + name)}postgres.{name} must be a number of "
                f"seconds above 0, got {getattr(pg, name)!r}"
            )
    if pg.password_env and pg.password_env not in env:
        raise ConfigError(
            f"{cfg_source(cfg, 'postgres.password_env')}postgres.password_env names the "
            f"environment variable {pg.password_env!r}, which is not set; expected it to "
            "hold the database password"
        )


def _flatten(values: dict[str, Any], source: str, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in values.items():
        name = prefix + key.replace("-", "_")
        if isinstance(value, dict):
            out.update(_flatten(value, source, name + "."))
        else:
            out[name] = source
    return out
