"""The ctxd protocol as data: every request, its parameters, result and errors.

Both wires (JSON-RPC 2.0 and ZeroMQ + msgpack) and every client read this one table:
the daemon validates each request against it with `validate_params`, and
`python -m ctxd.protocol.gen_docs` renders it to `docs/protocol.md`. Changing a name
here changes the contract other clients are written against.

JSON keys are camelCase. An optional parameter sent as `null` counts as absent; `params`
sent as `null`, left out or sent as an empty array `[]` means no parameters.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ctxd.protocol.auth import MAC_HEX_LENGTH, NONCE_MAX, NONCE_MIN
from ctxd.protocol.errors import ErrorCode, InvalidParams, MethodNotFound

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
        "The frame or message is bigger than the daemon accepts.",
        "Send smaller batches: split one `messages/append` into several.",
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


def _id(name: str, doc: str, required: bool = True) -> Param:
    return Param(name, "string", required, doc, min=1, max=ID_MAX)


def _session_id(required: bool = True) -> Param:
    return _id("sessionId", "Id of the session.", required)


def _limit(default: int, maximum: int = LIMIT_MAX, doc: str = "Most items to return.") -> Param:
    return Param("limit", "integer", False, doc, default=default, min=1, max=maximum)


_E = ErrorCode
_COMPACT_RESULT = (
    "`effective` (boolean: true only when both messages and tokens shrank; otherwise "
    "nothing is committed and `reason` and `proposed` say why), `compactionId` (null "
    "when nothing was committed), `before` and `after`: `{messages, tokens}` of the "
    "active context, `summarizedFrom`/`summarizedTo` (archive ids), `trigger`, "
    "`rederived` (true when the summary was derived again from the archive: the drift "
    "bound). A compaction without `force` of a context under its limits that moved nothing "
    "also has `underLimits: true` and `limits` (`{messages, tokens}`)."
)
_SESSION_ONLY = (_session_id(),)

_METHOD_LIST: tuple[Method, ...] = (
    Method(
        "initialize",
        (
            Param(
                "token",
                "string",
                False,
                "The token from the connection file. Required unless `proof` is sent.",
                max=TOKEN_MAX,
            ),
            Param("clientName", "string", False, "Shown in the daemon log.", max=NAME_MAX),
            Param(
                "nonce",
                "string",
                False,
                "A fresh random string from the client (16 to 128 characters). The daemon "
                "answers with `nonceMac`, proving it knows the token too.",
                min=NONCE_MIN,
                max=NONCE_MAX,
            ),
            Param(
                "proof",
                "string",
                False,
                'Sent instead of `token`: hex HMAC-SHA256 under the token of `"ctxd-client:"` '
                "followed by `nonce`, so a server that is not the daemon never learns the "
                "token. Needs `nonce`.",
                max=MAC_HEX_LENGTH,
            ),
        ),
        '`serverName` ("ctxd"), `version` (daemon version), `protocolVersion` ("1.0"), '
        "`capabilities` (object naming the optional features this daemon serves; "
        "`runLeaseSeconds`: how long a ZeroMQ client holding a run may stay silent), "
        '`nonceMac` (when `nonce` was sent: hex HMAC-SHA256 under the token of `"ctxd-daemon:"` '
        "followed by `nonce`; a client must check it before sending anything else and close "
        "the connection when it differs).",
        "Proves the token, and with `nonce` has the daemon prove it too (mutual "
        "authentication). On JSON-RPC wires it must be the first request of a connection. "
        "On ZeroMQ it may be sent with `proof` and no token in the envelope, so the client "
        "checks the daemon before sending the token.",
        (_E.UNAUTHORIZED,),
        False,
        handler="dispatcher.initialize",
        # sent by the clients' open(), with a nonce and a proof of the token
        client="open",
    ),
    Method(
        "session/create",
        (
            _id("sessionId", "Id to give the session; the daemon picks one when absent.", False),
            Param("title", "string", False, "Human-readable title.", max=TITLE_MAX),
            Param("metadata", "object", False, "Any JSON object, stored as given."),
        ),
        "The session: `sessionId`, `title`, `metadata`, `createdAt` (unix seconds).",
        "Creates an empty session.",
        (_E.CONFLICT,),
        False,
        handler="engine.create_session",
        client="create_session",
    ),
    Method(
        "session/list",
        (
            _limit(50, doc="Most sessions to return."),
            Param("cursor", "string", False, "`nextCursor` of the previous page.", max=CURSOR_MAX),
            Param(
                "title",
                "string",
                False,
                "Only sessions whose title contains this text (ASCII letters match in "
                "either case).",
                min=1,
                max=TITLE_MAX,
            ),
        ),
        "`sessions` (each session with its `status`, as in `context/status`, and "
        "`lastActivityAt`: unix seconds of its newest message, or of its creation when it "
        "has none), `nextCursor` (string, or null on the last page).",
        "Lists sessions, newest first, one page at a time.",
        (),
        False,
        handler="engine.list_sessions",
        client="list_sessions",
    ),
    Method(
        "session/get",
        _SESSION_ONLY,
        "`session` (as from `session/create`), `status` (as from `context/status`).",
        "Reads one session.",
        (_E.SESSION_NOT_FOUND,),
        True,
        handler="engine.get_session",
        client="get_session",
    ),
    Method(
        "session/subscribe",
        _SESSION_ONLY,
        "`{}`.",
        "Sends this connection the session's notifications (JSON-RPC wires; on ZeroMQ "
        "subscribe a SUB socket to the session's topic instead).",
        (_E.SESSION_NOT_FOUND,),
        True,
        handler="dispatcher.subscribe",
        client="subscribe",
    ),
    Method(
        "session/unsubscribe",
        _SESSION_ONLY,
        "`{}`.",
        "Stops the session's notifications on this connection.",
        (_E.SESSION_NOT_FOUND,),
        True,
        handler="dispatcher.unsubscribe",
        client="unsubscribe",
    ),
    Method(
        "messages/append",
        (
            _session_id(),
            Param(
                "messages",
                "array",
                True,
                "OpenAI-shaped chat messages (`role`, `content`, `tool_calls`, "
                "`tool_call_id`, `name`), oldest first.",
                min=1,
                max=APPEND_MAX_MESSAGES,
            ),
            _id("runId", "The run these messages belong to.", False),
            _id(
                "clientBatchId",
                "Idempotency key: a retry with the same id returns the first append's "
                "result instead of appending again.",
                False,
            ),
            Param(
                "returnContext",
                "boolean",
                False,
                "Also return the model context after the append (`context`, as from "
                "`context/get` without a budget or query): append and read the next model "
                "input in one round trip.",
                default=False,
            ),
        ),
        "`batchId` (integer), `messageIds` (archive ids, integers, in order), `status` (as from "
        "`context/status`); with `returnContext`, `context` (as from `context/get`).",
        "Appends one batch to the archive and the active context. The batch is stored whole "
        "or not at all. May schedule an automatic compaction. Limits (daemon config): each "
        "message at most `max_message_bytes` of JSON (8 MiB by default), at most "
        "`max_batch_messages` messages (10,000), and the whole request at most "
        "`max_request_bytes` (64 MiB); above them `PAYLOAD_TOO_LARGE` and nothing is stored.",
        (
            _E.SESSION_NOT_FOUND,
            _E.INVALID_MESSAGE,
            _E.PAYLOAD_TOO_LARGE,
            _E.APPROVAL_PENDING,
            _E.NOT_FOUND,
            _E.CONFLICT,
        ),
        True,
        handler="dispatcher.append",
        client="append",
    ),
    Method(
        "archive/read",
        (
            _session_id(),
            Param(
                "afterId",
                "integer",
                False,
                "Return messages with an archive id greater than this.",
                default=0,
                min=0,
            ),
            _limit(200, READ_LIMIT_MAX, "Most messages to return."),
            Param(
                "beforeId",
                "integer",
                False,
                "Page backwards: return the latest `limit` messages with an archive id "
                "smaller than this (still oldest first).",
                min=1,
            ),
            Param(
                "maxBytes",
                "integer",
                False,
                "Most bytes of messages (their stored JSON) in one page; the page ends "
                "before the message that would pass it, and `nextAfterId` (`nextBeforeId`) "
                "says where to go on. A single message larger than this still comes alone, "
                "so paging always moves.",
                default=READ_BYTES_DEFAULT,
                min=1,
                max=READ_BYTES_MAX,
            ),
        ),
        "`messages` (each with `id`, `batchId`, `createdAt`, `tokens` and its chat fields), "
        "`nextAfterId` (pass as `afterId` for the next page; null when there is no more). "
        "With `beforeId`: `nextAfterId` is null and `nextBeforeId` (pass as `beforeId` for "
        "the page of older messages; null when there is none) is added.",
        "Reads the full archived history in order, whether or not it is still in context, "
        f"one page at a time: at most `limit` messages and `maxBytes` bytes (default "
        f"{READ_BYTES_DEFAULT // (1024 * 1024)} MiB). A message is at most the daemon's "
        "`max_message_bytes` (8 MiB of JSON by default).",
        (_E.SESSION_NOT_FOUND,),
        True,
        handler="engine.read_archive",
        client="read",
    ),
    Method(
        "archive/search",
        (
            Param(
                "query",
                "string",
                True,
                f"Words to find: at most {QUERY_TERMS_MAX} terms (each Chinese or Japanese "
                "character counts as one); more are refused with `INVALID_PARAMS`.",
                min=1,
                max=QUERY_MAX,
            ),
            _session_id(required=False),
            Param(
                "role",
                "string",
                False,
                "Only messages of this role.",
                choices=("system", "user", "assistant", "tool"),
            ),
            _limit(20, doc="Most hits to return."),
            Param("offset", "integer", False, "Hits to skip.", default=0, min=0, max=OFFSET_MAX),
            Param(
                "advanced",
                "boolean",
                False,
                "Pass `query` through as SQLite FTS5 syntax (phrases, NEAR, AND/OR/NOT, "
                "prefix*); otherwise it is matched as plain words.",
                default=False,
            ),
            Param("newestFirst", "boolean", False, "Order by time, not rank.", default=False),
            Param("since", "number", False, "Only messages created at or after (unix seconds)."),
            Param("until", "number", False, "Only messages created at or before (unix seconds)."),
        ),
        "`hits`: each `messageId`, `sessionId`, `role`, `snippet`, `createdAt`, `score`, "
        "`inActiveContext` (boolean), and `supersededBy` (the archive id of the statement "
        "now current) when a later statement of the same subject superseded this one; "
        "the newer statement then ranks directly above it. "
        '`matched`: `"all"` when the hits have every word '
        '(or match the advanced query), `"any"` when no message has every word and the '
        "hits are the messages with some of them, best first.",
        "Full-text search of the archive, across all sessions unless `sessionId` is given. "
        "Plain words must all appear in a message (in any order; a quoted chunk is one "
        "word); when no message has them all, the search falls back to messages with any "
        'of them and says so with `matched: "any"`. A search that runs longer than the '
        "daemon's budget is stopped with `SEARCH_TOO_BROAD`; other requests are served "
        "while a search runs.",
        (_E.SESSION_NOT_FOUND, _E.SEARCH_TOO_BROAD),
        False,
        handler="dispatcher.search",
        client="search",
    ),
    Method(
        "context/get",
        (
            _session_id(),
            Param(
                "format",
                "string",
                False,
                "Shape of the messages.",
                default="openai",
                choices=("openai",),
            ),
            Param(
                "budgetTokens",
                "integer",
                False,
                "Fit the messages to this many tokens (a step projection): the leading system "
                "messages and pins always; the summary, giving up items when it does not fit "
                "(superseded ones first, then tool activity, files, errors, decisions, open "
                "items, goals and constraints last, oldest first within each); then the "
                "longest tail suffix that fits without splitting a tool call from its result.",
                min=1,
                max=10_000_000,
            ),
            Param(
                "query",
                "string",
                False,
                "Add one marked system message recalling the archived messages most "
                "relevant to this text that are no longer in the active context (its first "
                f"{QUERY_TERMS_MAX} terms are used; a recall search that runs out of the "
                "search budget recalls nothing).",
                min=1,
                max=QUERY_MAX,
            ),
            Param(
                "includeMetadata",
                "boolean",
                False,
                "Give each archived message back with its `metadata` (where a client keeps "
                "its own form of the message); strip it before sending to a model.",
                default=False,
            ),
        ),
        "`messages` ready to send to the model (the session's leading system messages, "
        "one system message with pins and summary, then the exact tail), `messageIds` (the "
        "archive id of each message, null for the pins/summary and recall messages), "
        "`status` (as from `context/status`). With `budgetTokens` or `query` also "
        "`estimatedTokens`, `budgetTokens`, `overBudget`, `truncated` (null, or "
        "`{messages, tokens, fromId, toId}` of the tail left out), `recalledIds` and "
        "`droppedSummaryItems` (summary items left out to fit the budget). `overBudget` is "
        "true only when the system messages and pins alone exceed `budgetTokens`.",
        "The model context: what to send as the next request's messages. A projection "
        "never changes the stored context.",
        (_E.SESSION_NOT_FOUND,),
        True,
        handler="dispatcher.context_get",
        client="context_get",
    ),
    Method(
        "context/status",
        _SESSION_ONLY,
        "`activeMessages`, `estimatedTokens`, `archiveMessages`, `compactionCount`, "
        "`lastCompactedAt` (unix seconds or null), `pendingApprovals`, `activeRunId` (or "
        "null), `compacting` (boolean), `autoCompactionPaused` (boolean: three automatic "
        "compactions failed in a row; a manual compaction or rebuild that succeeds resumes "
        "it), `version` (bumped whenever the context is replaced), `sessionId`.",
        "Counters of the session's context and archive.",
        (_E.SESSION_NOT_FOUND,),
        True,
        handler="engine.status",
        client="context_status",
    ),
    Method(
        "context/compact",
        (
            _session_id(),
            Param(
                "force",
                "boolean",
                False,
                "Compact even when the context is under its threshold.",
                default=False,
            ),
            Param(
                "instructions",
                "string",
                False,
                "Extra guidance for the summarizer (what to keep).",
                max=INSTRUCTIONS_MAX,
            ),
        ),
        _COMPACT_RESULT,
        "Moves the oldest messages out of the active context into the summary. The archive "
        "keeps them. Reports progress with `$/progress`. When another compaction of the "
        "session is running (an automatic one), waits for it first (progress message "
        '"waiting for the compaction already running"), then runs.',
        (
            _E.SESSION_NOT_FOUND,
            _E.COMPACTION_IN_PROGRESS,
            _E.SUMMARIZER_FAILED,
        ),
        True,
        handler="dispatcher.compact",
        client="compact",
    ),
    Method(
        "context/rebuild",
        (
            _session_id(),
            Param(
                "dryRun",
                "boolean",
                False,
                "Preview only: return the context it would produce (`messages`) and the "
                "difference (`diff`: items, messages, tokens) without committing.",
                default=False,
            ),
        ),
        _COMPACT_RESULT + " With `dryRun`: `dryRun`, `messages` and `diff` too.",
        "Rebuilds the summary from the archive from scratch with the current strategy, "
        "keeping pins; committed even when it does not shrink the context. Reports "
        "progress with `$/progress`.",
        (
            _E.SESSION_NOT_FOUND,
            _E.COMPACTION_IN_PROGRESS,
            _E.SUMMARIZER_FAILED,
        ),
        True,
        handler="dispatcher.rebuild",
        client="rebuild",
    ),
    Method(
        "context/clear",
        _SESSION_ONLY,
        "`before` (`{messages, tokens}` of the context it replaced), `status` (as from "
        "`context/status`).",
        "Starts a fresh active context: no system messages, summary or tail; pins stay. "
        "The archive keeps every message and search still finds them; messages appended "
        "from now on make up the new context.",
        (_E.SESSION_NOT_FOUND, _E.APPROVAL_PENDING),
        True,
        handler="context_edit.clear",
        client="context_clear",
    ),
    Method(
        "context/pop",
        (
            _session_id(),
            Param(
                "count",
                "integer",
                False,
                "How many of the newest messages to take out.",
                default=1,
                min=1,
                max=APPEND_MAX_MESSAGES,
            ),
        ),
        "`messages`: the messages taken out, oldest first, as from `archive/read` (none "
        "when the tail is empty), `status` (as from `context/status`).",
        "Takes the newest messages of the tail out of the active context (the archive keeps "
        "them). The cut is widened so that a tool result never stays without its call: "
        "popping a result also pops the assistant message that made the call and all after.",
        (_E.SESSION_NOT_FOUND, _E.APPROVAL_PENDING),
        True,
        handler="context_edit.pop",
        client="context_pop",
    ),
    Method(
        "context/explain",
        _SESSION_ONLY,
        "`items`: each summary item (`section`, `text`, `status`, `sources`: each "
        "`{id, role, createdAt, snippet, ordinal}` resolved from the archive, `ordinal` "
        "being the message's position in its session, the `#N` the model reads; or "
        "`{id, broken: true}`; and, when they apply, `unconfirmed` (a hedged statement), "
        "`subject` (the path or id an artifact names), `value` (what a setting sets) and "
        "`was` (the value it replaced)); `brokenPointers` (count); `pins`; `provenance` "
        "(`compactionIds`, `coversFrom`, `coversTo`, `summarizer`).",
        "Shows where every line of the summary came from.",
        (_E.SESSION_NOT_FOUND,),
        True,
        handler="recall.explain",
        client="explain",
    ),
    Method(
        "context/compactions",
        (_session_id(), _limit(50, doc="Most attempts to return.")),
        "`compactions`, newest first: each `compactionId`, `trigger`, `startedAt`, "
        "`durationMs`, `beforeMessages`, `beforeTokens`, `afterMessages`, `afterTokens`, "
        "`effective`, `committed`, `summarizedFrom`, `summarizedTo`, `summarizer`, `error` "
        "(null, or why it failed), `archiveMessages` and `archiveTokens` (the archive's size "
        "when it ran).",
        "The session's compaction attempts, effective or not: what each one saved.",
        (_E.SESSION_NOT_FOUND,),
        True,
        handler="engine.compaction_history_async",
        client="compactions",
        wrap="compactions",
    ),
    Method(
        "context/pins/add",
        (
            _session_id(),
            Param(
                "text",
                "string",
                True,
                "Text kept in the context through every compaction.",
                min=1,
                max=TEXT_MAX,
            ),
        ),
        "`pin`: `pinId`, `text`, `createdAt`.",
        "Pins a text to the context.",
        (_E.SESSION_NOT_FOUND,),
        True,
        handler="engine.add_pin",
        client="add_pin",
        wrap="pin",
    ),
    Method(
        "context/pins/list",
        _SESSION_ONLY,
        "`pins`: each `pinId`, `text`, `createdAt`.",
        "Lists the session's pins.",
        (_E.SESSION_NOT_FOUND,),
        True,
        handler="engine.pins",
        client="list_pins",
        wrap="pins",
    ),
    Method(
        "context/pins/remove",
        (_session_id(), _id("pinId", "Id of the pin.")),
        "`pin`: the removed pin.",
        "Unpins a text.",
        (_E.SESSION_NOT_FOUND, _E.NOT_FOUND),
        True,
        handler="engine.remove_pin",
        client="remove_pin",
        wrap="pin",
    ),
    Method(
        "run/start",
        _SESSION_ONLY,
        "`runId`.",
        "Starts a run (one agent turn). A session has at most one run at a time; a run "
        "left open by a connection that closes is marked interrupted.",
        (_E.SESSION_NOT_FOUND, _E.RUN_ACTIVE),
        True,
        handler="dispatcher.run_start",
        client="start_run",
    ),
    Method(
        "run/finish",
        (
            _id("runId", "Id of the run."),
            Param(
                "outcome",
                "string",
                True,
                "How the run ended.",
                choices=("completed", "failed", "cancelled"),
            ),
            Param(
                "messages",
                "array",
                False,
                "The run's last messages, appended to its session within the run before it "
                "finishes (as `messages/append` with this `runId`), saving a round trip.",
                min=1,
                max=APPEND_MAX_MESSAGES,
            ),
            _id(
                "clientBatchId",
                "Idempotency key of `messages`, as in `messages/append`.",
                False,
            ),
            Param(
                "returnContext",
                "boolean",
                False,
                "Also return the model context once the run is finished (`context`, as from "
                "`context/get`): with `messages`, a whole turn after `run/start` is one "
                "round trip.",
                default=False,
            ),
        ),
        "`run` (`runId`, `sessionId`, `status` (the outcome), `startedAt`, `finishedAt`), "
        "`autoCompactionScheduled` (boolean); with `messages`, `append` (as from "
        "`messages/append`); with `returnContext`, `context` (as from `context/get`).",
        "Finishes a run. The daemon may then compact the context in the background. With "
        "`messages`, appends them first: when the append is refused, the run stays open.",
        (_E.NOT_FOUND, _E.CONFLICT, _E.INVALID_MESSAGE, _E.APPROVAL_PENDING),
        False,
        handler="dispatcher.run_finish",
        client="finish_run",
    ),
    Method(
        "approval/request",
        (
            _session_id(),
            _id("runId", "The run the tool call belongs to."),
            _id("toolCallId", "`id` of the tool call in the assistant message."),
            Param("toolName", "string", False, "Name of the tool.", max=NAME_MAX),
            Param(
                "arguments",
                "any",
                False,
                "The tool call's arguments, as an object or as the JSON string the model wrote.",
            ),
        ),
        "`approvalId`.",
        "Asks a human to approve a tool call; clients see `approval/didRequest`.",
        (_E.SESSION_NOT_FOUND, _E.NOT_FOUND, _E.CONFLICT),
        True,
        handler="dispatcher.approval_request",
        client="request_approval",
    ),
    Method(
        "approval/resolve",
        (
            _id("approvalId", "Id of the approval."),
            Param(
                "decision",
                "string",
                True,
                "The human's decision.",
                choices=("approved", "denied"),
            ),
            Param("reason", "string", False, "Why; shown to the agent.", max=REASON_MAX),
        ),
        "The approval: `approvalId`, `sessionId`, `runId`, `toolCallId`, `toolName`, "
        "`arguments`, `status`, `reason`, `createdAt`, `resolvedAt`.",
        "Approves or denies a pending tool call; clients see `approval/didResolve`. When it "
        "was the session's last pending approval and no run is open, a compaction held back "
        "by the approval runs now if the context is over its limits.",
        (_E.NOT_FOUND, _E.CONFLICT),
        False,
        handler="dispatcher.approval_resolve",
        client="resolve_approval",
    ),
    Method(
        "approval/list",
        (
            _session_id(),
            Param(
                "status",
                "string",
                False,
                "Only approvals in this state; all when absent.",
                choices=("pending", "approved", "denied"),
            ),
        ),
        "`approvals` (as from `approval/resolve`), oldest first.",
        "Lists the session's approvals.",
        (_E.SESSION_NOT_FOUND,),
        True,
        handler="engine.list_approvals",
        client="list_approvals",
        wrap="approvals",
    ),
    Method(
        "tools/list",
        (),
        '`tools`: OpenAI function-tool schemas (`{type: "function", function: {name, '
        "description, parameters}}`), among them `search_past_messages`.",
        "Tools the agent can offer its model so it can read its own past.",
        (),
        False,
        handler="dispatcher.list_tools",
        client="list_tools",
    ),
    Method(
        "tools/call",
        (
            _session_id(),
            Param("name", "string", True, "Tool name from `tools/list`.", min=1, max=NAME_MAX),
            Param("arguments", "object", True, "The tool's arguments, parsed from JSON."),
        ),
        "`content` (text to give the model as the tool result), `data` (the same, "
        "structured: for `search_past_messages`, `hits` and `matched` as from "
        "`archive/search`).",
        "Runs one of the tools of `tools/list` for the session's agent. "
        "`search_past_messages` takes the same query limits as `archive/search`.",
        (_E.SESSION_NOT_FOUND, _E.NOT_FOUND, _E.SEARCH_TOO_BROAD),
        True,
        handler="recall.call_tool_async",
        client="call_tool",
    ),
    Method(
        "heartbeat",
        (),
        "`leaseSeconds` (how long the daemon waits for the next request before it interrupts "
        "this client's runs).",
        "Tells the daemon the client is alive. ZeroMQ has no disconnect signal: a ZeroMQ "
        "client holding an open run must send a request (any, or this one) at least every "
        "`leaseSeconds`, or its runs are marked interrupted.",
        (),
        False,
        handler="dispatcher.heartbeat",
        client="heartbeat",
    ),
    Method(
        "shutdown",
        (),
        "`{}`, sent before the daemon stops.",
        "Asks the daemon to stop: it answers, finishes writing, removes its connection file "
        "and exits.",
        (),
        False,
        handler="dispatcher.shutdown",
        client="shutdown",
    ),
)

METHODS: dict[str, Method] = {m.name: m for m in _METHOD_LIST}

_NOTIFICATION_LIST: tuple[Notification, ...] = (
    Notification(
        "session/didAppend",
        "`sessionId`, `batchId`, `messageIds`, `runId` (or null).",
        "A batch was appended to the session.",
    ),
    Notification(
        "context/didCompact",
        "`sessionId`, `compactionId`, `trigger` (`auto`, `manual` or `rebuild`), `before` "
        "and `after` (`{messages, tokens}`).",
        "A compaction or rebuild changed the active context.",
    ),
    Notification(
        "context/didChange",
        "`sessionId`, `change` (`clear` or `pop`), `messageIds` (the messages taken out), "
        "`status` (as from `context/status`).",
        "A client cleared the active context or popped messages from it.",
    ),
    Notification(
        "context/compactionFailed",
        "`sessionId`, `trigger` (`auto`, `manual` or `rebuild`), `error` (`{code, message}`).",
        "A compaction attempt failed; the context is unchanged.",
    ),
    Notification(
        "approval/didRequest",
        "`sessionId`, `approval` (as from `approval/resolve`; `arguments` longer than 2048 "
        "characters are cut, with `argumentsTruncated: true`: `approval/list` has them whole).",
        "A tool call waits for a human decision.",
    ),
    Notification(
        "approval/didResolve",
        "`sessionId`, `approval` (as in `approval/didRequest`).",
        "A tool call was approved or denied.",
    ),
    Notification(
        "run/didStart",
        "`sessionId`, `runId`, `run` (the run object).",
        "A run started.",
    ),
    Notification(
        "run/didFinish",
        "`sessionId`, `run` (as from `run/finish`), `autoCompactionScheduled`.",
        "A run finished (or was marked interrupted when its connection closed).",
    ),
    Notification(
        "$/progress",
        '`token` (string, one per operation), `sessionId`, `value`: `{kind: "begin" | '
        '"report" | "end", title?, message?, percentage? (0-100)}`.',
        "Progress of a compaction or rebuild, as in LSP: one `begin`, any `report`s, one `end`.",
    ),
)

NOTIFICATIONS: dict[str, Notification] = {n.name: n for n in _NOTIFICATION_LIST}


# Validation. Everything below runs on every request, so per-method work is precomputed
# into plain dicts of checker functions; a call does one dict lookup per parameter.

_Checker = Callable[[Any], Any]

_TYPE_WORDS = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
    "object": "an object",
    "array": "an array",
}


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list | tuple):
        return "array"
    return type(value).__name__


def _fail(method: str, param: str, expected: str, value: Any) -> InvalidParams:
    return InvalidParams(
        f"{method}: parameter '{param}' must be {expected}, got {_type_name(value)}"
        + (f" {_preview(value)}" if isinstance(value, int | float | str) else ""),
        {"param": param},
    )


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _make_checker(method: str, p: Param) -> _Checker:
    """Build one parameter's checker: returns the (possibly normalised) value or raises."""
    name, lo, hi, choices = p.name, p.min, p.max, p.choices

    def out_of_range(value: Any, size: float, unit: str) -> InvalidParams:
        if lo is not None and hi is not None:
            want = f"between {_num(lo)} and {_num(hi)}{unit}"
        elif lo is not None:
            want = f"at least {_num(lo)}{unit}"
        else:
            want = f"at most {_num(hi)}{unit}"
        what = f"{_num(size)}{unit}" if unit else _preview(value)
        return InvalidParams(
            f"{method}: parameter '{name}' must be {want}, got {what}", {"param": name}
        )

    def bounded(value: Any, size: float, unit: str) -> Any:
        if (lo is not None and size < lo) or (hi is not None and size > hi):
            raise out_of_range(value, size, unit)
        return value

    def among(value: Any) -> Any:
        if choices is not None and value not in choices:
            raise InvalidParams(
                f"{method}: parameter '{name}' must be one of "
                f"{', '.join(repr(c) for c in choices)}, got {_preview(value)}",
                {"param": name, "choices": list(choices)},
            )
        return value

    if p.type == "string":
        unit = " characters"

        def check(value: Any) -> Any:
            if type(value) is not str:
                raise _fail(method, name, "a string", value)
            bounded(value, len(value), unit)
            if not value.isascii():
                try:  # a lone surrogate (JSON "\ud800") is not text SQLite can store
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    raise InvalidParams(
                        f"{method}: parameter {name!r} contains a lone surrogate; "
                        "send valid Unicode text",
                        {"param": name},
                    ) from None
            return among(value)

    elif p.type == "integer":

        def check(value: Any) -> Any:
            # `type(...) is int` refuses bool (a subclass of int) without a second test.
            if type(value) is not int:
                # Some encoders cannot tell 5 from 5.0; an integral float is accepted.
                if type(value) is float and value.is_integer():
                    value = int(value)
                else:
                    raise _fail(method, name, "an integer", value)
            bounded(value, value, "")
            return among(value)

    elif p.type == "number":

        def check(value: Any) -> Any:
            if type(value) is not int and type(value) is not float:
                raise _fail(method, name, "a number", value)
            if not math.isfinite(value):
                raise _fail(method, name, "a finite number", value)
            bounded(value, value, "")
            return among(value)

    elif p.type == "boolean":

        def check(value: Any) -> Any:
            if type(value) is not bool:
                raise _fail(method, name, "a boolean (true or false)", value)
            return value

    elif p.type == "object":

        def check(value: Any) -> Any:
            if not isinstance(value, dict):
                raise _fail(method, name, "an object", value)
            return value

    elif p.type == "array":
        unit = " items"

        def check(value: Any) -> Any:
            # msgpack decoders may hand back tuples for arrays; both are arrays on the wire.
            if not isinstance(value, list | tuple):
                raise _fail(method, name, "an array", value)
            return bounded(value, len(value), unit)

    else:  # "any"

        def check(value: Any) -> Any:
            return value

    return check


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


