"""The pieces the protocol table is written with: parameters, methods, notifications.

`Param`, `Method` and `Notification` declare one request, parameter or event each; the
bounds below (lengths, counts) and what each error code means are part of the contract
too. The entries themselves are in the `table_*` modules, and `ctxd.protocol.methods`
assembles them into the one table every wire and client reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ctxd.protocol.errors import ErrorCode

PROTOCOL_VERSION = "1.0"
SERVER_NAME = "ctxd"

# Value types a parameter may declare. "integer" and "number" refuse booleans: in Python
# `True` is an `int`, and a client sending `true` for a limit has a bug worth reporting.
TYPES = ("string", "integer", "number", "boolean", "object", "array", "any")

# Bounds shared by many parameters. Lengths count characters (not bytes); arrays count items.
ID_MAX = 200
TOKEN_MAX = 1024
CURSOR_MAX = 1024
NAME_MAX = 200
TITLE_MAX = 1000
QUERY_MAX = 4 * 1024
# terms one search weighs (daemon/fts.py enforces it; kept here as part of the contract)
QUERY_TERMS_MAX = 64
INSTRUCTIONS_MAX = 16 * 1024
REASON_MAX = 4 * 1024
TEXT_MAX = 64 * 1024
LIMIT_MAX = 1000
READ_LIMIT_MAX = 5000
# bytes of messages one archive/read page holds: by default one largest message (8 MiB)
READ_BYTES_DEFAULT = 8 * 1024 * 1024
READ_BYTES_MAX = 64 * 1024 * 1024
OFFSET_MAX = 10_000
APPEND_MAX_MESSAGES = 10_000


@dataclass(frozen=True, slots=True)
class Param:
    """One named parameter of a request.

    `min`/`max` bound the value of an integer or number, the length of a string and the
    item count of an array. `default` is what the handler sees when the parameter is absent.
    """

    name: str
    type: str
    required: bool
    doc: str
    default: Any = None
    choices: tuple[Any, ...] | None = None
    min: float | None = None
    max: float | None = None

    def __post_init__(self) -> None:
        # Caught at import time so a bad table entry never reaches a running daemon.
        if self.type not in TYPES:
            raise ValueError(f"param {self.name!r}: unknown type {self.type!r}")
        if self.required and self.default is not None:
            raise ValueError(f"param {self.name!r}: a required param cannot have a default")
        if isinstance(self.default, dict | list):
            raise ValueError(f"param {self.name!r}: mutable defaults would be shared")


# Where a method's handler lives (see `Method.handler`).
HANDLER_OWNERS = ("engine", "context_edit", "recall", "dispatcher")


@dataclass(frozen=True, slots=True)
class Method:
    """One request. `result` is a short description of the result object's keys.

    `errors` lists the codes specific to this method; any request may also fail with
    `COMMON_ERRORS`. `needs_session` is true when the method takes a required `sessionId`
    naming an existing session (answered with SESSION_NOT_FOUND when it does not exist).
    """

    name: str
    params: tuple[Param, ...]
    result: str
    doc: str
    errors: tuple[ErrorCode, ...]
    needs_session: bool
    # The function serving it, "<owner>.<function>": `engine.*` is called with the params
    # as keyword arguments (camelCase names in snake_case), `context_edit.*` and `recall.*`
    # with the engine first, `dispatcher.*` (what needs the connection) with (conn, params).
    handler: str = ""
    # The method of the Python clients (`clients/client.py`) that sends it.
    client: str = ""
    # When set, the handler's return value is the result's member of this name.
    wrap: str | None = None

    def __post_init__(self) -> None:
        owner, _, func = self.handler.partition(".")
        if owner not in HANDLER_OWNERS or not func:
            raise ValueError(f"method {self.name!r}: handler {self.handler!r} names no owner")
        if not self.client.isidentifier():
            raise ValueError(f"method {self.name!r}: no client method named")

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)


@dataclass(frozen=True, slots=True)
class Notification:
    """One event the daemon sends: a JSON-RPC notification, or a ZeroMQ PUB frame."""

    name: str
    params_doc: str
    doc: str


# Any request can fail with these, whatever its own `errors` say.
COMMON_ERRORS: tuple[ErrorCode, ...] = (
    ErrorCode.PARSE_ERROR,
    ErrorCode.INVALID_REQUEST,
    ErrorCode.METHOD_NOT_FOUND,
    ErrorCode.INVALID_PARAMS,
    ErrorCode.UNAUTHORIZED,
    ErrorCode.PAYLOAD_TOO_LARGE,
    ErrorCode.INTERNAL_ERROR,
    ErrorCode.STORAGE_ERROR,
)

# What each code means and what a client should do about it (rendered in the docs).
ERROR_DOCS: dict[ErrorCode, tuple[str, str]] = {
    ErrorCode.PARSE_ERROR: (
        "The bytes were not valid JSON or msgpack, or a Content-Length header was broken.",
        "Fix the encoder. After a broken header the daemon closes the connection: reconnect.",
    ),
    ErrorCode.INVALID_REQUEST: (
        "The message is not a request object (`method` not a string, `params` not an object).",
        'Send `{jsonrpc: "2.0", id, method, params}` (ZeroMQ: `{id, method, params, token}`).',
    ),
    ErrorCode.METHOD_NOT_FOUND: (
        "No method has that name. `data.known` lists the method names.",
        "Check the name against this document; names are case-sensitive.",
    ),
    ErrorCode.INVALID_PARAMS: (
        "The params do not match the method's table: missing, unknown, wrong type, out of "
        "range or not among the choices. The message and `data.param` name the parameter.",
        "Fix the call. Retrying it unchanged fails the same way.",
    ),
    ErrorCode.INTERNAL_ERROR: (
        "The daemon failed while serving the request (a bug, or a disk or database error).",
        "Read the daemon log. An append may be retried safely with the same `clientBatchId`.",
    ),
    ErrorCode.UNAUTHORIZED: (
        "The token is missing or wrong, or a request other than `initialize` came before a "
        "successful `initialize`.",
        "Re-read the connection file (a restarted daemon has a new token) and `initialize`.",
    ),
    ErrorCode.SESSION_NOT_FOUND: (
        "No session has that `sessionId`.",
        "Use `session/list` to find it, or `session/create` to make it.",
    ),
    ErrorCode.APPROVAL_PENDING: (
        "A tool call of the session is waiting for a human decision.",
        "Resolve it with `approval/resolve`, or wait for `approval/didResolve`, then retry.",
    ),
    ErrorCode.RUN_ACTIVE: (
        "The session already has a run in progress.",
        "Wait for `run/didFinish`, or finish the run with `run/finish`, then retry.",
    ),
    ErrorCode.COMPACTION_IN_PROGRESS: (
        "Another compaction or rebuild of the session is running. `context/compact` and "
        "`context/rebuild` first wait for it (up to `compaction.wait_seconds`, 300 s by "
        "default, reported with `$/progress`); this error comes only when that wait times "
        "out, or when the context was replaced while the compaction ran.",
        "Wait for `context/didCompact` (or `$/progress` with kind `end`), then retry.",
    ),
    ErrorCode.INVALID_MESSAGE: (
        "A message of an append is not a valid chat message (role, content, tool calls). "
        "`data.index` names the message; the batch is refused as a whole.",
        "Fix that message and send the whole batch again.",
    ),
    ErrorCode.PAYLOAD_TOO_LARGE: (
        "The frame or message is bigger than the daemon accepts, or the reply would be "
        "bigger than the reply limit (`max_request_bytes`): a `context/get` (or "
        "`returnContext`) of an active context holding more than that is refused before "
        "it is read; the batch of an append is stored all the same (`data.appended`).",
        "Send smaller batches: split one `messages/append` into several. For a context, "
        "read its tail in pages with `archive/read` (`maxBytes`) from `data.tailFromId`, "
        "or compact the session.",
    ),
    ErrorCode.SUMMARIZER_FAILED: (
        "The summarizer could not build the summary; the context is left as it was.",
        "Retry later, or check the summarizer's configuration in the daemon log.",
    ),
    ErrorCode.NOT_FOUND: (
        "A named run, approval, pin or tool does not exist.",
        "Check the id; the `*/list` methods show what exists.",
    ),
    ErrorCode.CONFLICT: (
        "The request contradicts the current state: the id is taken, the run or approval "
        "is already finished, or a `clientBatchId` was reused for different messages.",
        "Re-read the state (`session/get`, `approval/list`) before deciding what to send.",
    ),
    ErrorCode.STORAGE_ERROR: (
        "The database could not be written: the disk is full, the file is read-only, or an "
        "I/O error occurred. Nothing of the request was written; reads keep working.",
        "Free disk space or fix the file's permissions, then send the same request again "
        "(with the same `clientBatchId` for appends).",
    ),
    ErrorCode.SEARCH_TOO_BROAD: (
        "A search ran longer than the daemon's time budget (`search_budget_seconds`, 2 s "
        "by default) and was stopped. Other requests were served meanwhile. "
        "`data.budgetSeconds` says the budget.",
        "Use fewer, more specific words, or narrow it with `sessionId`, `role`, `since` or "
        "`until`.",
    ),
}


# Parameter builders: the bounds below are part of the contract.


def id_param(name: str, doc: str, required: bool = True) -> Param:
    return Param(name, "string", required, doc, min=1, max=ID_MAX)


def session_param(required: bool = True) -> Param:
    return id_param("sessionId", "Id of the session.", required)


def limit_param(
    default: int, maximum: int = LIMIT_MAX, doc: str = "Most items to return."
) -> Param:
    return Param("limit", "integer", False, doc, default=default, min=1, max=maximum)


# The params of a method that names one existing session and nothing else.
SESSION_ONLY = (session_param(),)
