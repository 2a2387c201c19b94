"""Protocol table entries. The handshake and the sessions: `initialize` and `session/*`.

Assembled in order with the other groups by `ctxd.protocol.methods`.
"""

from typing import Annotated

from msgspec import Meta

from ctxd.protocol import types
from ctxd.protocol.auth import MAC_HEX_LENGTH, NONCE_MAX, NONCE_MIN
from ctxd.protocol.declare import (
    CURSOR_MAX,
    ID_MAX,
    JSON,
    LIMIT_MAX,
    NAME_MAX,
    TITLE_MAX,
    TOKEN_MAX,
    Method,
    Params,
    SessionId,
)
from ctxd.protocol.errors import ErrorCode
from ctxd.protocol.webpage import LOGIN_MAX, PAGE_KEY_MAX

_E = ErrorCode


class InitializeParams(Params):
    token: (
        Annotated[
            str,
            Meta(
                max_length=TOKEN_MAX,
                description="The token from the connection file. Required unless `proof` is sent.",
            ),
        ]
        | None
    ) = None
    client_name: (
        Annotated[
            str,
            Meta(
                max_length=NAME_MAX,
                description="Shown in the daemon log.",
            ),
        ]
        | None
    ) = None
    nonce: (
        Annotated[
            str,
            Meta(
                min_length=NONCE_MIN,
                max_length=NONCE_MAX,
                description=(
                    "A fresh random string from the client (16 to 128 characters). The daemon "
                    "answers with `nonceMac`, proving it knows the token too."
                ),
            ),
        ]
        | None
    ) = None
    proof: (
        Annotated[
            str,
            Meta(
                max_length=MAC_HEX_LENGTH,
                description=(
                    'Sent instead of `token`: hex HMAC-SHA256 under the token of `"ctxd-client:"` '
                    "followed by `nonce`, so a server that is not the daemon never learns the "
                    "token. Needs `nonce`."
                ),
            ),
        ]
        | None
    ) = None
    page_login: (
        Annotated[
            str,
            Meta(
                max_length=LOGIN_MAX,
                description=(
                    "The web page only (a browser on the daemon's own origin), instead of `token`:"
                    " the one-time login secret of a `ctxd ui` link. Taken once, within 2 minutes."
                ),
            ),
        ]
        | None
    ) = None
    page_key: (
        Annotated[
            str,
            Meta(
                max_length=PAGE_KEY_MAX,
                description=(
                    "The web page only, instead of `token`: the `pageKey` an earlier `initialize` "
                    "of this page returned. Refused 15 minutes after the last connection that used"
                    " it closed, and by a restarted daemon."
                ),
            ),
        ]
        | None
    ) = None


class SessionCreateParams(Params):
    session_id: (
        Annotated[
            str,
            Meta(
                min_length=1,
                max_length=ID_MAX,
                description="Id to give the session; the daemon picks one when absent.",
            ),
        ]
        | None
    ) = None
    title: (
        Annotated[
            str,
            Meta(
                max_length=TITLE_MAX,
                description="Human-readable title.",
            ),
        ]
        | None
    ) = None
    metadata: (
        Annotated[
            dict[str, JSON],
            Meta(
                description="Any JSON object, stored as given.",
            ),
        ]
        | None
    ) = None
    created_at: (
        Annotated[
            float,
            Meta(
                ge=0,
                description=(
                    "When the session began (unix seconds), for a session brought in from "
                    "elsewhere (an imported transcript); now when absent. Not in the future "
                    "(5 minutes of clock skew allowed); sessions list newest first by it."
                ),
            ),
        ]
        | None
    ) = None


class SessionListParams(Params):
    limit: (
        Annotated[
            int,
            Meta(
                ge=1,
                le=LIMIT_MAX,
                description="Most sessions to return.",
            ),
        ]
        | None
    ) = 50
    cursor: (
        Annotated[
            str,
            Meta(
                max_length=CURSOR_MAX,
                description="`nextCursor` of the previous page.",
            ),
        ]
        | None
    ) = None
    title: (
        Annotated[
            str,
            Meta(
                min_length=1,
                max_length=TITLE_MAX,
                description=(
                    "Only sessions whose title contains this text (ASCII letters match in either "
                    "case)."
                ),
            ),
        ]
        | None
    ) = None


class SessionGetParams(Params):
    session_id: SessionId


class SessionSubscribeParams(Params):
    session_id: SessionId


class SessionUnsubscribeParams(Params):
    session_id: SessionId


INITIALIZE = Method(
    "initialize",
    InitializeParams,
    '`serverName` ("ctxd"), `version` (daemon version), `protocolVersion` ("1.0"), '
    "`capabilities` (object naming the optional features this daemon serves; "
    "`runLeaseSeconds`: how long a ZeroMQ client holding a run may stay silent; "
    "`summarizer`: the summarizer in use; `summarizerLastFailure`: `{at, message}` of "
    "its last failure, or null), "
    '`nonceMac` (when `nonce` was sent: hex HMAC-SHA256 under the token of `"ctxd-daemon:"` '
    "followed by `nonce`; a client must check it before sending anything else and close "
    "the connection when it differs), `pageKey` (after `pageLogin` or `pageKey`: the key the "
    "page keeps in its `localStorage` and sends when it connects again).",
    "Proves the token, and with `nonce` has the daemon prove it too (mutual "
    "authentication). On JSON-RPC wires it must be the first request of a connection. "
    "On ZeroMQ it may be sent with `proof` and no token in the envelope, so the client "
    "checks the daemon before sending the token.",
    (_E.UNAUTHORIZED,),
    False,
    returns=types.InitializeResult,
    client="open",
)

SESSION_CREATE = Method(
    "session/create",
    SessionCreateParams,
    "The session: `sessionId`, `title`, `metadata`, `createdAt` (unix seconds).",
    "Creates an empty session.",
    (_E.CONFLICT,),
    False,
    returns=types.Session,
    client="create_session",
)

SESSION_LIST = Method(
    "session/list",
    SessionListParams,
    "`sessions` (each session with its `status`, as in `context/status`, and "
    "`lastActivityAt`: unix seconds of its newest message, or of its creation when it "
    "has none), `nextCursor` (string, or null on the last page).",
    "Lists sessions, newest first, one page at a time.",
    (),
    False,
    returns=types.SessionListResult,
    client="list_sessions",
)

SESSION_GET = Method(
    "session/get",
    SessionGetParams,
    "`session` (as from `session/create`), `status` (as from `context/status`).",
    "Reads one session.",
    (_E.SESSION_NOT_FOUND,),
    True,
    returns=types.SessionGetResult,
    client="get_session",
)

SESSION_SUBSCRIBE = Method(
    "session/subscribe",
    SessionSubscribeParams,
    "`{}`.",
    "Sends this connection the session's notifications (JSON-RPC wires; on ZeroMQ "
    "subscribe a SUB socket to the session's topic instead).",
    (_E.SESSION_NOT_FOUND,),
    True,
    returns=types.Empty,
    client="subscribe",
)

SESSION_UNSUBSCRIBE = Method(
    "session/unsubscribe",
    SessionUnsubscribeParams,
    "`{}`.",
    "Stops the session's notifications on this connection.",
    (_E.SESSION_NOT_FOUND,),
    True,
    returns=types.Empty,
    client="unsubscribe",
)


SESSION_METHODS: tuple[Method, ...] = (
    INITIALIZE,
    SESSION_CREATE,
    SESSION_LIST,
    SESSION_GET,
    SESSION_SUBSCRIBE,
    SESSION_UNSUBSCRIBE,
)
