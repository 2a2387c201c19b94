"""The web page in Debian's headless Chromium against a real daemon with a big session.

1. First paint: a fresh browser context opens the login URL of a session with
   100,000 archived messages (the redirect, the page, its modules, the WebSocket,
   `initialize`, `session/get`, `context/get`, the newest page of `archive/read`),
   until the newest messages are on screen (`performance.mark("ctxd-ready")`).
   Chromium's first-contentful-paint is reported too. Median of `--runs` runs.
2. Scrolling back: from the newest message, scroll to the top of the transcript again
   and again until 10,000 older messages have been paged in. Every 1,000 messages the
   page is garbage-collected (DevTools) and its JS heap, DOM node count and number of
   messages in the DOM are recorded: the window keeps the DOM bounded.
3. The daemon side of the page's requests, from the Python client: the newest page
   (`archive/read` with `beforeId`) and `context/compactions` (one pass over the
   archive for the chart's sizes).

    python bench/bench_web.py                    # 100,000 messages, ~3 minutes
    python bench/bench_web.py --messages 20000   # quicker

The session is built in-process with the engine (then compacted once, as the daemon's
automatic compaction would have), then served by a `ctxd serve` process.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from playwright.sync_api import sync_playwright

from bench.bench_daemon import start_daemon
from bench.workload import turns
from ctxd.clients.client import Client
from ctxd.daemon.config import Config
from ctxd.daemon.engine import Engine
from ctxd.protocol.webpage import new_login_secret, page_url

RESULTS = Path(__file__).resolve().parent / "results"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
NEWEST = 2**53 - 1


def build(data_dir: Path, n_messages: int) -> tuple[str, float]:
    cfg = Config(data_dir=data_dir)
    engine = Engine(cfg)
    started = time.perf_counter()
    sid = engine.create_session(title="bench: 100k messages").session_id
    batch: list[dict[str, Any]] = []
    for turn in turns(n_messages, seed=7):
        batch.extend(turn)
        if len(batch) >= 1000:
            engine.append(sid, batch)
            batch = []
    if batch:
        engine.append(sid, batch)
    engine.compact_sync(sid, force=True)
    took = time.perf_counter() - started
    engine.close()
    return sid, took


def first_paint(browser: Any, url: str) -> dict[str, float]:
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    page = ctx.new_page()
    t0 = time.perf_counter()
    page.goto(url)
    page.wait_for_selector("body[data-ready=true]", timeout=60_000)
    wall = (time.perf_counter() - t0) * 1000
    marks = page.evaluate("""() => ({
        ready: performance.getEntriesByName('ctxd-ready')[0].startTime,
        fcp: (performance.getEntriesByName('first-contentful-paint')[0] || {}).startTime,
        msgs: document.querySelectorAll('#transcript .msg').length })""")
    ctx.close()
    return {"ready": marks["ready"], "fcp": marks["fcp"] or float("nan"), "wall": wall,
            "msgs": marks["msgs"]}


def scroll_back(browser: Any, url: str, target: int, budget: float) -> list[dict[str, float]]:
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    page = ctx.new_page()
    page.goto(url)
    page.wait_for_selector("body[data-ready=true]", timeout=60_000)
    cdp = ctx.new_cdp_session(page)
    cdp.send("Performance.enable")
    last = "#transcript .msg:last-child"
    newest = page.evaluate(f"Number(document.querySelector('{last}').dataset.id)")
    rows: list[dict[str, float]] = []

    def sample(back: int, page_ms: list[float]) -> None:
        cdp.send("HeapProfiler.collectGarbage")
        metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
        msgs = page.evaluate("document.querySelectorAll('#transcript .msg').length")
        rows.append({"back": back, "heap": metrics["JSHeapUsedSize"] / 2**20,
                     "nodes": metrics["Nodes"], "msgs": msgs,
                     "page_ms": statistics.median(page_ms) if page_ms else float("nan")})

    sample(0, [])
    deadline = time.monotonic() + budget
    back = 0
    next_sample = 1000
    page_ms: list[float] = []
    while back < target and time.monotonic() < deadline:
        oldest = page.evaluate("Number(document.querySelector('#transcript .msg').dataset.id)")
        t0 = time.perf_counter()
        page.evaluate("document.querySelector('#transcript-scroller').scrollTop = 0")
        while time.monotonic() < deadline:
            now = page.evaluate("Number(document.querySelector('#transcript .msg').dataset.id)")
            if now != oldest:
                break
            time.sleep(0.005)
        page_ms.append((time.perf_counter() - t0) * 1000)
        back = newest - now
        if back >= next_sample:
            sample(back, page_ms)
            page_ms = []
            next_sample += 1000
    ctx.close()
    return rows


def daemon_side(info: dict[str, Any], sid: str, runs: int) -> dict[str, float]:
    out: dict[str, list[float]] = {"newest": [], "compactions": []}
    with Client(info, "websocket") as c:
        for _ in range(runs):
            t0 = time.perf_counter()
            c.call("archive/read", {"sessionId": sid, "beforeId": NEWEST, "limit": 100})
            out["newest"].append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            c.call("context/compactions", {"sessionId": sid, "limit": 100})
            out["compactions"].append((time.perf_counter() - t0) * 1000)
    return {k: statistics.median(v) for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--back", type=int, default=10_000, help="messages to scroll back")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--budget", type=float, default=240.0, help="seconds for scrolling")
    parser.add_argument("--tmp", default=None)
    parser.add_argument("--out", type=Path, default=RESULTS / "web.md")
    args = parser.parse_args(argv)
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        root = Path(tmp)
        sid, built = build(root / "data-ctxd", args.messages)
        proc, info = start_daemon(root)
        try:
            def url() -> str:  # each browser context logs in once, with its own login
                return page_url(info["http"], new_login_secret(info["token"]), sid)

            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                first_paint(browser, url())  # warm the OS caches and the daemon's counters
                paints = [first_paint(browser, url()) for _ in range(args.runs)]
                rows = scroll_back(browser, url(), args.back, args.budget)
                browser.close()
            server = daemon_side(info, sid, 20)
        finally:
            proc.stop()

    say("# The web page")
    say()
    say(f"{datetime.date.today()} · {platform.node()} · {os.cpu_count()} cores · "
        f"Python {platform.python_version()} · Chromium (Debian, headless) · "
        f"{args.messages:,} archived messages (built and compacted in {built:.0f} s)")
    say()
    say(f"## First paint of the newest page ({args.runs} runs, fresh browser context each)")
    say()
    say("| | median | min | max |")
    say("|---|---:|---:|---:|")
    for key, label in (("fcp", "first contentful paint (ms)"),
                       ("ready", "newest messages on screen (ms)"),
                       ("wall", "goto → ready, seen from the driver (ms)")):
        vals = [r[key] for r in paints]
        say(f"| {label} | {statistics.median(vals):.0f} | {min(vals):.0f} | {max(vals):.0f} |")
    say(f"\nMessages rendered on open: {paints[0]['msgs']}.")
    say()
    say(f"## Scrolling back {args.back:,} messages")
    say()
    say("| messages scrolled back | messages in the DOM | DOM nodes | JS heap after GC (MB) "
        "| median ms per older page |")
    say("|---:|---:|---:|---:|---:|")
    for r in rows:
        per_page = "–" if r["page_ms"] != r["page_ms"] else f"{r['page_ms']:.0f}"
        say(f"| {r['back']:,} | {r['msgs']} | {r['nodes']:,.0f} | {r['heap']:.1f} | {per_page} |")
    say()
    say("## The daemon side (Python client over WebSocket, median of 20)")
    say()
    say("| request | ms |")
    say("|---|---:|")
    say(f"| `archive/read` newest 100 (`beforeId`) | {server['newest']:.1f} |")
    say(f"| `context/compactions` (archive sizes for the chart) | {server['compactions']:.1f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"\nwritten to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
