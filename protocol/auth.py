"""Mutual authentication between a client and the daemon, from the connection file's token.

The client proves it knows the token without sending it, and the daemon proves it knows
it too, before the client sends anything else:

1. the client picks a fresh `nonce` and sends `initialize` with `nonce` and
   `proof = HMAC-SHA256(token, "ctxd-client:" + nonce)` (hex) instead of `token`;
2. the daemon checks `proof` and answers with
   `nonceMac = HMAC-SHA256(token, "ctxd-daemon:" + nonce)` (hex);
3. the client compares `nonceMac` with its own computation and closes the connection
   when they differ. Only then does it send any other request.

The two labels keep one side's MAC from being replayed as the other side's. A process
that took over a stale connection file's port (the daemon died, another user bound the
port) never learns the token, so it can neither compute `nonceMac` nor later pass the
client's `proof` to anything. Old clients that send `token` and no `nonce` still work.

ZeroMQ over TCP authenticates at the socket instead (CURVE with ZAP): both key pairs
are derived from the token, so only holders of the token can complete a handshake, and
the client knows the daemon's public key only a holder of the token can match.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

import zmq
from zmq.utils import z85

NONCE_MIN = 16
NONCE_MAX = 128
MAC_HEX_LENGTH = 64

_CLIENT_LABEL = b"ctxd-client:"
_DAEMON_LABEL = b"ctxd-daemon:"
_CURVE_SERVER_LABEL = b"ctxd-zmq-curve-server"
_CURVE_CLIENT_LABEL = b"ctxd-zmq-curve-client"


def new_nonce() -> str:
    """A fresh nonce for `initialize` (32 url-safe characters)."""
    return secrets.token_urlsafe(24)


def _mac(token: str, label: bytes, nonce: str) -> str:
    key = token.encode("utf-8", "surrogatepass")
    msg = label + nonce.encode("utf-8", "surrogatepass")
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


def client_proof(token: str, nonce: str) -> str:
    """What the client sends as `proof`: shows it knows the token without revealing it."""
    return _mac(token, _CLIENT_LABEL, nonce)


def daemon_proof(token: str, nonce: str) -> str:
    """What the daemon answers as `nonceMac`."""
    return _mac(token, _DAEMON_LABEL, nonce)


def _same(expected: str, given: object) -> bool:
    return isinstance(given, str) and hmac.compare_digest(
        expected.encode(), given.encode("utf-8", "surrogatepass")
    )


def check_client_proof(token: str, nonce: object, proof: object) -> bool:
    return isinstance(nonce, str) and _same(client_proof(token, nonce), proof)


def check_daemon_proof(token: str, nonce: str, mac: object) -> bool:
    return _same(daemon_proof(token, nonce), mac)


# ZeroMQ CURVE keys


def _curve_pair(token: str, label: bytes) -> tuple[bytes, bytes]:
    secret = hmac.new(token.encode("utf-8", "surrogatepass"), label, hashlib.sha256).digest()
    secret_z85 = z85.encode(secret)
    return zmq.curve_public(secret_z85), secret_z85


def curve_server_keys(token: str) -> tuple[bytes, bytes]:
    """The daemon's CURVE key pair (public, secret), Z85, derived from the token."""
    return _curve_pair(token, _CURVE_SERVER_LABEL)


def curve_client_keys(token: str) -> tuple[bytes, bytes]:
    """The key pair (public, secret), Z85, every holder of the token connects with."""
    return _curve_pair(token, _CURVE_CLIENT_LABEL)


def secure_client_socket(sock: zmq.Socket, token: str) -> None:  # type: ignore[type-arg]
    """Make `sock` a CURVE client of the daemon whose token is `token` (before connect)."""
    server_public, _ = curve_server_keys(token)
    public, secret = curve_client_keys(token)
    sock.curve_serverkey = server_public
    sock.curve_publickey = public
    sock.curve_secretkey = secret
