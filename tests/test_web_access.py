"""Who gets the web page: `ctxd ui`'s private redirect file and one-time login, the page
key, foreign origins and ports, DNS rebinding, a restarted daemon, the HTTP responses
themselves. Real Chromium, real daemon processes, raw sockets."""

# pytest fixtures come from web_helpers by import; test parameters name them again
# ruff: noqa: F811

from __future__ import annotations

import http.server
import json
import os
import re
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

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
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect as ws_connect

from ctxd.daemon.servers.page_keys import PageKeys
from ctxd.protocol.webpage import LOGIN_TTL, new_login_secret

UNAUTHORIZED = -32001
INVALID_PARAMS = -32602


class _ForeignSite(http.server.BaseHTTPRequestHandler):
    """Another user's server on another loopback port: it keeps the cookies it is sent."""

    cookies: list[str] = []

    def do_GET(self) -> None:  # noqa: N802
        _ForeignSite.cookies.extend(self.headers.get_all("Cookie") or [])
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


def _port(daemon: DaemonProcess) -> int:
    return int(daemon.info()["http"].rsplit(":", 1)[1].strip("/"))


def _ws_first(port: int, first: dict[str, Any], then: dict[str, Any] | None = None, *,
              origin: str | None, cookie: str | None = None) -> list[dict[str, Any]]:
    """A raw WebSocket client: the replies to `first` and (if the connection is still open)
    `then`; an empty list when the handshake is refused."""
    headers = {"Cookie": cookie} if cookie else None
    out: list[dict[str, Any]] = []
    try:
        with ws_connect(f"ws://127.0.0.1:{port}/ws", origin=origin,  # type: ignore[arg-type]
                        additional_headers=headers, open_timeout=10) as ws:
            for i, msg in enumerate(m for m in (first, then) if m is not None):
                ws.send(json.dumps({"jsonrpc": "2.0", "id": i + 1, **msg}))
                out.append(json.loads(ws.recv(10)))
    except InvalidStatus as exc:
        assert exc.response.status_code == 403
    except ConnectionClosed:
        pass
    return out


def _page_login(port: int, secret: str, origin: str | None = "own") -> dict[str, Any]:
    origin = f"http://127.0.0.1:{port}" if origin == "own" else origin
    got = _ws_first(port, {"method": "initialize", "params": {"pageLogin": secret}},
                    origin=origin)
    assert len(got) == 1
    return got[0]


def test_foreign_origin_and_missing_login_get_nothing(daemon: DaemonProcess, client: Any,
                                                      browser: Browser) -> None:
    marker = "secret-title-7c1e"
    sid = client.call("session/create", {"title": marker})["sessionId"]
    base = daemon.info()["http"]
    # no login: the page's files (nothing of the daemon's in them), a page that says how to
    # log in, and a WebSocket that answers nothing but "log in first"
    ctx = browser.new_context()
    page = ctx.new_page()
    resp = page.goto(base + f"s/{sid}")
    assert resp is not None and resp.status == 200
    expect(page.locator("#conn")).to_have_text(re.compile("logged out: run `ctxd ui`"))
    assert marker not in page.content() and marker not in page.inner_text("body")
    got = page.evaluate(PROBE, base)
    assert "result" not in got["ws"] and str(UNAUTHORIZED) in got["ws"], got
    assert marker not in json.dumps(got)
    # an old login link (?token=) is no login
    page.goto(base + "?token=" + "A" * 43)
    expect(page.locator("#conn")).to_have_text(re.compile("logged out"))
    ctx.close()
    # logged in, then a page of another origin (same host, other port: same site for
    # cookies) tries the WebSocket, a credentialed fetch and the page's storage
    ctx = browser.new_context()
    page = ctx.new_page()
    page.goto(ui_url(daemon, sid))
    page.wait_for_selector("body[data-ready=true]")
    key = page.evaluate("localStorage.getItem('ctxd.pageKey')")
    assert key
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ForeignSite)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        page.goto(f"http://127.0.0.1:{server.server_address[1]}/")
        got = page.evaluate(PROBE, base)
        assert got["ws"] in ("error", "closed") and got["fetched"] == "blocked", got
        assert marker not in json.dumps(got)
        assert page.evaluate("localStorage.getItem('ctxd.pageKey')") is None
    finally:
        server.shutdown()
        server.server_close()
    # DNS rebinding: a foreign Host name gets nothing, the daemon's own gets the page
    port = _port(daemon)
    for host in (f"evil.example:{port}", f"127.0.0.1.nip.io:{port}", "127.0.0.1:1"):
        head = _raw_get(port, f"/s/{sid}", host, "")
        assert head.startswith(b"HTTP/1.1 403"), (host, head[:80])
        assert marker.encode() not in head
    head = _raw_get(port, f"/s/{sid}", f"127.0.0.1:{port}", "")
    assert head.startswith(b"HTTP/1.1 200") and marker.encode() not in head
    ctx.close()
    # neither the daemon's token nor the page's key reached the daemon's log, even at DEBUG
    log = daemon.log_path.read_text(errors="replace")
    assert "GET" in log and "initialize" in log  # the log does record requests and frames
    assert daemon.info()["token"] not in log and key not in log


