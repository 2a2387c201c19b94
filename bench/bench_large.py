"""Large batches and replies: how long do other clients wait meanwhile?

    python -m bench.bench_large                      # this checkout only
    python -m bench.bench_large --before DIR         # DIR's code first, then this one's
    python -m bench.bench_large --before DIR --rounds 2 --mb 40

`DIR` is another checkout of ctxd (for example `git archive main | tar -x -C DIR`): its
daemon runs from its own files, the clients from this checkout's. With `--before`, each
round runs every case on DIR's daemon, then on this checkout's, so load on a shared
machine hits both alike.

One client sends a batch of eight messages (`--mb` megabytes in all) as a plain
`messages/append`, as `messages/append` with `returnContext`, and as `run/finish` with
`messages`; then reads it back as one `context/get` and one `archive/read` page.
Meanwhile a ZeroMQ client and a JSON-RPC TCP client each call `context/status` on another
session every 20 ms. A row gives the large request's time and each small client's
longest wait (and median, and how many calls it made).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.bench_attacks import Rpc, _words
from tests.helpers import DaemonProcess

TIMEOUT = 600.0
MESSAGES = 8


def farm(checkout: Path, root: Path) -> Path:
    """A directory on PYTHONPATH whose `ctxd` package is `checkout`'s code (the same
    mapping as pyproject.toml's package-dir). A path entry wins over the editable
    install's finder, which comes last."""
    pkg = root / "ctxd"
    pkg.mkdir(parents=True)
    for name in os.listdir(checkout / "ctxd_pkg"):
        (pkg / name).symlink_to(checkout / "ctxd_pkg" / name)
    for sub in ("daemon", "protocol", "clients"):
        (pkg / sub).symlink_to(checkout / sub)
    return root


def start(root: Path, code: Path | None) -> DaemonProcess:
    config = root / "ctxd.toml"
    # no auto-compaction: the rows measure the request, not a compaction it triggers
    config.write_text("[compaction]\nmax_active_messages = 1000000\n"
                      "max_active_tokens = 1000000000\n")
    env = {"PYTHONPATH": str(farm(code, root / "code"))} if code is not None else {}
    return DaemonProcess(root, "--config", str(config), env=env).start()


class StatusPoller:
    """`context/status` every 20 ms on one wire, in a thread; records each wait."""

    def __init__(self, call: Callable[[], Any], close: Callable[[], Any]) -> None:
        self.call, self.close = call, close
        self.times: list[float] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            try:
                self.call()
            except Exception:
                self.errors += 1
            self.times.append(time.perf_counter() - t0)
            time.sleep(0.02)

    def __enter__(self) -> StatusPoller:
        self._thread.start()
        time.sleep(0.2)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(TIMEOUT)
        self.close()

    def summary(self) -> dict[str, Any]:
        ms = sorted(t * 1000 for t in self.times) or [float("nan")]
        return {"max_ms": ms[-1], "median_ms": statistics.median(ms), "calls": len(self.times),
                "errors": self.errors}


def pollers(d: DaemonProcess, quiet_sid: str) -> list[StatusPoller]:
    info = d.info()
    zc = d.client("zmq", timeout=TIMEOUT)
    tcp = Rpc(info)
    tcp.sock.settimeout(TIMEOUT)
    params = {"sessionId": quiet_sid}

    def tcp_call() -> None:
        assert "result" in tcp.call("context/status", params)

    return [StatusPoller(lambda: zc.call("context/status", params), zc.close),
            StatusPoller(tcp_call, tcp.close)]


