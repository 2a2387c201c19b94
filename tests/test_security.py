"""Security of a real daemon: the token, private files, loopback-only endpoints, browser
origins, search and SQL injection, and the limits that keep one client from hurting others.

One daemon (ZeroMQ on TCP so that every endpoint is a TCP port) serves most tests; the
connection-limit test starts its own with a small `max_connections`.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw
import msgpack
import pytest
import zmq
from helpers import DaemonProcess
from outcomes import OutcomeCounts
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect as ws_connect

from ctxd.protocol.auth import secure_client_socket
from ctxd.protocol.codec import FrameReader, frame
from ctxd.protocol.connection import split_endpoint
from ctxd.protocol.errors import CtxdError, PayloadTooLarge
from ctxd.protocol.methods import METHODS

MAX_REQUEST_BYTES = 1024 * 1024
MAX_MESSAGE_BYTES = 32 * 1024
MAX_BATCH_MESSAGES = 50
TIMEOUT = 10.0

PARSE_ERROR = -32700
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
UNAUTHORIZED = -32001
PAYLOAD_TOO_LARGE = -32015


# outcome counts, for bench/fuzz_report.py

STATS = OutcomeCounts()
note = STATS.note


@pytest.fixture(scope="module", autouse=True)
def _write_stats() -> Iterator[None]:
    yield
    STATS.write()


def start_daemon(root: Path, *extra: str, **config: Any) -> DaemonProcess:
    """A daemon with a TOML config whose keys are `Config` field names."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "ctxd.toml"
    path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in config.items()))
    daemon = DaemonProcess(root, "--config", str(path), *extra).start()
    return daemon


@dataclass
class Env:
    daemon: DaemonProcess
    info: dict[str, Any]
    client: Any  # a healthy ZeroMQ client
    ctx: zmq.Context[Any]

    @property
    def token(self) -> str:
        return str(self.info["token"])

    def alive(self) -> None:
        assert self.daemon.proc is not None and self.daemon.proc.poll() is None, "daemon died"
        assert self.client.call("tools/list", {})["tools"]

    def db(self) -> apsw.Connection:
        return apsw.Connection(str(self.daemon.data_dir / "ctxd.db"),
                               flags=apsw.SQLITE_OPEN_READONLY)

    def message_count(self) -> int:
        db = self.db()
        try:
            return int(db.execute("SELECT count(*) FROM messages").fetchone()[0])
        finally:
            db.close()


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    daemon = start_daemon(
        tmp_path_factory.mktemp("security"), "--zmq-transport", "tcp",
        max_request_bytes=MAX_REQUEST_BYTES, max_message_bytes=MAX_MESSAGE_BYTES,
        max_batch_messages=MAX_BATCH_MESSAGES)
    client = daemon.client("zmq", timeout=TIMEOUT)
    ctx: zmq.Context[Any] = zmq.Context()
    e = Env(daemon, daemon.info(), client, ctx)
    try:
        yield e
        e.alive()
    finally:
        client.close()
        ctx.destroy(linger=0)
        assert daemon.stop() == 0


def valid_params(method: str) -> dict[str, Any]:
    """Params that pass validation, so only authentication can refuse the request."""
    out: dict[str, Any] = {}
    for p in METHODS[method].fields:
        if not p.required:
            continue
        if p.choices:
            out[p.name] = p.choices[0]
        elif p.type == "string":
            out[p.name] = "x"
        elif p.type == "integer":
            out[p.name] = int(p.min or 1)
        elif p.type == "number":
            out[p.name] = 1.0
        elif p.type == "boolean":
            out[p.name] = True
        elif p.type == "array":
            out[p.name] = [{"role": "user", "content": "written without the token"}]
        else:
            out[p.name] = {}
    return out


# blocking JSON-RPC connections on both wires


class Tcp:
    def __init__(self, env: Env) -> None:
        self.sock = socket.create_connection(split_endpoint(env.info["jsonrpc_tcp"]),
                                             timeout=TIMEOUT)
        self.reader = FrameReader(max_frame=1 << 30)
        self.pending: list[bytes] = []
        self.n = 0

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self) -> Any:
        while not self.pending:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed by the daemon")
            self.pending += self.reader.feed(data)
        return json.loads(self.pending.pop(0))

    def call(self, method: str, params: Any) -> dict[str, Any]:
        self.n += 1
        self.send_raw(frame(json.dumps({"jsonrpc": "2.0", "id": self.n, "method": method,
                                        "params": params}).encode()))
        reply = self.recv()
        assert reply["id"] == self.n
        return reply

    def closed(self, timeout: float = TIMEOUT) -> bool:
        """True once the daemon closed the connection (EOF or reset) within `timeout`."""
        self.sock.settimeout(timeout)
        try:
            while self.sock.recv(65536):
                pass
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        self.sock.close()


