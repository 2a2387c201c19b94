"""`ctxd import` into a daemon on the PostgreSQL store (a real cluster): the messages'
and the session's own times are stored there as on SQLite."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from helpers import DaemonProcess
from pg import PASSWORD, PgCluster

REAL = Path(__file__).resolve().parent.parent / "bench" / "data" / "transcripts"
PW_VAR = "CTXD_TEST_PG_PASSWORD"


def _unix(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_imported_times_on_postgres(tmp_path: Path) -> None:
    src = REAL / "codex" / "rollout-privacy-x402.jsonl"
    path = tmp_path / "pg-times.jsonl"
    shutil.copyfile(src, path)
    lines = [json.loads(ln) for ln in src.read_text(encoding="utf-8").splitlines()]
    last = max(_unix(r["timestamp"]) for r in lines)
    os.utime(path, (last, last))
    cluster = PgCluster().start()
    (tmp_path / "d").mkdir()
    d = DaemonProcess(tmp_path / "d", env={
        "CTXD_STORE": "postgres", "CTXD_POSTGRES_DSN": cluster.tcp_dsn(),
        "CTXD_POSTGRES_PASSWORD_ENV": PW_VAR, PW_VAR: PASSWORD}).start()
    try:
        r = subprocess.run([sys.executable, "-m", "ctxd.clients.cli", "import", "codex",
                            str(path), "--json", "--connection-file", str(d.connection_file)],
                           env=d.env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["messages"] > 10
        with d.client("jsonrpc") as c:
            msgs = c.read("codex-pg-times", limit=1000)["messages"]
            for m in msgs:
                line = lines[m["metadata"]["line"] - 1]
                assert m["createdAt"] == pytest.approx(_unix(line["timestamp"]), abs=1e-3)
            session = c.get_session("codex-pg-times")["session"]
            meta = next(r for r in lines if r.get("type") == "session_meta")
            assert session["createdAt"] == pytest.approx(_unix(meta["payload"]["timestamp"]),
                                                         abs=1e-3)
            # since/until read the stored times on PostgreSQL too
            user = next(m for m in msgs if m["role"] == "user"
                        and re.search(r"[A-Za-z]{6,}", m.get("content") or ""))
            word = max(re.findall(r"[A-Za-z]{6,}", user["content"]), key=len)
            span = c.search(word, session_id="codex-pg-times", since=session["createdAt"],
                            until=msgs[-1]["createdAt"], limit=100)
            assert user["id"] in [h["messageId"] for h in span["hits"]]
            before = c.search(word, session_id="codex-pg-times",
                              until=session["createdAt"] - 1)
            assert before["hits"] == []
    finally:
        d.stop()
        cluster.stop()
