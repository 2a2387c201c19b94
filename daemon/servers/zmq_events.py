"""The ZeroMQ wire's event side: session events out on an XPUB socket, probes answered.

Events go out as `[b"session/<id>", msgpack {method, params}]`. The daemon sees
subscriptions (XPUB): when a subscriber subscribes to a topic starting with `probe/`, it
answers with one `$/probe` message on that topic. Subscriptions travel in order on one
connection, so once a subscriber receives its probe, every subscription it made before
is in effect: this is how clients wait out ZeroMQ's slow-joiner problem without sleeping.

The other topics subscribed are kept too, so the daemon can tell whether anyone here
watches a session (`watches`), and `on_topic` is told of each topic that comes or goes
(another daemon's events are read only for the sessions watched here, see
stores/postgres/event_reader.py). The XPUB socket keeps its default (not verbose): libzmq
counts the subscribers of each topic itself and passes on a topic's subscription when
its first subscriber comes and its unsubscription when the last one goes (unsubscribing,
or disconnecting), so the set of topics passed on is exactly the set subscribed.

A subscriber that stops reading loses events past the high-water mark (1,000 queued per
subscriber) without notice, unlike on the JSON-RPC wires (`session/didMissEvents`):
libzmq drops per subscriber inside the PUB socket and tells the publisher nothing, not
even that it dropped. `XPUB_NODROP` would report it, but for every send while any one
subscriber's queue is full, so healthy subscribers would lose events too; and a notice
on the topic would reach every subscriber of it and queue behind the same full pipe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
from collections.abc import Callable
from typing import Any

import zmq

from ctxd.daemon.servers.zmq_frames import SocketPump, send_now
from ctxd.protocol.codec import packb
from ctxd.protocol.envelope import PROBE_METHOD, PROBE_PREFIX, SESSION_PREFIX, session_topic

log = logging.getLogger("ctxd.servers.zmq")

# a topic naming one session the daemon made (ids.py): a subscription is a prefix, and no
# other id of that form starts with this one; any other topic may take many sessions
ONE_SESSION = re.compile(rb"session/ses_[0-9a-f]{20}")


def topic_session(topic: bytes) -> str | None:
    """The one session a topic takes the events of, or None when it may take many."""
    if ONE_SESSION.fullmatch(topic):
        return topic[len(SESSION_PREFIX):].decode()
    return None


class EventPublisher:
    """Publishes on `pub` from the loop that owns it; answers subscription probes."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, pub: zmq.Socket[Any], stats: dict[str, int]
    ) -> None:
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._pub: zmq.Socket[Any] | None = pub
        self.stats = stats
        self._pump = SocketPump(loop, pub, self._on_subscription, "XPUB")
        # the topics some subscriber holds (probes aside)
        self._topics: set[bytes] = set()
        # told of each topic that comes or goes
        self.on_topic: Callable[[bytes], None] | None = None

    def start(self) -> None:
        self._pump.start()

    def close(self) -> None:
        self._pump.close()
        self._pub = None
        self._topics.clear()

    def watches(self, session_id: str) -> bool:
        """Whether a subscriber would receive the session's events: one subscribed to a
        prefix of its topic (the topic itself, `session/` for every session, or all)."""
        topics = self._topics
        if not topics:
            return False
        topic = session_topic(session_id)
        return any(topic[:i] in topics for i in range(len(topic) + 1))

    def watches_everything(self) -> bool:
        """Whether a subscriber holds a topic that may take many sessions' events."""
        return any(topic_session(t) is None for t in self._topics)

    def publish(self, session_id: str, method: str, params: dict[str, Any]) -> None:
        """Send one event to the session's subscribers; never blocks (drops at the HWM)."""
        if self._pub is None:
            return
        if threading.get_ident() != self._loop_thread:
            # ZeroMQ sockets are not thread-safe: hop onto the loop that owns them.
            try:
                self._loop.call_soon_threadsafe(self.publish, session_id, method, params)
            except RuntimeError:  # the loop is already closed: the server is gone
                self.stats["events_dropped"] += 1
            return
        try:
            payload = packb({"method": method, "params": params})
        except Exception:
            log.exception("event %s for session %s cannot be encoded", method, session_id)
            self.stats["events_dropped"] += 1
            return
        try:
            send_now(self._pub, [session_topic(session_id), payload], self._pump)
        except zmq.Again:
            self.stats["events_dropped"] += 1
            log.warning("event queue full: dropped %s for session %s", method, session_id)
        except zmq.ZMQError as exc:
            self.stats["events_dropped"] += 1
            log.warning("could not publish %s: %s", method, exc)
        else:
            self.stats["events_published"] += 1

    def _on_subscription(self, frames: list[bytes]) -> None:
        """Note the topics subscribed; answer `probe/...` subscriptions so subscribers
        know theirs are in effect."""
        pub = self._pub
        msg = frames[0] if frames else b""
        if pub is None or not msg or msg[0] not in (0, 1):
            return
        if not msg[1:].startswith(PROBE_PREFIX):
            if msg[0] == 1:
                self._topics.add(msg[1:])
            else:
                self._topics.discard(msg[1:])
            if self.on_topic is not None:
                self.on_topic(msg[1:])
            return
        if msg[0] != 1:
            return
        topic = msg[1:]
        payload = packb({"method": PROBE_METHOD, "params": {"topic": topic.decode("latin-1")}})
        with contextlib.suppress(zmq.ZMQError):
            send_now(pub, [topic, payload], self._pump)
