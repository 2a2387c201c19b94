"""Round trip and throughput of the ZeroMQ wire, client and server in separate processes.

    python bench/bench_wire_zmq.py [--transport tcp|ipc|both] [--seq N] [--pipelined N]

Rows:
  raw pyzmq echo      asyncio ROUTER that sends every message straight back, driven by a
                      plain DEALER packing/unpacking msgpack requests: the floor.
  ZmqServer + Client  the daemon's ZmqServer with an echo handler (token check, one task
                      per request, msgpack both ways) and the blocking `Client`.
  ZmqServer + Async   the same server and `AsyncClient`.

p50/p99 are sequential round trips (one request in flight). "pipelined" keeps `--window`
requests in flight (the sync client: one thread per slot) and reports requests per second
and the CPU time each side spent per request during that run.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection as Pipe
from typing import Any

import zmq
import zmq.asyncio

from ctxd.clients.client import AsyncClient, Client
from ctxd.daemon.servers.base import Connection, EventHub
from ctxd.daemon.servers.zmq_server import ZmqServer
from ctxd.protocol.codec import packb, unpackb

TOKEN = "bench-token"
PARAMS = {"sessionId": "bench", "text": "a short chat message of typical size " * 2}


# servers (each in its own process)


class EchoHandler:
    async def handle(self, conn: Connection, method: str, params: Any) -> Any:
        return params

    def check_token(self, token: Any) -> bool:
        return token == TOKEN

    def connection_opened(self, conn: Connection) -> None:
        pass

    def connection_closed(self, conn: Connection) -> None:
        pass


def _serve_ctxd(router: str, pub: str, pipe: Pipe) -> None:
    async def main() -> None:
        hub = EventHub()
        server = ZmqServer(EchoHandler(), hub, router, pub)
        await server.start()
        pipe.send((server.router_endpoint, server.pub_endpoint))
        await asyncio.Event().wait()

    asyncio.run(main())


def _serve_raw(router: str, pipe: Pipe) -> None:
    async def main() -> None:
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.ROUTER)
        sock.bind(router)
        pipe.send((sock.getsockopt(zmq.LAST_ENDPOINT).decode(), ""))
        while True:
            frames = await sock.recv_multipart()
            await sock.send_multipart(frames)

    asyncio.run(main())


def _start(target: Callable[..., None], *args: Any) -> tuple[mp.process.BaseProcess, str, str]:
    spawn = mp.get_context("spawn")
    ours, theirs = spawn.Pipe()
    proc = spawn.Process(target=target, args=(*args, theirs), daemon=True)
    proc.start()
    if not ours.poll(30):
        proc.terminate()
        raise RuntimeError("benchmark server did not start")
    router, pub = ours.recv()
    return proc, router, pub


# measurements


class Meter:
    """Wall time and CPU time of this process and of the server process over a run.

    CPU per request says which side is the bottleneck, and unlike wall-clock rates it
    barely moves when other work shares the machine.
    """

    def __init__(self, server_pid: int) -> None:
        self.server_pid = server_pid

    def _server_cpu(self) -> float:
        with open(f"/proc/{self.server_pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def __enter__(self) -> Meter:
        self.t0 = time.perf_counter()
        self.c0 = time.process_time()
        self.s0 = self._server_cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.t0
        self.client_cpu = time.process_time() - self.c0
        self.server_cpu = self._server_cpu() - self.s0

    def result(self, n: int, p50: float, p99: float) -> dict[str, float]:
        return {
            "p50": p50,
            "p99": p99,
            "rate": n / self.wall,
            "client_us": self.client_cpu / n * 1e6,
            "server_us": self.server_cpu / n * 1e6,
        }


def _pcts(samples_ns: list[int]) -> tuple[float, float]:
    samples_ns.sort()
    p50 = statistics.median(samples_ns) / 1000
    p99 = samples_ns[min(len(samples_ns) - 1, int(len(samples_ns) * 0.99))] / 1000
    return p50, p99


def bench_raw(router: str, pid: int, n_seq: int, n_pipe: int, window: int) -> dict[str, float]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(router)

    def request(i: int) -> bytes:
        return packb({"id": i, "method": "echo", "params": PARAMS, "token": TOKEN})

    for i in range(200):  # warm up
        sock.send_multipart([b"", request(i)])
        unpackb(sock.recv_multipart()[-1])
    samples = []
    for i in range(n_seq):
        t0 = time.perf_counter_ns()
        sock.send_multipart([b"", request(i)])
        reply = unpackb(sock.recv_multipart()[-1])
        samples.append(time.perf_counter_ns() - t0)
        assert reply["id"] == i
    p50, p99 = _pcts(samples)
    with Meter(pid) as meter:
        sent = received = 0
        while sent < min(window, n_pipe):
            sock.send_multipart([b"", request(sent)])
            sent += 1
        while received < n_pipe:
            unpackb(sock.recv_multipart()[-1])
            received += 1
            if sent < n_pipe:
                sock.send_multipart([b"", request(sent)])
                sent += 1
    sock.close(0)
    ctx.term()
    return meter.result(n_pipe, p50, p99)


def bench_sync_client(
    info: dict[str, Any], n_seq: int, n_pipe: int, window: int
) -> dict[str, float]:
    with Client(info, "zmq") as client:
        for _ in range(200):
            client.call("echo", PARAMS)
        samples = []
        for _ in range(n_seq):
            t0 = time.perf_counter_ns()
            client.call("echo", PARAMS)
            samples.append(time.perf_counter_ns() - t0)
        p50, p99 = _pcts(samples)
        per_thread = n_pipe // window

        def worker() -> None:
            for _ in range(per_thread):
                client.call("echo", PARAMS)

        threads = [threading.Thread(target=worker) for _ in range(window)]
        with Meter(int(info["pid"])) as meter:
            for th in threads:
                th.start()
            for th in threads:
                th.join()
    return meter.result(per_thread * window, p50, p99)


def bench_async_client(
    info: dict[str, Any], n_seq: int, n_pipe: int, window: int
) -> dict[str, float]:
    async def main() -> dict[str, float]:
        async with AsyncClient(info, "zmq") as client:
            for _ in range(200):
                await client.call("echo", PARAMS)
            samples = []
            for _ in range(n_seq):
                t0 = time.perf_counter_ns()
                await client.call("echo", PARAMS)
                samples.append(time.perf_counter_ns() - t0)
            p50, p99 = _pcts(samples)
            per_worker = n_pipe // window

            async def worker() -> None:
                for _ in range(per_worker):
                    await client.call("echo", PARAMS)

            with Meter(int(info["pid"])) as meter:
                await asyncio.gather(*(worker() for _ in range(window)))
        return meter.result(per_worker * window, p50, p99)

    return asyncio.run(main())


def run(
    transport: str, args: argparse.Namespace, tmp: str
) -> list[tuple[str, str, dict[str, float]]]:
    def endpoint(name: str) -> str:
        return "tcp://127.0.0.1:0" if transport == "tcp" else f"ipc://{tmp}/{name}.sock"

    rows = []
    proc, router, _ = _start(_serve_raw, endpoint("raw"))
    try:
        rows.append(
            (
                "raw pyzmq echo",
                transport,
                bench_raw(router, proc.pid, args.seq, args.pipelined, args.window),
            )
        )
    finally:
        proc.terminate()
        proc.join()
    proc, router, pub = _start(_serve_ctxd, endpoint("router"), endpoint("pub"))
    info = {"pid": proc.pid, "zmq_router": router, "zmq_pub": pub, "token": TOKEN}
    try:
        rows.append(
            (
                "ZmqServer + Client",
                transport,
                bench_sync_client(info, args.seq, args.pipelined, args.window),
            )
        )
        rows.append(
            (
                "ZmqServer + AsyncClient",
                transport,
                bench_async_client(info, args.seq, args.pipelined, args.window),
            )
        )
    finally:
        proc.terminate()
        proc.join()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--transport", choices=["tcp", "ipc", "both"], default="both")
    parser.add_argument("--seq", type=int, default=3000, help="sequential round trips")
    parser.add_argument(
        "--pipelined", type=int, default=20000, help="requests in the pipelined run"
    )
    parser.add_argument("--window", type=int, default=32, help="requests in flight when pipelined")
    args = parser.parse_args()
    transports = ["tcp", "ipc"] if args.transport == "both" else [args.transport]
    tmp = tempfile.mkdtemp(prefix="ctxd-bench-", dir="/tmp")
    try:
        rows = [row for t in transports for row in run(t, args, tmp)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"Python {platform.python_version()}, pyzmq {zmq.__version__}, libzmq "
        f"{zmq.zmq_version()}, {os.cpu_count()} CPUs; {args.seq} sequential, "
        f"{args.pipelined} pipelined with {args.window} in flight"
    )
    print(
        f"{'setup':<25}{'wire':<5}{'p50 us':>8}{'p99 us':>8}{'pipelined req/s':>17}"
        f"{'client CPU us/req':>19}{'server CPU us/req':>19}"
    )
    for name, transport, r in rows:
        print(
            f"{name:<25}{transport:<5}{r['p50']:>8.0f}{r['p99']:>8.0f}{r['rate']:>17,.0f}"
            f"{r['client_us']:>19.0f}{r['server_us']:>19.0f}"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
