"""Fuzzing every wire of one real daemon with malformed and hostile input.

One daemon subprocess serves the whole module. Each property sends generated input on
a fresh connection (JSON-RPC over TCP, WebSocket) or a DEALER socket (ZeroMQ) and checks
the answer against what docs/protocol.md promises: a typed error with the right code,
or a closed connection. After every case the daemon must still be alive, a separate
healthy client must still get correct answers, and the archive (read straight from the
SQLite file, read-only) must hold exactly what it held before: fuzz traffic never writes.

`CTXD_FUZZ_SCALE` multiplies every example count (bench/fuzz_report.py runs with more);
`CTXD_FUZZ_STATS` names a file that receives one JSON line per (test, outcome) count.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import apsw
import msgpack
import pytest
import zmq
from helpers import DaemonProcess
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from outcomes import OutcomeCounts
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from ctxd.daemon.servers.rpc_state import PREAUTH_MAX_FRAME
from ctxd.protocol.codec import FrameReader, check_request, frame
from ctxd.protocol.connection import split_endpoint
from ctxd.protocol.errors import CtxdError
from ctxd.protocol.methods import METHODS

# Small limits so that "too large" cases are cheap to send.
MAX_REQUEST_BYTES = 256 * 1024
MAX_MESSAGE_BYTES = 16 * 1024
MAX_BATCH_MESSAGES = 20
ZMQ_ENVELOPE_SLACK = 64 * 1024  # zmq_server._ENVELOPE_SLACK: libzmq's own size cap above this

TIMEOUT = 10.0
SENTINEL = "sentinel-6b1f"
FUZZ_METHODS = sorted(m for m in METHODS if m != "shutdown")  # shutdown would end the run

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
UNAUTHORIZED = -32001
INVALID_MESSAGE = -32014
PAYLOAD_TOO_LARGE = -32015

SCALE = float(os.environ.get("CTXD_FUZZ_SCALE", "1"))


def fuzz(n: int) -> settings:
    """Bounded, deadline-free examples; no example database written into the repo."""
    return settings(
        max_examples=max(1, int(n * SCALE)),
        deadline=None,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.filter_too_much,
            HealthCheck.data_too_large,
        ],
    )


# outcome counts, for bench/fuzz_report.py

STATS = OutcomeCounts()
note = STATS.note


@pytest.fixture(scope="module", autouse=True)
def _write_stats() -> Iterator[None]:
    yield
    STATS.write()


# the daemon under fuzz, its canary session, and the checks run after every case


class LogDrain:
    """The daemon's log file (`DaemonProcess.log_path`): its size, and its tail for
    failure messages."""

    def __init__(self, daemon: DaemonProcess) -> None:
        self.path = daemon.log_path

    @property
    def bytes(self) -> int:
        return self.path.stat().st_size

    def __str__(self) -> str:
        return "\n".join(self.path.read_text(errors="replace").splitlines()[-200:])


@dataclass
class World:
    daemon: DaemonProcess
    info: dict[str, Any]
    canary: str
    canary_texts: list[str]
    healthy: Any
    db: apsw.Connection
    log: LogDrain
    baseline: tuple[int, int, int] = (0, 0, 0)
    ctx: zmq.Context[Any] = field(default_factory=zmq.Context)

    def counts(self) -> tuple[int, int, int]:
        """Rows of the archive tables, read from the file itself: a partial write shows."""
        return tuple(  # type: ignore[return-value]
            self.db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            for t in ("messages", "batches", "sessions")
        )

    def rebaseline(self) -> None:
        self.baseline = self.counts()

    def check(self, full: bool = False) -> None:
        assert self.daemon.proc is not None and self.daemon.proc.poll() is None, (
            f"daemon died; its log ends with:\n{self.log}")
        assert self.counts() == self.baseline, "fuzz traffic changed the archive"
        status = self.healthy.call("context/status", {"sessionId": self.canary})
        assert status["archiveMessages"] == len(self.canary_texts)
        if full:
            msgs = self.healthy.call("archive/read", {"sessionId": self.canary})["messages"]
            assert [m["content"] for m in msgs] == self.canary_texts

    @property
    def tcp_address(self) -> tuple[str, int]:
        host, port = split_endpoint(self.info["jsonrpc_tcp"])
        return host, int(port)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("fuzzwires")
    config = root / "ctxd.toml"
    config.write_text(
        f"max_request_bytes = {MAX_REQUEST_BYTES}\n"
        f"max_message_bytes = {MAX_MESSAGE_BYTES}\n"
        f"max_batch_messages = {MAX_BATCH_MESSAGES}\n"
    )
    daemon = DaemonProcess(root, "--config", str(config)).start()
    log = LogDrain(daemon)
    healthy = daemon.client("zmq", timeout=TIMEOUT)
    texts = ["canary one", "canary two: 上下文", "canary three"]
    canary = healthy.call("session/create", {"title": "canary"})["sessionId"]
    healthy.call("messages/append", {"sessionId": canary, "messages": [
        {"role": "user", "content": t} for t in texts]})
    db = apsw.Connection(str(daemon.data_dir / "ctxd.db"), flags=apsw.SQLITE_OPEN_READONLY)
    w = World(daemon, daemon.info(), canary, texts, healthy, db, log)
    w.rebaseline()
    try:
        yield w
        w.check(full=True)
    finally:
        healthy.close()
        db.close()
        w.ctx.destroy(linger=0)
        assert daemon.proc is not None and daemon.proc.poll() is None, "daemon died"
        assert daemon.stop() == 0


# JSON-RPC cases: a message and the reply it must get


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


@dataclass(frozen=True)
class Case:
    """One JSON-RPC request (or batch) and the `(id, code)` error replies it must get.

    For a batch the reply is one array of these entries in request order, and no reply
    at all when there are none (only notifications).
    """

    msg: Any
    expect: tuple[tuple[str, int], ...]
    batch: bool = False
    kind: str = ""


JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda kids: st.lists(kids, max_size=4)
    | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=8,
)
ODD_IDS = JSON_VALUES.filter(lambda v: v != SENTINEL)

_TEXT = st.text(max_size=20)
_INTS = st.integers(min_value=-(2**40), max_value=2**40)
_FLOATS = st.floats(allow_nan=False, allow_infinity=False)
# within 64 bits, so that the same values also go out as msgpack
_SCALARS = st.none() | st.booleans() | _INTS | _FLOATS | _TEXT
# an empty array means no params (Lua's empty table); only non-empty ones are refused
_LISTS = st.lists(_SCALARS, min_size=1, max_size=3)
_DICTS = st.dictionaries(st.text(max_size=5), _SCALARS, max_size=3)
# values of a JSON type other than the declared one (null means absent, so never null)
WRONG_TYPE: dict[str, st.SearchStrategy[Any]] = {
    "string": _INTS | _FLOATS | st.booleans() | _LISTS | _DICTS,
    "integer": _TEXT | st.booleans() | _LISTS | _DICTS
    | _FLOATS.filter(lambda f: not f.is_integer()),
    "number": _TEXT | st.booleans() | _LISTS | _DICTS,
    "boolean": _INTS | _FLOATS | _TEXT | _LISTS | _DICTS,
    "object": _INTS | _FLOATS | _TEXT | st.booleans() | _LISTS,
    "array": _INTS | _FLOATS | _TEXT | st.booleans() | _DICTS,
}
TYPED_PARAMS = [(m, p) for m in FUZZ_METHODS for p in METHODS[m].fields if p.type != "any"]
BOUNDED_PARAMS = [
    (m, p) for m, p in TYPED_PARAMS
    if p.choices or (p.type in ("string", "integer") and (p.min or p.max))
]


def valid_params(method: str) -> dict[str, Any]:
    """Params that pass validation (the handler may still refuse them)."""
    out: dict[str, Any] = {}
    for p in METHODS[method].fields:
        if not p.required:
            continue
        if p.choices:
            out[p.name] = p.choices[0]
        elif p.type == "string":
            out[p.name] = "x" * int(max(1, p.min or 0))
        elif p.type == "integer":
            out[p.name] = int(p.min or 1)
        elif p.type == "number":
            out[p.name] = 1.0
        elif p.type == "boolean":
            out[p.name] = True
        elif p.type == "array":
            out[p.name] = [{"role": "user", "content": "must never be stored"}]
        else:
            out[p.name] = {}
    return out


@st.composite
def out_of_range(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    method, p = draw(st.sampled_from(BOUNDED_PARAMS))
    if p.choices:
        value: Any = draw(st.text(max_size=12).filter(lambda s: s not in p.choices))
    elif p.type == "string":
        value = "" if p.min else "y" * (int(p.max or 0) + 1)
        if p.min and p.max and draw(st.booleans()):
            value = "y" * (int(p.max) + 1)
    else:
        # within 64 bits: the same cases go out as msgpack too
        low = (draw(st.integers(min_value=-(2**63), max_value=int(p.min) - 1))
               if p.min is not None else None)
        high = (draw(st.integers(min_value=int(p.max) + 1, max_value=2**63 - 1))
                if p.max is not None else None)
        value = draw(st.sampled_from([v for v in (low, high) if v is not None]))
    return method, {**valid_params(method), p.name: value}


@st.composite
def request_case(draw: st.DrawFn, authenticated: bool) -> tuple[dict[str, Any] | Any, int, bool]:
    """(message, expected code, whether the daemon answers it when it has no id)."""
    kind = draw(st.sampled_from([
        "unknown_method", "array_params", "wrong_type", "unknown_param", "out_of_range",
        "bad_method", "no_method", "bad_params", "not_an_object",
    ] + ([] if authenticated else ["valid_but_unauthenticated"])))
    msg: dict[str, Any] = {"jsonrpc": "2.0"}
    code = INVALID_PARAMS
    answered_without_id = False
    if kind == "unknown_method":
        msg["method"] = draw(st.text(max_size=30).filter(lambda m: m not in METHODS))
        msg["params"] = draw(_DICTS)
        code = METHOD_NOT_FOUND
    elif kind == "array_params":
        msg["method"] = draw(st.sampled_from(FUZZ_METHODS))
        msg["params"] = draw(_LISTS)
    elif kind == "wrong_type":
        method, p = draw(st.sampled_from(TYPED_PARAMS))
        msg["method"] = method
        msg["params"] = {**valid_params(method), p.name: draw(WRONG_TYPE[p.type])}
    elif kind == "unknown_param":
        method = draw(st.sampled_from(FUZZ_METHODS))
        names = METHODS[method].param_names
        msg["method"] = method
        msg["params"] = {**valid_params(method),
                         draw(st.text(max_size=15).filter(lambda n: n not in names)):
                         draw(JSON_VALUES)}
    elif kind == "out_of_range":
        msg["method"], msg["params"] = draw(out_of_range())
    elif kind == "bad_method":
        msg["method"] = draw(_INTS | _FLOATS | st.booleans() | st.none() | _LISTS | _DICTS)
        msg["params"] = {}
        code, answered_without_id = INVALID_REQUEST, True
    elif kind == "no_method":
        msg["params"] = draw(_DICTS)
        code, answered_without_id = INVALID_REQUEST, True
    elif kind == "bad_params":
        msg["method"] = draw(st.sampled_from(FUZZ_METHODS))
        msg["params"] = draw(_INTS | _FLOATS.filter(bool) | _TEXT | st.booleans())
        code, answered_without_id = INVALID_REQUEST, True
    elif kind == "not_an_object":
        # a bare value, as an element of a batch (single messages are always objects here)
        return draw(JSON_SCALARS | _LISTS), INVALID_REQUEST, True
    else:  # a well-formed request to a real method, without the token first
        method = draw(st.sampled_from(FUZZ_METHODS))
        msg["method"] = method
        msg["params"] = valid_params(method)
        if method == "initialize":
            msg["params"]["token"] = draw(st.text(max_size=40))
        code = UNAUTHORIZED
    if draw(st.integers(0, 3)):  # mostly requests; a quarter are notifications
        msg["id"] = draw(ODD_IDS)
    return msg, code, answered_without_id


@st.composite
def jsonrpc_cases(draw: st.DrawFn) -> tuple[bool, Case]:
    authenticated = draw(st.booleans())
    if draw(st.integers(0, 3)) == 0:  # a batch
        n = draw(st.integers(0, 5))
        items = [draw(request_case(authenticated)) for _ in range(n)]
        if not items:
            return authenticated, Case([], ((canonical(None), INVALID_REQUEST),), kind="empty")
        entries = []
        for msg, code, answered_without_id in items:
            has_id = isinstance(msg, dict) and "id" in msg
            if has_id or answered_without_id:
                entries.append((canonical(msg.get("id") if has_id else None), code))
        return authenticated, Case([m for m, _, _ in items], tuple(entries), batch=True,
                                   kind="batch")
    msg, code, answered_without_id = draw(
        request_case(authenticated).filter(lambda c: isinstance(c[0], dict)))
    has_id = "id" in msg
    expect = ((canonical(msg.get("id")), code),) if has_id or answered_without_id else ()
    return authenticated, Case(msg, expect, kind=str(code))


def init_request(token: str, id_: Any = "init") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": "initialize", "params": {"token": token}}


def sentinel_request(world: World) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": SENTINEL, "method": "context/status",
            "params": {"sessionId": world.canary}}


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode("utf-8")


def check_sentinel(world: World, reply: Any, authenticated: bool) -> None:
    """The request after the fuzz case is answered normally on the same connection."""
    assert isinstance(reply, dict) and reply.get("id") == SENTINEL, reply
    if authenticated:
        assert reply["result"]["archiveMessages"] == len(world.canary_texts), reply
    else:
        assert reply["error"]["code"] == UNAUTHORIZED, reply


def check_replies(case: Case, replies: list[Any]) -> str:
    """Compare the replies to a case with what it must get; returns an outcome label."""
    if case.batch:
        if not case.expect:
            assert replies == [], replies
            return "no reply (all notifications)"
        assert len(replies) == 1 and isinstance(replies[0], list), replies
        got = [(canonical(r.get("id")), r["error"]["code"]) for r in replies[0]]
        assert got == list(case.expect), (got, case.expect)
        return "batch: one array of errors in request order"
    got = [(canonical(r.get("id")), r["error"]["code"]) for r in replies]
    assert got == list(case.expect), (got, case.expect)
    return f"error {case.expect[0][1]}" if case.expect else "no reply (notification)"


def preauth_expect(case: Case) -> tuple[str, int]:
    """Before login the one message read gets one error, then the connection closes:
    -32600 for a batch or a malformed request, -32001 for anything but an `initialize`
    request, and for `initialize` what it gets anyway (bad params, wrong token)."""
    if case.batch:
        return canonical(None), INVALID_REQUEST
    msg = case.msg
    try:
        id_, method, _, is_notification = check_request(msg)
    except CtxdError:
        return canonical(msg.get("id") if isinstance(msg, dict) else None), INVALID_REQUEST
    if method != "initialize" or is_notification:
        return canonical(id_), UNAUTHORIZED
    return case.expect[0]


def check_preauth(case: Case, replies: list[Any], closed: bool) -> str:
    assert closed, "the connection stayed open after a message before login"
    got = [(canonical(r.get("id")), r["error"]["code"]) for r in replies]
    expect = preauth_expect(case)
    assert got == [expect], (got, expect)
    return f"before login: error {expect[1]}, closed"


# raw TCP


def tcp_exchange_raw(
    world: World,
    chunks: list[bytes],
    *,
    authenticate: bool,
    half_close: bool = True,
    timeout: float = TIMEOUT,
) -> tuple[list[bytes], bool]:
    """Send raw bytes on a fresh connection; the body of every reply after `initialize`,
    and whether the daemon closed the connection (EOF) within `timeout`."""
    bodies: list[bytes] = []
    reader = FrameReader(max_frame=1 << 30)
    with socket.create_connection(world.tcp_address, timeout=timeout) as s:
        if authenticate:
            s.sendall(frame(dumps(init_request(world.info["token"]))))
            got: list[bytes] = []
            while not got:
                data = s.recv(65536)
                assert data, "closed before answering initialize"
                got = reader.feed(data)
            assert json.loads(got[0])["result"]["serverName"] == "ctxd"
            bodies += got[1:]
        try:
            for chunk in chunks:
                s.sendall(chunk)
            if half_close:
                s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError, OSError):
            # the daemon closed early (ENOTCONN for the half-close): what it said before
            # is still to be read
            pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                data = s.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                return bodies, True
            if not data:
                return bodies, True
            bodies += reader.feed(data)
    return bodies, False


def tcp_exchange(
    world: World, chunks: list[bytes], *, authenticate: bool, half_close: bool = True
) -> tuple[list[Any], bool]:
    bodies, closed = tcp_exchange_raw(world, chunks, authenticate=authenticate,
                                      half_close=half_close)
    return [json.loads(b) for b in bodies], closed


@fuzz(150)
@given(case=jsonrpc_cases())
def test_tcp_requests_of_every_wrong_shape_get_their_code(
    world: World, case: tuple[bool, Case]
) -> None:
    authenticated, c = case
    # before login a frame above the smaller limit is refused for its size alone
    # (test_attacks covers that); the expectations here are for what is read
    assume(authenticated or len(dumps(c.msg)) <= PREAUTH_MAX_FRAME)
    replies, closed = tcp_exchange(
        world, [frame(dumps(c.msg)), frame(dumps(sentinel_request(world)))],
        authenticate=authenticated)
    assert closed, "the daemon did not close after the client's half-close"
    if not authenticated:
        note(check_preauth(c, replies, closed))
        world.check()
        return
    assert replies, "no reply at all"
    check_sentinel(world, replies[-1], authenticated)
    note(check_replies(c, replies[:-1]))
    world.check()


# what the daemon takes for an HTTP request line at the start of a connection
HTTP_REQUEST_LINE = re.compile(rb"[A-Z]{1,16} ")
HEADER_TEXT = st.binary(max_size=60).filter(lambda b: b"\r\n" not in b)


def _int_or_none(value: bytes) -> int | None:
    try:
        return int(value.strip())
    except ValueError:
        return None


@st.composite
def broken_headers(draw: st.DrawFn) -> tuple[bytes, int, str]:
    """A header block the daemon cannot use, with the code it must answer."""
    kind = draw(st.sampled_from(
        ["no_colon", "not_a_number", "negative", "missing", "huge", "endless"]))
    code = PARSE_ERROR
    if kind == "no_colon":
        line = draw(HEADER_TEXT.filter(lambda b: b":" not in b and b != b""))
        lines = draw(st.permutations([b"Content-Length: 2", line]))
        block = b"\r\n".join(lines) + b"\r\n\r\n"
    elif kind == "not_a_number":
        value = draw(HEADER_TEXT.filter(lambda b: _int_or_none(b) is None))
        block = b"Content-Length:" + value + b"\r\n\r\n"
    elif kind == "negative":
        block = b"Content-Length: -%d\r\n\r\n" % draw(st.integers(1, 10**12))
    elif kind == "missing":
        name = draw(st.sampled_from([b"Content-Type", b"Content-Len", b"X", b""]))
        block = name + b": " + draw(HEADER_TEXT) + b"\r\n\r\n"
    elif kind == "huge":
        block = b"Content-Length: %d\r\n\r\n" % draw(
            st.integers(MAX_REQUEST_BYTES + 1, 10**30))
        code = PAYLOAD_TOO_LARGE
    else:  # no end of the header block within the header limit
        junk = draw(st.binary(min_size=8200, max_size=9000)).replace(b"\r", b" ")
        return b"Content-Length: 1" + junk, code, kind
    return block + draw(st.binary(max_size=200)), code, kind


@fuzz(150)
@given(case=broken_headers(), authenticate=st.booleans())
def test_tcp_broken_headers_get_an_error_then_close(
    world: World, case: tuple[bytes, int, str], authenticate: bool
) -> None:
    data, code, kind = case
    # no half-close: the daemon must close the connection by itself
    replies, closed = tcp_exchange(world, [data], authenticate=authenticate, half_close=False)
    assert closed, f"{kind}: connection left open after a broken header"
    if not authenticate and HTTP_REQUEST_LINE.match(data):
        assert replies == [], replies  # taken for an HTTP request: closed without a word
        note("an HTTP request line: closed without an answer")
        world.check()
        return
    assert [(r["id"], r["error"]["code"]) for r in replies] == [(None, code)], replies
    note(f"error {code} then closed")
    world.check()


@st.composite
def truncated_appends(draw: st.DrawFn, session_id: str) -> tuple[bytes, str]:
    """A complete append to the canary, cut short or with a longer declared length."""
    n = draw(st.integers(1, 5))
    body = dumps({"jsonrpc": "2.0", "id": 7, "method": "messages/append", "params": {
        "sessionId": session_id, "messages": [
            {"role": "user", "content": f"truncated {i}"} for i in range(n)]}})
    full = frame(body)
    if draw(st.booleans()):
        return full[: draw(st.integers(1, len(full) - 1))], "cut"
    extra = draw(st.integers(1, MAX_REQUEST_BYTES - len(body)))
    return b"Content-Length: %d\r\n\r\n" % (len(body) + extra) + body, "declared longer"


@fuzz(150)
@given(data=st.data())
def test_tcp_truncated_append_writes_nothing(world: World, data: st.DataObject) -> None:
    chunk, kind = data.draw(truncated_appends(world.canary))
    # the frame never completes: the append must not run, whatever part of it arrived
    replies, closed = tcp_exchange(world, [chunk], authenticate=True)
    assert closed
    assert replies == [], replies
    note(f"{kind}: no reply, closed at EOF")
    world.check()


@fuzz(50)
@given(cuts=st.lists(st.integers(1, 300), min_size=1, max_size=8))
def test_tcp_frames_split_anywhere_are_reassembled(world: World, cuts: list[int]) -> None:
    data = frame(dumps(sentinel_request(world)))
    pieces, start = [], 0
    for cut in sorted(set(cuts)):
        if start < cut < len(data):
            pieces.append(data[start:cut])
            start = cut
    pieces.append(data[start:])
    replies, closed = tcp_exchange(world, pieces, authenticate=True)
    assert closed and len(replies) == 1
    check_sentinel(world, replies[0], authenticated=True)
    note("answered once")


def _json_error(body: bytes | str) -> bool:
    """True when the daemon's decoder (json.loads on the frame as received) refuses it."""
    try:
        json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return True
    return False


