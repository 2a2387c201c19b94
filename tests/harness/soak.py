"""The soak harness: writers, subscribers and a round-trip timer on every wire for a
while, then every acknowledged message checked; resident memory sampled meanwhile.

The tests are in tests/test_soak.py; bench/soak.py runs the same harness longer. The
memory sampler and the round-trip timer are in tests/harness/probes.py.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxd.clients.client import Client
from ctxd.daemon.tokens import TokenCounter
from ctxd.protocol.errors import CompactionInProgress
from tests.harness.image import open_readonly, read_archive
from tests.harness.probes import RoundTrips, RssSampler, client_for
from tests.harness.talk import WIRES, LoggedDaemon, Talker, marker_of

# the daemon's whole resident set may not exceed this during the soak
SOAK_RSS_LIMIT_KIB = 768 * 1024
# and it must level off: from the first half's peak to the second's it may grow by at most
# this share of what it grew in the first half (warm-up included), or by the floor below
SOAK_RSS_TREND = 0.75
SOAK_RSS_FLOOR_KIB = 12 * 1024


@dataclass
class Sent:
    key: str
    session: str
    messages: list[dict[str, Any]]
    ids: list[int] = field(default_factory=list)


class SoakWriter:
    """A client appending to a session: alone (agent turns in runs, calls answered by
    the next batch) or shared with other writers (self-contained batches, no runs)."""

    def __init__(
        self,
        d: LoggedDaemon,
        name: str,
        wire: str,
        session: str,
        sole: bool,
        seed: int,
        stop: threading.Event,
        fail: Callable[[str], None],
    ) -> None:
        self.d, self.name, self.wire, self.session, self.sole = d, name, wire, session, sole
        self.rng = random.Random(seed)
        self.talk = Talker(name, self.rng)
        self.stop, self.fail = stop, fail
        self.acked: list[Sent] = []
        self.counts: Counter[str] = Counter()
        self.thread = threading.Thread(target=self.run, name=f"soak-{name}", daemon=True)

    def run(self) -> None:
        try:
            with client_for(self.d, self.wire) as c:
                self._loop(c)
        except Exception as exc:
            self.fail(f"{self.name} ({self.wire}): {exc!r}")

    def _loop(self, c: Client) -> None:
        open_calls: list[str] = []
        run_id: str | None = None
        left = 0
        while not self.stop.is_set():
            if self.sole and run_id is None:
                run_id = c.call("run/start", {"sessionId": self.session})["runId"]
                left = self.rng.randint(3, 12)
                continue
            if self.sole and left <= 0 and not open_calls:
                fin = c.call("run/finish", {"runId": run_id, "outcome": "completed"})
                self.counts["auto_compactions_scheduled"] += fin["autoCompactionScheduled"]
                run_id = None
                continue
            if not self.sole and self.rng.random() < 0.01:
                try:
                    c.call("context/compact", {"sessionId": self.session, "force": True})
                    self.counts["compactions"] += 1
                except CompactionInProgress:
                    self.counts["compactions_busy"] += 1
                continue
            msgs, open_calls = self.talk.batch(open_calls, True, allow_open=self.sole)
            sent = Sent(f"{self.name}-{len(self.acked) + 1}", self.session, msgs)
            params: dict[str, Any] = {
                "sessionId": self.session,
                "messages": msgs,
                "clientBatchId": sent.key,
            }
            if run_id is not None:
                params["runId"] = run_id
            reply = c.call("messages/append", params)
            sent.ids = reply["messageIds"]
            if self.acked and sent.ids[0] <= self.acked[-1].ids[-1]:
                self.fail(f"{sent.key}: ids {sent.ids} after {self.acked[-1].ids}")
            self.acked.append(sent)
            left -= 1
        if run_id is not None:
            c.call("run/finish", {"runId": run_id, "outcome": "completed"})


class Subscriber:
    """Records every `session/didAppend` of the given sessions, in arrival order."""

    def __init__(self, d: LoggedDaemon, wire: str, sessions: list[str]) -> None:
        self.wire = wire
        self.c = client_for(d, wire)
        self.appends: dict[str, list[tuple[int, list[int]]]] = {s: [] for s in sessions}
        self.events: Counter[str] = Counter()
        self.event_bytes = 0
        # events the daemon dropped for it while it read too slowly, as it was told
        self.missed = 0
        self.c.on_notification(self._on)
        for s in sessions:
            self.c.subscribe(s)

    def _on(self, method: str, params: dict[str, Any]) -> None:
        self.events[method] += 1
        if method.startswith("approval/"):  # the large ones: count what they weigh
            self.event_bytes += len(json.dumps(params, ensure_ascii=False).encode())
        if method == "session/didMissEvents":
            self.missed += params["missed"]
        if method == "session/didAppend" and params["sessionId"] in self.appends:
            self.appends[params["sessionId"]].append((params["batchId"], params["messageIds"]))

    def received(self) -> int:
        return sum(len(v) for v in self.appends.values())


def run_soak(
    root: Path, seconds: float, seed: int, log: Callable[[str], None] = print
) -> tuple[dict[str, Any], list[str]]:
    """Run the soak; returns (figures, problems)."""
    failures: list[str] = []
    lock = threading.Lock()

    def fail(msg: str) -> None:
        with lock:
            failures.append(msg)

    rng = random.Random(seed)
    d = LoggedDaemon(root).start()
    stats: dict[str, Any] = {"seconds": seconds, "seed": seed}
    try:
        with client_for(d, "zmq") as c:
            shared = c.call("session/create", {"title": "shared"})["sessionId"]
            own = [c.call("session/create", {"title": f"own{i}"})["sessionId"] for i in range(5)]
        stop = threading.Event()
        # 4 writers share a session across wires, 5 have one each: 9 writing clients
        writers = [
            SoakWriter(d, f"sh{ch}", w, shared, False, rng.randrange(2**32), stop, fail)
            for ch, w in zip("abcd", ("zmq", "jsonrpc", "websocket", "zmq"), strict=True)
        ]
        writers += [
            SoakWriter(d, f"own{ch}", w, own[i], True, rng.randrange(2**32), stop, fail)
            for i, (ch, w) in enumerate(zip("abcde", (*WIRES, "jsonrpc", "websocket"), strict=True))
        ]
        sessions = [shared, *own]
        subscribers = [Subscriber(d, w, sessions) for w in WIRES]
        ops = Counter[str]()
        with RssSampler(d) as rss, RoundTrips(d, "websocket", period=0.1) as trips:
            for w in writers:
                w.thread.start()
            ops_thread = threading.Thread(
                target=_soak_ops,
                args=(d, writers, sessions, stop, fail, ops, random.Random(rng.randrange(2**32))),
                daemon=True,
            )
            ops_thread.start()
            stop.wait(seconds)
            stop.set()
            for w in writers:
                w.thread.join(60)
                if w.thread.is_alive():
                    fail(f"{w.name} did not stop")
            ops_thread.join(60)
        stats["round_trips"] = trips.summary()
        if trips.errors:
            fail(f"round-trip probe failed: {trips.errors[:3]}")
        stats.update(_soak_checks(d, writers, subscribers, sessions, fail))
        stats["ops"] = dict(ops)
        stats["events"] = {s.wire: dict(s.events) for s in subscribers}
        half = seconds / 2
        first, second = rss.peak(0, half), rss.peak(half)
        stats["rss_kib"] = {
            "start": rss.samples[0][1] if rss.samples else 0,
            "first_half_peak": first,
            "second_half_peak": second,
            "vm_hwm": d.status_kib("VmHWM"),
            # peak of each tenth of the run, to see a trend
            "timeline": [rss.peak(seconds * i / 10, seconds * (i + 1) / 10) for i in range(10)],
        }
        for s in subscribers:
            s.c.close()
        # the daemon still answers on every wire
        for w in WIRES:
            with client_for(d, w, timeout=10) as c:
                if len(c.call("session/list", {"limit": 100})["sessions"]) < len(sessions):
                    fail(f"session/list over {w} lost sessions")
        if d.stop() != 0:
            fail(f"the daemon did not stop cleanly: {d.log_tail()}")
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.kill()
    return stats, failures


def _soak_ops(
    d: LoggedDaemon,
    writers: list[SoakWriter],
    sessions: list[str],
    stop: threading.Event,
    fail: Callable[[str], None],
    ops: Counter[str],
    rng: random.Random,
) -> None:
    """Searches, status polls, context checks and compactions between the appends."""
    counter = TokenCounter()
    try:
        with client_for(d, "jsonrpc") as c:
            while not stop.is_set():
                r = rng.random()
                sid = rng.choice(sessions)
                if r < 0.4:
                    w = rng.choice(writers)
                    if not w.acked:
                        continue
                    sent = w.acked[-rng.randint(1, min(50, len(w.acked)))]
                    i = rng.randrange(len(sent.messages))
                    mark = marker_of(sent.messages[i])
                    hits = c.call("archive/search", {"query": mark})["hits"]
                    if [h["messageId"] for h in hits] != [sent.ids[i]]:
                        fail(f"search for {mark} found {hits}, expected {sent.ids[i]}")
                    ops["searches"] += 1
                elif r < 0.7:
                    c.call("context/status", {"sessionId": sid})
                    ops["status_polls"] += 1
                elif r < 0.95:
                    # context/get carries its status: both come from one moment
                    got = c.call("context/get", {"sessionId": sid})
                    msgs, status = got["messages"], got["status"]
                    recount = sum(counter.count_message(m) for m in msgs)
                    if (status["activeMessages"], status["estimatedTokens"]) != (
                        len(msgs),
                        recount,
                    ):
                        fail(
                            f"{sid}: status {status['activeMessages']} messages "
                            f"{status['estimatedTokens']} tokens, context/get has "
                            f"{len(msgs)} and {recount}"
                        )
                    tail = [m for m in msgs if m["role"] != "system"]
                    if tail and tail[0]["role"] == "tool":
                        fail(f"{sid}: the context's tail starts with a tool result")
                    ops["context_checks"] += 1
                else:
                    try:
                        c.call("context/compact", {"sessionId": sid, "force": True})
                        ops["compactions"] += 1
                    except CompactionInProgress:
                        ops["compactions_busy"] += 1
                stop.wait(0.01)
    except Exception as exc:
        fail(f"ops client: {exc!r}")


def _soak_checks(
    d: LoggedDaemon,
    writers: list[SoakWriter],
    subscribers: list[Subscriber],
    sessions: list[str],
    fail: Callable[[str], None],
) -> dict[str, Any]:
    db = d.data_dir / "ctxd.db"
    conn = open_readonly(db)
    try:
        stored = {
            s: [
                i
                for (i,) in conn.execute(
                    "SELECT id FROM messages WHERE session_id = ? ORDER BY id", (s,)
                )
            ]
            for s in sessions
        }
        batches = {
            s: [
                (b, first, last)
                for b, first, last in conn.execute(
                    "SELECT id, first_message_id, last_message_id FROM batches "
                    "WHERE session_id = ? ORDER BY id",
                    (s,),
                )
            ]
            for s in sessions
        }
        by_key = {
            (s, k): (first, last)
            for s, k, first, last in conn.execute(
                "SELECT session_id, client_batch_id, first_message_id, last_message_id FROM batches"
            )
        }
        for body, n in conn.execute(
            "SELECT body, count(*) FROM messages GROUP BY body HAVING count(*) > 1 LIMIT 5"
        ):
            fail(f"stored {n} times: {body[:120]}")
        acked = 0
        for w in writers:
            last = 0
            for sent in w.acked:
                acked += len(sent.ids)
                if by_key.get((sent.session, sent.key)) != (sent.ids[0], sent.ids[-1]):
                    fail(
                        f"acknowledged {sent.key} {sent.ids} is stored as "
                        f"{by_key.get((sent.session, sent.key))}"
                    )
                    continue
                if sent.ids[0] <= last:
                    fail(f"{w.name}: {sent.key} stored before an earlier batch")
                last = sent.ids[-1]
                bodies = [
                    json.loads(b)
                    for (b,) in conn.execute(
                        "SELECT body FROM messages WHERE id BETWEEN ? AND ? ORDER BY id",
                        (sent.ids[0], sent.ids[-1]),
                    )
                ]
                if bodies != sent.messages:
                    fail(f"{sent.key}: stored messages differ from the sent ones")
    finally:
        conn.close()
    if sum(len(v) for v in stored.values()) != acked:
        fail(f"{sum(len(v) for v in stored.values())} messages stored, {acked} acknowledged")
    # the API serves the same archive
    with client_for(d, "zmq") as c:
        for s in sessions:
            if [m["id"] for m in read_archive(c, s)] != stored[s]:
                fail(f"archive/read of {s} differs from the file")
    # every subscriber sees every batch once, in order, whatever its wire
    want = sum(len(b) for b in batches.values())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(s.received() < want for s in subscribers):
        time.sleep(0.1)
    for sub in subscribers:
        for s in sessions:
            got = sub.appends[s]
            if [b for b, _ in got] != [b for b, _, _ in batches[s]]:
                missing = {b for b, _, _ in batches[s]} - {b for b, _ in got}
                fail(
                    f"{sub.wire} subscriber: {len(got)} didAppend for {s}, "
                    f"{len(batches[s])} batches stored ({len(missing)} missing)"
                )
            ids = [i for _, mids in got for i in mids]
            if ids != stored[s]:
                fail(f"{sub.wire} subscriber: message ids of {s} differ from the archive")
    return {
        "acked_messages": acked,
        "acked_batches": sum(len(w.acked) for w in writers),
        "stored_batches": want,
        "writers": len(writers),
        "subscribers": len(subscribers),
        "auto_compactions_scheduled": sum(w.counts["auto_compactions_scheduled"] for w in writers),
        "events_per_subscriber": {s.wire: s.received() for s in subscribers},
    }


def soak_seconds() -> float:
    return float(os.environ.get("CTXD_SOAK_SECONDS", "45"))

