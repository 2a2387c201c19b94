"""What the daemon checks before it trusts a path: its data dir, its files, its sockets.

Another local user must not be able to plant a database (a 0666 file makes the WAL
world-readable), hold the lock file, share the connection file's directory, or have the
daemon bind over another daemon's live socket. Each is refused with one line saying why.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path

from ctxd.daemon.config import StartupError
from ctxd.protocol.connection import UnsafePath, check_private, ensure_private_dir

# the database and the files SQLite keeps beside it
DB_FILES = ("ctxd.db", "ctxd.db-wal", "ctxd.db-shm", "ctxd.db-journal")


class Refused(StartupError):
    """The daemon will not start with this setup; the message says why, in one line."""


def check_data_dir(data_dir: Path) -> None:
    """Create the data dir (0700) or accept an existing one only if it is ours alone;
    refuse the database, its side files and the lock file when another user owns them."""
    try:
        ensure_private_dir(data_dir, what="data dir", tighten=False)
    except UnsafePath as exc:
        raise Refused(str(exc)) from None
    for name in (*DB_FILES, "daemon.lock"):
        path = data_dir / name
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            raise Refused(f"{path} is a symbolic link; refusing to use it")
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise Refused(
                f"{path} is owned by uid {st.st_uid}, not by you (uid {os.getuid()}); "
                "refusing to use it"
            )
        if st.st_mode & 0o077:
            # ours, but readable by others: the archive is private
            os.chmod(path, 0o600)


def open_private_file(path: Path, what: str) -> int:
    """Open (creating 0600) a file of ours without following a symlink planted there."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        check_private(path, what, os.fstat(fd))
    except UnsafePath as exc:
        os.close(fd)
        raise Refused(str(exc)) from None
    return fd


def prepare_connection_dir(connection_file: Path) -> None:
    """The connection file's directory must be ours alone; an existing one is never chmod-ed."""
    try:
        ensure_private_dir(
            connection_file.parent, what="the directory of the connection file", tighten=False
        )
    except UnsafePath as exc:
        raise Refused(f"{exc}; give --connection-file a path in a private directory") from None


class PidLock:
    """An flock on a private file that holds the owner's pid: one daemon per thing locked.

    `busy` turns the pid of the daemon holding the lock into the error to raise.
    """

    def __init__(self, path: Path, busy: Callable[[str], Exception]) -> None:
        self.path = path
        self._busy = busy
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = open_private_file(self.path, "lock file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise self._busy(owner) from None
        try:
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
        except OSError as exc:  # a full disk: say which file could not be written
            os.close(fd)
            raise OSError(exc.errno, exc.strerror, str(self.path)) from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def connection_file_lock(connection_file: Path) -> PidLock:
    """An flock on `<connection file>.lock`: one daemon per connection file.

    Two daemons (for different data dirs) given the same connection file would otherwise
    overwrite each other's file, and clients of the first would reach the second.
    """
    return PidLock(
        connection_file.with_name(connection_file.name + ".lock"),
        lambda owner: Refused(
            f"another ctxd daemon (pid {owner}) uses the connection file "
            f"{connection_file}; give this one another --connection-file"
        ),
    )


def ipc_endpoints(run_dir: Path, connection_file: Path) -> tuple[str, str]:
    """Socket paths unique to the daemon of `connection_file` (one daemon per file).

    Named after a hash of the connection file's full path, not its base name: two
    daemons whose connection files share a name in different folders must not meet.
    """
    key = hashlib.sha256(str(connection_file.resolve()).encode()).hexdigest()[:12]
    return f"ipc://{run_dir}/zmq-{key}-router.sock", f"ipc://{run_dir}/zmq-{key}-pub.sock"


def jsonrpc_socket_path(run_dir: Path, connection_file: Path) -> str:
    """The JSON-RPC Unix socket of the daemon of `connection_file`, keyed like
    `ipc_endpoints`."""
    key = hashlib.sha256(str(connection_file.resolve()).encode()).hexdigest()[:12]
    return f"{run_dir}/jsonrpc-{key}.sock"


def refuse_live_socket(endpoint: str) -> None:
    """Raise `Refused` when a process listens on the ipc socket `endpoint`; remove a stale
    socket file. libzmq itself would unlink a live socket and silently take it over."""
    if not endpoint.startswith("ipc://") or endpoint.startswith("ipc://@"):
        return
    path = endpoint[len("ipc://") :]
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise Refused(f"{path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise Refused(f"cannot tell whether {path} is in use ({exc})") from None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # stale: left by a daemon that died
        return
    finally:
        probe.close()
    raise Refused(f"another process serves the ZeroMQ socket {path}; refusing to take it over")
