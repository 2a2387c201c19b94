"""Where a daemon lives and how clients find it: data dir, runtime dir, connection file.

The connection file is JSON, mode 0600, in a 0700 runtime dir (like a Jupyter kernel's):
one `ConnectionInfo` record, `{"pid", "jsonrpc_tcp", "jsonrpc_unix", "websocket", "http",
"zmq_router", "zmq_pub", "token", "data_dir", "store", "version"}`, written by
`write_connection_file` and read by `read_connection_file` only; `http` is the web
page's address (`ctxd ui` adds a one-time login to it).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import platformdirs

from ctxd.protocol.files import replace_file


@dataclass(frozen=True, kw_only=True)
class ConnectionInfo:
    """What the connection file holds: read and written here only, with these keys.

    `token` proves a client to the daemon (and the daemon to the client); `pid` is the
    daemon's process, checked before its endpoints are trusted; `http` is the web page's
    address (`ctxd ui` adds a one-time login to it); `jsonrpc_unix` is None when the
    socket path would be too long. Keys a newer daemon adds are passed over. A dataclass,
    not a msgspec Struct: a hook asks whether the daemon is there without loading msgspec.
    """

    pid: int | None = None
    jsonrpc_tcp: str | None = None
    jsonrpc_unix: str | None = None
    websocket: str | None = None
    http: str | None = None
    zmq_router: str | None = None
    zmq_pub: str | None = None
    token: str
    data_dir: str | None = None
    store: str | None = None
    version: str | None = None

    @classmethod
    def from_dict(cls, raw: object, where: object = "connection info") -> ConnectionInfo:
        """The record of a mapping with the file's keys; ValueError naming `where`."""
        if not isinstance(raw, Mapping) or "token" not in raw:
            raise ValueError(f"{where} is not a ctxd connection file")
        values = {k: raw.get(k) for k in CONNECTION_KEYS}
        for key, value in values.items():
            wanted: type = int if key == "pid" else str
            if (value is None and key != "token") or (
                    isinstance(value, wanted) and not isinstance(value, bool)):
                continue
            raise ValueError(f"{where} is not a ctxd connection file: its {key} is "
                             f"{value!r}, not {'an integer' if key == 'pid' else 'a string'}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """The file's keys and values, as the Python clients take them."""
        return {k: getattr(self, k) for k in CONNECTION_KEYS}


# the file's keys, in the order it is written (docs/protocol.md documents each)
CONNECTION_KEYS: tuple[str, ...] = tuple(f.name for f in fields(ConnectionInfo))


def default_data_dir() -> Path:
    env = os.environ.get("CTXD_DATA_DIR")
    if env:
        return Path(env).expanduser().resolve()
    return Path(platformdirs.user_data_dir("ctxd")).resolve()


def default_runtime_dir() -> Path:
    env = os.environ.get("CTXD_RUNTIME_DIR")
    if env:
        return Path(env).expanduser().resolve()
    with warnings.catch_warnings():
        # without XDG_RUNTIME_DIR platformdirs falls back to /tmp/runtime-<uid> and warns;
        # the fallback is fine: the daemon makes the dir 0700 and checks its owner
        warnings.simplefilter("ignore")
        return Path(platformdirs.user_runtime_dir("ctxd")).resolve()


class UnsafePath(PermissionError):
    """A file or directory another user owns, or may write to: not to be trusted."""


def _uid() -> int | None:
    return os.getuid() if hasattr(os, "getuid") else None


def unsafe_reason(st: os.stat_result, *, allow_group_write: bool = False) -> str | None:
    """Why a file or dir with this stat must not be trusted, or None when it is ours alone."""
    uid = _uid()
    if uid is None:
        return None
    if st.st_uid != uid:
        return f"is owned by uid {st.st_uid}, not by you (uid {uid})"
    writable = 0o002 if allow_group_write else 0o022
    if st.st_mode & writable:
        return f"is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def check_private(path: Path | str, what: str, st: os.stat_result | None = None) -> None:
    """Raise `UnsafePath` unless `path` is owned by this user and not writable by others."""
    reason = unsafe_reason(st if st is not None else os.stat(path))
    if reason is not None:
        raise UnsafePath(f"{what} {path} {reason}; refusing to use it")


def ensure_private_dir(path: Path, *, what: str = "directory", tighten: bool = True) -> Path:
    """Create `path` (0700) if needed; refuse one another user owns or may write to.

    An existing directory is never opened up or taken over: one shared with others is
    refused, not changed. `tighten` drops group/other read access from a directory that
    is ours alone (the runtime dir, which holds the ZeroMQ sockets).
    """
    created = not path.exists()
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.stat()
    check_private(path, what, st)
    if (created or tighten) and st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def format_hostport(host: str, port: int) -> str:
    """`HOST:PORT` as the connection file writes an endpoint (an IPv6 host in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_endpoint(endpoint: str, what: str = "endpoint") -> tuple[str, int]:
    """(host, port) of `HOST:PORT`, `[::1]:PORT` or `SCHEME://HOST:PORT` (the connection
    file's `jsonrpc_tcp`, `websocket`, a TCP `zmq_router`); ValueError naming `what`."""
    host, sep, port = endpoint.split("://", 1)[-1].rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"bad {what} {endpoint!r}; expected 'HOST:PORT'")
    return host.strip("[]") or "127.0.0.1", int(port)


def connection_file_for(data_dir: Path | str) -> Path:
    """The default connection file of the daemon serving `data_dir`: one per data dir."""
    key = hashlib.sha1(str(Path(data_dir).resolve()).encode()).hexdigest()[:12]
    return default_runtime_dir() / f"daemon-{key}.json"


def write_connection_file(path: Path, info: ConnectionInfo | Mapping[str, Any]) -> None:
    """Write atomically with mode 0600 so no reader ever sees a partial file; a mapping
    is checked as the record first (a value of the wrong type is a ValueError)."""
    record = info if isinstance(info, ConnectionInfo) else ConnectionInfo.from_dict(info)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    replace_file(path, json.dumps(record.to_dict(), indent=2), 0o600)


def read_connection_file(path: Path | str) -> ConnectionInfo:
    """Read a connection file, trusting it only if this user alone could have written it.

    Another user who can plant the file (or replace it through its directory) could point
    clients at their own server and collect everything clients send.
    """
    path = Path(path)
    check_private(path.parent.resolve(), "the directory of the connection file")
    check_private(path, "connection file")  # before opening: says why, even if unreadable
    with open(path) as f:
        check_private(path, "connection file", os.fstat(f.fileno()))
        raw = json.load(f)
    return ConnectionInfo.from_dict(raw, path)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs: the one check every client makes of a connection
    file's `pid` before trusting its endpoints (a dead daemon's port may be anyone's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, but belongs to someone else
    try:  # an exited process its parent has not reaped yet is gone all the same
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def daemon_gone(info: ConnectionInfo | Mapping[str, Any]) -> bool:
    """True when the connection file names a pid and that process no longer runs; a file
    without a usable pid leaves the decision to the connection attempt."""
    pid = info.pid if isinstance(info, ConnectionInfo) else info.get("pid")
    return isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 and not pid_alive(pid)
