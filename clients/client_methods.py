"""The Python clients' typed calls, one per method of the protocol table.

Generated from protocol/table_*.py by `python -m ctxd.clients.gen_methods`; edit the
table (or that generator), not this file."""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

from ctxd.clients.client_common import COMPACT_TIMEOUT
from ctxd.protocol.methods import (
    APPROVAL_LIST,
    APPROVAL_REQUEST,
    APPROVAL_RESOLVE,
    ARCHIVE_READ,
    ARCHIVE_SEARCH,
    CONTEXT_CLEAR,
    CONTEXT_COMPACT,
    CONTEXT_COMPACTIONS,
    CONTEXT_EXPLAIN,
    CONTEXT_GET,
    CONTEXT_PINS_ADD,
    CONTEXT_PINS_LIST,
    CONTEXT_PINS_REMOVE,
    CONTEXT_POP,
    CONTEXT_REBUILD,
    CONTEXT_STATUS,
    HEARTBEAT,
    MESSAGES_APPEND,
    RUN_FINISH,
    RUN_START,
    SESSION_CREATE,
    SESSION_GET,
    SESSION_LIST,
    SESSION_SUBSCRIBE,
    SESSION_UNSUBSCRIBE,
    SHUTDOWN,
    TOOLS_CALL,
    TOOLS_LIST,
)

R = TypeVar("R")


def _drop_none(**params: Any) -> dict[str, Any]:
    # an absent param and one sent as null mean the same: send neither
    return {k: v for k, v in params.items() if v is not None}


