"""The pieces the protocol table is written with: params, methods, notifications.

`Params` (a msgspec Struct per method), `Method` and `Notification` declare one
request's params, one request and one event; the
bounds below (lengths, counts) and what each error code means are part of the contract
too. The entries themselves are in the `table_*` modules, and `ctxd.protocol.methods`
assembles them into the one table every wire and client reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as dataclass_field
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import msgspec

from ctxd.protocol.errors import ErrorCode

PROTOCOL_VERSION = "1.0"
SERVER_NAME = "ctxd"

# Bounds shared by many parameters. Lengths count characters (not bytes); arrays count items.
ID_MAX = 200
TOKEN_MAX = 1024
CURSOR_MAX = 1024
NAME_MAX = 200
TITLE_MAX = 1000
QUERY_MAX = 4 * 1024
# terms one search weighs (daemon/stores/sqlite/fts.py enforces it; kept here as part of
# the contract)
QUERY_TERMS_MAX = 64
INSTRUCTIONS_MAX = 16 * 1024
REASON_MAX = 4 * 1024
TEXT_MAX = 64 * 1024
LIMIT_MAX = 1000
READ_LIMIT_MAX = 5000
# bytes of messages one archive/read page holds: by default one largest message (8 MiB)
READ_BYTES_DEFAULT = 8 * 1024 * 1024
READ_BYTES_MAX = 64 * 1024 * 1024

# the param most methods take first, declared once
SessionId = Annotated[
    str, msgspec.Meta(min_length=1, max_length=ID_MAX, description="Id of the session.")
]
OFFSET_MAX = 10_000
APPEND_MAX_MESSAGES = 10_000


class Params(msgspec.Struct, rename="camel", kw_only=True, forbid_unknown_fields=True):
    """The params of one request: snake_case fields, camelCase on the wire.

    Each field's type carries its bounds (`msgspec.Meta`: `min_length`/`max_length` for
    strings and arrays, `ge`/`le` for numbers), its choices (`Literal`) and its doc
    (`description`). A required field has no default; an optional one is `X | None` with
    the default the handler sees when the client leaves it out or sends null.
    """


# the params' JSON Schema says what the items of `messages` are; the daemon checks them
# itself (INVALID_MESSAGE with `data.index`), so the Struct keeps them as plain JSON
MESSAGE_ITEMS: dict[str, Any] = {"items": {"$ref": "#/$defs/ChatMessage"}}


@dataclass(frozen=True, slots=True)
class Field:
    """One parameter as the docs, the error texts and the tests read it, derived from a
    params Struct (never declared by hand)."""

    name: str
    attr: str
    type: str
    required: bool
    doc: str
    default: Any = None
    choices: tuple[Any, ...] | None = None
    min: float | None = None
    max: float | None = None


# the names of a parameter's value types, as the docs and the error texts say them
TYPES = ("string", "integer", "number", "boolean", "object", "array", "any")

_TYPE_NAMES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _field(info: msgspec.structs.FieldInfo) -> Field:
    t: Any = info.type
    meta: dict[str, Any] = {}
    optional = False
    while True:
        if get_origin(t) is Annotated:
            for m in t.__metadata__:
                if isinstance(m, msgspec.Meta):
                    for key in ("min_length", "max_length", "ge", "le", "description"):
                        if getattr(m, key) is not None:
                            meta[key] = getattr(m, key)
            t = get_args(t)[0]
        elif get_origin(t) in (Union, UnionType):
            rest = [a for a in get_args(t) if a is not type(None)]
            optional = True
            t = rest[0]
        else:
            break
    choices = None
    if get_origin(t) is Literal:
        choices = get_args(t)
        kind = _TYPE_NAMES[type(choices[0])]
    elif t in _TYPE_NAMES:
        kind = _TYPE_NAMES[t]
    elif get_origin(t) is dict:
        kind = "object"
    elif get_origin(t) is list:
        kind = "array"
    else:
        kind = "any"
    required = info.required
    if required and optional:
        raise ValueError(f"param {info.encode_name!r}: a required param cannot be nullable")
    default = None if info.default is msgspec.NODEFAULT else info.default
    return Field(
        info.encode_name,
        info.name,
        kind,
        required,
        meta.get("description", ""),
        default,
        choices,
        meta.get("min_length", meta.get("ge")),
        meta.get("max_length", meta.get("le")),
    )


def fields_of(params: type[Params]) -> tuple[Field, ...]:
    """The parameters a params Struct declares, in order."""
    return tuple(_field(f) for f in msgspec.structs.fields(params))


@dataclass(frozen=True, slots=True)
class Method:
    """One request: its params Struct, its result Struct and what the docs say of it.

    `result` is a short description of the result object's keys, `returns` its type.
    `errors` lists the codes specific to this method; any request may also fail with
    `COMMON_ERRORS`. `needs_session` is true when the method takes a required `sessionId`
    naming an existing session (answered with SESSION_NOT_FOUND when it does not exist).
    The handler registers itself against this object (`ctxd.protocol.handlers.serves`).
    """

    name: str
    params: type[Params]
    result: str
    doc: str
    errors: tuple[ErrorCode, ...]
    needs_session: bool
    returns: type[msgspec.Struct]
    # The method of the Python clients (`clients/client.py`) that sends it.
    client: str = ""
    # When set, the handler's return value is the result's member of this name.
    wrap: str | None = None
    # the params Struct's fields as docs and error texts read them (derived, not declared)
    fields: tuple[Field, ...] = dataclass_field(default=(), init=False)

    def __post_init__(self) -> None:
        if not self.client.isidentifier():
            raise ValueError(f"method {self.name!r}: no client method named")
        if not issubclass(self.params, Params):
            raise ValueError(f"method {self.name!r}: params must be a Params Struct")
        object.__setattr__(self, "fields", fields_of(self.params))

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def param(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
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


# JSON values kept as they came (objects, arrays, anything)
JSON = Any
