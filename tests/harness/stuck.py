"""Clients that stop reading: a TCP or ZeroMQ subscriber that never reads while tens of
MiB of events are published for it, and load from separate processes meanwhile."""

from __future__ import annotations

import asyncio
import inspect
import json
import random
import socket
import time
from pathlib import Path
from typing import Any

import msgpack
import zmq

from ctxd.clients.client import AsyncClient, connect_async
from ctxd.daemon.servers.zmq_server import ZmqServer
from ctxd.protocol.codec import FrameReader, dumps_json, frame
from ctxd.protocol.connection import split_endpoint
from tests.harness.image import read_archive
from tests.harness.probes import (
    MIB,
    Child,
    RoundTrips,
    RssSampler,
    client_for,
    until_stdin,
)
from tests.harness.soak import Subscriber
from tests.harness.talk import LoggedDaemon, Talker, as_wire

# ---------------------------------------------------------------- clients that stop reading

# the daemon may grow by at most this while tens of MiB of events go to a stuck client
STUCK_RSS_GROWTH_KIB = 32 * 1024
# ...and this much is published to it meanwhile: more than the limit could hold
STUCK_EVENT_MIB = 64
# Approval events are the largest: the tool's arguments (cut at 2048 characters in
# events) and, once resolved, the reason (up to 4096). Chinese text takes 3 bytes a
# character in UTF-8, so each round publishes about 25 KB.
ARGUMENT_TEXT = ("把配置文件里的数据库地址改成只读副本，并且在迁移完成之前不要重启服务。" * 50)[
    :2000
]
REASON_TEXT = ("这个改动会影响生产环境的连接池，先在预发布环境验证，确认没有问题再执行。" * 120)[
    :4096
]


class Load:
    """Load on one session from a separate process (its own interpreter lock, so the
    daemon sets the pace): an asyncio client per wire with several requests in flight.
    `appends`: small batches; `approvals`: tool calls asked for and resolved with long
    arguments and reasons, inside one run. Acknowledged ids come back at the end."""

    def __init__(self, d: LoggedDaemon, sid: str, mode: str, concurrency: int = 8) -> None:
        self.d, self.args = d, (sid, mode, "zmq,jsonrpc", str(concurrency))
        self.acked: list[int] = []
        self.rounds = 0
        self.errors: list[str] = []
        self.child: Child | None = None

    def start(self) -> None:
        self.child = Child(self.d, "load_main", *self.args)

    def join(self, timeout: float) -> None:
        if self.child is not None:
            report = self.child.finish(timeout)
            self.acked = report.get("acked", [])
            self.rounds = report.get("rounds", 0)
            self.errors = report.get("errors", [])


def load_main(argv: list[str]) -> None:
    """The load process: runs until a line arrives on stdin, then reports."""
    connection_file, sid, mode, wires, concurrency = argv
    acked: list[int] = []
    errors: list[str] = []
    rounds = 0

    async def appends(c: AsyncClient, name: str, stop: asyncio.Event) -> None:
        talk = Talker(name, random.Random(name))
        while not stop.is_set():
            msgs, _ = talk.batch([], True, allow_open=False)
            reply = await c.call("messages/append", {"sessionId": sid, "messages": msgs})
            acked.extend(reply["messageIds"])

    async def approvals(c: AsyncClient, name: str, run: str, stop: asyncio.Event) -> None:
        nonlocal rounds
        n = 0
        while not stop.is_set():
            n += 1
            call = {
                "id": f"call_{name}_{n}",
                "type": "function",
                "function": {"name": "write_file", "arguments": '{"path": "README.zh.md"}'},
            }
            reply = await c.call(
                "messages/append",
                {
                    "sessionId": sid,
                    "runId": run,
                    "messages": [
                        {"role": "assistant", "content": "修改说明文件。", "tool_calls": [call]}
                    ],
                },
            )
            acked.extend(reply["messageIds"])
            approval = await c.call(
                "approval/request",
                {
                    "sessionId": sid,
                    "runId": run,
                    "toolCallId": call["id"],
                    "toolName": "write_file",
                    "arguments": {"path": "README.zh.md", "content": ARGUMENT_TEXT},
                },
            )
            await c.call(
                "approval/resolve",
                {"approvalId": approval["approvalId"], "decision": "denied", "reason": REASON_TEXT},
            )
            reply = await c.call(
                "messages/append",
                {
                    "sessionId": sid,
                    "runId": run,
                    "messages": [
                        {
                            "role": "tool",
                            "tool_call_id": call["id"],
                            "content": "用户拒绝了这次修改。",
                        }
                    ],
                },
            )
            acked.extend(reply["messageIds"])
            rounds += 1

    async def worker(task: Any) -> None:
        try:
            await task
        except Exception as exc:
            errors.append(repr(exc))

    async def main() -> None:
        stop = asyncio.Event()
        await until_stdin(stop)
        clients = [
            await connect_async(connection_file=connection_file, wire=as_wire(w))
            for w in wires.split(",")
        ]
        names = "abcdefghijklmnop"[: int(concurrency)]
        if mode == "approvals":
            run = (await clients[0].call("run/start", {"sessionId": sid}))["runId"]
            tasks = [approvals(c, f"ap{c.wire[0]}{k}", run, stop) for c in clients for k in names]
        else:
            tasks = [appends(c, f"fl{c.wire[0]}{k}", stop) for c in clients for k in names]
        await asyncio.gather(*(worker(t) for t in tasks))
        if mode == "approvals":
            await clients[0].call("run/finish", {"runId": run, "outcome": "completed"})
        for c in clients:
            await c.close()

    asyncio.run(main())
    print(json.dumps({"acked": acked, "rounds": rounds, "errors": errors}), flush=True)


