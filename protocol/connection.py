"""Where a daemon lives and how clients find it: data dir, runtime dir, connection file.

The connection file is JSON, mode 0600, in a 0700 runtime dir (like a Jupyter kernel's):
`{"pid", "jsonrpc_tcp", "websocket", "http", "zmq_router", "zmq_pub", "token", "data_dir",
"version"}`; `http` is the web page's address (`ctxd ui` adds the login token to it).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import platformdirs

CONNECTION_KEYS = (
    "pid",
    "jsonrpc_tcp",
    "websocket",
    "http",
    "zmq_router",
    "zmq_pub",
    "token",
    "data_dir",
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


def ensure_private_dir(path: Path) -> Path:
    """Create `path` (0700) if needed and tighten its mode; refuse a dir owned by another user."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.stat()
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise PermissionError(f"{path} belongs to another user; choose another runtime dir")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def connection_file_for(data_dir: Path | str) -> Path:
    """The default connection file of the daemon serving `data_dir`: one per data dir."""
    key = hashlib.sha1(str(Path(data_dir).resolve()).encode()).hexdigest()[:12]
    return default_runtime_dir() / f"daemon-{key}.json"


def write_connection_file(path: Path, info: dict[str, Any]) -> None:
    """Write atomically with mode 0600 so no reader ever sees a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".conn-", suffix=".json")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(info, f, indent=2)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def read_connection_file(path: Path | str) -> dict[str, Any]:
    with open(path) as f:
        info = json.load(f)
    if not isinstance(info, dict) or "token" not in info:
        raise ValueError(f"{path} is not a ctxd connection file")
    return info
