"""The web page's login: one-time login secrets, the address and the redirect file.

`ctxd ui` mints a login secret from the connection file's `token`: an expiry (unix
seconds, at most `LOGIN_TTL` ahead), a random nonce and an HMAC of both under the token.
The daemon checks the MAC and the expiry and takes each nonce once, so a secret logs in
one page, once, within two minutes; knowing it does not let a program `initialize`.

The secret travels in the address's fragment (`#login=…`), which browsers never send to
a server; the page's script reads it, drops it from the address bar and sends it in its
first WebSocket message, getting a page key of its own in return. The address itself
never goes on a command line: `ctxd ui` writes it into a private redirect file (as a
Jupyter server does) and hands the browser that file's path.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import html
import secrets
import time
from urllib.parse import quote

# how long a login secret may be used after `ctxd ui` minted it
LOGIN_TTL = 120
# clocks of one machine: a little slack for the time between minting and checking
LOGIN_SLACK = 5
LOGIN_MAX = 200  # characters: the longest login secret the daemon reads
PAGE_KEY_MAX = 100
_LOGIN_CONTEXT = b"ctxd web page one-time login v2\0"


def _mac(daemon_token: str, expires: int, nonce: str) -> str:
    msg = _LOGIN_CONTEXT + f"{expires}.{nonce}".encode()
    mac = hmac.new(daemon_token.encode(), msg, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def new_login_secret(daemon_token: str, *, now: float | None = None, ttl: int = LOGIN_TTL) -> str:
    """A fresh one-time login secret, valid `ttl` seconds from `now`."""
    expires = int((time.time() if now is None else now) + ttl)
    nonce = secrets.token_urlsafe(16)
    return f"{expires}.{nonce}.{_mac(daemon_token, expires, nonce)}"


def check_login_secret(daemon_token: str, secret: str, now: float | None = None) -> tuple[str, int]:
    """(nonce, expiry) of a login secret minted under `daemon_token` that has not expired
    and expires no later than `LOGIN_TTL` from now; `ValueError` saying why otherwise.
    Whether the nonce was used already is the caller's to check."""
    parts = secret.split(".")
    if len(parts) != 3 or not parts[0].isdigit() or len(parts[0]) > 12 or not parts[1]:
        raise ValueError("not a login secret")
    expires, nonce, mac = int(parts[0]), parts[1], parts[2]
    if not hmac.compare_digest(mac.encode(), _mac(daemon_token, expires, nonce).encode()):
        raise ValueError("not minted with this daemon's token")
    t = time.time() if now is None else now
    if expires < t:
        raise ValueError("expired")
    if expires > t + LOGIN_TTL + LOGIN_SLACK:
        raise ValueError("valid for longer than a login secret may be")
    return nonce, expires


def page_url(http: str, login_secret: str, session_id: str | None = None) -> str:
    """The address that opens the page (on a session when given) and logs it in once."""
    base = http if http.endswith("/") else http + "/"
    path = f"s/{quote(session_id, safe='')}" if session_id else ""
    return f"{base}{path}#login={login_secret}"


def redirect_page(url: str) -> str:
    """The redirect file's HTML: it sends the browser on to `url` at once (no script),
    with a link for a browser that does not follow the refresh."""
    esc = html.escape(url, quote=True)
    return (
        "<!doctype html>\n<html><head><meta charset=\"utf-8\">\n"
        f'<meta http-equiv="refresh" content="0;url={esc}">\n'
        '<meta name="referrer" content="no-referrer">\n'
        "<title>ctxd</title></head>\n"
        f'<body><p>Opening ctxd\'s web page. If nothing happens, <a href="{esc}">click here</a>.'
        "</p>\n<p>This link logs in once and expires two minutes after <code>ctxd ui</code> "
        "made it.</p></body></html>\n"
    )
