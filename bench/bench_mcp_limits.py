"""`ctxd mcp --http` under an idle-connection flood and a pile of MCP sessions.

    python -m bench.bench_mcp_limits --before DIR

Runs `ctxd mcp --http` at a descriptor limit of 1024 (soft and hard) and opens 1,100 idle
TCP connections without the token; reports whether the process is alive 2 s later and
how long an authenticated `initialize` took meanwhile. Then opens 2,000 MCP sessions
(`initialize` each) and reports the growth of the process's resident memory. `DIR`:
another checkout, as for bench_large.
"""

from __future__ import annotations

import argparse
import json
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from bench.bench_large import farm
from tests.helpers import DaemonProcess


def initialize(url: str, token: str) -> tuple[int, str | None]:
    """(HTTP status, mcp-session-id) of an MCP `initialize` with the token."""
    from mcp_types.version import LATEST_HANDSHAKE_VERSION

    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": LATEST_HANDSHAKE_VERSION, "capabilities": {},
        "clientInfo": {"name": "bench", "version": "0"}}}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {token}",
        "Accept": "application/json, text/event-stream"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()
            return int(r.status), r.headers.get("mcp-session-id")
    except urllib.error.HTTPError as exc:
        return int(exc.code), None


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def nofile_1024() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))


def one(root: Path, d: DaemonProcess, code: Path | None) -> dict[str, Any]:
    env = dict(d.env)
    if code is not None:
        env["PYTHONPATH"] = str(farm(code, root / "code"))
    err = root / "mcp.err"
    with open(err, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "ctxd.clients.cli", "mcp",
                                 "--connection-file", str(d.connection_file), "--http"],
                                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=f, preexec_fn=nofile_1024)
    while not err.read_text(errors="replace").split("\n", 1)[0].endswith("}"):
        time.sleep(0.05)
    info = json.loads(err.read_text().split("\n", 1)[0].removeprefix("ctxd mcp: "))
    host, port = info["url"].split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    out: dict[str, Any] = {}
    flood = []
    for _ in range(1100):
        try:
            flood.append(socket.create_connection((host, int(port)), timeout=5))
        except OSError:
            break
    time.sleep(2)
    out["alive_after_flood"] = proc.poll() is None
    if out["alive_after_flood"]:
        t0 = time.perf_counter()
        try:
            out["initialize_during_flood"] = initialize(info["url"], info["token"])[0]
        except OSError as exc:
            out["initialize_during_flood"] = repr(exc)
        out["initialize_s"] = time.perf_counter() - t0
    for s in flood:
        s.close()
    time.sleep(1)
    out["alive_after"] = proc.poll() is None
    if out["alive_after"]:
        before = rss_kib(proc.pid)
        for _ in range(2000):
            assert initialize(info["url"], info["token"])[0] == 200
        out["rss_growth_mb_2000_sessions"] = (rss_kib(proc.pid) - before) / 1024
    proc.terminate()
    proc.wait(10)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", type=Path)
    args = ap.parse_args()
    sides: list[tuple[str, Path | None]] = [("after" if args.before else "this", None)]
    if args.before is not None:
        sides.insert(0, ("before", args.before.resolve()))
    with tempfile.TemporaryDirectory(prefix="ctxd-mcp-") as tmp:
        (Path(tmp) / "daemon").mkdir()
        d = DaemonProcess(Path(tmp) / "daemon").start()
        try:
            with d.client() as c:
                c.create_session(title="bench")
            for label, code in sides:
                root = Path(tmp) / label
                root.mkdir()
                print(json.dumps({label: one(root, d, code)}), flush=True)
        finally:
            d.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
