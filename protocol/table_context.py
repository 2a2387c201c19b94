"""Protocol table entries. The active context: `context/*` (reading, compaction, editing, pins).

Assembled in order with the other groups by `ctxd.protocol.methods`.
"""

from typing import Annotated, Literal

from msgspec import Meta

from ctxd.protocol import types
from ctxd.protocol.declare import (
    APPEND_MAX_MESSAGES,
    ID_MAX,
    INSTRUCTIONS_MAX,
    LIMIT_MAX,
    QUERY_MAX,
    TEXT_MAX,
    Method,
    Params,
    SessionId,
)
from ctxd.protocol.errors import ErrorCode

_E = ErrorCode

_COMPACT_RESULT = (
    "`effective` (boolean: true only when both messages and tokens shrank; otherwise "
    "nothing is committed and `reason` and `proposed` say why), `compactionId` (null "
    "when nothing was committed), `before` and `after`: `{messages, tokens}` of the "
    "active context, `summarizedFrom`/`summarizedTo` (archive ids), `trigger`, "
    "`rederived` (true when the summary was derived again from the archive: the drift "
    "bound). A compaction without `force` of a context under its limits that moved nothing "
    "also has `underLimits: true` and `limits` (`{messages, tokens}`). With "
    "`instructions`, `instructionsApplied` says whether they shaped a committed summary "
    "(when false, `reason` says so too). A rebuild that did not shrink the context is "
    "kept anyway and says so in `note`."
)


class ContextGetParams(Params):
    session_id: SessionId
    format: (
        Annotated[
            Literal["openai"],
            Meta(
                description="Shape of the messages.",
            ),
        ]
        | None
    ) = "openai"
    budget_tokens: (
        Annotated[
            int,
            Meta(
                ge=1,
                le=10_000_000,
                description=(
                    "Fit the messages to this many tokens (a step projection): the leading system "
                    "messages and pins always; the summary, giving up items when it does not fit "
                    "(superseded ones first, then tool activity, files, errors, decisions, open "
                    "items, goals and constraints last, oldest first within each); then the "
                    "longest tail suffix that fits without splitting a tool call from its result."
                ),
            ),
        ]
        | None
    ) = None
    query: (
        Annotated[
            str,
            Meta(
                min_length=1,
                max_length=QUERY_MAX,
                description=(
                    "Add one marked system message recalling the archived messages most relevant "
                    "to this text that are no longer in the active context (its first 64 terms are"
                    " used; a recall search that runs out of the search budget recalls nothing)."
                ),
            ),
        ]
        | None
    ) = None
    include_metadata: (
        Annotated[
            bool,
            Meta(
                description=(
                    "Give each archived message back with its `metadata` (where a client keeps its"
                    " own form of the message); strip it before sending to a model."
                ),
            ),
        ]
        | None
    ) = False


class ContextStatusParams(Params):
    session_id: SessionId


class ContextCompactParams(Params):
    session_id: SessionId
    force: (
        Annotated[
            bool,
            Meta(
                description=(
                    "Compact even when the context is under its threshold, keeping only the last "
                    "few messages (`compaction.force_keep_messages`, at most half)."
                ),
            ),
        ]
        | None
    ) = False
    instructions: (
        Annotated[
            str,
            Meta(
                max_length=INSTRUCTIONS_MAX,
                description=(
                    "Extra guidance for the summarizer (what to keep first); the result's "
                    "`instructionsApplied` says whether they shaped a committed summary."
                ),
            ),
        ]
        | None
    ) = None


class ContextRebuildParams(Params):
    session_id: SessionId
    dry_run: (
        Annotated[
            bool,
            Meta(
                description=(
                    "Preview only: return the context it would produce (`messages`) and the "
                    "difference (`diff`: items, messages, tokens) without committing."
                ),
            ),
        ]
        | None
    ) = False


class ContextClearParams(Params):
    session_id: SessionId


class ContextPopParams(Params):
    session_id: SessionId
    count: (
        Annotated[
            int,
            Meta(
                ge=1,
                le=APPEND_MAX_MESSAGES,
                description="How many of the newest messages to take out.",
            ),
        ]
        | None
    ) = 1


class ContextExplainParams(Params):
    session_id: SessionId


class ContextCompactionsParams(Params):
    session_id: SessionId
    limit: (
        Annotated[
            int,
            Meta(
                ge=1,
                le=LIMIT_MAX,
                description="Most attempts to return.",
            ),
        ]
        | None
    ) = 50


class ContextPinsAddParams(Params):
    session_id: SessionId
    text: Annotated[
        str,
        Meta(
            min_length=1,
            max_length=TEXT_MAX,
            description="Text kept in the context through every compaction.",
        ),
    ]


class ContextPinsListParams(Params):
    session_id: SessionId


class ContextPinsRemoveParams(Params):
    session_id: SessionId
    pin_id: Annotated[
        str,
        Meta(
            min_length=1,
            max_length=ID_MAX,
            description="Id of the pin.",
        ),
    ]


CONTEXT_GET = Method(
    "context/get",
    ContextGetParams,
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
    returns=types.ContextGetResult,
    client="context_get",
)

