"""The crash harness's daemon and its talk: a daemon process that keeps its log, and the
messages agents say (English and Chinese, each with a marker to find it again)."""

from __future__ import annotations

import json
import random
import re
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.helpers import DaemonProcess

WIRES = ("zmq", "jsonrpc", "websocket")

# ---------------------------------------------------------------- the daemon process


class LoggedDaemon(DaemonProcess):
    """`DaemonProcess` with its output in a file.

    A pipe nobody reads would stop the daemon once its log fills the pipe buffer, which
    a stuck subscriber (one warning per dropped event) does quickly.
    """

    def __init__(self, root: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        super().__init__(root, *extra, env=env)
        self.log_path = root / "daemon.log"

    def start(self, timeout: float = 30.0) -> LoggedDaemon:
        self.connection_file.unlink(missing_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(), env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                if self.info().get("pid") == self.proc.pid:
                    return self
            except (OSError, ValueError):
                pass  # not written yet
            if time.monotonic() > deadline:
                raise TimeoutError("daemon did not write its connection file")
            time.sleep(0.01)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def status_kib(self, key: str = "VmRSS") -> int:
        """A `kB` line of /proc/<pid>/status (VmRSS, VmHWM, ...)."""
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
        raise KeyError(key)

    def log_tail(self, limit: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""


# ---------------------------------------------------------------- messages

EN_USER = [
    "Please find out why the {x} test fails on CI and fix it.",
    "Refactor the {x} loader but keep its public API unchanged.",
    "Never touch the production database while working on {x}.",
    "Add a retry with backoff around the {x} client calls.",
    "Can you check the memory use of the {x} worker under load?",
]
ZH_USER = [
    "请检查 {x} 测试为什么在 CI 上失败，并修复它。",
    "重构 {x} 的加载逻辑，但不要改变公开接口。",
    "处理 {x} 的时候不要碰生产数据库。",
    "给 {x} 客户端的调用加上带退避的重试。",
    "看一下 {x} 进程在高负载下的内存占用。",
]
EN_SAY = [
    "The {x} module reads its config twice; I removed the second read.",
    "Done: {x} now passes locally and the lint is clean.",
    "I found the cause: {x} keeps a stale cache entry after reload.",
]
ZH_SAY = [
    "{x} 模块读取了两次配置，我删掉了第二次。",
    "完成：{x} 在本地测试通过，代码检查也没有问题。",
    "找到原因了：{x} 重新加载后保留了过期的缓存。",
]
TOPICS = ["parser", "scheduler", "archive", "session", "tokenizer", "上下文压缩", "索引", "迁移"]
MARKER = re.compile(r"mk[a-z]+n\d+")


class Talker:
    """Builds one client's chat messages, already in the shape the archive stores.

    Every message carries a marker word unique in the whole test (`mk<name>n<count>`,
    one full-text token), so each archived message can be traced to the batch that sent
    it and a duplicate shows up as a repeated body.
    """

    def __init__(self, name: str, rng: random.Random) -> None:
        if not name.isalpha() or not name.islower():
            raise ValueError("talker names are lowercase letters (markers must parse)")
        self.name = name
        self.rng = rng
        self.count = 0
        self.calls = 0

    def mark(self) -> str:
        self.count += 1
        return f"mk{self.name}n{self.count}"

    def _line(self, en: list[str], zh: list[str]) -> str:
        pool = zh if self.rng.random() < 0.4 else en
        return self.rng.choice(pool).format(x=self.rng.choice(TOPICS))

    def system(self) -> dict[str, Any]:
        return {"role": "system", "content": f"You are a careful coding agent. {self.mark()}"}

    def user(self) -> dict[str, Any]:
        return {"role": "user", "content": f"{self._line(EN_USER, ZH_USER)} {self.mark()}"}

    def say(self) -> dict[str, Any]:
        return {"role": "assistant", "content": f"{self._line(EN_SAY, ZH_SAY)} {self.mark()}"}

    def call(self, n: int = 1, tool: str = "read_file") -> dict[str, Any]:
        calls = []
        for _ in range(n):
            self.calls += 1
            args = {"path": f"src/{self.rng.choice(TOPICS)}/mod{self.calls}.py"}
            if tool == "write_file":
                args["content"] = "def main():\n    return 0\n" * self.rng.randint(1, 20)
            calls.append(
                {
                    "id": f"call_{self.name}_{self.calls}",
                    "type": "function",
                    "function": {"name": tool, "arguments": json.dumps(args)},
                }
            )
        note = "Let me look at the code." if self.rng.random() < 0.6 else "我先看一下代码。"
        return {"role": "assistant", "content": f"{note} {self.mark()}", "tool_calls": calls}

    def result(self, call_id: str, denied: bool = False) -> dict[str, Any]:
        if denied:
            body = "The user denied this tool call."
        else:
            lines = self.rng.randint(2, 40)
            body = "".join(f"{i:4d}  value = compute({i}) # 计算 {i}\n" for i in range(lines))
        return {"role": "tool", "tool_call_id": call_id, "content": f"{body}{self.mark()}"}

    def batch(
        self,
        open_calls: list[str],
        allow_user: bool,
        denied: set[str] | None = None,
        allow_open: bool = True,
    ) -> tuple[list[dict[str, Any]], list[str]]:
        """1-5 messages that keep every tool call before its result.

        Returns the messages and the calls they leave open, which the next batch answers
        (only with `allow_open`: in a session with several writers another client's
        message would come between a call and its result).
        """
        if open_calls:
            msgs = [self.result(c, c in (denied or set())) for c in open_calls]
            if self.rng.random() < 0.5:
                msgs.append(self.say())
            return msgs, []
        shape = self.rng.choice(["user", "turn", "open", "parallel", "say", "pair"])
        if shape == "user" and allow_user:
            return [self.user()], []
        if shape == "turn":
            call = self.call()
            head = [self.user()] if allow_user else []
            return [*head, call, self.result(_ids(call)[0]), self.say()], []
        if shape == "open" and allow_open:
            call = self.call(self.rng.randint(1, 2))
            head = [self.user()] if allow_user else []
            return [*head, call], _ids(call)
        if shape == "parallel":
            call = self.call(2)
            return [call, *(self.result(c) for c in _ids(call)), self.say()], []
        if shape == "pair":
            call = self.call()
            return [call, self.result(_ids(call)[0])], []
        return [self.say()], []


def _ids(call: dict[str, Any]) -> list[str]:
    return [c["id"] for c in call["tool_calls"]]


def marker_of(msg: dict[str, Any]) -> str:
    found = MARKER.findall(msg.get("content") or "")
    assert found, msg
    return found[-1]

def as_wire(name: str) -> Any:
    """A wire name for `connect` (checked: a typo fails here, not as a hang)."""
    if name not in WIRES:
        raise ValueError(name)
    return name
