"""Finding and reaching the daemon for a command, and turning every failure into a
message on stderr and an exit code; paging through sessions and archives."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from ctxd.clients.cli.commands.output import EXIT_OK, EXIT_REFUSED, EXIT_UNREACHABLE, Output, fail
from ctxd.clients.cli.text import cli_message
from ctxd.clients.client import Client, DaemonNotRunning, Wire, find_daemon
from ctxd.daemon.config import ConfigError
from ctxd.protocol.connection import connection_file_for
from ctxd.protocol.errors import CtxdError

# archive/read allows up to 5000; 1000 keeps each reply small while paging fast
READ_PAGE = 1000
SESSION_PAGE = 1000
# side by side needs two columns wide enough for a role and a useful preview

CommonOptions = Callable[[argparse.ArgumentParser], None]




@dataclass
class Context:
    args: argparse.Namespace
    out: Output
    client: Client
    info: dict[str, Any]
    connection_file: Path
    data_dir: Path


Handler = Callable[[Context], int]


class NoDaemon(Exception):
    """find_daemon failed: the message names the data dir and says how to start one."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


def _locate(args: argparse.Namespace) -> tuple[Path | None, Path]:
    """The connection file given (flag or config) if any, and the effective data dir."""
    from ctxd.daemon.config import load_config

    cfg = load_config(args.config, {
        "data_dir": args.data_dir, "connection_file": args.connection_file})
    return cfg.connection_file, cfg.data_dir


def _find(args: argparse.Namespace) -> tuple[Path, dict[str, Any], Path]:
    given, data_dir = _locate(args)
    path = given or connection_file_for(data_dir)
    try:
        found, info = find_daemon(given, data_dir)
    except DaemonNotRunning as exc:
        where = f"at {given}" if given else f"for {data_dir}"
        detail = (f"no connection file at {path}" if not path.exists() else str(exc))
        raise NoDaemon(f"no ctxd daemon {where}; start one with `ctxd serve`", detail) from None
    return found, info, data_dir


def _client_log_to_stderr() -> None:
    """Show the client's warnings (a lost connection and why) the way the CLI reports."""
    root, client_log = logging.getLogger(), logging.getLogger("ctxd.client")
    if root.handlers or client_log.handlers:
        return  # an embedding program configured logging: leave it alone
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("ctxd: %(message)s"))
    handler.setLevel(logging.WARNING)
    client_log.addHandler(handler)


def runner(handler: Handler) -> Callable[[argparse.Namespace], int]:
    """Connect, run `handler`, and turn every failure into a message and an exit code."""

    def run(args: argparse.Namespace) -> int:
        _client_log_to_stderr()
        # `ctxd --json status` and `ctxd status --json` alike
        json_mode = bool(args.json or getattr(args, "json_first", False))
        out = Output(sys.stdout, json_mode)
        client: Client | None = None
        try:
            path, info, data_dir = _find(args)
            client = Client(info, cast(Wire, args.wire), source=str(path))
            client.open()
            return handler(Context(args, out, client, info, path, data_dir))
        except BrokenPipeError:
            raise  # the reader went away: not an error to report (see `guarded`)
        except NoDaemon as exc:
            fail(str(exc))
            fail(exc.detail)
            if json_mode and args.command == "status":
                out.document({"running": False, "message": str(exc), "detail": exc.detail})
            return EXIT_UNREACHABLE
        except CtxdError as exc:
            fail(cli_message(exc.message, getattr(args, "session", None)))
            return EXIT_REFUSED
        except (ConnectionError, TimeoutError) as exc:
            fail(str(exc))
            return EXIT_UNREACHABLE
        except ConfigError as exc:
            fail(str(exc))  # a bad config file, CTXD_* variable or flag: a usage mistake
            return EXIT_REFUSED
        except (ValueError, OSError) as exc:
            # an unwritable --output
            fail(str(exc))
            return EXIT_UNREACHABLE
        finally:
            if client is not None:
                client.close()

    def guarded(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except BrokenPipeError:
            # the reader (`| head`) has all it wanted; keep Python from complaining at exit
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return EXIT_OK

    return guarded


def archive_pages(client: Client, session_id: str, stop_after: int | None = None
           ) -> Iterator[dict[str, Any]]:
    """Every archived message of the session in id order, one page in memory at a time."""
    after = 0
    seen = 0
    while True:
        page = client.read(session_id, after_id=after, limit=READ_PAGE)
        for msg in page["messages"]:
            if stop_after is not None and seen >= stop_after:
                return
            seen += 1
            yield msg
        nxt = page.get("nextAfterId")
        if nxt is None or not page["messages"] or nxt <= after:
            return
        after = nxt


def all_sessions(client: Client) -> Iterator[dict[str, Any]]:
    cursor: str | None = None
    while True:
        page = client.list_sessions(limit=SESSION_PAGE, cursor=cursor)
        yield from page["sessions"]
        cursor = page.get("nextCursor")
        if not cursor:
            return


# commands
