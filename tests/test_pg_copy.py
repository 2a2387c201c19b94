"""`ctxd migrate --store postgres` and `ctxd copy --from sqlite:DIR --to postgres:DSN`,
run as an operator runs them: the CLI in a subprocess, real databases on both ends."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
from helpers import agent_turn, make_config
from pg import PASSWORD, PgCluster

from ctxd.daemon.engine import Engine
from ctxd.daemon.stores.copy import copy_sqlite_to_postgres
from ctxd.daemon.stores.postgres import schema
from ctxd.daemon.stores.postgres.store import PostgresStore

PW_VAR = "CTXD_TEST_PG_PASSWORD"


def ctxd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ctxd.clients.cli", *args], capture_output=True, text=True,
        env={**__import__("os").environ, PW_VAR: PASSWORD}, timeout=120,
    )


def _tcp(cluster: PgCluster, socket_dsn: str) -> str:
    return cluster.tcp_dsn(psycopg.conninfo.conninfo_to_dict(socket_dsn)["dbname"])


def test_migrate_creates_then_reports_current(pg_cluster: PgCluster, pg_dsn: str) -> None:
    dsn = _tcp(pg_cluster, pg_dsn)
    r = ctxd("migrate", "--store", "postgres", "--dsn", dsn, "--password-env", PW_VAR)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"postgres: schema version {schema.SCHEMA_VERSION} (was 0)"
    r = ctxd("migrate", "--store", "postgres", "--dsn", dsn, "--password-env", PW_VAR)
    current = f"postgres: schema version {schema.SCHEMA_VERSION} (already current)"
    assert r.stdout.strip() == current
    r = ctxd("migrate", "--store", "postgres", "--dsn", dsn)  # no password
    assert r.returncode == 2 and "ctxd: migrate:" in r.stderr and "Traceback" not in r.stderr


def _build_archive(data: Path) -> str:
    cfg = make_config(data, max_active_messages=30, keep_messages=8)
    e = Engine(cfg)
    sid = e.create_session(title="to copy", metadata={"team": "a"}).session_id
    e.append(sid, [{"role": "system", "content": "You are terse."}])
    for i in range(12):
        e.append(sid, agent_turn(i), client_batch_id=f"b{i}")
    e.append(sid, [{"role": "user", "content": "我们讨论了上下文压缩策略"}])
    e.add_pin(sid, "never touch production")
    e.compact_sync(sid)
    run = e.start_run(sid)
    e.append(sid, [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_x", "type": "function", "function": {"name": "shell", "arguments": "{}"}}
    ]}])
    e.request_approval(sid, run.run_id, "call_x", "shell", {"cmd": "ls"})
    other = e.create_session(title="second").session_id
    e.append(other, [{"role": "user", "content": "hello"}])
    e.close()
    return sid


def _snapshot(e: Engine, sid: str) -> dict:
    return {
        "archive": e.read_archive(sid, limit=1000).messages,
        "context": e.get_context(sid).messages,
        "status": e.status(sid),
        "pins": e.pins(sid),
        "approvals": e.list_approvals(sid),
        "compactions": e.compaction_log(sid),
        "search": [h.message_id for h in e.search("压缩", session_id=sid)],
        "sessions": e.list_sessions().sessions,
    }


def test_copy_is_faithful_resumable_and_idempotent(tmp_path: Path, pg_cluster: PgCluster,
                                                   pg_dsn: str) -> None:
    data = tmp_path / "data"
    sid = _build_archive(data)
    sqlite_engine = Engine(make_config(data))
    expected = _snapshot(sqlite_engine, sid)
    sqlite_engine.close()
    assert expected["search"] and expected["compactions"] and expected["approvals"]

    # a copy cut short after 5 batches, then resumed by the CLI
    part = copy_sqlite_to_postgres(data, pg_dsn, max_batches=5, chunk=2)
    assert part["batches"] == 5
    dsn = _tcp(pg_cluster, pg_dsn)
    r = ctxd("copy", "--from", f"sqlite:{data}", "--to", f"postgres:{dsn}",
             "--password-env", PW_VAR, "--json")
    assert r.returncode == 0, r.stderr
    rest = json.loads(r.stdout)
    with psycopg.connect(pg_dsn) as c:
        total = c.execute("SELECT count(*) FROM batches").fetchone()[0]
    assert part["batches"] + rest["batches"] == total == 16
    assert rest["sessions"] == 0  # the first, cut short copy had them all

    # again: nothing archived twice, the changing rows refreshed
    again = copy_sqlite_to_postgres(data, pg_dsn)
    assert (again["batches"], again["messages"], again["sessions"]) == (0, 0, 0)
    with psycopg.connect(pg_dsn) as c:
        assert c.execute("SELECT count(*) FROM batches").fetchone()[0] == 16

    pg_engine = Engine(make_config(tmp_path / "unused"), store=PostgresStore(pg_dsn))
    try:
        assert _snapshot(pg_engine, sid) == expected
        # the copy goes on working as an archive: the next id follows the copied ones
        with psycopg.connect(pg_dsn) as c:
            top = c.execute("SELECT max(id) FROM messages").fetchone()[0]
        fresh = pg_engine.create_session().session_id
        new = pg_engine.append(fresh, [{"role": "user", "content": "after the move"}])
        assert new.message_ids == [top + 1]
    finally:
        pg_engine.close()

    # once daemons write to PostgreSQL, a copy no longer fits on top of it
    r = ctxd("copy", "--from", f"sqlite:{data}", "--to", f"postgres:{dsn}",
             "--password-env", PW_VAR)
    assert r.returncode == 2 and "not this archive's" in r.stderr


def test_copy_refuses_a_foreign_target(tmp_path: Path, pg_dsn: str) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _build_archive(a)
    e = Engine(make_config(b))
    s = e.create_session().session_id
    for i in range(20):
        e.append(s, [{"role": "user", "content": f"other {i}"}])
    e.close()
    copy_sqlite_to_postgres(b, pg_dsn)
    r = ctxd("copy", "--from", f"sqlite:{a}", "--to", f"postgres:{pg_dsn}")
    assert r.returncode == 2
    assert "not this archive's" in r.stderr and "Traceback" not in r.stderr
    r = ctxd("copy", "--from", f"{a}", "--to", f"postgres:{pg_dsn}")
    assert r.returncode == 2 and "expected sqlite:DIR" in r.stderr
