"""`ctxd stdio`: bridge an editor's stdin/stdout to the daemon's JSON-RPC TCP wire.

Editors speak Content-Length framed JSON-RPC over the stdio of a process they spawn. This
proxy connects that process to the shared daemon (starting it when needed), so every
editor window talks to the same archive as every other client.

Trust: the connection file and its directory must be this user's alone, and before any
byte of the editor's goes out the proxy authenticates the daemon: it sends its own
`initialize` with a nonce and a proof of the token (not the token), and goes on only if
the daemon answers with the right `nonceMac` (`ctxd.protocol.auth`). Something else
listening on a stale file's port learns nothing and gets nothing.

Frames are copied byte for byte in both directions. The one exception is an
`initialize` request whose params lack `token`: the token from the connection file is
inserted, so editors need no knowledge of it (the connection is already authenticated,
so the daemon does not need it; older daemons did).

Requests the editor sent are remembered by id until their reply passes; if the daemon
goes away first, each gets an error reply (-32603) before the proxy exits with status 1,
so the editor never waits for an answer that cannot come.

Two plain threads: the calling thread copies daemon output to stdout, a helper thread
copies stdin to the daemon. Blocking I/O keeps the proxy simple and exact.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ctxd.protocol import auth
from ctxd.protocol.codec import FrameReader, dumps_json, frame
from ctxd.protocol.connection import (
    ConnectionInfo,
    daemon_gone,
    read_connection_file,
    split_endpoint,
)

START_TIMEOUT = 10.0
# after stdin closes, how long the daemon may take to deliver the last replies
DRAIN_TIMEOUT = 5.0
_POLL = 0.05


# the id of the proxy's own `initialize`; its reply never reaches the editor
_AUTH_ID = "ctxd-stdio-auth"
AUTH_TIMEOUT = 5.0


class DaemonUnreachable(Exception):
    pass


class DaemonNotAuthentic(ConnectionError):
    """What listens at the file's endpoint could not prove it knows the token."""


def _try_connect(connection_file: Path) -> tuple[socket.socket, dict[str, Any]]:
    info = read_connection_file(connection_file)
    if daemon_gone(info):
        # a stale file of a dead daemon: its port may now belong to anything
        raise ConnectionRefusedError(f"daemon pid {info.pid} is not running")
    unix_path = info.jsonrpc_unix
    if isinstance(unix_path, str) and unix_path:
        # this user's own socket: no other local user can squat its logins
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(2.0)
        try:
            sock.connect(unix_path)
            _authenticate(sock, info, unix_path)
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        return sock, info
    host, port = split_endpoint(info.jsonrpc_tcp or "", "jsonrpc_tcp endpoint")
    sock = socket.create_connection((host, port), timeout=2.0)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _authenticate(sock, info, f"{host}:{port}")
    except BaseException:
        sock.close()
        raise
    sock.settimeout(None)
    return sock, info


def _authenticate(sock: socket.socket, info: ConnectionInfo, where: str) -> None:
    """Mutual authentication before anything of the editor's is sent (see module doc)."""
    token = info.token
    if not isinstance(token, str):
        raise ValueError("the connection file has no token")
    nonce = auth.new_nonce()
    params = {"nonce": nonce, "proof": auth.client_proof(token, nonce), "clientName": "ctxd stdio"}
    sock.settimeout(AUTH_TIMEOUT)
    sock.sendall(
        frame(dumps_json({"jsonrpc": "2.0", "id": _AUTH_ID, "method": "initialize",
                          "params": params}))
    )
    reader = FrameReader(1024 * 1024)
    while True:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            raise DaemonNotAuthentic(f"no answer to initialize from {where}") from None
        if not data:
            raise DaemonNotAuthentic(f"{where} closed the connection during initialize")
        try:
            bodies = reader.feed(data)
        except Exception as exc:
            raise DaemonNotAuthentic(f"{where} does not speak ctxd's JSON-RPC ({exc})") from None
        for body in bodies:
            try:
                msg = json.loads(body)
            except ValueError:
                continue
            if not isinstance(msg, dict) or msg.get("id") != _AUTH_ID:
                continue
            result = msg.get("result")
            mac = result.get("nonceMac") if isinstance(result, dict) else None
            if not auth.check_daemon_proof(token, nonce, mac):
                error = msg.get("error")
                why = f": {error.get('message')}" if isinstance(error, dict) else ""
                raise DaemonNotAuthentic(
                    f"the server at {where} did not prove it knows the token of the "
                    f"connection file{why}; it is not that daemon"
                )
            return


