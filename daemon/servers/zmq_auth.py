"""The ZAP handler (ZeroMQ RFC 27) of the daemon's ZeroMQ sockets over TCP.

libzmq asks the handler bound at `inproc://zeromq.zap.01` of a context about every peer
completing a CURVE handshake with a socket of that context; a peer refused here is
disconnected before a single message passes, in either direction. Only the client key
derived from the daemon's token (`ctxd.protocol.auth.curve_client_keys`) is admitted.
"""

from __future__ import annotations

import contextlib
import hmac
import logging

import zmq
import zmq.asyncio
from zmq.utils import z85

from ctxd.protocol.auth import curve_client_keys

log = logging.getLogger("ctxd.servers.zmq")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"


class ZapHandler:
    def __init__(self, ctx: zmq.asyncio.Context, token: str, stats: dict[str, int]) -> None:
        public, _ = curve_client_keys(token)
        self._client_key = z85.decode(public)
        self.stats = stats
        stats.setdefault("zap_allowed", 0)
        stats.setdefault("zap_denied", 0)
        self._sock = ctx.socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(ZAP_ENDPOINT)

    async def serve(self) -> None:
        sock = self._sock
        while True:
            try:
                frames = await sock.recv_multipart()
            except zmq.ZMQError as exc:
                if exc.errno in (zmq.ETERM, zmq.ENOTSOCK):
                    return
                log.warning("ZAP receive failed: %s", exc)
                continue
            with contextlib.suppress(zmq.ZMQError):
                await sock.send_multipart(self._answer(frames))

    def _answer(self, frames: list[bytes]) -> list[bytes]:
        if len(frames) < 6:
            return [b"1.0", b"", b"500", b"malformed ZAP request", b"", b""]
        version, request_id, _domain, address, _identity, mechanism = frames[:6]
        credentials = frames[6:]
        if (
            mechanism == b"CURVE"
            and len(credentials) == 1
            and hmac.compare_digest(credentials[0], self._client_key)
        ):
            self.stats["zap_allowed"] += 1
            return [version, request_id, b"200", b"OK", b"ctxd-client", b""]
        denied = self.stats["zap_denied"] = self.stats["zap_denied"] + 1
        # a flood of refused peers must not flood the log: 1st, 10th, 100th, ...
        if denied in (1, 10, 100, 1000) or denied % 10_000 == 0:
            log.warning(
                "ZeroMQ peer %s refused: it does not hold the token (%d refused so far)",
                address.decode(errors="replace"),
                denied,
            )
        return [version, request_id, b"400", b"unknown key", b"", b""]

    def close(self) -> None:
        self._sock.close(linger=0)
