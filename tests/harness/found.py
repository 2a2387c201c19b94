"""Two checks found along the way by the crash harness, kept as functions that raise
AssertionError: tests/test_crash.py runs them, bench/soak.py reports them."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from ctxd.daemon.tokens import TokenCounter
from ctxd.protocol.errors import CtxdError
from tests.harness.image import check_context_api
from tests.harness.talk import LoggedDaemon

# ---------------------------------------------------------------- found along the way
# Both were found by the crash checks and fixed; tests/test_crash.py keeps them fixed.


def late_tool_result_keeps_its_call(tmp_path: Path, meanwhile: str) -> None:
    """Another client of the session talks while a tool runs, then a compaction runs:
    the call may leave the context only if its result can no longer be appended."""
    d = LoggedDaemon(tmp_path).start()
    try:
        with d.client("jsonrpc") as agent, d.client("zmq") as other:
            sid = agent.call("session/create", {})["sessionId"]
            for i in range(5):
                agent.call(
                    "messages/append",
                    {
                        "sessionId": sid,
                        "messages": [
                            {"role": "user", "content": f"question {i}"},
                            {"role": "assistant", "content": f"answer {i}"},
                        ],
                    },
                )
            agent.call(
                "messages/append",
                {
                    "sessionId": sid,
                    "messages": [
                        {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {
                                    "id": "call_slow",
                                    "type": "function",
                                    "function": {"name": "run_tests", "arguments": "{}"},
                                }
                            ],
                        }
                    ],
                },
            )
            for i in range(30):
                other.call(
                    "messages/append",
                    {
                        "sessionId": sid,
                        "messages": [
                            {"role": meanwhile, "content": f"meanwhile {i}"},
                            {"role": "assistant", "content": f"noted {i}"},
                        ],
                    },
                )
            other.call("context/compact", {"sessionId": sid, "force": True})
            try:
                agent.call(
                    "messages/append",
                    {
                        "sessionId": sid,
                        "messages": [
                            {"role": "tool", "tool_call_id": "call_slow", "content": "42 passed"}
                        ],
                    },
                )
                accepted = True
            except CtxdError:
                accepted = False  # the call was abandoned: refusing its result is right
            problems: list[str] = []
            check_context_api(agent, sid, TokenCounter(), problems.append)
            assert problems == []
            if meanwhile == "assistant":
                # nobody abandoned the call: it stayed in context and its result came in
                assert accepted
    finally:
        d.stop()


def closing_a_client_fails_its_calls(tmp_path: Path) -> None:
    """The kill protocol above relies on it: a call waiting for a dead daemon ends with
    ConnectionError when another thread closes the client."""
    d = LoggedDaemon(tmp_path).start()
    c = d.client("zmq")
    sid = c.call("session/create", {})["sessionId"]
    d.kill()
    raised: list[BaseException] = []

    def call() -> None:
        try:
            c.call("context/status", {"sessionId": sid})
        except BaseException as exc:
            raised.append(exc)

    t = threading.Thread(target=call)
    t.start()
    time.sleep(0.5)  # the send now waits for a daemon that is gone
    c.close()
    t.join(10)
    assert len(raised) == 1
    assert isinstance(raised[0], ConnectionError), repr(raised[0])
