"""The crash harness's checks: the SQLite file read directly after a kill (the crash
image) and the same state read through the API after the restart."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw

from ctxd.clients.client import Client
from ctxd.daemon.tokens import TokenCounter
from tests.harness.talk import marker_of
from tests.harness.workers import Ledger

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
        # its client thread may be recording a reply right now: see Ledger.lock
        with led.lock:
            for rid, allowed in led.runs.items():
                inflight = led.inflight
                finishing = inflight is not None and inflight[0] == "run/finish"
                if finishing and inflight[1]["runId"] == rid:
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


