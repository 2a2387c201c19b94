"""The envelope both wires share: request checking, replies and error replies, the
ZeroMQ topic names. The JSON-RPC servers (`daemon/servers/rpc_core.py`), the ZeroMQ
server and the clients all take them from here, so the two wires cannot drift apart.

A JSON-RPC request is `{jsonrpc: "2.0", id, method, params}`; a ZeroMQ request is one
msgpack map `{id, method, params, token}`. Replies are `{jsonrpc, id, result}` /
`{jsonrpc, id, error}` on JSON-RPC and the same without `jsonrpc` on ZeroMQ.
"""

from __future__ import annotations

from typing import Any, Literal

from ctxd.protocol.errors import CtxdError, InternalError, InvalidRequest

Wire = Literal["jsonrpc", "zmq"]

# ZeroMQ PUB topics: a session's events, and the probe a subscriber uses to learn that
# its subscriptions are in effect (answered with one `$/probe` message on that topic)
SESSION_PREFIX = b"session/"
PROBE_PREFIX = b"probe/"
PROBE_METHOD = "$/probe"

# what each wire calls the request object and its params, in error messages
_REQUEST_SHAPE = {
    "jsonrpc": ("a JSON-RPC request must be an object", "'params' must be an object"),
    "zmq": (
        "a request must be a msgpack map {id, method, params, token}",
        "'params' must be a map",
    ),
}


def session_topic(session_id: str) -> bytes:
    return SESSION_PREFIX + session_id.encode("utf-8")


def check_request(msg: Any, wire: Wire = "jsonrpc") -> tuple[Any, str, Any, bool]:
    """Check a decoded request: returns (id, method, params, is_notification).

    `params` left out or null becomes `{}`; an array is passed on (the table refuses a
    non-empty one with a clear message). ZeroMQ has no notifications from clients: every
    request there gets a reply, so is_notification is always False.
    """
    not_request, bad_params = _REQUEST_SHAPE[wire]
    if not isinstance(msg, dict):
        raise InvalidRequest(not_request)
    method = msg.get("method")
    if not isinstance(method, str) or (wire == "zmq" and not method):
        raise InvalidRequest("'method' must be a string")
    params = msg.get("params")
    if params is None:
        params = {}
    if not isinstance(params, dict | list):
        raise InvalidRequest(bad_params)
    return msg.get("id"), method, params, wire == "jsonrpc" and "id" not in msg


def reply(id_: Any, result: Any, wire: Wire = "jsonrpc") -> dict[str, Any]:
    if wire == "zmq":
        return {"id": id_, "result": result}
    return {"jsonrpc": "2.0", "id": id_, "result": result}


def error_reply(
    id_: Any, err: CtxdError, wire: Wire = "jsonrpc", *, bare: bool = False
) -> dict[str, Any]:
    """The error reply; `bare` leaves out `data` (when it cannot be encoded)."""
    error = {"code": int(err.code), "message": err.message} if bare else err.to_dict()
    if wire == "zmq":
        return {"id": id_, "error": error}
    return {"jsonrpc": "2.0", "id": id_, "error": error}


def internal(exc: BaseException) -> CtxdError:
    """What a client learns of a bug: its type, never its text (the log has that)."""
    return InternalError(
        f"internal error ({type(exc).__name__}); the daemon log has the details",
        {"type": type(exc).__name__},
    )
