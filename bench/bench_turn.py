"""One agent turn and one request, each against its floor, measured from outside.

    python -m bench.bench_turn [--turns N] [--requests N] [--out bench/results/turn.md]

Per-request overhead: `context/status` to a real daemon (`ctxd serve`) beside the plainest
echo of the same wire, each server in its own process: a blocking pyzmq ROUTER that sends
every msgpack request straight back (ipc, as the daemon), and a blocking TCP server that
sends every Content-Length frame straight back. Both are driven the same two ways: by a
plain blocking socket packing the request itself, and by the Python client.

One agent turn (a user request, a tool call, its result and an answer: 4 messages, about
4.5 KB) in three forms, interleaved round by round on sessions of their own, so the
machine's load hits all of them alike:

  4 calls   run/start, messages/append, run/finish, context/get (the form before
            returnContext and run/finish's messages)
  3 calls   run/start, messages/append with returnContext, run/finish
  2 calls   run/start, run/finish with messages and returnContext

Each turn ends holding the next model input, as an agent loop needs. Every
SESSION_TURNS turns all of them move to fresh sessions, so no context outgrows the
compaction limits: the rows are the constant cost of a turn. The in-process rows
are the floor (raw APSW: insert the turn with its FTS5 rows in one transaction, read the
newest 80 rows) and the engine as a library doing the same work as "4 calls".
Medians of all turns; the ratio is to the in-process floor.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import zmq

from bench.bench_core import machine_info
from bench.bench_daemon import agent_turn
from bench.peers import Daemon, RawApsw
from ctxd.clients.client import Client, connect
from ctxd.daemon.config import Config
from ctxd.daemon.engine import Engine
from ctxd.protocol import auth
from ctxd.protocol.codec import FrameReader, dumps_json, frame, loads_json

RESULTS = Path(__file__).resolve().parent / "results" / "turn.md"
SESSION_TURNS = 20


# echo servers, each in its own process


def _zmq_echo(endpoint: str, ready: Any) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(endpoint)
    ready.set()
    while True:
        frames = sock.recv_multipart()
        sock.send_multipart(frames)


def _tcp_echo(port: Any, ready: Any) -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    port.value = srv.getsockname()[1]
    ready.set()
    while True:
        conn, _ = srv.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = FrameReader()
        with conn:
            while data := conn.recv(65536):
                for body in reader.feed(data):
                    conn.sendall(frame(body))


# plain blocking clients


class ZmqPlain:
    def __init__(self, endpoint: str, token: str) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.connect(endpoint)
        self.token = token
        self.n = 0

    def call(self, method: str, params: dict[str, Any]) -> Any:
        self.n += 1
        msg = {"id": self.n, "method": method, "params": params, "token": self.token}
        self.sock.send_multipart([b"", msgpack.packb(msg, use_bin_type=True)])
        return msgpack.unpackb(self.sock.recv_multipart()[-1], raw=False)

    def close(self) -> None:
        self.sock.close(linger=0)


class TcpPlain:
    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = FrameReader()
        self.n = 0

    def call(self, method: str, params: dict[str, Any]) -> Any:
        self.n += 1
        req = {"jsonrpc": "2.0", "id": self.n, "method": method, "params": params}
        self.sock.sendall(frame(dumps_json(req)))
        while True:
            bodies = self.reader.feed(self.sock.recv(1 << 20))
            if bodies:
                return loads_json(bodies[0])

    def login(self, token: str) -> None:
        nonce = auth.new_nonce()
        reply = self.call("initialize", {"nonce": nonce, "proof": auth.client_proof(token, nonce)})
        assert "result" in reply, reply

    def close(self) -> None:
        self.sock.close()


def median_us(fn: Callable[[], Any], n: int) -> float:
    for _ in range(min(50, n)):
        fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


# the three forms of a turn over a wire, and the in-process ones


def turn_4(c: Client, sid: str, msgs: list[dict[str, Any]]) -> Any:
    run = c.start_run(sid)["runId"]
    c.append(sid, msgs, run_id=run)
    c.finish_run(run, "completed")
    return c.context_get(sid)["messages"]


def turn_3(c: Client, sid: str, msgs: list[dict[str, Any]]) -> Any:
    run = c.start_run(sid)["runId"]
    ctx = c.append(sid, msgs, run_id=run, return_context=True)["context"]["messages"]
    c.finish_run(run, "completed")
    return ctx


def turn_2(c: Client, sid: str, msgs: list[dict[str, Any]]) -> Any:
    run = c.start_run(sid)["runId"]
    return c.finish_run(run, "completed", messages=msgs, return_context=True)["context"]


FORMS = {"4 calls": turn_4, "3 calls": turn_3, "2 calls": turn_2}


def bench_requests(root: Path, daemon: Daemon, n: int) -> list[list[str]]:
    info = json.loads(daemon.connection_file.read_text())
    ready = mp.Event()
    zmq_ep = f"ipc://{root}/echo.sock"
    port = mp.Value("i", 0)
    procs = [
        mp.Process(target=_zmq_echo, args=(zmq_ep, ready), daemon=True),
    ]
    procs[0].start()
    ready.wait(10)
    ready2 = mp.Event()
    procs.append(mp.Process(target=_tcp_echo, args=(port, ready2), daemon=True))
    procs[1].start()
    ready2.wait(10)
    rows: list[list[str]] = []
    try:
        with connect(connection_file=daemon.connection_file, wire="zmq") as c:
            sid = c.create_session(title="status")["sessionId"]
        params = {"sessionId": sid}
        # ZeroMQ
        echo = ZmqPlain(zmq_ep, info["token"])
        plain = ZmqPlain(info["zmq_router"], info["token"])
        echo_us = median_us(lambda: echo.call("context/status", params), n)
        plain_us = median_us(lambda: plain.call("context/status", params), n)
        with connect(connection_file=daemon.connection_file, wire="zmq") as c:
            client_us = median_us(lambda: c.context_status(sid), n)
        echo.close()
        plain.close()
        rows += [
            ["ZeroMQ", "echo (blocking ROUTER), plain DEALER", f"{echo_us:,.0f}", "1.0"],
            ["ZeroMQ", "daemon, plain DEALER", f"{plain_us:,.0f}", f"{plain_us / echo_us:.1f}"],
            ["ZeroMQ", "daemon, Python client", f"{client_us:,.0f}", f"{client_us / echo_us:.1f}"],
        ]
        # JSON-RPC over TCP
        host, _, p = info["jsonrpc_tcp"].rpartition(":")
        techo = TcpPlain("127.0.0.1", port.value)
        tplain = TcpPlain(host.strip("[]"), int(p))
        tplain.login(info["token"])
        techo_us = median_us(lambda: techo.call("context/status", params), n)
        tplain_us = median_us(lambda: tplain.call("context/status", params), n)
        with connect(connection_file=daemon.connection_file, wire="jsonrpc") as c:
            tclient_us = median_us(lambda: c.context_status(sid), n)
        techo.close()
        tplain.close()
        rows += [
            ["JSON-RPC TCP", "echo (blocking), plain socket", f"{techo_us:,.0f}", "1.0"],
            ["JSON-RPC TCP", "daemon, plain socket", f"{tplain_us:,.0f}",
             f"{tplain_us / techo_us:.1f}"],
            ["JSON-RPC TCP", "daemon, Python client", f"{tclient_us:,.0f}",
             f"{tclient_us / techo_us:.1f}"],
        ]
    finally:
        for proc in procs:
            proc.kill()
            proc.join(5)
    return rows


def bench_turns(root: Path, daemon: Daemon, n: int) -> list[list[str]]:
    rng = random.Random(7)
    order = random.Random(11)
    turns = [agent_turn("t", i, rng) for i in range(n)]
    times: dict[str, list[float]] = {}

    def timed(key: str, fn: Callable[[], Any]) -> None:
        t0 = time.perf_counter()
        fn()
        times.setdefault(key, []).append(time.perf_counter() - t0)

    floor = RawApsw(root / "floor")
    engine = Engine(Config(data_dir=root / "inproc"))
    sessions: dict[Any, str] = {}

    def inproc(msgs: list[dict[str, Any]]) -> Any:
        sid = sessions["inproc"]
        run = engine.start_run(sid).run_id
        engine.append(sid, msgs, run_id=run)
        engine.finish_run(run, "completed")
        return engine.get_context(sid).messages

    clients = {w: connect(connection_file=daemon.connection_file, wire=w)
               for w in ("zmq", "jsonrpc")}
    try:
        for i, msgs in enumerate(turns):
            if i % SESSION_TURNS == 0:
                # fresh sessions now and then: the context stays under the compaction
                # limits, so every row measures the constant cost of a turn, not the
                # growth of an uncompacted context or a compaction running beside it
                sessions["inproc"] = engine.create_session().session_id
                for w, c in clients.items():
                    for f in FORMS:
                        sessions[(w, f)] = c.create_session(title=f"{w} {f}")["sessionId"]
            # the same turn in every form: tool call ids are per session, so each form
            # appends the same messages to its own session
            timed("floor", lambda m=msgs: (floor.append(m), floor.read()))
            timed("inproc", lambda m=msgs: inproc(m))
            # in a new order each round: whatever the first call after a pause pays (a
            # sleeping I/O thread, a core given to another process) falls on every form
            pairs = [(w, f) for w in clients for f in FORMS]
            order.shuffle(pairs)
            for w, f in pairs:
                c, fn = clients[w], FORMS[f]
                timed(f"{w} {f}", lambda c=c, s=sessions[(w, f)], m=msgs, fn=fn: fn(c, s, m))
            if i and i % 100 == 0:
                print(f"  {i} turns", file=sys.stderr)
    finally:
        for c in clients.values():
            c.close()
        engine.close()
        floor.close()
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    base = med["floor"]
    rows = [
        ["in-process", "floor: raw APSW insert + FTS5, read newest 80", "-",
         f"{base:.2f}", "1.0"],
        ["in-process", "ctxd engine (start, append, finish, get)", "-",
         f"{med['inproc']:.2f}", f"{med['inproc'] / base:.1f}"],
    ]
    for w, label in (("zmq", "ZeroMQ"), ("jsonrpc", "JSON-RPC TCP")):
        for f in FORMS:
            v = med[f"{w} {f}"]
            rows.append([label, f"ctxd daemon, Python client, {f}", f[0], f"{v:.2f}",
                         f"{v / base:.1f}"])
    return rows


def table(headers: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--turns", type=int, default=300)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ctxd-turn-") as tmp:
        root = Path(tmp)
        daemon = Daemon(root / "daemon").start()
        try:
            req_rows = bench_requests(root, daemon, args.requests)
            turn_rows = bench_turns(root, daemon, args.turns)
        finally:
            daemon.stop()
    text = "\n".join([
        "# One request and one agent turn against their floors",
        "",
        "Generated by `python -m bench.bench_turn"
        f" --turns {args.turns} --requests {args.requests}`; one run, medians.",
        "",
        table(["Measure", "Value"], [[k, v] for k, v in machine_info()]),
        "",
        f"## Per-request overhead: `context/status`, median of {args.requests} (µs)",
        "",
        table(["Wire", "Server, driven by", "µs", "x echo"], req_rows),
        "",
        f"## One agent turn (4 messages, ~4.5 KB), median of {args.turns} (ms)",
        "",
        table(["Where", "How", "Round trips", "ms", "x floor"], turn_rows),
        "",
    ])
    print(text)
    args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
