"""The daemon over the wire: a real `ctxd serve` process and real clients.

1. Round trip of `context/status` on each wire (ZeroMQ DEALER, JSON-RPC over TCP,
   WebSocket), against a trivial echo server on the same wire, in a process of its own
   like the daemon, measured by the same client (`AsyncClient`) in the same run.
2. Append throughput, one agent turn per `messages/append`, with 1 and with 8 client
   processes (the blocking `Client`), to separate sessions and to one shared session.
3. `context/get` for a session with a small and one with a big archive (same daemon,
   same database), after compaction has bounded both active contexts.

    python bench/bench_daemon.py            # small: 20,000-message archive, ~2 minutes
    python bench/bench_daemon.py --full     # 100,000-message archive, bigger counts

Markdown tables are printed and written to bench/results/daemon.md (see --out).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import multiprocessing as mp
import os
import platform
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import websockets
import zmq
import zmq.asyncio

from ctxd.clients.client import AsyncClient, Client, Wire
from ctxd.protocol.codec import FrameReader, dumps_json, frame, packb, unpackb

RESULTS = Path(__file__).resolve().parent / "results"
WIRES: tuple[Wire, ...] = ("zmq", "jsonrpc", "websocket")
WIRE_LABELS = {"zmq": "ZeroMQ DEALER", "jsonrpc": "JSON-RPC TCP", "websocket": "WebSocket"}
ECHO_TOKEN = "echo"


@dataclass(frozen=True)
class Sizes:
    name: str
    rtt_calls: int  # per wire and server
    rtt_blocks: int  # daemon and echo alternate in this many blocks
    append_turns_one: int  # one client
    append_turns_each: int  # per client of eight
    append_repeats: int  # each configuration, in rounds; the median run is reported
    append_wires: tuple[Wire, ...]  # with the default policy (auto-compaction on)
    small_archive: int
    big_archive: int
    fill_batch: int  # messages per append while filling the big archive
    get_calls: int  # per session


SMALL = Sizes(
    "small",
    rtt_calls=3000,
    rtt_blocks=10,
    append_turns_one=1500,
    append_turns_each=300,
    append_repeats=3,
    append_wires=("zmq",),
    small_archive=100,
    big_archive=20_000,
    fill_batch=400,
    get_calls=300,
)
# Bigger fill batches at 100k: fewer round trips and fewer compactions to wait for; the
# fill only prepares the archive whose context/get is measured.
FULL = Sizes(
    "full",
    rtt_calls=10_000,
    rtt_blocks=20,
    append_turns_one=5000,
    append_turns_each=600,
    append_repeats=2,
    append_wires=WIRES,
    small_archive=100,
    big_archive=100_000,
    fill_batch=2000,
    get_calls=1000,
)
# A daemon whose context never reaches its limits: appends alone, no compaction.
NO_COMPACTION_ENV = {
    "CTXD_MAX_ACTIVE_MESSAGES": "1000000000",
    "CTXD_MAX_ACTIVE_TOKENS": "1000000000000",
}


# ------------------------------------------------------------------------ helpers


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f}"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f}"


def verdict(ok: bool) -> str:
    return "ok" if ok else "**MISSED**"


# -------------------------------------------------------------------- echo servers
#
# What a request costs on each wire with nothing behind it: decode, answer `params`,
# encode. All three run on asyncio, as the daemon's servers do, so the ratio isolates
# what the daemon adds (dispatch, validation, the engine).


async def _echo_zmq(router: zmq.asyncio.Socket) -> None:
    while True:
        frames = await router.recv_multipart()
        # [identity, b"", body] from the client's DEALER (REQ framing)
        msg = unpackb(frames[-1])
        reply = packb({"id": msg.get("id"), "result": msg.get("params")})
        await router.send_multipart([*frames[:-1], reply])


async def _echo_tcp(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    frames = FrameReader()
    try:
        while data := await reader.read(256 * 1024):
            for body in frames.feed(data):
                msg = json.loads(body)
                reply = {"jsonrpc": "2.0", "id": msg.get("id"), "result": msg.get("params")}
                writer.write(frame(dumps_json(reply)))
    finally:
        writer.close()


async def _echo_ws(ws: Any) -> None:
    with contextlib.suppress(websockets.ConnectionClosed):
        async for message in ws:
            msg = json.loads(message)
            reply = {"jsonrpc": "2.0", "id": msg.get("id"), "result": msg.get("params")}
            await ws.send(dumps_json(reply).decode())


async def echo_server_main(run_dir: Path, info_path: Path) -> None:
    from websockets.asyncio.server import serve

    ctx = zmq.asyncio.Context()
    router = ctx.socket(zmq.ROUTER)
    pub = ctx.socket(zmq.XPUB)  # the client connects a SUB too; nothing is published
    router.bind(f"ipc://{run_dir}/echo-router.sock")
    pub.bind(f"ipc://{run_dir}/echo-pub.sock")
    tcp = await asyncio.start_server(_echo_tcp, "127.0.0.1", 0)
    ws = await serve(_echo_ws, "127.0.0.1", 0, compression=None, max_size=64 * 1024 * 1024)
    tcp_port = tcp.sockets[0].getsockname()[1]
    ws_port = next(iter(ws.sockets)).getsockname()[1]
    info = {
        "pid": os.getpid(),
        "zmq_router": router.getsockopt(zmq.LAST_ENDPOINT).decode(),
        "zmq_pub": pub.getsockopt(zmq.LAST_ENDPOINT).decode(),
        "jsonrpc_tcp": f"127.0.0.1:{tcp_port}",
        "websocket": f"ws://127.0.0.1:{ws_port}",
        "token": ECHO_TOKEN,
    }
    tmp = info_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(info))
    tmp.rename(info_path)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    task = asyncio.create_task(_echo_zmq(router))
    await stop.wait()
    task.cancel()
    tcp.close()
    ws.close()
    router.close(linger=0)
    pub.close(linger=0)
    ctx.term()


# ------------------------------------------------------------------- processes


class Proc:
    """A server subprocess that announces itself by writing a JSON file."""

    def __init__(self, cmd: list[str], info_path: Path, env: dict[str, str]) -> None:
        info_path.unlink(missing_ok=True)
        self.info_path = info_path
        info_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.log = open(info_path.with_suffix(".log"), "wb")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=self.log)

    def wait_ready(self, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not self.info_path.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server exited with {self.proc.returncode}: "
                    + self.info_path.with_suffix(".log").read_text()[-2000:]
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.info_path} not written within {timeout}s")
            time.sleep(0.02)
        time.sleep(0.05)  # the file is written (and renamed) complete, but be safe
        return json.loads(self.info_path.read_text())

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()


def start_daemon(
    root: Path, name: str = "ctxd", env_extra: dict[str, str] | None = None
) -> tuple[Proc, dict[str, Any]]:
    run_dir = root / "run"
    # the daemon measured is the default one, whatever this shell has configured
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXD_")}
    env.update(CTXD_RUNTIME_DIR=str(run_dir), CTXD_LOG_LEVEL="WARNING", **(env_extra or {}))
    # the ZeroMQ socket files are named after the connection file: one name per daemon
    conn_file = run_dir / f"{name}.json"
    cmd = [
        sys.executable,
        "-m",
        "ctxd.daemon",
        "serve",
        "--data-dir",
        str(root / f"data-{name}"),
        "--connection-file",
        str(conn_file),
    ]
    proc = Proc(cmd, conn_file, env)
    return proc, proc.wait_ready()


def start_echo(root: Path) -> tuple[Proc, dict[str, Any]]:
    run_dir = root / "run"
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    info_path = run_dir / "echo.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--echo-server", str(info_path)]
    proc = Proc(cmd, info_path, dict(os.environ))
    return proc, proc.wait_ready()


# --------------------------------------------------------------------- messages

_EN = (
    "Please check why the parser drops the last token in src/app/parser.py and "
    "fix it without touching the public API."
)
_ZH = "请检查一下上下文压缩策略，为什么摘要里丢了最后一条用户约束，然后修复它。"
_CODE = "def handler(request):\n    value = request.get('value')\n    return value * 2\n"


def agent_turn(tag: str, i: int, rng: random.Random) -> list[dict[str, Any]]:
    """One agent turn: request, a tool call and its result, an answer (~4.5 KB)."""
    cid = f"call_{tag}_{i}"
    user = _ZH if rng.random() < 0.33 else _EN
    path = f"src/app/mod_{rng.randrange(500)}.py"
    return [
        {"role": "user", "content": f"{user} (step {i})"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": cid,
                    "type": "function",
                    "function": {"name": "read_file", "arguments": json.dumps({"path": path})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": cid, "content": _CODE * rng.randint(20, 60)},
        {"role": "assistant", "content": f"Done with step {i}: {path} now doubles the value."},
    ]


# ---------------------------------------------------------------- 1. round trips


@dataclass
class Rtt:
    wire: str
    echo: list[float]
    daemon: list[float]
    daemon_trivial: list[float]


async def _timed(
    client: AsyncClient, method: str, params: dict[str, Any], n: int, out: list[float]
) -> None:
    for _ in range(n):
        t0 = time.perf_counter()
        await client.call(method, params)
        out.append(time.perf_counter() - t0)


async def measure_rtt(
    wire: Wire, daemon: dict[str, Any], echo: dict[str, Any], sid: str, sizes: Sizes
) -> Rtt:
    d = AsyncClient(daemon, wire)
    e = AsyncClient(echo, wire)
    await d.open()
    await e.open()
    params = {"sessionId": sid}
    res = Rtt(wire, [], [], [])
    try:
        warm: list[float] = []
        await _timed(d, "context/status", params, 300, warm)
        await _timed(e, "context/status", params, 300, warm)
        per_block = max(1, sizes.rtt_calls // sizes.rtt_blocks)
        for b in range(sizes.rtt_blocks):
            # alternate which goes first, so a burst of load on the machine hits both
            order = [(d, res.daemon), (e, res.echo)]
            for client, out in order if b % 2 == 0 else order[::-1]:
                await _timed(client, "context/status", params, per_block, out)
            # a method that touches no database: what dispatch alone costs
            await _timed(d, "tools/list", {}, max(1, per_block // 4), res.daemon_trivial)
    finally:
        await d.close()
        await e.close()
    return res


def rtt_section(results: Sequence[Rtt]) -> tuple[str, list[tuple[str, str, str, bool]]]:
    rows = []
    summary = []
    for r in results:
        e50, e99 = percentile(r.echo, 0.5), percentile(r.echo, 0.99)
        d50, d99 = percentile(r.daemon, 0.5), percentile(r.daemon, 0.99)
        t50 = percentile(r.daemon_trivial, 0.5)
        ratio50, ratio99 = d50 / e50, d99 / e99
        rows.append(
            [
                WIRE_LABELS[r.wire],
                us(e50),
                us(e99),
                us(d50),
                us(d99),
                f"**{ratio50:.2f}**",
                f"{ratio99:.2f}",
                us(t50),
            ]
        )
        summary.append(
            (
                f"`context/status` p50 daemon/echo, {WIRE_LABELS[r.wire]}",
                f"{ratio50:.2f} ({us(d50)} vs {us(e50)} µs)",
                "≤ 2",
                ratio50 <= 2,
            )
        )
    headers = [
        "Wire",
        "echo p50 µs",
        "echo p99 µs",
        "daemon p50 µs",
        "daemon p99 µs",
        "p50 daemon/echo",
        "p99 daemon/echo",
        "daemon `tools/list` p50 µs",
    ]
    return table(headers, rows), summary


# ------------------------------------------------------------ 2. append throughput


def append_worker(
    info: dict[str, Any], wire: Wire, sid: str | None, tag: str, turns: int, barrier: Any, out: Any
) -> None:
    """One client process: connect, wait for the others, append `turns` turns."""
    rng = random.Random(tag)
    batches = [agent_turn(tag, i, rng) for i in range(turns)]
    with Client(info, wire, timeout=120.0) as client:
        if sid is None:
            sid = client.create_session(title=f"append {tag}")["sessionId"]
        client.context_status(sid)  # warm the connection
        lat: list[float] = []
        peak = 0
        barrier.wait()
        start = time.monotonic()
        for batch in batches:
            t0 = time.perf_counter()
            status = client.append(sid, batch)["status"]
            lat.append(time.perf_counter() - t0)
            peak = max(peak, status["activeMessages"])
        end = time.monotonic()
        archived = client.context_status(sid)["archiveMessages"]
    out.put((start, end, sum(len(b) for b in batches), lat, archived, peak))


@dataclass
class AppendRun:
    wire: str
    compaction: bool
    clients: int
    target: str  # "separate" or "shared"
    messages: int
    seconds: float
    latencies: list[float]
    session_size: int  # archived messages of the biggest session at the end
    peak_active: int  # largest active context an append reported

    @property
    def rate(self) -> float:
        return self.messages / self.seconds


def measure_append(
    info: dict[str, Any], wire: Wire, compaction: bool, clients: int, shared: bool, turns_each: int
) -> AppendRun:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(clients + 1)
    out = ctx.Queue()
    sid = None
    if shared:
        with Client(info, wire) as c:
            sid = c.create_session(title="append shared")["sessionId"]
    tag = f"{wire}{clients}{'s' if shared else 'x'}{'c' if compaction else 'n'}"
    procs = [
        ctx.Process(
            target=append_worker, args=(info, wire, sid, f"{tag}_{i}", turns_each, barrier, out)
        )
        for i in range(clients)
    ]
    for p in procs:
        p.start()
    barrier.wait(timeout=120)
    got = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(30)
    start = min(g[0] for g in got)
    end = max(g[1] for g in got)
    return AppendRun(
        wire,
        compaction,
        clients,
        "shared" if shared else "separate",
        sum(g[2] for g in got),
        end - start,
        [x for g in got for x in g[3]],
        max(g[4] for g in got),
        max(g[5] for g in got),
    )


def append_section(runs: Sequence[AppendRun]) -> tuple[str, list[tuple[str, str, str, bool]]]:
    rows = []
    summary = []
    base = {(r.wire, r.compaction): r.rate for r in runs if r.clients == 1}
    for r in runs:
        one = base.get((r.wire, r.compaction))
        rel = r.rate / one if one else float("nan")
        mode = "on" if r.compaction else "off"
        rows.append(
            [
                WIRE_LABELS[r.wire],
                mode,
                r.clients,
                "one each" if r.target == "separate" else "one shared",
                f"{r.session_size:,}",
                f"{r.peak_active:,}",
                f"{r.rate:,.0f}",
                f"{r.rate / 4:,.0f}",
                ms(percentile(r.latencies, 0.5)),
                ms(percentile(r.latencies, 0.99)),
                ms(max(r.latencies)),
                f"{rel:.2f}",
            ]
        )
        if r.clients > 1:
            summary.append(
                (
                    f"Append, {r.clients} clients / 1, {r.target} sessions, auto-compaction "
                    f"{mode}, {WIRE_LABELS[r.wire]}",
                    f"{rel:.2f} ({r.rate:,.0f} msg/s)",
                    "≥ 0.8",
                    rel >= 0.8,
                )
            )
    headers = [
        "Wire",
        "Auto-compaction",
        "Clients",
        "Sessions",
        "Biggest session at end",
        "Peak active messages",
        "Messages/s",
        "Appends/s",
        "append p50 ms",
        "p99 ms",
        "max ms",
        "vs 1 client",
    ]
    return table(headers, rows), summary


def compaction_share(runs: Sequence[AppendRun]) -> str:
    """How much of the append throughput auto-compaction takes, per configuration."""
    lines = []
    for r in runs:
        if not r.compaction or r.wire != "zmq":
            continue
        off = next(
            (
                o
                for o in runs
                if not o.compaction
                and o.wire == r.wire
                and o.clients == r.clients
                and o.target == r.target
            ),
            None,
        )
        if off is not None:
            cost = 1 - r.rate / off.rate
            # a faster run with compaction on is noise between the two daemons
            what = f"costs {100 * cost:.0f}% of" if cost > 0 else "costs nothing measurable of"
            lines.append(
                f"- {r.clients} client(s), {r.target} sessions: auto-compaction {what} the "
                f"throughput ({r.rate:,.0f} vs {off.rate:,.0f} msg/s without)."
            )
    return "\n".join(lines) + "\n" if lines else ""


# ---------------------------------------------------------- 3. context/get scaling


@dataclass
class Fill:
    seconds: float
    peak_messages: int  # largest active context an append reported during the fill
    peak_tokens: int


def fill_session(client: Client, sid: str, messages: int, batch: int, tag: str) -> Fill:
    """Append whole turns, `batch` messages per call, outside runs (auto-compaction on)."""
    rng = random.Random(tag)
    turns = [agent_turn(tag, i, rng) for i in range(messages // 4)]
    per = max(1, batch // 4)
    fill = Fill(0.0, 0, 0)
    t0 = time.monotonic()
    for i in range(0, len(turns), per):
        status = client.append(sid, [m for t in turns[i : i + per] for m in t])["status"]
        fill.peak_messages = max(fill.peak_messages, status["activeMessages"])
        fill.peak_tokens = max(fill.peak_tokens, status["estimatedTokens"])
    fill.seconds = time.monotonic() - t0
    return fill


def settle(client: Client, sid: str) -> dict[str, Any]:
    """Wait out a running auto-compaction, then compact whatever is left over the limit."""
    for _ in range(600):
        if not client.context_status(sid)["compacting"]:
            break
        time.sleep(0.05)
    client.compact(sid)
    return client.context_status(sid)  # type: ignore[no-any-return]


@dataclass
class GetRun:
    archived: int
    active_messages: int
    active_tokens: int
    get: list[float]
    status: list[float]
    reply_bytes: int


def measure_get(info: dict[str, Any], sizes: Sizes) -> tuple[list[GetRun], Fill, str]:
    with Client(info, "zmq", timeout=600.0) as c:
        small = c.create_session(title="context/get small")["sessionId"]
        big = c.create_session(title="context/get big")["sessionId"]
        fill_session(c, small, sizes.small_archive, sizes.fill_batch, "small")
        fill = fill_session(c, big, sizes.big_archive, sizes.fill_batch, "big")
        stats = {sid: settle(c, sid) for sid in (small, big)}
        runs = {
            sid: GetRun(
                stats[sid]["archiveMessages"],
                stats[sid]["activeMessages"],
                stats[sid]["estimatedTokens"],
                [],
                [],
                0,
            )
            for sid in (small, big)
        }
        for sid in (small, big):
            runs[sid].reply_bytes = len(msgpack.packb(c.context_get(sid)))
            for _ in range(20):  # warm caches on both
                c.context_get(sid)
        for i in range(sizes.get_calls):
            for sid in (small, big) if i % 2 == 0 else (big, small):
                t0 = time.perf_counter()
                c.context_get(sid)
                t1 = time.perf_counter()
                c.context_status(sid)
                t2 = time.perf_counter()
                runs[sid].get.append(t1 - t0)
                runs[sid].status.append(t2 - t1)
    return [runs[small], runs[big]], fill, big


@dataclass
class Compaction:
    trigger: str
    ms: float
    archived: int  # session's archive size when it ran (up to what it summarized)
    summarized: int  # archive ids it summarized, first to last
    rederived: bool  # summarized from the start of the archive again


def compaction_log(db: Path, sid: str) -> list[Compaction]:
    """The committed compactions of a session, from the daemon's own log."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        first = con.execute(
            "SELECT min(id) FROM messages WHERE session_id = ? AND role != 'system'", (sid,)
        ).fetchone()[0]
        rows = con.execute(
            "SELECT trigger, duration_ms, summarized_from, summarized_to FROM compactions "
            "WHERE session_id = ? AND committed = 1 ORDER BY started_at",
            (sid,),
        ).fetchall()
        out = []
        for i, (trigger, dur, lo, hi) in enumerate(rows):
            archived = con.execute(
                "SELECT count(*) FROM messages WHERE session_id = ? AND id <= ?", (sid, hi)
            ).fetchone()[0]
            # the first compaction starts at the first message too, without re-deriving
            rederived = i > 0 and lo == first
            out.append(Compaction(trigger, float(dur), int(archived), int(hi - lo + 1), rederived))
        return out
    finally:
        con.close()