GOOD_BODY = dumps({"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {}})


@st.composite
def garbage_bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["bytes", "text", "mutated", "cut"]))
    if kind == "bytes":
        body = draw(st.binary(max_size=300))
    elif kind == "text":
        body = draw(st.text(max_size=100)).encode("utf-8")
    elif kind == "mutated":
        i = draw(st.integers(0, len(GOOD_BODY)))
        body = GOOD_BODY[:i] + draw(st.binary(min_size=1, max_size=4)) + GOOD_BODY[i:]
    else:
        body = GOOD_BODY[: draw(st.integers(0, len(GOOD_BODY) - 1))]
    assume(_json_error(body))
    return body


@fuzz(150)
@given(bodies=st.lists(garbage_bodies(), min_size=1, max_size=4), authenticate=st.booleans())
def test_tcp_invalid_json_gets_parse_errors_and_the_connection_lives(
    world: World, bodies: list[bytes], authenticate: bool
) -> None:
    chunks = [frame(b) for b in bodies] + [frame(dumps(sentinel_request(world)))]
    replies, closed = tcp_exchange(world, chunks, authenticate=authenticate)
    assert closed and replies
    if not authenticate:
        # before login the first bad message ends the connection
        assert [(r["id"], r["error"]["code"]) for r in replies] == [(None, PARSE_ERROR)]
        note("before login: error -32700, closed")
        world.check()
        return
    check_sentinel(world, replies[-1], authenticate)
    assert [(r["id"], r["error"]["code"]) for r in replies[:-1]] == [(None, PARSE_ERROR)] * len(
        bodies), replies
    note("error -32700 per frame, connection kept")
    world.check()