class Ws:
    def __init__(self, env: Env, origin: str | None = None) -> None:
        # the connection is a context manager: entered here, left in close()
        self._stack = ExitStack()
        self.ws = self._stack.enter_context(ws_connect(
            env.info["websocket"], origin=origin,  # type: ignore[arg-type]
            open_timeout=TIMEOUT, max_size=None))
        self.n = 0

    def call(self, method: str, params: Any) -> dict[str, Any]:
        self.n += 1
        self.ws.send(json.dumps({"jsonrpc": "2.0", "id": self.n, "method": method,
                                 "params": params}))
        reply = json.loads(self.ws.recv(TIMEOUT))
        assert reply["id"] == self.n
        return reply

    def closed(self, timeout: float = TIMEOUT) -> bool:
        """True once the daemon closed the connection within `timeout`."""
        try:
            while True:
                self.ws.recv(timeout)
        except ConnectionClosed:
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self._stack.close()


def open_wire(env: Env, wire: str) -> Tcp | Ws:
    return Tcp(env) if wire == "tcp" else Ws(env)


def error_code(reply: dict[str, Any]) -> int | None:
    return reply.get("error", {}).get("code")


# the token


def refused_then_closed(conn: Tcp | Ws, method: str, params: Any) -> dict[str, Any]:
    """Before login: one error reply, then the daemon closes the connection."""
    reply = conn.call(method, params)
    assert conn.closed(), f"{method}: still open after the refusal"
    conn.close()
    return reply


@pytest.mark.parametrize("wire", ["tcp", "websocket"])
def test_every_method_is_refused_before_initialize(env: Env, wire: str) -> None:
    before = env.message_count()
    for method in [*METHODS, "no/such-method"]:
        if method == "initialize":
            continue
        params = valid_params(method) if method in METHODS else {}
        reply = refused_then_closed(open_wire(env, wire), method, params)
        assert error_code(reply) == UNAUTHORIZED, (method, reply)
        assert env.token not in json.dumps(reply)
        # nothing about the daemon's methods for a stranger, known method or not
        assert "session/list" not in json.dumps(reply), reply
        note("-32001 before initialize, then closed")
    # a wrong token changes nothing and ends the connection
    reply = refused_then_closed(open_wire(env, wire), "initialize", {"token": "wrong"})
    assert error_code(reply) == UNAUTHORIZED
    # the right one opens the connection
    conn = open_wire(env, wire)
    try:
        assert conn.call("initialize", {"token": env.token})["result"]["serverName"] == "ctxd"
        assert "sessions" in conn.call("session/list", {})["result"]
    finally:
        conn.close()
    env.alive()  # the refused `shutdown` did not stop it
    assert env.message_count() == before


WRONG_TOKENS: list[Any] = [
    "", " ", "wrong", "\x00", "null", "true", "*",
]


@pytest.mark.parametrize("wire", ["tcp", "websocket"])
def test_wrong_tokens_are_refused(env: Env, wire: str) -> None:
    t = env.token
    near_misses = [t[:-1], t + "x", " " + t, t + "\n", t.swapcase(), t[::-1], t + "\x00", t * 2,
                   t.encode().hex()]
    for token in WRONG_TOKENS + near_misses:
        assert token != t
        reply = refused_then_closed(open_wire(env, wire), "initialize", {"token": token})
        assert error_code(reply) == UNAUTHORIZED, (token, reply)
        assert t not in json.dumps(reply)
        note("wrong string token: -32001, closed")
    # not strings at all: refused as params, and the connection is closed
    for token in (None, 0, 1, True, [t], {"token": t}):
        reply = refused_then_closed(open_wire(env, wire), "initialize", {"token": token})
        assert error_code(reply) in (UNAUTHORIZED, INVALID_PARAMS), (token, reply)
        note(f"token of another type: {error_code(reply)}, closed")


