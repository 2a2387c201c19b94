"""Where a daemon lives and how clients find it: data dir, runtime dir, connection file.

The connection file is JSON, mode 0600, in a 0700 runtime dir (like a Jupyter kernel's):
`{"pid", "jsonrpc_tcp", "jsonrpc_unix", "websocket", "http", "zmq_router", "zmq_pub",
"token", "data_dir", "store", "version"}`; `http` is the web page's address (`ctxd ui`
adds a one-time login to it).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import warnings
from pathlib import Path
from typing import Any

import platformdirs

from ctxd.protocol.files import replace_file

CONNECTION_KEYS = (
    "pid",
    "jsonrpc_tcp",
    "jsonrpc_unix",
    "websocket",
    "http",
    "zmq_router",
    "zmq_pub",
    "token",
    "data_dir",
    "store",
    "version",
)


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


def write_connection_file(path: Path, info: dict[str, Any]) -> None:
    """Write atomically with mode 0600 so no reader ever sees a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    replace_file(path, json.dumps(info, indent=2), 0o600)


def read_connection_file(path: Path | str) -> dict[str, Any]:
    """Read a connection file, trusting it only if this user alone could have written it.

    Another user who can plant the file (or replace it through its directory) could point
    clients at their own server and collect everything clients send.
    """
    path = Path(path)
    check_private(path.parent.resolve(), "the directory of the connection file")
    check_private(path, "connection file")  # before opening: says why, even if unreadable
    with open(path) as f:
        check_private(path, "connection file", os.fstat(f.fileno()))
        info = json.load(f)
    if not isinstance(info, dict) or "token" not in info:
        raise ValueError(f"{path} is not a ctxd connection file")
    return info


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


def daemon_gone(info: dict[str, Any]) -> bool:
    """True when the connection file names a pid and that process no longer runs; a file
    without a usable pid leaves the decision to the connection attempt."""
    pid = info.get("pid")
    return isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 and not pid_alive(pid)
