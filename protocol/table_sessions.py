"""Protocol table entries. The handshake and the sessions: `initialize` and `session/*`.

Assembled in order with the other groups by `ctxd.protocol.methods`.
"""

from __future__ import annotations

from ctxd.protocol.auth import MAC_HEX_LENGTH, NONCE_MAX, NONCE_MIN
from ctxd.protocol.declare import (
    CURSOR_MAX,
    NAME_MAX,
    SESSION_ONLY,
    TITLE_MAX,
    TOKEN_MAX,
    Method,
    Param,
    id_param,
    limit_param,
)
from ctxd.protocol.errors import ErrorCode
from ctxd.protocol.webpage import LOGIN_MAX, PAGE_KEY_MAX

_E = ErrorCode

SESSION_METHODS: tuple[Method, ...] = (
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
            Param(
                "pageLogin",
                "string",
                False,
                "The web page only (a browser on the daemon's own origin), instead of `token`: "
                "the one-time login secret of a `ctxd ui` link. Taken once, within 2 minutes.",
                max=LOGIN_MAX,
            ),
            Param(
                "pageKey",
                "string",
                False,
                "The web page only, instead of `token`: the `pageKey` an earlier `initialize` "
                "of this page returned. Refused 15 minutes after the last connection that "
                "used it closed, and by a restarted daemon.",
                max=PAGE_KEY_MAX,
            ),
        ),
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
        handler="dispatcher.initialize",
        # sent by the clients' open(), with a nonce and a proof of the token
        client="open",
    ),
    Method(
        "session/create",
        (
            id_param(
                "sessionId", "Id to give the session; the daemon picks one when absent.", False
            ),
            Param("title", "string", False, "Human-readable title.", max=TITLE_MAX),
            Param("metadata", "object", False, "Any JSON object, stored as given."),
            Param(
                "createdAt",
                "number",
                False,
                "When the session began (unix seconds), for a session brought in from "
                "elsewhere (an imported transcript); now when absent. Not in the future "
                "(5 minutes of clock skew allowed); sessions list newest first by it.",
                min=0,
            ),
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
            limit_param(50, doc="Most sessions to return."),
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
        SESSION_ONLY,
        "`session` (as from `session/create`), `status` (as from `context/status`).",
        "Reads one session.",
        (_E.SESSION_NOT_FOUND,),
        True,
        handler="engine.get_session",
        client="get_session",
    ),
    Method(
        "session/subscribe",
        SESSION_ONLY,
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
        SESSION_ONLY,
        "`{}`.",
        "Stops the session's notifications on this connection.",
        (_E.SESSION_NOT_FOUND,),
        True,
        handler="dispatcher.unsubscribe",
        client="unsubscribe",
    ),
)