def test_a_lone_surrogate_token_is_refused(env: Env) -> None:
    conn = Tcp(env)
    try:
        conn.send_raw(frame(b'{"jsonrpc":"2.0","id":1,"method":"initialize",'
                            b'"params":{"token":"\\ud800"}}'))
        assert error_code(conn.recv()) in (UNAUTHORIZED, INVALID_PARAMS)
        assert conn.closed()
    finally:
        conn.close()


def zmq_request(env: Env, sock: zmq.Socket[Any], msg: dict[str, Any]) -> dict[str, Any]:
    sock.send(msgpack.packb(msg, use_bin_type=True))
    assert sock.poll(int(TIMEOUT * 1000)), f"no reply to {msg.get('method')}"
    return msgpack.unpackb(sock.recv_multipart()[-1], raw=False, strict_map_key=False)


def test_zmq_needs_the_token_in_every_request(env: Env) -> None:
    before = env.message_count()
    sock = env.ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    secure_client_socket(sock, env.token)  # CURVE over TCP: the socket holds the token's key
    sock.connect(env.info["zmq_router"])
    t = env.token
    try:
        for i, method in enumerate(METHODS):
            base = {"id": i, "method": method, "params": valid_params(method)}
            for token in (None, "", "wrong", t[:-1], t + "x", t.encode(), [t], {"t": t}, 1):
                msg = dict(base) if token is None else {**base, "token": token}
                reply = zmq_request(env, sock, msg)
                assert reply["error"]["code"] == UNAUTHORIZED, (method, token, reply)
                assert t not in json.dumps(reply, default=repr)
                note("missing or wrong token: -32001")
        # a request with the token does not authenticate the socket for later ones
        ok = zmq_request(env, sock, {"id": "a", "method": "session/list", "params": {},
                                     "token": t})
        assert "result" in ok
        again = zmq_request(env, sock, {"id": "b", "method": "session/list", "params": {}})
        assert again["error"]["code"] == UNAUTHORIZED
    finally:
        sock.close(0)
    env.alive()
    assert env.message_count() == before


# private files


