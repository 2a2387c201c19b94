"""What both Python clients share: discovery through the connection file, the errors of
a daemon that is not there or not authentic, and the typed calls the protocol table
names (`_Methods`). See `client.py` for the clients themselves."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from ctxd.protocol.connection import (
    connection_file_for,
    daemon_gone,
    default_data_dir,
    read_connection_file,
)

log = logging.getLogger("ctxd.client")

Wire = Literal["zmq", "jsonrpc", "websocket"]
WIRES: tuple[str, ...] = ("zmq", "jsonrpc", "websocket")
NotificationCallback = Callable[[str, dict[str, Any]], None]

DEFAULT_TIMEOUT = 60.0
DEFAULT_CONNECT_TIMEOUT = 5.0
# A compaction waits for a summarizer (often a model call): give it far longer.
COMPACT_TIMEOUT = 900.0
# How long `subscribe` waits for the ZeroMQ subscription probe (see `_zmq`).
SUBSCRIBE_SETTLE_TIMEOUT = 5.0
CLIENT_NAME = "ctxd-python"

_WIRE_KEYS = {"zmq": "zmq_router", "jsonrpc": "jsonrpc_tcp", "websocket": "websocket"}
_END: Any = object()
R = TypeVar("R")


class DaemonNotRunning(ConnectionError):
    """No daemon answers: no connection file, a dead pid, or nothing at its endpoint."""


# discovery


def find_daemon(
    connection_file: str | os.PathLike[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Locate and read the connection file; raise `DaemonNotRunning` with the reason."""
    if connection_file is not None:
        path = Path(connection_file)
    else:
        path = connection_file_for(Path(data_dir) if data_dir else default_data_dir())
    where = f"data dir {data_dir}" if data_dir and connection_file is None else str(path)
    try:
        info = read_connection_file(path)
    except FileNotFoundError:
        raise DaemonNotRunning(
            f"no ctxd daemon: connection file {path} does not exist; start one with "
            f"'ctxd serve' (for {where}) or pass the right connection_file/data_dir"
        ) from None
    except (OSError, ValueError) as exc:
        raise DaemonNotRunning(f"cannot read the connection file {path}: {exc}") from None
    if daemon_gone(info):
        raise DaemonNotRunning(
            f"the daemon of {path} (pid {info['pid']}) is not running; the file is stale. "
            "Start it again with 'ctxd serve'"
        )
    return path, info


def _check_wire(wire: str) -> None:
    if wire not in WIRES:
        raise ValueError(f"unknown wire {wire!r}; use one of {', '.join(WIRES)}")


def _drop_none(**params: Any) -> dict[str, Any]:
    return {k: v for k, v in params.items() if v is not None}


class DaemonNotAuthentic(ConnectionError):
    """Whatever answered at the connection file's endpoint could not prove it knows the
    token: not the daemon that wrote the file. Nothing but a proof of the token was sent."""


class _Callbacks:
    """The notification callbacks of a client. The list is replaced, never mutated:
    delivery iterates a snapshot without locking."""

    _callbacks: list[NotificationCallback]

    def on_notification(self, callback: NotificationCallback) -> Callable[[], None]:
        """Call `callback(method, params)` for every notification (on `Client`, on its
        I/O thread). May be registered before `open()`; returns a function that removes
        it."""
        self._callbacks = [*self._callbacks, callback]

        def remove() -> None:
            self._callbacks = [cb for cb in self._callbacks if cb is not callback]

        return remove

    def _run_callbacks(self, method: str, params: dict[str, Any]) -> None:
        for callback in self._callbacks:
            try:
                callback(method, params)
            except Exception:
                log.exception("notification callback %r failed on %s", callback, method)


# typed convenience calls, shared by both clients


