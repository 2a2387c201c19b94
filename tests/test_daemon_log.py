"""The daemon's log under a flood of refusals: rate-limited, rotated, private (0600),
including the log that `ctxd stdio` writes when it starts the daemon itself."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import stat
import time
from pathlib import Path
from typing import Any

from helpers import DaemonProcess, wait_for_connection_file

from ctxd.clients.cli import entry as cli
from ctxd.daemon.logsetup import RATE_BURST
from ctxd.protocol.codec import frame
from ctxd.protocol.connection import read_connection_file, split_endpoint

TIMEOUT = 10.0


def start(root: Path, **config: Any) -> DaemonProcess:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "ctxd.toml"
    path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in config.items()))
    return DaemonProcess(root, "--config", str(path), env={"CTXD_LOG_LEVEL": "INFO"}).start()


def refused(info: dict[str, Any], n: int) -> None:
    """`n` connections without the token, each refused (and logged) by the daemon."""
    host, port = split_endpoint(info["jsonrpc_tcp"])
    for i in range(n):
        with socket.create_connection((host, int(port)), timeout=TIMEOUT) as s:
            s.sendall(frame(json.dumps({"jsonrpc": "2.0", "id": i, "method": "session/list",
                                        "params": {}}).encode()))
            while s.recv(65536):
                pass


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_refusals_are_rate_limited_and_the_log_is_private(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "daemon.log"
    d = start(tmp_path, log_file=str(log))
    try:
        refused(d.info(), 300)
        time.sleep(0.3)
        text = log.read_text()
    finally:
        assert d.stop() == 0
    assert mode(log) == 0o600
    lines = [line for line in text.splitlines() if "before login" in line]
    # once one line per refusal (and more): now a burst per window, then silence
    assert 0 < len(lines) <= 2 * RATE_BURST, len(lines)
    assert "ctxd" in text and "serving" in text  # the start-up lines are there


def test_the_log_rotates_and_every_file_is_private(tmp_path: Path) -> None:
    log = tmp_path / "daemon.log"
    log.write_text("left by an earlier run\n")
    os.chmod(log, 0o644)
    d = start(tmp_path, log_file=str(log), log_max_bytes=1500, log_backups=2)
    try:
        refused(d.info(), 40)
        time.sleep(0.3)
    finally:
        assert d.stop() == 0
    files = sorted(tmp_path.glob("daemon.log*"))
    assert [f.name for f in files] == ["daemon.log", "daemon.log.1", "daemon.log.2"], files
    for f in files:
        assert mode(f) == 0o600, f
        assert f.stat().st_size <= 1500 + 1000, (f, f.stat().st_size)


def test_the_log_of_a_daemon_started_by_ctxd_stdio_is_private(tmp_path: Path) -> None:
    data = tmp_path / "data"
    conn_file = tmp_path / "run" / "ctxd.json"
    args = argparse.Namespace(data_dir=data, connection_file=conn_file, config=None)
    old_umask = os.umask(0o022)  # a usual umask: files would be 0644 without care
    try:
        env_runtime = os.environ.get("CTXD_RUNTIME_DIR")
        os.environ["CTXD_RUNTIME_DIR"] = str(tmp_path / "run")
        cli._spawn_daemon(args)
    finally:
        os.umask(old_umask)
        if env_runtime is None:
            os.environ.pop("CTXD_RUNTIME_DIR", None)
        else:
            os.environ["CTXD_RUNTIME_DIR"] = env_runtime
    wait_for_connection_file(conn_file, None, data / "daemon.log", 20)
    pid = read_connection_file(conn_file).pid
    try:
        log = data / "daemon.log"
        assert mode(log) == 0o600
        deadline = time.monotonic() + 5
        while "serving" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
    finally:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while conn_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    assert not conn_file.exists()
