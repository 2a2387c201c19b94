"""Error codes of the ctxd protocol and the typed exceptions that carry them.

The engine raises these; both wires turn them into `{code, message, data}`.
Every message says what the caller can do about it.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any


class ErrorCode(IntEnum):
    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    UNAUTHORIZED = -32001
    SESSION_NOT_FOUND = -32010
    APPROVAL_PENDING = -32011
    RUN_ACTIVE = -32012
    COMPACTION_IN_PROGRESS = -32013
    INVALID_MESSAGE = -32014
    PAYLOAD_TOO_LARGE = -32015
    SUMMARIZER_FAILED = -32016
    NOT_FOUND = -32017
    CONFLICT = -32018
    STORAGE_ERROR = -32019
    SEARCH_TOO_BROAD = -32020


class CtxdError(Exception):
    """Base of every error that crosses the wire with a code."""

    code: ErrorCode = ErrorCode.INTERNAL_ERROR

    def __init__(self, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.data = data or {}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": int(self.code), "message": self.message}
        if self.data:
            out["data"] = self.data
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({int(self.code)}, {self.message!r})"


class ParseError(CtxdError):
    code = ErrorCode.PARSE_ERROR


class InvalidRequest(CtxdError):
    code = ErrorCode.INVALID_REQUEST


class MethodNotFound(CtxdError):
    code = ErrorCode.METHOD_NOT_FOUND


class InvalidParams(CtxdError):
    code = ErrorCode.INVALID_PARAMS


class InternalError(CtxdError):
    code = ErrorCode.INTERNAL_ERROR


class Unauthorized(CtxdError):
    code = ErrorCode.UNAUTHORIZED


class SessionNotFound(CtxdError):
    code = ErrorCode.SESSION_NOT_FOUND


class ApprovalPending(CtxdError):
    code = ErrorCode.APPROVAL_PENDING


class RunActive(CtxdError):
    code = ErrorCode.RUN_ACTIVE


class CompactionInProgress(CtxdError):
    code = ErrorCode.COMPACTION_IN_PROGRESS


class InvalidMessage(CtxdError):
    code = ErrorCode.INVALID_MESSAGE


class PayloadTooLarge(CtxdError):
    code = ErrorCode.PAYLOAD_TOO_LARGE


class SummarizerFailed(CtxdError):
    code = ErrorCode.SUMMARIZER_FAILED


class NotFound(CtxdError):
    code = ErrorCode.NOT_FOUND


class Conflict(CtxdError):
    code = ErrorCode.CONFLICT


class StorageError(CtxdError):
    """The database cannot be written (disk full, read-only, I/O error); nothing was."""

    code = ErrorCode.STORAGE_ERROR


class StorageTimeout(StorageError):
    """A wait on the database passed its bound (a lock held by another connection past
    `lock_timeout`, a statement past `statement_timeout`); nothing was written. On the
    wire it is a STORAGE_ERROR whose data names the reason and the bound."""


class SessionBusy(StorageError):
    """Another connection holds the session's write lock at this moment. Raised at once,
    never waited for on the event loop: the daemon waits for the lock beside the loop
    and runs the request again (daemon/busy.py); only a caller that does not wait sees
    it."""

    def __init__(self, session_id: str) -> None:
        super().__init__(
            f"session {session_id!r} is being written by another connection; nothing was "
            "written: send the request again",
            {"reason": "SessionBusy", "sessionId": session_id},
        )
        self.session_id = session_id


class SearchTooBroad(CtxdError):
    """A search ran out of its time budget and was stopped; nothing else was affected."""

    code = ErrorCode.SEARCH_TOO_BROAD


_BY_CODE: dict[int, type[CtxdError]] = {cls.code: cls for cls in CtxdError.__subclasses__()}


def error_from_dict(err: dict[str, Any]) -> CtxdError:
    """Rebuild the typed exception a client should raise for a wire error object."""
    code = int(err.get("code", ErrorCode.INTERNAL_ERROR))
    cls = _BY_CODE.get(code, CtxdError)
    exc = cls(str(err.get("message", "")), err.get("data") or None)
    if cls is CtxdError:
        exc.code = code  # type: ignore[assignment]
    return exc
