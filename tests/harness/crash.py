"""Crash safety under load: `kill -9` the daemon at random moments and prove, after every
restart, that nothing acknowledged was lost, duplicated or reordered.

Clients, each a thread with its own connection, drive three agent sessions (one per
wire: runs, tool calls, approvals, forced compactions, auto-compaction after completed
runs) and one session shared by a client on every wire. A controller keeps a large
context in a fifth session so a forced compaction of it takes long enough to be
interrupted. The daemon is killed at a random moment, right after a `context/compact`
is sent, or on a `$/progress` begin notification.

After each kill, with the daemon dead, the SQLite file is read directly (read-only):

* every acknowledged batch is stored under its `clientBatchId` with the acknowledged
  ids and exactly the sent messages; ids grow in acknowledgement order per client;
* no message is stored twice, no batch is partly stored, the full-text index has a row
  per message;
* the unacknowledged batch of each client is stored whole or not at all;
* the active context is valid: counters equal a recount, the tail does not start with
  a tool result and holds the call of every result in it, every summary source exists,
  the context version counts exactly the committed compactions, the tail starts right
  after what the latest committed compaction summarized, and a session without a new
  committed compaction has the same context as at the previous check;
* runs and approvals are in a state their acknowledged calls allow (pending stays
  pending).

After the restart the same state is read through the API (`context/get`,
`context/status`, `context/explain`, `archive/read`, `approval/list`) and must match the
file; token counts are recounted from `context/get`. Then each client re-sends its
unacknowledged request: a batch re-sent with its `clientBatchId` must return the ids
the crash image holds, or be appended once when the image has none of it.

`CTXD_CRASH_SEED` replays the random choices of a run (thread timing still varies);
`CTXD_CRASH_KILLS` sets the number of kills (default 32).

The tests are in tests/test_crash.py; bench/soak.py runs the same harness longer.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ctxd.clients.client import Client, connect
from ctxd.daemon.tokens import TokenCounter
from ctxd.protocol.codec import FrameReader, dumps_json, frame
from ctxd.protocol.connection import split_endpoint
from tests.harness.image import (
    SessionImage,
    check_context_api,
    check_image,
    open_readonly,
    read_archive,
)
from tests.harness.talk import WIRES, LoggedDaemon, as_wire
from tests.harness.workers import Agent, Ledger, SharedWriter, Worker

# ---------------------------------------------------------------- the controller

BIG_MIN_ACTIVE = 1200  # messages: a forced compaction of these takes tens of ms
MODES = ("random", "compact-send", "random", "progress-begin")


class Harness:
    def __init__(self, root: Path, seed: int, log: Callable[[str], None] = print) -> None:
        self.daemon = LoggedDaemon(root)
        self.db = self.daemon.data_dir / "ctxd.db"
        self.seed = seed
        self.rng = random.Random(seed)
        self.log = log
        self.cond = threading.Condition()
        self.gen = 0
        self.up = False
        self.stopping = False
        self.parked = 0
        self.clients: list[Client] = []
        self.failures: list[str] = []
        self.stats: Counter[str] = Counter()
        self.workers: list[Worker] = []
        self.ledgers: list[Ledger] = []
        self.images: dict[str, SessionImage] = {}
        self.counter = TokenCounter()
        self.sessions: dict[str, str] = {}
        # $/progress tokens seen begin/end during the current daemon's life
        self.begun: dict[str, str] = {}
        self.ended: set[str] = set()
        self.begin_seen = threading.Event()
        self.big_session = ""
        self.verified_upto: dict[str, int] = {}

    # ------------------------------------------------ shared with the client threads

    def fail(self, msg: str) -> None:
        with self.cond:
            self.failures.append(msg)

    def count(self, key: str, n: int = 1) -> None:
        with self.cond:
            self.stats[key] += n

    def alive(self, gen: int) -> bool:
        with self.cond:
            return self.up and self.gen == gen

    def wait_up(self, seen: int) -> int | None:
        """Park until a daemon newer than `seen` is up; None when the test is over."""
        with self.cond:
            self.parked += 1
            self.cond.notify_all()
            try:
                while not self.stopping and not (self.up and self.gen > seen):
                    self.cond.wait()
                return None if self.stopping else self.gen
            finally:
                self.parked -= 1

    def connect(self, wire: str, gen: int) -> Client | None:
        c = connect(connection_file=self.daemon.connection_file, wire=as_wire(wire), timeout=30)
        with self.cond:
            # registered under the lock the kill takes, so no client outlives its daemon
            if self.up and self.gen == gen:
                self.clients.append(c)
                return c
        c.close()
        return None

    # ------------------------------------------------ daemon life

    def start(self) -> None:
        self.daemon.start()
        with self.cond:
            self.gen += 1
        self.begun, self.ended = {}, set()
        self.begin_seen.clear()

    def release(self) -> None:
        with self.cond:
            self.up = True
            self.cond.notify_all()

    def kill(self) -> None:
        with self.cond:
            self.up = False
            clients, self.clients = self.clients, []
        self.daemon.kill()
        for c in clients:  # unblocks every call still waiting for the dead daemon
            c.close()
        self.count("kills")
        deadline = time.monotonic() + 30
        with self.cond:
            while self.parked < len(self.workers):
                left = deadline - time.monotonic()
                if left <= 0:
                    self.failures.append("client threads did not notice the kill in 30 s")
                    break
                self.cond.wait(left)

    def drop_client(self, c: Client) -> None:
        with self.cond:
            if c not in self.clients:
                return  # the kill closed it
            self.clients.remove(c)
        c.close()

    def own_client(self, wire: str) -> Client:
        c = connect(connection_file=self.daemon.connection_file, wire=as_wire(wire), timeout=30)
        with self.cond:
            self.clients.append(c)
        return c

    def on_event(self, method: str, params: dict[str, Any]) -> None:
        if method != "$/progress":
            self.count(f"event {method}")
            return
        kind = params.get("value", {}).get("kind")
        if kind == "begin":
            self.begun[params["token"]] = params["sessionId"]
            if params["sessionId"] == self.big_session:  # the one slow enough to cut short
                self.begin_seen.set()
        elif kind == "end":
            self.ended.add(params["token"])

    def raw_compact(self, sid: str) -> socket.socket:
        """Send `context/compact` on a fresh TCP connection without waiting for it."""
        info = self.daemon.info()
        host, port = split_endpoint(info["jsonrpc_tcp"])
        s = socket.create_connection((host, int(port)), timeout=10)
        s.sendall(
            frame(
                dumps_json(
                    {
                        "jsonrpc": "2.0",
                        "id": 1,
                        "method": "initialize",
                        "params": {"token": info["token"]},
                    }
                )
            )
        )
        reader = FrameReader()
        while not reader.feed(s.recv(65536)):
            pass
        s.sendall(
            frame(
                dumps_json(
                    {
                        "jsonrpc": "2.0",
                        "id": 2,
                        "method": "context/compact",
                        "params": {"sessionId": sid, "force": True},
                    }
                )
            )
        )
        return s

    # ------------------------------------------------ the big session

    def feed_big(self, c: Client, big: Ledger, run_id: str) -> None:
        """Grow the big session's context until a forced compaction of it takes a while."""
        active = c.call("context/status", {"sessionId": big.session})["activeMessages"]
        while active < BIG_MIN_ACTIVE:
            msgs: list[dict[str, Any]] = []
            while len(msgs) < 400:
                part, left = big.talk.batch([], allow_user=True)
                msgs += part + [big.talk.result(call) for call in left]
            big.append(c, msgs, run_id)
            active = c.call("context/status", {"sessionId": big.session})["activeMessages"]

    # ------------------------------------------------ checks

    def check_dead(self, full: bool = False) -> None:
        t = time.monotonic()
        self.images = check_image(self.db, self.ledgers, self.images, self.fail, full)
        self.stats["image_check_seconds"] += time.monotonic() - t
        # compactions this daemon began: finished (a row) or cut short by the kill
        conn = open_readonly(self.db)
        cut = 0
        try:
            for token, sid in self.begun.items():
                row = conn.execute(
                    "SELECT committed FROM compactions WHERE id = ?", (token,)
                ).fetchone()
                if row is None:
                    cut += 1
                    if token in self.ended:
                        self.fail(f"compaction {token} of {sid} ended but left no row")
                elif row[0]:
                    self.count("compactions_committed_before_kill")
        finally:
            conn.close()
        if cut:
            self.count("kills_mid_compaction")
            self.count("compactions_cut_short", cut)

    def check_live(self, wire: str) -> None:
        c = self.own_client(wire)
        try:
            for sid, img in self.images.items():
                got = check_context_api(c, sid, self.counter, self.fail)
                status, msgs = got["status"], got["context"]["messages"]
                where = f"session {sid} ({wire})"
                has_summary = 1 if img.summary_tokens else 0
                want = {
                    "activeMessages": img.active_messages + has_summary,
                    "estimatedTokens": img.active_tokens + img.summary_tokens,
                    "archiveMessages": len(img.ids),
                    "compactionCount": img.compaction_count,
                    "pendingApprovals": len(img.pending_approvals),
                    "activeRunId": img.open_runs[0] if img.open_runs else None,
                }
                seen = {k: status[k] for k in want}
                if seen != want:
                    self.fail(f"{where}: status {seen}, the file holds {want}")
                n_sys = len(img.system)
                if msgs[:n_sys] != img.system or msgs[n_sys + has_summary :] != img.tail:
                    self.fail(f"{where}: context/get differs from the stored context")
                ids = got["context"].get("messageIds")
                tail_ids = [
                    i for i in img.ids if img.tail_start_id is not None and i >= img.tail_start_id
                ]
                if ids is not None and ids != img.system_ids + [None] * has_summary + tail_ids:
                    self.fail(f"{where}: context/get messageIds differ from the stored context")
                after = self.verified_upto.get(sid, 0)
                archived = [m["id"] for m in read_archive(c, sid, after)]
                if archived != [i for i in img.ids if i > after]:
                    self.fail(f"{where}: archive/read ids differ from the file after {after}")
                self.verified_upto[sid] = img.ids[-1] if img.ids else 0
                pending = c.call("approval/list", {"sessionId": sid, "status": "pending"})
                got_pending = {a["approvalId"] for a in pending["approvals"]}
                if got_pending != img.pending_approvals:
                    self.fail(
                        f"{where}: pending approvals {got_pending}, stored {img.pending_approvals}"
                    )
        finally:
            self.drop_client(c)

    # ------------------------------------------------ the run

    def run(self, kills: int, work: tuple[float, float] = (0.3, 1.2)) -> Counter[str]:
        started = time.monotonic()
        self.start()
        # ZeroMQ: closing it does not interrupt the big session's run (a stream would)
        c = self.own_client("zmq")
        sids = {
            name: c.call("session/create", {"title": name})["sessionId"]
            for name in ("agz", "agr", "agw", "shared", "big")
        }
        c.call(
            "context/pins/add",
            {"sessionId": sids["agr"], "text": "Never touch the production database."},
        )
        seed = self.rng.randrange(2**32)
        agents = [
            Agent(self, name, wire, sids[name], seed + i)
            for i, (name, wire) in enumerate(zip(("agz", "agr", "agw"), WIRES, strict=True))
        ]
        shared = [
            SharedWriter(self, f"sh{w[0]}", w, sids["shared"], seed + 10 + i)
            for i, w in enumerate(WIRES)
        ]
        self.workers = [*agents, *shared]
        big = Ledger(self, "big", sids["big"], seed + 20)
        self.big_session = big.session
        self.ledgers = [*self.workers, big]
        big_run = c.call("run/start", {"sessionId": sids["big"]})["runId"]
        big.runs[big_run] = {"open"}  # never finished: keeps auto-compaction off there
        for w in self.workers:
            w.thread.start()
        modes = [MODES[i % len(MODES)] for i in range(kills)]
        self.rng.shuffle(modes)
        for i, mode in enumerate(modes):
            self.cycle(mode, sids, big, big_run)
            if self.failures:
                break
            self.start()
            self.check_live(WIRES[i % 3])
            if self.failures:
                break
        else:
            self.finish(sids)
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        if self.daemon.proc is not None and self.daemon.proc.poll() is None:
            self.daemon.kill()
        self.stats["seconds"] = round(time.monotonic() - started, 1)
        self.stats["archived_messages"] = sum(len(i.ids) for i in self.images.values())
        self.stats["image_check_seconds"] = round(self.stats["image_check_seconds"], 2)
        return self.stats

    def cycle(self, mode: str, sids: dict[str, str], big: Ledger, big_run: str) -> None:
        """Let the clients work, kill the daemon as `mode` says, check the crash image."""
        events = self.own_client("jsonrpc")
        events.on_notification(self.on_event)
        for sid in sids.values():
            events.subscribe(sid)
        feeder = self.own_client("zmq")
        self.release()
        sock: socket.socket | None = None
        if mode == "random":
            time.sleep(self.rng.uniform(0.3, 1.2))
        else:
            self.feed_big(feeder, big, big_run)
            time.sleep(self.rng.uniform(0.05, 0.3))
            self.begin_seen.clear()
            sock = self.raw_compact(sids["big"])
            if mode == "compact-send":
                time.sleep(self.rng.uniform(0, 0.03))
            elif not self.begin_seen.wait(10):
                self.fail("no $/progress begin within 10 s of context/compact")
            else:
                time.sleep(self.rng.uniform(0, 0.004))
        self.kill()
        if sock is not None:
            sock.close()
        self.stats[f"kills {mode}"] += 1
        self.check_dead()

    def finish(self, sids: dict[str, str]) -> None:
        """The last daemon: every client settles its lost request and stops; after a
        clean shutdown the file and then a fresh daemon are checked once more."""
        self.release()
        time.sleep(1.0)
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        for w in self.workers:
            w.thread.join(60)
            if w.thread.is_alive():
                self.fail(f"{w.name} did not stop")
        for w in self.workers:
            if isinstance(w, Agent) and w.run_id is not None and w.wire != "zmq":
                # its connection closed with the run open: the daemon interrupts it
                w.runs[w.run_id] = {"interrupted"}
        c = self.own_client("zmq")
        deadline = time.monotonic() + 20
        for sid in sids.values():
            while True:
                st = c.call("context/status", {"sessionId": sid})
                agent = [w for w in self.workers if isinstance(w, Agent) and w.session == sid]
                closing = agent and agent[0].wire != "zmq" and st["activeRunId"] is not None
                if not (st["compacting"] or closing) or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        with self.cond:
            self.up = False
            clients, self.clients = self.clients, []
        for cl in clients:
            cl.close()
        if self.daemon.stop() != 0:
            self.fail(f"the daemon did not stop cleanly: {self.daemon.log_tail()}")
        for led in self.ledgers:
            if led.pending is not None or led.inflight is not None:
                self.fail(f"{led.name} ended with an unsettled request")
        self.begun = {}  # not a kill: nothing was cut short
        self.check_dead(full=True)
        self.start()
        self.verified_upto = {}  # read every session's whole archive through the API
        self.check_live("websocket")
        with self.cond:
            clients, self.clients = self.clients, []
        for cl in clients:
            cl.close()
        if self.daemon.stop() != 0:
            self.fail(f"the daemon did not stop cleanly: {self.daemon.log_tail()}")



def crash_seed() -> int:
    env = os.environ.get("CTXD_CRASH_SEED")
    return int(env) if env else random.SystemRandom().randrange(2**32)


def run_crash(
    root: Path, seed: int, kills: int, log: Callable[[str], None] = print
) -> tuple[Counter[str], list[str]]:
    h = Harness(root, seed, log)
    try:
        stats = h.run(kills)
    except BaseException:
        h.stopping = True
        if h.daemon.proc is not None and h.daemon.proc.poll() is None:
            h.daemon.kill()
        raise
    return stats, h.failures


def _iter_lines(stats: Counter[str]) -> Iterator[str]:
    for key in sorted(stats):
        yield f"  {key}: {stats[key]}"

