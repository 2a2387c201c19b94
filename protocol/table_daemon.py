"""Protocol table entries. The daemon itself: `heartbeat` and `shutdown`.

Assembled in order with the other groups by `ctxd.protocol.methods`.
"""

from ctxd.protocol import types
from ctxd.protocol.declare import (
    Method,
    Params,
)


class HeartbeatParams(Params):
    """No params."""


class ShutdownParams(Params):
    """No params."""


HEARTBEAT = Method(
    "heartbeat",
    HeartbeatParams,
    "`leaseSeconds` (how long the daemon waits for the next request before it interrupts "
    "this client's runs).",
    "Tells the daemon the client is alive. ZeroMQ has no disconnect signal: a ZeroMQ "
    "client holding an open run must send a request (any, or this one) at least every "
    "`leaseSeconds`, or its runs are marked interrupted.",
    (),
    False,
    returns=types.HeartbeatResult,
    client="heartbeat",
)

SHUTDOWN = Method(
    "shutdown",
    ShutdownParams,
    "`{}`, sent before the daemon stops.",
    "Asks the daemon to stop: it answers, finishes writing, removes its connection file and exits.",
    (),
    False,
    returns=types.Empty,
    client="shutdown",
)


DAEMON_METHODS: tuple[Method, ...] = (
    HEARTBEAT,
    SHUTDOWN,
)
