"""What both Python clients share: discovery through the connection file, the errors of
a daemon that is not there or not authentic, and notification callbacks. The typed
calls the protocol table names are generated into `client_methods.py`. See `client.py`
for the clients themselves."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

from ctxd.protocol.connection import (
    connection_file_for,
    daemon_gone,
    default_data_dir,
    read_connection_file,
)

log = logging.getLogger("ctxd.client")

Wire = Literal["zmq", "jsonrpc", "websocket"]
WIRES: tuple[str, ...] = ("zmq", "jsonrpc", "websocket")
NotificationCallback = Callable[[str, dict[str, Any]], None]

DEFAULT_TIMEOUT = 60.0
DEFAULT_CONNECT_TIMEOUT = 5.0
# A compaction waits for a summarizer (often a model call): give it far longer.
COMPACT_TIMEOUT = 900.0
# How long `subscribe` waits for the ZeroMQ subscription probe (see `_zmq`).
SUBSCRIBE_SETTLE_TIMEOUT = 5.0
CLIENT_NAME = "ctxd-python"

_WIRE_KEYS = {"zmq": "zmq_router", "jsonrpc": "jsonrpc_tcp", "websocket": "websocket"}
_END: Any = object()
R = TypeVar("R")


class DaemonNotRunning(ConnectionError):
    """No daemon answers: no connection file, a dead pid, or nothing at its endpoint."""


# discovery


def find_daemon(
    connection_file: str | os.PathLike[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Locate and read the connection file; raise `DaemonNotRunning` with the reason."""
    if connection_file is not None:
        path = Path(connection_file)
    else:
        path = connection_file_for(Path(data_dir) if data_dir else default_data_dir())
    where = f"data dir {data_dir}" if data_dir and connection_file is None else str(path)
    try:
        record = read_connection_file(path)
    except FileNotFoundError:
        raise DaemonNotRunning(
            f"no ctxd daemon: connection file {path} does not exist; start one with "
            f"'ctxd serve' (for {where}) or pass the right connection_file/data_dir"
        ) from None
    except (OSError, ValueError) as exc:
        raise DaemonNotRunning(f"cannot read the connection file {path}: {exc}") from None
    if daemon_gone(record):
        raise DaemonNotRunning(
            f"the daemon of {path} (pid {record.pid}) is not running; the file is stale. "
            "Start it again with 'ctxd serve'"
        )
    # the clients take the file's keys as a mapping (what `Client(info)` is given)
    return path, record.to_dict()


def _check_wire(wire: str) -> None:
    if wire not in WIRES:
        raise ValueError(f"unknown wire {wire!r}; use one of {', '.join(WIRES)}")


class DaemonNotAuthentic(ConnectionError):
    """Whatever answered at the connection file's endpoint could not prove it knows the
    token: not the daemon that wrote the file. Nothing but a proof of the token was sent."""


class _Callbacks:
    """The notification callbacks of a client. The list is replaced, never mutated:
    delivery iterates a snapshot without locking."""

    _callbacks: list[NotificationCallback]

    def on_notification(self, callback: NotificationCallback) -> Callable[[], None]:
        """Call `callback(method, params)` for every notification (on `Client`, on its
        I/O thread). May be registered before `open()`; returns a function that removes
        it."""
        self._callbacks = [*self._callbacks, callback]

        def remove() -> None:
            self._callbacks = [cb for cb in self._callbacks if cb is not callback]

        return remove

    def _run_callbacks(self, method: str, params: dict[str, Any]) -> None:
        for callback in self._callbacks:
            try:
                callback(method, params)
            except Exception:
                log.exception("notification callback %r failed on %s", callback, method)
