"""The protocol table is the one contract: every method in it has a handler, a client
method taking each of its params, and a docs entry; the one-round-trip forms of a turn
(`messages/append` with `returnContext`, `run/finish` with `messages`) work on every wire."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import DaemonProcess

from ctxd.clients.client import AsyncClient, Client
from ctxd.daemon import context_edit, recall
from ctxd.daemon.dispatch import Dispatcher
from ctxd.daemon.engine import Engine
from ctxd.protocol.errors import InvalidMessage, NotFound
from ctxd.protocol.methods import METHODS

DOCS = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"
OWNERS: dict[str, Any] = {
    "engine": Engine,
    "context_edit": context_edit,
    "recall": recall,
    "dispatcher": Dispatcher,
}


def _snake(name: str) -> str:
    return re.sub(r"[A-Z]", lambda m: "_" + m.group(0).lower(), name)


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_has_a_handler_taking_its_params(name: str) -> None:
    method = METHODS[name]
    owner, _, func = method.handler.partition(".")
    fn = getattr(OWNERS[owner], func, None)
    assert callable(fn), f"{name}: handler {method.handler} does not exist"
    accepted = inspect.signature(fn).parameters
    if owner == "dispatcher":
        assert list(accepted)[1:3] == ["conn", "p"], f"{name}: a dispatcher handler takes (conn, p)"
        return
    lead = ["self"] if owner == "engine" else ["engine"]
    assert list(accepted)[: len(lead)] == lead, name
    for param in method.param_names:
        assert _snake(param) in accepted, f"{name}: {method.handler} lacks {_snake(param)}"


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_has_a_client_method_taking_its_params(name: str) -> None:
    method = METHODS[name]
    for cls in (Client, AsyncClient):
        fn = getattr(cls, method.client, None)
        assert callable(fn), f"{name}: {cls.__name__} has no {method.client}()"
        if name == "initialize":
            continue  # open() computes every param: the nonce, the proof, the client name
        accepted = inspect.signature(fn).parameters
        extra = any(p.kind is p.VAR_KEYWORD for p in accepted.values())
        for param in method.param_names:
            assert _snake(param) in accepted or extra, (
                f"{name}: {cls.__name__}.{method.client}() cannot send {param}"
            )


def test_every_method_has_a_docs_entry() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for name, method in METHODS.items():
        heading = f"### `{name}`"
        assert heading in text, name
        section = text.split(heading, 1)[1].split("\n### ", 1)[0]
        for param in method.param_names:
            assert f"`{param}`" in section, f"{name}: {param} is not documented"


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
                            client_batch_id="last")
        assert done["run"]["status"] == "completed"
        assert done["append"]["messageIds"] == [got["messageIds"][0] + 1]
        read = c.read(sid)["messages"]
        assert [m["content"] for m in read] == ["hi", "hello"]
        # without the new params the results are what they were
        plain = c.append(sid, [{"role": "user", "content": "x"}])
        assert "context" not in plain
        assert "append" not in c.finish_run(c.start_run(sid)["runId"], "cancelled")


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
