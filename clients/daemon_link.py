"""Reach the shared daemon from a client command, starting it when none runs.

`ctxd mcp`, `ctxd import`, `ctxd stdio`, `ctxd lsp` and the framework adapters are
clients like any other: they find the daemon through its connection file and never open
the database themselves, so any number of them can run at once without racing on a
file. The one way they start a daemon is `spawn_daemon` (detached, its output in the
data dir's private `daemon.log`), and the one way they wait for it is
`wait_for_daemon`: until its connection file names a live process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ctxd.clients.client import Client, DaemonNotRunning, Wire, find_daemon
from ctxd.protocol.connection import default_data_dir

# polled: a daemon that comes up sooner is used at once; a loaded machine can take a while
START_TIMEOUT = 60.0
_POLL = 0.05


def spawn_daemon(connection_file: Path | None = None, data_dir: Path | None = None,
                 config: Path | None = None) -> Path:
    """Start `ctxd serve` detached from this process (its own session, no terminal);
    returns its log, `daemon.log` in the data dir (0600: the log is private)."""
    cmd = [sys.executable, "-m", "ctxd.daemon", "serve"]
    if data_dir:
        cmd += ["--data-dir", str(data_dir)]
    if connection_file:
        cmd += ["--connection-file", str(connection_file)]
    if config:
        cmd += ["--config", str(config)]
    log_dir = Path(data_dir or default_data_dir())
    log_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    log_path = log_dir / "daemon.log"
    # the daemon rotates this file itself; until its logging is set up (and for a start
    # that fails before), its output goes to the same file
    cmd += ["--log-file", str(log_path)]
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.fchmod(fd, 0o600)
    with open(fd, "ab") as log:
        subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                         start_new_session=True, env=os.environ.copy())
    return log_path


def wait_for_daemon(connection_file: Path, timeout: float = START_TIMEOUT,
                    log: str = "its daemon.log") -> tuple[Path, dict[str, Any]]:
    """The connection file and what it holds, once a live daemon has written it (every
    endpoint bound); `DaemonNotRunning` naming `log` when none has within `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return find_daemon(connection_file)
        except DaemonNotRunning as exc:
            if time.monotonic() >= deadline:
                raise DaemonNotRunning(
                    f"started a daemon but it did not come up through {connection_file} "
                    f"within {timeout:.0f} s ({exc}); see {log}"
                ) from None
        time.sleep(_POLL)


def connect_or_start(
    connection_file: Path,
    start_daemon: Callable[[], None] | None,
    wire: Wire = "zmq",
    timeout: float = START_TIMEOUT,
    **options: Any,
) -> Client:
    """A connected client; when no daemon answers, call `start_daemon` once and wait."""
    try:
        find_daemon(connection_file)
    except DaemonNotRunning:
        if start_daemon is None:
            raise
        start_daemon()
        wait_for_daemon(connection_file, timeout)
    return Client.connect(os.fspath(connection_file), None, wire, **options)
