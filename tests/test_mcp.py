"""`ctxd mcp` driven by the MCP SDK's own client, over stdio and streamable HTTP, against a
real daemon holding imported Claude Code and Codex transcripts."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import DaemonProcess
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from ctxd.clients.client import Client
from ctxd.clients.mcp_server import READ_BUDGET_TOKENS, estimate_tokens

FIXTURES = Path(__file__).parent / "fixtures" / "transcripts"
CC_MAIN = "claude-code-7f1c2a9e-4b1d-4c53-9a11-2f7a0c6e9b10"
TOOLS = {"search_past_messages", "read_past_messages", "context_status", "pin_invariant"}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("mcp")).start()
    try:
        for fmt, sub in (("claude-code", "claude-code"), ("codex", "codex")):
            subprocess.run([sys.executable, "-m", "ctxd.clients.cli", "import", fmt,
                            str(FIXTURES / sub), "--connection-file", str(d.connection_file)],
                           env=d.env, check=True, capture_output=True, timeout=120)
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> Iterator[Client]:
    with daemon.client() as c:
        yield c


def mcp_cmd(d: DaemonProcess, *extra: str) -> list[str]:
    return ["-m", "ctxd.clients.cli", "mcp", "--connection-file", str(d.connection_file),
            *extra]


@asynccontextmanager
async def stdio_session(d: DaemonProcess, cwd: Path, *extra: str
                        ) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=sys.executable, args=mcp_cmd(d, *extra),
                                   env=dict(d.env), cwd=str(cwd))
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        with anyio.fail_after(30):
            await s.initialize()
        yield s


def text(result: Any) -> str:
    return "\n".join(c.text for c in result.content if getattr(c, "text", None))


def test_stdio_tools_resources_and_session_choice(daemon: DaemonProcess, client: Client,
                                                  tmp_path: Path) -> None:
    project = tmp_path / "shop"
    project.mkdir()
    mine = client.create_session(title="project", metadata={"cwd": str(project)})["sessionId"]
    client.append(mine, [{"role": "user", "content": "the rollback plan uses 回滚脚本 v2"}])
    # a newer subagent conversation of the same project is not the one to attach to
    client.create_session(title="subagent", metadata={"cwd": str(project), "sidechain": True})
    daemon_tools = {t["function"]["name"]: t["function"] for t in client.list_tools()["tools"]}
    # a session of long Chinese messages: a wide read must still fit the budget
    big = client.create_session(title="big")["sessionId"]
    big_ids = client.append(big, [{"role": "user", "content": f"{i} " + "数据库迁移" * 1600}
                                  for i in range(21)])["messageIds"]
    # a compacted session whose summary cites messages by their ordinal in the session
    compacted = client.create_session(title="compacted")["sessionId"]
    for i in range(30):
        client.append(compacted, [
            {"role": "user", "content": f"step {i}: set retries to {i} in config/app{i}.toml"},
            {"role": "assistant", "content": f"Done: config/app{i}.toml now has retries={i}."}])
    assert client.compact(compacted, force=True)["effective"]
    cited_id, cited_ordinal = next(
        (src["id"], src["ordinal"]) for item in client.call(
            "context/explain", {"sessionId": compacted})["items"]
        for src in item["sources"] if "ordinal" in src)

    async def main() -> None:
        sub = project / "src"  # the client runs in a folder below the project
        sub.mkdir()
        async with stdio_session(daemon, sub) as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert set(tools) == TOOLS
            assert tools["search_past_messages"].input_schema == \
                daemon_tools["search_past_messages"]["parameters"]
            for t in tools.values():
                assert len(t.description or "") > 80  # written for a model to act on

            status = json.loads(text(await s.call_tool("context_status", {})))
            assert status["sessionId"] == mine
            assert status["chosen"].startswith("mapped from the working directory")

            # this session; English and Chinese; the same result text as the daemon's tool
            found = await s.call_tool("search_past_messages", {"query": "回滚脚本"})
            direct = client.call_tool(mine, "search_past_messages", {"query": "回滚脚本"})
            assert not found.is_error and text(found).startswith(direct["content"])
            assert "read_past_messages" in text(found)

            hits = await s.call_tool("search_past_messages",
                                     {"query": "checkout test", "scope": "all"})
            m = re.search(r"\[msg (\d+) · user · [^\]]*session (\S+?)[ \]·]", text(hits))
            assert m, text(hits)
            mid, sid = int(m.group(1)), m.group(2)
            assert sid == CC_MAIN
            read = text(await s.call_tool("read_past_messages", {
                "message_id": mid + 2, "session_id": sid, "before": 2, "after": 1}))
            assert f"[msg {mid} · user" in read and "结账测试失败了" in read
            assert "result of toolu_01 · error" in read and "→ call toolu_01: Bash(" in read
            # by the #N ordinal a summary cites: the N-th message of the session
            third = text(await s.call_tool("read_past_messages", {
                "ordinal": 3, "session_id": sid, "before": 0, "after": 0}))
            assert f"(asked for {mid + 2})" in third and "result of toolu_01" in third
            cited = text(await s.call_tool("read_past_messages", {
                "ordinal": cited_ordinal, "session_id": compacted, "before": 0, "after": 0}))
            assert f"(asked for {cited_id})" in cited
            # the message shows the #N the summary cites beside its archive id
            assert re.search(rf"\[msg {cited_id} · \w+ · #{cited_ordinal} · ", cited), cited
            assert f"messages #{cited_ordinal}..#{cited_ordinal} (msg {cited_id}..{cited_id})" \
                in cited
            wide = text(await s.call_tool("read_past_messages", {
                "message_id": big_ids[10], "session_id": big, "before": 10, "after": 10,
                "max_chars": 8000}))
            assert wide.count("[msg ") == 21 and "each cut to" in wide
            assert estimate_tokens(wide) <= READ_BUDGET_TOKENS + 500
            both = await s.call_tool("read_past_messages", {"message_id": 1, "ordinal": 1})
            assert both.is_error
            # a message of another session is not silently read from this one
            wrong = await s.call_tool("read_past_messages", {"message_id": mid})
            assert wrong.is_error and "session_id" in text(wrong)
            # bounded: more neighbours than allowed are refused
            too_many = await s.call_tool("read_past_messages",
                                         {"message_id": mid, "session_id": sid, "after": 500})
            assert too_many.is_error

            pinned = await s.call_tool("pin_invariant",
                                       {"text": "Never touch the production database."})
            assert not pinned.is_error

            listed = [str(r.uri) for r in (await s.list_resources()).resources]
            assert f"ctxd://session/{CC_MAIN}/context" in listed
            assert f"ctxd://session/{mine}/context" in listed
            read_ctx = await s.read_resource(f"ctxd://session/{CC_MAIN}/context")
            body = read_ctx.contents[0].text
            assert "已修复 ✅" in body and "toolu_01" in body

        async with stdio_session(daemon, tmp_path, "--session", CC_MAIN) as s:
            status = json.loads(text(await s.call_tool("context_status", {})))
            assert status["sessionId"] == CC_MAIN and status["cwd"] == "/home/dev/shop"

        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        async with stdio_session(daemon, elsewhere) as s:
            status = json.loads(text(await s.call_tool("context_status", {})))
            assert status["chosen"] == "the most recent session"
            assert status["sessionId"] == client.list_sessions(limit=1)["sessions"][0][
                "sessionId"]

    anyio.run(main)
    pins = [p["text"] for p in client.list_pins(mine)["pins"]]
    assert pins == ["Never touch the production database."]


@pytest.fixture
def http_server(daemon: DaemonProcess) -> Iterator[tuple[str, str]]:
    proc = subprocess.Popen([sys.executable, *mcp_cmd(daemon, "--http", "--session", CC_MAIN)],
                            env=daemon.env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.startswith("ctxd mcp: "), line
        info = json.loads(line.removeprefix("ctxd mcp: "))
        assert info["url"].startswith("http://127.0.0.1:")
        yield info["url"], info["token"]
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if proc.stderr:
            proc.stderr.close()


def _post(url: str, headers: dict[str, str]) -> int:
    """The HTTP status of an MCP `initialize` request with these headers."""
    from mcp_types.version import LATEST_HANDSHAKE_VERSION

    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": LATEST_HANDSHAKE_VERSION, "capabilities": {},
        "clientInfo": {"name": "test", "version": "0"}}})
    req = urllib.request.Request(url, data=body.encode(), method="POST", headers={
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream", **headers})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_streamable_http_needs_the_token_and_a_local_host(
        http_server: tuple[str, str], client: Client) -> None:
    url, token = http_server

    async def main() -> None:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with http, streamable_http_client(url, http_client=http) as (r, w), \
                ClientSession(r, w) as s:
            with anyio.fail_after(30):
                await s.initialize()
            assert {t.name for t in (await s.list_tools()).tools} == TOOLS
            found = await s.call_tool("search_past_messages", {"query": "数据库 layer",
                                                               "scope": "all"})
            assert not found.is_error and "sidechain" in text(found)
            status = json.loads(text(await s.call_tool("context_status", {})))
            assert status["sessionId"] == CC_MAIN

    anyio.run(main)
    auth = {"Authorization": f"Bearer {token}"}
    assert _post(url, {}) == 401
    assert _post(url, {"Authorization": "Bearer wrong"}) == 401
    assert _post(url, {**auth, "Origin": "http://evil.example"}) in (403, 421)
    port = url.split(":")[2].split("/")[0]
    assert _post(url, {**auth, "Host": f"evil.example:{port}"}) in (403, 421)


def test_http_refuses_a_non_loopback_host(daemon: DaemonProcess) -> None:
    r = subprocess.run([sys.executable, *mcp_cmd(daemon, "--http", "--host", "0.0.0.0")],
                       env=daemon.env, capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and "loopback only" in r.stderr


def test_documented_client_configs_start_the_server(daemon: DaemonProcess,
                                                    tmp_path: Path) -> None:
    """The .mcp.json (Claude Code) and config.toml (Codex) of docs/agents.md, as written,
    start a server that answers; only the interpreter path is this test's own."""
    import tomllib

    doc = (Path(__file__).parent.parent / "docs" / "agents.md").read_text()
    blocks = re.findall(r"```(json|toml)\n(.*?)```", doc, re.S)
    mcp_json = next(json.loads(b) for k, b in blocks if k == "json" and "mcpServers" in b)
    codex = next(tomllib.loads(b) for k, b in blocks if k == "toml" and "mcp_servers" in b)
    configs = [mcp_json["mcpServers"]["ctxd"], codex["mcp_servers"]["ctxd"]]
    for cfg in configs:
        assert cfg["command"] == "ctxd" and cfg["args"][0] == "mcp"

        async def main(cfg: dict[str, Any] = cfg) -> None:
            params = StdioServerParameters(
                command=sys.executable,
                args=["-m", "ctxd.clients.cli", *cfg["args"], "--connection-file",
                      str(daemon.connection_file)],
                env={**daemon.env, **cfg.get("env", {})}, cwd=str(tmp_path))
            async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
                with anyio.fail_after(30):
                    await s.initialize()
                assert {t.name for t in (await s.list_tools()).tools} == TOOLS

        anyio.run(main)
    assert os.path.exists(daemon.connection_file)


