"""The summary's size and manual compaction through a real daemon: over its JSON-RPC
wire, through the CLI (what compact and rebuild say), and the size keys in `ctxd config`.
The engine-level cases are in test_summary_size.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import DaemonProcess
from test_summary_size import EN_SESSION, _short_messages, assistant, check_pairs, user

from ctxd.daemon.config import ConfigError, load_config

# --------------------------------------------- a real daemon, its wire, the CLI


def _renumbered(msgs: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """The same messages with tool call ids of their own."""
    out = []
    for m in msgs:
        if m["role"] == "tool":
            m = {**m, "tool_call_id": f"{m['tool_call_id']}_{k}"}
        elif m.get("tool_calls"):
            m = {**m, "tool_calls": [{**c, "id": f"{c['id']}_{k}"} for c in m["tool_calls"]]}
        out.append(m)
    return out


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("summary-size")).start()
    try:
        yield d
    finally:
        d.stop()


def cli(d: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "ctxd.clients.cli", *args,
           "--connection-file", str(d.connection_file)]
    return subprocess.run(cmd, env=d.env, capture_output=True, text=True, timeout=120,
                          encoding="utf-8")


def test_over_the_wire_manual_compaction_of_short_contexts(daemon: DaemonProcess) -> None:
    with daemon.client(wire="jsonrpc") as c:
        sid = c.call("session/create", {"title": "short"})["sessionId"]
        c.call("messages/append", {"sessionId": sid, "messages": _short_messages(80)})
        first = c.call("context/compact", {"sessionId": sid, "force": True,
                                           "instructions": "keep item 7"})
        assert first["effective"] and first["instructionsApplied"] is True
        assert first["after"]["tokens"] < first["before"]["tokens"]
        c.call("messages/append", {"sessionId": sid, "messages": _short_messages(20, 100)})
        second = c.call("context/compact", {"sessionId": sid, "force": True})
        assert second["effective"], second
        rows = c.call("context/compactions", {"sessionId": sid})["compactions"]
        assert [r["instructions"] for r in rows] == [None, "keep item 7"]
        ctx = c.call("context/get", {"sessionId": sid})["messages"]
        check_pairs(ctx)


def test_cli_says_what_compact_and_rebuild_did(daemon: DaemonProcess) -> None:
    with daemon.client() as c:
        small = c.call("session/create", {"title": "small"})["sessionId"]
        c.call("messages/append", {"sessionId": small,
                                   "messages": [user("hello"), assistant("hi")]})
        big = c.call("session/create", {"title": "big"})["sessionId"]
        for k in range(3):
            c.call("messages/append", {"sessionId": big, "messages": _renumbered(EN_SESSION, k)})
    r = cli(daemon, "compact", small, "--instructions", "keep the deployment rules")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("compaction: not effective")
    assert "instructions: not applied" in r.stdout
    r = cli(daemon, "compact", big, "--force")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("compaction: effective")
    r = cli(daemon, "--json", "rebuild", big)
    assert r.returncode == 0, r.stderr
    rebuilt = json.loads(r.stdout)
    # a rebuild never brings summarized messages back into the context
    assert rebuilt["after"]["messages"] <= rebuilt["before"]["messages"]
    r = cli(daemon, "rebuild", big)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("rebuild: ")
    # kept and "not effective" are never said together
    assert not ("not effective" in r.stdout and "kept" in r.stdout), r.stdout


# ------------------------------------------------------------------- config


def test_size_keys_in_config_file_environment_and_ctxd_config(tmp_path: Path) -> None:
    toml = tmp_path / "ctxd.toml"
    toml.write_text("[compaction]\nsummary_share = 0.25\nforce_keep_messages = 4\n")
    policy = load_config(toml, environ={}).compaction
    assert (policy.summary_share, policy.force_keep_messages) == (0.25, 4)
    env = {"CTXD_SUMMARY_SHARE": "0.5", "CTXD_FORCE_KEEP_MESSAGES": "8"}
    policy = load_config(environ=env).compaction
    assert (policy.summary_share, policy.force_keep_messages) == (0.5, 8)
    for bad in ({"CTXD_SUMMARY_SHARE": "1.5"}, {"CTXD_SUMMARY_SHARE": "0"},
                {"CTXD_FORCE_KEEP_MESSAGES": "0"}):
        with pytest.raises(ConfigError) as info:
            load_config(environ=bad)
        assert next(iter(bad)) in str(info.value)
    out = subprocess.run([sys.executable, "-m", "ctxd.clients.cli", "config"],
                         env={**os.environ, "CTXD_SUMMARY_SHARE": "0.3"}, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert '"summary_share": 0.3' in out.stdout and '"force_keep_messages": 6' in out.stdout
