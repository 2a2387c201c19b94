"""Denial of service without the token, measured against a real daemon on loopback.

    python -m bench.bench_attacks          # prints the table, writes bench/results/attacks.md
    python -m bench.bench_attacks --only squatters log_flood    # some rows, printed only

A local process that does not have the token floods the daemon's descriptors with
half-finished WebSocket handshakes, sends a 38 MB batch before logging in, squats on
the JSON-RPC TCP wire with connections that never log in nor read, and makes the
daemon refuse it as fast as it can to grow its log; a client that has the token sends
eight 7.5 MB messages in one request. Each row says what was tried, how much, and what
came out. Bounded: a few minutes on 2 cores.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import random
import resource
import socket
import stat
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ctxd.protocol.codec import FrameReader, frame
from tests.helpers import DaemonProcess

ROOT = Path(__file__).resolve().parents[1]

OUT = ROOT / "bench" / "results" / "attacks.md"
Row = tuple[str, str, str]
TIMEOUT = 30.0


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start(root: Path, preexec_fn: Any = None, **config: Any) -> DaemonProcess:
    path = root / "ctxd.toml"
    path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in config.items()))
    # INFO, the daemon's default level: every refusal is worth a line
    return DaemonProcess(root, "--config", str(path), preexec_fn=preexec_fn,
                         env={"CTXD_LOG_LEVEL": "INFO"}).start()


def addr(endpoint: str) -> tuple[str, int]:
    host, port = endpoint.split("://", 1)[-1].rsplit(":", 1)
    return host.strip("[]"), int(port)


class Rpc:
    """A blocking JSON-RPC TCP client."""

    def __init__(self, info: dict[str, Any], login: bool = True) -> None:
        self.sock = socket.create_connection(addr(info["jsonrpc_tcp"]), timeout=TIMEOUT)
        self.reader = FrameReader(max_frame=1 << 31)
        self.pending: list[bytes] = []
        self.n = 0
        if login:
            assert "result" in self.call("initialize", {"token": info["token"]})

    def call(self, method: str, params: Any) -> dict[str, Any]:
        self.n += 1
        self.sock.sendall(frame(json.dumps({"jsonrpc": "2.0", "id": self.n, "method": method,
                                            "params": params}).encode()))
        return self.recv()

    def recv(self) -> dict[str, Any]:
        while not self.pending:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("closed")
            self.pending += self.reader.feed(data)
        return json.loads(self.pending.pop(0))  # type: ignore[no-any-return]

    def close(self) -> None:
        self.sock.close()


class Pinger:
    """Round trips of a logged-in client (tools/list) every 20 ms, in a thread."""

    def __init__(self, info: dict[str, Any]) -> None:
        self.rpc = Rpc(info)
        self.times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            self.rpc.call("tools/list", {})
            self.times.append(time.perf_counter() - t0)
            time.sleep(0.02)

    def __enter__(self) -> Pinger:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(TIMEOUT)
        self.rpc.close()

    def summary(self) -> str:
        if not self.times:
            return "no round trip completed"
        ms = sorted(t * 1000 for t in self.times)
        return (f"another client's round trips meanwhile: median {statistics.median(ms):.1f} ms, "
                f"max {ms[-1]:.0f} ms ({len(ms)} calls)")


def login_time(info: dict[str, Any], budget: float = 20.0) -> float | None:
    """Seconds until a new JSON-RPC TCP client logs in (None: not within `budget`)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < budget:
        try:
            Rpc(info).close()
            return time.monotonic() - t0
        except (OSError, AssertionError, ConnectionError):
            time.sleep(0.05)
    return None


def _secs(t: float | None) -> str:
    return "never" if t is None else f"{t:.2f} s"


def _ws_wait(t: float | None) -> str:
    if t is None:
        return ("did not get in within 30 s: the flooded wire admits 32 strangers at a time, "
                "each for up to the 5 s login deadline, and the flood's connects queue ahead")
    return f"after {t:.1f} s (it queued behind the flood)"


def ws_login_time(info: dict[str, Any], budget: float = 30.0) -> float | None:
    """Seconds until a new WebSocket client logs in (None: not within `budget`)."""
    from websockets.sync.client import connect as ws_connect

    t0 = time.monotonic()
    try:
        with ws_connect(info["websocket"], open_timeout=budget) as ws:
            ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                "params": {"token": info["token"]}}))
            assert "result" in json.loads(ws.recv(budget))
    except Exception:
        return None
    return time.monotonic() - t0


def _nofile_1024() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))