CONTEXT_STATUS = Method(
    "context/status",
    ContextStatusParams,
    "`activeMessages` (the messages `context/get` returns: the archived ones in the "
    "context, plus one when the session has pins or a summary, for the generated system "
    "message that carries them), `estimatedTokens`, `archiveMessages`, `compactionCount`, "
    "`lastCompactedAt` (unix seconds or null), `pendingApprovals`, `activeRunId` (or "
    "null), `compacting` (boolean), `autoCompactionPaused` (boolean: three automatic "
    "compactions failed in a row; a manual compaction or rebuild that succeeds resumes "
    "it), `version` (bumped whenever the context is replaced), `sessionId`, "
    "`summarizer` (the daemon's summarizer, e.g. \"openai:qwen2.5:7b (fallback "
    'builtin)"), `summarizerLastFailureAt` (unix seconds or null) and '
    "`summarizerLastFailure` (the message of its last failure, or null; a model "
    "that failed over to the fallback counts).",
    "Counters of the session's context and archive.",
    (_E.SESSION_NOT_FOUND,),
    True,
    returns=types.Status,
    client="context_status",
)

CONTEXT_COMPACT = Method(
    "context/compact",
    ContextCompactParams,
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
    returns=types.CompactResult,
    client="compact",
)

CONTEXT_REBUILD = Method(
    "context/rebuild",
    ContextRebuildParams,
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
    returns=types.CompactResult,
    client="rebuild",
)

CONTEXT_CLEAR = Method(
    "context/clear",
    ContextClearParams,
    "`before` (`{messages, tokens}` of the context it replaced), `status` (as from "
    "`context/status`).",
    "Starts a fresh active context: no system messages, summary or tail; pins stay. "
    "The archive keeps every message and search still finds them; messages appended "
    "from now on make up the new context.",
    (_E.SESSION_NOT_FOUND, _E.APPROVAL_PENDING),
    True,
    returns=types.ClearResult,
    client="context_clear",
)

CONTEXT_POP = Method(
    "context/pop",
    ContextPopParams,
    "`messages`: the messages taken out, oldest first, as from `archive/read` (none "
    "when the tail is empty), `status` (as from `context/status`).",
    "Takes the newest messages of the tail out of the active context (the archive keeps "
    "them). The cut is widened so that a tool result never stays without its call: "
    "popping a result also pops the assistant message that made the call and all after.",
    (_E.SESSION_NOT_FOUND, _E.APPROVAL_PENDING),
    True,
    returns=types.PopResult,
    client="context_pop",
)

CONTEXT_EXPLAIN = Method(
    "context/explain",
    ContextExplainParams,
    "`items`: each summary item (`section`, `text`, `status`, `sources`: each "
    "`{id, role, createdAt, snippet, ordinal}` resolved from the archive, `ordinal` "
    "being the message's position in its session, the `#N` the model reads; or "
    "`{id, broken: true}`; and, when they apply, `unconfirmed` (a hedged statement), "
    "`origin` (who wrote it when a model and the built-in extractor summarized "
    "together: `extractor`, `model` or `model+extractor`), "
    "`subject` (the path or id an artifact names), `value` (what a setting sets) and "
    "`was` (the value it replaced)); first the instruction preambles the summary message "
    "carries verbatim (`section` `preambles`, `subject`: its heading or tag); "
    "`brokenPointers` (count); `pins`; `provenance` "
    "(`compactionIds`, `coversFrom`, `coversTo` (archive ids), `coversFromOrdinal`, "
    "`coversToOrdinal` (their `#N`), `summarizer`).",
    "Shows where every line of the summary came from.",
    (_E.SESSION_NOT_FOUND,),
    True,
    returns=types.ExplainResult,
    client="explain",
)

CONTEXT_COMPACTIONS = Method(
    "context/compactions",
    ContextCompactionsParams,
    "`compactions`, newest first: each `compactionId`, `trigger`, `startedAt`, "
    "`durationMs`, `beforeMessages`, `beforeTokens`, `afterMessages`, `afterTokens`, "
    "`effective`, `committed`, `summarizedFrom`, `summarizedTo`, `summarizer`, `error` "
    "(null, or why it failed), `instructions` (null, or what the caller asked the "
    "summarizer to keep), `archiveMessages` and `archiveTokens` (the archive's size "
    "when it ran).",
    "The session's compaction attempts, effective or not: what each one saved.",
    (_E.SESSION_NOT_FOUND,),
    True,
    returns=types.CompactionsResult,
    client="compactions",
    wrap="compactions",
)

CONTEXT_PINS_ADD = Method(
    "context/pins/add",
    ContextPinsAddParams,
    "`pin`: `pinId`, `text`, `createdAt`.",
    "Pins a text to the context; a text the session has pinned already returns that "
    "pin, unchanged.",
    (_E.SESSION_NOT_FOUND,),
    True,
    returns=types.PinResult,
    client="add_pin",
    wrap="pin",
)

CONTEXT_PINS_LIST = Method(
    "context/pins/list",
    ContextPinsListParams,
    "`pins`: each `pinId`, `text`, `createdAt`.",
    "Lists the session's pins.",
    (_E.SESSION_NOT_FOUND,),
    True,
    returns=types.PinsResult,
    client="list_pins",
    wrap="pins",
)

CONTEXT_PINS_REMOVE = Method(
    "context/pins/remove",
    ContextPinsRemoveParams,
    "`pin`: the removed pin.",
    "Unpins a text.",
    (_E.SESSION_NOT_FOUND, _E.NOT_FOUND),
    True,
    returns=types.PinResult,
    client="remove_pin",
    wrap="pin",
)


CONTEXT_METHODS: tuple[Method, ...] = (
    CONTEXT_GET,
    CONTEXT_STATUS,
    CONTEXT_COMPACT,
    CONTEXT_REBUILD,
    CONTEXT_CLEAR,
    CONTEXT_POP,
    CONTEXT_EXPLAIN,
    CONTEXT_COMPACTIONS,
    CONTEXT_PINS_ADD,
    CONTEXT_PINS_LIST,
    CONTEXT_PINS_REMOVE,
)
