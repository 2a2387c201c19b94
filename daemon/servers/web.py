"""The web page, served on the WebSocket port: plain GETs for the page, the upgrade for JSON-RPC.

The page's files hold no data and no secret: every GET that passes the checks below
gets them. The data comes over the WebSocket, and a browser's connection logs in like
any client, with its first message (`initialize`): the one-time login secret of a
`ctxd ui` link, then the page key the daemon gave for it (see `page_keys.py`), which the
page keeps in `localStorage`, readable by this origin only. No cookie is set or
honoured: browsers send a loopback cookie to every port of the host, so a server on
another loopback port would receive it.

Checks on every request, in this order:

* `Host` must name a loopback host and this port: a DNS-rebinding page (evil.example
  resolving to 127.0.0.1) sends its own name and is refused.
* A browser (it sends `Origin` on every WebSocket and on cross-origin fetches) must come
  from the daemon's own origin; `Sec-Fetch-Site` refuses cross-site subresource reads.

Programs (no `Origin` header) upgrade as before and prove the token with `initialize`.
Nothing here logs a request's query string or a cookie. Pages are sent with a strict
Content-Security-Policy: scripts and styles from this origin only, no inline script,
nothing from elsewhere.
"""

from __future__ import annotations

import email.utils
import logging
import re
from http import HTTPStatus
from importlib import resources

from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

log = logging.getLogger("ctxd.servers.web")

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".txt": "text/plain; charset=utf-8",
}

_MISSING_PAGE = (
    b"<!doctype html><meta charset=utf-8><title>ctxd</title>"
    b"<p>The page's files are missing from this installation of ctxd."
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
# a frame's text as the library prints it (cut in the middle when long): the secrets of
# initialize and its reply
_SECRET_IN_FRAME = re.compile(r'("(?:token|proof|pageLogin|pageKey)"\s*:\s*")[^"\']*')


class _RedactLoginTokens(logging.Filter):
    """`websockets` logs requests, headers and frames at DEBUG: blank out the secrets."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        redacted = _SECRET_IN_FRAME.sub(r"\1<redacted>", text)
        if "token=" in redacted:
            redacted = _TOKEN_IN_TEXT.sub(r"\1<redacted>", redacted)
        if redacted.startswith(("< Cookie:", "> Set-Cookie:", "< cookie:")):
            redacted = redacted.split(":", 1)[0] + ": <redacted>"
        if redacted != text:
            record.msg, record.args = redacted, ()
        return True


_REDACT = _RedactLoginTokens()


def _redact_library_logs() -> None:
    for name in ("websockets", "websockets.server", "websockets.protocol"):
        logger = logging.getLogger(name)
        if _REDACT not in logger.filters:
            logger.addFilter(_REDACT)


def _safe_path(path: str) -> str:
    """The path for a log line: never the query."""
    return path.split("?", 1)[0][:200]


class PageServer:
    """Serves the page and its assets and decides which browsers may upgrade."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.port = port
        names = set(LOOPBACK_NAMES[:2])
        if host in ("::1", "[::1]"):
            names.add("[::1]")
        self.hosts = frozenset(f"{n}:{port}" for n in names)
        self.origins = frozenset(f"http://{h}" for h in self.hosts)
        self.assets = _load_assets()
        _redact_library_logs()
        index = self.assets.get("/static/index.html")
        self.index = index[0] if index else _MISSING_PAGE

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
        """A browser upgrade from the daemon's own origin: it may log in with a page key."""
        browser, origin = self._origin(request)
        return browser and origin in self.origins and self.host_ok(request)

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
            return None  # the page logs in with its first message
        route = path.partition("?")[0]
        if route == "/" or route.startswith("/s/"):
            return self._page(HTTPStatus.OK, self.index, _TYPES[".html"])
        asset = self.assets.get(route)
        if asset is None or route.endswith(".html"):
            return self._page(HTTPStatus.NOT_FOUND, b"not found\n", _TYPES[".txt"])
        return self._page(HTTPStatus.OK, asset[0], asset[1])

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
