"""A second real editor: Emacs (Debian's emacs-nox with elpa-eglot 1.9) drives `ctxd lsp`
through eglot in batch mode. eglot 1.9 declares neither `window.showMessage` nor
`workDoneProgress`, so approvals come as a message plus code actions, and a compaction
shows in `ctxd/status` rather than as progress."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from helpers import DaemonProcess, agent_turn
from lsp_harness import lsp_command

SCRIPT = Path(__file__).with_name("eglot_lsp.el")
# a deadline for each wait, polled for its condition: generous, since a loaded 2-core
# machine can take tens of seconds to start Emacs, eglot and `ctxd lsp`
PATIENCE = 300


def test_emacs_eglot_symbols_approval_progress_documents(tmp_path: Path) -> None:
    emacs = shutil.which("emacs")
    assert emacs, "Emacs is needed: apt-get install emacs-nox elpa-eglot (.ci/run)"
    (tmp_path / "notes.txt").write_text("notes\n")
    daemon = DaemonProcess(tmp_path).start()
    proc = None
    try:
        with daemon.client("jsonrpc") as agent:
            sid = agent.create_session(title="emacs")["sessionId"]
            for i in range(4):
                agent.append(sid, agent_turn(i))
            agent.append(sid, [{"role": "user", "content": "别再修改生产数据库的配置"}])
            out, ready = tmp_path / "out.json", tmp_path / "ready"
            env = {**daemon.env, "HOME": str(tmp_path), "CTXD_ROOT": str(tmp_path),
                   "CTXD_OUT": str(out), "CTXD_READY": str(ready), "CTXD_SESSION": sid,
                   "CTXD_LSP_CMD": json.dumps(lsp_command(daemon, tmp_path / "cache"))}
            compacted = tmp_path / "compacted"
            env["CTXD_COMPACTED"] = str(compacted)
            # --no-init-file, not -Q: Debian's site-start puts elpa-eglot on the load path
            proc = subprocess.Popen([emacs, "--batch", "--no-init-file", "-l", str(SCRIPT)],
                                    env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT)
            deadline = time.monotonic() + PATIENCE
            while not ready.exists():
                assert proc.poll() is None, (proc.stdout.read().decode(errors="replace"),
                                             out.exists() and out.read_text())
                assert time.monotonic() < deadline, "eglot never connected"
                time.sleep(0.05)
            run = agent.start_run(sid)["runId"]
            agent.append(sid, [{"role": "assistant", "content": None, "tool_calls": [
                {"id": "e1", "type": "function",
                 "function": {"name": "rm_rf", "arguments": '{"path": "build"}'}}]}],
                run_id=run)
            aid = agent.request_approval(sid, run, "e1", "rm_rf", {"path": "build"})["approvalId"]
            deadline = time.monotonic() + PATIENCE
            while (approval := agent.list_approvals(sid)["approvals"][0])["status"] == "pending":
                assert time.monotonic() < deadline, "Emacs never answered the approval"
                time.sleep(0.05)
            assert (approval["approvalId"], approval["status"]) == (aid, "approved")
            agent.append(sid, [{"role": "tool", "tool_call_id": "e1", "content": "removed"}],
                         run_id=run)
            agent.finish_run(run, "completed")
            cli = subprocess.run([sys.executable, "-m", "ctxd.clients.cli", "compact", sid,
                                  "--force", "--connection-file", str(daemon.connection_file)],
                                 env=daemon.env, capture_output=True, timeout=PATIENCE)
            assert cli.returncode == 0, cli.stderr
            compacted.write_text("done")
            log = proc.communicate(timeout=PATIENCE)[0].decode(errors="replace")
            assert proc.returncode == 0, log
            result = json.loads(out.read_text())
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        daemon.stop()
    assert "error" not in result, (result["error"], log)
    assert "ctxd.pin" in result["commands"]
    approval_message = next(m for m in result["messages"] if "ctxd.resolveApproval" in m)
    assert "rm_rf" in approval_message and aid in approval_message
    assert result["action"] == f"ctxd: approve rm_rf ({aid})"
    assert result["resolved"]["status"] == "approved"
    # eglot 1.9 declares no workDoneProgress: the compaction shows in ctxd/status instead
    assert "$/progress" not in result["notifications"]
    assert result["notifications"].count("ctxd/status") >= 2
    assert result["symbols"] == ["别再修改生产数据库的配置"]
    assert result["symbol_next"] == "别再修改生产数据库的配置"
    assert result["context"].startswith("# Context: emacs") and "## Summary" in result["context"]
