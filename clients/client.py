"""The Python client of the ctxd daemon, for every wire it serves.

    from ctxd.clients.client import connect, connect_async

    with connect(wire="zmq") as client:              # or "jsonrpc", "websocket"
        sid = client.create_session(title="demo")["sessionId"]
        client.on_notification(lambda method, params: print(method, params))
        client.subscribe(sid)
        client.append(sid, [{"role": "user", "content": "hello"}])
        messages = client.context_get(sid)["messages"]

    async with await connect_async(wire="websocket") as client:
        await client.subscribe(sid)
        async for method, params in client.notifications():
            ...

The daemon is found through its connection file (`connection_file_for(data_dir)`), which
names the endpoints and the token; a file or directory another user owns or may write to
is refused. On every wire the client first sends `initialize` with a nonce and a proof of
the token (never the token itself), and checks the daemon's `nonceMac` before sending
anything else (`ctxd.protocol.auth`): a process that took over a stale file's endpoint
gets nothing (`DaemonNotAuthentic`). Then, on ZeroMQ, the token travels in every request,
and a `heartbeat` keeps the lease of the client's runs (ZeroMQ has no disconnect signal).

`call()` returns the `result` of the reply, raises the typed `CtxdError` subclass for an
error reply (`SessionNotFound`, `InvalidParams`, ...), `ConnectionError` when the daemon
cannot be reached or the connection is lost (`DaemonNotRunning` when it is not there at
all), and `TimeoutError` when no reply comes in time.

On ZeroMQ, `subscribe()` returns only once the SUB socket's subscription is in effect at
the daemon (a subscription probe, see `_zmq`), so no event sent afterwards is missed.

A connection that falls behind on the JSON-RPC wires (more than the daemon's
`max_queue_bytes`, 8 MiB by default, sent and not yet read: a notification callback
that blocks the I/O thread, a stream nobody iterates) has its events dropped rather than
queued; once it has read its backlog it gets `session/didMissEvents` with
`{sessionId, missed}` for each session concerned, before any later event of it: re-read
what you keep of the session (`context_status`, `read`). Replies are never dropped: a
client that leaves `max_queue_bytes` of them unread is disconnected. On ZeroMQ the PUB
socket drops silently past 1,000 queued events per subscriber and nothing tells which
subscriber lost what, so no notice comes there.

`AsyncClient` matches replies to concurrent awaits by request id. `Client` runs an
`AsyncClient` on its own I/O thread, so any number of threads may call it at once;
notification callbacks of a `Client` run on that I/O thread. On ZeroMQ and JSON-RPC TCP
a `Client` also keeps a direct line (`_lane`): a call finding it free is sent and
answered on the calling thread itself, without the two thread switches of the I/O thread.
"""

from __future__ import annotations

from ctxd.clients.client_async import AsyncClient, NotificationStream, connect_async
from ctxd.clients.client_common import (
    COMPACT_TIMEOUT,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_TIMEOUT,
    WIRES,
    DaemonNotAuthentic,
    DaemonNotRunning,
    NotificationCallback,
    Wire,
    find_daemon,
)
from ctxd.clients.client_sync import Client, SyncNotificationStream, connect

# the one pid-alive check of the connection file, shared with the CLI (see test_contract)
from ctxd.protocol.connection import daemon_gone as daemon_gone

__all__ = [
    "COMPACT_TIMEOUT",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "WIRES",
    "AsyncClient",
    "Client",
    "DaemonNotAuthentic",
    "DaemonNotRunning",
    "NotificationCallback",
    "NotificationStream",
    "SyncNotificationStream",
    "Wire",
    "connect",
    "connect_async",
    "find_daemon",
]