class _Methods(Generic[R]):
    """Calls over `call`: R is `Any` for `Client`, `Awaitable[Any]` for `AsyncClient`."""

    def call(
        self, method: str, params: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> R:
        raise NotImplementedError

    def create_session(
        self,
        session_id: str | None = None,
        title: str | None = None,
        metadata: dict[str, Any] | None = None,
        created_at: float | None = None,
        *,
        timeout: float | None = None,
    ) -> R:
        """Creates an empty session."""
        return self.call(
            SESSION_CREATE.name,
            _drop_none(
                sessionId=session_id,
                title=title,
                metadata=metadata,
                createdAt=created_at,
            ),
            timeout=timeout,
        )

    def list_sessions(
        self,
        limit: int | None = None,
        cursor: str | None = None,
        title: str | None = None,
        *,
        timeout: float | None = None,
    ) -> R:
        """Lists sessions, newest first, one page at a time."""
        return self.call(
            SESSION_LIST.name,
            _drop_none(
                limit=limit,
                cursor=cursor,
                title=title,
            ),
            timeout=timeout,
        )

    def get_session(
        self,
        session_id: str,
        *,
        timeout: float | None = None,
    ) -> R:
        """Reads one session."""
        return self.call(
            SESSION_GET.name,
            _drop_none(
                sessionId=session_id,
            ),
            timeout=timeout,
        )

    def subscribe(
        self,
        session_id: str,
        *,
        timeout: float | None = None,
    ) -> R:
        """Sends this connection the session's notifications (JSON-RPC wires; on ZeroMQ subscribe a
        SUB socket to the session's topic instead)."""
        return self.call(
            SESSION_SUBSCRIBE.name,
            _drop_none(
                sessionId=session_id,
            ),
            timeout=timeout,
        )

    def unsubscribe(
        self,
        session_id: str,
        *,
        timeout: float | None = None,
    ) -> R:
        """Stops the session's notifications on this connection."""
        return self.call(
            SESSION_UNSUBSCRIBE.name,
            _drop_none(
                sessionId=session_id,
            ),
            timeout=timeout,
        )

    def append(
        self,
        session_id: str,
        messages: list[dict[str, Any]],
        run_id: str | None = None,
        client_batch_id: str | None = None,
        return_context: bool | None = None,
        *,
        timeout: float | None = None,
    ) -> R:
        """Appends one batch to the archive and the active context. The batch is stored whole or
        not at all. May schedule an automatic compaction. Limits (daemon config): each message
        at most `max_message_bytes` of JSON (8 MiB by default), at most `max_batch_messages`
        messages (10,000), and the whole request at most `max_request_bytes` (64 MiB); above
        them `PAYLOAD_TOO_LARGE` and nothing is stored."""
        return self.call(
            MESSAGES_APPEND.name,
            _drop_none(
                sessionId=session_id,
                messages=messages,
                runId=run_id,
                clientBatchId=client_batch_id,
                returnContext=return_context,
            ),
            timeout=timeout,
        )

    def read(
        self,
        session_id: str,
        after_id: int | None = None,
        limit: int | None = None,
        before_id: int | None = None,
        max_bytes: int | None = None,
        *,
        timeout: float | None = None,
    ) -> R:
        """Reads the full archived history in order, whether or not it is still in context, one
        page at a time: at most `limit` messages and `maxBytes` bytes (default 8 MiB). A message
        is at most the daemon's `max_message_bytes` (8 MiB of JSON by default)."""
        return self.call(
            ARCHIVE_READ.name,
            _drop_none(
                sessionId=session_id,
                afterId=after_id,
                limit=limit,
                beforeId=before_id,
                maxBytes=max_bytes,
            ),
            timeout=timeout,
        )

    def search(
        self,
        query: str,
        session_id: str | None = None,
        role: Literal["system", "user", "assistant", "tool"] | None = None,
        limit: int | None = None,
        offset: int | None = None,
        advanced: bool | None = None,
        newest_first: bool | None = None,
        since: float | None = None,
        until: float | None = None,
        *,
        timeout: float | None = None,
        **extra: Any,
    ) -> R:
        """Full-text search of the archive, across all sessions unless `sessionId` is given. Plain
        words must all appear in a message (in any order; a quoted chunk is one word); when no
        message has them all, the search falls back to messages with any of them and says so
        with `matched: "any"`. A search that runs longer than the daemon's budget is stopped
        with `SEARCH_TOO_BROAD`; other requests are served while a search runs."""
        return self.call(
            ARCHIVE_SEARCH.name,
            _drop_none(
                query=query,
                sessionId=session_id,
                role=role,
                limit=limit,
                offset=offset,
                advanced=advanced,
                newestFirst=newest_first,
                since=since,
                until=until,
            )
            | _drop_none(**extra),
            timeout=timeout,
        )

    def context_get(
        self,
        session_id: str,
        format: Literal["openai"] | None = None,
        include_metadata: bool | None = None,
        budget_tokens: int | None = None,
        query: str | None = None,
        *,
        timeout: float | None = None,
    ) -> R:
        """The model context: what to send as the next request's messages. A projection never
        changes the stored context."""
        return self.call(
            CONTEXT_GET.name,
            _drop_none(
                sessionId=session_id,
                format=format,
                budgetTokens=budget_tokens,
                query=query,
                includeMetadata=include_metadata,
            ),
            timeout=timeout,
        )

    def context_status(
        self,
        session_id: str,
        *,
        timeout: float | None = None,
    ) -> R:
        """Counters of the session's context and archive."""
        return self.call(
            CONTEXT_STATUS.name,
            _drop_none(
                sessionId=session_id,
            ),
            timeout=timeout,
        )

    def compact(
        self,
        session_id: str,
        force: bool | None = None,
        instructions: str | None = None,
        timeout: float = COMPACT_TIMEOUT,
    ) -> R:
        """Moves the oldest messages out of the active context into the summary. The archive keeps
        them. Reports progress with `$/progress`. When another compaction of the session is
        running (an automatic one), waits for it first (progress message "waiting for the
        compaction already running"), then runs."""
        return self.call(
            CONTEXT_COMPACT.name,
            _drop_none(
                sessionId=session_id,
                force=force,
                instructions=instructions,
            ),
            timeout=timeout,
        )

    def rebuild(
        self,
        session_id: str,
        timeout: float = COMPACT_TIMEOUT,
        dry_run: bool | None = None,
    ) -> R:
        """Rebuilds the summary from the archive from scratch with the current strategy, keeping
        pins; committed even when it does not shrink the context. Reports progress with
        `$/progress`."""
        return self.call(
            CONTEXT_REBUILD.name,
            _drop_none(
                sessionId=session_id,
                dryRun=dry_run,
            ),
            timeout=timeout,
        )

    def context_clear(
        self,
        session_id: str,
        *,
        timeout: float | None = None,
    ) -> R:
        """Starts a fresh active context: no system messages, summary or tail; pins stay. The
        archive keeps every message and search still finds them; messages appended from now on
        make up the new context."""
        return self.call(
            CONTEXT_CLEAR.name,
            _drop_none(
                sessionId=session_id,
            ),
            timeout=timeout,
        )

    def context_pop(
        self,
        session_id: str,
        count: int | None = None,
        *,
        timeout: float | None = None,
    ) -> R:
        """Takes the newest messages of the tail out of the active context (the archive keeps
        them). The cut is widened so that a tool result never stays without its call: popping a
        result also pops the assistant message that made the call and all after."""
        return self.call(
            CONTEXT_POP.name,
            _drop_none(
                sessionId=session_id,
                count=count,
            ),
            timeout=timeout,
        )

    def explain(
        self,
        session_id: str,
        *,
        timeout: float | None = None,
    ) -> R:
        """Shows where every line of the summary came from."""
        return self.call(
            CONTEXT_EXPLAIN.name,
            _drop_none(
                sessionId=session_id,
            ),
            timeout=timeout,
        )

    def compactions(
        self,
        session_id: str,
        limit: int | None = None,
        *,
        timeout: float | None = None,
    ) -> R:
        """The session's compaction attempts, effective or not: what each one saved."""
        return self.call(
            CONTEXT_COMPACTIONS.name,
            _drop_none(
                sessionId=session_id,
                limit=limit,
            ),
            timeout=timeout,
        )

    def add_pin(
        self,
        session_id: str,
        text: str,
        *,
        timeout: float | None = None,
    ) -> R:
        """Pins a text to the context; a text the session has pinned already returns that pin,
        unchanged."""
        return self.call(
            CONTEXT_PINS_ADD.name,
            _drop_none(
                sessionId=session_id,
                text=text,
            ),
            timeout=timeout,
        )

    def list_pins(
        self,
        session_id: str,
        *,
        timeout: float | None = None,
    ) -> R:
        """Lists the session's pins."""
        return self.call(
            CONTEXT_PINS_LIST.name,
            _drop_none(
                sessionId=session_id,
            ),
            timeout=timeout,
        )

    def remove_pin(
        self,
        session_id: str,
        pin_id: str,
        *,
        timeout: float | None = None,
    ) -> R:
        """Unpins a text."""
        return self.call(
            CONTEXT_PINS_REMOVE.name,
            _drop_none(
                sessionId=session_id,
                pinId=pin_id,
            ),
            timeout=timeout,
        )

    def start_run(
        self,
        session_id: str,
        *,
        timeout: float | None = None,
    ) -> R:
        """Starts a run (one agent turn). A session has at most one run at a time; a run left open
        by a connection that closes is marked interrupted."""
        return self.call(
            RUN_START.name,
            _drop_none(
                sessionId=session_id,
            ),
            timeout=timeout,
        )

    def finish_run(
        self,
        run_id: str,
        outcome: Literal["completed", "failed", "cancelled"],
        messages: list[dict[str, Any]] | None = None,
        client_batch_id: str | None = None,
        return_context: bool | None = None,
        *,
        timeout: float | None = None,
    ) -> R:
        """Finishes a run. The daemon may then compact the context in the background. With
        `messages`, appends them first: when the append is refused, the run stays open."""
        return self.call(
            RUN_FINISH.name,
            _drop_none(
                runId=run_id,
                outcome=outcome,
                messages=messages,
                clientBatchId=client_batch_id,
                returnContext=return_context,
            ),
            timeout=timeout,
        )

    def request_approval(
        self,
        session_id: str,
        run_id: str,
        tool_call_id: str,
        tool_name: str | None = None,
        arguments: Any | None = None,
        *,
        timeout: float | None = None,
    ) -> R:
        """Asks a human to approve a tool call; clients see `approval/didRequest`."""
        return self.call(
            APPROVAL_REQUEST.name,
            _drop_none(
                sessionId=session_id,
                runId=run_id,
                toolCallId=tool_call_id,
                toolName=tool_name,
                arguments=arguments,
            ),
            timeout=timeout,
        )

    def resolve_approval(
        self,
        approval_id: str,
        decision: Literal["approved", "denied"],
        reason: str | None = None,
        *,
        timeout: float | None = None,
    ) -> R:
        """Approves or denies a pending tool call; clients see `approval/didResolve`. When it was
        the session's last pending approval and no run is open, a compaction held back by the
        approval runs now if the context is over its limits."""
        return self.call(
            APPROVAL_RESOLVE.name,
            _drop_none(
                approvalId=approval_id,
                decision=decision,
                reason=reason,
            ),
            timeout=timeout,
        )

    def list_approvals(
        self,
        session_id: str,
        status: Literal["pending", "approved", "denied"] | None = None,
        *,
        timeout: float | None = None,
    ) -> R:
        """Lists the session's approvals."""
        return self.call(
            APPROVAL_LIST.name,
            _drop_none(
                sessionId=session_id,
                status=status,
            ),
            timeout=timeout,
        )

    def list_tools(
        self,
        *,
        timeout: float | None = None,
    ) -> R:
        """Tools the agent can offer its model so it can read its own past."""
        return self.call(
            TOOLS_LIST.name,
            {},
            timeout=timeout,
        )

    def call_tool(
        self,
        session_id: str,
        name: str,
        arguments: dict[str, Any],
        *,
        timeout: float | None = None,
    ) -> R:
        """Runs one of the tools of `tools/list` for the session's agent. `search_past_messages`
        takes the same query limits as `archive/search`."""
        return self.call(
            TOOLS_CALL.name,
            _drop_none(
                sessionId=session_id,
                name=name,
                arguments=arguments,
            ),
            timeout=timeout,
        )

    def heartbeat(
        self,
        *,
        timeout: float | None = None,
    ) -> R:
        """Tells the daemon the client is alive. ZeroMQ has no disconnect signal: a ZeroMQ client
        holding an open run must send a request (any, or this one) at least every
        `leaseSeconds`, or its runs are marked interrupted."""
        return self.call(
            HEARTBEAT.name,
            {},
            timeout=timeout,
        )

    def shutdown(
        self,
        *,
        timeout: float | None = None,
    ) -> R:
        """Asks the daemon to stop: it answers, finishes writing, removes its connection file and
        exits."""
        return self.call(
            SHUTDOWN.name,
            {},
            timeout=timeout,
        )
