"""What a new user hit in the core: empty params arrays, held-back and concurrent
compactions, step projections over their budget, archive pages bounded by bytes.

Each test drives a real daemon process over real sockets, on a real SQLite file.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
from fake_llm import FakeLLM
from helpers import DaemonProcess, agent_turn, wait_for
from websockets.sync.client import connect as ws_connect

from ctxd.daemon.compaction.rules import SUMMARY_HEADER
from ctxd.daemon.tokens import TokenCounter
from ctxd.protocol.codec import FrameReader, frame
from ctxd.protocol.connection import split_endpoint
from ctxd.protocol.errors import CompactionInProgress

TIMEOUT = 20.0


def start(root: Path, tables: str = "", **config: Any) -> DaemonProcess:
    """A daemon whose TOML config sets these keys (`compaction.x` for policy keys), then
    `tables` (more TOML)."""
    root.mkdir(parents=True, exist_ok=True)
    top = {k: v for k, v in config.items() if "." not in k}
    policy = {k.split(".", 1)[1]: v for k, v in config.items() if k.startswith("compaction.")}
    text = "".join(f"{k} = {json.dumps(v)}\n" for k, v in top.items())
    if policy:
        text += "[compaction]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in policy.items())
    path = root / "ctxd.toml"
    path.write_text(text + tables)
    return DaemonProcess(root, "--config", str(path)).start()


# params: [] (Lua's empty table, Neovim's LSP client) means no params, on every wire


def test_an_empty_params_array_means_no_params_on_every_wire(tmp_path: Path) -> None:
    daemon = start(tmp_path)
    info = daemon.info()
    try:
        # JSON-RPC over TCP
        sock = socket.create_connection(split_endpoint(info["jsonrpc_tcp"]), timeout=TIMEOUT)
        reader = FrameReader()
        pending: list[bytes] = []

        def tcp(msg: dict[str, Any]) -> dict[str, Any]:
            sock.sendall(frame(json.dumps(msg).encode()))
            while not pending:
                data = sock.recv(65536)
                assert data, "the daemon closed the connection"
                pending.extend(reader.feed(data))
            return json.loads(pending.pop(0))

        assert "result" in tcp({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                "params": {"token": info["token"]}})
        reply = tcp({"jsonrpc": "2.0", "id": 2, "method": "session/list", "params": []})
        assert reply.get("result", {}).get("sessions") == [], reply
        reply = tcp({"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": []})
        assert reply["result"]["tools"][0]["function"]["name"] == "search_past_messages"
        # a non-empty array is still refused: parameters are named
        reply = tcp({"jsonrpc": "2.0", "id": 4, "method": "session/list", "params": [5]})
        assert reply["error"]["code"] == -32602
        # an empty array for a method with required params names what is missing
        reply = tcp({"jsonrpc": "2.0", "id": 5, "method": "session/get", "params": []})
        assert reply["error"]["code"] == -32602 and "sessionId" in reply["error"]["message"]
        sock.close()

        # WebSocket
        with ws_connect(info["websocket"], open_timeout=TIMEOUT) as ws:
            ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                "params": {"token": info["token"]}}))
            assert "result" in json.loads(ws.recv(TIMEOUT))
            ws.send(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "session/list",
                                "params": []}))
            assert json.loads(ws.recv(TIMEOUT))["result"]["sessions"] == []

        # ZeroMQ + msgpack
        ctx: zmq.Context[Any] = zmq.Context()
        try:
            dealer = ctx.socket(zmq.DEALER)
            dealer.connect(info["zmq_router"])
            dealer.send(msgpack.packb({"id": 1, "method": "session/list", "params": [],
                                       "token": info["token"]}))
            assert dealer.poll(int(TIMEOUT * 1000))
            reply = msgpack.unpackb(dealer.recv_multipart()[-1], raw=False)
            assert reply.get("result", {}).get("sessions") == [], reply
        finally:
            ctx.destroy(linger=0)
    finally:
        assert daemon.stop() == 0


# a step projection keeps to its budget: the summary gives up items, never pins


def test_a_projection_below_pins_and_summary_drops_summary_items_to_fit(
        tmp_path: Path) -> None:
    count = TokenCounter().count_message
    # no auto-compaction: one that commits just before the forced one would leave it
    # nothing to do (appends without a run schedule one when over the limits)
    daemon = start(tmp_path, **{"compaction.keep_messages": 4,
                                "compaction.max_active_messages": 10_000})
    try:
        with daemon.client("jsonrpc") as c:
            sid = c.call("session/create", {})["sessionId"]
            c.call("messages/append", {"sessionId": sid, "messages": [
                {"role": "system", "content": "You are a careful coding agent."}]})
            for i in range(40):
                c.call("messages/append", {"sessionId": sid, "messages": [
                    {"role": "user", "content": f"Never edit vendor/lib{i}.py; the goal is "
                     f"to make src/mod{i}.py fast"}, *agent_turn(i)[1:]]})
            pins = ["Always answer in English.", "Never push to main."]
            for text in pins:
                c.call("context/pins/add", {"sessionId": sid, "text": text})
            assert c.call("context/compact", {"sessionId": sid, "force": True})["effective"]
            full = c.call("context/get", {"sessionId": sid})["messages"]
            assert full[0]["content"] == "You are a careful coding agent."
            summary = full[1]
            assert summary["content"].startswith(SUMMARY_HEADER)
            head = count(full[0]) + count(summary)

            budget = head - 60  # below system message + pins + summary
            got = c.call("context/get", {"sessionId": sid, "budgetTokens": budget})
            msgs = got["messages"]
            assert sum(count(m) for m in msgs) <= budget
            assert got["estimatedTokens"] <= budget and not got["overBudget"]
            assert got["droppedSummaryItems"] > 0
            assert msgs[0] == full[0]  # the leading system message stays
            assert msgs[1]["content"].startswith(SUMMARY_HEADER)
            assert all(p in msgs[1]["content"] for p in pins)  # pins are never dropped
            assert len(msgs[1]["content"]) < len(summary["content"])
            assert len(got["messageIds"]) == len(msgs)

            # below the system message and pins alone: nothing more can go
            pins_only = count(full[0]) + count({"role": "system", "content": "\n\n".join(
                [SUMMARY_HEADER, "Pinned (always applies):\n" + "\n".join(
                    f"- {p}" for p in pins)])})
            tight = c.call("context/get", {"sessionId": sid, "budgetTokens": pins_only - 5})
            assert tight["overBudget"]
            assert [m["content"] for m in tight["messages"]][0] == full[0]["content"]
            assert all(p in tight["messages"][1]["content"] for p in pins)
            assert "Summary of earlier messages" not in tight["messages"][1]["content"]
            # the stored context is unchanged by projections
            assert c.call("context/get", {"sessionId": sid})["messages"] == full
    finally:
        assert daemon.stop() == 0


# compactions held back or overlapping


def _events(client: Any, sid: str) -> Any:
    client.subscribe(sid)
    return client.notifications(timeout=0.5)


def test_resolving_the_last_approval_of_an_idle_session_runs_the_held_back_compaction(
        tmp_path: Path) -> None:
    daemon = start(tmp_path, **{"compaction.max_active_messages": 12,
                                "compaction.keep_messages": 4})
    try:
        with daemon.client("zmq") as c:
            sid = c.call("session/create", {})["sessionId"]
            events = _events(c, sid)
            run = c.call("run/start", {"sessionId": sid})["runId"]
            for i in range(5):
                c.call("messages/append", {"sessionId": sid, "runId": run,
                                           "messages": agent_turn(i)})
            c.call("messages/append", {"sessionId": sid, "runId": run, "messages": [
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_rm", "type": "function",
                     "function": {"name": "shell", "arguments": '{"cmd": "rm -rf build"}'}}]}]})
            approval = c.call("approval/request", {"sessionId": sid, "runId": run,
                                                   "toolCallId": "call_rm"})["approvalId"]
            # the run ends while the approval is pending: compaction must wait
            fin = c.call("run/finish", {"runId": run, "outcome": "completed"})
            assert fin["autoCompactionScheduled"] is False
            before = c.call("context/status", {"sessionId": sid})
            assert before["activeMessages"] == 21 and before["compactionCount"] == 0
            c.call("approval/resolve", {"approvalId": approval, "decision": "denied",
                                        "reason": "not now"})
            done = wait_for(events, "context/didCompact")
            assert done["trigger"] == "auto" and done["effective"] is True
            after = c.call("context/status", {"sessionId": sid})
            assert after["compactionCount"] == 1 and after["activeMessages"] <= 12
    finally:
        assert daemon.stop() == 0


def _start_slow_auto_compaction(c: Any, llm: Any, sid: str, events: Any) -> None:
    llm.script("slow")
    for i in range(5):
        c.call("messages/append", {"sessionId": sid, "messages": agent_turn(i)})
    wait_for(events, "$/progress", where=lambda p: p["value"]["kind"] == "begin")
    assert c.call("context/status", {"sessionId": sid})["compacting"] is True


@pytest.mark.parametrize("wait_seconds", [60.0, 0.2])
def test_a_manual_compaction_waits_for_the_running_one(tmp_path: Path,
                                                       wait_seconds: float) -> None:
    with FakeLLM("good", slow_seconds=2.0) as llm:
        daemon = start(
            tmp_path,
            f'[openai]\nbase_url = "{llm.base_url}"\nmodel = "fake-model"\n',
            summarizer="openai",
            **{"compaction.max_active_messages": 12, "compaction.keep_messages": 4,
               "compaction.wait_seconds": wait_seconds})
        try:
            with daemon.client("jsonrpc") as c:
                sid = c.call("session/create", {})["sessionId"]
                events = _events(c, sid)
                _start_slow_auto_compaction(c, llm, sid, events)
                if wait_seconds < 1:
                    with pytest.raises(CompactionInProgress) as info:
                        c.call("context/compact", {"sessionId": sid, "force": True})
                    assert info.value.data["waitedSeconds"] == wait_seconds
                    assert "waiting" in info.value.message
                    return
                result = c.call("context/compact", {"sessionId": sid, "force": True})
                assert result["trigger"] == "manual"
                waits = []
                compacted = []
                while len(compacted) < 2:
                    method, p = next(events)
                    if method == "$/progress" and "waiting" in (p["value"].get("message") or ""):
                        waits.append(p["token"])
                    if method == "context/didCompact":
                        compacted.append(p["trigger"])
                # the automatic one finished first, then the manual one ran
                assert compacted == ["auto", "manual"]
                assert waits, "the wait was not reported as progress"
                if result["compactionId"]:
                    assert waits == [result["compactionId"]]
        finally:
            assert daemon.stop() == 0


# archive/read pages by bytes as well as by count


def test_archive_read_pages_by_bytes(tmp_path: Path) -> None:
    mib = 1024 * 1024
    daemon = start(tmp_path)
    try:
        with daemon.client("zmq", timeout=60) as c:
            sid = c.call("session/create", {})["sessionId"]
            words = "lorem ipsum dolor sit amet " * (mib // 27 + 1)
            big = [{"role": "user", "content": f"{i} " + words} for i in range(12)]
            for m in big:  # one per request: each request stays far below its limit
                c.call("messages/append", {"sessionId": sid, "messages": [m]})
            c.call("messages/append", {"sessionId": sid, "messages": [
                {"role": "assistant", "content": "small"}]})

            def size(page: dict[str, Any]) -> int:
                return sum(len(json.dumps({"role": m["role"], "content": m["content"]},
                                          ensure_ascii=False)) for m in page["messages"])

            # the default bound: 8 MiB a page, whatever the count limit
            first = c.call("archive/read", {"sessionId": sid, "limit": 5000})
            assert 1 <= len(first["messages"]) < 12
            assert size(first) <= 8 * mib
            assert first["nextAfterId"] == first["messages"][-1]["id"]

            # an explicit bound, followed to the end
            seen: list[str] = []
            after = 0
            pages = 0
            while True:
                page = c.call("archive/read", {"sessionId": sid, "afterId": after,
                                               "maxBytes": int(2.5 * mib)})
                pages += 1
                assert size(page) <= 2.5 * mib
                seen += [m["content"].split(" ", 1)[0] for m in page["messages"]]
                if page["nextAfterId"] is None:
                    break
                after = page["nextAfterId"]
            assert seen == [str(i) for i in range(12)] + ["small"]
            assert pages == 6  # two large messages a page; the small one joins the last

            # one message above the bound still comes, alone, so paging moves
            one = c.call("archive/read", {"sessionId": sid, "maxBytes": 1000})
            assert len(one["messages"]) == 1 and one["nextAfterId"] is not None

            # backwards: the latest messages that fit, oldest first
            last = c.call("archive/read", {"sessionId": sid, "beforeId": 10 ** 9,
                                           "maxBytes": int(1.5 * mib)})
            assert [m["content"].split(" ", 1)[0] for m in last["messages"]] == ["11", "small"]
            assert last["nextBeforeId"] == last["messages"][0]["id"]
    finally:
        assert daemon.stop() == 0