@dataclass(frozen=True, slots=True)
class _Compiled:
    checkers: dict[str, _Checker]
    required: tuple[str, ...]
    defaults: dict[str, Any]


def _compile(method: Method) -> _Compiled:
    return _Compiled(
        checkers={p.name: _make_checker(method.name, p) for p in method.params},
        required=tuple(p.name for p in method.params if p.required),
        # Every declared parameter is present in the result, so handlers can index it.
        defaults={p.name: p.default for p in method.params},
    )


_COMPILED: dict[str, _Compiled] = {name: _compile(m) for name, m in METHODS.items()}


def validate_params(method: str, params: Any) -> dict[str, Any]:
    """Check `params` against `method`'s table and return a new dict of them.

    The result holds every declared parameter: absent optional ones (and optional ones
    sent as null) get their default, None when they have none. Raises `MethodNotFound`
    for an unknown method and `InvalidParams` naming the parameter for anything else.
    """
    spec = _COMPILED.get(method)
    if spec is None:
        raise _unknown_method(method)
    if type(params) is not dict:
        if params is None or (isinstance(params, list | tuple) and not params):
            # `[]` is how Lua's empty table and some clients spell "no params"
            params = {}
        elif isinstance(params, list | tuple):
            names = ", ".join(METHODS[method].param_names) or "none"
            raise InvalidParams(
                f"{method}: params must be an object of named parameters, not a positional "
                f"array (by-position params are not supported); parameters: {names}"
            )
        elif not isinstance(params, dict):
            raise InvalidParams(f"{method}: params must be an object, got {_type_name(params)}")
    out = spec.defaults.copy()
    checkers = spec.checkers
    for key, value in params.items():
        check = checkers.get(key)
        if check is None:
            raise _unknown_param(method, key)
        if value is not None:
            out[key] = check(value)
    for key in spec.required:
        if out[key] is None:
            p = METHODS[method].param(key)
            got = ", got null" if key in params else ""
            raise InvalidParams(
                f"{method}: missing required parameter '{key}' "
                f"({_TYPE_WORDS.get(p.type, p.type)}){got}",
                {"param": key},
            )
    return out