# WebSocket


@contextmanager
def ws_open(world: World, authenticate: bool) -> Iterator[Any]:
    with ws_connect(world.info["websocket"], open_timeout=TIMEOUT, close_timeout=2,
                    max_size=None) as ws:
        if authenticate:
            ws.send(dumps(init_request(world.info["token"])).decode())
            assert json.loads(ws.recv(TIMEOUT))["result"]["serverName"] == "ctxd"
        yield ws


def ws_until_closed(ws: Any) -> tuple[list[Any], bool]:
    """Every reply until the daemon closes the connection, and whether it did."""
    replies: list[Any] = []
    try:
        while True:
            replies.append(json.loads(ws.recv(TIMEOUT)))
    except ConnectionClosed:
        return replies, True
    except TimeoutError:
        return replies, False


def ws_until_sentinel(ws: Any) -> list[Any]:
    replies: list[Any] = []
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        reply = json.loads(ws.recv(TIMEOUT))
        replies.append(reply)
        if isinstance(reply, dict) and reply.get("id") == SENTINEL:
            return replies
    raise AssertionError(f"no sentinel reply; got {replies}")


@fuzz(150)
@given(case=jsonrpc_cases())
def test_ws_requests_of_every_wrong_shape_get_their_code(
    world: World, case: tuple[bool, Case]
) -> None:
    authenticated, c = case
    # before login a frame above the smaller limit is refused for its size alone
    # (test_attacks covers that); the expectations here are for what is read
    assume(authenticated or len(dumps(c.msg)) <= PREAUTH_MAX_FRAME)
    with ws_open(world, authenticated) as ws:
        ws.send(dumps(c.msg).decode())
        if not authenticated:
            replies, closed = ws_until_closed(ws)
            note(check_preauth(c, replies, closed))
            world.check()
            return
        ws.send(dumps(sentinel_request(world)).decode())
        replies = ws_until_sentinel(ws)
    check_sentinel(world, replies[-1], authenticated)
    note(check_replies(c, replies[:-1]))
    world.check()


