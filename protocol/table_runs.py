"""Protocol table entries. Runs, approvals and tools: `run/*`, `approval/*`, `tools/*`.

Assembled in order with the other groups by `ctxd.protocol.methods`.
"""

from __future__ import annotations

from ctxd.protocol.declare import (
    APPEND_MAX_MESSAGES,
    NAME_MAX,
    REASON_MAX,
    SESSION_ONLY,
    Method,
    Param,
    id_param,
    session_param,
)
from ctxd.protocol.errors import ErrorCode

_E = ErrorCode

RUN_METHODS: tuple[Method, ...] = (
    Method(
        "run/start",
        SESSION_ONLY,
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
            id_param("runId", "Id of the run."),
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
            id_param(
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
            session_param(),
            id_param("runId", "The run the tool call belongs to."),
            id_param("toolCallId", "`id` of the tool call in the assistant message."),
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
            id_param("approvalId", "Id of the approval."),
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
            session_param(),
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
            session_param(),
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
)
