"""The hand-written JSON-RPC wire beside the pygls path, measured in one run.

    python -m bench.bench_pygls_path [--requests N] [--rounds R] [--out FILE]

ctxd serves JSON-RPC over TCP (Content-Length frames, as LSP) with its own small
server (daemon/servers/rpc_tcp.py, rpc_core.py) instead of pygls. This puts numbers on
that choice: one request round trip, on loopback, through

  echo     a blocking TCP server that sends every Content-Length frame straight back
           (the floor of the wire: framing, a syscall each way, no JSON-RPC at all);
  pygls    a minimal pygls 2 `JsonRPCServer` (`JsonRPCProtocol`, the default cattrs
           converter) with one method that returns a constant, on `start_tcp`;
  ctxd     `ctxd serve`, a real daemon: `heartbeat` (the cheapest method: envelope,
           token, table check, dispatcher) and `context/status` (a real engine read).

Each server runs in its own process; one blocking client (a plain socket, the same code
for all three) sends a request and waits for the answer. Rounds interleave the servers,
so load on the shared machine hits all alike; the table gives the median over all
rounds and the ratio to the echo.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_core import machine_info
from bench.bench_turn import TcpPlain, _tcp_echo, table
from bench.peers import Daemon
from ctxd.clients.client import connect
from ctxd.protocol.codec import dumps_json, frame

RESULTS = Path(__file__).resolve().parent / "results" / "pygls_path.md"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pygls_server(port: int) -> None:
    """A minimal pygls 2 JSON-RPC server: one method, a constant answer."""
    from pygls.protocol import JsonRPCProtocol, default_converter
    from pygls.server import JsonRPCServer

    server = JsonRPCServer(JsonRPCProtocol, default_converter)

    @server.feature("heartbeat")
    def heartbeat(params: Any) -> dict[str, Any]:
        return {"leaseSeconds": 30.0}

    server.start_tcp("127.0.0.1", port)


def _connect_when_up(port: int, timeout: float = 20.0) -> TcpPlain:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return TcpPlain("127.0.0.1", port)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def timed(call: Any, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        out.append(time.perf_counter() - t0)
    return out


def run(requests: int, rounds: int) -> tuple[list[list[str]], dict[str, Any]]:
    ctx = mp.get_context("spawn")
    port = ctx.Value("i", 0)
    ready = ctx.Event()
    echo_proc = ctx.Process(target=_tcp_echo, args=(port, ready), daemon=True)
    echo_proc.start()
    ready.wait(10)
    pygls_port = _free_port()
    pygls_proc = ctx.Process(target=_pygls_server, args=(pygls_port,), daemon=True)
    pygls_proc.start()
    with tempfile.TemporaryDirectory(prefix="ctxd-pygls-") as tmp:
        daemon = Daemon(Path(tmp) / "daemon").start()
        try:
            info = json.loads(daemon.connection_file.read_text())
            with connect(connection_file=daemon.connection_file, wire="zmq") as c:
                sid = c.create_session(title="pygls path")["sessionId"]
            host, _, p = info["jsonrpc_tcp"].rpartition(":")
            ctxd = TcpPlain(host.strip("[]"), int(p))
            ctxd.login(info["token"])
            echo = _connect_when_up(port.value)
            pygls = _connect_when_up(pygls_port)
            calls = {
                "echo": lambda: echo.call("heartbeat", {}),
                "pygls": lambda: pygls.call("heartbeat", {}),
                "ctxd heartbeat": lambda: ctxd.call("heartbeat", {}),
                "ctxd context/status": lambda: ctxd.call("context/status", {"sessionId": sid}),
            }
            # every server answers as expected before anything is timed
            assert calls["pygls"]()["result"] == {"leaseSeconds": 30.0}
            assert "result" in calls["ctxd heartbeat"]()
            assert "result" in calls["ctxd context/status"]()
            samples: dict[str, list[float]] = {k: [] for k in calls}
            for call in calls.values():
                timed(call, min(200, requests))  # warm-up
            for _ in range(rounds):
                for key, call in calls.items():
                    samples[key] += timed(call, requests)
            for conn in (echo, pygls, ctxd):
                conn.close()
        finally:
            daemon.stop()
            for proc in (echo_proc, pygls_proc):
                proc.kill()
                proc.join(5)
    med = {k: statistics.median(v) * 1e6 for k, v in samples.items()}
    p99 = {k: sorted(v)[int(len(v) * 0.99) - 1] * 1e6 for k, v in samples.items()}
    labels = {
        "echo": "blocking Content-Length echo (floor)",
        "pygls": "pygls 2 JsonRPCServer, constant answer",
        "ctxd heartbeat": "ctxd daemon, `heartbeat`",
        "ctxd context/status": "ctxd daemon, `context/status` (engine read)",
    }
    rows = [
        [labels[k], f"{med[k]:,.0f}", f"{p99[k]:,.0f}", f"{med[k] / med['echo']:.1f}"]
        for k in calls
    ]
    return rows, med


def sharing() -> list[list[str]]:
    """What pygls's `start_tcp` does with a second client: ctxd serves many at once."""
    ctx = mp.get_context("spawn")
    port = _free_port()
    proc = ctx.Process(target=_pygls_server, args=(port,), daemon=True)
    proc.start()
    rows: list[list[str]] = []
    try:
        a = _connect_when_up(port)
        a.call("heartbeat", {})
        b = _connect_when_up(port)
        b.call("heartbeat", {})
        a.sock.settimeout(2)
        b.sock.settimeout(2)
        ask = {"jsonrpc": "2.0", "id": 7, "method": "heartbeat", "params": {}}
        a.sock.sendall(frame(dumps_json(ask)))
        got_a = _answer(a)
        got_b = _answer(b)
        where = "client A" if got_a else ("client B" if got_b else "nobody")
        rows.append(["client A asks after client B connected; the answer reaches", where])
        b.close()
        time.sleep(1.0)
        try:
            c = TcpPlain("127.0.0.1", port)
            c.sock.settimeout(2)
            c.call("heartbeat", {})
            after = "answered"
            c.close()
        except OSError as exc:  # refused, reset or timed out
            after = f"no answer ({type(exc).__name__}; the server shut down)"
        rows.append(["a new client C, one second after client B disconnected", after])
        a.close()
    finally:
        proc.kill()
        proc.join(5)
    return rows


