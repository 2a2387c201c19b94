"""The web page's credentials: one-time login secrets redeemed for page keys.

A browser page authenticates in the first message of each WebSocket connection, never by
a cookie: browsers send a loopback cookie to every port of the host, so a server on
another loopback port would receive it. A page key lives in the page's `localStorage`,
which only the daemon's own origin (scheme, host and port) can read.

* A login secret (`ctxd.protocol.webpage`) is taken once: its nonce is remembered until
  the secret expires, so a second use is refused.
* A page key stays good while a connection that logged in with it is open, and for
  `PAGE_KEY_IDLE` seconds after the last such connection closed (a reload or a dropped
  connection logs in again with it); then it is refused. Keys live in memory only: a
  restarted daemon knows none, and `ctxd ui` logs the page in again.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from dataclasses import dataclass

from ctxd.daemon.servers.base import Connection
from ctxd.protocol.errors import Unauthorized
from ctxd.protocol.webpage import LOGIN_TTL, check_login_secret

log = logging.getLogger("ctxd.servers.web")

PAGE_KEY_IDLE = 15 * 60


@dataclass
class _Key:
    expires: float  # monotonic; only counts while no connection holds the key
    holders: int = 0


def _digest(key: str) -> bytes:
    # keys are looked up by their hash: a dict probe on the secret itself would compare
    # prefixes of it in variable time
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


class PageKeys:
    """Login secrets taken so far and the page keys given for them."""

    def __init__(self, daemon_token: str, idle: float = PAGE_KEY_IDLE) -> None:
        self._token = daemon_token
        self._idle = idle
        self._used: dict[str, int] = {}  # nonce -> expiry (unix seconds)
        self._keys: dict[bytes, _Key] = {}

    def redeem(self, login_secret: str) -> str:
        """A new page key for a login secret; `ValueError` saying why it was refused."""
        now = time.time()
        for nonce, expires in list(self._used.items()):
            if expires < now:
                del self._used[nonce]
        nonce, expires = check_login_secret(self._token, login_secret, now)
        if nonce in self._used:
            raise ValueError("used already")
        self._used[nonce] = expires
        self._prune()
        key = secrets.token_urlsafe(32)
        self._keys[_digest(key)] = _Key(time.monotonic() + self._idle)
        return key

    def valid(self, key: str) -> bool:
        entry = self._keys.get(_digest(key))
        return entry is not None and (entry.holders > 0 or entry.expires > time.monotonic())

    def hold(self, key: str) -> bytes:
        """A connection logged in with `key`: it does not expire while that is open."""
        digest = _digest(key)
        self._keys[digest].holders += 1
        return digest

    def release(self, digest: bytes) -> None:
        """The connection that held the key closed: its idle time starts now."""
        entry = self._keys.get(digest)
        if entry is not None:
            entry.holders = max(0, entry.holders - 1)
            if entry.holders == 0:
                entry.expires = time.monotonic() + self._idle

    def log_in(self, conn: Connection, login: str | None, key: str | None) -> str:
        """`initialize` with `pageLogin` or `pageKey`: the page key the connection now
        holds, or `Unauthorized`. Only a browser on the daemon's own origin may: another
        origin cannot read that origin's storage, and a program has the token."""
        if not conn.page_origin:
            raise Unauthorized("pageLogin and pageKey are for the web page on the daemon's origin")
        if login is not None:
            try:
                key = self.redeem(login)
            except ValueError as exc:
                log.warning("page login of %r refused: %s", conn, exc)
                raise Unauthorized(
                    f"login link refused ({exc}): each logs in once, within "
                    f"{LOGIN_TTL // 60} minutes; run `ctxd ui` for a new one"
                ) from None
            log.info("page login of %r", conn)
        elif key is None or not self.valid(key):
            log.info("page key of %r refused", conn)
            raise Unauthorized("this page's login expired; run `ctxd ui` for a new link")
        conn.page_key = self.hold(key)
        return key

    def closed(self, conn: Connection) -> None:
        if conn.page_key is not None:
            self.release(conn.page_key)
            conn.page_key = None

    def _prune(self) -> None:
        now = time.monotonic()
        for digest, entry in list(self._keys.items()):
            if entry.holders == 0 and entry.expires <= now:
                del self._keys[digest]
