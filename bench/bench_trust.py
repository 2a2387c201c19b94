"""Attacks on the trust between clients and daemon, measured against a real daemon.

    python bench/bench_trust.py            # prints the table, writes bench/results/trust.md

A local process without the token tries to read events and get requests served over
ZeroMQ on TCP, to flood the ZeroMQ sockets with subscriptions and raw connections, and
to pose as the daemon behind a stale connection file; a ZeroMQ client dies with a run
open; `ctxd stdio` loses its daemon with requests in flight. Each row says what was
tried, how much, and what came out. Bounded: about a minute on 2 cores.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import msgpack  # noqa: E402
import zmq  # noqa: E402
from helpers import DaemonProcess, tool_turn  # noqa: E402
from test_trust import FakeServer, planted_info, rpc, stdio_proxy  # noqa: E402

from ctxd.clients.client import DaemonNotAuthentic, connect  # noqa: E402
from ctxd.protocol import auth  # noqa: E402
from ctxd.protocol.codec import FrameReader  # noqa: E402
from ctxd.protocol.connection import write_connection_file  # noqa: E402
from ctxd.protocol.errors import RunActive  # noqa: E402

OUT = ROOT / "bench" / "results" / "trust.md"
Row = tuple[str, str, str]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def eavesdroppers(root: Path, n: int = 100, appends: int = 200, approvals: int = 20) -> Row:
    d = DaemonProcess(root, "--zmq-transport", "tcp").start()
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        info = d.info()
        subs = []
        for i in range(2 * n):
            s = ctx.socket(zmq.SUB)
            s.setsockopt(zmq.LINGER, 0)
            if i % 2:
                auth.secure_client_socket(s, f"guess-{i}")
            s.subscribe(b"")
            s.connect(info["zmq_pub"])
            subs.append(s)
        raw = ctx.socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(info["zmq_router"])
        for i in range(100):  # with the right token, but no handshake
            raw.send_multipart([b"", msgpack.packb({"id": i, "method": "session/list",
                                                    "params": {}, "token": info["token"]})])
        with d.client("zmq") as c:
            sid = c.call("session/create", {})["sessionId"]
            stream = iter(c.notifications(timeout=10))
            c.subscribe(sid)
            run = c.call("run/start", {"sessionId": sid})["runId"]
            sent = 1
            for i in range(appends):
                c.call("messages/append", {"sessionId": sid, "runId": run, "messages": [
                    {"role": "user", "content": f"private {i}"}]})
                sent += 1
            for i in range(approvals):
                call, result = tool_turn(i, path=f"/home/secret/{i}")
                c.call("messages/append", {"sessionId": sid, "runId": run, "messages": [call]})
                aid = c.call("approval/request", {"sessionId": sid, "runId": run,
                                                  "toolCallId": f"call_{i}",
                                                  "arguments": {"path": "/home/secret"}})[
                    "approvalId"]
                c.call("approval/resolve", {"approvalId": aid, "decision": "approved",
                                            "reason": "private reason"})
                c.call("messages/append", {"sessionId": sid, "runId": run,
                                           "messages": [result]})
                sent += 4  # append, didRequest, didResolve, append
            got = sum(1 for _ in zip(range(sent), stream, strict=False))
        time.sleep(1.0)
        stolen = 0
        for s in subs:
            while s.poll(0):
                s.recv_multipart()
                stolen += 1
        served = 0
        while raw.poll(200):
            raw.recv_multipart()
            served += 1
        return ("ZeroMQ over TCP: subscribers and requests without the token",
                f"{n} SUB sockets without CURVE and {n} with keys of a wrong token, all "
                f"subscribed to everything; 100 requests carrying the right token from a "
                f"socket that skipped the handshake; {sent} events (appends, approvals with "
                "arguments and reasons)",
                f"events delivered to them: {stolen}; requests served: {served}; the "
                f"token holder received {got} of {sent} events")
    finally:
        ctx.destroy(linger=0)
        d.stop()


def subscription_flood(root: Path, topics: int = 100_000) -> Row:
    d = DaemonProcess(root, "--zmq-transport", "tcp").start()
    ctx: zmq.Context[Any] = zmq.Context()
    assert d.proc is not None
    try:
        info = d.info()
        with d.client("zmq") as c:
            c.call("tools/list", {})
            before = rss_mib(d.proc.pid)
            socks = []
            for keys in (None, "guess"):
                s = ctx.socket(zmq.SUB)
                s.setsockopt(zmq.LINGER, 0)
                s.setsockopt(zmq.SNDHWM, 0)
                if keys:
                    auth.secure_client_socket(s, keys)
                for i in range(topics):
                    s.subscribe(b"session/%08d" % i)
                s.connect(info["zmq_pub"])
                socks.append(s)
            time.sleep(6.0)
            after = rss_mib(d.proc.pid)
            t0 = time.perf_counter()
            c.call("tools/list", {})
            rtt = (time.perf_counter() - t0) * 1000
        return ("ZeroMQ over TCP: subscription flood without the token",
                f"two SUB sockets (no CURVE; CURVE with a wrong token's keys) with "
                f"{topics:,} subscriptions each, for 6 s",
                f"daemon RSS {before:.0f} MiB before, {after:.0f} MiB after "
                f"(+{after - before:.1f} MiB): no subscription reaches the daemon before "
                f"the handshake; a request right after took {rtt:.1f} ms")
    finally:
        ctx.destroy(linger=0)
        d.stop()


def raw_connections(root: Path, n: int = 1100) -> Row:
    d = DaemonProcess(root, "--zmq-transport", "tcp").start()
    assert d.proc is not None
    socks: list[socket.socket] = []
    try:
        info = d.info()
        host, port = info["zmq_router"].removeprefix("tcp://").rsplit(":", 1)
        with d.client("zmq") as c:
            before = rss_mib(d.proc.pid)
            start = time.monotonic()
            for _ in range(n):
                socks.append(socket.create_connection((host, int(port)), timeout=10))
            rtts = []
            for _ in range(20):
                t0 = time.perf_counter()
                c.call("tools/list", {})
                rtts.append((time.perf_counter() - t0) * 1000)
                time.sleep(0.05)
            peak = rss_mib(d.proc.pid)
            closed = 0
            for s in socks:
                s.settimeout(max(0.05, start + 12 - time.monotonic()))
                try:
                    while s.recv(4096):
                        pass
                    closed += 1
                except ConnectionResetError:
                    closed += 1
                except TimeoutError:
                    pass
            took = time.monotonic() - start
            alive = d.proc.poll() is None and bool(c.call("tools/list", {}))
        return ("ZeroMQ over TCP: raw connections that never handshake",
                f"{n:,} TCP connections to the request socket, each silent",
                f"all wires kept serving (round trip median {statistics.median(rtts):.1f} ms "
                f"during the flood, daemon alive: {alive}); RSS +{peak - before:.1f} MiB; "
                f"{closed:,} of {n:,} closed by the daemon at the 5 s handshake deadline "
                f"(all within {took:.1f} s)")
    finally:
        for s in socks:
            s.close()
        d.stop()


def impostor(root: Path) -> Row:
    fake = FakeServer()
    try:
        conn_file = root / "run" / "ctxd.json"
        info = planted_info(fake.port)
        write_connection_file(conn_file, info)
        refused = 0
        try:
            connect(connection_file=conn_file, wire="jsonrpc")
        except DaemonNotAuthentic:
            refused += 1
        editor = rpc(1, "initialize", {}) + rpc(2, "messages/append", {
            "sessionId": "s", "messages": [{"role": "user", "content": "private"}]})
        proc = subprocess.run(stdio_proxy(conn_file), input=editor, capture_output=True,
                              timeout=30)
        got = bytes(fake.received)
        bodies = [json.loads(b) for b in FrameReader().feed(got)]
        others = [b for b in bodies if b.get("method") != "initialize"]
        return ("Stale connection file: another process holds the dead daemon's port",
                "the Python client and `ctxd stdio` with an editor's "
                "initialize and a private append, against a server that answers like the "
                "daemon but does not know the token",
                f"clients that refused: {refused + (proc.returncode == 1)} of 2; token bytes "
                f"sent: {got.count(info['token'].encode())}; requests other than the "
                f"authenticating initialize received: {len(others)}; editor bytes "
                f"forwarded: {got.count(b'private')}")
    finally:
        fake.close()


def run_lease(root: Path, lease: float = 2.0) -> Row:
    d = DaemonProcess(root, env={"CTXD_RUN_LEASE_SECONDS": str(lease)}).start()
    try:
        with d.client("zmq") as c:
            sid = c.call("session/create", {})["sessionId"]
            code = (
                "import os\nfrom ctxd.clients.client import connect\n"
                f"c = connect(connection_file={str(d.connection_file)!r}, wire='zmq')\n"
                f"c.call('run/start', {{'sessionId': {sid!r}}})\n"
                "os.kill(os.getpid(), 9)\n"
            )
            subprocess.run([sys.executable, "-c", code], timeout=30)
            died = time.monotonic()
            while True:
                try:
                    c.call("run/start", {"sessionId": sid})
                    break
                except RunActive:
                    time.sleep(0.05)
            released = time.monotonic() - died
        return ("ZeroMQ client dies with a run open",
                f"a client process opens a run over ZeroMQ and is killed (lease {lease:g} s; "
                "the default is 30 s)",
                f"the run was marked interrupted and the next run/start succeeded "
                f"{released:.1f} s after the client died (before: RUN_ACTIVE forever)")
    finally:
        d.stop()


def stdio_in_flight(root: Path, n: int = 20) -> Row:
    d = DaemonProcess(root).start()
    assert d.proc is not None
    proc = subprocess.Popen(stdio_proxy(d.connection_file), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(rpc(0, "initialize", {}))
    proc.stdin.flush()
    reader, got = FrameReader(), []
    while not got:
        got = reader.feed(os.read(proc.stdout.fileno(), 65536))
    d.proc.send_signal(signal.SIGSTOP)
    for i in range(1, n + 1):
        proc.stdin.write(rpc(i, "session/list"))
    proc.stdin.flush()
    time.sleep(0.3)
    t0 = time.monotonic()
    d.proc.kill()
    d.proc.wait(10)
    code = proc.wait(30)
    took = time.monotonic() - t0
    replies = [json.loads(b) for b in reader.feed(proc.stdout.read())]
    errors = sum(1 for r in replies if r.get("error", {}).get("code") == -32603)
    proc.stdin.close()
    return ("`ctxd stdio` loses its daemon with requests in flight",
            f"{n} requests sent to a hung daemon, which is then killed",
            f"{errors} of {n} answered with error -32603, then exit status {code} after "
            f"{took * 1000:.0f} ms (before: no reply, the editor waited forever)")


def curve_cost(root: Path, calls: int = 500) -> Row:
    medians = {}
    for transport in ("ipc", "tcp"):
        (root / transport).mkdir()
        d = DaemonProcess(root / transport, "--zmq-transport", transport).start()
        try:
            with d.client("zmq") as c:
                sid = c.call("session/create", {})["sessionId"]
                body = [{"role": "user", "content": "x" * 2000}]
                rtts = []
                for _ in range(calls):
                    t0 = time.perf_counter()
                    c.call("messages/append", {"sessionId": sid, "messages": body})
                    rtts.append((time.perf_counter() - t0) * 1000)
                medians[transport] = statistics.median(rtts)
        finally:
            d.stop()
    return ("Cost of CURVE on ZeroMQ over TCP",
            f"{calls} sequential 2 KB appends over ZeroMQ, ipc (no CURVE: private runtime "
            "dir) and TCP (CURVE)",
            f"round trip median {medians['ipc']:.2f} ms on ipc, {medians['tcp']:.2f} ms on "
            f"TCP with CURVE ({medians['tcp'] / medians['ipc']:.2f}x)")


def main() -> int:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="ctxd-trust-") as tmp:
        for i, check in enumerate((eavesdroppers, subscription_flood, raw_connections,
                                   impostor, run_lease, stdio_in_flight, curve_cost)):
            root = Path(tmp) / str(i)
            root.mkdir()
            rows.append(check(root))
            print(f"{rows[-1][0]}: {rows[-1][2]}", flush=True)
    stamp = (f"Measured {datetime.date.today()} by `python bench/bench_trust.py` on "
             f"{os.cpu_count()} cores, Python {platform.python_version()}.")
    table = ["| Attack | What was tried | After the fix |", "|---|---|---|"]
    table += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    OUT.write_text("# Trust attacks\n\n" + stamp + "\n\n" + "\n".join(table) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
