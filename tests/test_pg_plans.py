"""How PostgreSQL reads a session's tail: through its (session_id, id) index, whatever
the other sessions have appended since, and with statistics fresh after a bulk copy.

A plan that reads the tail through the primary key walks every newer row of every other
session (ids are global), so the cost of a read grows with the whole archive instead of
staying with the tail; these tests look at the plans the server actually runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
from helpers import make_config
from psycopg import sql

from ctxd.daemon.engine import Engine
from ctxd.daemon.pg.copy import copy_sqlite_to_postgres
from ctxd.daemon.pg.store import PostgresStore


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", ()) for n in _nodes(child))]


def test_a_tail_behind_other_sessions_rows_is_read_through_its_session_index(
        tmp_path: Path, pg_dsn: str) -> None:
    store = PostgresStore(pg_dsn)
    engine = Engine(make_config(tmp_path, max_active_messages=10**6), store=store)
    try:
        quiet = engine.create_session()["sessionId"]
        busy = engine.create_session()["sessionId"]
        # the two sessions' rows interleaved, then 30,000 newer rows of the busy one
        for b in range(10):
            for sid in (quiet, busy):
                done = engine.append(sid, [{"role": "user", "content": f"{b} {i}"}
                                           for i in range(500)])
        start = done["messageIds"][0] - 20  # the quiet session's last 20 rows, and on
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
            "'%FROM messages WHERE session_id = $1 AND id >= $2%'"
        )]
        assert prepared == []
        # and the plan made for these values reads the session's index, not the newer
        # rows of the other session
        (raw,) = conn.execute(sql.SQL(
            "EXPLAIN (ANALYZE, FORMAT JSON) SELECT id, batch_id, body, tokens, created_at "
            "FROM messages WHERE session_id = {} AND id >= {} ORDER BY id"
        ).format(sql.Literal(quiet), sql.Literal(start))).fetchone()
        plan = (raw if isinstance(raw, list) else json.loads(raw))[0]["Plan"]
        walked = sum(n.get("Rows Removed by Filter", 0) for n in _nodes(plan))
        used = {n.get("Index Name") for n in _nodes(plan)} - {None}
        assert walked < 100 and "messages_pkey" not in used, (walked, used)
    finally:
        engine.close()


def test_a_copy_leaves_fresh_statistics(tmp_path: Path, pg_dsn: str) -> None:
    data = tmp_path / "data"
    e = Engine(make_config(data))
    sid = e.create_session()["sessionId"]
    e.append(sid, [{"role": "user", "content": f"m{i}"} for i in range(50)])
    e.close()
    assert copy_sqlite_to_postgres(data, pg_dsn)["messages"] == 50
    with psycopg.connect(pg_dsn) as c:
        analyzed = dict(c.execute(
            "SELECT relname, last_analyze IS NOT NULL FROM pg_stat_user_tables "
            "WHERE relname IN ('messages', 'batches')"
        ).fetchall())
    assert analyzed == {"messages": True, "batches": True}