def run_cases(d: DaemonProcess, messages: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    info = d.info()
    big = Rpc(info)
    big.sock.settimeout(TIMEOUT)
    quiet = big.call("session/create", {})["result"]["sessionId"]
    out: dict[str, dict[str, Any]] = {}

    def case(name: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
        polls = pollers(d, quiet)
        with polls[0], polls[1]:
            t0 = time.perf_counter()
            reply = big.call(method, params)
            secs = time.perf_counter() - t0
        assert "result" in reply, str(reply)[:300]
        out[name] = {"seconds": secs, "zmq": polls[0].summary(), "tcp": polls[1].summary()}
        return reply["result"]  # type: ignore[no-any-return]

    sid = big.call("session/create", {})["result"]["sessionId"]
    case("messages/append", "messages/append", {"sessionId": sid, "messages": messages})
    sid2 = big.call("session/create", {})["result"]["sessionId"]
    got = case("messages/append returnContext", "messages/append",
               {"sessionId": sid2, "messages": messages, "returnContext": True})
    assert len(got["context"]["messages"]) == len(messages)
    sid3 = big.call("session/create", {})["result"]["sessionId"]
    run = big.call("run/start", {"sessionId": sid3})["result"]["runId"]
    case("run/finish messages", "run/finish",
         {"runId": run, "outcome": "completed", "messages": messages})
    got = case("context/get", "context/get", {"sessionId": sid})
    assert len(got["messages"]) == len(messages)
    got = case("archive/read", "archive/read",
               {"sessionId": sid, "limit": MESSAGES, "maxBytes": 64 << 20})
    assert len(got["messages"]) == len(messages)
    big.close()
    return out


def one(tmp: Path, label: str, code: Path | None, messages: list[dict[str, Any]]) -> Any:
    root = tmp / f"{label}-{time.monotonic_ns()}"
    root.mkdir()
    d = start(root, code)
    try:
        return run_cases(d, messages)
    finally:
        d.stop(timeout=TIMEOUT)


def table(results: dict[str, list[dict[str, dict[str, Any]]]]) -> str:
    lines = ["| Request | Code | Request s | ZeroMQ status: longest wait ms (median) | "
             "TCP status: longest wait ms (median) |", "|---|---|---|---|---|"]
    cases = list(next(iter(results.values()))[0])
    for name in cases:
        for label, runs in results.items():
            rows = [r[name] for r in runs]

            def med(key: str, wire: str | None = None, rows: Any = rows) -> float:
                vals = [r[wire][key] if wire else r[key] for r in rows]
                return statistics.median(vals)

            lines.append(
                f"| {name} | {label} | {med('seconds'):.1f} | "
                f"{med('max_ms', 'zmq'):,.0f} ({med('median_ms', 'zmq'):.1f}) | "
                f"{med('max_ms', 'tcp'):,.0f} ({med('median_ms', 'tcp'):.1f}) |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", type=Path, help="another checkout to run first, for comparison")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--mb", type=float, default=40.0, help="size of the batch, megabytes")
    ap.add_argument("--out", type=Path, help="also write the table here (e.g. "
                    "bench/results/large.md)")
    args = ap.parse_args()
    per = int(args.mb * 1e6 / MESSAGES)
    text = _words(per, 7)
    messages = [{"role": "user", "content": text[i * 997:] + text[:i * 997]}
                for i in range(MESSAGES)]
    sides: list[tuple[str, Path | None]] = [("after" if args.before else "this", None)]
    if args.before is not None:
        sides.insert(0, ("before", args.before.resolve()))
    results: dict[str, list[dict[str, dict[str, Any]]]] = {label: [] for label, _ in sides}
    with tempfile.TemporaryDirectory(prefix="ctxd-large-") as tmp:
        for _ in range(args.rounds):
            for label, code in sides:
                results[label].append(one(Path(tmp), label, code, messages))
                print(json.dumps({label: results[label][-1]}), flush=True)
    head = (f"{MESSAGES} messages, {args.mb:g} MB in all; {args.rounds} round(s), medians; "
            f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores, Python "
            f"{platform.python_version()}; measured {datetime.date.today()} by `python -m "
            f"bench.bench_large{' --before DIR' if args.before else ''} --mb {args.mb:g} "
            f"--rounds {args.rounds}`")
    print(f"\n{head}\n\n{table(results)}")
    if args.out is not None:
        args.out.write_text(f"# Large batches and replies\n\n{head}\n\n{table(results)}\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