@fuzz(150)
@given(frames=st.lists(st.binary(max_size=300) | st.text(max_size=200), min_size=1,
                       max_size=4),
       authenticate=st.booleans())
def test_ws_garbage_text_and_binary_frames_get_parse_errors(
    world: World, frames: list[bytes | str], authenticate: bool
) -> None:
    assume(all(_json_error(f) for f in frames))
    with ws_open(world, authenticate) as ws:
        if not authenticate:
            ws.send(frames[0])
            replies, closed = ws_until_closed(ws)
            assert closed
            assert [(r["id"], r["error"]["code"]) for r in replies] == [(None, PARSE_ERROR)]
            note("before login: error -32700, closed")
            world.check()
            return
        for f in frames:
            ws.send(f)  # str: a text frame, bytes: a binary frame
        ws.send(dumps(sentinel_request(world)).decode())
        replies = ws_until_sentinel(ws)
    check_sentinel(world, replies[-1], authenticate)
    assert [(r["id"], r["error"]["code"]) for r in replies[:-1]] == [(None, PARSE_ERROR)] * len(
        frames), replies
    note("error -32700 per frame, connection kept")
    world.check()


def http_exchange(world: World, data: bytes, *, half_close: bool) -> tuple[bytes, bool]:
    """Raw bytes to the WebSocket port; what came back and whether the daemon closed."""
    host, port = split_endpoint(world.info["websocket"])
    out = b""
    with socket.create_connection((host, int(port)), timeout=TIMEOUT) as s:
        try:
            s.sendall(data)
            if half_close:
                s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            while chunk := s.recv(65536):
                out += chunk
        except ConnectionResetError:
            pass
        except TimeoutError:
            return out, False
    return out, True