def connect_daemon(
    connection_file: Path,
    start_daemon: Callable[[], None] | None,
    timeout: float = START_TIMEOUT,
) -> tuple[socket.socket, dict[str, Any]]:
    """Connect to the daemon of `connection_file`, starting it once if it is not there."""
    try:
        return _try_connect(connection_file)
    except (OSError, ValueError) as exc:
        if start_daemon is None:
            raise DaemonUnreachable(
                f"no daemon reachable through {connection_file} ({exc}); start one with "
                "'ctxd serve'"
            ) from None
    start_daemon()
    deadline = time.monotonic() + timeout
    while True:
        try:
            return _try_connect(connection_file)
        except (OSError, ValueError) as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise DaemonUnreachable(
                f"started a daemon but it was not reachable through {connection_file} "
                f"within {timeout:.0f} s ({last}); see its log, or run 'ctxd serve' by hand"
            )
        time.sleep(_POLL)


def _content_length(header: bytes) -> int | None:
    for line in header.split(b"\n"):
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == b"content-length":
            try:
                n = int(value.strip())
            except ValueError:
                return None
            return n if n >= 0 else None
    return None


def _inject_token(body: bytes, token: Any) -> bytes | None:
    """The body with `token` added to an `initialize` request lacking one, else None."""
    if b'"initialize"' not in body or not isinstance(token, str):
        return None  # cheap test first: only the first frame of a session is this
    try:
        msg = json.loads(body)
    except ValueError:
        return None
    if not isinstance(msg, dict) or msg.get("method") != "initialize":
        return None
    params = msg.get("params")
    if params is None:
        params = {}
    if not isinstance(params, dict) or "token" in params:
        return None
    params["token"] = token
    msg["params"] = params
    return dumps_json(msg)


class _FdReader:
    """Minimal buffered reader on a raw file descriptor.

    `sys.stdin.buffer` takes a lock while a thread blocks in it, and the interpreter
    aborts at exit if the lock is still held; reading the descriptor directly lets the
    process end while the reading thread still waits for the editor.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buf = bytearray()
        self._eof = False

    def _fill(self) -> bool:
        if self._eof:
            return False
        data = os.read(self._fd, 65536)
        if not data:
            self._eof = True
            return False
        self._buf += data
        return True

    def readline(self) -> bytes:
        while True:
            end = self._buf.find(b"\n")
            if end >= 0:
                return self._take(end + 1)
            if not self._fill():
                return self._take(len(self._buf))

    def read(self, n: int) -> bytes:
        while len(self._buf) < n and self._fill():
            pass
        return self._take(min(n, len(self._buf)))

    def read1(self) -> bytes:
        if not self._buf:
            self._fill()
        return self._take(len(self._buf))

    def _take(self, n: int) -> bytes:
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out


class _InFlight:
    """Ids of the editor's requests still waiting for a reply (shared by both threads)."""

    def __init__(self) -> None:
        self._ids: dict[str, Any] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _ids_of(body: bytes, requests: bool) -> list[Any]:
        try:
            msg = json.loads(body)
        except ValueError:
            return []
        items = msg if isinstance(msg, list) else [msg]
        out = []
        for item in items:
            if not isinstance(item, dict) or item.get("id") is None:
                continue
            if requests == isinstance(item.get("method"), str):
                out.append(item["id"])
        return out

    def sent(self, body: bytes) -> None:
        ids = self._ids_of(body, requests=True)
        if ids:
            with self._lock:
                for i in ids:
                    self._ids[json.dumps(i)] = i

    def answered(self, body: bytes) -> None:
        ids = self._ids_of(body, requests=False)
        if ids:
            with self._lock:
                for i in ids:
                    self._ids.pop(json.dumps(i), None)

    def take(self) -> list[Any]:
        with self._lock:
            ids, self._ids = list(self._ids.values()), {}
        return ids


