"""`workspace/symbol` of `ctxd lsp` over a 100,000-message archive: p50 and p90.

    python bench/bench_lsp.py                      # 100k messages, 200 queries per mode
    python bench/bench_lsp.py --messages 20000     # quicker
    python bench/bench_lsp.py --out /tmp/lsp.md

A real daemon on a scratch data dir is filled with the seeded agent histories of
`workload.py` (10 sessions, English and Chinese), then `ctxd lsp` runs as its own process
driven by pygls's LanguageClient over stdio, as an editor drives it. Queries rotate over
the workload's marker words (rare, common, a 2-character Chinese word, a 7-character
Chinese phrase) and plain words. Three ways, each timed per request on the caller's side:

- `archive/search` straight from the Python client (limit 100): the floor;
- `workspace/symbol`, client with `workspace/textDocumentContent` (ctxd: URIs): one search
  and a symbol per hit (up to 100), no document read;
- `workspace/symbol`, client without it (file mode): up to 50 hits, and each hit's
  transcript page written under the cache dir before the answer (the first time a page
  is needed; later queries find it written).

Every query goes to the three in turn (so the machine's load weighs on all alike) until
the query count or the time budget is reached. The times include the pygls client's own
decoding of the reply into lsprotocol objects (a few ms for 100 symbols), which an
editor's native JSON decoder does faster. Results: bench/results/lsp.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from helpers import DaemonProcess  # noqa: E402
from lsp_harness import Editor  # noqa: E402
from workload import COMMON_WORD, RARE_WORD, ZH_PHRASE, ZH_WORD, turns  # noqa: E402

from ctxd.clients.client import connect_async  # noqa: E402

QUERIES = [RARE_WORD, COMMON_WORD, ZH_WORD, ZH_PHRASE, "database migration", "timeout retry",
           "broken parser", "上下文", "stale cache", "deploy"]
SESSIONS = 10
BATCH = 500


def fill(daemon: DaemonProcess, messages: int) -> float:
    t0 = time.perf_counter()
    with daemon.client("jsonrpc", timeout=600) as c:
        per = messages // SESSIONS
        for s in range(SESSIONS):
            sid = c.create_session(title=f"bench {s}")["sessionId"]
            batch: list[dict[str, Any]] = []
            for turn in turns(per, seed=s):
                batch.extend(turn)
                if len(batch) >= BATCH:
                    c.append(sid, batch)
                    batch = []
            if batch:
                c.append(sid, batch)
        total = sum(s["status"]["archiveMessages"]
                    for s in c.list_sessions(limit=100)["sessions"])
    print(f"filled {total} messages in {time.perf_counter() - t0:.0f} s", flush=True)
    return float(total)


def stats(name: str, times: list[float], hits: list[int]) -> list[str]:
    times_ms = sorted(t * 1000 for t in times)
    p90 = times_ms[min(len(times_ms) - 1, int(len(times_ms) * 0.9))]
    return [name, str(len(times_ms)), f"{statistics.median(times_ms):.1f}", f"{p90:.1f}",
            f"{times_ms[-1]:.1f}", f"{statistics.mean(hits):.0f}"]


async def measure(daemon: DaemonProcess, root: Path, n: int, budget: float) -> list[list[str]]:
    """Each query goes to the three ways in turn, so the machine's load weighs on all alike."""
    client = await connect_async(connection_file=daemon.connection_file, wire="jsonrpc")
    virtual, files = Editor(virtual_docs=True), Editor(virtual_docs=False)
    await virtual.start(daemon, root / "c1")
    await files.start(daemon, root / "c2")
    await virtual.connected()
    await files.connected()
    ways: list[tuple[str, Any]] = [
        ("archive/search (Python client, floor)",
         lambda q: client.search(q, limit=100)),
        ("workspace/symbol, ctxd: URIs", virtual.symbols),
        ("workspace/symbol, cache files (pages written)", files.symbols),
    ]
    times: dict[str, list[float]] = {name: [] for name, _ in ways}
    hits: dict[str, list[int]] = {name: [] for name, _ in ways}
    end = time.monotonic() + budget
    try:
        for i in range(n):
            if time.monotonic() > end:
                break
            query = QUERIES[i % len(QUERIES)]
            for name, way in ways:
                t0 = time.perf_counter()
                got = await way(query)
                times[name].append(time.perf_counter() - t0)
                hits[name].append(len(got["hits"]) if isinstance(got, dict) else len(got))
    finally:
        await client.close()
        await virtual.stop()
        await files.stop()
    return [stats(name, times[name], hits[name]) for name, _ in ways]


def machine() -> list[str]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0, 0, 0)
    return [f"- date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
            f"- machine: {platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
            f"- Python {platform.python_version()}; load average {load[0]:.1f} "
            f"(a shared machine: other work ran beside this)"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=200, help="rounds over the three ways")
    ap.add_argument("--budget", type=float, default=300.0, help="seconds for all queries")
    ap.add_argument("--tmp", help="scratch directory (default: the system's)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "lsp.md")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        root = Path(tmp)
        daemon = DaemonProcess(root, env={"CTXD_LOG_LEVEL": "WARNING"}).start()
        try:
            total = fill(daemon, args.messages)
            rows = asyncio.run(measure(daemon, root, args.queries, args.budget))
        finally:
            daemon.stop()
    head = ["way", "queries", "p50 ms", "p90 ms", "max ms", "hits per query"]
    lines = ["# `ctxd lsp`: workspace/symbol over the archive", "",
             f"{total:.0f} archived messages in {SESSIONS} sessions (`bench/workload.py`), "
             f"queries rotating over {len(QUERIES)} words and phrases (English and Chinese). "
             "`python bench/bench_lsp.py`.", "", *machine(), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    report = "\n".join(lines) + "\n"
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)


if __name__ == "__main__":
    main()