def get_section(runs: Sequence[GetRun]) -> tuple[str, list[tuple[str, str, str, bool]]]:
    rows = []
    for r in runs:
        rows.append(
            [
                f"{r.archived:,}",
                r.active_messages,
                f"{r.active_tokens:,}",
                f"{r.reply_bytes:,}",
                ms(statistics.median(r.get)),
                ms(percentile(r.get, 0.99)),
                ms(statistics.median(r.status)),
            ]
        )
    a, b = runs
    get_ratio = statistics.median(b.get) / statistics.median(a.get)
    status_ratio = statistics.median(b.status) / statistics.median(a.status)
    rows.append(["**ratio**", "", "", "", f"**{get_ratio:.2f}**", "", f"{status_ratio:.2f}"])
    headers = [
        "Archived messages",
        "Active messages",
        "Active tokens",
        "Reply bytes",
        "`context/get` median ms",
        "p99 ms",
        "`context/status` median ms",
    ]
    summary = [
        (
            f"`context/get`, {b.archived:,} vs {a.archived:,} archived",
            f"{get_ratio:.2f} ({ms(statistics.median(b.get))} ms)",
            "≈ 1 (≤ 1.2)",
            get_ratio <= 1.2,
        )
    ]
    return table(headers, rows), summary


def compaction_section(log: Sequence[Compaction], fill: Fill) -> str:
    if not log:
        return "No compaction was committed.\n"
    rows = []
    for label, part in (
        ("automatic, during the fill", [c for c in log if c.trigger == "auto"]),
        ("manual, after the fill", [c for c in log if c.trigger != "auto"]),
    ):
        if not part:
            continue
        durations = [c.ms for c in part]
        sizes = [c.summarized for c in part]
        rows.append(
            [
                label,
                len(part),
                sum(c.rederived for c in part),
                f"{statistics.median(sizes):,.0f} / {max(sizes):,}",
                f"{statistics.median(durations):,.0f} / {max(durations):,.0f}",
                f"{max(c.archived for c in part):,}",
            ]
        )
    text = table(
        [
            "Compactions",
            "Count",
            "Re-derived",
            "Messages summarized median / max",
            "ms median / max",
            "Archived at the last",
        ],
        rows,
    )
    return (
        text + f"\n\nLargest active context an append reported during the fill: "
        f"{fill.peak_messages:,} messages, {fill.peak_tokens:,} tokens (the limits are 80 "
        "messages and 120,000 tokens; appends go on while a compaction runs, and what they "
        "add waits for the next one).\n"
    )


