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
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apsw
import pytest
from helpers import DaemonProcess

from ctxd.clients.client import Client, connect
from ctxd.daemon.tokens import TokenCounter
from ctxd.protocol.codec import FrameReader, dumps_json, frame
from ctxd.protocol.errors import CompactionInProgress, Conflict, CtxdError

WIRES = ("zmq", "jsonrpc", "websocket")

# ---------------------------------------------------------------- the daemon process


class LoggedDaemon(DaemonProcess):
    """`DaemonProcess` with its output in a file.

    A pipe nobody reads would stop the daemon once its log fills the pipe buffer, which
    a stuck subscriber (one warning per dropped event) does quickly.
    """

    def __init__(self, root: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        super().__init__(root, *extra, env=env)
        self.log_path = root / "daemon.log"

    def start(self, timeout: float = 30.0) -> LoggedDaemon:
        self.connection_file.unlink(missing_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(), env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                if self.info().get("pid") == self.proc.pid:
                    return self
            except (OSError, ValueError):
                pass  # not written yet
            if time.monotonic() > deadline:
                raise TimeoutError("daemon did not write its connection file")
            time.sleep(0.01)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def status_kib(self, key: str = "VmRSS") -> int:
        """A `kB` line of /proc/<pid>/status (VmRSS, VmHWM, ...)."""
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
        raise KeyError(key)

    def log_tail(self, limit: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""


# ---------------------------------------------------------------- messages

EN_USER = [
    "Please find out why the {x} test fails on CI and fix it.",
    "Refactor the {x} loader but keep its public API unchanged.",
    "Never touch the production database while working on {x}.",
    "Add a retry with backoff around the {x} client calls.",
    "Can you check the memory use of the {x} worker under load?",
]
ZH_USER = [
    "请检查 {x} 测试为什么在 CI 上失败，并修复它。",
    "重构 {x} 的加载逻辑，但不要改变公开接口。",
    "处理 {x} 的时候不要碰生产数据库。",
    "给 {x} 客户端的调用加上带退避的重试。",
    "看一下 {x} 进程在高负载下的内存占用。",
]
EN_SAY = [
    "The {x} module reads its config twice; I removed the second read.",
    "Done: {x} now passes locally and the lint is clean.",
    "I found the cause: {x} keeps a stale cache entry after reload.",
]
ZH_SAY = [
    "{x} 模块读取了两次配置，我删掉了第二次。",
    "完成：{x} 在本地测试通过，代码检查也没有问题。",
    "找到原因了：{x} 重新加载后保留了过期的缓存。",
]
TOPICS = ["parser", "scheduler", "archive", "session", "tokenizer", "上下文压缩", "索引", "迁移"]
MARKER = re.compile(r"mk[a-z]+n\d+")


class Talker:
    """Builds one client's chat messages, already in the shape the archive stores.

    Every message carries a marker word unique in the whole test (`mk<name>n<count>`,
    one full-text token), so each archived message can be traced to the batch that sent
    it and a duplicate shows up as a repeated body.
    """

    def __init__(self, name: str, rng: random.Random) -> None:
        if not name.isalpha() or not name.islower():
            raise ValueError("talker names are lowercase letters (markers must parse)")
        self.name = name
        self.rng = rng
        self.count = 0
        self.calls = 0

    def mark(self) -> str:
        self.count += 1
        return f"mk{self.name}n{self.count}"

    def _line(self, en: list[str], zh: list[str]) -> str:
        pool = zh if self.rng.random() < 0.4 else en
        return self.rng.choice(pool).format(x=self.rng.choice(TOPICS))

    def system(self) -> dict[str, Any]:
        return {"role": "system", "content": f"You are a careful coding agent. {self.mark()}"}

    def user(self) -> dict[str, Any]:
        return {"role": "user", "content": f"{self._line(EN_USER, ZH_USER)} {self.mark()}"}

    def say(self) -> dict[str, Any]:
        return {"role": "assistant", "content": f"{self._line(EN_SAY, ZH_SAY)} {self.mark()}"}

    def call(self, n: int = 1, tool: str = "read_file") -> dict[str, Any]:
        calls = []
        for _ in range(n):
            self.calls += 1
            args = {"path": f"src/{self.rng.choice(TOPICS)}/mod{self.calls}.py"}
            if tool == "write_file":
                args["content"] = "def main():\n    return 0\n" * self.rng.randint(1, 20)
            calls.append(
                {
                    "id": f"call_{self.name}_{self.calls}",
                    "type": "function",
                    "function": {"name": tool, "arguments": json.dumps(args)},
                }
            )
        note = "Let me look at the code." if self.rng.random() < 0.6 else "我先看一下代码。"
        return {"role": "assistant", "content": f"{note} {self.mark()}", "tool_calls": calls}

    def result(self, call_id: str, denied: bool = False) -> dict[str, Any]:
        if denied:
            body = "The user denied this tool call."
        else:
            lines = self.rng.randint(2, 40)
            body = "".join(f"{i:4d}  value = compute({i}) # 计算 {i}\n" for i in range(lines))
        return {"role": "tool", "tool_call_id": call_id, "content": f"{body}{self.mark()}"}

    def batch(
        self,
        open_calls: list[str],
        allow_user: bool,
        denied: set[str] | None = None,
        allow_open: bool = True,
    ) -> tuple[list[dict[str, Any]], list[str]]:
        """1-5 messages that keep every tool call before its result.

        Returns the messages and the calls they leave open, which the next batch answers
        (only with `allow_open`: in a session with several writers another client's
        message would come between a call and its result).
        """
        if open_calls:
            msgs = [self.result(c, c in (denied or set())) for c in open_calls]
            if self.rng.random() < 0.5:
                msgs.append(self.say())
            return msgs, []
        shape = self.rng.choice(["user", "turn", "open", "parallel", "say", "pair"])
        if shape == "user" and allow_user:
            return [self.user()], []
        if shape == "turn":
            call = self.call()
            head = [self.user()] if allow_user else []
            return [*head, call, self.result(_ids(call)[0]), self.say()], []
        if shape == "open" and allow_open:
            call = self.call(self.rng.randint(1, 2))
            head = [self.user()] if allow_user else []
            return [*head, call], _ids(call)
        if shape == "parallel":
            call = self.call(2)
            return [call, *(self.result(c) for c in _ids(call)), self.say()], []
        if shape == "pair":
            call = self.call()
            return [call, self.result(_ids(call)[0])], []
        return [self.say()], []


def _ids(call: dict[str, Any]) -> list[str]:
    return [c["id"] for c in call["tool_calls"]]


def marker_of(msg: dict[str, Any]) -> str:
    found = MARKER.findall(msg.get("content") or "")
    assert found, msg
    return found[-1]


# ---------------------------------------------------------------- what clients sent


@dataclass
class Batch:
    key: str  # clientBatchId
    session: str
    messages: list[dict[str, Any]]
    run_id: str | None
    ids: list[int] = field(default_factory=list)  # acknowledged archive ids
    batch_id: int | None = None
    # unacknowledged: ids the latest crash image holds under `key` (None: not there)
    found: list[int] | None = None
    checked: bool = False  # contents compared with the archive

    def params(self) -> dict[str, Any]:
        p: dict[str, Any] = {
            "sessionId": self.session,
            "messages": self.messages,
            "clientBatchId": self.key,
        }
        if self.run_id is not None:
            p["runId"] = self.run_id
        return p


class Ledger:
    """What one client sent and what was acknowledged, in order."""

    def __init__(self, h: Harness, name: str, session: str, seed: int) -> None:
        self.h = h
        self.name = name
        self.session = session
        self.rng = random.Random(seed)
        self.talk = Talker(name, self.rng)
        self.acked: list[Batch] = []
        self.pending: Batch | None = None  # sent, not acknowledged
        self.last_id = 0
        self.seq = 0
        # run id -> statuses the archive may show; approval id -> likewise
        self.runs: dict[str, set[str]] = {}
        self.approvals: dict[str, set[str]] = {}
        # (method, params) of a request other than an append, sent and not acknowledged
        self.inflight: tuple[str, dict[str, Any]] | None = None
        self.unknown_runs = 0  # run/start calls whose reply was lost

    def append(self, c: Client, messages: list[dict[str, Any]], run_id: str | None) -> Batch:
        self.seq += 1
        b = Batch(f"{self.name}-{self.seq}", self.session, messages, run_id)
        self.pending = b
        self.ack(b, c.call("messages/append", b.params()))
        return b

    def ack(self, b: Batch, reply: dict[str, Any]) -> None:
        ids = reply["messageIds"]
        if len(ids) != len(b.messages) or ids != list(range(ids[0], ids[0] + len(ids))):
            self.h.fail(f"{b.key}: acknowledged ids {ids} for {len(b.messages)} messages")
        if ids and ids[0] <= self.last_id:
            self.h.fail(f"{b.key}: ids {ids} do not follow {self.last_id} (client order)")
        b.ids, b.batch_id = list(ids), reply["batchId"]
        self.last_id = max(self.last_id, ids[-1]) if ids else self.last_id
        self.acked.append(b)
        self.pending = None
        self.h.count("acked_batches")
        self.h.count("acked_messages", len(ids))

    def resend(self, c: Client) -> None:
        """Re-send the unacknowledged batch with its clientBatchId after a restart."""
        b = self.pending
        if b is None:
            return
        reply = c.call("messages/append", b.params())
        if b.found is not None:
            self.h.count("resent_found_in_image")
            if reply["messageIds"] != b.found:
                self.h.fail(
                    f"{b.key}: re-send returned {reply['messageIds']}, the crash "
                    f"image holds it as {b.found}"
                )
        else:
            self.h.count("resent_absent_from_image")
        self.ack(b, reply)

    def op(self, c: Client, method: str, params: dict[str, Any]) -> Any:
        self.inflight = (method, params)
        result = c.call(method, params)
        self.inflight = None
        return result


# ---------------------------------------------------------------- client threads


class Worker(Ledger):
    """A client thread: reconnects after each restart, settles its unacknowledged
    request, then drives its session until the daemon dies again."""

    wire = "zmq"
    sole_writer = True  # may leave a call open for its next batch to answer

    def __init__(self, h: Harness, name: str, wire: str, session: str, seed: int) -> None:
        super().__init__(h, name, session, seed)
        self.thread = threading.Thread(target=self.run, name=f"client-{name}", daemon=True)
        self.wire = wire
        self.open_calls: list[str] = []
        self.denied: set[str] = set()

    def run(self) -> None:
        seen = 0
        while True:
            gen = self.h.wait_up(seen)
            if gen is None:
                return
            seen = gen
            client: Client | None = None
            try:
                client = self.h.connect(self.wire, gen)
                if client is None:
                    continue
                self.resend(client)
                self.settle(client)
                while not self.h.stopping:
                    self.step(client)
            except (ConnectionError, TimeoutError) as exc:
                if self.h.alive(gen):
                    self.h.fail(f"{self.name} ({self.wire}) lost a live daemon: {exc!r}")
            except Exception as exc:
                self.h.fail(f"{self.name} ({self.wire}): {exc!r}\n{traceback.format_exc()}")
            finally:
                if client is not None and self.h.stopping:
                    self.h.drop_client(client)

    def settle(self, c: Client) -> None:
        """Finish what the previous daemon may or may not have done."""
        if self.inflight is None:
            return
        method, params = self.inflight
        self.inflight = None
        self.h.count(f"unacked {method}")
        if method == "run/start":
            self.unknown_runs += 1
            self.start_run(c)
        elif method == "run/finish":
            outcome = params["outcome"]
            try:
                c.call(method, params)
            except Conflict as exc:  # the dead daemon committed it
                if exc.data.get("status") != outcome:
                    self.h.fail(
                        f"{self.name}: run {params['runId']} is "
                        f"{exc.data.get('status')}, finished as {outcome}"
                    )
            self.runs[params["runId"]] = {outcome}
            self.finished_run()
        elif method == "approval/request":
            pending = c.call("approval/list", {"sessionId": self.session, "status": "pending"})
            mine = [a for a in pending["approvals"] if a["toolCallId"] == params["toolCallId"]]
            if mine:
                self.approval_requested(mine[0]["approvalId"], params["toolCallId"])
            else:
                self.request_approval(c, params["toolCallId"])
        elif method == "approval/resolve":
            try:
                c.call(method, params)
            except Conflict as exc:
                if exc.data.get("status") != params["decision"]:
                    self.h.fail(
                        f"{self.name}: approval {params['approvalId']} is "
                        f"{exc.data.get('status')}, resolved as {params['decision']}"
                    )
            self.approval_resolved(params["approvalId"], params["decision"])
        # compactions and reads need nothing: a compaction is applied or absent

    # overridden by agents
    def step(self, c: Client) -> None:
        self.append_some(c, allow_user=True, run_id=None)

    def start_run(self, c: Client) -> None:
        raise NotImplementedError

    def finished_run(self) -> None:
        pass

    def request_approval(self, c: Client, call_id: str) -> None:
        raise NotImplementedError

    def approval_requested(self, approval_id: str, call_id: str) -> None:
        pass

    def approval_resolved(self, approval_id: str, decision: str) -> None:
        pass

    # shared actions

    def append_some(self, c: Client, allow_user: bool, run_id: str | None) -> None:
        msgs, self.open_calls = self.talk.batch(
            self.open_calls, allow_user, self.denied, allow_open=self.sole_writer
        )
        self.append(c, msgs, run_id)

    def compact(self, c: Client) -> None:
        try:
            result = self.op(c, "context/compact", {"sessionId": self.session, "force": True})
            self.h.count(
                "forced_compactions_effective"
                if result["effective"]
                else "forced_compactions_not_effective"
            )
        except CompactionInProgress:
            self.inflight = None
            self.h.count("forced_compactions_busy")

    def read(self, c: Client) -> None:
        if self.acked and self.rng.random() < 0.5:
            b = self.acked[-1]
            i = self.rng.randrange(len(b.messages))
            mark = marker_of(b.messages[i])
            hits = c.call("archive/search", {"query": mark, "sessionId": self.session})["hits"]
            if [h["messageId"] for h in hits] != [b.ids[i]]:
                self.h.fail(f"{self.name}: search for {mark} found {hits}, expected {b.ids[i]}")
            self.h.count("searches")
        else:
            c.call("context/status", {"sessionId": self.session})
            self.h.count("status_polls")


class SharedWriter(Worker):
    """Appends to the session every shared writer uses, outside runs (appends there
    schedule auto-compaction themselves)."""

    sole_writer = False

    def step(self, c: Client) -> None:
        r = self.rng.random()
        if r < 0.02:
            self.compact(c)
        elif r < 0.14:
            self.read(c)
        else:
            self.append_some(c, allow_user=True, run_id=None)


class Agent(Worker):
    """One agent in its own session: runs of batches with tool calls, approvals of
    some calls, forced compactions; runs end mostly `completed`, which auto-compacts
    the context once it is over its limits."""

    def __init__(self, h: Harness, name: str, wire: str, session: str, seed: int) -> None:
        super().__init__(h, name, wire, session, seed)
        self.run_id: str | None = None
        self.run_len = 0
        self.batches = 0
        self.needs_approval: str | None = None  # call appended, approval not asked yet
        self.approval: tuple[str, str] | None = None  # (approval id, call id) pending
        self.started = False

    def step(self, c: Client) -> None:
        if not self.started:
            self.append(c, [self.talk.system(), self.talk.user()], None)
            self.started = True
            return
        if self.run_id is None:
            self.start_run(c)
            return
        if self.needs_approval is not None:
            self.request_approval(c, self.needs_approval)
            return
        r = self.rng.random()
        if self.approval is not None:
            # leave it pending a while so kills find approvals waiting
            if r < 0.3:
                aid = self.approval[0]
                decision = "approved" if self.rng.random() < 0.7 else "denied"
                self.op(c, "approval/resolve", {"approvalId": aid, "decision": decision})
                self.approval_resolved(aid, decision)
            else:
                self.read(c)
            return
        if self.batches >= self.run_len and not self.open_calls:
            outcome = self.rng.choices(["completed", "failed", "cancelled"], [8, 1, 1])[0]
            reply = self.op(c, "run/finish", {"runId": self.run_id, "outcome": outcome})
            if reply["run"]["status"] != outcome:
                self.h.fail(f"{self.name}: run/finish returned {reply['run']}")
            if reply["autoCompactionScheduled"]:
                self.h.count("auto_compactions_scheduled")
            self.runs[self.run_id] = {outcome}
            self.finished_run()
            return
        if r < 0.08 and not self.open_calls:
            call = self.talk.call(tool="write_file")
            head = [self.talk.user()] if self.rng.random() < 0.5 else []
            self.append(c, [*head, call], self.run_id)
            self.open_calls = _ids(call)
            self.needs_approval = self.open_calls[0]
        elif r < 0.095:
            self.compact(c)
        elif r < 0.2:
            self.read(c)
        else:
            self.append_some(c, allow_user=True, run_id=self.run_id)
        self.batches += 1

    def start_run(self, c: Client) -> None:
        reply = self.op(c, "run/start", {"sessionId": self.session})
        self.run_id = reply["runId"]
        self.runs[self.run_id] = {"open"}
        self.run_len = self.rng.randint(3, 14)
        self.batches = 0

    def finished_run(self) -> None:
        self.run_id = None

    def request_approval(self, c: Client, call_id: str) -> None:
        assert self.run_id is not None
        reply = self.op(
            c,
            "approval/request",
            {
                "sessionId": self.session,
                "runId": self.run_id,
                "toolCallId": call_id,
                "toolName": "write_file",
                "arguments": {"path": f"src/{call_id}.py"},
            },
        )
        self.approval_requested(reply["approvalId"], call_id)

    def approval_requested(self, approval_id: str, call_id: str) -> None:
        self.needs_approval = None
        self.approval = (approval_id, call_id)
        self.approvals[approval_id] = {"pending"}
        self.h.count("approvals_requested")

    def approval_resolved(self, approval_id: str, decision: str) -> None:
        self.approvals[approval_id] = {decision}
        if decision == "denied" and self.approval is not None:
            self.denied.add(self.approval[1])
        self.approval = None


# ---------------------------------------------------------------- the crash image


@dataclass
class SessionImage:
    """One session as a crash image (the file) holds it."""

    ids: list[int]
    version: int
    system_ids: list[int]
    tail_start_id: int | None
    summary: str | None
    summary_tokens: int
    active_messages: int
    active_tokens: int
    compaction_count: int
    committed: list[str]  # committed compactions, oldest first
    pending_approvals: set[str]
    open_runs: list[str]
    system: list[dict[str, Any]]  # bodies of the leading system messages
    tail: list[dict[str, Any]]  # bodies of the tail


def open_readonly(db: Path) -> apsw.Connection:
    return apsw.Connection(
        f"file:{db}?mode=ro", flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI
    )


def _summary_sources(summary: dict[str, Any]) -> set[int]:
    return {
        int(s)
        for items in (summary.get("sections") or {}).values()
        for item in items
        for s in item.get("sources", [])
    }


def check_image(
    db: Path,
    ledgers: list[Ledger],
    previous: dict[str, SessionImage],
    fail: Callable[[str], None],
    full: bool = False,
) -> dict[str, SessionImage]:
    """Check the database file against what clients were told; returns each session's
    state for the API check and the next round. `full` re-reads every acked message."""
    conn = open_readonly(db)
    try:
        return _check_image(conn, ledgers, previous, fail, full)
    finally:
        conn.close()


def _check_image(
    conn: apsw.Connection,
    ledgers: list[Ledger],
    previous: dict[str, SessionImage],
    fail: Callable[[str], None],
    full: bool,
) -> dict[str, SessionImage]:
    q = conn.execute
    rows = list(
        q("SELECT id, session_id, client_batch_id, first_message_id, last_message_id FROM batches")
    )
    batches = {(s, k): (bid, first, last) for bid, s, k, first, last in rows if k is not None}
    by_id = {bid: (s, first, last) for bid, s, _, first, last in rows}

    # no half batch: each batch row has exactly its contiguous messages, no message
    # lacks its batch row, every message is in the full-text index
    for bid, n, lo, hi, sessions in q(
        "SELECT batch_id, count(*), min(id), max(id), count(DISTINCT session_id) "
        "FROM messages GROUP BY batch_id"
    ):
        if bid not in by_id:
            fail(f"messages {lo}..{hi} belong to batch {bid}, which has no row")
            continue
        s, first, last = by_id[bid]
        if (n, lo, hi, sessions) != (last - first + 1, first, last, 1):
            fail(f"batch {bid} holds {n} messages {lo}..{hi}, its row says {first}..{last}")
    n_batches_with_messages = q("SELECT count(DISTINCT batch_id) FROM messages").fetchone()[0]
    if n_batches_with_messages != len(by_id):
        fail(f"{len(by_id)} batch rows, {n_batches_with_messages} batches with messages")
    n_messages = q("SELECT count(*) FROM messages").fetchone()[0]
    n_fts = q("SELECT count(*) FROM messages_fts").fetchone()[0]
    if n_fts != n_messages:
        fail(f"{n_messages} messages but {n_fts} full-text rows")
    for body, n in q(
        "SELECT body, count(*) FROM messages GROUP BY body HAVING count(*) > 1 LIMIT 5"
    ):
        fail(f"stored {n} times: {body[:120]}")

    def bodies(lo: int, hi: int) -> list[dict[str, Any]]:
        return [
            json.loads(b)
            for (b,) in q(
                "SELECT body FROM messages WHERE id BETWEEN ? AND ? ORDER BY id", (lo, hi)
            )
        ]

    # every acknowledged batch, with its acknowledged ids and contents, in client order
    for led in ledgers:
        last = 0
        for b in led.acked:
            got = batches.get((b.session, b.key))
            want = (b.batch_id, b.ids[0], b.ids[-1])
            if got != want:
                fail(f"acknowledged batch {b.key} {want} is stored as {got}")
                continue
            if b.ids[0] <= last:
                fail(f"{led.name}: batch {b.key} at {b.ids[0]} is stored before {last}")
            last = b.ids[-1]
            if full or not b.checked:
                if bodies(b.ids[0], b.ids[-1]) != b.messages:
                    fail(f"acknowledged batch {b.key}: stored messages differ from the sent")
                b.checked = True
        b = led.pending
        if b is not None:  # unacknowledged: whole or absent
            got = batches.get((b.session, b.key))
            if got is None:
                b.found = None
                for m in b.messages:
                    (n,) = q(
                        "SELECT count(*) FROM messages WHERE session_id = ? AND id > ? "
                        "AND instr(body, ?) > 0",
                        (b.session, led.last_id, marker_of(m)),
                    ).fetchone()
                    if n:
                        fail(f"unacknowledged {b.key}: {marker_of(m)} stored without its batch")
            else:
                b.found = list(range(got[1], got[2] + 1))
                if bodies(got[1], got[2]) != b.messages:
                    fail(f"unacknowledged batch {b.key} is stored partly or altered")

    compactions: dict[str, list[tuple[str, int | None]]] = {}
    for cid, s, to in q(
        "SELECT id, session_id, summarized_to FROM compactions WHERE committed = 1 ORDER BY rowid"
    ):
        compactions.setdefault(s, []).append((cid, to))
    n_effective = dict(
        q(
            "SELECT session_id, count(*) FROM compactions "
            "WHERE committed = 1 AND effective = 1 GROUP BY session_id"
        )
    )
    approvals: dict[str, tuple[str, str, str]] = {
        aid: (s, status, call)
        for aid, s, status, call in q("SELECT id, session_id, status, tool_call_id FROM approvals")
    }
    runs: dict[str, tuple[str, str]] = {
        rid: (s, status) for rid, s, status in q("SELECT id, session_id, status FROM runs")
    }

    out: dict[str, SessionImage] = {}
    contexts = list(
        q(
            "SELECT session_id, version, system_ids, tail_start_id, summary, summary_tokens, "
            "active_messages, active_tokens, compaction_count FROM conversation_context"
        )
    )
    for sid, version, system_ids, tail, summary, s_tokens, active, tokens, count in contexts:
        where = f"session {sid}"
        system_ids = json.loads(system_ids)
        committed = compactions.get(sid, [])
        if version != 1 + len(committed):
            fail(f"{where}: context version {version} after {len(committed)} committed compactions")
        if count != n_effective.get(sid, 0):
            fail(f"{where}: compaction_count {count}, {n_effective.get(sid, 0)} committed")
        ids = [i for (i,) in q("SELECT id FROM messages WHERE session_id = ? ORDER BY id", (sid,))]
        system = [
            json.loads(b)
            for (b,) in q(
                "SELECT body FROM messages WHERE id IN (SELECT value FROM json_each(?)) "
                "ORDER BY id",
                (json.dumps(system_ids),),
            )
        ]
        if len(system) != len(system_ids) or any(m["role"] != "system" for m in system):
            fail(f"{where}: leading system ids {system_ids} do not resolve to system messages")
        tail_rows = (
            []
            if tail is None
            else list(
                q(
                    "SELECT id, role, body, tokens FROM messages WHERE session_id = ? AND id >= ? "
                    "ORDER BY id",
                    (sid, tail),
                )
            )
        )
        sys_tokens = q(
            "SELECT coalesce(sum(tokens), 0) FROM messages WHERE id IN "
            "(SELECT value FROM json_each(?))",
            (json.dumps(system_ids),),
        ).fetchone()
        if active != len(system_ids) + len(tail_rows):
            fail(f"{where}: active_messages {active}, recount {len(system_ids)} + {len(tail_rows)}")
        if tokens != sys_tokens[0] + sum(r[3] for r in tail_rows):
            fail(
                f"{where}: active_tokens {tokens}, recount "
                f"{sys_tokens[0] + sum(r[3] for r in tail_rows)}"
            )
        if tail is not None and (not tail_rows or tail_rows[0][0] != tail):
            fail(f"{where}: tail start {tail} is not a message of the session")
        if tail_rows and tail_rows[0][1] == "tool":
            fail(f"{where}: the tail starts with a tool result (message {tail})")
        calls_in_context: set[str] = set()
        for mid, role, body, _ in tail_rows:
            m = json.loads(body)
            calls_in_context.update(c["id"] for c in m.get("tool_calls") or ())
            if role == "tool" and m["tool_call_id"] not in calls_in_context:
                fail(
                    f"{where}: tool result {mid} is in context, its call {m['tool_call_id']} is not"
                )
        parsed = json.loads(summary) if summary else {}
        sources = _summary_sources(parsed)
        if sources:
            (n,) = q(
                "SELECT count(*) FROM messages WHERE session_id = ? AND id IN "
                "(SELECT value FROM json_each(?))",
                (sid, json.dumps(sorted(sources))),
            ).fetchone()
            if n != len(sources):
                fail(f"{where}: {len(sources) - n} summary sources are not archived messages")
            if tail is not None and max(sources) >= tail:
                fail(f"{where}: the summary cites {max(sources)}, still in the tail")
        committed_ids = [c for c, _ in committed]
        if committed:
            cid, to = committed[-1]
            if (parsed.get("compactionIds") or [None])[-1] != cid:
                fail(f"{where}: the summary is not the one compaction {cid} committed")
            if not set(parsed.get("compactionIds") or []) <= set(committed_ids):
                fail(f"{where}: the summary names compactions that never committed")
            nxt = q(
                "SELECT min(id) FROM messages WHERE session_id = ? AND id > ?", (sid, to)
            ).fetchone()[0]
            if tail != nxt:
                fail(
                    f"{where}: compaction {cid} summarized up to {to}, the tail starts at "
                    f"{tail}, not at the next message {nxt}"
                )
        elif parsed:
            fail(f"{where}: a summary without any committed compaction")
        before = previous.get(sid)
        if before is not None and before.committed == committed_ids:
            # no compaction committed since the previous image: the context is as it was
            same_tail = before.tail_start_id in (None, tail)
            if (version, summary) != (before.version, before.summary) or not same_tail:
                fail(
                    f"{where}: the context changed without a committed compaction "
                    f"(version {before.version}->{version}, tail "
                    f"{before.tail_start_id}->{tail})"
                )
        if before is not None and committed_ids[: len(before.committed)] != before.committed:
            fail(f"{where}: committed compactions disappeared")
        out[sid] = SessionImage(
            ids=ids,
            version=version,
            system_ids=system_ids,
            tail_start_id=tail,
            summary=summary,
            summary_tokens=s_tokens,
            active_messages=active,
            active_tokens=tokens,
            compaction_count=count,
            committed=committed_ids,
            pending_approvals={
                a for a, (s, st, _) in approvals.items() if s == sid and st == "pending"
            },
            open_runs=[r for r, (s, st) in runs.items() if s == sid and st == "open"],
            system=system,
            tail=[json.loads(r[2]) for r in tail_rows],
        )

    # runs and approvals: as acknowledged (a pending approval is still pending)
    for led in ledgers:
        for rid, allowed in led.runs.items():
            inflight = led.inflight
            if inflight is not None and inflight[0] == "run/finish" and inflight[1]["runId"] == rid:
                allowed = allowed | {inflight[1]["outcome"]}
            got = runs.get(rid)
            if got is None or got[1] not in allowed:
                fail(f"{led.name}: run {rid} is {got}, acknowledged as {sorted(allowed)}")
        starting = led.inflight is not None and led.inflight[0] == "run/start"
        for rid, (s, st) in runs.items():
            if s == led.session and rid not in led.runs:
                # created by a run/start whose reply was lost: open until the client's
                # next run/start finds it orphaned and marks it interrupted
                ok = (st == "open" and starting) or (st == "interrupted" and led.unknown_runs)
                if not ok:
                    fail(f"{led.name}: run {rid} ({st}) was never acknowledged")
        for aid, allowed in led.approvals.items():
            got = approvals.get(aid)
            inflight = led.inflight
            if (
                inflight is not None
                and inflight[0] == "approval/resolve"
                and inflight[1]["approvalId"] == aid
            ):
                allowed = allowed | {inflight[1]["decision"]}
            if got is None or got[1] not in allowed:
                fail(f"{led.name}: approval {aid} is {got}, acknowledged as {sorted(allowed)}")
        for aid, (s, st, call) in approvals.items():
            if s == led.session and aid not in led.approvals:
                inflight = led.inflight
                lost_request = (
                    inflight is not None
                    and inflight[0] == "approval/request"
                    and inflight[1]["toolCallId"] == call
                    and st == "pending"
                )
                if not lost_request:
                    fail(f"{led.name}: approval {aid} ({st}) was never acknowledged")
    for sid, img in out.items():
        if len(img.open_runs) > 1:
            fail(f"session {sid}: {len(img.open_runs)} open runs")
    return out


# ---------------------------------------------------------------- the API view


def read_archive(c: Client, sid: str, after: int = 0) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while True:
        page = c.call("archive/read", {"sessionId": sid, "afterId": after, "limit": 5000})
        out += page["messages"]
        if page["nextAfterId"] is None:
            return out
        after = page["nextAfterId"]


def check_context_api(
    c: Client, sid: str, counter: TokenCounter, fail: Callable[[str], None]
) -> dict[str, Any]:
    """What the API says of a session's context, checked for validity on its own;
    returns `context/get` for comparison."""
    ctx = c.call("context/get", {"sessionId": sid})
    status = c.call("context/status", {"sessionId": sid})
    msgs = ctx["messages"]
    where = f"session {sid} (API)"
    if status["activeMessages"] != len(msgs):
        fail(f"{where}: activeMessages {status['activeMessages']}, context/get has {len(msgs)}")
    recount = sum(counter.count_message(m) for m in msgs)
    if status["estimatedTokens"] != recount:
        fail(f"{where}: estimatedTokens {status['estimatedTokens']}, recount {recount}")
    lead = 0
    while lead < len(msgs) and msgs[lead]["role"] == "system":
        lead += 1
    tail = msgs[lead:]
    if tail and tail[0]["role"] == "tool":
        fail(f"{where}: the context's tail starts with a tool result")
    calls: set[str] = set()
    for m in tail:
        calls.update(call["id"] for call in m.get("tool_calls") or ())
        if m["role"] == "tool" and m["tool_call_id"] not in calls:
            fail(f"{where}: tool result for {m['tool_call_id']} without its call in context")
    explain = c.call("context/explain", {"sessionId": sid})
    if explain["brokenPointers"] != 0:
        fail(f"{where}: {explain['brokenPointers']} summary pointers do not resolve")
    return {"context": ctx, "status": status}


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
        host, port = info["jsonrpc_tcp"].rsplit(":", 1)
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


def as_wire(name: str) -> Any:
    """A wire name for `connect` (checked: a typo fails here, not as a hang)."""
    if name not in WIRES:
        raise ValueError(name)
    return name


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


def test_kill_9_under_load_loses_nothing_acknowledged(tmp_path: Path) -> None:
    seed = crash_seed()
    kills = int(os.environ.get("CTXD_CRASH_KILLS", "32"))
    print(f"crash test: seed {seed} (CTXD_CRASH_SEED={seed} replays it), {kills} kills")
    stats, failures = run_crash(tmp_path, seed, kills)
    print("\n".join(_iter_lines(stats)))
    assert not failures, f"seed {seed}: {len(failures)} problems:\n" + "\n".join(failures[:20])
    assert stats["kills"] == kills
    # the run must have exercised what it claims to check
    assert stats["acked_batches"] > 20 * kills
    assert stats["kills_mid_compaction"] >= kills // 8, "too few kills inside a compaction"
    assert stats["resent_found_in_image"] + stats["resent_absent_from_image"] >= kills // 2
    assert stats["auto_compactions_scheduled"] >= 1
    assert stats["approvals_requested"] >= 5


# ---------------------------------------------------------------- found along the way
# Both were found by the checks above and fixed; these keep them fixed.


@pytest.mark.parametrize("meanwhile", ["assistant", "user"])
def test_a_late_tool_result_keeps_its_call_in_context(tmp_path: Path, meanwhile: str) -> None:
    """Another client of the session talks while a tool runs, then a compaction runs:
    the call may leave the context only if its result can no longer be appended."""
    d = LoggedDaemon(tmp_path).start()
    try:
        with d.client("jsonrpc") as agent, d.client("zmq") as other:
            sid = agent.call("session/create", {})["sessionId"]
            for i in range(5):
                agent.call(
                    "messages/append",
                    {
                        "sessionId": sid,
                        "messages": [
                            {"role": "user", "content": f"question {i}"},
                            {"role": "assistant", "content": f"answer {i}"},
                        ],
                    },
                )
            agent.call(
                "messages/append",
                {
                    "sessionId": sid,
                    "messages": [
                        {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {
                                    "id": "call_slow",
                                    "type": "function",
                                    "function": {"name": "run_tests", "arguments": "{}"},
                                }
                            ],
                        }
                    ],
                },
            )
            for i in range(30):
                other.call(
                    "messages/append",
                    {
                        "sessionId": sid,
                        "messages": [
                            {"role": meanwhile, "content": f"meanwhile {i}"},
                            {"role": "assistant", "content": f"noted {i}"},
                        ],
                    },
                )
            other.call("context/compact", {"sessionId": sid, "force": True})
            try:
                agent.call(
                    "messages/append",
                    {
                        "sessionId": sid,
                        "messages": [
                            {"role": "tool", "tool_call_id": "call_slow", "content": "42 passed"}
                        ],
                    },
                )
                accepted = True
            except CtxdError:
                accepted = False  # the call was abandoned: refusing its result is right
            problems: list[str] = []
            check_context_api(agent, sid, TokenCounter(), problems.append)
            assert problems == []
            if meanwhile == "assistant":
                # nobody abandoned the call: it stayed in context and its result came in
                assert accepted
    finally:
        d.stop()


def test_closing_a_client_fails_its_calls_with_connection_error(tmp_path: Path) -> None:
    """The kill protocol above relies on it: a call waiting for a dead daemon ends with
    ConnectionError when another thread closes the client."""
    d = LoggedDaemon(tmp_path).start()
    c = d.client("zmq")
    sid = c.call("session/create", {})["sessionId"]
    d.kill()
    raised: list[BaseException] = []

    def call() -> None:
        try:
            c.call("context/status", {"sessionId": sid})
        except BaseException as exc:
            raised.append(exc)

    t = threading.Thread(target=call)
    t.start()
    time.sleep(0.5)  # the send now waits for a daemon that is gone
    c.close()
    t.join(10)
    assert len(raised) == 1
    assert isinstance(raised[0], ConnectionError), repr(raised[0])
