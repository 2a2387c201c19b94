"""Protocol table entries. The daemon itself: `heartbeat` and `shutdown`.

Assembled in order with the other groups by `ctxd.protocol.methods`.
"""

from __future__ import annotations

from ctxd.protocol.declare import (
    Method,
)

DAEMON_METHODS: tuple[Method, ...] = (
    Method(
        "heartbeat",
        (),
        "`leaseSeconds` (how long the daemon waits for the next request before it interrupts "
        "this client's runs).",
        "Tells the daemon the client is alive. ZeroMQ has no disconnect signal: a ZeroMQ "
        "client holding an open run must send a request (any, or this one) at least every "
        "`leaseSeconds`, or its runs are marked interrupted.",
        (),
        False,
        handler="dispatcher.heartbeat",
        client="heartbeat",
    ),
    Method(
        "shutdown",
        (),
        "`{}`, sent before the daemon stops.",
        "Asks the daemon to stop: it answers, finishes writing, removes its connection file "
        "and exits.",
        (),
        False,
        handler="dispatcher.shutdown",
        client="shutdown",
    ),
)