def test_connection_file_and_runtime_dir_are_private(env: Env) -> None:
    conn_file = env.daemon.connection_file
    assert stat.S_IMODE(conn_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(env.daemon.runtime_dir.stat().st_mode) == 0o700
    assert conn_file.stat().st_uid == os.getuid()
    # a guessable token would make the file's mode pointless
    assert len(env.token) >= 32
    assert env.token not in str(env.info["data_dir"])


def test_ipc_sockets_live_in_the_private_runtime_dir(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path)
    try:
        info = daemon.info()
        for key in ("zmq_router", "zmq_pub"):
            assert info[key].startswith("ipc://")
            path = Path(info[key].removeprefix("ipc://"))
            # reachable only through the 0700 runtime dir
            assert path.parent == daemon.runtime_dir
        assert stat.S_IMODE(daemon.runtime_dir.stat().st_mode) == 0o700
    finally:
        assert daemon.stop() == 0


def test_the_archive_is_not_readable_by_other_users(env: Env) -> None:
    # the token file is private; the history it guards must be too, whatever the umask
    data_dir = env.daemon.data_dir
    dir_private = stat.S_IMODE(data_dir.stat().st_mode) & 0o077 == 0
    files = [p for p in data_dir.iterdir() if p.name.startswith("ctxd.db")]
    assert files
    files_private = all(stat.S_IMODE(p.stat().st_mode) & 0o077 == 0 for p in files)
    assert dir_private or files_private, {p.name: oct(p.stat().st_mode) for p in files}


# loopback only


def listening_addresses(port: int) -> set[str]:
    """Local addresses with a listening TCP socket on `port`, from /proc/net/tcp{,6}."""
    found: set[str] = set()
    for name in ("tcp", "tcp6"):
        path = Path("/proc/net") / name
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, state = fields[1], fields[3]
            addr_hex, port_hex = local.split(":")
            if state != "0A" or int(port_hex, 16) != port:  # 0A: LISTEN
                continue
            if name == "tcp":
                found.add(socket.inet_ntop(socket.AF_INET, bytes.fromhex(addr_hex)[::-1]))
            else:
                raw = b"".join(bytes.fromhex(addr_hex[i:i + 8])[::-1] for i in range(0, 32, 8))
                found.add(socket.inet_ntop(socket.AF_INET6, raw))
    return found


def other_local_addresses() -> list[str]:
    """This machine's IPv4 addresses outside 127/8 (local routes: traffic stays in the host)."""
    try:
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
    except OSError:
        return []
    out = []
    for prev, line in zip(lines, lines[1:], strict=False):
        if "/32 host LOCAL" in line:
            addr = prev.strip().removeprefix("|-- ")
            if not addr.startswith("127."):
                out.append(addr)
    return sorted(set(out))


def refused(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        try:
            s.connect((host, port))
        except OSError:
            return True
    return False


def test_every_tcp_endpoint_listens_on_127_0_0_1_only(env: Env) -> None:
    endpoints = {k: split_endpoint(env.info[k])
                 for k in ("jsonrpc_tcp", "websocket", "zmq_router", "zmq_pub")}
    assert env.info["zmq_router"].startswith("tcp://")
    for key, (host, port) in endpoints.items():
        assert host == "127.0.0.1", (key, host)
        if Path("/proc/net/tcp").exists():
            assert listening_addresses(port) == {"127.0.0.1"}, (key, listening_addresses(port))
        assert not refused("127.0.0.1", port), key
        # another loopback address and IPv6 loopback do not reach it
        assert refused("127.0.0.2", port), key
        if socket.has_ipv6:
            assert refused("::1", port), key


def test_other_local_addresses_do_not_reach_the_daemon(env: Env) -> None:
    addresses = other_local_addresses()
    if not addresses:
        pytest.skip("this machine has no address outside 127/8")
    for key in ("jsonrpc_tcp", "websocket", "zmq_router", "zmq_pub"):
        _, port = split_endpoint(env.info[key])
        for addr in addresses:
            assert refused(addr, port), (key, addr)


# browsers


def raw_http(env: Env, request: bytes, port: int | None = None) -> bytes:
    """Send one HTTP request; everything the daemon answered until it closed."""
    port = port or split_endpoint(env.info["websocket"])[1]
    out = b""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as s:
        s.sendall(request)
        try:
            while chunk := s.recv(65536):
                out += chunk
                if b"\r\n\r\n" in out and b" 101 " in out.split(b"\r\n", 1)[0]:
                    break  # an upgraded connection stays open: the head is enough
        except (ConnectionResetError, TimeoutError):
            pass
    return out


def closed_without_answer(env: Env, request: bytes) -> bool:
    """The JSON-RPC TCP port closed the connection without sending a byte."""
    with socket.create_connection(split_endpoint(env.info["jsonrpc_tcp"]), timeout=TIMEOUT) as s:
        s.sendall(request)
        try:
            return s.recv(65536) == b""
        except ConnectionResetError:
            return True


def handshake(origin: str | None, host: str = "127.0.0.1") -> bytes:
    lines = [b"GET / HTTP/1.1", b"Host: " + host.encode(), b"Upgrade: websocket",
             b"Connection: Upgrade", b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
             b"Sec-WebSocket-Version: 13"]
    if origin is not None:
        lines.append(b"Origin: " + origin.encode())
    return b"\r\n".join(lines) + b"\r\n\r\n"


def test_foreign_origins_are_refused_at_the_handshake(env: Env) -> None:
    port = split_endpoint(env.info["websocket"])[1]
    foreign = ["http://evil.example", "null", f"http://localhost:{port + 1}",
               f"https://127.0.0.1:{port}", f"http://127.0.0.1.evil.example:{port}",
               f"http://[::1]:{port}", "file://", f"http://127.0.0.1:{port}/"]
    for origin in foreign:
        with pytest.raises(InvalidStatus) as err:
            ws_connect(env.info["websocket"], origin=origin,  # type: ignore[arg-type]
                       open_timeout=TIMEOUT)
        assert err.value.response.status_code == 403, origin
        head = raw_http(env, handshake(origin))
        assert head.startswith(b"HTTP/1.1 403"), (origin, head[:100])
        assert b"access-control-allow-origin" not in head.lower()
        assert env.token.encode() not in head
        note("foreign Origin: HTTP 403")
    # a browser of the daemon's own origin upgrades, then must log in like any client: with
    # the token, or a page key or one-time login of `ctxd ui`; a cookie is no credential
    for origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}"):
        for first in (("session/list", {}), ("initialize", {"token": ""}),
                      ("initialize", {"pageKey": "A" * 43}),
                      ("initialize", {"pageLogin": f"{int(time.time()) + 60}.abc.def"})):
            conn = Ws(env, origin)
            try:
                reply = conn.call(*first)
                assert error_code(reply) == UNAUTHORIZED, (origin, first, reply)
                assert "result" not in reply
            finally:
                conn.close()
            note("own Origin, no page login: -32001")
    for origin in (None,):
        conn = Ws(env, origin)
        try:
            assert conn.call("initialize", {"token": env.token})["result"]["serverName"] == "ctxd"
            response = conn.ws.response
            assert response is not None
            assert "Access-Control-Allow-Origin" not in response.headers
        finally:
            conn.close()
        head = raw_http(env, handshake(origin))
        assert head.startswith(b"HTTP/1.1 101"), (origin, head[:100])
        assert b"access-control-allow-origin" not in head.lower()
        note("own or no Origin: HTTP 101")


def test_plain_http_requests_get_nothing(env: Env) -> None:
    marker = "secret-marker-5f2c"
    sid = env.client.call("session/create", {"title": marker})["sessionId"]
    env.client.call("messages/append", {"sessionId": sid, "messages": [
        {"role": "user", "content": marker}]})
    secrets = [env.token.encode(), marker.encode(), sid.encode(),
               str(env.info["data_dir"]).encode()]
    requests = [
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"GET /session/list HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://evil.example\r\n\r\n",
        b"GET /ctxd.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"OPTIONS / HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://evil.example\r\n"
        b"Access-Control-Request-Method: POST\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 52\r\n\r\n"
        b'{"jsonrpc":"2.0","id":1,"method":"session/list"}   ',
        # an absolute URI has a colon: its request line once passed for a header line
        b"POST http://127.0.0.1:1/ HTTP/1.1\r\nContent-Length: 48\r\n\r\n"
        b'{"jsonrpc":"2.0","id":1,"method":"session/list"}',
    ]
    before = env.message_count()
    for request in requests:
        out = raw_http(env, request)
        assert not out.startswith(b"HTTP/1.1 2") and not out.startswith(b"HTTP/1.1 101"), out
        assert b"access-control-allow-origin" not in out.lower()
        for secret in secrets:
            assert secret not in out, (request, out[:200])
        # the JSON-RPC TCP port closes a connection that starts with an HTTP request line
        assert closed_without_answer(env, request)
        note("no data on either port")
    assert env.message_count() == before
    env.alive()


# injection


def test_plain_search_text_is_never_fts5_syntax(env: Env) -> None:
    sid = env.client.call("session/create", {})["sessionId"]
    texts = {
        "m1": "alpha gamma", "m2": "beta gamma", "m3": "alpha OR beta", "m4": "gamma not alpha",
        "m5": "body alpha", "m6": "delta epsilon",
    }
    ids = env.client.call("messages/append", {"sessionId": sid, "messages": [
        {"role": "user", "content": t} for t in texts.values()]})["messageIds"]
    by_name = dict(zip(texts, ids, strict=True))

    def search(query: str, advanced: bool = False) -> set[str]:
        hits = env.client.call("archive/search", {
            "sessionId": sid, "query": query, "advanced": advanced, "limit": 100})["hits"]
        names = {v: k for k, v in by_name.items()}
        return {names[h["messageId"]] for h in hits}

    # advanced mode shows what the syntax would do, plain mode must not do it
    assert search("alpha OR beta", advanced=True) == {"m1", "m2", "m3", "m4", "m5"}
    assert search('alpha" OR "beta') == {"m3"}  # the words, literally: no OR
    assert search("gamma NOT alpha", advanced=True) == {"m2"}
    assert search("gamma NOT alpha") == {"m4"}
    assert search("body:alpha", advanced=True) == {"m1", "m3", "m4", "m5"}
    assert search("body:alpha") == {"m5"}  # a phrase, not a column filter
    assert search("alph*", advanced=True) == {"m1", "m3", "m4", "m5"}
    assert search("alph*") == set()  # no prefix query
    assert search("NEAR(delta epsilon)", advanced=True) == {"m6"}
    # syntax that would be an error in advanced mode is plain text here
    for query in ['"', "(", "alpha AND", "NEAR(", "*", "-alpha", "^", '"" OR ""', "a:b:c",
                  "rank:1", "{body}:x", "x'; DROP TABLE messages; --"]:
        search(query)  # no error
        with pytest.raises(CtxdError) as err:
            search(query + ' "(', advanced=True)
        assert err.value.code == INVALID_PARAMS
        note("syntax taken literally")


def test_no_sql_is_built_from_user_text(env: Env) -> None:
    db = env.db()
    tables = sorted(r[0] for r in db.execute("SELECT name FROM sqlite_master"))
    db.close()
    evil = "x'; DROP TABLE messages; --"
    sid = env.client.call("session/create", {
        "sessionId": evil, "title": evil, "metadata": {evil: evil}})["sessionId"]
    assert sid == evil
    env.client.call("messages/append", {"sessionId": evil, "clientBatchId": evil,
                                        "messages": [{"role": "user", "content": evil,
                                                      "name": evil}]})
    got = env.client.call("session/get", {"sessionId": evil})
    assert got["session"]["title"] == evil and got["session"]["metadata"] == {evil: evil}
    msgs = env.client.call("archive/read", {"sessionId": evil})["messages"]
    assert [(m["content"], m["name"]) for m in msgs] == [(evil, evil)]
    pin = env.client.call("context/pins/add", {"sessionId": evil, "text": evil})["pin"]
    assert pin["text"] == evil
    hits = env.client.call("archive/search", {"sessionId": evil, "query": "DROP TABLE"})["hits"]
    assert [h["sessionId"] for h in hits] == [evil]
    # a cursor is parsed, never spliced: this one simply pages past everything
    page = env.client.call("session/list", {"cursor": "1:" + evil})
    assert page["sessions"] == []
    db = env.db()
    try:
        assert sorted(r[0] for r in db.execute("SELECT name FROM sqlite_master")) == tables
        assert db.execute("SELECT id FROM sessions WHERE id = ?", (evil,)).fetchone() == (evil,)
        note("stored and returned literally, schema intact")
    finally:
        db.close()


# limits


def test_a_request_above_max_request_bytes(env: Env) -> None:
    before = env.message_count()
    sid = env.client.call("session/create", {})["sessionId"]
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "messages/append", "params": {
        "sessionId": sid, "messages": [{"role": "user", "content": "y" * MAX_REQUEST_BYTES}]}})
    # TCP: refused from the header alone, then closed (the stream cannot be resynchronised)
    conn = Tcp(env)
    try:
        assert conn.call("initialize", {"token": env.token})["result"]
        conn.send_raw(frame(body.encode()))
        assert error_code(conn.recv()) == PAYLOAD_TOO_LARGE
        assert conn.closed()
    finally:
        conn.close()
    # WebSocket: closed with 1009 (message too big)
    ws = Ws(env)
    try:
        assert ws.call("initialize", {"token": env.token})["result"]
        with pytest.raises(ConnectionClosed) as closed:
            ws.ws.send(body)
            ws.ws.recv(TIMEOUT)
        assert closed.value.rcvd is None or closed.value.rcvd.code == 1009
    finally:
        ws.close()
    # ZeroMQ: a typed error
    sock = env.ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    secure_client_socket(sock, env.token)  # CURVE over TCP: the socket holds the token's key
    sock.connect(env.info["zmq_router"])
    try:
        reply = zmq_request(env, sock, {"id": 1, "method": "messages/append", "token": env.token,
                                        "params": json.loads(body)["params"]})
        assert reply["error"]["code"] == PAYLOAD_TOO_LARGE
    finally:
        sock.close(0)
    assert env.client.call("context/status", {"sessionId": sid})["archiveMessages"] == 0
    assert env.message_count() == before
    env.alive()
    note("TCP -32015 then closed, WebSocket closed 1009, ZeroMQ -32015")


