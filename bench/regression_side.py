"""One side of bench/bench_regression.py: ctxd of one revision, measured in its own process.

    python -m bench.regression_side        (started by bench_regression, not by hand)

bench_regression starts one of these per revision, each with the interpreter whose
`ctxd` is that revision, and the current tree's root on PYTHONPATH for `bench.workload`
and `bench.peers`. It reads one JSON command a line on stdin and answers one JSON line on
stdout, so the two sides can be driven in turn (before, after, before, ...):

    {"cmd": "begin", "root": DIR, "preload": N}              a data dir, one session
    {"cmd": "fill", "messages": N, "batch": B}               the next N messages of it
    {"cmd": "finish"}                                        compact, start the daemon
    {"cmd": "round", "turns": [...], ...}                    one round of every measure
    {"cmd": "close"}

Everything here must work against both revisions, so it uses only what both have: the
Engine as a library (create_session, append, get_context, compact,
auto_compaction_due), the Python client's create_session/append/context_get, the
connection file and the two wires' envelopes. bench_turn's plain clients cannot be
imported here (that module imports the current login's proof helpers), so the two
plain clients below are their minimal form, with the login each daemon accepts.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import shutil
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import msgspec
import zmq

from bench.peers import Daemon
from bench.workload import turns
from ctxd.clients.client import connect
from ctxd.daemon.config import Config
from ctxd.daemon.engine import Engine
from ctxd.protocol.codec import FrameReader, dumps_json, frame, loads_json


class ZmqPlain:
    """A blocking DEALER packing each request itself: the daemon's cost, no client's."""

    def __init__(self, endpoint: str, token: str) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.connect(endpoint)
        self.token = token
        self.n = 0

    def call(self, method: str, params: dict[str, Any]) -> Any:
        self.n += 1
        msg = {"id": self.n, "method": method, "params": params, "token": self.token}
        self.sock.send_multipart([b"", msgpack.packb(msg, use_bin_type=True)])
        reply = msgpack.unpackb(self.sock.recv_multipart()[-1], raw=False)
        if "result" not in reply:
            raise RuntimeError(f"{method}: {reply}")
        return reply["result"]

    def close(self) -> None:
        self.sock.close(linger=0)


class TcpPlain:
    """A blocking socket sending Content-Length frames of JSON-RPC."""

    def __init__(self, address: str, token: str) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host.strip("[]"), int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = FrameReader()
        self.n = 0
        self.call("initialize", login_params(token))

    def call(self, method: str, params: dict[str, Any]) -> Any:
        self.n += 1
        req = {"jsonrpc": "2.0", "id": self.n, "method": method, "params": params}
        self.sock.sendall(frame(dumps_json(req)))
        while True:
            bodies = self.reader.feed(self.sock.recv(1 << 20))
            if bodies:
                reply = loads_json(bodies[0])
                if "result" not in reply:
                    raise RuntimeError(f"{method}: {reply}")
                return reply["result"]

    def close(self) -> None:
        self.sock.close()


def login_params(token: str) -> dict[str, Any]:
    """`initialize` as this revision's daemon takes it: a nonce and a proof of the token
    where the protocol has them, the token itself before."""
    if importlib.util.find_spec("ctxd.protocol.auth") is None:
        return {"token": token}
    from ctxd.protocol import auth

    nonce = auth.new_nonce()
    return {"nonce": nonce, "proof": auth.client_proof(token, nonce)}


def big_config(data: Path) -> Config:
    config = Config(data_dir=data)
    # re-derivation would summarize the whole archive again every few compactions (the
    # daemons get CTXD_REDERIVE_AFTER=0 from bench_regression for the same reason)
    if hasattr(config.compaction, "rederive_after"):
        config.compaction.rederive_after = 0
    return config


def tagged(turn: list[dict[str, Any]], tag: str) -> list[dict[str, Any]]:
    """The turn with its tool call ids made unique to `tag`: several ways append the same
    turns to one session."""
    out = []
    for m in turn:
        m = dict(m)
        if "tool_call_id" in m:
            m["tool_call_id"] = f"{m['tool_call_id']}-{tag}"
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "id": f"{c['id']}-{tag}"} for c in m["tool_calls"]]
        out.append(m)
    return out


def timed(fn: Callable[[], Any], n: int, warmup: int = 10) -> list[float]:
    """Seconds of each of `n` calls, after `warmup` untimed ones."""
    for _ in range(min(warmup, n)):
        fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


class Side:
    def __init__(self) -> None:
        self.runner = asyncio.Runner()
        self.daemon: Daemon | None = None
        self.closers: list[Callable[[], Any]] = []

    def begin(self, root: str, preload: int) -> dict[str, Any]:
        """A data dir with one session, to be filled by `fill` with `preload` messages."""
        self.root = Path(root)
        self.data = self.root / "daemon" / "data"
        self.data.mkdir(parents=True)
        self.filler = Engine(big_config(self.data))
        self.closers.append(self.filler.close)
        # wire form: a dict on every revision compared
        self.big_sid = msgspec.to_builtins(self.filler.create_session(title="archive"))[
            "sessionId"]
        self.source = turns(preload, seed=301)
        return {}

    def fill(self, messages: int, batch: int) -> dict[str, Any]:
        """About `messages` more messages appended to the session, whole turns in batches
        of about `batch`, compacting when due after each batch so the context stays
        bounded (as the daemon's scheduler would). Timed apart: the appends (wall and
        CPU) and each compaction (wall)."""
        totals = [0, 0.0, 0.0]  # messages, wall, CPU seconds
        compactions: list[float] = []
        pending: list[dict[str, Any]] = []

        def append(batch: list[dict[str, Any]]) -> None:
            t0, c0 = time.perf_counter(), time.process_time()
            self.filler.append(self.big_sid, batch)
            totals[1] += time.perf_counter() - t0
            totals[2] += time.process_time() - c0
            totals[0] += len(batch)
            if self.filler.auto_compaction_due(self.big_sid):
                t0 = time.perf_counter()
                self.runner.run(self.filler.compact(self.big_sid, trigger="auto"))
                compactions.append(time.perf_counter() - t0)

        for t in self.source:
            pending.extend(t)
            if len(pending) >= batch or totals[0] + len(pending) >= messages:
                append(pending)
                pending = []
                if totals[0] >= messages:
                    break
        if pending:  # the source ran out
            append(pending)
        done, wall, cpu = totals
        return {"bulk inproc": [done, wall, cpu], "compact inproc": compactions}

    def finish(self) -> dict[str, Any]:
        """The context brought down by a forced compaction, then the daemon started on
        the filled data dir and the in-process reader on a copy of it."""
        self.runner.run(self.filler.compact(self.big_sid, force=True))
        self.filler.close()
        self.closers.remove(self.filler.close)
        # the in-process reads get a copy: the daemon owns its data dir, and both read the
        # same archive and context
        shutil.copytree(self.data, self.root / "copy")
        self.daemon = Daemon(self.root / "daemon").start(timeout=120)
        self.closers.append(self.daemon.stop)
        info = json.loads(self.daemon.connection_file.read_text())
        self.big = Engine(big_config(self.root / "copy"))
        self.closers.append(self.big.close)
        self.engine = Engine(Config(data_dir=self.root / "append"))
        self.closers.append(self.engine.close)
        self.clients = {w: connect(connection_file=self.daemon.connection_file, wire=w)
                        for w in ("zmq", "jsonrpc")}
        for c in self.clients.values():
            self.closers.append(c.close)
        self.status_sid = self.clients["zmq"].create_session(title="status")["sessionId"]
        self.zmq = ZmqPlain(info["zmq_router"], info["token"])
        self.tcp = TcpPlain(info["jsonrpc_tcp"], info["token"])
        self.closers += [self.zmq.close, self.tcp.close]
        status = self.big.get_context(self.big_sid)
        if not isinstance(status, dict):  # a revision whose engine returns Structs
            status = msgspec.to_builtins(status)
        st = status.get("status", status)
        return {
            "archived": st.get("archiveMessages"),
            "active": st.get("activeMessages", len(status["messages"])),
            "ctxd": str(Path(sys.modules["ctxd"].__file__ or "").parent),
        }

    def round(self, turn_list: list[list[dict[str, Any]]], session_turns: int, requests: int,
              gets: int, fresh: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        params = {"sessionId": self.status_sid}
        out["status zmq"] = timed(lambda: self.zmq.call("context/status", params), requests)
        out["status tcp"] = timed(lambda: self.tcp.call("context/status", params), requests)
        n_msgs = sum(len(t) for t in turn_list)
        appenders: dict[str, tuple[Callable[[str], Any], Callable[[str, Any], Any]]] = {
            "append inproc": (lambda title: msgspec.to_builtins(
                self.engine.create_session(title=title)),
                              self.engine.append),
        }
        for w, c in self.clients.items():
            appenders[f"append {w}"] = (lambda title, c=c: c.create_session(title=title),
                                        c.append)
        for key, (create, append) in appenders.items():
            seconds = 0.0
            sid = ""
            # CPU of this process and of the daemon: what an append costs, whatever the
            # machine's other work and the disk's flushes add to the wall time
            cpu0 = time.process_time() + self._daemon_cpu(key)
            for i, t in enumerate(turn_list):
                if i % session_turns == 0:
                    # fresh sessions under the compaction limits: the constant cost of
                    # an append, not a compaction's
                    sid = create("append")["sessionId"]
                t0 = time.perf_counter()
                append(sid, t)
                seconds += time.perf_counter() - t0
            cpu = time.process_time() + self._daemon_cpu(key) - cpu0
            out[key] = [n_msgs, seconds, cpu]
        sid = self.big_sid
        # the first read after a write: one turn appended to the preloaded session, then
        # context/get timed (a read of an unchanged session may be served from what the
        # previous read kept); compactions when due, untimed in-process, by the daemon
        # itself over the wires
        readers: dict[str, tuple[Callable[..., Any], Callable[[str], Any]]] = {
            "fresh inproc": (self.big.append, self.big.get_context),
        }
        for w, c in self.clients.items():
            readers[f"fresh {w}"] = (c.append, c.context_get)
        for key, (append, get) in readers.items():
            samples = []
            for t in turn_list[:fresh]:
                append(sid, tagged(t, key.split()[-1]))
                t0 = time.perf_counter()
                get(sid)
                samples.append(time.perf_counter() - t0)
                if key == "fresh inproc" and self.big.auto_compaction_due(sid):
                    self.runner.run(self.big.compact(sid, trigger="auto"))
            out[key] = samples
        out["get inproc"] = timed(lambda: self.big.get_context(sid), gets)
        for w, c in self.clients.items():
            out[f"get {w}"] = timed(lambda c=c: c.context_get(sid), gets)
        # the same through the plain sockets: the daemon's part of the above
        for key, plain in (("get zmq plain", self.zmq), ("get tcp plain", self.tcp)):
            out[key] = timed(lambda p=plain: p.call("context/get", {"sessionId": sid}), gets)
        return out

    def _daemon_cpu(self, key: str) -> float:
        assert self.daemon is not None
        return 0.0 if key.endswith("inproc") else self.daemon.cpu_seconds()

    def close(self) -> None:
        for fn in reversed(self.closers):
            try:
                fn()
            except Exception as exc:  # a failing close must not hide the others
                print(f"close: {exc!r}", file=sys.stderr)
        self.runner.close()


def main() -> int:
    side = Side()
    try:
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["cmd"] == "begin":
                reply = side.begin(cmd["root"], cmd["preload"])
            elif cmd["cmd"] == "fill":
                reply = side.fill(cmd["messages"], cmd["batch"])
            elif cmd["cmd"] == "finish":
                reply = side.finish()
            elif cmd["cmd"] == "round":
                reply = side.round(cmd["turns"], cmd["session_turns"], cmd["requests"],
                                   cmd["gets"], cmd["fresh"])
            else:
                break
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()
    finally:
        side.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
