"""What the protocol's types cannot say by themselves: every handler accepts its
method's params, the generated client calls, docs and schema are current, the layer
over the params Structs refuses with typed errors, real replies and events (with the
store records inside them) convert into the declared types, and the one-round-trip forms
of a turn (`messages/append` with `returnContext`, `run/finish` with `messages`) work on
every wire."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from helpers import DaemonProcess
from test_protocol_table import GOOD

from ctxd.clients import gen_methods
from ctxd.daemon import dispatch  # every handler registered
from ctxd.daemon.engine import Engine
from ctxd.protocol import schema, types
from ctxd.protocol.errors import InvalidMessage, InvalidParams, NotFound
from ctxd.protocol.handlers import HANDLERS
from ctxd.protocol.methods import METHODS, NOTIFICATIONS, RESULTS, validate_params
from ctxd.protocol.schema import PARAMS


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_has_a_handler_taking_its_params(name: str) -> None:
    handler = HANDLERS[name]
    accepted = inspect.signature(handler.function).parameters
    if handler.connection:
        # the dispatcher's, or one of the parts it is made of (run_requests.py)
        assert handler.owner in (c.__name__ for c in dispatch.Dispatcher.__mro__), name
        assert list(accepted)[1:3] == ["conn", "p"], f"{name}: a dispatcher handler takes (conn, p)"
        # the Struct it is given is the one its annotation names
        assert accepted["p"].annotation == METHODS[name].params.__name__, name
        return
    assert handler.owner in (None, *(c.__name__ for c in Engine.__mro__)), name
    lead = ["self"] if handler.owner is not None else ["engine"]
    assert list(accepted)[: len(lead)] == lead, name
    for field in METHODS[name].fields:
        assert field.attr in accepted, f"{name}: {handler.function.__qualname__} lacks {field.attr}"


def test_client_calls_are_generated_from_the_table(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert gen_methods.main(["--check"]) == 0, "run python -m ctxd.clients.gen_methods"
    out = tmp_path / "client_methods.py"
    assert gen_methods.main(["--output", str(out)]) == 0
    out.write_text(out.read_text().replace("sessionId=session_id", "session_id=session_id"))
    assert gen_methods.main(["--check", "--output", str(out)]) == 1
    assert "stale" in capsys.readouterr().err
    # the LSP and MCP servers and the CLI send through these calls, not raw names
    clients = Path(gen_methods.__file__).resolve().parent
    for path in [*clients.glob("lsp/*.py"), clients / "mcp_server.py",
                 *clients.glob("cli/*.py"), *clients.glob("cli/commands/*.py")]:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"\.call\(\s*\"", text), f"{path.name} sends a raw method name"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("contract")).start()
    yield d
    d.stop()


@pytest.mark.parametrize("wire", ["zmq", "jsonrpc", "websocket"])
def test_a_turn_in_two_round_trips_after_run_start(daemon: DaemonProcess, wire: str) -> None:
    with daemon.client(wire) as c:
        sid = c.create_session(title=wire)["sessionId"]
        run_id = c.start_run(sid)["runId"]
        got = c.append(sid, [{"role": "user", "content": "hi"}], run_id=run_id,
                       return_context=True)
        assert got["context"] == c.context_get(sid)
        assert got["context"]["messageIds"] == got["messageIds"]
        done = c.finish_run(run_id, "completed",
                            messages=[{"role": "assistant", "content": "hello"}],
                            client_batch_id="last", return_context=True)
        assert done["run"]["status"] == "completed"
        assert done["context"] == c.context_get(sid)
        assert done["context"]["status"]["activeRunId"] is None
        assert done["append"]["messageIds"] == [got["messageIds"][0] + 1]
        read = c.read(sid)["messages"]
        assert [m["content"] for m in read] == ["hi", "hello"]
        # without the new params the results are what they were
        plain = c.append(sid, [{"role": "user", "content": "x"}])
        assert "context" not in plain
        assert c.finish_run(c.start_run(sid)["runId"], "cancelled").keys() == {
            "run", "autoCompactionScheduled"}


def test_run_finish_with_a_refused_message_leaves_the_run_open(daemon: DaemonProcess) -> None:
    with daemon.client("zmq") as c:
        sid = c.create_session()["sessionId"]
        run_id = c.start_run(sid)["runId"]
        with pytest.raises(InvalidMessage):
            c.finish_run(run_id, "completed", messages=[{"role": "tool", "content": "x",
                                                         "tool_call_id": "nope"}])
        assert c.context_status(sid)["activeRunId"] == run_id
        assert c.context_status(sid)["archiveMessages"] == 0
        c.finish_run(run_id, "completed")
        with pytest.raises(NotFound):
            c.finish_run("run_missing", "completed", messages=[{"role": "user", "content": "x"}])
        assert c.context_status(sid)["archiveMessages"] == 0


# typed params, results and notifications; the JSON Schema


def test_every_notification_has_a_payload_type() -> None:
    # two declarations (the table's notifications, the payload Structs) kept equal here
    assert set(types.NOTIFICATIONS) == set(NOTIFICATIONS)


@pytest.mark.parametrize("name", list(METHODS))
def test_params_struct_accepts_what_the_table_accepts(name: str) -> None:
    good = GOOD[name]
    # the daemon's checks (defaults filled, text checked) and a plain decode of the JSON
    # into the Struct agree on what is valid
    decoded = msgspec.json.decode(msgspec.json.encode(good), type=PARAMS[name])
    assert validate_params(name, good) == decoded
    # and what the Struct refuses comes back as a typed error naming the param
    for p in METHODS[name].fields:
        if p.type == "string" and p.max is not None:
            with pytest.raises(InvalidParams) as info:
                validate_params(name, {**good, p.name: "x" * (int(p.max) + 1)})
            assert info.value.data["param"] == p.name
    with pytest.raises(InvalidParams):
        validate_params(name, {**good, "noSuchParam": 1})


def test_schema_file_is_current_and_printed_by_the_package() -> None:
    assert schema.main(["--check"]) == 0, "run python -m ctxd.protocol --write"
    out = subprocess.run([sys.executable, "-m", "ctxd.protocol"], capture_output=True,
                         check=True, timeout=60).stdout
    doc = json.loads(out)
    assert doc == json.loads(schema.DEFAULT_OUTPUT.read_text(encoding="utf-8"))
    assert set(doc["methods"]) == set(METHODS)
    append = doc["$defs"]["MessagesAppendParams"]
    assert append["required"] == ["sessionId", "messages"]
    assert append["properties"]["messages"]["maxItems"] == 10_000
    assert sorted(doc["$defs"]["ChatMessage"]["properties"]["role"]["enum"]) == [
        "assistant", "system", "tool", "user"]


def test_real_replies_and_notifications_have_the_declared_types(daemon: DaemonProcess) -> None:
    seen: dict[str, Any] = {}

    def call(method: str, result: Any) -> Any:
        seen[method] = msgspec.convert(result, RESULTS[method])
        return result

    with daemon.client("zmq") as c:
        stream = c.notifications()
        call("initialize", c.server_info)
        sid = call("session/create", c.create_session(title="t", metadata={"a": 1}))["sessionId"]
        call("session/subscribe", c.subscribe(sid))
        call("session/list", c.list_sessions())
        call("session/get", c.get_session(sid))
        run_id = call("run/start", c.start_run(sid))["runId"]
        call("messages/append", c.append(sid, [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "sh", "arguments": "{}"}}]},
        ], run_id=run_id, return_context=True))
        approval = call("approval/request", c.request_approval(sid, run_id, "c1", "sh", {"x": 1}))
        call("approval/resolve", c.resolve_approval(approval["approvalId"], "approved"))
        call("approval/list", c.list_approvals(sid))
        call("run/finish", c.finish_run(run_id, "completed", messages=[
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}]))
        call("archive/read", c.read(sid))
        call("archive/search", c.search("hi", session_id=sid))
        call("context/get", c.context_get(sid, budget_tokens=1000, query="hi"))
        call("context/status", c.context_status(sid))
        pin = call("context/pins/add", c.add_pin(sid, "keep"))["pin"]
        call("context/pins/list", c.list_pins(sid))
        for i in range(3):
            c.append(sid, [{"role": "user", "content": f"more {i} " * 50},
                           {"role": "assistant", "content": "ok " * 50}])
        call("context/compact", c.compact(sid, force=True))
        call("context/rebuild", c.rebuild(sid, dry_run=True))
        call("context/explain", c.explain(sid))
        call("context/compactions", c.compactions(sid))
        call("context/pins/remove", c.remove_pin(sid, pin["pinId"]))
        call("tools/list", c.list_tools())
        call("tools/call", c.call_tool(sid, "search_past_messages", {"query": "hi"}))
        call("heartbeat", c.heartbeat())
        call("context/pop", c.context_pop(sid))
        call("context/clear", c.context_clear(sid))
        events: set[str] = set()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and events != set(NOTIFICATIONS) - {
            "context/compactionFailed", "session/didMissEvents"}:
            try:
                method, params = next(stream)
            except StopIteration:
                break
            msgspec.convert(params, types.NOTIFICATIONS[method])
            events.add(method)
            if method == "context/didChange" and params["change"] == "clear":
                break
        call("session/unsubscribe", c.unsubscribe(sid))
    assert set(seen) == set(METHODS) - {"shutdown"}
    assert {"session/didAppend", "run/didFinish", "context/didCompact", "$/progress",
            "approval/didRequest", "approval/didResolve", "context/didChange"} <= events


# one envelope for both wires


def test_both_wires_and_the_clients_share_one_envelope() -> None:
    from ctxd.clients import _zmq, client, stdio_proxy
    from ctxd.clients.cli.commands import watch
    from ctxd.daemon.servers import rpc_core, zmq_server
    from ctxd.protocol import codec, connection, envelope

    assert codec.check_request is envelope.check_request
    assert zmq_server.check_request is envelope.check_request
    assert rpc_core.internal is envelope.internal
    assert zmq_server.session_topic is _zmq.session_topic is envelope.session_topic
    assert zmq_server.PROBE_PREFIX is _zmq.PROBE_PREFIX
    for module in (client, watch, stdio_proxy):
        assert module.daemon_gone is connection.daemon_gone
    assert envelope.session_topic("s1") == b"session/s1"
    assert set(watch.EVENTS) == set(NOTIFICATIONS)


@pytest.mark.parametrize(
    ("msg", "wire", "message"),
    [
        ([], "jsonrpc", "a JSON-RPC request must be an object"),
        ([], "zmq", "a request must be a msgpack map {id, method, params, token}"),
        ({"method": 1}, "jsonrpc", "'method' must be a string"),
        ({"method": ""}, "zmq", "'method' must be a string"),
        ({"method": "m", "params": 3}, "jsonrpc", "'params' must be an object"),
        ({"method": "m", "params": 3}, "zmq", "'params' must be a map"),
    ],
)
def test_request_checking_per_wire(msg: Any, wire: Any, message: str) -> None:
    from ctxd.protocol.envelope import check_request
    from ctxd.protocol.errors import InvalidRequest

    with pytest.raises(InvalidRequest) as info:
        check_request(msg, wire)
    assert info.value.message == message


def test_request_checking_fills_params_and_spots_notifications() -> None:
    from ctxd.protocol.envelope import check_request

    assert check_request({"method": "m"}) == (None, "m", {}, True)
    assert check_request({"id": 3, "method": "m", "params": None}) == (3, "m", {}, False)
    assert check_request({"method": "m"}, "zmq") == (None, "m", {}, False)


def test_pid_alive_knows_a_running_an_exited_and_an_unreaped_process() -> None:
    from ctxd.protocol.connection import daemon_gone, pid_alive

    assert pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while pid_alive(child.pid) and time.monotonic() < deadline:
        time.sleep(0.02)  # exited but not reaped yet (a zombie) is gone all the same
    assert not pid_alive(child.pid)
    child.wait()
    assert not pid_alive(child.pid)
    assert daemon_gone({"pid": child.pid})
    assert not daemon_gone({"pid": os.getpid()})
    assert not daemon_gone({}) and not daemon_gone({"pid": "x"}) and not daemon_gone({"pid": True})
