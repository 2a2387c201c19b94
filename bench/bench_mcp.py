"""`ctxd mcp` as an MCP client sees it: start-up, per-call latency and answer sizes.

    python bench/bench_mcp.py                    # ~1-2 minutes
    python bench/bench_mcp.py --calls 50 --out /tmp/mcp.md

A real daemon on a scratch data dir is filled by `ctxd import` with a generated Claude
Code project (20 transcripts of 300 turns, English and Chinese). Then, with the MCP SDK's
own client:

- start-up: spawn `ctxd mcp` over stdio until `initialize` answers, with the daemon
  already running (warm) and with no daemon (cold: `ctxd mcp` starts it); Codex waits
  10 s by default (`startup_timeout_sec`), Claude Code `MCP_TIMEOUT`;
- per-call latency over stdio and over streamable HTTP for each tool;
- answer size in tokens (cl100k_base) of each tool's default answer and of the widest
  read allowed, against Claude Code's 10,000-token warning.

Results go to bench/results/mcp.md.
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
import time
from pathlib import Path
from typing import Any

import anyio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from helpers import wait_for_connection_file  # noqa: E402
from transcript_gen import write_claude_code  # noqa: E402

from ctxd.daemon.tokens import TokenCounter  # noqa: E402


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


def ms(values: list[float]) -> str:
    values = sorted(values)
    p90 = values[min(len(values) - 1, int(len(values) * 0.9))]
    return f"{statistics.median(values) * 1000:.1f} | {p90 * 1000:.1f}"


async def time_initialize(args: list[str], env: dict[str, str], cwd: Path) -> float:
    params = StdioServerParameters(command=sys.executable, args=args, env=env, cwd=str(cwd))
    t0 = time.perf_counter()
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        return time.perf_counter() - t0


CALLS: list[tuple[str, str, dict[str, Any]]] = [
    ("search (English, this session)", "search_past_messages", {"query": "invoice module"}),
    ("search (Chinese, all sessions)", "search_past_messages",
     {"query": "数据库", "scope": "all"}),
    ("search, limit 20", "search_past_messages", {"query": "checkout", "limit": 20}),
    ("read_past_messages (defaults)", "read_past_messages", {"message_id": 0}),
    ("read_past_messages (10 + 10, 8000 chars)", "read_past_messages",
     {"message_id": 0, "before": 10, "after": 10, "max_chars": 8000}),
    ("context_status", "context_status", {}),
]


async def run_calls(s: ClientSession, n: int, mid: int, counter: TokenCounter,
                    sizes: dict[str, int]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for label, name, args in CALLS:
        args = {**args, "message_id": mid} if "message_id" in args else args
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            res = await s.call_tool(name, args)
            times.append(time.perf_counter() - t0)
            if res.is_error:
                raise RuntimeError(f"{label}: {res.content}")
        text = "\n".join(c.text for c in res.content if getattr(c, "text", None))
        sizes[label] = counter.count_text(text)
        out[label] = times
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--starts", type=int, default=8)
    ap.add_argument("--tmp", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "mcp.md")
    a = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="ctxd-mcp-", dir=a.tmp))
    load0 = os.getloadavg()
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    counter = TokenCounter()
    try:
        project = root / "home" / "dev" / "shop"
        project.mkdir(parents=True)
        folder = root / "transcripts"
        for i in range(20):
            write_claude_code(folder / f"{i:04d}mcpbench.jsonl", f"{i:04d}mcpbench", 300)
        daemon, conn, env = start_daemon(root)
        try:
            subprocess.run([sys.executable, "-m", "ctxd.clients.cli", "import", "claude-code",
                            str(folder), "--connection-file", str(conn)], env=env, check=True,
                           capture_output=True)
            cmd = ["-m", "ctxd.clients.cli", "mcp", "--connection-file", str(conn),
                   "--session", "claude-code-0010mcpbench"]
            warm = [anyio.run(time_initialize, cmd, env, project) for _ in range(a.starts)]
            from ctxd.clients.client import Client

            with Client.connect(str(conn), None, "jsonrpc") as c:
                mid = c.read("claude-code-0010mcpbench", limit=200)["messages"][100]["id"]
            sizes: dict[str, int] = {}

            async def stdio_calls() -> dict[str, list[float]]:
                params = StdioServerParameters(command=sys.executable, args=cmd, env=env,
                                               cwd=str(project))
                async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
                    await s.initialize()
                    return await run_calls(s, a.calls, mid, counter, sizes)

            stdio = anyio.run(stdio_calls)
            proc = subprocess.Popen([sys.executable, *cmd, "--http"], env=env,
                                    stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    stdin=subprocess.DEVNULL, text=True)
            try:
                assert proc.stderr is not None
                info = json.loads(proc.stderr.readline().removeprefix("ctxd mcp: "))

                async def http_calls() -> dict[str, list[float]]:
                    http = create_mcp_http_client(
                        headers={"Authorization": f"Bearer {info['token']}"})
                    async with http, streamable_http_client(info["url"], http_client=http) \
                            as (r, w), ClientSession(r, w) as s:
                        await s.initialize()
                        return await run_calls(s, a.calls, mid, counter, {})

                http = anyio.run(http_calls)
            finally:
                proc.terminate()
                proc.wait(10)
        finally:
            daemon.terminate()
            daemon.wait(30)
        # cold: no daemon runs; `ctxd mcp` starts one on a fresh data dir
        cold = []
        for i in range(max(2, a.starts // 3)):
            env_c = {**env, "CTXD_RUNTIME_DIR": str(root / f"run-cold{i}")}
            cold.append(anyio.run(time_initialize, ["-m", "ctxd.clients.cli", "mcp",
                                                    "--data-dir", str(root / f"cold{i}")],
                                  env_c, project))
            for f in (root / f"run-cold{i}").glob("daemon-*.json"):
                pid = json.loads(f.read_text())["pid"]
                os.kill(pid, 15)
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline:
                    try:
                        os.kill(pid, 0)
                    except ProcessLookupError:
                        break
                    time.sleep(0.05)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    lines = [
        "# MCP server benchmark",
        "",
        f"`python bench/bench_mcp.py --calls {a.calls}`, {started}. "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, load average {load0[0]:.2f} at the start and "
        f"{os.getloadavg()[0]:.2f} at the end (a shared machine: wall times include "
        "waiting for CPU). 20 imported Claude Code transcripts, 24,000 messages.",
        "",
        "## Start-up: spawn `ctxd mcp` (stdio) until `initialize` answers",
        "",
        "| case | runs | median s | max s |",
        "|---|---|---|---|",
        f"| daemon running | {len(warm)} | {statistics.median(warm):.2f} | {max(warm):.2f} |",
        f"| no daemon (started by `ctxd mcp`) | {len(cold)} | {statistics.median(cold):.2f} | "
        f"{max(cold):.2f} |",
        "",
        "Codex gives an MCP server 10 s by default (`startup_timeout_sec`).",
        "",
        f"## Tool calls ({a.calls} each, one client)",
        "",
        "| call | stdio median ms | stdio p90 ms | HTTP median ms | HTTP p90 ms | answer "
        "tokens |",
        "|---|---|---|---|---|---|",
    ]
    for label, _, _ in CALLS:
        lines.append(f"| {label} | {ms(stdio[label])} | {ms(http[label])} | {sizes[label]} |")
    lines += ["", "Answer tokens are counted with cl100k_base; Claude Code warns above "
              "10,000 and cuts at 25,000 (`MAX_MCP_OUTPUT_TOKENS`).", ""]
    text = "\n".join(lines)
    print(text)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