def test_a_cookie_sent_to_another_port_gets_nothing(daemon: DaemonProcess, client: Any,
                                                    browser: Browser) -> None:
    """Browsers send a loopback cookie to every port of the host. Another user's server on
    another port keeps what the logged-in browser sends it and replays it, with any Origin
    it likes, over raw sockets: it must get nothing."""
    marker = "cookie-replay-3b9d"
    sid = client.call("session/create", {"title": marker})["sessionId"]
    port = _port(daemon)
    ctx = browser.new_context()
    page = ctx.new_page()
    page.goto(ui_url(daemon, sid))
    page.wait_for_selector("body[data-ready=true]")
    expect(page.locator("#conn")).to_have_text("● live")
    _ForeignSite.cookies = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ForeignSite)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    other = server.server_address[1]
    try:
        page.goto(f"http://127.0.0.1:{other}/")
        expect(page.locator("body")).to_contain_text("elsewhere")
    finally:
        server.shutdown()
        server.server_close()
    ctx.close()
    # the logged-in browser gave the other port no credential of the daemon's
    assert not any(f"ctxd_page_{port}" in c for c in _ForeignSite.cookies), _ForeignSite.cookies
    # whatever reached the other port, plus a cookie of the old form, replayed
    harvested = "; ".join(_ForeignSite.cookies + [f"ctxd_page_{port}=abc.def"])
    listing = {"method": "session/list", "params": {}}
    for origin in (f"http://127.0.0.1:{other}", f"http://127.0.0.1:{port}",
                   f"http://localhost:{port}", None):
        got = _ws_first(port, listing, listing, origin=origin, cookie=harvested)
        assert all("result" not in r for r in got), (origin, got)
        assert marker not in json.dumps(got)
        if got:
            assert got[0]["error"]["code"] == UNAUTHORIZED
        got = _ws_first(port, {"method": "initialize", "params": {"token": ""}}, listing,
                        origin=origin, cookie=harvested)
        assert all("result" not in r for r in got) and marker not in json.dumps(got), got
    # plain HTTP with the harvested cookie and the other port's Origin: refused
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"GET /s/{sid} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                  f"Origin: http://127.0.0.1:{other}\r\nCookie: {harvested}\r\n\r\n".encode())
        head = s.recv(65536)
    assert head.startswith(b"HTTP/1.1 403") and marker.encode() not in head


