"""The LSP errors `ctxd lsp` answers with when the core fails."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams

from ctxd.clients.lsp.core import BadArgument, DaemonGone
from ctxd.protocol.errors import CtxdError

REQUEST_FAILED = -32803  # LSP RequestFailed: the daemon is gone


def lsp_error(exc: Exception) -> JsonRpcException:
    """The LSP error for a failure of the core: typed, with ctxd's code and message."""
    if isinstance(exc, BadArgument):
        return JsonRpcInvalidParams(message=str(exc))
    if isinstance(exc, DaemonGone):
        return JsonRpcException(code=REQUEST_FAILED, message=str(exc))
    if isinstance(exc, CtxdError):
        code = getattr(exc, "code", -32603)
        return JsonRpcException(code=int(code), message=str(exc), data={"ctxdCode": int(code)})
    if isinstance(exc, TimeoutError):
        return JsonRpcException(code=REQUEST_FAILED, message=f"ctxd: {exc}")
    return JsonRpcException(code=-32603, message=f"ctxd: {exc}")


@contextlib.contextmanager
def lsp_errors() -> Iterator[None]:
    """Inside: a failure of the core (a bad argument, the daemon gone, a typed error,
    a timeout) leaves as the LSP error reply for it."""
    try:
        yield
    except (BadArgument, DaemonGone, CtxdError, TimeoutError) as exc:
        raise lsp_error(exc) from None
