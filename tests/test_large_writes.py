"""Large batches are committed beside the event loop: other clients are served meanwhile,
other writes wait for the commit, and the batch is stored whole and in order."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path
from typing import Any

from test_attacks import Tcp, _words, start

from ctxd.daemon.config import Config
from ctxd.daemon.dispatch import Dispatcher
from ctxd.daemon.engine import Engine
from ctxd.daemon.servers.base import Connection, EventHub
from ctxd.protocol.codec import dumps_json, packb, response
from ctxd.protocol.large import encode_sliced, pack_reply


def _client() -> Connection:
    conn = Connection("test")
    conn.authenticated = True
    return conn


def _digest(messages: list[dict[str, Any]]) -> list[str]:
    return [hashlib.sha256(m["content"].encode()).hexdigest() for m in messages]


def test_the_loop_serves_reads_while_a_large_batch_commits_and_writes_wait(
    tmp_path: Path,
) -> None:
    engine = Engine(Config(data_dir=tmp_path))
    events: list[tuple[str, Any]] = []
    engine.add_listener(lambda sid, method, params: events.append((method, params)))
    d = Dispatcher(engine, EventHub(), token="t")
    big_conn, other = _client(), _client()
    sid = engine.create_session().session_id
    quiet = engine.create_session().session_id
    messages = [{"role": "user", "content": _words(2_000_000, i)} for i in range(4)]

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        big = asyncio.create_task(d.handle(big_conn, "messages/append", {
            "sessionId": sid, "messages": messages, "returnContext": True}))
        # the batch is prepared in a worker thread, then committed in one while the write
        # gate is held: a commit on the loop would finish without the gate ever being seen
        while not d.large.gate.busy:
            assert not big.done(), "the batch was committed without the loop serving anyone"
            await asyncio.sleep(0.001)
        # reads are answered during the commit, from the state before it
        assert (await d.handle(other, "context/status", {"sessionId": quiet})).session_id
        during = await d.handle(other, "context/status", {"sessionId": sid})
        assert during.active_messages == 0
        assert not big.done()
        # a write waits for the commit: its message comes after the whole batch
        small = asyncio.create_task(d.handle(other, "messages/append", {
            "sessionId": sid, "messages": [{"role": "user", "content": "after"}]}))
        for _ in range(3):
            await asyncio.sleep(0)
        assert big.done() or not small.done()
        return await big, await small

    try:
        big_result, small_result = asyncio.run(main())
        ids = big_result.message_ids
        assert len(ids) == 4 and max(ids) < small_result.message_ids[0]
        assert big_result.status.archive_messages == 4
        assert _digest(big_result.context.messages) == _digest(messages)
        status = engine.status(sid)
        assert (status.archive_messages, status.active_messages) == (5, 5)
        assert status.estimated_tokens > 1_000_000
        page = engine.read_archive(sid, 0, 10).messages
        assert _digest(page) == _digest([*messages, {"content": "after"}])
        appended = [p.message_ids for m, p in events if m == "session/didAppend"]
        assert appended == [ids, small_result.message_ids]
        # the search index holds the batch too
        word = messages[2]["content"].split()[7]
        assert engine.search(word, session_id=sid)
    finally:
        engine.close()


def test_run_finish_with_a_large_batch_lets_other_clients_in_first(tmp_path: Path) -> None:
    # run/finish with `messages` takes the same path as a large append: before, its batch
    # was validated, counted and committed on the event loop while every client waited
    d = start(tmp_path)
    info = d.info()
    try:
        big, tcp = Tcp(info), Tcp(info)
        big.login(info["token"])
        tcp.login(info["token"])
        zc = d.client("zmq", timeout=120)
        sid = big.call("session/create", {})["result"]["sessionId"]
        quiet = big.call("session/create", {})["result"]["sessionId"]
        run = big.call("run/start", {"sessionId": sid})["result"]["runId"]
        messages = [{"role": "user", "content": _words(6_000_000, i)} for i in range(4)]
        big.send({"jsonrpc": "2.0", "id": "big", "method": "run/finish", "params": {
            "runId": run, "outcome": "completed", "messages": messages}})
        # pipelined behind it on the same connection: answered after it
        big.send({"jsonrpc": "2.0", "id": "status", "method": "context/status",
                  "params": {"sessionId": sid}})
        time.sleep(0.3)  # the big frame has arrived; the daemon is working on it
        tcp.sock.settimeout(60)
        assert tcp.call("context/status", {"sessionId": quiet})["result"]["sessionId"] == quiet
        assert zc.call("context/status", {"sessionId": quiet})["sessionId"] == quiet
        big.sock.setblocking(False)
        try:
            early = big.sock.recv(1 << 16)
        except BlockingIOError:
            early = b""
        assert early == b"", "run/finish was answered before the other clients"
        big.sock.setblocking(True)
        big.sock.settimeout(120)
        first, second = big.recv(), big.recv()
        assert (first["id"], second["id"]) == ("big", "status"), json.dumps(first)[:300]
        result = first["result"]
        assert result["run"]["status"] == "completed"
        ids = result["append"]["messageIds"]
        assert len(ids) == 4
        assert second["result"]["archiveMessages"] == 4
        assert second["result"]["activeRunId"] is None
        read = tcp.call("archive/read", {"sessionId": sid, "maxBytes": 64 << 20})["result"]
        assert [m["id"] for m in read["messages"]] == ids
        assert _digest(read["messages"]) == _digest(messages)
        # large replies are encoded beside the loop, to the same bytes on both wires
        got = tcp.call("context/get", {"sessionId": sid})["result"]
        assert (got["messageIds"], _digest(got["messages"])) == (ids, _digest(messages))
        got = zc.call("context/get", {"sessionId": sid})
        assert (got["messageIds"], _digest(got["messages"])) == (ids, _digest(messages))
        zc.close()
        big.sock.close()
        tcp.sock.close()
    finally:
        assert d.stop() == 0


def test_large_results_are_encoded_to_the_wires_bytes() -> None:
    text = "x" * 600_000 + '"\\\n\t\x00压缩😀\u2028' + "é" * 300_000
    result = {
        "messages": [
            {"role": "user", "content": text, "metadata": {"k": [1, 2.5, None, True]}},
            {"role": "tool", "content": [{"type": "text", "text": text[:10]}]},
        ],
        "messageIds": [1, None],
        "status": {"sessionId": "s", "estimatedTokens": -1, "version": 0},
    }
    for wire in ("jsonrpc-tcp", "websocket"):
        sliced = encode_sliced(result, wire)
        assert dumps_json(response(7, sliced)) == dumps_json(response(7, result))
    assert pack_reply("r1", encode_sliced(result, "zmq")) == packb({"id": "r1", "result": result})
    assert pack_reply(2, result) == packb({"id": 2, "result": result})