class _Methods(Generic[R]):
    """Thin wrappers over `call`: R is `Any` for `Client`, `Awaitable[Any]` for `AsyncClient`."""

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
    ) -> R:
        return self.call(
            "session/create",
            _drop_none(
                sessionId=session_id, title=title, metadata=metadata, createdAt=created_at
            ),
        )

    def list_sessions(
        self, limit: int | None = None, cursor: str | None = None, title: str | None = None
    ) -> R:
        return self.call("session/list", _drop_none(limit=limit, cursor=cursor, title=title))

    def get_session(self, session_id: str) -> R:
        return self.call("session/get", {"sessionId": session_id})

    def append(
        self,
        session_id: str,
        messages: list[dict[str, Any]],
        run_id: str | None = None,
        client_batch_id: str | None = None,
        return_context: bool | None = None,
    ) -> R:
        """With `return_context`, the result's `context` is the model context after the
        append (as from `context_get`): one round trip instead of two."""
        return self.call(
            "messages/append",
            _drop_none(
                sessionId=session_id,
                messages=messages,
                runId=run_id,
                clientBatchId=client_batch_id,
                returnContext=return_context,
            ),
        )

    def read(
        self,
        session_id: str,
        after_id: int | None = None,
        limit: int | None = None,
        before_id: int | None = None,
        max_bytes: int | None = None,
    ) -> R:
        return self.call(
            "archive/read",
            _drop_none(
                sessionId=session_id,
                afterId=after_id,
                limit=limit,
                beforeId=before_id,
                maxBytes=max_bytes,
            ),
        )

    def search(
        self,
        query: str,
        session_id: str | None = None,
        role: str | None = None,
        limit: int | None = None,
        offset: int | None = None,
        **extra: Any,
    ) -> R:
        """`extra`: further `archive/search` params by wire name (`newestFirst`, `since`...)."""
        return self.call(
            "archive/search",
            _drop_none(
                query=query, sessionId=session_id, role=role, limit=limit, offset=offset, **extra
            ),
        )

    def context_get(
        self,
        session_id: str,
        format: str | None = None,
        include_metadata: bool | None = None,
        budget_tokens: int | None = None,
        query: str | None = None,
    ) -> R:
        return self.call(
            "context/get",
            _drop_none(
                sessionId=session_id,
                format=format,
                includeMetadata=include_metadata,
                budgetTokens=budget_tokens,
                query=query,
            ),
        )

    def context_clear(self, session_id: str) -> R:
        return self.call("context/clear", {"sessionId": session_id})

    def context_pop(self, session_id: str, count: int | None = None) -> R:
        return self.call("context/pop", _drop_none(sessionId=session_id, count=count))

    def context_status(self, session_id: str) -> R:
        return self.call("context/status", {"sessionId": session_id})

    def compact(
        self,
        session_id: str,
        force: bool | None = None,
        instructions: str | None = None,
        timeout: float = COMPACT_TIMEOUT,
    ) -> R:
        return self.call(
            "context/compact",
            _drop_none(sessionId=session_id, force=force, instructions=instructions),
            timeout=timeout,
        )

    def rebuild(
        self, session_id: str, timeout: float = COMPACT_TIMEOUT, dry_run: bool | None = None
    ) -> R:
        return self.call(
            "context/rebuild", _drop_none(sessionId=session_id, dryRun=dry_run), timeout=timeout
        )

    def explain(self, session_id: str) -> R:
        return self.call("context/explain", {"sessionId": session_id})

    def compactions(self, session_id: str, limit: int | None = None) -> R:
        return self.call("context/compactions", _drop_none(sessionId=session_id, limit=limit))

    def add_pin(self, session_id: str, text: str) -> R:
        return self.call("context/pins/add", {"sessionId": session_id, "text": text})

    def list_pins(self, session_id: str) -> R:
        return self.call("context/pins/list", {"sessionId": session_id})

    def remove_pin(self, session_id: str, pin_id: str) -> R:
        return self.call("context/pins/remove", {"sessionId": session_id, "pinId": pin_id})

    def start_run(self, session_id: str) -> R:
        return self.call("run/start", {"sessionId": session_id})

    def finish_run(
        self,
        run_id: str,
        outcome: str,
        messages: list[dict[str, Any]] | None = None,
        client_batch_id: str | None = None,
        return_context: bool | None = None,
    ) -> R:
        """`messages`: the run's last messages, appended within the run before it finishes
        (the result's `append`); `return_context`: the model context afterwards (the
        result's `context`). All in the same round trip."""
        return self.call(
            "run/finish",
            _drop_none(
                runId=run_id,
                outcome=outcome,
                messages=messages,
                clientBatchId=client_batch_id,
                returnContext=return_context,
            ),
        )

    def request_approval(
        self,
        session_id: str,
        run_id: str,
        tool_call_id: str,
        tool_name: str | None = None,
        arguments: Any = None,
    ) -> R:
        return self.call(
            "approval/request",
            _drop_none(
                sessionId=session_id,
                runId=run_id,
                toolCallId=tool_call_id,
                toolName=tool_name,
                arguments=arguments,
            ),
        )

    def resolve_approval(self, approval_id: str, decision: str, reason: str | None = None) -> R:
        return self.call(
            "approval/resolve",
            _drop_none(approvalId=approval_id, decision=decision, reason=reason),
        )

    def list_approvals(self, session_id: str, status: str | None = None) -> R:
        return self.call("approval/list", _drop_none(sessionId=session_id, status=status))

    def heartbeat(self) -> R:
        """Renew the lease of this client's runs (ZeroMQ); sent by the client on its own."""
        return self.call("heartbeat", {})

    def shutdown(self) -> R:
        """Ask the daemon to stop; it answers first."""
        return self.call("shutdown", {})

    def list_tools(self) -> R:
        return self.call("tools/list", {})

    def call_tool(self, session_id: str, name: str, arguments: dict[str, Any]) -> R:
        return self.call(
            "tools/call", {"sessionId": session_id, "name": name, "arguments": arguments}
        )