# ----------------------------------------------------------------------- report


def machine_info() -> list[tuple[str, str]]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return [
        ("Date (UTC)", datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M")),
        ("CPU", cpu),
        ("Cores", str(os.cpu_count())),
        ("OS", platform.platform()),
        ("Python", platform.python_version()),
        ("pyzmq / libzmq", f"{zmq.pyzmq_version()} / {zmq.zmq_version()}"),
        ("websockets", websockets.__version__),
        ("Load average at start", " ".join(f"{x:.2f}" for x in os.getloadavg())),
    ]


async def rtt_all(
    daemon: dict[str, Any], echo: dict[str, Any], sid: str, sizes: Sizes
) -> list[Rtt]:
    return [await measure_rtt(w, daemon, echo, sid, sizes) for w in WIRES]


def run(sizes: Sizes, tmp: str | None) -> str:
    info = machine_info()
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="ctxd-bench-daemon-", dir=tmp))
    daemon_proc: Proc | None = None
    echo_proc: Proc | None = None
    try:
        daemon_proc, daemon = start_daemon(root)
        echo_proc, echo = start_echo(root)
        print(f"daemon pid {daemon_proc.pid}, echo pid {echo_proc.pid}", flush=True)

        with Client(daemon, "zmq") as c:
            sid = c.create_session(title="round trips")["sessionId"]
            rng = random.Random(1)
            for i in range(10):
                c.append(sid, agent_turn("rtt", i, rng))
        rtts = asyncio.run(rtt_all(daemon, echo, sid, sizes))
        rtt_text, rtt_sum = rtt_section(rtts)
        print(rtt_text, flush=True)
        echo_proc.stop()
        echo_proc = None

        plain_proc, plain = start_daemon(root, "plain", NO_COMPACTION_ENV)
        configs = [
            (wire, compaction, where, clients, shared, turns)
            for wire, compaction, where in [(w, True, daemon) for w in sizes.append_wires]
            + [("zmq", False, plain)]
            for clients, shared, turns in (
                (1, False, sizes.append_turns_one),
                (8, False, sizes.append_turns_each),
                (8, True, sizes.append_turns_each),
            )
        ]
        tried: list[list[AppendRun]] = [[] for _ in configs]
        try:
            # rounds over every configuration, so a burst of load elsewhere on the machine
            # lands on one run of several rather than on all runs of one configuration
            for rnd in range(sizes.append_repeats):
                for i, (wire, compaction, where, clients, shared, turns) in enumerate(configs):
                    r = measure_append(where, wire, compaction, clients, shared, turns)
                    tried[i].append(r)
                    print(
                        f"round {rnd + 1}: {wire}, compaction {compaction}, {clients} "
                        f"client(s), {r.target}: {r.rate:,.0f} msg/s",
                        flush=True,
                    )
        finally:
            plain_proc.stop()
        appends = [sorted(runs, key=lambda r: r.rate)[(len(runs) - 1) // 2] for runs in tried]
        append_text, append_sum = append_section(appends)
        print(append_text, flush=True)

        gets, fill, big_sid = measure_get(daemon, sizes)
        get_text, get_sum = get_section(gets)
        # the fill appends far faster than an agent does: does compaction keep up?
        bound = 4
        get_sum.append(
            (
                f"Peak active context while {gets[1].archived:,} messages were appended "
                f"{sizes.fill_batch} per call",
                f"{fill.peak_messages:,} messages, {fill.peak_tokens:,} tokens",
                f"≤ {bound}× the limits (80 messages, 120,000 tokens)",
                fill.peak_messages <= bound * 80 and fill.peak_tokens <= bound * 120_000,
            )
        )
        print(get_text, flush=True)
        daemon_proc.stop()
        daemon_proc = None
        comp_text = compaction_section(
            compaction_log(root / "data-ctxd" / "ctxd.db", big_sid), fill
        )
        print(comp_text, flush=True)
    finally:
        for p in (echo_proc, daemon_proc):
            if p is not None:
                p.stop()
        shutil.rmtree(root, ignore_errors=True)

    elapsed = time.monotonic() - started
    summary = rtt_sum + append_sum + get_sum
    cmd = "python bench/bench_daemon.py" + (" --full" if sizes.name == "full" else "")
    big = gets[1].archived
    parts = [
        f"# Daemon over the wire ({sizes.name} sizes)",
        "",
        table(["", ""], info),
        "",
        f"Run with `{cmd}`: a real `ctxd serve` process on a fresh data directory "
        "(default configuration: ZeroMQ over ipc, built-in summarizer), clients from the "
        f"benchmark process or its child processes. Total run time {elapsed:.0f} s; load "
        f"average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}.",
        "",
        "## Summary",
        "",
        table(
            ["Measure", "Result", "Target", ""], [[m, r, t, verdict(ok)] for m, r, t, ok in summary]
        ),
        "",
        "## 1. Round trip of `context/status`",
        "",
        f"{sizes.rtt_calls:,} sequential calls per wire and server (one in flight), "
        f"daemon and echo alternating in {sizes.rtt_blocks} blocks, after 300 warm-up calls "
        "each; client: `AsyncClient` in the benchmark process. The echo server (a process "
        "of its own, asyncio like the daemon) answers every request with its params: "
        "pyzmq ROUTER + msgpack, Content-Length JSON over asyncio streams, `websockets` "
        "JSON. The session has 40 messages. The last column is the daemon answering "
        "`tools/list`, which reads no database: what the wire and dispatch cost alone.",
        "",
        rtt_text,
        "",
        "## 2. Append throughput",
        "",
        "One agent turn (4 messages, ~4.5 KB: request, tool call, tool result, answer) per "
        "`messages/append`, outside runs, so auto-compaction runs as it would (after an "
        "append that leaves more than 80 messages). Each client is a process with a "
        f"blocking `Client`; one client appends {sizes.append_turns_one:,} turns, each of "
        f"eight {sizes.append_turns_each:,}, to a fresh session each or to one fresh shared "
        "session. Messages/s over the wall time from the common start to the last "
        f"client's end; each configuration runs {sizes.append_repeats} times, in rounds, "
        "and the run with the median rate is shown. Auto-compaction off: a second daemon "
        "whose limits are never reached (`CTXD_MAX_ACTIVE_MESSAGES`, "
        "`CTXD_MAX_ACTIVE_TOKENS`), so only appends run.",
        "",
        append_text,
        "",
        compaction_share(appends),
        "## 3. `context/get` as the archive grows",
        "",
        f"Two sessions in the same daemon: {gets[0].archived:,} and {big:,} archived "
        f"messages, filled over ZeroMQ {sizes.fill_batch} messages per append with "
        f"auto-compaction on ({big:,} messages in {fill.seconds:.1f} s), then a compaction. "
        f"{sizes.get_calls:,} calls of each, interleaved; `context/status` timed right "
        "after each `context/get` to separate the counters from the messages.",
        "",
        get_text,
        "",
        "### Compactions while filling the big session",
        "",
        comp_text,
    ]
    return "\n".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", action="store_true", help="100,000-message archive, more calls")
    ap.add_argument("--tmp", help="directory for the temporary data directory")
    ap.add_argument("--out", type=Path, default=RESULTS / "daemon.md")
    ap.add_argument("--echo-server", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.echo_server:
        asyncio.run(echo_server_main(args.echo_server.parent, args.echo_server))
        return
    text = run(FULL if args.full else SMALL, args.tmp)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