class StuckTcp:
    """A JSON-RPC TCP client that authenticates, subscribes, then never reads again."""

    def __init__(self, d: LoggedDaemon, sid: str) -> None:
        info = d.info()
        host, port = split_endpoint(info["jsonrpc_tcp"])
        self.sock = socket.socket()
        # a small window so the daemon's queue, not the kernel, holds what is unread
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect((host, int(port)))
        reader = FrameReader()
        for i, (method, params) in enumerate(
            (("initialize", {"token": info["token"]}), ("session/subscribe", {"sessionId": sid}))
        ):
            self.sock.sendall(
                frame(dumps_json({"jsonrpc": "2.0", "id": i, "method": method, "params": params}))
            )
            while not reader.feed(self.sock.recv(65536)):
                pass

    def drain(self, timeout: float) -> dict[str, Any]:
        """Read again: the events queued before it fell behind, then the notice of what
        it missed. How it ended: `notice`, `eof`, `reset`, or `open` (no notice within
        `timeout`)."""
        self.sock.settimeout(timeout)
        reader = FrameReader()
        total, events, missed, end = 0, 0, None, "open"
        try:
            while missed is None:
                data = self.sock.recv(1 << 20)
                if not data:
                    end = "eof"
                    break
                total += len(data)
                for body in reader.feed(data):
                    msg = json.loads(body)
                    if msg.get("method") == "session/didMissEvents":
                        missed, end = msg["params"]["missed"], "notice"
                    elif "method" in msg:
                        events += 1
        except ConnectionResetError:
            end = "reset"
        except TimeoutError:
            pass
        finally:
            self.sock.close()
        return {"stuck_bytes_read": total, "stuck_events_read": events,
                "stuck_missed": missed, "stuck_end": end}


