"""The `ctxd mcp` command: options, transports (stdio, or streamable HTTP on loopback
with a bearer token and Host/Origin checks) around the server of `mcp_server`.

Kept apart from `mcp_server` so that building the `ctxd` parser loads neither the MCP SDK
nor pydantic: they load when `ctxd mcp` runs.
"""

from __future__ import annotations

import hmac
import io
import json
import os
import secrets
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ctxd.clients.client import Client
from ctxd.clients.mcp_daemon import DaemonLink, SessionChoice
from ctxd.protocol.connection import read_connection_file

LOOPBACK = ("127.0.0.1", "::1", "localhost")


# streamable HTTP


def bearer_guard(app: Any, token: str) -> Any:
    """ASGI wrapper: every HTTP request must carry `Authorization: Bearer <token>`."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            got = dict(scope.get("headers") or ()).get(b"authorization", b"")
            if not hmac.compare_digest(got, expected):
                body = b'{"error": "unauthorized: send Authorization: Bearer <token>"}'
                await send({"type": "http.response.start", "status": 401, "headers": [
                    (b"content-type", b"application/json"),
                    (b"www-authenticate", b'Bearer realm="ctxd"'),
                    (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    return guarded


def serve_http(server: Any, host: str, port: int, token: str,
               announce: Callable[[str], None], limits: Any = None) -> None:
    """`limits`: the parsed options with `max_connections`, `max_sessions` and
    `session_idle_seconds` (see mcp_limits), defaults when None."""
    import anyio
    import uvicorn
    from mcp.server.transport_security import TransportSecuritySettings

    from ctxd.clients import mcp_limits as lim

    if host not in LOOPBACK:
        raise ValueError(f"--host {host}: ctxd mcp serves HTTP on loopback only "
                         f"({', '.join(LOOPBACK)})")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    bind = "127.0.0.1" if host == "localhost" else host
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((bind, port))
    sock.listen(128)
    port = sock.getsockname()[1]
    hosts = [f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"]
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts,
        allowed_origins=[f"http://{h}" for h in hosts])
    max_conns = getattr(limits, "max_connections", None) or lim.DEFAULT_MAX_CONNECTIONS
    max_sessions = getattr(limits, "max_sessions", None) or lim.DEFAULT_MAX_SESSIONS
    idle = getattr(limits, "session_idle_seconds", None) or lim.DEFAULT_SESSION_IDLE_SECONDS
    cap = lim.connection_cap(max_conns, lim.raise_descriptor_limit())
    # the SDK refuses sessions past its own cap; ours (SessionCap) closes the least
    # recently used first, so the SDK's is only a backstop
    app = server.streamable_http_app(transport_security=security, host=bind,
                                     session_idle_timeout=idle, max_sessions=max_sessions + 8)
    app = lim.SessionCap(app, server.session_manager, max_sessions)
    url = f"http://{'[::1]' if family == socket.AF_INET6 else bind}:{port}/mcp"
    announce(url)
    config = uvicorn.Config(
        bearer_guard(app, token), log_level="warning", lifespan="on",
        http=lim.bounded_protocol(cap), timeout_keep_alive=lim.KEEP_ALIVE_SECONDS,
        h11_max_incomplete_event_size=lim.MAX_HEADER_BYTES,
        backlog=lim.ACCEPT_BATCH)
    anyio.run(lambda: lim.BoundedServer(config).serve(sockets=[sock]))


def serve_stdio(server: Any, max_line: int) -> None:
    """The server over stdin/stdout, one JSON-RPC message per line of at most
    `max_line` bytes (a longer line is refused with an error and skipped)."""
    import anyio
    from mcp.server.stdio import stdio_server

    from ctxd.clients.mcp_limits import bounded_stdio_lines

    async def main() -> None:
        out = anyio.wrap_file(io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8"))

        async def write_error(text: str) -> None:
            await out.write(text + "\n")
            await out.flush()

        lines = bounded_stdio_lines(sys.stdin.buffer, write_error, max_line)
        async with stdio_server(stdin=lines, stdout=out) as (read, write):  # type: ignore[arg-type]
            low = server._lowlevel_server
            await low.run(read, write, low.create_initialization_options())

    anyio.run(main)


def run(args: Any, connect: Callable[[], Client], connection_file: Path) -> int:
    try:
        from ctxd.clients.mcp_server import SERVER
    except ImportError:
        print("ctxd: the MCP server needs the mcp extra: pip install 'ctxd[mcp]'",
              file=sys.stderr)
        return 2
    for name in ("max_connections", "max_sessions", "session_idle_seconds", "max_line_bytes"):
        value = getattr(args, name, None)
        if value is not None and not value > 0:
            print(f"ctxd: --{name.replace('_', '-')} must be positive, not {value}",
                  file=sys.stderr)
            return 2
    link = DaemonLink(connect)
    cwd = args.cwd or os.getcwd()
    choice = SessionChoice(session_id=args.session, cwd=cwd)
    try:
        link.client()  # start the daemon now, not on the model's first call
    except ConnectionError as exc:
        print(f"ctxd: {exc}", file=sys.stderr)
        return 1
    server = SERVER.configure(link, choice)
    try:
        if not args.http:
            from ctxd.clients.mcp_limits import DEFAULT_MAX_LINE_BYTES

            serve_stdio(server, args.max_line_bytes or DEFAULT_MAX_LINE_BYTES)
            return 0
        token = os.environ.get("CTXD_MCP_TOKEN") or ""
        if not token and args.daemon_token:
            token = read_connection_file(connection_file).token
        printed = not token
        token = token or secrets.token_urlsafe(32)

        def announce(url: str) -> None:
            info = {"url": url, **({"token": token} if printed else {})}
            print(f"ctxd mcp: {json.dumps(info)}", file=sys.stderr, flush=True)

        serve_http(server, args.host, args.port, token, announce, args)
        return 0
    except ValueError as exc:
        print(f"ctxd: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    finally:
        link.close()


def register(sub: Any, common: Callable[[Any], None], connect: Callable[[Any], Client],
             connection_file: Callable[[Any], Path]) -> None:
    p = sub.add_parser("mcp", help="serve the archive to Claude Code, Codex or any MCP "
                       "client (stdio; --http for streamable HTTP on loopback)")
    common(p)
    p.add_argument("--session", help="the session the tools work on (default: the one "
                   "imported from this directory, else the most recent)")
    p.add_argument("--cwd", help="directory to map to a session (default: the current one)")
    p.add_argument("--http", action="store_true",
                   help="streamable HTTP instead of stdio, with a bearer token")
    p.add_argument("--host", default="127.0.0.1", help="loopback address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    p.add_argument("--daemon-token", action="store_true",
                   help="use the daemon's token from its connection file as the bearer "
                   "token (else CTXD_MCP_TOKEN, else a random one printed once)")
    p.add_argument("--max-connections", type=int, default=None, metavar="N",
                   help="HTTP connections open at once (default 256, within the "
                   "descriptor limit); past it the oldest idle one is closed")
    p.add_argument("--max-sessions", type=int, default=None, metavar="N",
                   help="MCP sessions open at once over HTTP (default 64); opening one "
                   "more closes the least recently used")
    p.add_argument("--session-idle-seconds", type=float, default=None, metavar="S",
                   help="an HTTP MCP session unused this long is closed (default 900)")
    p.add_argument("--max-line-bytes", type=int, default=None, metavar="N",
                   help="longest stdio line, one JSON-RPC message (default 4 MiB); a "
                   "longer one gets an error and is skipped")
    p.set_defaults(func=lambda a: run(a, lambda: connect(a), connection_file(a)))
