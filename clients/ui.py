"""`ctxd ui [SESSION]`: open the web page in a browser, logged in once.

The address carries a one-time login secret (minted from the connection file's token,
see `ctxd.protocol.webpage`): it logs in one page, once, within two minutes, and the
page keeps a key of its own. The address never goes on the browser's command line, where
any local user reads it (`/proc/PID/cmdline`): like a Jupyter server, `ctxd ui` writes it
into a redirect file only its user can read (0600, in the private runtime dir) and hands
the browser that file's path. `--no-browser` prints the address instead. Anyone who can
read the connection file can open the page.
"""

from __future__ import annotations

import argparse
import os
import secrets
import stat
import sys
import time
import webbrowser
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ctxd.clients.client import Client, DaemonNotRunning, find_daemon
from ctxd.protocol.connection import default_runtime_dir, ensure_private_dir
from ctxd.protocol.errors import CtxdError
from ctxd.protocol.webpage import LOGIN_TTL, new_login_secret, page_url, redirect_page

__all__ = ["register", "write_redirect_file"]

# redirect files older than this are removed by the next `ctxd ui` (their secret expired
# long before; a slow browser still had ample time to read them)
_REDIRECT_KEEP = 10 * LOGIN_TTL
_ONCE = f"it logs in once, within {LOGIN_TTL // 60} minutes; run `ctxd ui` again for another"


def _remove_stale_redirects(run_dir: Path) -> None:
    now = time.time()
    for entry in run_dir.glob("ui-*.html"):
        try:
            st = entry.lstat()
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and (
                now - st.st_mtime > _REDIRECT_KEEP
            ):
                entry.unlink()
        except OSError:
            continue


def write_redirect_file(url: str) -> Path:
    """A new file (0600, in the 0700 runtime dir) whose page sends the browser to `url`.

    Created with O_EXCL and O_NOFOLLOW under a random name: nothing planted there
    beforehand (a file, a symlink) is written through or reused.
    """
    run_dir = ensure_private_dir(default_runtime_dir(), what="runtime dir")
    _remove_stale_redirects(run_dir)
    path = run_dir / f"ui-{secrets.token_hex(8)}.html"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(redirect_page(url))
    return path


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
    url = page_url(http, new_login_secret(info["token"]), args.session)
    if args.no_browser:
        print(url, flush=True)
        print(f"ctxd: open this address in a browser: {_ONCE}", file=sys.stderr)
        return 0
    try:
        redirect = write_redirect_file(url)
    except OSError as exc:
        print(f"ctxd: cannot write the page's login file: {exc}", file=sys.stderr)
        return 1
    file_url = redirect.as_uri()
    print(file_url, flush=True)
    try:
        opened = webbrowser.open(file_url)
    except webbrowser.Error:
        opened = False
    if not opened:
        print(
            f"ctxd: no browser found; open the file above in one ({_ONCE}), "
            "or use `ctxd ui --no-browser` for an address",
            file=sys.stderr,
        )
    return 0


def register(
    sub: Any, common: Callable[[argparse.ArgumentParser], None]
) -> None:
    """Add `ctxd ui` to the `ctxd` parser."""
    help_text = "open the web page in the default browser, logged in once"
    p = sub.add_parser("ui", help=help_text, description=help_text)
    common(p)
    p.add_argument("session", nargs="?", help="open this session (default: the session list)")
    p.add_argument(
        "--no-browser",
        action="store_true",
        help="print a one-time login address instead (it logs in once, within 2 minutes)",
    )
    p.set_defaults(func=cmd_ui)