def test_stdio_starts_the_shared_daemon_when_none_runs(tmp_path: Path) -> None:
    import signal
    import time

    run_dir, data_dir = tmp_path / "run", tmp_path / "data"
    env = {**os.environ, "CTXD_RUNTIME_DIR": str(run_dir), "CTXD_LOG_LEVEL": "WARNING"}
    for key in ("CTXD_DATA_DIR", "CTXD_CONFIG", "CTXD_CONNECTION_FILE"):
        env.pop(key, None)

    async def main() -> None:
        params = StdioServerParameters(
            command=sys.executable, env=env, cwd=str(tmp_path),
            args=["-m", "ctxd.clients.cli", "mcp", "--data-dir", str(data_dir)])
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            with anyio.fail_after(30):
                await s.initialize()
            status = json.loads(text(await s.call_tool("context_status", {})))
            assert status["chosen"] == "created: no session existed"
            assert status["cwd"] == str(tmp_path)
            assert not (await s.call_tool("pin_invariant", {"text": "keep it"})).is_error

    try:
        anyio.run(main)
        files = list(run_dir.glob("daemon-*.json"))
        assert len(files) == 1  # one daemon, found through its connection file
        with Client.connect(str(files[0]), None, "jsonrpc") as c:
            sessions = c.list_sessions()["sessions"]
            assert [len(c.list_pins(s["sessionId"])["pins"]) for s in sessions] == [1]
    finally:
        for f in run_dir.glob("daemon-*.json"):
            pid = json.loads(f.read_text())["pid"]
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.05)


@pytest.mark.parametrize("mode", ["env", "daemon"])
def test_http_token_from_the_environment_or_the_daemon(daemon: DaemonProcess,
                                                       mode: str) -> None:
    env = {**daemon.env, "CTXD_MCP_TOKEN": "s3cret-from-env"} if mode == "env" else daemon.env
    extra = ("--daemon-token",) if mode == "daemon" else ()
    proc = subprocess.Popen([sys.executable, *mcp_cmd(daemon, "--http", *extra)], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        info = json.loads(proc.stderr.readline().removeprefix("ctxd mcp: "))
        assert "token" not in info  # a token the user chose is never printed
        token = "s3cret-from-env" if mode == "env" else daemon.info()["token"]
        assert _post(info["url"], {"Authorization": f"Bearer {token}"}) == 200
        assert _post(info["url"], {"Authorization": "Bearer s3cret"}) == 401
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stderr:
            proc.stderr.close()