def descriptor_flood(root: Path, n: int = 1300) -> Row:
    d = start(root, preexec_fn=_nofile_1024)
    info = d.info()
    flood: list[socket.socket] = []
    try:
        ws = addr(info["websocket"])
        for _ in range(n):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(ws)
            flood.append(s)
        time.sleep(0.5)
        for s in flood:
            try:
                s.send(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finished
            except OSError:
                pass
        from ctxd.clients.client import connect

        zmq_ms = []
        for _ in range(20):  # each a new ZeroMQ connection
            t0 = time.perf_counter()
            with connect(connection_file=d.connection_file, wire="zmq", timeout=TIMEOUT) as c:
                c.call("tools/list", {})
            zmq_ms.append((time.perf_counter() - t0) * 1000)
        during = login_time(info)
        ws_during = ws_login_time(info)
        alive = d.proc is not None and d.proc.poll() is None
        for s in flood:
            s.close()
        flood.clear()
        after = login_time(info)
        fds = len(os.listdir(f"/proc/{info['pid']}/fd"))
        alive = alive and d.proc is not None and d.proc.poll() is None
        result = (
            f"daemon alive: {alive}; 20 new ZeroMQ clients served during the flood "
            f"(connect + call median {statistics.median(zmq_ms):.0f} ms); during the flood "
            f"a JSON-RPC TCP client logged in after {_secs(during)} (its own quota) and a "
            f"WebSocket client {_ws_wait(ws_during)}; after the flood a client logged in "
            f"after {_secs(after)}; {fds} descriptors open afterwards")
        return ("Descriptor flood (RLIMIT_NOFILE 1024)",
                f"{n:,} half-finished WebSocket handshakes held open", result)
    finally:
        for s in flood:
            s.close()
        if d.proc is not None and d.proc.poll() is None:
            d.stop()


def _sent_and_answer(info: dict[str, Any], body: bytes, login: bool) -> tuple[int, float, bool]:
    """(bytes answered, seconds until closed or answered, closed)."""
    rpc = Rpc(info, login=login)
    t0 = time.perf_counter()
    got = 0
    closed = False

    def send() -> None:
        try:
            rpc.sock.sendall(frame(body))
        except OSError:
            pass

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    rpc.sock.settimeout(TIMEOUT)
    try:
        while data := rpc.sock.recv(1 << 20):
            got += len(data)
            if not login:
                continue
            if rpc.reader.feed(data):
                break
        else:
            closed = True
    except ConnectionResetError:
        closed = True
    elapsed = time.perf_counter() - t0
    rpc.close()
    sender.join(TIMEOUT)
    return got, elapsed, closed


def preauth_batch(root: Path) -> Row:
    d = start(root)
    info = d.info()
    pid = info["pid"]
    try:
        batch = json.dumps([{"jsonrpc": "2.0", "id": i, "method": f"no/such-method-{i}",
                             "params": {}} for i in range(480_000)]).encode()
        before = rss_mib(pid)
        with Pinger(info) as ping:
            got, secs, closed = _sent_and_answer(info, batch, login=False)
            time.sleep(0.3)
        mid = rss_mib(pid)
        with Pinger(info) as ping2:
            got2, secs2, _ = _sent_and_answer(info, batch, login=True)
            time.sleep(0.3)
        after = rss_mib(pid)
        return ("Batch before login",
                f"a {len(batch) / 1e6:.0f} MB batch of {480_000:,} unknown-method requests, "
                "before login; then the same after login",
                f"before login: {got} bytes answered (one -32015 from the frame header), "
                f"closed: {closed}, in {secs * 1000:.0f} ms, RSS {before:.0f} -> {mid:.0f} MiB; "
                f"{ping.summary()}. After login: one -32600 (batch limit 256) of {got2} bytes "
                f"in {secs2 * 1000:.0f} ms, RSS -> {after:.0f} MiB; {ping2.summary()}")
    finally:
        d.stop()


def _words(n_chars: int, seed: int) -> str:
    rng = random.Random(seed)
    vocab = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9)))
             for _ in range(5000)]
    return " ".join(rng.choices(vocab, k=n_chars // 5 + 1))[:n_chars]


def large_messages(root: Path) -> Row:
    d = start(root)
    info = d.info()
    try:
        rpc = Rpc(info)
        sid = rpc.call("session/create", {})["result"]["sessionId"]
        text = _words(7_500_000, 7)
        messages = [{"role": "user", "content": text[i * 997:] + text[:i * 997]}
                    for i in range(8)]
        with Pinger(info) as ping:
            t0 = time.perf_counter()
            rpc.sock.settimeout(600)
            reply = rpc.call("messages/append", {"sessionId": sid, "messages": messages})
            append_s = time.perf_counter() - t0
        assert "result" in reply, str(reply)[:300]
        with Pinger(info) as ping_read:
            t0 = time.perf_counter()
            got = 0
            params: dict[str, Any] = {"sessionId": sid, "limit": 8}
            while True:
                page = rpc.call("archive/read", params)["result"]
                got += len(page["messages"])
                if page.get("nextAfterId") is None:
                    break
                params["afterId"] = page["nextAfterId"]
            read_s = time.perf_counter() - t0
        rpc.close()
        load = os.getloadavg()[0]
        return ("Large messages",
                "one messages/append of eight 7.5 MB messages (60 MB), then reading them back",
                f"append answered in {append_s:.1f} s; {ping.summary()}. Read back "
                f"({got} messages) in {read_s:.1f} s; {ping_read.summary()} (load average "
                f"{load:.1f} on {os.cpu_count()} cores)")
    finally:
        d.stop(timeout=300)


def squatters(root: Path, n: int = 256, seconds: float = 12.0) -> Row:
    d = start(root)
    info = d.info()
    stop = threading.Event()
    opened = [0]

    def squat() -> None:
        socks: list[socket.socket] = []
        # half announce a frame and never finish it (they hold a place until the login
        # deadline), half send requests without the token and never read the answers
        spam = b"".join(frame(json.dumps({"jsonrpc": "2.0", "id": i, "method": "session/list"})
                              .encode()) for i in range(50))
        stall = b"Content-Length: 100\r\n\r\n{"
        while not stop.is_set():
            while len(socks) < n and not stop.is_set():
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
                s.settimeout(0.2)
                try:
                    s.connect(addr(info["jsonrpc_tcp"]))
                    s.sendall(spam if opened[0] % 2 else stall)
                except OSError:
                    pass
                socks.append(s)
                opened[0] += 1
            # reconnect the ones the daemon dropped
            alive = []
            for s in socks:
                try:
                    s.setblocking(False)
                    if s.recv(1, socket.MSG_PEEK) == b"":
                        s.close()
                        continue
                except BlockingIOError:
                    pass
                except OSError:
                    s.close()
                    continue
                alive.append(s)
            socks = alive
            time.sleep(0.05)
        for s in socks:
            s.close()

    try:
        with Pinger(info) as ping:
            t = threading.Thread(target=squat, daemon=True)
            t.start()
            time.sleep(1.0)
            waits = []
            t_end = time.monotonic() + seconds
            while time.monotonic() < t_end:
                w = login_time(info, budget=15.0)
                waits.append(w)
            stop.set()
            t.join(TIMEOUT)
        ok = [w for w in waits if w is not None]
        return ("Squatters on the JSON-RPC TCP wire",
                f"{n} connections without the token, half of them stalled in a frame, half "
                f"sending 50 requests and never reading, reopened as soon as the daemon drops "
                f"them ({opened[0]:,} opened in {seconds:.0f} s)",
                f"new clients logged in {len(ok)} of {len(waits)} times (wait median "
                f"{statistics.median(ok):.1f} s, max {max(ok):.1f} s: they wait in the "
                f"backlog; while the quota is full, connections in it for 1 s are "
                f"dropped); a client logged in before "
                f"kept being served: {ping.summary()}" if ok else "no client logged in")
    finally:
        stop.set()
        d.stop()


def log_flood(root: Path, n: int = 3000) -> Row:
    log = root / "daemon.log"
    d = start(root, log_file=str(log))
    info = d.info()
    try:
        size0 = log.stat().st_size
        t0 = time.perf_counter()
        bad = frame(b'{"jsonrpc":"2.0","id":1,"method":"session/list"}')
        for _ in range(n):
            with socket.create_connection(addr(info["jsonrpc_tcp"]), timeout=TIMEOUT) as s:
                s.sendall(bad)
                try:
                    while s.recv(4096):
                        pass
                except OSError:
                    pass
        secs = time.perf_counter() - t0
        time.sleep(0.2)
        grown = log.stat().st_size - size0
        modes = {oct(stat.S_IMODE(p.stat().st_mode)) for p in root.glob("daemon.log*")}
        return ("Log flood", f"{n:,} connections refused before login in {secs:.1f} s",
                f"log grew {grown / 1024:.1f} KiB ({grown / secs / 1024:.1f} KiB/s; repeated "
                f"lines rate-limited to 20 per 10 s per kind, then one line saying how many "
                f"were left out); rotated at 10 MiB keeping 3; file modes {sorted(modes)}")
    finally:
        d.stop()


CHECKS: list[Callable[[Path], Row]] = [
    descriptor_flood, preauth_batch, large_messages, squatters, log_flood,
]


def main() -> int:
    only = sys.argv[sys.argv.index("--only") + 1:] if "--only" in sys.argv else []
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="ctxd-attacks-") as tmp:
        for i, check in enumerate(CHECKS):
            if only and check.__name__ not in only:
                continue
            root = Path(tmp) / str(i)
            root.mkdir()
            rows.append(check(root))
            print(f"{rows[-1][0]}: {rows[-1][2]}", flush=True)
    stamp = (f"Measured {datetime.date.today()} by `python -m bench.bench_attacks` on "
             f"{os.cpu_count()} cores, Python {platform.python_version()}.")
    table = ["| Attack | What was tried | After the fix |", "|---|---|---|"]
    table += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    if only:
        return 0  # a partial run does not replace the table
    OUT.write_text("# Denial-of-service attacks\n\n" + stamp + "\n\n" + "\n".join(table) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
