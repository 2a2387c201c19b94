"""Protocol table entries. Runs, approvals and tools: `run/*`, `approval/*`, `tools/*`.

Assembled in order with the other groups by `ctxd.protocol.methods`.
"""

from typing import Annotated, Literal

from msgspec import Meta

from ctxd.protocol import types
from ctxd.protocol.declare import (
    APPEND_MAX_MESSAGES,
    ID_MAX,
    JSON,
    MESSAGE_ITEMS,
    NAME_MAX,
    REASON_MAX,
    Method,
    Params,
    SessionId,
)
from ctxd.protocol.errors import ErrorCode

_E = ErrorCode


class RunStartParams(Params):
    session_id: SessionId


class RunFinishParams(Params):
    run_id: Annotated[
        str,
        Meta(
            min_length=1,
            max_length=ID_MAX,
            description="Id of the run.",
        ),
    ]
    outcome: Annotated[
        Literal["completed", "failed", "cancelled"],
        Meta(
            description="How the run ended.",
        ),
    ]
    messages: (
        Annotated[
            list[JSON],
            Meta(
                min_length=1,
                max_length=APPEND_MAX_MESSAGES,
                extra_json_schema=MESSAGE_ITEMS,
                description=(
                    "The run's last messages, appended to its session within the run before it "
                    "finishes (as `messages/append` with this `runId`), saving a round trip."
                ),
            ),
        ]
        | None
    ) = None
    client_batch_id: (
        Annotated[
            str,
            Meta(
                min_length=1,
                max_length=ID_MAX,
                description="Idempotency key of `messages`, as in `messages/append`.",
            ),
        ]
        | None
    ) = None
    return_context: (
        Annotated[
            bool,
            Meta(
                description=(
                    "Also return the model context once the run is finished (`context`, as from "
                    "`context/get`): with `messages`, a whole turn after `run/start` is one round "
                    "trip."
                ),
            ),
        ]
        | None
    ) = False


class ApprovalRequestParams(Params):
    session_id: SessionId
    run_id: Annotated[
        str,
        Meta(
            min_length=1,
            max_length=ID_MAX,
            description="The run the tool call belongs to.",
        ),
    ]
    tool_call_id: Annotated[
        str,
        Meta(
            min_length=1,
            max_length=ID_MAX,
            description="`id` of the tool call in the assistant message.",
        ),
    ]
    tool_name: (
        Annotated[
            str,
            Meta(
                max_length=NAME_MAX,
                description="Name of the tool.",
            ),
        ]
        | None
    ) = None
    arguments: (
        Annotated[
            JSON,
            Meta(
                description=(
                    "The tool call's arguments, as an object or as the JSON string the model wrote."
                ),
            ),
        ]
        | None
    ) = None


class ApprovalResolveParams(Params):
    approval_id: Annotated[
        str,
        Meta(
            min_length=1,
            max_length=ID_MAX,
            description="Id of the approval.",
        ),
    ]
    decision: Annotated[
        Literal["approved", "denied"],
        Meta(
            description="The human's decision.",
        ),
    ]
    reason: (
        Annotated[
            str,
            Meta(
                max_length=REASON_MAX,
                description="Why; shown to the agent.",
            ),
        ]
        | None
    ) = None


class ApprovalListParams(Params):
    session_id: SessionId
    status: (
        Annotated[
            Literal["pending", "approved", "denied"],
            Meta(
                description="Only approvals in this state; all when absent.",
            ),
        ]
        | None
    ) = None


class ToolsListParams(Params):
    """No params."""


class ToolsCallParams(Params):
    session_id: SessionId
    name: Annotated[
        str,
        Meta(
            min_length=1,
            max_length=NAME_MAX,
            description="Tool name from `tools/list`.",
        ),
    ]
    arguments: Annotated[
        dict[str, JSON],
        Meta(
            description="The tool's arguments, parsed from JSON.",
        ),
    ]


RUN_START = Method(
    "run/start",
    RunStartParams,
    "`runId`.",
    "Starts a run (one agent turn). A session has at most one run at a time; a run "
    "left open by a connection that closes is marked interrupted.",
    (_E.SESSION_NOT_FOUND, _E.RUN_ACTIVE),
    True,
    returns=types.RunStartResult,
    client="start_run",
)

RUN_FINISH = Method(
    "run/finish",
    RunFinishParams,
    "`run` (`runId`, `sessionId`, `status` (the outcome), `startedAt`, `finishedAt`), "
    "`autoCompactionScheduled` (boolean); with `messages`, `append` (as from "
    "`messages/append`); with `returnContext`, `context` (as from `context/get`).",
    "Finishes a run. The daemon may then compact the context in the background. With "
    "`messages`, appends them first: when the append is refused, the run stays open.",
    (_E.NOT_FOUND, _E.CONFLICT, _E.INVALID_MESSAGE, _E.APPROVAL_PENDING),
    False,
    returns=types.RunFinishResult,
    client="finish_run",
)

APPROVAL_REQUEST = Method(
    "approval/request",
    ApprovalRequestParams,
    "`approvalId`.",
    "Asks a human to approve a tool call; clients see `approval/didRequest`.",
    (_E.SESSION_NOT_FOUND, _E.NOT_FOUND, _E.CONFLICT),
    True,
    returns=types.ApprovalRequestResult,
    client="request_approval",
)

APPROVAL_RESOLVE = Method(
    "approval/resolve",
    ApprovalResolveParams,
    "The approval: `approvalId`, `sessionId`, `runId`, `toolCallId`, `toolName`, "
    "`arguments`, `status`, `reason`, `createdAt`, `resolvedAt`.",
    "Approves or denies a pending tool call; clients see `approval/didResolve`. When it "
    "was the session's last pending approval and no run is open, a compaction held back "
    "by the approval runs now if the context is over its limits.",
    (_E.NOT_FOUND, _E.CONFLICT),
    False,
    returns=types.Approval,
    client="resolve_approval",
)

APPROVAL_LIST = Method(
    "approval/list",
    ApprovalListParams,
    "`approvals` (as from `approval/resolve`), oldest first.",
    "Lists the session's approvals.",
    (_E.SESSION_NOT_FOUND,),
    True,
    returns=types.ApprovalListResult,
    client="list_approvals",
    wrap="approvals",
)

TOOLS_LIST = Method(
    "tools/list",
    ToolsListParams,
    '`tools`: OpenAI function-tool schemas (`{type: "function", function: {name, '
    "description, parameters}}`), among them `search_past_messages`.",
    "Tools the agent can offer its model so it can read its own past.",
    (),
    False,
    returns=types.ToolsListResult,
    client="list_tools",
)

TOOLS_CALL = Method(
    "tools/call",
    ToolsCallParams,
    "`content` (text to give the model as the tool result), `data` (the same, "
    "structured: for `search_past_messages`, `hits` and `matched` as from "
    "`archive/search`).",
    "Runs one of the tools of `tools/list` for the session's agent. "
    "`search_past_messages` takes the same query limits as `archive/search`.",
    (_E.SESSION_NOT_FOUND, _E.NOT_FOUND, _E.SEARCH_TOO_BROAD),
    True,
    returns=types.ToolsCallResult,
    client="call_tool",
)


RUN_METHODS: tuple[Method, ...] = (
    RUN_START,
    RUN_FINISH,
    APPROVAL_REQUEST,
    APPROVAL_RESOLVE,
    APPROVAL_LIST,
    TOOLS_LIST,
    TOOLS_CALL,
)
