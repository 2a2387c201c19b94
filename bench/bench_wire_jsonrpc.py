"""Round-trip latency and pipelined throughput of the JSON-RPC wires (TCP and WebSocket).

The daemon side runs the real servers with an echo handler; the client runs in another
process so the two event loops don't share a CPU slice. Usage:

    python bench/bench_wire_jsonrpc.py [--count 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import sys
import threading
import time
from typing import Any

PARAMS = {"session_id": "s-1", "role": "user", "content": "把这个文件读一下 and summarise it"}


def _request(i: int) -> bytes:
    msg = {"jsonrpc": "2.0", "id": i, "method": "echo", "params": PARAMS}
    return json.dumps(msg, ensure_ascii=False, separators=(",", ":")).encode()


def _report(name: str, lat: list[float], pipelined_s: float, count: int) -> None:
    lat.sort()
    p50 = statistics.median(lat) * 1e6
    p99 = lat[int(len(lat) * 0.99) - 1] * 1e6
    print(
        f"{name:10s} round trip p50 {p50:6.0f} us  p99 {p99:6.0f} us   "
        f"pipelined {count / pipelined_s:8.0f} req/s"
    )


# client side (runs in a subprocess)


def _client_tcp(port: int, count: int) -> None:
    from ctxd.protocol.codec import FrameReader, frame

    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = FrameReader()
    pending: list[bytes] = []
    lat: list[float] = []
    for i in range(count):
        data = frame(_request(i))
        t0 = time.perf_counter()
        sock.sendall(data)
        while not pending:
            pending.extend(reader.feed(sock.recv(65536)))
        pending.pop(0)
        lat.append(time.perf_counter() - t0)

    blob = b"".join(frame(_request(i)) for i in range(count))
    t0 = time.perf_counter()
    sender = threading.Thread(target=sock.sendall, args=(blob,))
    sender.start()
    seen = 0
    while seen < count:
        seen += len(reader.feed(sock.recv(1 << 20)))
    elapsed = time.perf_counter() - t0
    sender.join()
    sock.close()
    _report("tcp", lat, elapsed, count)


def _client_ws(port: int, count: int) -> None:
    from websockets.sync.client import connect

    with connect(f"ws://127.0.0.1:{port}", compression=None, max_size=None) as ws:
        lat: list[float] = []
        for i in range(count):
            data = _request(i).decode()
            t0 = time.perf_counter()
            ws.send(data)
            ws.recv()
            lat.append(time.perf_counter() - t0)

        msgs = [_request(i).decode() for i in range(count)]

        def send_all() -> None:
            for m in msgs:
                ws.send(m)

        t0 = time.perf_counter()
        sender = threading.Thread(target=send_all)
        sender.start()
        for _ in range(count):
            ws.recv()
        elapsed = time.perf_counter() - t0
        sender.join()
    _report("websocket", lat, elapsed, count)


# daemon side


class EchoHandler:
    async def handle(self, conn: Any, method: str, params: Any) -> Any:
        return params

    def check_token(self, token: Any) -> bool:
        return True

    def connection_opened(self, conn: Any) -> None:
        pass

    def connection_closed(self, conn: Any) -> None:
        pass


async def _serve_and_measure(count: int) -> None:
    from ctxd.daemon.servers.base import EventHub
    from ctxd.daemon.servers.jsonrpc import start_tcp_server, start_websocket_server

    hub = EventHub()
    tcp = await start_tcp_server(EchoHandler(), hub)
    ws = await start_websocket_server(EchoHandler(), hub)
    print(f"{count} requests per run, client in another process")
    for kind, port in (("tcp", tcp.port), ("ws", ws.port)):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--client", kind, "--port", str(port), "--count", str(count)
        )
        await proc.wait()
    await tcp.close()
    await ws.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--client", choices=["tcp", "ws"])
    ap.add_argument("--port", type=int)
    args = ap.parse_args()
    if args.client == "tcp":
        _client_tcp(args.port, args.count)
    elif args.client == "ws":
        _client_ws(args.port, args.count)
    else:
        asyncio.run(_serve_and_measure(args.count))


if __name__ == "__main__":
    main()
