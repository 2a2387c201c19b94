"""The `ctxd` command: run the daemon, bridge an editor over stdio, inspect sessions."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from ctxd import __version__
from ctxd.protocol.connection import connection_file_for, default_data_dir

_DATA_DIR_HELP = "data directory (default: CTXD_DATA_DIR or the user data dir)"
_CONNECTION_FILE_HELP = "the daemon's connection file"
_CONFIG_HELP = "TOML configuration file"


def _common(p: argparse.ArgumentParser) -> None:
    # SUPPRESS: given only before the command (`ctxd --config c.toml status`), the value
    # the main parser read stays; given after it, this one wins
    p.add_argument("--data-dir", type=Path, default=argparse.SUPPRESS, help=_DATA_DIR_HELP)
    p.add_argument("--connection-file", type=Path, default=argparse.SUPPRESS,
                   help=_CONNECTION_FILE_HELP)
    p.add_argument("--config", type=Path, default=argparse.SUPPRESS, help=_CONFIG_HELP)


def _global_options(parser: argparse.ArgumentParser) -> None:
    """The options every command takes, accepted before the command too."""
    parser.add_argument("--json", action="store_true", dest="json_first",
                        help="machine-readable output for the commands that talk to the "
                        "daemon (also accepted after the command)")
    parser.add_argument("--data-dir", type=Path, default=None, help=_DATA_DIR_HELP)
    parser.add_argument("--connection-file", type=Path, default=None,
                        help=_CONNECTION_FILE_HELP)
    parser.add_argument("--config", type=Path, default=None, help=_CONFIG_HELP)
    parser.add_argument("--wire", choices=["zmq", "jsonrpc", "websocket"], default="zmq",
                        help="how the commands that talk to the daemon reach it "
                        "(default: zmq)")


def _load(args: argparse.Namespace) -> Any:
    from ctxd.daemon.config import load_config

    overrides: dict[str, Any] = {
        "data_dir": args.data_dir,
        "connection_file": getattr(args, "connection_file", None),
    }
    for name in ("port", "host", "durability", "zmq_transport", "log_file"):
        if getattr(args, name, None) is not None:
            overrides[name] = getattr(args, name)
    return load_config(args.config, overrides)


def _connection_file(args: argparse.Namespace) -> Path:
    if args.connection_file:
        return args.connection_file
    return connection_file_for(args.data_dir or default_data_dir())


def cmd_serve(args: argparse.Namespace) -> int:
    from ctxd.daemon.app import serve

    return serve(_load(args))


def cmd_config(args: argparse.Namespace) -> int:
    cfg = _load(args)
    out = cfg.to_dict()
    out["connection_file"] = str(cfg.connection_file or connection_file_for(cfg.data_dir))
    print(json.dumps(out, indent=2))
    if cfg.summarizer != "builtin":
        from ctxd.daemon.summarizers.llm_probe import summarizer_report

        # after the JSON, on stderr: `ctxd config | jq` keeps working
        ok, line = summarizer_report(cfg)
        print(("" if ok else "warning: ") + line, file=sys.stderr)
    return 0


def _spawn_daemon(args: argparse.Namespace) -> None:
    from ctxd.clients.daemon_link import spawn_daemon

    spawn_daemon(args.connection_file, args.data_dir, args.config)


def _connect(args: argparse.Namespace) -> Any:
    """A client of the shared daemon, started if none runs (as for `ctxd stdio`)."""
    from ctxd.clients.daemon_link import connect_or_start

    return connect_or_start(_connection_file(args), lambda: _spawn_daemon(args))


def cmd_stdio(args: argparse.Namespace) -> int:
    from ctxd.clients.stdio_proxy import run_stdio_proxy

    return run_stdio_proxy(_connection_file(args), lambda: _spawn_daemon(args))


def cmd_lsp(args: argparse.Namespace) -> int:
    try:
        from ctxd.clients.lsp.server import run
    except ImportError as exc:
        print(f"ctxd lsp needs pygls: pip install 'ctxd[lsp]' ({exc})", file=sys.stderr)
        return 2
    from ctxd.clients.lsp.documents import default_cache_dir

    tcp = (args.host, args.port) if args.tcp else None
    cache = args.cache_dir or default_cache_dir()
    return run(_connection_file(args), cache, lambda: _spawn_daemon(args), tcp)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ctxd", description=(
        "ctxd keeps an agent's full history in an append-only archive and serves the "
        "compacted model context to many clients at once."))
    parser.add_argument("--version", action="version", version=f"ctxd {__version__}")
    _global_options(parser)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the daemon in the foreground")
    _common(p)
    p.add_argument("--port", type=int, help="first TCP port (0 picks free ports)")
    p.add_argument("--host", help="address to bind TCP endpoints to (default 127.0.0.1)")
    p.add_argument("--durability", choices=["normal", "full"],
                   help="full: every commit survives power loss, not only a crash")
    p.add_argument("--zmq-transport", choices=["ipc", "tcp"], dest="zmq_transport",
                   help="ZeroMQ over Unix sockets in the private runtime dir (ipc, the "
                   "default) or loopback TCP")
    p.add_argument("--log-file", type=Path, dest="log_file",
                   help="write the log to this file (rotated, mode 0600) instead of stderr")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("stdio", help="JSON-RPC on stdin/stdout, forwarded to the daemon "
                       "(started if needed): what an editor spawns")
    _common(p)
    p.set_defaults(func=cmd_stdio)

    p = sub.add_parser("lsp", help="a language server on stdio, client of the daemon "
                       "(started if needed): what an LSP editor spawns")
    _common(p)
    p.add_argument("--tcp", action="store_true", help="serve one client on TCP (debugging)")
    p.add_argument("--host", default="127.0.0.1", help="with --tcp (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=2087, help="with --tcp (default 2087)")
    p.add_argument("--cache-dir", type=Path, help="where session documents are written for "
                   "editors without ctxd: URIs (default: CTXD_CACHE_DIR or the user cache dir)")
    p.set_defaults(func=cmd_lsp)

    p = sub.add_parser("config", help="print the effective configuration")
    _common(p)
    p.set_defaults(func=cmd_config)

    from ctxd.clients.cli.commands.admin import register as register_admin
    from ctxd.clients.cli.parser import register as register_commands

    register_admin(register_commands(sub, _common))

    from ctxd.clients import importers

    importers.register(sub, _common, _connect)

    from ctxd.clients import mcp_serve

    mcp_serve.register(sub, _common, _connect, _connection_file)

    from ctxd.clients.cli.commands import hook, install

    hook.register(sub, _common, _connection_file)
    install.register(sub, _common)

    from ctxd.clients import ui

    ui.register(sub, _common)

    from ctxd.clients.cli.commands.store import register as register_store

    register_store(sub, _common, _load)
    return parser


def main(argv: list[str] | None = None) -> int:
    args_given = sys.argv[1:] if argv is None else argv
    if args_given[:1] == ["hook"]:
        # an agent runs this on every turn and waits for it: no parser of every command
        from ctxd.clients.cli.commands.hook import main as hook_main

        return hook_main(args_given[1:], _connection_file)
    parser = build_parser()
    args = parser.parse_args(argv)
    from ctxd.daemon.config import StartupError

    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, so a closed pipe is caught below, not at exit
        return code
    except BrokenPipeError:
        # the reader (`| head`) has all it wanted: no complaint at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130
    except StartupError as exc:
        # a configuration or data-dir mistake: one line saying what to fix, no traceback
        print(f"ctxd: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # `python -m ctxd.clients.cli.entry`; ctxd.clients.cli runs it too
    sys.exit(main())