def stuck_run(
    tmp_path: Path,
    stuck_kind: str,
    flood_seconds: float,
    min_events: int,
    event_mib: float,
    big_first: bool = False,
) -> tuple[dict[str, Any], list[str]]:
    """A busy session with a stuck subscriber (`tcp`, `zmq` or `none`) and a healthy one.

    One phase floods the session with small appends for `flood_seconds` (longer, up to
    90 s, until `min_events` batches were published); the other publishes `event_mib`
    MiB of approval events (first with `big_first`). The daemon's memory is sampled
    throughout; its growth is reported per phase.
    """
    failures: list[str] = []
    d = LoggedDaemon(tmp_path).start()
    stats: dict[str, Any] = {"stuck": stuck_kind}
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        c = client_for(d, "zmq")
        sid = c.call("session/create", {"title": "busy"})["sessionId"]
        healthy = Subscriber(d, "zmq" if stuck_kind == "zmq" else "jsonrpc", [sid])
        stuck_tcp = StuckTcp(d, sid) if stuck_kind == "tcp" else None
        sub = _stuck_sub(ctx, d, sid) if stuck_kind == "zmq" else None
        time.sleep(0.3)
        rss0 = d.status_kib("VmRSS")
        flood, big = Load(d, sid, "appends"), Load(d, sid, "approvals")
        spans: dict[str, tuple[float, float, int]] = {}  # phase: (start, end, rss at start)
        with RssSampler(d, 0.05) as rss, RoundTrips(d, "websocket", 0.05) as trips:
            started = time.monotonic()
            for phase in ("big", "flood") if big_first else ("flood", "big"):
                t0, rss_t0 = time.monotonic(), d.status_kib("VmRSS")
                if phase == "flood":
                    base = healthy.events["session/didAppend"]
                    flood.start()
                    while time.monotonic() - t0 < flood_seconds or (
                        healthy.events["session/didAppend"] - base < min_events
                        and time.monotonic() - t0 < 90
                    ):
                        time.sleep(0.1)
                    flood.join(30)
                else:
                    target = healthy.event_bytes + event_mib * MIB
                    big.start()
                    while healthy.event_bytes < target and time.monotonic() - t0 < 120:
                        time.sleep(0.1)
                    big.join(30)
                time.sleep(0.5)
                spans[phase] = (t0 - started, time.monotonic() - started, rss_t0)
            elapsed = time.monotonic() - started
        failures += flood.errors + big.errors
        stats.update(
            rss_start_kib=rss0,
            rss_peak_kib=rss.peak(),
            rss_flood_growth_kib=rss.peak(*spans["flood"][:2]) - spans["flood"][2],
            rss_big_growth_kib=rss.peak(*spans["big"][:2]) - spans["big"][2],
            small_appends=len(flood.acked),
            approval_rounds=big.rounds,
            approval_event_bytes=healthy.event_bytes,
            flood_seconds=round(spans["flood"][1] - spans["flood"][0], 1),
            seconds=round(elapsed, 1),
            round_trips=trips.summary(),
        )
        if trips.errors:
            failures.append(f"round-trip probe failed: {trips.errors[:3]}")
        # the daemon kept serving, and the healthy subscriber got every batch
        archived = [m["id"] for m in read_archive(c, sid)]
        deadline = time.monotonic() + 20
        ids: list[int] = []
        while time.monotonic() < deadline:
            ids = [i for _, mids in healthy.appends[sid] for i in mids]
            if len(ids) >= len(archived):
                break
            time.sleep(0.1)
        # A reader slowed by the machine's load may itself pass the shedding mark: then
        # it was told how many events it missed, and what it saw is the archive in order
        # with gaps. Without a notice it must have seen every message.
        stats["healthy_missed"] = healthy.missed
        if ids != archived and (healthy.missed == 0 or not _in_order_within(ids, archived)):
            failures.append(f"healthy subscriber saw {len(ids)} of {len(archived)} messages")
        if not set(flood.acked + big.acked) <= set(archived):
            failures.append("acknowledged appends missing from the archive")
        # what it heard plus what it was told it missed
        heard = sum(n for m, n in healthy.events.items() if m != "session/didMissEvents")
        stats["events_published"] = heard + healthy.missed
        if stuck_tcp is not None:
            stats.update(stuck_tcp.drain(30))
        if sub is not None:
            stats["stuck_events_read"] = _drain_sub(sub)
        healthy.c.close()
        c.close()
        log_text = d.log_tail(1 << 24)
        stats["daemon_log_drops"] = log_text.count("the client stopped reading")
        stats["daemon_log_sheds"] = log_text.count("dropping its events until it reads again")
        if d.stop() != 0:
            failures.append(f"the daemon did not stop cleanly: {d.log_tail()}")
    finally:
        ctx.destroy(linger=0)
        if d.proc is not None and d.proc.poll() is None:
            d.kill()
    return stats, failures


def _in_order_within(seen: list[int], archived: list[int]) -> bool:
    """Whether `seen` is `archived` with some ids left out, nothing repeated or moved."""
    remaining = iter(archived)
    return all(any(i == a for a in remaining) for i in seen)


def _stuck_sub(ctx: zmq.Context[Any], d: LoggedDaemon, sid: str) -> zmq.Socket[Any]:
    """A SUB socket on the session that reads its subscription probe, then nothing."""
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 10)
    sub.setsockopt(zmq.RCVBUF, 4096)
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(d.info()["zmq_pub"])
    sub.subscribe(f"session/{sid}".encode())
    probe = b"probe/stuck"
    sub.subscribe(probe)
    while True:
        if not sub.poll(10_000):
            raise TimeoutError("no subscription probe")
        topic, payload = sub.recv_multipart()
        if topic == probe and msgpack.unpackb(payload)["method"] == "$/probe":
            return sub


def _drain_sub(sub: zmq.Socket[Any]) -> int:
    n = 0
    while sub.poll(1000):
        sub.recv_multipart()
        n += 1
    return n


def pub_hwm() -> int:
    """The daemon's high-water mark for each subscriber of its PUB socket (messages)."""
    return int(inspect.signature(ZmqServer).parameters["pub_hwm"].default)


def stuck_zmq_events() -> int:
    # well past the high-water mark, so the publisher has to drop for the stuck SUB
    return max(3 * pub_hwm(), pub_hwm() + 2000)


def _check_responsive(stats: dict[str, Any]) -> None:
    trips = stats["round_trips"]
    assert trips["n"] > 20 and trips["median_ms"] < 250 and trips["max_ms"] < 5000, trips