# header lines, some of a real handshake; the key is never valid, so no request upgrades
HEADER_LINE = st.one_of(
    HEADER_TEXT,
    st.sampled_from([b"Host: 127.0.0.1", b"Upgrade: websocket", b"Connection: Upgrade",
                     b"Sec-WebSocket-Version: 13", b"Sec-WebSocket-Key: not a key",
                     b"Sec-WebSocket-Version: 99", b"Origin: http://evil.example",
                     b"Content-Length: 99999999999"]),
)
HTTP_REQUESTS = st.builds(
    lambda method, path, lines: method + b" /" + path + b" HTTP/1.1\r\n"
    + b"".join(line + b"\r\n" for line in lines) + b"\r\n",
    st.sampled_from([b"GET", b"POST", b"OPTIONS", b"PUT", b"\xff\xfe"]),
    st.binary(max_size=30).filter(lambda b: b" " not in b and b"\r" not in b and b"\n" not in b),
    st.lists(HEADER_LINE, max_size=6),
)


def http_status(out: bytes) -> str:
    return out.split(b"\r\n", 1)[0].decode(errors="replace")


@fuzz(100)
@given(data=st.binary(max_size=2000))
def test_ws_port_garbage_bytes_are_dropped(world: World, data: bytes) -> None:
    out, closed = http_exchange(world, data, half_close=True)
    assert closed, "the WebSocket port kept a garbage connection open"
    # either nothing, or an HTTP error status: never an upgrade, never the token
    assert out == b"" or out.startswith(b"HTTP/1.1 4"), out[:200]
    assert world.info["token"].encode() not in out
    note(http_status(out) if out else "closed without answer")
    world.check()


