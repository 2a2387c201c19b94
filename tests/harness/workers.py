"""The crash harness's clients: what each sent and had acknowledged (the ledger), and the
threads that drive agent sessions and the shared session on every wire."""

from __future__ import annotations

import random
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ctxd.clients.client import Client
from ctxd.protocol.errors import CompactionInProgress, Conflict
from tests.harness.talk import Talker, _ids, marker_of

if TYPE_CHECKING:  # the harness owns the workers: imported for annotations only
    from tests.harness.crash import Harness

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
        # held while an acknowledged request is recorded and `inflight` cleared, and by
        # the crash image's check, which runs while this client's thread goes on: the
        # check never sees a reply that is neither in flight nor recorded
        self.lock = threading.Lock()
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

    def op(
        self,
        c: Client,
        method: str,
        params: dict[str, Any],
        record: Callable[[Any], None] | None = None,
    ) -> Any:
        """Send a request other than an append; `record` notes what its reply
        acknowledged, in the same step as the request stops being in flight."""
        self.inflight = (method, params)
        result = c.call(method, params)
        with self.lock:
            if record is not None:
                record(result)
            self.inflight = None
        return result

    def settled(self, record: Callable[[], None]) -> None:
        with self.lock:
            record()
            self.inflight = None


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
            self.settled(lambda: self.runs.__setitem__(params["runId"], {outcome}))
            self.finished_run()
        elif method == "approval/request":
            pending = c.call("approval/list", {"sessionId": self.session, "status": "pending"})
            mine = [a for a in pending["approvals"] if a["toolCallId"] == params["toolCallId"]]
            if mine:
                self.settled(
                    lambda: self.approval_requested(mine[0]["approvalId"], params["toolCallId"])
                )
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
            self.settled(lambda: self.approval_resolved(params["approvalId"], params["decision"]))
        else:
            # compactions and reads need nothing: a compaction is applied or absent
            self.settled(lambda: None)

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
                self.op(c, "approval/resolve", {"approvalId": aid, "decision": decision},
                        record=lambda _: self.approval_resolved(aid, decision))
            else:
                self.read(c)
            return
        if self.batches >= self.run_len and not self.open_calls:
            outcome = self.rng.choices(["completed", "failed", "cancelled"], [8, 1, 1])[0]
            rid = self.run_id
            reply = self.op(c, "run/finish", {"runId": rid, "outcome": outcome},
                            record=lambda _: self.runs.__setitem__(rid, {outcome}))
            if reply["run"]["status"] != outcome:
                self.h.fail(f"{self.name}: run/finish returned {reply['run']}")
            if reply["autoCompactionScheduled"]:
                self.h.count("auto_compactions_scheduled")
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
        reply = self.op(c, "run/start", {"sessionId": self.session},
                        record=lambda r: self.runs.__setitem__(r["runId"], {"open"}))
        self.run_id = reply["runId"]
        self.run_len = self.rng.randint(3, 14)
        self.batches = 0

    def finished_run(self) -> None:
        self.run_id = None

    def request_approval(self, c: Client, call_id: str) -> None:
        assert self.run_id is not None
        self.op(
            c,
            "approval/request",
            {
                "sessionId": self.session,
                "runId": self.run_id,
                "toolCallId": call_id,
                "toolName": "write_file",
                "arguments": {"path": f"src/{call_id}.py"},
            },
            record=lambda r: self.approval_requested(r["approvalId"], call_id),
        )

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