def _unknown_method(method: Any) -> MethodNotFound:
    name = method if isinstance(method, str) else repr(method)
    close = difflib.get_close_matches(name, list(METHODS), n=1) if isinstance(method, str) else []
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return MethodNotFound(
        f"unknown method '{name}'{hint}; the methods are listed in docs/protocol.md "
        "and in ctxd.protocol.methods.METHODS, and error.data.known has their names",
        {"method": name, "known": list(METHODS)},
    )


def _unknown_param(method: str, key: Any) -> InvalidParams:
    names = METHODS[method].param_names
    close = difflib.get_close_matches(str(key), names, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    accepted = ", ".join(names) if names else "none"
    return InvalidParams(
        f"{method}: unknown parameter '{key}'; {hint}accepted parameters: {accepted}",
        {"param": str(key)},
    )


__all__ = [
    "APPEND_MAX_MESSAGES",
    "COMMON_ERRORS",
    "ERROR_DOCS",
    "ID_MAX",
    "INSTRUCTIONS_MAX",
    "LIMIT_MAX",
    "METHODS",
    "NOTIFICATIONS",
    "PROTOCOL_VERSION",
    "QUERY_MAX",
    "QUERY_TERMS_MAX",
    "READ_BYTES_DEFAULT",
    "READ_BYTES_MAX",
    "READ_LIMIT_MAX",
    "SERVER_NAME",
    "TEXT_MAX",
    "TYPES",
    "Method",
    "Notification",
    "Param",
    "validate_params",
]
