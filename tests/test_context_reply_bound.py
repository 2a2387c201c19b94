"""A token holder asks for a context larger than any reply can be.

A real daemon process with a reply limit of 1 MiB (`max_request_bytes`), a session whose
tail holds 14 MiB of messages stored before the daemon started (so nothing of it is in
memory). `context/get`, and an append or a finish with `returnContext`, are refused with
-32015 and a message naming what to ask for instead, without the daemon reading the tail
(its peak memory does not grow by the tail's size), while another client's
`context/status` is answered throughout.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import DaemonProcess
from test_attacks import PAYLOAD_TOO_LARGE, TIMEOUT, Tcp, error_code

LIMIT = 1 << 20
MESSAGE_CHARS = 900 * 1024
MESSAGES = 16


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc/PID/status")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, str]]:
    root = tmp_path_factory.mktemp("reply-bound")
    path = root / "ctxd.toml"
    # no automatic compaction: the tail stays whole
    path.write_text(f"max_request_bytes = {LIMIT}\nmax_message_bytes = {LIMIT}\n"
                    "[compaction]\nmax_active_tokens = 1000000000\n"
                    "max_active_messages = 100000\n")
    d = DaemonProcess(root, "--config", str(path)).start()
    with d.client("zmq", timeout=TIMEOUT) as c:
        sid = c.call("session/create", {"title": "big tail"})["sessionId"]
        for i in range(MESSAGES):
            words = " ".join(f"w{i}x{j}" for j in range(MESSAGE_CHARS // 8))
            text = f"part {i} {words}"[:MESSAGE_CHARS]
            c.call("messages/append", {"sessionId": sid,
                                       "messages": [{"role": "user", "content": text}]})
    assert d.stop() == 0
    # a daemon that has never read the session: its tail is on disk only
    d = DaemonProcess(root, "--config", str(path)).start()
    try:
        yield d, sid
        assert d.proc is not None and d.proc.poll() is None
    finally:
        assert d.stop() == 0


def statuses_meanwhile(d: DaemonProcess, sid: str, stop: threading.Event,
                       answers: list[Any]) -> threading.Thread:
    """Another client asking for `context/status` until `stop`, its answers in `answers`."""

    def ask() -> None:
        with d.client("zmq", timeout=TIMEOUT) as c:
            while True:
                answers.append(c.call("context/status", {"sessionId": sid}))
                if stop.wait(0.01):
                    return

    t = threading.Thread(target=ask, daemon=True)
    t.start()
    return t


def refused(reply: dict[str, Any]) -> dict[str, Any]:
    assert error_code(reply) == PAYLOAD_TOO_LARGE, str(reply)[:300]
    err = reply["error"]
    # it names what to ask for instead, and the size that did not fit
    assert "archive/read" in err["message"] and "context/compact" in err["message"], err
    assert err["data"]["limit"] == LIMIT
    assert err["data"]["size"] > MESSAGES * MESSAGE_CHARS
    return err


def test_context_get_of_a_tail_above_the_reply_limit_is_refused_up_front(
    daemon: tuple[DaemonProcess, str],
) -> None:
    d, sid = daemon
    assert d.proc is not None
    info = d.info()
    stop, answers = threading.Event(), []
    other = statuses_meanwhile(d, sid, stop, answers)
    conn = Tcp(info)
    try:
        conn.login(info["token"])
        before = peak_rss_kib(d.proc.pid)
        for _ in range(3):
            err = refused(conn.call("context/get", {"sessionId": sid}))
            assert err["data"]["tailFromId"] is not None
        # a budget does not load the tail either
        refused(conn.call("context/get", {"sessionId": sid, "budgetTokens": 1000}))
        grown = peak_rss_kib(d.proc.pid) - before
        # the tail is 14 MiB: reading it once would have raised the peak by more than that
        assert grown * 1024 < MESSAGES * MESSAGE_CHARS // 2, grown
        # the page the refusal points at is served
        page = conn.call("archive/read", {"sessionId": sid, "afterId": 0, "maxBytes": LIMIT // 2})
        assert len(page["result"]["messages"]) == 1
    finally:
        stop.set()
        other.join(TIMEOUT)
        conn.close()
    assert answers and all(a["sessionId"] == sid for a in answers), answers[:2]


def test_return_context_above_the_limit_is_refused_and_names_the_stored_batch(
    daemon: tuple[DaemonProcess, str],
) -> None:
    d, sid = daemon
    info = d.info()
    conn = Tcp(info)
    try:
        conn.login(info["token"])
        reply = conn.call("messages/append", {
            "sessionId": sid, "returnContext": True,
            "messages": [{"role": "user", "content": "one more"}],
        })
        err = refused(reply)
        ids = err["data"]["appended"]["messageIds"]
        assert len(ids) == 1 and "batch was stored" in err["message"]
        # the append itself happened
        page = conn.call("archive/read", {"sessionId": sid, "afterId": ids[0] - 1})
        assert page["result"]["messages"][0]["content"] == "one more"
        run = conn.call("run/start", {"sessionId": sid})["result"]["runId"]
        reply = conn.call("run/finish", {
            "runId": run, "outcome": "completed", "returnContext": True,
            "messages": [{"role": "assistant", "content": "finished"}],
        })
        assert refused(reply)["data"]["appended"]["messageIds"]
        status = conn.call("context/status", {"sessionId": sid})["result"]
        assert status["activeMessages"] == MESSAGES + 2
    finally:
        conn.close()
