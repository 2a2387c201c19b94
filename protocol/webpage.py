"""The web page's login: the token its URL carries, derived from the daemon's secret.

`ctxd ui` and the daemon compute the same login token from the connection file's
`token`, so nothing new is stored. It is a different string from the JSON-RPC token
(knowing it does not let a program `initialize`), and the page trades it for a cookie
of its own on first load, so it leaves the address bar (as a Jupyter server's does).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from urllib.parse import quote

_LOGIN_CONTEXT = b"ctxd web page login v1"


def login_token(daemon_token: str) -> str:
    """The token a page URL carries: an HMAC of a fixed label under the daemon's token."""
    mac = hmac.new(daemon_token.encode(), _LOGIN_CONTEXT, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def page_url(http: str, daemon_token: str, session_id: str | None = None) -> str:
    """The URL that opens the page (on a session when given) and logs the browser in."""
    base = http if http.endswith("/") else http + "/"
    path = f"s/{quote(session_id, safe='')}" if session_id else ""
    return f"{base}{path}?token={login_token(daemon_token)}"
