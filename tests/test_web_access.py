"""Who gets the web page: the login link and its cookie, foreign origins, DNS rebinding,
a restarted daemon, the HTTP responses themselves, and `ctxd ui`. Real Chromium, real
daemon processes, raw sockets."""

# pytest fixtures come from web_helpers by import; test parameters name them again
# ruff: noqa: F811

from __future__ import annotations

import http.server
import json
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from helpers import DaemonProcess
from playwright.sync_api import Browser, expect
from web_helpers import (  # noqa: F401  (fixtures)
    WAIT_MS,
    browser,
    client,
    context,
    daemon,
    fmt,
    new_session,
    open_session,
    ui_url,
    watch_errors,
)

from ctxd.protocol.webpage import login_token


class _ForeignSite(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        body = b"<!doctype html><title>foreign</title><p>elsewhere"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


PROBE = """async (base) => {
  const ws = await new Promise((resolve) => {
    const s = new WebSocket(base.replace('http', 'ws') + 'ws');
    s.onopen = () => { s.send(JSON.stringify({jsonrpc: '2.0', id: 1, method: 'session/list',
                                              params: {}})); };
    s.onmessage = (e) => resolve('message: ' + e.data);
    s.onerror = () => resolve('error');
    s.onclose = () => resolve('closed');
    setTimeout(() => resolve('timeout'), 4000);
  });
  let fetched;
  try {
    const r = await fetch(base, {credentials: 'include'});
    fetched = 'read: ' + await r.text();
  }
  catch (e) { fetched = 'blocked'; }
  return {ws, fetched};
}"""


def test_foreign_origin_and_missing_token_get_nothing(daemon: DaemonProcess, client: Any,
                                                      browser: Browser) -> None:
    marker = "secret-title-7c1e"
    sid = client.call("session/create", {"title": marker})["sessionId"]
    base = daemon.info()["http"]
    # no login token: a 401 page with nothing of the daemon's, and no WebSocket
    ctx = browser.new_context()
    page = ctx.new_page()
    resp = page.goto(base + f"s/{sid}")
    assert resp is not None and resp.status == 401
    assert marker not in page.content() and sid not in page.inner_text("body")
    assert "ctxd ui" in page.inner_text("body")
    got = page.evaluate(PROBE, base)
    assert got["ws"] in ("error", "closed"), got
    assert marker not in json.dumps(got)
    # a wrong token is the same as none
    resp = page.goto(base + "?token=" + "A" * 43)
    assert resp is not None and resp.status == 401
    ctx.close()
    # logged in, then a page of another origin (same host, other port: same site for
    # cookies) tries the WebSocket and a credentialed fetch
    ctx = browser.new_context()
    page = ctx.new_page()
    page.goto(ui_url(daemon, sid))
    page.wait_for_selector("body[data-ready=true]")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ForeignSite)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        page.goto(f"http://127.0.0.1:{server.server_address[1]}/")
        got = page.evaluate(PROBE, base)
        assert got["ws"] in ("error", "closed") and got["fetched"] == "blocked", got
        assert marker not in json.dumps(got)
    finally:
        server.shutdown()
        server.server_close()
    # DNS rebinding: the page's own cookie, a foreign Host name
    cookie = next(c for c in ctx.cookies() if c["name"].startswith("ctxd_page_"))
    port = int(base.rsplit(":", 1)[1].strip("/"))
    for host in (f"evil.example:{port}", f"127.0.0.1.nip.io:{port}", "127.0.0.1:1"):
        head = _raw_get(port, f"/s/{sid}", host, f"{cookie['name']}={cookie['value']}")
        assert head.startswith(b"HTTP/1.1 403"), (host, head[:80])
        assert marker.encode() not in head
    head = _raw_get(port, f"/s/{sid}", f"127.0.0.1:{port}", f"{cookie['name']}={cookie['value']}")
    assert head.startswith(b"HTTP/1.1 200")
    ctx.close()
    # the token never reached the daemon's log, even at DEBUG
    log = daemon.log_path.read_text(errors="replace")
    assert "GET" in log  # the log does record requests
    assert login_token(daemon.info()["token"]) not in log
    assert cookie["value"] not in log


