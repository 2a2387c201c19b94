"""Broad searches against a large archive: what they cost, and what other clients see.

Builds an archive in-process (each message holds 40 of 64 common words, so a query of
those words matches everything and no message has them all), then runs a real
`ctxd serve` on it and measures, over the wire:

* the heaviest plain query allowed (64 terms, one of them absent, so the ranked
  any-word fallback runs over every message), with the default budget and unbounded;
* the round trip of `context/status` on another connection while that query runs,
  against the same round trip with no search running;
* a 5,000-word `search_past_messages` call and a 4,096-character `archive/search`
  (refused at the term cap), a 64-term all-words query and a narrow one.

    python bench/bench_search.py              # 200,000 messages (about a minute)
    python bench/bench_search.py --messages 50000 --out /tmp/search.md

Results go to bench/results/search.md (with machine information); medians are quoted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import apsw

from ctxd.clients.client import connect
from ctxd.daemon.config import Config
from ctxd.daemon.engine import Engine
from ctxd.protocol.errors import CtxdError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from helpers import wait_for_connection_file  # noqa: E402

WORDS = [f"common{i}" for i in range(64)]
BROAD = " ".join(WORDS[:63]) + " zebracorn"
ALL64 = " ".join(WORDS[:64])
RESULTS = Path(__file__).resolve().parent / "results" / "search.md"


def build(data_dir: Path, n: int) -> tuple[str, float]:
    started = time.perf_counter()
    engine = Engine(Config(data_dir=data_dir))
    sid = engine.create_session(session_id="big").session_id
    rnd = random.Random(7)
    for start in range(0, n, 5000):
        engine.append(sid, [
            {"role": "user", "content": " ".join(rnd.sample(WORDS, 40)) + f" order {start + i}"}
            for i in range(min(5000, n - start))])
    engine.append(sid, [{"role": "user", "content": "the quokka arrived"}])
    engine.close()
    return sid, time.perf_counter() - started


class Daemon:
    def __init__(self, root: Path, data_dir: Path, budget: float | None) -> None:
        self.conn_file = root / "run" / "ctxd.json"
        self.conn_file.unlink(missing_ok=True)
        cfg = root / "bench.toml"
        cfg.write_text(f"search_budget_seconds = {budget}\n" if budget is not None else "")
        env = {**os.environ, "CTXD_RUNTIME_DIR": str(root / "run"), "CTXD_LOG_LEVEL": "WARNING"}
        self.log = open(root / "daemon.log", "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ctxd.daemon", "serve", "--data-dir", str(data_dir),
             "--connection-file", str(self.conn_file), "--config", str(cfg)],
            env=env, stdout=self.log, stderr=subprocess.STDOUT)
        wait_for_connection_file(self.conn_file, self.proc, root / "daemon.log", 30)

    def client(self, wire: str = "zmq") -> Any:
        return connect(connection_file=self.conn_file, wire=wire, timeout=900)  # type: ignore[arg-type]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)
        self.log.close()


def timed(c: Any, method: str, params: dict[str, Any]) -> tuple[float, str]:
    started = time.perf_counter()
    try:
        result = c.call(method, params)
        outcome = f"{len(result.get('hits', []))} hits, matched {result.get('matched')}" \
            if method == "archive/search" else "answered"
    except CtxdError as exc:
        outcome = f"error {int(exc.code)}"
    return time.perf_counter() - started, outcome


def round_trips_while(d: Daemon, sid: str, query: str) -> dict[str, Any]:
    """Run `query` on one connection; measure context/status on another until it ends."""
    done = threading.Event()
    out: dict[str, Any] = {}

    def search() -> None:
        with d.client("jsonrpc") as c:
            out["seconds"], out["outcome"] = timed(c, "archive/search",
                                                   {"query": query, "limit": 5})
        done.set()

    trips: list[float] = []
    with d.client("websocket") as other:
        thread = threading.Thread(target=search)
        thread.start()
        while not done.is_set():
            started = time.perf_counter()
            other.call("context/status", {"sessionId": sid})
            if not done.is_set():
                trips.append(time.perf_counter() - started)
        thread.join()
    out["trips"] = trips
    return out


def idle_round_trips(d: Daemon, sid: str, n: int = 300) -> list[float]:
    trips = []
    with d.client("websocket") as c:
        for _ in range(n):
            started = time.perf_counter()
            c.call("context/status", {"sessionId": sid})
            trips.append(time.perf_counter() - started)
    return trips


def ms(x: float) -> str:
    return f"{x * 1000:,.1f} ms" if x < 10 else f"{x:,.1f} s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000, help="archive size")
    ap.add_argument("--repeats", type=int, default=3, help="runs per measure (median)")
    ap.add_argument("--tmp", type=Path, help="scratch dir (default: a temporary dir)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="markdown report")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ctxd-bench-search-", dir=args.tmp))
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    try:
        data = root / "data"
        sid, build_s = build(data, args.messages)
        say("# Broad searches on a large archive")
        say()
        say("|  |  |\n|---|---|")
        say(f"| Date (UTC) | {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} |")
        say(f"| Cores | {os.cpu_count()} |")
        say(f"| Python | {platform.python_version()} |")
        say(f"| SQLite | {apsw.sqlite_lib_version()} |")
        say(f"| Load average at start | {' '.join(f'{x:.2f}' for x in os.getloadavg())} |")
        say()
        say(f"Run with `python bench/bench_search.py --messages {args.messages}`: "
            f"{args.messages:,} messages in one session (built in {build_s:.1f} s), each "
            "with 40 of 64 common words; a real `ctxd serve` on it; medians of "
            f"{args.repeats} runs. Round trips are `context/status` over WebSocket on "
            "a second connection while the search runs on a JSON-RPC TCP connection.")
        say()
        rows = []
        for budget, label in ((None, "default budget (2 s)"), (600.0, "budget 600 s")):
            d = Daemon(root, data, budget)
            try:
                idle = idle_round_trips(d, sid) if budget is None else []
                runs = [round_trips_while(d, sid, BROAD) for _ in range(args.repeats)]
                secs = statistics.median(r["seconds"] for r in runs)
                trips = [t for r in runs for t in r["trips"]]
                rows.append((f"64-term query, any-word fallback over every message, {label}",
                             ms(secs), runs[0]["outcome"], len(trips),
                             ms(statistics.median(trips)) if trips else "-",
                             ms(max(trips)) if trips else "-"))
                if budget is None:
                    rows.insert(0, ("no search running (baseline)", "-", "-", len(idle),
                                    ms(statistics.median(idle)), ms(max(idle))))
                    with d.client("zmq") as c:
                        many = " ".join(f"w{i}" for i in range(5000))
                        for name, method, params in (
                            ("`search_past_messages`, 5,000 words", "tools/call",
                             {"sessionId": sid, "name": "search_past_messages",
                              "arguments": {"query": many}}),
                            ("`archive/search`, 4,096 characters (2,048 words)",
                             "archive/search", {"query": many[:4096]}),
                            ("64-term all-words query (no message has all)", "archive/search",
                             {"query": ALL64}),
                            ("narrow query (`quokka`)", "archive/search", {"query": "quokka"}),
                        ):
                            got = [timed(c, method, params) for _ in range(args.repeats)]
                            rows.append((name, ms(statistics.median(g[0] for g in got)),
                                         got[0][1], "-", "-", "-"))
            finally:
                d.stop()
        say("| Search | Its time | Outcome | Round trips meanwhile | Median | Max |")
        say("|---|---|---|---|---|---|")
        for row in rows:
            say("| " + " | ".join(str(x) for x in row) + " |")
        say()
        say(f"Load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}.")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
        print(f"\nwrote {args.out}")
        print(json.dumps({"rows": rows}, default=str))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
