"""Message builders and config shared by the tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ctxd.daemon.config import Config
from ctxd.protocol.connection import read_connection_file


def make_config(path: Path, **policy: Any) -> Config:
    cfg = Config(data_dir=path)
    for k, v in policy.items():
        if hasattr(cfg.compaction, k):
            setattr(cfg.compaction, k, v)
        else:
            setattr(cfg, k, v)
    return cfg


def tool_turn(i: int, path: str | None = None, result: str = "ok") -> list[dict[str, Any]]:
    """An assistant tool call and its result."""
    args = json.dumps({"path": path or f"src/mod{i}.py"})
    return [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{i}", "type": "function",
             "function": {"name": "read_file", "arguments": args}}]},
        {"role": "tool", "tool_call_id": f"call_{i}", "content": result},
    ]


def agent_turn(i: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"step {i}: look at src/mod{i}.py"},
            *tool_turn(i, result=f"# mod{i}\n" + "def handler(x):\n    return x * 2\n" * 12),
            {"role": "assistant", "content": f"done with step {i}"}]


def wait_for_connection_file(path: Path, proc: subprocess.Popen[bytes] | None,
                             log_path: Path, timeout: float = 60.0) -> None:
    """Until a daemon started as `proc` (None: detached, not ours to poll) has written its
    connection file, which it does once every endpoint is bound. RuntimeError with its
    log when it exits first; TimeoutError when it takes longer than `timeout`."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc is not None and proc.poll() is not None:
            out = log_path.read_text(errors="replace")
            raise RuntimeError(f"daemon exited with {proc.returncode}: {out}")
        if time.monotonic() > deadline:
            out = log_path.read_text(errors="replace") if log_path.exists() else ""
            raise TimeoutError(f"daemon did not write its connection file {path}: {out}")
        time.sleep(0.02)


class DaemonProcess:
    """A real `ctxd serve` subprocess on a temp data dir, found through its connection file."""

    def __init__(self, root: Path, *extra: str, env: dict[str, str] | None = None,
                 preexec_fn: Any = None) -> None:
        self.root = root
        self.data_dir = root / "data"
        self.runtime_dir = root / "run"
        self.connection_file = self.runtime_dir / "ctxd.json"
        self.extra = list(extra)
        self.env = {**os.environ, "CTXD_RUNTIME_DIR": str(self.runtime_dir),
                    "CTXD_LOG_LEVEL": "WARNING", **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        # runs in the child before exec: e.g. a low descriptor limit for a flood test
        self.preexec_fn = preexec_fn

    def command(self) -> list[str]:
        return [sys.executable, "-m", "ctxd.daemon", "serve", "--data-dir", str(self.data_dir),
                "--connection-file", str(self.connection_file), *self.extra]

    def start(self, timeout: float = 60.0) -> DaemonProcess:
        self.connection_file.unlink(missing_ok=True)
        # the daemon's output goes to a file: an unread pipe would fill and block it
        self.log_path = self.root / f"daemon-{time.monotonic_ns()}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command(), env=self.env, stdout=log,
                                         stderr=subprocess.STDOUT, preexec_fn=self.preexec_fn)
        wait_for_connection_file(self.connection_file, self.proc, self.log_path, timeout)
        return self

    def info(self) -> dict[str, Any]:
        return read_connection_file(self.connection_file).to_dict()

    def client(self, wire: str = "zmq", **kw: Any) -> Any:
        from ctxd.clients.client import connect

        return connect(connection_file=self.connection_file, wire=wire, **kw)  # type: ignore[arg-type]

    def stop(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self._close_pipes()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)
        self._close_pipes()

    def _close_pipes(self) -> None:
        """Nothing to close: the output went to `log_path`."""


def notifications_until(stream: Any, method: str, where: Any = lambda p: True,
                        timeout: float = 20.0) -> list[tuple[str, dict[str, Any]]]:
    """Every notification of a client's stream up to and including the first `method`
    matching `where` (progress and all)."""
    deadline = time.monotonic() + timeout
    seen: list[tuple[str, dict[str, Any]]] = []
    while time.monotonic() < deadline:
        try:
            m, params = next(stream)
        except StopIteration:
            continue
        seen.append((m, params))
        if m == method and where(params):
            return seen
    raise AssertionError(f"no {method} within {timeout}s; saw {[m for m, _ in seen]}")


def wait_for(stream: Any, method: str, timeout: float = 10.0,
             where: Any = lambda p: True) -> dict[str, Any]:
    """The params of the first notification `method` on a client's stream matching `where`."""
    return notifications_until(stream, method, where, timeout)[-1][1]
