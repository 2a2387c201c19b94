"""How PostgreSQL reads a session's tail: its own rows only (through its batches' id
ranges), whatever the other sessions have appended since, and with statistics fresh
after a bulk copy.

A plan that reads the tail through the primary key walks every newer row of every other
session (ids are global), so the cost of a read grows with the whole archive instead of
staying with the tail; these tests look at the plans the server actually runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
from helpers import make_config

from ctxd.daemon.engine import Engine
from ctxd.daemon.stores.copy import copy_sqlite_to_postgres
from ctxd.daemon.stores.postgres.store import READ_TAIL, PostgresStore


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", ()) for n in _nodes(child))]


def _tail_plan(store: PostgresStore, session_id: str, start: int) -> list[dict[str, Any]]:
    """The nodes of the plan the server runs for PgArchive's tail read with these values
    (bound client-side, as the statement is never prepared)."""
    conn = store.conn.raw()
    with psycopg.ClientCursor(conn) as cur:
        cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + store.conn._convert(READ_TAIL),
                    (start, session_id, start))
        (raw,) = cur.fetchone()
    return _nodes((raw if isinstance(raw, list) else json.loads(raw))[0]["Plan"])


def _walked(nodes: list[dict[str, Any]]) -> int:
    """Rows a plan read and threw away: other sessions' rows, on a bad plan."""
    return sum(n.get(k, 0) for n in nodes for k in (
        "Rows Removed by Filter", "Rows Removed by Join Filter", "Rows Removed by Index Recheck"))


def test_a_tail_behind_other_sessions_rows_is_read_through_its_session_index(
        tmp_path: Path, pg_dsn: str) -> None:
    store = PostgresStore(pg_dsn)
    engine = Engine(make_config(tmp_path, max_active_messages=10**6), store=store)
    try:
        quiet = engine.create_session().session_id
        busy = engine.create_session().session_id
        # the two sessions' rows interleaved, then 30,000 newer rows of the busy one
        for b in range(10):
            for sid in (quiet, busy):
                done = engine.append(sid, [{"role": "user", "content": f"{b} {i}"}
                                           for i in range(500)])
        start = done.message_ids[0] - 20  # the quiet session's last 20 rows, and on
        for b in range(30):
            engine.append(busy, [{"role": "user", "content": f"b{b} {i}"} for i in range(1000)])
        engine.append(quiet, [{"role": "user", "content": "latest"}])
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("ANALYZE")
        # more runs than psycopg needs to prepare the statement and the server needs to
        # consider a generic plan for it
        for _ in range(12):
            assert len(store.archive.read_from(quiet, start)) == 21
        conn = store.conn.raw()
        # never prepared: the server plans it for each call's values, never generically
        prepared = [r[0] for r in conn.execute(
            "SELECT statement FROM pg_prepared_statements WHERE statement LIKE "
            "'%FROM messages WHERE id = ANY(ARRAY(%'"
        )]
        assert prepared == []
        # and the plan made for these values reads the session's own rows, not the
        # newer rows of the other session
        nodes = _tail_plan(store, quiet, start)
        assert _walked(nodes) < 100, nodes
        assert sum(n["Actual Rows"] * n["Actual Loops"] for n in nodes) < 500, nodes
    finally:
        engine.close()


def test_a_tail_of_one_of_a_few_long_sessions_reads_only_its_rows(
        tmp_path: Path, pg_dsn: str) -> None:
    """Four sessions appended one after the other: the planner, taking session and id as
    independent, expects a quarter of the newer rows to be the first session's and once
    walked the primary key through all three other sessions for a 24-row tail."""
    store = PostgresStore(pg_dsn)
    engine = Engine(make_config(tmp_path, max_active_messages=10**6), store=store)
    try:
        sessions = [engine.create_session().session_id for _ in range(4)]
        for sid in sessions:
            for b in range(10):
                done = engine.append(sid, [{"role": "user", "content": f"{b} {i}"}
                                           for i in range(500)])
            if sid == sessions[0]:
                start = done.message_ids[-24]
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("ANALYZE")
        tail = store.archive.read_from(sessions[0], start)
        assert [m["id"] for m in tail] == list(range(start, start + 24))
        assert [m["id"] for m in store.archive.read_from(sessions[0], start, start + 9)] == \
            list(range(start, start + 10))
        nodes = _tail_plan(store, sessions[0], start)
        assert _walked(nodes) < 100, nodes
        assert sum(n["Actual Rows"] * n["Actual Loops"] for n in nodes) < 500, nodes
    finally:
        engine.close()


def test_a_copy_leaves_fresh_statistics(tmp_path: Path, pg_dsn: str) -> None:
    data = tmp_path / "data"
    e = Engine(make_config(data))
    sid = e.create_session().session_id
    e.append(sid, [{"role": "user", "content": f"m{i}"} for i in range(50)])
    e.close()
    assert copy_sqlite_to_postgres(data, pg_dsn)["messages"] == 50
    with psycopg.connect(pg_dsn) as c:
        analyzed = dict(c.execute(
            "SELECT relname, last_analyze IS NOT NULL FROM pg_stat_user_tables "
            "WHERE relname IN ('messages', 'batches')"
        ).fetchall())
    assert analyzed == {"messages": True, "batches": True}


def test_store_connections_compile_nothing(tmp_path: Path, pg_dsn: str) -> None:
    """JIT off on every connection the store opens, the first and one after a lost one."""
    store = PostgresStore(pg_dsn)
    try:
        assert store.conn.raw().execute("SHOW jit").fetchone()[0] == "off"
        store.conn.raw().close()  # as a server restart would leave it
        assert store.conn.raw().execute("SHOW jit").fetchone()[0] == "off"
    finally:
        store.close()
