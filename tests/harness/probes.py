"""What the soak and stuck-client harnesses measure a daemon with: its resident memory
sampled on a thread, and `context/status` round trips timed by a client in a process of
its own (so the harness's threads do not distort what it measures).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ctxd.clients.client import Client, connect, connect_async
from tests.harness.talk import LoggedDaemon, as_wire

# the repository root, where the child processes import this package from
ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024


def client_for(d: LoggedDaemon, wire: str, timeout: float = 60) -> Client:
    return connect(connection_file=d.connection_file, wire=as_wire(wire), timeout=timeout)


class RssSampler:
    """Samples the daemon's VmRSS on a thread, so growth over time can be judged."""

    def __init__(self, d: LoggedDaemon, period: float = 0.25) -> None:
        self.d = d
        self.period = period
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self.t0 = time.monotonic()

    def __enter__(self) -> RssSampler:
        self.t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.monotonic() - self.t0, self.d.status_kib("VmRSS")))
            except (OSError, KeyError):
                return
            self._stop.wait(self.period)

    def peak(self, start: float = 0.0, end: float = float("inf")) -> int:
        return max((kib for t, kib in self.samples if start <= t < end), default=0)


class Child:
    """A function of this module run in a separate Python process (its own interpreter
    lock, so this process's threads do not distort what it measures). It runs until a
    line arrives on its stdin and prints one JSON object as its last line."""

    def __init__(self, d: LoggedDaemon, function: str, *args: str) -> None:
        code = (
            "import sys; sys.path.insert(0, sys.argv[1]); "
            "from tests.harness import probes, stuck; "
            f"(getattr(probes, {function!r}, None) or getattr(stuck, {function!r}))(sys.argv[2:])"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, str(ROOT), str(d.connection_file), *args],
            env=d.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def finish(self, timeout: float = 60) -> dict[str, Any]:
        out, err = self.proc.communicate("stop\n", timeout=timeout)
        try:
            report: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return {"errors": [f"child process failed: {err[-2000:]}"]}
        return report


async def until_stdin(stop: asyncio.Event) -> None:
    asyncio.get_running_loop().add_reader(sys.stdin.fileno(), stop.set)


class RoundTrips:
    """A client on its own session, in its own process, timing `context/status`."""

    def __init__(self, d: LoggedDaemon, wire: str, period: float = 0.05) -> None:
        self.d, self.wire, self.period = d, wire, period
        self.times: list[float] = []
        self.errors: list[str] = []

    def __enter__(self) -> RoundTrips:
        self.child = Child(self.d, "round_trips_main", self.wire, str(self.period))
        return self

    def __exit__(self, *exc: object) -> None:
        report = self.child.finish()
        self.times = report.get("times", [])
        self.errors = report.get("errors", [])

    def summary(self) -> dict[str, float]:
        if not self.times:
            return {"n": 0}
        ordered = sorted(self.times)
        return {
            "n": len(ordered),
            "median_ms": round(statistics.median(ordered) * 1000, 1),
            "p99_ms": round(ordered[max(0, int(len(ordered) * 0.99) - 1)] * 1000, 1),
            "max_ms": round(ordered[-1] * 1000, 1),
        }


def round_trips_main(argv: list[str]) -> None:
    connection_file, wire, period = argv
    times: list[float] = []
    errors: list[str] = []

    async def main() -> None:
        stop = asyncio.Event()
        await until_stdin(stop)
        async with await connect_async(connection_file=connection_file, wire=as_wire(wire)) as c:
            sid = (await c.call("session/create", {"title": "probe"}))["sessionId"]
            while not stop.is_set():
                t = time.monotonic()
                try:
                    await c.call("context/status", {"sessionId": sid})
                except Exception as exc:
                    errors.append(repr(exc))
                    return
                times.append(time.monotonic() - t)
                try:
                    await asyncio.wait_for(stop.wait(), float(period))
                except TimeoutError:
                    pass

    asyncio.run(main())
    print(json.dumps({"times": times, "errors": errors}), flush=True)
