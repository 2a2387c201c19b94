"""The ctxd protocol as data: every request, its parameters, result and errors.

Both wires (JSON-RPC 2.0 and ZeroMQ + msgpack) and every client read this one table:
the daemon validates each request against it with `validate_params`, and
`python -m ctxd.protocol.gen_docs` renders it to `docs/protocol.md`. Changing a name
here changes the contract other clients are written against.

JSON keys are camelCase. An optional parameter sent as `null` counts as absent; `params`
sent as `null`, left out or sent as an empty array `[]` means no parameters.

This module assembles the table, in the order the docs list it, from the modules that
hold it by job:

- `declare.py`: `Params` (the base of each method's params Struct), `Method`,
  `Notification`, the bounds and the error codes' docs;
- `table_sessions.py`, `table_messages.py`, `table_context.py`, `table_runs.py`,
  `table_daemon.py`: the method entries, grouped as the docs group them;
- `table_notifications.py`: the events the daemon sends;
- `validate.py`: params converted into each method's Struct, with the error texts
  clients read;
- `handlers.py`: the decorator a handler registers itself with, against its method.

Every name other modules use is importable from here.
"""

from __future__ import annotations

import msgspec

from ctxd.protocol.declare import (
    APPEND_MAX_MESSAGES,
    COMMON_ERRORS,
    CURSOR_MAX,
    ERROR_DOCS,
    ID_MAX,
    INSTRUCTIONS_MAX,
    LIMIT_MAX,
    NAME_MAX,
    OFFSET_MAX,
    PROTOCOL_VERSION,
    QUERY_MAX,
    QUERY_TERMS_MAX,
    READ_BYTES_DEFAULT,
    READ_BYTES_MAX,
    READ_LIMIT_MAX,
    REASON_MAX,
    SERVER_NAME,
    TEXT_MAX,
    TITLE_MAX,
    TOKEN_MAX,
    TYPES,
    Field,
    Method,
    Notification,
    Params,
)
from ctxd.protocol.table_context import (
    CONTEXT_CLEAR,
    CONTEXT_COMPACT,
    CONTEXT_COMPACTIONS,
    CONTEXT_EXPLAIN,
    CONTEXT_GET,
    CONTEXT_METHODS,
    CONTEXT_PINS_ADD,
    CONTEXT_PINS_LIST,
    CONTEXT_PINS_REMOVE,
    CONTEXT_POP,
    CONTEXT_REBUILD,
    CONTEXT_STATUS,
)
from ctxd.protocol.table_daemon import (
    DAEMON_METHODS,
    HEARTBEAT,
    SHUTDOWN,
)
from ctxd.protocol.table_messages import (
    ARCHIVE_READ,
    ARCHIVE_SEARCH,
    MESSAGE_METHODS,
    MESSAGES_APPEND,
)
from ctxd.protocol.table_notifications import NOTIFICATION_LIST
from ctxd.protocol.table_runs import (
    APPROVAL_LIST,
    APPROVAL_REQUEST,
    APPROVAL_RESOLVE,
    RUN_FINISH,
    RUN_METHODS,
    RUN_START,
    TOOLS_CALL,
    TOOLS_LIST,
)
from ctxd.protocol.table_sessions import (
    INITIALIZE,
    SESSION_CREATE,
    SESSION_GET,
    SESSION_LIST,
    SESSION_METHODS,
    SESSION_SUBSCRIBE,
    SESSION_UNSUBSCRIBE,
)
from ctxd.protocol.validate import make_validator

_METHOD_LIST: tuple[Method, ...] = (
    *SESSION_METHODS,
    *MESSAGE_METHODS,
    *CONTEXT_METHODS,
    *RUN_METHODS,
    *DAEMON_METHODS,
)

METHODS: dict[str, Method] = {m.name: m for m in _METHOD_LIST}
if len(METHODS) != len(_METHOD_LIST):  # two groups declaring one name: caught at import
    raise ValueError("a method name is declared twice in the protocol table")

NOTIFICATIONS: dict[str, Notification] = {n.name: n for n in NOTIFICATION_LIST}

# each method's result type, as its declaration names it
RESULTS: dict[str, type[msgspec.Struct]] = {m.name: m.returns for m in _METHOD_LIST}

validate_params = make_validator(METHODS)

__all__ = [
    "APPROVAL_LIST",
    "APPROVAL_REQUEST",
    "APPROVAL_RESOLVE",
    "ARCHIVE_READ",
    "ARCHIVE_SEARCH",
    "CONTEXT_CLEAR",
    "CONTEXT_COMPACT",
    "CONTEXT_COMPACTIONS",
    "CONTEXT_EXPLAIN",
    "CONTEXT_GET",
    "CONTEXT_PINS_ADD",
    "CONTEXT_PINS_LIST",
    "CONTEXT_PINS_REMOVE",
    "CONTEXT_POP",
    "CONTEXT_REBUILD",
    "CONTEXT_STATUS",
    "HEARTBEAT",
    "INITIALIZE",
    "MESSAGES_APPEND",
    "RUN_FINISH",
    "RUN_START",
    "SESSION_CREATE",
    "SESSION_GET",
    "SESSION_LIST",
    "SESSION_SUBSCRIBE",
    "SESSION_UNSUBSCRIBE",
    "SHUTDOWN",
    "TOOLS_CALL",
    "TOOLS_LIST",
    "APPEND_MAX_MESSAGES",
    "COMMON_ERRORS",
    "CURSOR_MAX",
    "ERROR_DOCS",
    "ID_MAX",
    "INSTRUCTIONS_MAX",
    "LIMIT_MAX",
    "METHODS",
    "NAME_MAX",
    "NOTIFICATIONS",
    "OFFSET_MAX",
    "PROTOCOL_VERSION",
    "QUERY_MAX",
    "QUERY_TERMS_MAX",
    "READ_BYTES_DEFAULT",
    "READ_BYTES_MAX",
    "READ_LIMIT_MAX",
    "REASON_MAX",
    "SERVER_NAME",
    "TEXT_MAX",
    "TITLE_MAX",
    "TOKEN_MAX",
    "TYPES",
    "Field",
    "Method",
    "Params",
    "RESULTS",
    "Notification",
    "validate_params",
]