@fuzz(100)
@given(data=HTTP_REQUESTS)
def test_ws_port_malformed_handshakes_get_http_errors(world: World, data: bytes) -> None:
    # complete requests (no half-close): the daemon must answer and close by itself
    out, closed = http_exchange(world, data, half_close=False)
    assert closed, f"no answer and no close for {data!r}"
    status = http_status(out)
    # never an upgrade: without a valid Sec-WebSocket-Key no request here is a handshake
    assert out == b"" or status.startswith(("HTTP/1.1 4", "HTTP/1.1 5")), out[:300]
    assert world.info["token"].encode() not in out
    assert b"access-control-allow-origin" not in out.lower()
    note(status or "closed without answer")
    world.check()


def test_refused_handshakes_cost_a_bounded_log(world: World) -> None:
    # every refused handshake is logged with a traceback: a local process can grow the log,
    # but only by a bounded amount per connection it opens
    n = 20
    before = world.log.bytes
    for i in range(n):
        http_exchange(world, b"GET /%d HTTP/1.1\r\nHost: x\r\n\r\n" % i, half_close=True)
    world.check()  # a round trip: the log lines of the refusals are written by now
    deadline = time.monotonic() + 2
    while world.log.bytes == before and time.monotonic() < deadline:
        time.sleep(0.05)
    per_connection = (world.log.bytes - before) / n
    assert per_connection < 8192, f"{per_connection:.0f} log bytes per refused handshake"
    note(f"{per_connection:.0f} log bytes per refused connection")


def test_ws_frame_above_the_limit_closes_only_that_connection(world: World) -> None:
    with ws_open(world, True) as other, ws_open(world, True) as ws:
        ws.send("[" + " " * MAX_REQUEST_BYTES + "]")
        with pytest.raises(ConnectionClosed) as err:
            ws.recv(TIMEOUT)
        assert err.value.rcvd is not None and err.value.rcvd.code == 1009
        other.send(dumps(sentinel_request(world)).decode())
        check_sentinel(world, json.loads(other.recv(TIMEOUT)), True)
    note("closed 1009, others served")
    world.check(full=True)


# ZeroMQ


