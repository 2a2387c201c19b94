"""The replies and events of a scripted set of calls, on every wire, compared between
two revisions.

    python -m bench.wire_replies [--before REV]      # compare REV (default HEAD) with this tree
    python -m bench.wire_replies --side              # print this tree's replies as JSON

Each side starts its own `ctxd serve` of its revision and sends the same calls over
JSON-RPC TCP (plain Content-Length frames) and ZeroMQ (a plain DEALER packing msgpack
itself), subscribed to the session's events. The replies are decoded as they came (key
order and the type of every value kept: an int stays an int, a float a float) and only
what differs from run to run is masked: random ids and times. A reply that changed its
keys, their order, a value or a type shows as a difference.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

# random ids: a prefix, an underscore and the random part
_ID = re.compile(r"^(ses|run|apr|pin|cmp|cpt|prg)_[0-9A-Za-z_-]+$")
_CLOCK = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d")
# a random id written into a text (an error message naming its approval)
_ID_IN_TEXT = re.compile(r"\b(ses|run|apr|pin|cmp|cpt|prg)_[0-9a-f]{20}\b")
# keys whose values are times or durations
_TIMES = {"createdAt", "startedAt", "finishedAt", "resolvedAt", "lastCompactedAt",
          "lastActivityAt", "durationMs", "at", "nonceMac", "pageKey", "nextCursor",
          "leaseSeconds", "token", "version"}


def mask(value: Any, key: str = "") -> Any:
    """`value` with what differs between runs replaced by its type's name; dicts become
    lists of pairs so that key order is compared."""
    if isinstance(value, dict):
        return [[k, mask(v, k)] for k, v in value.items()]
    if isinstance(value, list):
        return [mask(v, key) for v in value]
    if key in _TIMES and value is not None:
        return f"<{type(value).__name__}>"
    if isinstance(value, str) and _ID.match(value):
        return f"<{value.split('_', 1)[0]}>"
    if isinstance(value, str):
        # a time or a random id written into a text
        return _ID_IN_TEXT.sub(r"<\1>", _CLOCK.sub("<time>", value))
    if isinstance(value, float):
        return ["float", value]
    return value


def script(call: Any) -> None:
    """The calls, each through `call(method, params)`."""
    sid = call("session/create", {"sessionId": "ses_fixed", "title": "t", "metadata": {"a": 1}})[
        "sessionId"]
    call("session/subscribe", {"sessionId": sid})
    call("session/list", {})
    call("session/get", {"sessionId": sid})
    call("context/status", {"sessionId": sid})
    run_id = call("run/start", {"sessionId": sid})["runId"]
    call("messages/append", {"sessionId": sid, "runId": run_id, "returnContext": True,
                             "messages": [
        {"role": "user", "content": "hi there"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "sh", "arguments": "{}"}}]},
    ]})
    approval = call("approval/request", {"sessionId": sid, "runId": run_id, "toolCallId": "c1",
                                         "toolName": "sh", "arguments": {"x": 1}})
    call("approval/list", {"sessionId": sid})
    call("approval/resolve", {"approvalId": approval["approvalId"], "decision": "approved"})
    call("run/finish", {"runId": run_id, "outcome": "completed", "returnContext": True,
                        "messages": [{"role": "tool", "tool_call_id": "c1", "content": "ok"}]})
    call("run/finish", {"runId": call("run/start", {"sessionId": sid})["runId"],
                        "outcome": "cancelled"})
    # approvals: one whose arguments its events cut, denied with a reason, one without any
    run_id = call("run/start", {"sessionId": sid})["runId"]
    call("messages/append", {"sessionId": sid, "runId": run_id, "messages": [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "sh", "arguments": "{}"}}
            for i in (2, 3)]}]})
    long = call("approval/request", {"sessionId": sid, "runId": run_id, "toolCallId": "c2",
                                     "toolName": "sh", "arguments": {"text": "x" * 3000}})
    bare = call("approval/request", {"sessionId": sid, "runId": run_id, "toolCallId": "c3"})
    call("approval/list", {"sessionId": sid, "status": "pending"})
    call("approval/resolve", {"approvalId": long["approvalId"], "decision": "denied",
                              "reason": "too long"})
    call("approval/resolve", {"approvalId": bare["approvalId"], "decision": "approved"})
    call("approval/resolve", {"approvalId": bare["approvalId"], "decision": "denied"})
    call("run/finish", {"runId": run_id, "outcome": "completed", "messages": [
        {"role": "tool", "tool_call_id": f"c{i}", "content": "done"} for i in (2, 3)]})
    call("approval/list", {"sessionId": sid})
    # a session with neither title nor metadata, and pages of the list
    call("session/create", {})
    call("session/list", {"limit": 1, "title": "t"})
    call("session/get", {"sessionId": call("session/list", {"limit": 1})["sessions"][0][
        "sessionId"]})
    call("archive/read", {"sessionId": sid})
    call("archive/read", {"sessionId": sid, "limit": 2})
    call("archive/read", {"sessionId": sid, "limit": 1, "beforeId": 3})
    call("archive/read", {"sessionId": sid, "limit": 5, "beforeId": 2})
    call("archive/read", {"sessionId": sid, "afterId": 1_000_000})
    call("archive/search", {"query": "hi", "sessionId": sid})
    call("context/get", {"sessionId": sid})
    call("context/get", {"sessionId": sid, "budgetTokens": 1000, "query": "hi"})
    call("context/get", {"sessionId": sid, "budgetTokens": 40, "includeMetadata": True})
    pin = call("context/pins/add", {"sessionId": sid, "text": "keep"})["pin"]
    call("context/pins/add", {"sessionId": sid, "text": " keep "})  # the same pin again
    call("context/pins/list", {"sessionId": sid})
    for i in range(3):
        call("messages/append", {"sessionId": sid, "messages": [
            {"role": "user", "content": f"more {i} " * 50},
            {"role": "assistant", "content": "ok " * 50}]})
    call("context/compact", {"sessionId": sid, "force": True})
    call("context/compact", {"sessionId": sid})
    call("context/rebuild", {"sessionId": sid, "dryRun": True})
    call("context/explain", {"sessionId": sid})
    call("context/compactions", {"sessionId": sid})
    call("context/pins/remove", {"sessionId": sid, "pinId": pin["pinId"]})
    call("tools/list", {})
    call("tools/call", {"sessionId": sid, "name": "search_past_messages",
                        "arguments": {"query": "hi"}})
    call("heartbeat", {})
    # a correction: once compacted, the search hit of the older statement says which
    # statement superseded it (`supersededBy`), and the newer one ranks above it
    fix = call("session/create", {"sessionId": "ses_correction"})["sessionId"]
    call("messages/append", {"sessionId": fix, "messages": [
        {"role": "user", "content": "Use port 8080 for the dev server."},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "No, actually use port 9090 for the dev server."},
        {"role": "assistant", "content": "Done."},
        *({"role": "user" if i % 2 == 0 else "assistant", "content": f"filler {i} " * 20}
          for i in range(6))]})
    call("context/compact", {"sessionId": fix, "force": True})
    call("archive/search", {"query": "port", "sessionId": fix})
    call("tools/call", {"sessionId": fix, "name": "search_past_messages",
                        "arguments": {"query": "port"}})
    call("context/pop", {"sessionId": sid})
    call("context/clear", {"sessionId": sid})
    call("session/unsubscribe", {"sessionId": sid})
    call("context/status", {"sessionId": "ses_missing"})


def _tcp(info: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    from bench.regression_side import login_params
    from ctxd.protocol.codec import FrameReader, dumps_json, frame, loads_json

    replies: list[Any] = []
    events: list[Any] = []
    host, _, port = info["jsonrpc_tcp"].rpartition(":")
    sock = socket.create_connection((host.strip("[]"), int(port)))
    reader = FrameReader()
    pending: list[bytes] = []
    n = 0

    def call(method: str, params: dict[str, Any]) -> Any:
        nonlocal n
        n += 1
        req = {"jsonrpc": "2.0", "id": n, "method": method, "params": params}
        sock.sendall(frame(dumps_json(req)))
        while True:
            while not pending:
                pending.extend(reader.feed(sock.recv(1 << 20)))
            msg = loads_json(pending.pop(0))
            if "id" in msg:
                replies.append([method, mask(msg)])
                return msg.get("result")
            events.append(mask(msg))

    call("initialize", login_params(info["token"]))
    script(call)
    sock.settimeout(1.0)
    try:
        while True:
            pending.extend(reader.feed(sock.recv(1 << 20)))
    except OSError:
        pass
    events.extend(mask(loads_json(b)) for b in pending)
    sock.close()
    return replies, events


def _zmq(info: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    import msgpack
    import zmq

    replies: list[Any] = []
    events: list[Any] = []
    ctx = zmq.Context.instance()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(info["zmq_router"])
    sub = ctx.socket(zmq.SUB)
    sub.connect(info["zmq_pub"])
    sub.setsockopt(zmq.SUBSCRIBE, b"session/")
    time.sleep(0.5)  # the subscription reaches the publisher
    n = 0

    def call(method: str, params: dict[str, Any]) -> Any:
        nonlocal n
        n += 1
        msg = {"id": n, "method": method, "params": params, "token": info["token"]}
        dealer.send_multipart([b"", msgpack.packb(msg, use_bin_type=True)])
        reply = msgpack.unpackb(dealer.recv_multipart()[-1], raw=False)
        replies.append([method, mask(reply)])
        return reply.get("result")

    script(call)
    while sub.poll(1000):
        events.append(mask(msgpack.unpackb(sub.recv_multipart()[-1], raw=False)))
    dealer.close(linger=0)
    sub.close(linger=0)
    return replies, events


def run_side() -> dict[str, Any]:
    from bench.peers import Daemon

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as root:
        for wire, talk in (("jsonrpc", _tcp), ("zmq", _zmq)):
            daemon = Daemon(Path(root) / wire).start()
            try:
                replies, events = talk(json.loads(daemon.connection_file.read_text()))
            finally:
                daemon.stop()
            # events' order against replies depends on timing; their set does not
            out[wire] = {"replies": replies, "events": sorted(events, key=json.dumps)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--side", action="store_true", help="print this interpreter's replies")
    ap.add_argument("--before", default="HEAD", help="the revision to compare with")
    args = ap.parse_args(argv)
    if args.side:
        json.dump(run_side(), sys.stdout)
        return 0
    from bench.bench_regression import git, materialize

    env = {**os.environ, "PYTHONPATH": str(REPO), "CTXD_LOG_LEVEL": "WARNING"}
    with tempfile.TemporaryDirectory() as root:
        before_python = materialize(git("rev-parse", args.before), Path(root))
        sides = {}
        for name, python in (("before", before_python), ("after", sys.executable)):
            got = subprocess.run([str(python), "-m", "bench.wire_replies", "--side"], cwd=REPO,
                                 env=env, capture_output=True, text=True, timeout=600)
            if got.returncode:
                print(got.stderr, file=sys.stderr)
                return 2
            sides[name] = json.loads(got.stdout)
    differ = 0
    for wire in sides["before"]:
        b, a = sides["before"][wire], sides["after"][wire]
        for (method, rb), (_, ra) in zip(b["replies"], a["replies"], strict=True):
            if rb != ra:
                differ += 1
                print(f"{wire} {method}:\n  before {json.dumps(rb)}\n  after  {json.dumps(ra)}")
        if b["events"] != a["events"]:
            differ += 1
            print(f"{wire} events differ:\n  before {json.dumps(b['events'])}\n"
                  f"  after  {json.dumps(a['events'])}")
        print(f"{wire}: {len(b['replies'])} replies, {len(b['events'])} events compared")
    print("identical" if not differ else f"{differ} differences")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
