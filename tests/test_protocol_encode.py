"""Result and event Structs on the wires: each encoder writes a Struct as the bytes of its
wire form (camelCase keys, in the declared order; a member left UNSET absent, None as
null), the same bytes the dict of that form gives, on every path a reply or an event
takes (small and large replies, JSON and msgpack, events)."""

from __future__ import annotations

from typing import Any

import msgpack
import msgspec
import pytest

from ctxd.protocol.codec import dumps_json, packb
from ctxd.protocol.large import _SLICE, encode_sliced, pack_reply
from ctxd.protocol.types import (
    ArchiveReadResult,
    CompactionFailed,
    DidChange,
    ErrorObject,
    InitializeResult,
    Progress,
    ProgressValue,
    Status,
)


def _status() -> Status:
    return Status(
        session_id="s1", active_messages=3, estimated_tokens=120, archive_messages=9,
        compaction_count=1, last_compacted_at=1764620000.5, pending_approvals=0,
        active_run_id=None, compacting=False, auto_compaction_paused=False, version=4,
        summarizer="builtin", summarizer_last_failure_at=None, summarizer_last_failure=None,
    )


def _page(text: str) -> ArchiveReadResult:
    msg = {"role": "user", "content": text, "id": 7, "batchId": 2, "tokens": 5,
           "createdAt": 1764620001.25}
    return ArchiveReadResult(messages=[msg], next_after_id=None)  # type: ignore[list-item]


RESULTS: list[tuple[msgspec.Struct, dict[str, Any]]] = [
    (_status(), {
        "sessionId": "s1", "activeMessages": 3, "estimatedTokens": 120, "archiveMessages": 9,
        "compactionCount": 1, "lastCompactedAt": 1764620000.5, "pendingApprovals": 0,
        "activeRunId": None, "compacting": False, "autoCompactionPaused": False,
        "version": 4, "summarizer": "builtin", "summarizerLastFailureAt": None,
        "summarizerLastFailure": None,
    }),
    # UNSET members stay out; a None one is null
    (_page("hi"), {"messages": [{"role": "user", "content": "hi", "id": 7, "batchId": 2,
                                 "tokens": 5, "createdAt": 1764620001.25}],
                   "nextAfterId": None}),
    (ArchiveReadResult(messages=[], next_after_id=None, next_before_id=None),
     {"messages": [], "nextAfterId": None, "nextBeforeId": None}),
    # omit_defaults: what a login did not ask for is left out
    (InitializeResult(server_name="ctxd", version="1", protocol_version="1.0",
                      capabilities={"wires": ["zmq"]}),
     {"serverName": "ctxd", "version": "1", "protocolVersion": "1.0",
      "capabilities": {"wires": ["zmq"]}}),
]


@pytest.mark.parametrize(("struct", "wire_form"), RESULTS)
def test_a_result_struct_is_encoded_as_its_wire_form(
    struct: msgspec.Struct, wire_form: dict[str, Any]
) -> None:
    assert msgspec.to_builtins(struct) == wire_form
    assert list(msgspec.to_builtins(struct)) == list(wire_form)  # the order too
    reply = {"jsonrpc": "2.0", "id": 1, "result": struct}
    assert dumps_json(reply) == dumps_json({**reply, "result": wire_form})
    # ZeroMQ: msgspec's msgpack of the Struct is msgpack's of the dict, byte for byte
    assert pack_reply(1, struct) == packb({"id": 1, "result": wire_form})
    assert pack_reply("r-9", struct) == packb({"id": "r-9", "result": wire_form})
    assert packb(struct) == packb(wire_form)


@pytest.mark.parametrize("wire", ["jsonrpc-tcp", "zmq"])
def test_a_large_struct_reply_is_sliced_into_the_same_bytes(wire: str) -> None:
    page = _page("长" * (2 * _SLICE + 17))
    sliced = encode_sliced(page, wire)
    if wire == "zmq":
        assert bytes(sliced) == msgspec.msgpack.encode(page)
        assert pack_reply(3, sliced) == pack_reply(3, page)
        assert msgpack.unpackb(pack_reply(3, sliced))["result"] == msgspec.to_builtins(page)
    else:
        assert bytes(sliced) == dumps_json(page)
        assert dumps_json({"id": 3, "result": sliced}) == dumps_json({"id": 3, "result": page})


def test_event_structs_are_published_as_their_wire_form() -> None:
    events: list[tuple[msgspec.Struct, dict[str, Any]]] = [
        (DidChange(session_id="s1", change="pop", message_ids=[4, 5], status=_status()),
         {"sessionId": "s1", "change": "pop", "messageIds": [4, 5],
          "status": msgspec.to_builtins(_status())}),
        (Progress(session_id="s1", token="cmp_1",
                  value=ProgressValue(kind="report", percentage=40)),
         {"sessionId": "s1", "token": "cmp_1", "value": {"kind": "report", "percentage": 40}}),
        (CompactionFailed(session_id="s1", trigger="manual", compaction_id="cmp_1",
                          error=ErrorObject(code=-32009, message="boom")),
         {"sessionId": "s1", "trigger": "manual", "compactionId": "cmp_1",
          "error": {"code": -32009, "message": "boom"}}),
    ]
    for event, wire_form in events:
        # the ZeroMQ PUB frame and the JSON-RPC notification of each wire
        assert packb({"method": "m", "params": event}) == packb(
            {"method": "m", "params": wire_form})
        assert dumps_json({"jsonrpc": "2.0", "method": "m", "params": event}) == dumps_json(
            {"jsonrpc": "2.0", "method": "m", "params": wire_form})


def test_what_msgpack_refuses_is_still_refused_beside_a_struct() -> None:
    with pytest.raises(TypeError, match="set"):
        packb({"status": _status(), "bad": {1, 2}})