def zmq_call(world: World, sock: zmq.Socket[Any], frames: list[bytes]) -> list[bytes] | None:
    sock.send_multipart(frames)
    if not sock.poll(int(TIMEOUT * 1000)):
        return None
    return sock.recv_multipart()


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def packb(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


@pytest.fixture(scope="module")
def dealer(world: World) -> Iterator[zmq.Socket[Any]]:
    sock = world.ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(world.info["zmq_router"])
    yield sock
    sock.close(0)


MSGPACK_SCALARS = (
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats() | st.text(max_size=20) | st.binary(max_size=20)
)
MSGPACK_VALUES = st.recursive(
    MSGPACK_SCALARS,
    lambda kids: st.lists(kids, max_size=4)
    | st.dictionaries(st.text(max_size=8) | st.integers(-5, 5), kids, max_size=4),
    max_leaves=8,
)


def zmq_expected(value: Any, token: str) -> int | None:
    """The code the ROUTER answers a decoded body with, before the handler; None: valid."""
    if not isinstance(value, dict):
        return INVALID_REQUEST
    method = value.get("method")
    if not isinstance(method, str) or not method:
        return INVALID_REQUEST
    if value.get("params") is not None and not isinstance(value["params"], dict | list):
        return INVALID_REQUEST
    if value.get("token") != token:
        return UNAUTHORIZED
    return None


def same_id(sent: Any, got: Any) -> bool:
    if isinstance(sent, float) and math.isnan(sent):
        return isinstance(got, float) and math.isnan(got)
    return packb(sent) == packb(got)


@fuzz(150)
@given(body=st.binary(max_size=300) | MSGPACK_VALUES.map(packb).map(lambda b: b[:-1]))
def test_zmq_frames_that_are_not_msgpack_requests_get_typed_errors(
    world: World, dealer: zmq.Socket[Any], body: bytes
) -> None:
    try:
        value = unpack(body)
        code = zmq_expected(value, world.info["token"])
    except Exception:
        code = PARSE_ERROR
    if body == b"":
        code = INVALID_REQUEST  # an empty frame is a routing delimiter: no body follows it
    assume(code is not None)
    reply = zmq_call(world, dealer, [body])
    assert reply is not None, "no reply"
    err = unpack(reply[-1])["error"]
    assert err["code"] == code, (err, body)
    note(f"error {code}")
    world.check()


@st.composite
def zmq_cases(draw: st.DrawFn, token: str) -> tuple[Any, int]:
    kind = draw(st.sampled_from([
        "not_a_map", "no_method", "bad_method", "bad_params", "no_token", "wrong_token",
        "unknown_method", "array_params", "wrong_type", "unknown_param", "out_of_range",
    ]))
    msg: dict[Any, Any] = {}
    if draw(st.booleans()):
        msg["id"] = draw(MSGPACK_VALUES)
    good_token = token if draw(st.booleans()) else draw(MSGPACK_VALUES)
    if kind == "not_a_map":
        return draw(MSGPACK_VALUES.filter(lambda v: not isinstance(v, dict))), INVALID_REQUEST
    if kind == "no_method":
        msg.update(params={}, token=good_token)
        return msg, INVALID_REQUEST
    if kind == "bad_method":
        msg.update(method=draw(MSGPACK_VALUES.filter(lambda v: not isinstance(v, str) or not v)),
                   params={}, token=good_token)
        return msg, INVALID_REQUEST
    method = draw(st.sampled_from(FUZZ_METHODS))
    if kind == "bad_params":
        msg.update(method=method, token=good_token, params=draw(
            MSGPACK_SCALARS.filter(lambda v: v is not None)))
        return msg, INVALID_REQUEST
    msg["token"] = token
    code = INVALID_PARAMS
    if kind in ("no_token", "wrong_token"):
        msg.update(method=method, params=valid_params(method))
        if kind == "no_token":
            del msg["token"]
        else:
            msg["token"] = draw(MSGPACK_VALUES.filter(lambda v: v != token))
        code = UNAUTHORIZED
    elif kind == "unknown_method":
        msg.update(method=draw(st.text(min_size=1, max_size=30).filter(
            lambda m: m not in METHODS)), params={})
        code = METHOD_NOT_FOUND
    elif kind == "array_params":
        msg.update(method=method, params=draw(st.lists(MSGPACK_SCALARS, min_size=1, max_size=3)))
    elif kind == "wrong_type":
        method, p = draw(st.sampled_from(TYPED_PARAMS))
        wrong = WRONG_TYPE[p.type] | (st.binary(max_size=8) if p.type == "string" else st.nothing())
        msg.update(method=method, params={**valid_params(method), p.name: draw(wrong)})
    elif kind == "unknown_param":
        names = METHODS[method].param_names
        msg.update(method=method, params={
            **valid_params(method),
            draw(st.text(max_size=15).filter(lambda n: n not in names)): draw(MSGPACK_VALUES)})
    else:
        msg["method"], msg["params"] = draw(out_of_range())
    return msg, code


@fuzz(200)
@given(data=st.data())
def test_zmq_requests_of_every_wrong_shape_get_their_code(
    world: World, dealer: zmq.Socket[Any], data: st.DataObject
) -> None:
    msg, code = data.draw(zmq_cases(world.info["token"]))
    reply = zmq_call(world, dealer, [packb(msg)])
    assert reply is not None, "no reply"
    got = unpack(reply[-1])
    assert got["error"]["code"] == code, (got, msg)
    sent_id = msg.get("id") if isinstance(msg, dict) else None
    assert same_id(sent_id, got["id"]), (sent_id, got["id"])
    note(f"error {code}")
    world.check()


def split_envelope(frames: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    """What the ROUTER makes of `[identity, *frames]`: extra routing frames, then the body."""
    for i, f in enumerate(frames):
        if not f:
            return frames[: i + 1], frames[i + 1:]
    return [], frames


@fuzz(100)
@given(data=st.data())
def test_zmq_missing_and_extra_frames(
    world: World, dealer: zmq.Socket[Any], data: st.DataObject
) -> None:
    good = packb({"id": "ok", "method": "tools/list", "params": {},
                  "token": world.info["token"]})
    part = st.sampled_from([b"", good]) | st.binary(min_size=1, max_size=40)
    frames = data.draw(st.lists(part, min_size=1, max_size=5))
    routing, body = split_envelope(frames)
    reply = zmq_call(world, dealer, frames)
    assert reply is not None, "no reply"
    # the reply comes back with the same routing frames, as a proxy in between expects
    assert reply[:-1] == routing, (frames, reply)
    got = unpack(reply[-1])
    if len(body) != 1:
        assert got["error"]["code"] == INVALID_REQUEST, got
        outcome = "error -32600"
    elif body[0] == good:
        assert got["id"] == "ok" and got["result"]["tools"], got
        outcome = "served behind extra routing frames"
    else:
        assert "error" in got and got["error"]["code"] in (
            PARSE_ERROR, INVALID_REQUEST, UNAUTHORIZED), got
        outcome = f"error {got['error']['code']}"
    note(outcome)
    world.check()


def test_zmq_huge_frames(world: World, dealer: zmq.Socket[Any]) -> None:
    # above the request limit but within libzmq's cap: a typed error
    reply = zmq_call(world, dealer, [b"\x00" * (MAX_REQUEST_BYTES + 1)])
    assert reply is not None and unpack(reply[-1])["error"]["code"] == PAYLOAD_TOO_LARGE
    # above libzmq's cap: the peer's connection is dropped without a reply
    big = world.ctx.socket(zmq.DEALER)
    big.setsockopt(zmq.LINGER, 0)
    big.connect(world.info["zmq_router"])
    try:
        big.send(b"\x00" * (MAX_REQUEST_BYTES + ZMQ_ENVELOPE_SLACK + 1))
        assert not big.poll(1000)
    finally:
        big.close(0)
    note("error -32015 within the cap, dropped above it")
    world.check(full=True)


# explicit cases the generators do not reach


@pytest.mark.parametrize("wire", ["tcp", "websocket"])
def test_deeply_nested_json_gets_a_parse_error_and_keeps_the_connection(
    world: World, wire: str
) -> None:
    # Python's decoder raises RecursionError, not ValueError, on deep nesting
    deep = b"[" * 100_000
    if wire == "tcp":
        replies, closed = tcp_exchange(
            world, [frame(deep), frame(dumps(sentinel_request(world)))], authenticate=True)
        world.check()
        assert replies, "connection closed without any error reply"
        assert replies[0]["error"]["code"] in (PARSE_ERROR, INVALID_REQUEST)
        check_sentinel(world, replies[-1], True)
        assert closed
    else:
        with ws_open(world, True) as ws:
            ws.send(deep.decode())
            ws.send(dumps(sentinel_request(world)).decode())
            try:
                replies = ws_until_sentinel(ws)
            finally:
                world.check()
        assert replies[0]["error"]["code"] in (PARSE_ERROR, INVALID_REQUEST)
    note(f"{wire}: error {replies[0]['error']['code']}, connection kept")


def test_deeply_nested_msgpack_gets_a_parse_error(
    world: World, dealer: zmq.Socket[Any]
) -> None:
    reply = zmq_call(world, dealer, [b"\x91" * 100_000])  # 100000 nested one-item arrays
    assert reply is not None and unpack(reply[-1])["error"]["code"] == PARSE_ERROR
    world.check()
    note("error -32700")


def test_lone_surrogates_get_typed_errors(world: World) -> None:
    # "\\ud800" is a valid JSON escape, but the text it makes cannot be encoded as UTF-8
    sid = world.healthy.call("session/create", {"title": "surrogates"})["sessionId"].encode()
    world.rebaseline()
    requests = [
        # (request as raw JSON text, the error codes that would be right; None: a result)
        (b'{"jsonrpc":"2.0","id":1,"method":"messages/append","params":{"sessionId":"'
         + sid + b'","messages":[{"role":"user","content":"a\\ud800b"}]}}',
         {None, INVALID_MESSAGE, INVALID_PARAMS}),
        (b'{"jsonrpc":"2.0","id":2,"method":"session/create","params":{"sessionId":"\\udc80"}}',
         {INVALID_PARAMS}),
        (b'{"jsonrpc":"2.0","id":3,"method":"archive/search","params":{"query":"\\ud800"}}',
         {None, INVALID_PARAMS}),
    ]
    replies, closed = tcp_exchange(world, [frame(b) for b, _ in requests], authenticate=True)
    world.rebaseline()  # an append that stores the text whole is a correct outcome too
    world.check()
    assert closed and len(replies) == len(requests)
    by_id = {r["id"]: r for r in replies}
    for i, (_, codes) in enumerate(requests, start=1):
        assert by_id[i].get("error", {}).get("code") in codes, by_id[i]
    replies, _ = tcp_exchange(world, [frame(
        b'{"jsonrpc":"2.0","id":4,"method":"initialize","params":{"token":"\\ud800"}}')],
        authenticate=False)
    # refused either way: as a malformed parameter or as a wrong token
    assert replies[0]["error"]["code"] in (INVALID_PARAMS, UNAUTHORIZED), replies
    codes = [by_id[i].get("error", {}).get("code", "result") for i in (1, 2, 3)]
    note(f"append {codes[0]}, session/create {codes[1]}, search {codes[2]}, "
         f"initialize {replies[0]['error']['code']}")


def test_deeply_nested_metadata_over_zmq_is_an_invalid_message(
    world: World, dealer: zmq.Socket[Any]
) -> None:
    # msgpack decodes 1000 levels; encoding the message body as JSON recurses deeper
    meta: dict[str, Any] = {}
    cur = meta
    for _ in range(1000):
        cur["a"] = {}
        cur = cur["a"]
    reply = zmq_call(world, dealer, [packb({
        "id": 1, "method": "messages/append", "token": world.info["token"],
        "params": {"sessionId": world.canary, "messages": [
            {"role": "user", "content": "deep", "metadata": meta}]}})])
    world.check()
    assert reply is not None
    code = unpack(reply[-1])["error"]["code"]
    assert code in (INVALID_MESSAGE, PAYLOAD_TOO_LARGE)
    note(f"error {code}")


def test_values_stored_over_zmq_read_back_as_strict_json(
    world: World, dealer: zmq.Socket[Any]
) -> None:
    # msgpack carries NaN and Infinity; JSON has neither, and browsers refuse the tokens
    sid = world.healthy.call("session/create", {"title": "non-finite"})["sessionId"]
    frames = zmq_call(world, dealer, [packb({
        "id": 1, "method": "messages/append", "token": world.info["token"],
        "params": {"sessionId": sid, "messages": [{
            "role": "user", "content": "x",
            "metadata": {"v": float("nan"), "w": float("inf")}}]}})])
    world.rebaseline()
    assert frames is not None
    reply = unpack(frames[-1])
    if "error" in reply:
        # refusing non-finite numbers is a correct outcome too
        assert reply["error"]["code"] in (INVALID_MESSAGE, INVALID_PARAMS)
        note(f"append refused with {reply['error']['code']}")
        return
    bodies, _ = tcp_exchange_raw(world, [frame(dumps({
        "jsonrpc": "2.0", "id": 1, "method": "archive/read", "params": {"sessionId": sid}}))],
        authenticate=True)

    # what a strict parser makes of the reply: JSON has no NaN or Infinity
    msgs = strict_json(bodies[0])["result"]["messages"]
    assert [m["content"] for m in msgs] == ["x"]
    note("stored, read back as strict JSON")


def strict_json(body: bytes) -> Any:
    """Parse as JSON parsers outside Python do: NaN and Infinity are not JSON."""

    def refuse(token: str) -> Any:
        raise ValueError(f"not JSON: {token}")

    return json.loads(body, parse_constant=refuse)


def test_session_metadata_stored_over_zmq_reads_back_as_strict_json(
    world: World, dealer: zmq.Socket[Any]
) -> None:
    sid = "non-finite-metadata"
    frames = zmq_call(world, dealer, [packb({
        "id": 1, "method": "session/create", "token": world.info["token"],
        "params": {"sessionId": sid, "metadata": {"v": float("nan"), "w": float("-inf")}}})])
    world.rebaseline()
    assert frames is not None
    reply = unpack(frames[-1])
    if "error" in reply:
        assert reply["error"]["code"] == INVALID_PARAMS  # refusing them is correct too
        return
    bodies, _ = tcp_exchange_raw(world, [frame(dumps({
        "jsonrpc": "2.0", "id": 1, "method": "session/get", "params": {"sessionId": sid}}))],
        authenticate=True)
    strict_json(bodies[0])


def test_non_json_number_tokens_get_a_parse_error(world: World) -> None:
    bodies, _ = tcp_exchange_raw(world, [
        frame(b'{"jsonrpc":"2.0","id":NaN,"method":"tools/list","params":{}}'),
        frame(b'{"jsonrpc":"2.0","id":1,"method":"archive/search",'
              b'"params":{"query":"x","since":-Infinity}}'),
    ], authenticate=True)
    world.check()
    replies = [strict_json(b) for b in bodies]
    assert [r.get("error", {}).get("code") for r in replies] == [PARSE_ERROR, PARSE_ERROR]


def test_daemon_survived_and_archive_is_intact(world: World) -> None:
    world.check(full=True)
    note("alive, archive unchanged")