def _browser_script(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A stand-in browser for `webbrowser` ($BROWSER): it records its whole command line."""
    argv = tmp_path / "argv.json"
    script = tmp_path / "browser.py"
    script.write_text(f"#!{sys.executable}\nimport json, sys\n"
                      f"open({str(argv)!r}, 'w').write(json.dumps(sys.argv))\n")
    script.chmod(0o755)
    return argv, {"BROWSER": str(script)}


def test_ctxd_ui_hands_the_browser_a_private_file_that_logs_in_once(
        daemon: DaemonProcess, client: Any, browser: Browser, tmp_path: Path) -> None:
    sid = new_session(client, "private login")
    argv_file, env = _browser_script(tmp_path)
    cmd = [sys.executable, "-m", "ctxd.clients.cli", "ui", sid,
           "--connection-file", str(daemon.connection_file)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                         env={**daemon.env, **env})
    assert out.returncode == 0, out.stderr
    deadline = time.monotonic() + 30
    while not argv_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    argv = json.loads(argv_file.read_text())
    # the command line (any local user reads it in /proc/PID/cmdline) holds a file's path,
    # no secret: not the token, not a login
    token = daemon.info()["token"]
    line = " ".join(argv)
    assert token not in line and "login" not in line and "token" not in line and "#" not in line
    assert len(argv) == 2 and argv[1].startswith("file://") and out.stdout.strip() == argv[1]
    redirect = Path(unquote(urlparse(argv[1]).path))
    st = redirect.lstat()
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_uid == os.getuid()
    assert stat.S_IMODE(redirect.parent.stat().st_mode) == 0o700
    assert redirect.parent == daemon.runtime_dir.resolve()
    text = redirect.read_text()
    secret = re.search(r"#login=([A-Za-z0-9_.-]+)", text)
    assert secret and secret.group(1) not in line and token not in text
    # real Chromium opens the file: it lands on the session, logged in
    ctx = browser.new_context()
    ctx.set_default_timeout(WAIT_MS)
    try:
        page = ctx.new_page()
        page.goto(argv[1])
        page.wait_for_selector("body[data-ready=true]")
        expect(page.locator("#conn")).to_have_text("● live")
        assert urlparse(page.url).path == f"/s/{sid}" and "login" not in page.url
        assert page.inner_text("#crumb").strip() == "private login"
    finally:
        ctx.close()
    # the same file a second time (another browser, another user who copied it): refused
    ctx = browser.new_context()
    ctx.set_default_timeout(WAIT_MS)
    try:
        page = ctx.new_page()
        page.goto(argv[1])
        expect(page.locator("#conn")).to_have_text(re.compile("logged out"))
        assert "private login" not in page.inner_text("body")
        assert page.evaluate("localStorage.getItem('ctxd.pageKey')") is None
    finally:
        ctx.close()
    reply = _page_login(_port(daemon), secret.group(1))
    assert reply["error"]["code"] == UNAUTHORIZED and "used already" in reply["error"]["message"]


def test_ctxd_ui_writes_no_login_into_a_shared_runtime_dir(daemon: DaemonProcess,
                                                           tmp_path: Path) -> None:
    # the connection file stays where it is (private); the runtime dir, where the
    # redirect file would go, is one other users may write to
    argv_file, env = _browser_script(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    cmd = [sys.executable, "-m", "ctxd.clients.cli", "ui",
           "--connection-file", str(daemon.connection_file)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                         env={**daemon.env, **env, "CTXD_RUNTIME_DIR": str(shared)})
    assert out.returncode == 1 and "runtime dir" in out.stderr, out
    assert "writable by other users" in out.stderr
    assert out.stdout == "" and not argv_file.exists() and list(shared.iterdir()) == []
    assert stat.S_IMODE(shared.stat().st_mode) == 0o777  # refused, not taken over


def test_ctxd_ui_no_browser_prints_a_one_time_address(daemon: DaemonProcess) -> None:
    cmd = [sys.executable, "-m", "ctxd.clients.cli", "ui", "--no-browser",
           "--connection-file", str(daemon.connection_file)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=daemon.env)
    assert out.returncode == 0, out.stderr
    url = out.stdout.strip()
    assert url.startswith(daemon.info()["http"] + "#login=")
    assert daemon.info()["token"] not in url
    assert "once" in out.stderr and "2 minutes" in out.stderr


def test_login_secrets_are_single_use_short_lived_and_for_the_page_only(
        daemon: DaemonProcess) -> None:
    port = _port(daemon)
    token = daemon.info()["token"]
    listing = {"method": "session/list", "params": {}}
    # a fresh secret logs in once: a page key comes back, and the session list with it
    secret = new_login_secret(token)
    first = _page_login(port, secret)
    key = first["result"]["pageKey"]
    assert isinstance(key, str) and len(key) >= 40 and key not in (token, secret)
    again = _page_login(port, secret)
    assert again["error"]["code"] == UNAUTHORIZED and "used already" in again["error"]["message"]
    # expired, valid for longer than a login may be, minted under another token, mangled
    refused = {
        "expired": new_login_secret(token, now=time.time() - LOGIN_TTL - 30),
        "valid for longer": new_login_secret(token, ttl=3600),
        "not minted with this daemon's token": new_login_secret("another daemon's token"),
        "not a login secret": "x" * 80,
    }
    # odd strings: refused (-32602 for text that is not valid Unicode), the daemon serving on
    for odd in ("", "..", "\ud800", f"{int(time.time()) + 60}.\ud800.x", "１２３.a.b",
                "²³.a.b", "9" * 13 + ".a.b", "1.a.b.c"):
        reply = _page_login(port, odd)
        assert reply["error"]["code"] in (UNAUTHORIZED, INVALID_PARAMS), (odd, reply)
        got = _ws_first(port, {"method": "initialize", "params": {"pageKey": odd}},
                        origin=f"http://127.0.0.1:{port}")
        assert got[0]["error"]["code"] in (UNAUTHORIZED, INVALID_PARAMS), (odd, got)
    for why, bad in refused.items():
        reply = _page_login(port, bad)
        assert reply["error"]["code"] == UNAUTHORIZED and why in reply["error"]["message"], reply
    # the page key: good for the page's origin, again and again while the daemon runs
    for _ in range(2):
        got = _ws_first(port, {"method": "initialize", "params": {"pageKey": key}}, listing,
                        origin=f"http://127.0.0.1:{port}")
        assert got[0]["result"]["pageKey"] == key and "sessions" in got[1]["result"]
    # neither works for a program (no Origin) or a page of another origin
    fresh = new_login_secret(token)
    for origin in (None, f"http://127.0.0.1:{port + 1}"):
        for params in ({"pageKey": key}, {"pageLogin": fresh}):
            got = _ws_first(port, {"method": "initialize", "params": params}, listing,
                            origin=origin)
            assert all("result" not in r for r in got), (origin, got)
    # the secret the refusals above did not take still logs in once
    assert "pageKey" in _page_login(port, fresh)["result"]


def test_a_page_key_expires_once_no_page_holds_it() -> None:
    # the daemon's own PageKeys, with a short idle time instead of 15 minutes
    keys = PageKeys("tok", idle=0.3)
    key = keys.redeem(new_login_secret("tok"))
    assert keys.valid(key) and not keys.valid(key[:-1] + ("A" if key[-1] != "A" else "B"))
    held = keys.hold(key)
    time.sleep(0.5)
    assert keys.valid(key)  # a connection holds it: it does not expire
    keys.release(held)
    assert keys.valid(key)
    time.sleep(0.5)
    assert not keys.valid(key)  # idle for longer than allowed


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

    def get(path: str, cookie: str | None = None) -> tuple[str, dict[str, list[str]], bytes]:
        extra = f"Cookie: {cookie}\r\n" if cookie else ""
        return _raw(port, f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n")

    # the page's files: no data, no secret, no cookie, whoever asks from a loopback name
    for path in ("/", "/s/abc", f"/s/abc?token={'A' * 43}", f"/?token={info['token']}"):
        status, headers, body = get(path)
        assert status.startswith("HTTP/1.1 200"), path
        assert "set-cookie" not in headers and "location" not in headers
        assert info["token"].encode() not in body and b"<script type=\"module\"" in body
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
    for path in ("/static/index.html", "/static/../web.py", "/static/nope.js", "/ctxd.json",
                 "/auth"):
        assert get(path)[0].startswith("HTTP/1.1 404"), path


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
        # a daemon that stays away may have restarted on another port: say what to do
        expect(page.locator("#conn")).to_have_text(
            re.compile(r"if it restarted, run `ctxd ui` again"), timeout=WAIT_MS)
        d.start()  # same port, new secret: the old page key is worthless
        expect(page.locator("#conn")).to_have_text(re.compile("logged out"), timeout=20_000)
        assert page.is_disabled("#send") and page.is_disabled("#compact-button")
        # a new link from ctxd ui logs the same browser in again
        page.goto(ui_url(d, sid))
        page.wait_for_selector("body[data-ready=true]")
        expect(page.locator("#conn")).to_have_text("● live")
    finally:
        ctx.close()
        d.stop()
