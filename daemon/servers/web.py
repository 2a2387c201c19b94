"""The web page, served on the WebSocket port: plain GETs for the page, the upgrade for JSON-RPC.

Access works like a Jupyter server's. `ctxd ui` opens `http://127.0.0.1:PORT/?token=LOGIN`
(`LOGIN` is derived from the daemon's secret, see `ctxd.protocol.webpage`). The first
request with a right login token gets a cookie of the page's own (HttpOnly,
SameSite=Strict, named after the port because browsers share cookies between the ports
of a host) and a redirect to the same address without the token, so the token leaves
the address bar and never reaches a script. Without that cookie every request gets a
401 page that shows nothing, and a browser's WebSocket upgrade is refused.

Checks on every request, in this order:

* `Host` must name a loopback host and this port: a DNS-rebinding page (evil.example
  resolving to 127.0.0.1) sends its own name and is refused.
* A browser (it sends `Origin` on every WebSocket and on cross-origin fetches) must come
  from the daemon's own origin; `Sec-Fetch-Site` refuses cross-site subresource reads.
* The page's cookie must be valid; it is an HMAC under the daemon's secret, so a
  restarted daemon (new secret) asks the browser to log in again.

Programs (no `Origin` header) upgrade as before and prove the token with `initialize`.
A browser connection with the cookie is authenticated at the upgrade: the page never
learns the daemon's token. Nothing here logs a request's query string, where the login
token travels. Pages are sent with a strict Content-Security-Policy: scripts and styles
from this origin only, no inline script, nothing from elsewhere.
"""

from __future__ import annotations

import email.utils
import hashlib
import hmac
import logging
import re
import secrets
from http import HTTPStatus
from importlib import resources
from urllib.parse import parse_qs

from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from ctxd.protocol.webpage import login_token

log = logging.getLogger("ctxd.servers.web")

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".txt": "text/plain; charset=utf-8",
}

_LOGIN_PAGE = (
    b"<!doctype html><meta charset=utf-8><title>ctxd</title>"
    b"<p>This page needs a login link. Run <code>ctxd ui</code> to open one."
)


def _load_assets() -> dict[str, tuple[bytes, str]]:
    """The shipped files of daemon/web (package data), by URL path."""
    out: dict[str, tuple[bytes, str]] = {}
    root = resources.files("ctxd.daemon").joinpath("web")
    for entry in root.iterdir():
        name = entry.name
        ext = name[name.rfind(".") :] if "." in name else ""
        if entry.is_file() and ext in _TYPES:
            out[f"/static/{name}"] = (entry.read_bytes(), _TYPES[ext])
    return out


_TOKEN_IN_TEXT = re.compile(r"([?&]token=)[^&\s\"']*")


