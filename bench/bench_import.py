"""Import speed and memory: `ctxd import` over a generated ~100 MB transcript folder.

    python -m bench.bench_import                 # 100 MB of Claude Code, 100 MB of Codex
    python -m bench.bench_import --size-mb 20    # quicker
    python -m bench.bench_import --tmp /some/dir --out /tmp/import.md

For each format it writes a folder of transcripts (2 MB files, the published line
formats, tool calls with results, English and Chinese; tests/transcript_gen.py), starts a
real daemon on a scratch data dir, runs `ctxd import <format> FOLDER` as its own process
and samples the importer's and the daemon's resident memory every 0.2 s. Then it imports
the same folder again (nothing to add: the cost of the idempotency check) and appends
10% more turns to every file and imports again (only the new lines).

Reported: messages per second and MB per second, CPU seconds of importer and daemon,
and the importer's resident memory over the run (start, median, peak, end): it reads
line by line with bounded batches, so it should stay flat whatever the folder's size.
Results go to bench/results/import.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tests.helpers import wait_for_connection_file
from tests.transcript_gen import claude_code_lines, codex_lines

ROOT = Path(__file__).resolve().parent.parent

FILE_BYTES = 2 * 1024 * 1024
TICK = 0.2
PAGE = os.sysconf("SC_PAGE_SIZE")
CLK = os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE / 2**20
    except OSError:
        return None


def cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK
    except OSError:
        return 0.0


def generate(fmt: str, folder: Path, size_mb: int) -> tuple[int, int]:
    """Write transcripts totalling ~size_mb; (files, turns)."""
    folder.mkdir(parents=True, exist_ok=True)
    total, files, turns = 0, 0, 0
    while total < size_mb * 2**20:
        sid = f"{files:04d}bench-{fmt}"
        name = f"{sid}.jsonl" if fmt == "claude-code" else f"rollout-{sid}.jsonl"
        path = folder / name
        written = 0
        with open(path, "w", encoding="utf-8") as f:
            gen = claude_code_lines(sid, 10**9, pad=1200) if fmt == "claude-code" \
                else codex_lines(sid, 10**9, pad=1200)
            for n, line in enumerate(gen):
                f.write(line + "\n")
                written += len(line.encode()) + 1
                if written >= FILE_BYTES and n % 5 == 4:
                    turns += (n + 1) // (5 if fmt == "claude-code" else 4)
                    break
        total += written
        files += 1
    return files, turns


def grow(fmt: str, folder: Path, share: float) -> None:
    """Append `share` more turns to every file (the agents went on working)."""
    for path in sorted(folder.iterdir()):
        sid = path.stem.removeprefix("rollout-")
        n = sum(1 for _ in open(path, encoding="utf-8"))
        if fmt == "claude-code":
            turns = n // 5
            new = claude_code_lines(sid, max(1, int(turns * share)), pad=1200, start=turns)
        else:
            turns = (n - 1) // 4
            new = (ln.replace('": "call_', f'": "call_g{turns}_') for i, ln in
                   enumerate(codex_lines(sid, max(1, int(turns * share)), pad=1200)) if i)
        with open(path, "a", encoding="utf-8") as f:
            for line in new:
                f.write(line + "\n")


class Sampler(threading.Thread):
    def __init__(self, pids: dict[str, int]) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.samples: dict[str, list[float]] = {k: [] for k in pids}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for k, pid in self.pids.items():
                v = rss_mb(pid)
                if v is not None:
                    self.samples[k].append(v)
            self.stop.wait(TICK)


def run_import(fmt: str, folder: Path, conn: Path, env: dict[str, str],
               daemon_pid: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "ctxd.clients.cli", "import", fmt, str(folder), "--json",
           "--connection-file", str(conn)]
    d_cpu0 = cpu_s(daemon_pid)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    sampler = Sampler({"importer": proc.pid, "daemon": daemon_pid})
    sampler.start()
    last_cpu = 0.0
    while proc.poll() is None:
        last_cpu = cpu_s(proc.pid) or last_cpu
        time.sleep(TICK)
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    sampler.stop.set()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"import failed: {err}")
    report = json.loads(out.strip().splitlines()[-1])
    return {"wall": wall, "report": report, "importer_cpu": last_cpu,
            "daemon_cpu": cpu_s(daemon_pid) - d_cpu0, "rss": sampler.samples}


def start_daemon(root: Path) -> tuple[subprocess.Popen[bytes], Path, dict[str, str]]:
    conn = root / "conn.json"
    env = {**os.environ, "CTXD_RUNTIME_DIR": str(root / "run"), "CTXD_LOG_LEVEL": "WARNING"}
    for k in ("CTXD_DATA_DIR", "CTXD_CONFIG"):
        env.pop(k, None)
    log = open(root / "daemon.log", "wb")  # noqa: SIM115 - lives as long as the daemon
    proc = subprocess.Popen([sys.executable, "-m", "ctxd.daemon", "serve", "--data-dir",
                             str(root / "data"), "--connection-file", str(conn)],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    wait_for_connection_file(conn, proc, root / "daemon.log", 30)
    return proc, conn, env


def mem_row(label: str, s: list[float]) -> str:
    if not s:
        return f"| {label} | – | – | – | – |"
    return (f"| {label} | {s[0]:.0f} | {statistics.median(s):.0f} | {max(s):.0f} | "
            f"{s[-1]:.0f} |")


def bench_format(fmt: str, size_mb: int, tmp: Path) -> str:
    root = Path(tempfile.mkdtemp(prefix=f"ctxd-import-{fmt}-", dir=tmp))
    try:
        folder = root / "transcripts"
        t = time.perf_counter()
        files, turns = generate(fmt, folder, size_mb)
        mb = sum(f.stat().st_size for f in folder.iterdir()) / 2**20
        print(f"{fmt}: wrote {mb:.0f} MB in {files} files ({turns} turns) in "
              f"{time.perf_counter() - t:.0f} s", file=sys.stderr)
        daemon, conn, env = start_daemon(root)
        try:
            first = run_import(fmt, folder, conn, env, daemon.pid)
            again = run_import(fmt, folder, conn, env, daemon.pid)
            grow(fmt, folder, 0.1)
            grown_mb = sum(f.stat().st_size for f in folder.iterdir()) / 2**20 - mb
            grown = run_import(fmt, folder, conn, env, daemon.pid)
        finally:
            daemon.terminate()
            daemon.wait(60)
        db_mb = sum(f.stat().st_size for f in (root / "data").rglob("*") if f.is_file()) / 2**20
    finally:
        shutil.rmtree(root, ignore_errors=True)

    def row(label: str, r: dict[str, Any], size: float) -> str:
        n = r["report"]["messages"]
        return (f"| {label} | {size:.1f} | {r['report']['lines']} | {n} | {r['wall']:.1f} | "
                f"{n / r['wall']:.0f} | {size / r['wall']:.2f} | {r['importer_cpu']:.1f} | "
                f"{r['daemon_cpu']:.1f} |")

    lines = [
        f"### {fmt}: {mb:.0f} MB in {files} files, {turns} turns",
        "",
        "| run | MB read | lines | messages added | seconds | messages/s | MB/s | "
        "importer CPU s | daemon CPU s |",
        "|---|---|---|---|---|---|---|---|---|",
        row("first import", first, mb),
        row("again (nothing new)", again, 0.0),
        row("after +10% turns", grown, grown_mb),
        "",
        f"Database after the runs: {db_mb:.0f} MB. Unmappable lines: "
        f"{sum(first['report']['unmappable'].values())}; skipped (not conversation): "
        f"{sum(first['report']['skipped'].values())}.",
        "",
        "Resident memory during the first import, MB (sampled every 0.2 s):",
        "",
        "| process | start | median | peak | end |",
        "|---|---|---|---|---|",
        mem_row("importer", first["rss"]["importer"]),
        mem_row("daemon", first["rss"]["daemon"]),
        "",
    ]
    s = first["rss"]["importer"]
    if len(s) >= 8:
        q = len(s) // 4
        quarters = [statistics.median(s[i * q:(i + 1) * q]) for i in range(4)]
        lines.append("Importer memory by quarter of the run (median MB): "
                     + ", ".join(f"{v:.0f}" for v in quarters) + ".")
        lines.append("")
    text = "\n".join(lines)
    print(text)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=100)
    ap.add_argument("--format", choices=["claude-code", "codex", "both"], default="both")
    ap.add_argument("--tmp", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "import.md")
    args = ap.parse_args(argv)
    fmts = ["claude-code", "codex"] if args.format == "both" else [args.format]
    load0 = os.getloadavg()
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    sections = [bench_format(f, args.size_mb, args.tmp) for f in fmts]
    head = [
        "# Import benchmark",
        "",
        f"`python -m bench.bench_import --size-mb {args.size_mb}`, {started}. "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, load average {load0[0]:.2f} at the start and "
        f"{os.getloadavg()[0]:.2f} at the end (the machine is shared: wall times include "
        "waiting for CPU).",
        "",
        "The importer (`ctxd import`) and the daemon are separate processes; the daemon "
        "validates, counts tokens, indexes (FTS5, CJK-aware) and compacts the imported "
        "sessions automatically while the import runs, as it would for any client.",
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(head + sections))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