def _raw_get(port: int, path: str, host: str, cookie: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nCookie: {cookie}\r\n\r\n".encode())
        out = b""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
        return out


def test_ctxd_ui_names_a_missing_session(daemon: DaemonProcess) -> None:
    cmd = [sys.executable, "-m", "ctxd.clients.cli", "ui", "no-such-session", "--no-browser",
           "--connection-file", str(daemon.connection_file)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, env=daemon.env)
    assert out.returncode == 2 and "no-such-session" in out.stderr
    assert out.stdout == ""


def _raw(port: int, request: str) -> tuple[str, dict[str, list[str]], bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request.encode())
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    head, _, body = out.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers: dict[str, list[str]] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    return lines[0], headers, body


def test_http_side_of_the_page_server(daemon: DaemonProcess) -> None:
    info = daemon.info()
    port = int(info["http"].rsplit(":", 1)[1].strip("/"))
    host = f"127.0.0.1:{port}"
    login = login_token(info["token"])
    # the login: 303 to the same page without the token, and an HttpOnly Strict cookie
    status, headers, _ = _raw(port, f"GET /s/abc?token={login} HTTP/1.1\r\nHost: {host}\r\n\r\n")
    assert status.startswith("HTTP/1.1 303")
    assert headers["location"] == ["/s/abc"]
    cookie = headers["set-cookie"][0]
    assert cookie.startswith(f"ctxd_page_{port}=")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and login not in cookie
    value = cookie.split(";")[0]
    # a login link to anywhere else lands on the session list
    status, headers, _ = _raw(
        port, f"GET /static/app.js?token={login} HTTP/1.1\r\nHost: {host}\r\n\r\n")
    assert headers["location"] == ["/"]

    def get(path: str, cookie: str | None = value) -> tuple[str, dict[str, list[str]], bytes]:
        extra = f"Cookie: {cookie}\r\n" if cookie else ""
        return _raw(port, f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n")

    status, headers, body = get("/s/abc")
    assert status.startswith("HTTP/1.1 200")
    csp = headers["content-security-policy"][0]
    for rule in ("default-src 'none'", "script-src 'self'", "style-src 'self'",
                 "frame-ancestors 'none'", "base-uri 'none'"):
        assert rule in csp
    assert "unsafe" not in csp and "http" not in csp.replace(f"ws://{host}", "")
    assert headers["x-frame-options"] == ["DENY"]
    assert headers["x-content-type-options"] == ["nosniff"]
    assert headers["referrer-policy"] == ["no-referrer"]
    assert "access-control-allow-origin" not in headers
    # no inline script and nothing from another host in the page itself
    assert b"<script>" not in body and b"//" not in body.replace(b'"/static/', b"")
    for path, ctype in (("/static/app.js", "text/javascript"), ("/static/app.css", "text/css"),
                        ("/static/icon.svg", "image/svg+xml")):
        status, headers, body = get(path)
        assert status.startswith("HTTP/1.1 200") and headers["content-type"][0].startswith(ctype)
        assert body
    for path in ("/static/index.html", "/static/../web.py", "/static/nope.js", "/ctxd.json"):
        assert get(path)[0].startswith("HTTP/1.1 404"), path
    assert get("/auth")[0].startswith("HTTP/1.1 204")
    # without the cookie, or with a forged one: the login page only
    for cookie in (None, f"ctxd_page_{port}=abc.def", value.replace(".", ".0")):
        for path in ("/", "/s/abc", "/static/app.js", "/auth"):
            status, _, body = get(path, cookie)
            assert status.startswith("HTTP/1.1 401"), (path, cookie)
            assert b"ctxd ui" in body and b"<script" not in body


def test_ctxd_ui_opens_the_browser(daemon: DaemonProcess, tmp_path: Path) -> None:
    # webbrowser honours $BROWSER: a script that records what it was asked to open
    opened = tmp_path / "opened.txt"
    script = tmp_path / "browser.sh"
    script.write_text(f'#!/bin/sh\nprintf "%s" "$1" > {opened}\n')
    script.chmod(0o755)
    env = {**daemon.env, "BROWSER": str(script)}
    cmd = [sys.executable, "-m", "ctxd.clients.cli", "ui",
           "--connection-file", str(daemon.connection_file)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, env=env)
    assert out.returncode == 0, out.stderr
    deadline = time.monotonic() + 10
    while not opened.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    url = out.stdout.strip()
    assert opened.read_text() == url
    assert url == daemon.info()["http"] + "?token=" + login_token(daemon.info()["token"])


def _free_port_pair() -> int:
    """A port P with P and P+1 free: `--port P` puts the WebSocket (and the page) on P+1."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no two free ports in a row")


def test_a_restarted_daemon_asks_the_page_to_log_in_again(tmp_path: Path,
                                                          browser: Browser) -> None:
    port = _free_port_pair()
    d = DaemonProcess(tmp_path, "--port", str(port)).start()
    ctx = browser.new_context()
    ctx.set_default_timeout(WAIT_MS)
    try:
        with d.client("jsonrpc") as client:
            sid = new_session(client, "restart")
        page = open_session(ctx, d, sid)
        d.stop()
        expect(page.locator("#conn")).not_to_have_text("● live")
        d.start()  # same port, new secret: the old cookie is worthless
        expect(page.locator("#conn")).to_have_text(re.compile("logged out"), timeout=20_000)
        assert page.is_disabled("#send") and page.is_disabled("#compact-button")
        # a new link from ctxd ui logs the same browser in again
        page.goto(ui_url(d, sid))
        page.wait_for_selector("body[data-ready=true]")
        expect(page.locator("#conn")).to_have_text("● live")
    finally:
        ctx.close()
        d.stop()
