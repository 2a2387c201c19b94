"""`ctxd ui [SESSION]`: print the web page's address, logged in, and open it in a browser.

The URL carries the page's login token (derived from the connection file's secret, see
`ctxd.protocol.webpage`); the page trades it for a cookie and drops it from the address
bar. Anyone who can read the connection file can open the page, as with a Jupyter server.
"""

from __future__ import annotations

import argparse
import sys
import webbrowser
from collections.abc import Callable
from typing import Any

from ctxd.clients.client import Client, DaemonNotRunning, find_daemon
from ctxd.protocol.errors import CtxdError
from ctxd.protocol.webpage import page_url

__all__ = ["register"]


def cmd_ui(args: argparse.Namespace) -> int:
    from ctxd.daemon.config import load_config

    try:
        cfg = load_config(
            args.config, {"data_dir": args.data_dir, "connection_file": args.connection_file}
        )
        path, info = find_daemon(cfg.connection_file, cfg.data_dir)
    except (DaemonNotRunning, ValueError, OSError) as exc:
        print(f"ctxd: {exc}", file=sys.stderr)
        return 1
    http = info.get("http")
    if not isinstance(http, str):
        print(
            f"ctxd: the daemon of {path} serves no web page (version {info.get('version')}); "
            "restart it with a current `ctxd serve`",
            file=sys.stderr,
        )
        return 1
    if args.session:
        try:
            with Client(info, "jsonrpc", source=str(path)) as client:
                client.get_session(args.session)
        except CtxdError as exc:
            print(f"ctxd: {exc.message}", file=sys.stderr)
            return 2
        except (ConnectionError, TimeoutError) as exc:
            print(f"ctxd: {exc}", file=sys.stderr)
            return 1
    url = page_url(http, info["token"], args.session)
    print(url, flush=True)
    if not args.no_browser:
        try:
            opened = webbrowser.open(url)
        except webbrowser.Error:
            opened = False
        if not opened:
            print("ctxd: no browser found; open the address above", file=sys.stderr)
    return 0


def register(
    sub: Any, common: Callable[[argparse.ArgumentParser], None]
) -> None:
    """Add `ctxd ui` to the `ctxd` parser."""
    help_text = "print the web page's address (logged in) and open it in the default browser"
    p = sub.add_parser("ui", help=help_text, description=help_text)
    common(p)
    p.add_argument("session", nargs="?", help="open this session (default: the session list)")
    p.add_argument("--no-browser", action="store_true", help="only print the address")
    p.set_defaults(func=cmd_ui)
