"""How long one `ctxd hook claude-code` call takes, as Claude Code runs it: a new `ctxd`
process per hook, the event's JSON on stdin, a real transcript growing between calls.

    python -m bench.bench_hooks [--calls 30] [--out bench/results/hooks.md]

Rows: the daemon up (SessionStart with the pins note; PostToolUse importing the lines
written since the last call; the same event again with nothing new) and the daemon down
(the event queued on disk), then the first call after the daemon came back, which
replays the queue. Each row is the median and worst of `--calls` calls, wall time from
spawning the process to its exit, which is what the agent waits for. The import is
incremental, so a call's cost follows what was written since the last one, not the
transcript's length. Python's start and the imports are most of a call: the row
"interpreter only" is a `python -c pass` for scale, and the last row is the hook's own
work in one process.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from tests.helpers import DaemonProcess

DATA = Path(__file__).resolve().parent / "data" / "transcripts" / "claude-code"
CTXD = str(Path(sys.executable).parent / "ctxd")


def _call(args: list[str], body: dict) -> float:
    t = time.perf_counter()
    done = subprocess.run(args, input=json.dumps(body), capture_output=True, text=True,
                          timeout=120)
    took = time.perf_counter() - t
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    return took


def _row(name: str, times: list[float]) -> str:
    ms = sorted(t * 1000 for t in times)
    return f"| {name} | {len(ms)} | {statistics.median(ms):.0f} | {ms[-1]:.0f} |"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--out", type=Path, default=Path("bench/results/hooks.md"))
    a = ap.parse_args()
    rows: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "ctxd").mkdir()
        daemon = DaemonProcess(root / "ctxd")
        args = [CTXD, "hook", "claude-code", "--data-dir", str(daemon.data_dir),
                "--connection-file", str(daemon.connection_file)]
        lines = (DATA / "posthog-impact-dashboard-zh.jsonl").read_bytes().splitlines(True)
        session = str(uuid.uuid4())
        transcript = root / "projects" / "p" / f"{session}.jsonl"
        transcript.parent.mkdir(parents=True)
        transcript.write_bytes(b"")
        base = {"session_id": session, "transcript_path": str(transcript), "cwd": "/w"}
        step = max(1, len(lines) // (a.calls * 3))
        written = 0

        def grow() -> None:
            nonlocal written
            with open(transcript, "ab") as f:
                f.writelines(lines[written:written + step])
            written += step

        interp = [_call([sys.executable, "-c", "pass"], {}) for _ in range(a.calls)]
        rows.append(_row("interpreter only (`python -c pass`)", interp))

        # daemon down: queued
        down = []
        for _ in range(a.calls):
            grow()
            down.append(_call(args, {**base, "hook_event_name": "PostToolUse"}))
        rows.append(_row("daemon down: PostToolUse queued on disk", down))

        daemon.start()
        try:
            replay = [_call(args, {**base, "hook_event_name": "PostToolUse"})]
            rows.append(_row(f"first call after the daemon is back (replays {a.calls} "
                             f"queued events, imports {written} lines)", replay))
            with daemon.client() as c:
                c.add_pin(f"claude-code-{session}", "Never push to main on Fridays.")
            start = [_call(args, {**base, "hook_event_name": "SessionStart",
                                  "source": "resume"}) for _ in range(a.calls)]
            rows.append(_row("daemon up: SessionStart (pins note)", start))
            up = []
            for _ in range(a.calls):
                grow()
                up.append(_call(args, {**base, "hook_event_name": "PostToolUse"}))
            rows.append(_row(f"daemon up: PostToolUse, {step} new transcript lines", up))
            same = [_call(args, {**base, "hook_event_name": "Stop"})
                    for _ in range(a.calls)]
            rows.append(_row("daemon up: Stop, nothing new", same))
            # the same work inside one process: what is left without Python's start and
            # the imports (connect, replay check, resume point, import, close)
            from ctxd.clients.hooks.capture import HookEvent
            from ctxd.clients.hooks.run import Places, handle

            places = Places(daemon.data_dir, daemon.connection_file)
            work = []
            for _ in range(a.calls):
                grow()
                t = time.perf_counter()
                handle(HookEvent("claude-code", "PostToolUse", str(transcript), session),
                       places)
                work.append(time.perf_counter() - t)
            rows.append(_row(f"in-process `handle()`: PostToolUse, {step} new lines (no "
                             "process start, no imports)", work))
        finally:
            daemon.stop()
    load = os.getloadavg()
    report = "\n".join([
        "# Hook latency (`python -m bench.bench_hooks`)",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {platform.machine()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}, load average "
        f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f} (a shared machine: read the ratios).",
        "",
        "Wall time of one `ctxd hook claude-code` process, from spawn to exit (what "
        "Claude Code waits for), in ms.",
        "",
        "| call | calls | median ms | worst ms |",
        "|---|---|---|---|",
        *rows,
        "",
    ])
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(report)
    print(report)


if __name__ == "__main__":
    main()