def _fail_in_flight(stdout: Any, in_flight: _InFlight, why: str) -> None:
    """Answer every request the daemon will now never answer."""
    for req_id in in_flight.take():
        reply = {
            "jsonrpc": "2.0",
            "id": req_id,
            "error": {
                "code": -32603,
                "message": f"the ctxd daemon went away before answering ({why}); "
                "restart it with 'ctxd serve' and send the request again",
            },
        }
        try:
            stdout.write(frame(dumps_json(reply)))
            stdout.flush()
        except (OSError, ValueError):
            return


def _stdin_to_daemon(
    stdin: _FdReader, sock: socket.socket, token: Any, in_flight: _InFlight | None = None
) -> None:
    """Copy frames from stdin until it closes."""
    while True:
        header = bytearray()
        while True:
            line = stdin.readline()
            if not line:
                if header:
                    sock.sendall(header)
                return
            header += line
            if line in (b"\r\n", b"\n"):
                break
        length = _content_length(bytes(header))
        if length is None:
            # not a frame the daemon can parse: pass the bytes on so it answers with a
            # parse error, then keep copying raw bytes
            sock.sendall(header)
            while chunk := stdin.read1():
                sock.sendall(chunk)
            return
        body = stdin.read(length)
        if in_flight is not None and len(body) == length:
            in_flight.sent(body)
        injected = _inject_token(body, token) if len(body) == length else None
        if injected is not None:
            sock.sendall(b"Content-Length: %d\r\n\r\n" % len(injected) + injected)
        else:
            sock.sendall(bytes(header) + body)
        if len(body) < length:
            return


def run_stdio_proxy(connection_file: Path, start_daemon: Callable[[], None] | None) -> int:
    """Serve one editor on stdin/stdout; 0 when stdin closes, 1 if the daemon is gone."""
    try:
        sock, info = connect_daemon(Path(connection_file), start_daemon)
    except DaemonUnreachable as exc:
        print(f"ctxd stdio: {exc}", file=sys.stderr)
        return 1

    stdin_closed = threading.Event()
    closed_at: list[float] = []
    in_flight = _InFlight()

    def pump_stdin() -> None:
        try:
            _stdin_to_daemon(_FdReader(sys.stdin.fileno()), sock, info.token, in_flight)
        except OSError:
            return  # the daemon went away; the reading side reports it
        closed_at.append(time.monotonic())
        stdin_closed.set()
        try:
            # half-close: the daemon finishes running requests, replies, then closes
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    threading.Thread(target=pump_stdin, name="ctxd-stdio-in", daemon=True).start()

    stdout = sys.stdout.buffer
    replies: FrameReader | None = FrameReader()
    # a short timeout lets this thread notice when the drain time after stdin EOF is over
    sock.settimeout(0.25)
    try:
        while True:
            try:
                data = sock.recv(65536)
            except TimeoutError:
                if stdin_closed.is_set() and time.monotonic() - closed_at[0] > DRAIN_TIMEOUT:
                    break
                continue
            if not data:
                break
            stdout.write(data)
            stdout.flush()
            if replies is not None:
                try:
                    for body in replies.feed(data):
                        in_flight.answered(body)
                except Exception:
                    replies = None  # not frames we can follow: stop tracking, keep copying
    except (BrokenPipeError, ValueError):
        return 0  # the editor went away: nothing left to serve
    except OSError as exc:
        if not stdin_closed.is_set():
            _fail_in_flight(stdout, in_flight, f"connection lost: {exc}")
            print(f"ctxd stdio: lost the daemon connection ({exc})", file=sys.stderr)
            return 1
    finally:
        sock.close()

    if stdin_closed.is_set():
        return 0
    _fail_in_flight(stdout, in_flight, "it closed the connection")
    print("ctxd stdio: the daemon closed the connection", file=sys.stderr)
    return 1