@pytest.mark.parametrize("wire", ["zmq", "jsonrpc", "websocket"])
def test_batches_and_messages_above_the_limits_write_nothing(env: Env, wire: str) -> None:
    before = env.message_count()
    with env.daemon.client(wire, timeout=TIMEOUT) as c:  # type: ignore[attr-defined]
        sid = c.call("session/create", {})["sessionId"]

        def refused_with(messages: list[dict[str, Any]]) -> CtxdError:
            with pytest.raises(CtxdError) as err:
                c.call("messages/append", {"sessionId": sid, "messages": messages})
            return err.value

        small = {"role": "user", "content": "small"}
        # one more message than max_batch_messages
        err = refused_with([small] * (MAX_BATCH_MESSAGES + 1))
        assert err.code in (PAYLOAD_TOO_LARGE, INVALID_PARAMS)
        # more than the protocol allows in any batch
        assert refused_with([small] * 10_001).code in (PAYLOAD_TOO_LARGE, INVALID_PARAMS)
        # one oversized message, alone or among small ones: the whole batch is refused
        big = {"role": "tool", "tool_call_id": "c1", "content": "z" * (MAX_MESSAGE_BYTES + 1)}
        err = refused_with([{"role": "user", "content": "z" * (MAX_MESSAGE_BYTES + 1)}])
        assert isinstance(err, PayloadTooLarge) and err.data["index"] == 0
        call = {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
        err = refused_with([small, call, big, small])
        assert isinstance(err, PayloadTooLarge) and err.data["index"] == 2
        assert c.call("context/status", {"sessionId": sid})["archiveMessages"] == 0
        # at the limits, the same batch goes through whole
        ok = c.call("messages/append", {"sessionId": sid, "messages": [small] * MAX_BATCH_MESSAGES})
        assert len(ok["messageIds"]) == MAX_BATCH_MESSAGES
    assert env.message_count() == before + MAX_BATCH_MESSAGES
    note("over a limit: refused whole; at the limit: stored whole")


def test_too_many_connections_are_refused_and_the_others_keep_working(tmp_path: Path) -> None:
    limit = 4
    daemon = start_daemon(tmp_path, max_connections=limit)
    env = Env(daemon, daemon.info(), daemon.client("zmq", timeout=TIMEOUT), zmq.Context())
    tcps: list[Tcp] = []
    wss: list[Ws] = []
    try:
        for _ in range(limit):
            conn = Tcp(env)
            assert conn.call("initialize", {"token": env.token})["result"]
            tcps.append(conn)
        extra = Tcp(env)
        # one error frame saying why, then the daemon closes it
        reply = extra.recv()
        assert error_code(reply) == INTERNAL_ERROR, reply
        assert reply["error"]["data"]["reason"] == "too_many_connections"
        assert extra.closed()
        extra.close()
        for conn in tcps:
            assert "sessions" in conn.call("session/list", {})["result"]

        for _ in range(limit):
            ws = Ws(env)
            assert ws.call("initialize", {"token": env.token})["result"]
            wss.append(ws)
        with pytest.raises(InvalidStatus) as err:
            Ws(env)
        assert err.value.response.status_code == 503
        for ws in wss:
            assert "sessions" in ws.call("session/list", {})["result"]
        env.alive()  # ZeroMQ has no connection table to fill

        # a freed slot can be taken again (once the daemon has seen the close)
        tcps.pop().close()
        deadline = time.monotonic() + TIMEOUT
        while True:
            again = Tcp(env)
            again.send_raw(frame(json.dumps(
                {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                 "params": {"token": env.token}}).encode()))
            if "result" in again.recv():
                break
            again.close()
            assert time.monotonic() < deadline, "the freed slot was never reused"
            time.sleep(0.05)
        tcps.append(again)
        note(f"{limit} kept, extra TCP refused (-32603 too_many_connections), "
             "extra WebSocket HTTP 503, freed slot reused")
    finally:
        for c in (*tcps, *wss):
            c.close()
        env.client.close()
        env.ctx.destroy(linger=0)
        assert daemon.stop() == 0


def test_idle_connections_without_the_token_cannot_lock_clients_out(tmp_path: Path) -> None:
    # loopback TCP is open to every local user: without a deadline for `initialize`, idle
    # sockets without the token could hold every slot of max_connections
    limit = 4
    daemon = start_daemon(tmp_path, max_connections=limit)
    info = daemon.info()
    squatters = [socket.create_connection(split_endpoint(info["jsonrpc_tcp"]), timeout=TIMEOUT)
                 for _ in range(limit)]
    try:
        env = Env(daemon, info, None, zmq.Context())
        deadline = time.monotonic() + 12.0
        while True:
            conn = Tcp(env)
            conn.send_raw(frame(json.dumps(
                {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                 "params": {"token": env.token}}).encode()))
            try:
                reply = conn.recv()
            except ConnectionError:
                reply = {}
            finally:
                conn.close()
            if "result" in reply:
                break
            assert time.monotonic() < deadline, "a client with the token is still locked out"
            time.sleep(0.5)
        env.ctx.destroy(linger=0)
    finally:
        for s in squatters:
            s.close()
        assert daemon.stop() == 0