def _answer(conn: TcpPlain) -> bool:
    try:
        return bool(conn.reader.feed(conn.sock.recv(65536)))
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=1000, help="requests per server per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    rows, med = run(args.requests, args.rounds)
    shared = sharing()
    n = args.requests * args.rounds
    ratio = med["pygls"] / med["ctxd heartbeat"]
    text = "\n".join([
        "# One JSON-RPC round trip: ctxd's own TCP wire beside pygls 2",
        "",
        f"Generated by `python -m bench.bench_pygls_path --requests {args.requests} "
        f"--rounds {args.rounds}`; one run, {n:,} requests per server, interleaved "
        "rounds, loopback TCP, one blocking client.",
        "",
        table(["Measure", "Value"], [[k, v] for k, v in machine_info()]),
        "",
        table(["Server", "median µs", "p99 µs", "x echo"], rows),
        "",
        f"pygls answering a constant takes {ratio:.1f}x ctxd's `heartbeat` "
        "(which checks the envelope, the login and the method table and goes through the "
        "dispatcher).",
        "",
        "## Two clients on one pygls TCP server",
        "",
        "ctxd's daemon serves every agent, the CLI, editors and the web page at once; "
        "pygls's `start_tcp` is made for one editor:",
        "",
        table(["Check", "pygls 2 JsonRPCServer"], shared),
        "",
    ])
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
