"""How PostgreSQL reads a session's tail: its own rows only (through its batches' id
ranges), whatever the other sessions have appended since, and with statistics fresh
after a bulk copy; and so under a generic plan too (what a prepared statement switches
to), alone or in the bundles a `context/get` and a status send, with statistics fresh
or stale.

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
from ctxd.daemon.stores.postgres import bundle, prefetch
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
        # prepared, and its generic plan reads the session's own rows too
        prepared = [r[0] for r in store.conn.raw().execute(
            "SELECT statement FROM pg_prepared_statements WHERE statement LIKE "
            "'%FROM messages WHERE id = ANY(ARRAY(%' AND statement LIKE '%ORDER BY id'"
        )]
        assert len(prepared) == 1, prepared
        assert_generic_plans_read_only(store, quiet, start)
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


def _numbered(sql: str) -> str:
    """`?` placeholders as PREPARE takes them ($1, $2...)."""
    parts = sql.split("?")
    return parts[0] + "".join(f"${i}{p}" for i, p in enumerate(parts[1:], 1))


def _generic_plan(conn: psycopg.Connection, sql: str, params: Any) -> list[dict[str, Any]]:
    """The nodes of the generic plan (made without the values, as a prepared statement's
    may be) the server runs for `sql`, run with `params`."""
    conn.execute("DEALLOCATE ALL")
    conn.execute("SET plan_cache_mode = force_generic_plan")
    try:
        conn.execute(f"PREPARE read_ahead AS {_numbered(sql)}")
        values = ", ".join(psycopg.sql.Literal(p).as_string(conn) for p in params)
        (raw,) = conn.execute(
            f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE read_ahead({values})").fetchone()
    finally:
        conn.execute("RESET plan_cache_mode")
        conn.execute("DEALLOCATE ALL")
    return _nodes((raw if isinstance(raw, list) else json.loads(raw))[0]["Plan"])


def _forms(store: PostgresStore, sid: str, start: int) -> dict[str, tuple[str, Any]]:
    """Every statement the store sends that reads the session's rows from an id on,
    alone and in the bundles a `context/get` and a status send."""
    tail = prefetch.tail(sid, start)
    status = store._status_reads(sid, True, True, True)
    assert status[0][0] == prefetch.COUNT_FROM  # the count is not known yet
    first = [*status, prefetch.pins(sid), tail]
    second = [prefetch.messages([start]), tail, *prefetch.stored_bytes(sid, start, [start], [])]
    return {
        "tail": tail,
        "range": (prefetch.READ_TAIL_RANGE, (start, start + 9, sid, start, start + 9)),
        "count": prefetch.message_count(store.archive, sid),
        "bytes": prefetch.stored_bytes(sid, start, [], [])[0],
        "status bundle": bundle.statement(status),
        "context/get bundle": bundle.statement(first),
        "context/get tail bundle": bundle.statement(second),
    }


def assert_generic_plans_read_only(store: PostgresStore, sid: str, start: int) -> None:
    """Each form's generic plan reads no message of another session (nor through the
    primary key past the session's tail), and each of its scans at most a page of
    other sessions' batches (a seq scan of a table that small is the plan's right
    call)."""
    with psycopg.connect(store.conn.dsn, autocommit=True) as conn:
        conn.prepare_threshold = None  # its own statements stay unprepared (DEALLOCATE ALL)
        (own,) = conn.execute("SELECT count(*) FROM messages WHERE session_id = %s",
                              (sid,)).fetchone()
        plans = {name: _generic_plan(conn, sql, params)
                 for name, (sql, params) in _forms(store, sid, start).items()}
    for name, nodes in plans.items():
        on_messages = [n for n in nodes if n.get("Relation Name") == "messages"]
        assert on_messages, (name, nodes)
        assert all(n["Node Type"] != "Seq Scan" for n in on_messages), (name, nodes)
        assert _walked(on_messages) == 0, (name, nodes)
        assert all(n["Actual Rows"] * n["Actual Loops"] <= own for n in on_messages), (
            name, nodes)
        assert all(_walked([n]) < 100 for n in nodes), (name, nodes)


def _add_rows(c: psycopg.Connection, sid: str, rows: int, per_batch: int) -> tuple[int, int]:
    """`rows` messages of the session in batches of `per_batch` (turn-sized batches make
    a batches table as long as a busy archive's), written as the archive writes them:
    each batch a contiguous id range of one session. Returns the first and last id."""
    c.execute("INSERT INTO sessions(id, created_at) VALUES (%s, 0) ON CONFLICT DO NOTHING",
              (sid,))
    (batch,) = c.execute("SELECT coalesce(max(id), 0) + 1 FROM batches").fetchone()
    (first,) = c.execute("SELECT coalesce(max(id), 0) + 1 FROM messages").fetchone()
    c.execute(
        "INSERT INTO batches(id, session_id, digest, first_message_id, last_message_id, "
        "created_at) SELECT %(b)s::bigint + n, %(s)s, 'd', %(f)s::bigint + n * %(k)s::bigint, "
        "least(%(f)s::bigint + (n + 1) * %(k)s::bigint, %(f)s::bigint + %(r)s::bigint) - 1, 0 "
        "FROM generate_series(0, (%(r)s::bigint + %(k)s::bigint - 1) / %(k)s::bigint - 1) n",
        {"b": batch, "s": sid, "f": first, "k": per_batch, "r": rows})
    c.execute(
        "INSERT INTO messages(id, session_id, batch_id, role, body, tokens, created_at) "
        "SELECT %(f)s::bigint + i, %(s)s, %(b)s::bigint + i / %(k)s::bigint, 'user', "
        "'{\"role\": \"user\", \"content\": \"x\"}', 3, 0 "
        "FROM generate_series(0, %(r)s::bigint - 1) i",
        {"b": batch, "s": sid, "f": first, "k": per_batch, "r": rows})
    return first, first + rows - 1


def test_generic_plans_read_only_the_session_with_stale_statistics(pg_dsn: str) -> None:
    """Statistics taken when the archive held one short session (autovacuum kept from
    taking new ones, as after a bulk load it has not reached yet) make `session_id = ?`
    match every row: a generic plan then once scanned every batch of every session."""
    store = PostgresStore(pg_dsn)
    try:
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            for table in ("messages", "batches"):
                c.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
            _add_rows(c, "early", 100, 3)
            c.execute("ANALYZE")
            for _ in range(10):  # two sessions' turns interleaved
                _, last = _add_rows(c, "quiet", 500, 3)
                _add_rows(c, "busy", 500, 3)
            _add_rows(c, "busy", 30000, 3)
            _add_rows(c, "quiet", 1, 1)
        start = last - 19
        assert [m["id"] for m in store.archive.read_from("quiet", start)][:20] == \
            list(range(start, last + 1))
        assert_generic_plans_read_only(store, "quiet", start)
    finally:
        store.close()


def test_generic_plans_read_only_the_session_with_fresh_statistics(pg_dsn: str) -> None:
    """Four sessions one after the other, turn-sized batches, statistics fresh: a
    generic plan counted the first session's rows through the primary key."""
    store = PostgresStore(pg_dsn)
    try:
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            for i, sid in enumerate("abcd"):
                _, last = _add_rows(c, sid, 5000, 3)
                if i == 0:
                    start = last - 23
            c.execute("ANALYZE")
        assert store.archive.message_count("a") == 5000
        assert store.archive.stored_bytes("a", start) == 24 * len(
            '{"role": "user", "content": "x"}')
        assert_generic_plans_read_only(store, "a", start)
    finally:
        store.close()
