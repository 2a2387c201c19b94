"""Reach the shared daemon from a long-lived client command, starting it when none runs.

`ctxd mcp` and `ctxd import` are clients like any other: they find the daemon through its
connection file and never open the database themselves, so any number of them can run
at once without racing on a file.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ctxd.clients.client import Client, DaemonNotRunning, Wire, find_daemon

# polled: a daemon that comes up sooner is used at once; a loaded machine can take a while
START_TIMEOUT = 60.0
_POLL = 0.05


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
        deadline = time.monotonic() + timeout
        while True:
            try:
                find_daemon(connection_file)
                break
            except DaemonNotRunning as exc:
                if time.monotonic() >= deadline:
                    raise DaemonNotRunning(
                        f"started a daemon but it did not come up through {connection_file} "
                        f"within {timeout:.0f} s ({exc}); see its daemon.log"
                    ) from None
            time.sleep(_POLL)
    return Client.connect(os.fspath(connection_file), None, wire, **options)