class _RedactLoginTokens(logging.Filter):
    """`websockets` logs requests and headers at DEBUG: blank out login tokens and cookies."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "token=" in text:
            text = _TOKEN_IN_TEXT.sub(r"\1<redacted>", text)
            record.msg, record.args = text, ()
        if text.startswith(("< Cookie:", "> Set-Cookie:", "< cookie:")):
            record.msg, record.args = text.split(":", 1)[0] + ": <redacted>", ()
        return True


_REDACT = _RedactLoginTokens()


def _redact_library_logs() -> None:
    for name in ("websockets", "websockets.server", "websockets.protocol"):
        logger = logging.getLogger(name)
        if _REDACT not in logger.filters:
            logger.addFilter(_REDACT)


def _safe_path(path: str) -> str:
    """The path for a log line: never the query, where the login token is."""
    return path.split("?", 1)[0][:200]


class PageServer:
    """Serves the page and its assets and decides which browsers may upgrade."""

    def __init__(self, daemon_token: str, port: int, host: str = "127.0.0.1") -> None:
        self.port = port
        self._secret = daemon_token.encode()
        self._login = login_token(daemon_token)
        self.cookie_name = f"ctxd_page_{port}"
        names = set(LOOPBACK_NAMES[:2])
        if host in ("::1", "[::1]"):
            names.add("[::1]")
        self.hosts = frozenset(f"{n}:{port}" for n in names)
        self.origins = frozenset(f"http://{h}" for h in self.hosts)
        self.assets = _load_assets()
        _redact_library_logs()
        index = self.assets.get("/static/index.html")
        self.index = index[0] if index else _LOGIN_PAGE

    # the cookie: nonce.mac, checked without server state

    def _mac(self, nonce: str) -> str:
        return hmac.new(self._secret, b"page cookie " + nonce.encode(), hashlib.sha256).hexdigest()

    def new_cookie(self) -> str:
        nonce = secrets.token_urlsafe(16)
        return f"{nonce}.{self._mac(nonce)}"

    def cookie_ok(self, request: Request) -> bool:
        for header in request.headers.get_all("Cookie"):
            for part in header.split(";"):
                name, _, value = part.strip().partition("=")
                if name == self.cookie_name:
                    nonce, _, mac = value.partition(".")
                    if nonce and hmac.compare_digest(mac.encode(), self._mac(nonce).encode()):
                        return True
        return False

    # checks

    def host_ok(self, request: Request) -> bool:
        hosts = request.headers.get_all("Host")
        return len(hosts) == 1 and hosts[0].lower() in self.hosts

    def _origin(self, request: Request) -> tuple[bool, str | None]:
        """(is a browser, its origin when exactly one was sent)."""
        origins = request.headers.get_all("Origin")
        if not origins:
            return False, None
        return True, origins[0] if len(origins) == 1 else None

    def is_page(self, request: Request) -> bool:
        """A browser upgrade that passed `process_request`: authenticated by its cookie."""
        browser, origin = self._origin(request)
        return browser and origin in self.origins and self.host_ok(request) and (
            self.cookie_ok(request)
        )

    # the hook called by the WebSocket server for every request

    def process_request(self, ws: ServerConnection, request: Request) -> Response | None:
        """A response for plain GETs and refused browsers; None lets the upgrade go on."""
        headers = request.headers
        upgrade = "websocket" in headers.get("Upgrade", "").lower()
        browser, origin = self._origin(request)
        if upgrade and not browser:
            return None  # a program: it proves the token with initialize
        path = request.path
        if not self.host_ok(request):
            return self._refuse(ws, request, HTTPStatus.FORBIDDEN, "Host not allowed")
        if browser and origin not in self.origins:
            return self._refuse(ws, request, HTTPStatus.FORBIDDEN, "Origin not allowed")
        site = headers.get("Sec-Fetch-Site")
        if site not in (None, "same-origin", "none") and headers.get("Sec-Fetch-Mode") != (
            "navigate"
        ):
            return self._refuse(ws, request, HTTPStatus.FORBIDDEN, "cross-site request")
        if upgrade:
            if self.cookie_ok(request):
                return None
            return self._refuse(ws, request, HTTPStatus.FORBIDDEN, "log in with ctxd ui first")
        route, _, query = path.partition("?")
        if query:
            tokens = parse_qs(query).get("token")
            if tokens is not None:
                return self._login_response(ws, request, route, tokens[0])
        if not self.cookie_ok(request):
            return self._page(HTTPStatus.UNAUTHORIZED, _LOGIN_PAGE, _TYPES[".html"])
        if route == "/auth":  # the page asks whether its cookie still works
            return self._page(HTTPStatus.NO_CONTENT, b"", _TYPES[".txt"])
        if route == "/" or route.startswith("/s/"):
            return self._page(HTTPStatus.OK, self.index, _TYPES[".html"])
        asset = self.assets.get(route)
        if asset is None or route.endswith(".html"):
            return self._page(HTTPStatus.NOT_FOUND, b"not found\n", _TYPES[".txt"])
        return self._page(HTTPStatus.OK, asset[0], asset[1])

    def _login_response(
        self, ws: ServerConnection, request: Request, route: str, token: str
    ) -> Response:
        if not hmac.compare_digest(token.encode(), self._login.encode()):
            log.warning("page login from %s with a wrong token refused", ws.remote_address)
            return self._page(HTTPStatus.UNAUTHORIZED, _LOGIN_PAGE, _TYPES[".html"])
        if not (route == "/" or route.startswith("/s/")):
            route = "/"
        resp = self._page(HTTPStatus.SEE_OTHER, b"", _TYPES[".txt"])
        resp.headers["Location"] = route
        resp.headers["Set-Cookie"] = (
            f"{self.cookie_name}={self.new_cookie()}; Path=/; HttpOnly; SameSite=Strict"
        )
        log.info("page login from %s", ws.remote_address)
        return resp

    def _refuse(
        self, ws: ServerConnection, request: Request, status: HTTPStatus, why: str
    ) -> Response:
        log.warning(
            "refusing %s %s from %s: %s",
            "WebSocket" if "Upgrade" in request.headers else "GET",
            _safe_path(request.path),
            ws.remote_address,
            why,
        )
        return self._page(status, (why + "\n").encode(), _TYPES[".txt"])

    def _page(self, status: HTTPStatus, body: bytes, ctype: str) -> Response:
        ws_origins = " ".join(f"ws://{h}" for h in sorted(self.hosts))
        headers = Headers(
            [
                ("Date", email.utils.formatdate(usegmt=True)),
                ("Connection", "close"),
                ("Content-Type", ctype),
                ("Content-Length", str(len(body))),
                ("Cache-Control", "no-store"),
                ("X-Content-Type-Options", "nosniff"),
                ("X-Frame-Options", "DENY"),
                ("Referrer-Policy", "no-referrer"),
                ("Cross-Origin-Opener-Policy", "same-origin"),
                ("Cross-Origin-Resource-Policy", "same-origin"),
                (
                    "Content-Security-Policy",
                    "default-src 'none'; script-src 'self'; style-src 'self'; "
                    f"img-src 'self' data:; connect-src 'self' {ws_origins}; "
                    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
                ),
            ]
        )
        return Response(status.value, status.phrase, headers, body)
