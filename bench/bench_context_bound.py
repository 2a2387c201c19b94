"""A context larger than any reply: how long, how much memory, how long others wait.

    python -m bench.bench_context_bound --before DIR --messages 10

A session gets `--messages` messages of 7.5 MB (one append each); the daemon is then
restarted, so nothing of the tail is in memory, and one client asks for `context/get`
of it (above the reply limit, `max_request_bytes`, 64 MiB by default) while a ZeroMQ and
a TCP client call `context/status` on another session every 20 ms. A row gives the
request's time, its error code, how much the daemon's peak memory grew, and each small
client's longest wait. `DIR`: another checkout, as for bench_large.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_attacks import Rpc, _words
from bench.bench_large import TIMEOUT, pollers, start


def peak_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def one(root: Path, code: Path | None, count: int) -> dict[str, Any]:
    root.mkdir(parents=True)
    d = start(root, code)
    text = _words(7_500_000, 3)
    try:
        rpc = Rpc(d.info())
        rpc.sock.settimeout(TIMEOUT)
        sid = rpc.call("session/create", {})["result"]["sessionId"]
        for i in range(count):
            msg = {"role": "user", "content": text[i * 997:] + text[:i * 997]}
            assert "result" in rpc.call("messages/append", {"sessionId": sid, "messages": [msg]})
        rpc.close()
    finally:
        d.stop(timeout=TIMEOUT)
    shutil.rmtree(root / "code", ignore_errors=True)  # start() lays it out again
    d = start(root, code)
    try:
        assert d.proc is not None
        rpc = Rpc(d.info())
        rpc.sock.settimeout(TIMEOUT)
        quiet = rpc.call("session/create", {})["result"]["sessionId"]
        before = peak_kib(d.proc.pid)
        polls = pollers(d, quiet)
        with polls[0], polls[1]:
            t0 = time.perf_counter()
            reply = rpc.call("context/get", {"sessionId": sid})
            secs = time.perf_counter() - t0
        rpc.close()
        return {"seconds": secs, "code": reply.get("error", {}).get("code"),
                "peak_growth_mb": (peak_kib(d.proc.pid) - before) / 1024,
                "zmq": polls[0].summary(), "tcp": polls[1].summary()}
    finally:
        d.stop(timeout=TIMEOUT)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", type=Path)
    ap.add_argument("--messages", type=int, default=10)
    args = ap.parse_args()
    sides: list[tuple[str, Path | None]] = [("after" if args.before else "this", None)]
    if args.before is not None:
        sides.insert(0, ("before", args.before.resolve()))
    with tempfile.TemporaryDirectory(prefix="ctxd-bound-") as tmp:
        for label, code in sides:
            row = one(Path(tmp) / label, code, args.messages)
            print(json.dumps({label: row}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
