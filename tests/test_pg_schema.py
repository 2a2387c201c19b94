"""The PostgreSQL schema on a real server: the database itself enforces the archive's
guarantees, whichever daemon (or person with psql) writes."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from ctxd.daemon.stores.postgres import schema, tsearch


@pytest.fixture
def conn(pg_dsn: str):
    c = psycopg.connect(pg_dsn, autocommit=True)
    assert schema.migrate(c) == schema.SCHEMA_VERSION
    yield c
    c.close()


def _session(conn, sid="s1") -> None:
    conn.execute("INSERT INTO sessions(id, created_at) VALUES (%s, 0)", (sid,))


def _message(conn, sid="s1", text="hello", batch_client_id=None) -> int:
    bid = conn.execute("SELECT nextval('batch_ids')").fetchone()[0]
    mid = conn.execute("SELECT nextval('message_ids')").fetchone()[0]
    conn.execute(
        "INSERT INTO batches VALUES (%s, %s, %s, NULL, 'd', %s, %s, 0)",
        (bid, sid, batch_client_id, mid, mid),
    )
    conn.execute(
        "INSERT INTO messages VALUES (%s, %s, %s, 'user', %s, 1, 0)",
        (mid, sid, bid, '{"role":"user","content":"x"}'),
    )
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO messages_search VALUES (%s, %s, %s::tsvector)",
            [(mid, i, lit) for i, lit in enumerate(tsearch.tsvector_parts(text))],
        )
    return mid


def test_cluster_takes_a_password_over_tcp(pg_cluster) -> None:
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(pg_cluster.tcp_dsn(), password="wrong").close()
    from pg import PASSWORD

    with psycopg.connect(pg_cluster.tcp_dsn(), password=PASSWORD) as c:
        assert c.execute("SELECT 1").fetchone() == (1,)


def test_migrate_is_idempotent_and_concurrent(pg_dsn: str) -> None:
    results: list[int] = []

    def run() -> None:
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            results.append(schema.migrate(c))

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [schema.SCHEMA_VERSION] * 3
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        assert schema.migrate(c) == schema.SCHEMA_VERSION
        assert c.execute("SELECT count(*) FROM ctxd_schema").fetchone() == (1,)


def test_archive_refuses_update_delete_truncate(conn) -> None:
    _session(conn)
    mid = _message(conn)
    for sql in (
        "UPDATE messages SET body = 'x' WHERE id = %s",
        "DELETE FROM messages WHERE id = %s",
        "UPDATE batches SET digest = 'x' WHERE first_message_id = %s",
        "DELETE FROM batches WHERE first_message_id = %s",
    ):
        with pytest.raises(psycopg.errors.RestrictViolation, match="append-only"):
            conn.execute(sql, (mid,))
    for table in ("messages", "batches"):
        with pytest.raises(psycopg.errors.RestrictViolation, match="append-only"):
            conn.execute(f"TRUNCATE {table} CASCADE")
    conn.execute("INSERT INTO tool_calls VALUES ('s1', 'c1', %s)", (mid,))
    with pytest.raises(psycopg.errors.RestrictViolation):
        conn.execute("DELETE FROM tool_calls")
    assert conn.execute("SELECT count(*) FROM messages").fetchone() == (1,)


def test_client_batch_id_is_unique_per_session(conn) -> None:
    _session(conn)
    _session(conn, "s2")
    _message(conn, batch_client_id="b1")
    _message(conn, "s2", batch_client_id="b1")  # another session may reuse it
    _message(conn)  # no client id: any number
    _message(conn)
    with pytest.raises(psycopg.errors.UniqueViolation):
        _message(conn, batch_client_id="b1")


def test_one_open_run_per_session_enforced_by_the_database(conn) -> None:
    _session(conn)
    conn.execute("INSERT INTO runs VALUES ('r1', 's1', 'open', 0, NULL)")
    with pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute("INSERT INTO runs VALUES ('r2', 's1', 'open', 0, NULL)")
    conn.execute("UPDATE runs SET status = 'completed' WHERE id = 'r1'")
    conn.execute("INSERT INTO runs VALUES ('r2', 's1', 'open', 0, NULL)")


def test_approval_first_answer_wins(pg_dsn: str, conn) -> None:
    _session(conn)
    conn.execute(
        "INSERT INTO approvals(id, session_id, run_id, tool_call_id, status, created_at) "
        "VALUES ('a1', 's1', 'r1', 'c1', 'pending', 0)"
    )
    barrier = threading.Barrier(8)
    won: list[str] = []

    def answer(decision: str) -> None:
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            barrier.wait()
            cur = c.execute(
                "UPDATE approvals SET status = %s, resolved_at = %s "
                "WHERE id = 'a1' AND status = 'pending'",
                (decision, time.time()),
            )
            if cur.rowcount == 1:
                won.append(decision)

    threads = [
        threading.Thread(target=answer, args=("approved" if i % 2 else "denied",))
        for i in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    assert conn.execute("SELECT status FROM approvals").fetchone() == (won[0],)


def _search(conn, query: str) -> list[int]:
    return [
        r[0]
        for r in conn.execute(
            "SELECT message_id FROM messages_search WHERE tsv @@ %s::tsquery "
            "GROUP BY message_id ORDER BY max(ts_rank(tsv, %s::tsquery)) DESC, message_id",
            (query, query),
        )
    ]


def test_search_finds_chinese_words_as_sqlite_does(conn) -> None:
    _session(conn)
    a = _message(conn, text="我们讨论了上下文压缩策略")
    b = _message(conn, text="压力很大, 缩小范围")  # both characters, never side by side
    c = _message(conn, text="Café résumé of the COMPACTION plan")
    d = _message(conn, text="compaction compaction compaction then more compaction")
    assert _search(conn, tsearch.plain_query("压缩")) == [a]
    assert _search(conn, tsearch.plain_query("上下文")) == [a]
    assert sorted(_search(conn, tsearch.any_terms_query("压 缩"))) == [a, b]
    assert _search(conn, tsearch.plain_query("cafe resume")) == [c]
    # ranked: more occurrences first
    assert _search(conn, tsearch.plain_query("compaction")) == [d, c]
    # quotes, stars and operators in plain text are text, not syntax
    assert _search(conn, tsearch.plain_query("'compaction' & !x")) == []
    assert tsearch.plain_query("*** ---") is None


def test_advanced_query_syntax(conn) -> None:
    _session(conn)
    a = _message(conn, text="alpha beta gamma")
    b = _message(conn, text="alpha delta")
    assert _search(conn, tsearch.advanced_query("alpha NOT beta")) == [b]
    assert sorted(_search(conn, tsearch.advanced_query("beta OR delta"))) == [a, b]
    assert _search(conn, tsearch.advanced_query('"beta gamma"')) == [a]
    assert _search(conn, tsearch.advanced_query('"gamma beta"')) == []
    assert sorted(_search(conn, tsearch.advanced_query("alph*"))) == [a, b]
    assert _search(conn, tsearch.advanced_query("(beta OR delta) gamma")) == [a]


def test_huge_message_vector_is_bounded(conn) -> None:
    _session(conn)
    words = " ".join(f"w{i}" for i in range(120_000)) + " 压缩" * 300
    mid = _message(conn, text=words)
    assert _search(conn, tsearch.plain_query("w5")) == [mid]
    assert _search(conn, tsearch.plain_query("w119999")) == [mid]
    assert _search(conn, tsearch.plain_query("w119999 压缩")) == [mid]
    # a phrase across the cut between two parts
    cut = tsearch.MAX_POSITION
    assert _search(conn, tsearch.advanced_query(f'"w{cut - 2} w{cut - 1} w{cut} w{cut + 1}"')) == [
        mid
    ]
    assert conn.execute("SELECT count(*) FROM messages_search").fetchone()[0] > 1


def test_snippet_marks_matches() -> None:
    text = "一 " * 40 + "我们讨论了上下文压缩策略 and more words after it"
    q = tsearch.plain_query("压缩")
    s = tsearch.snippet(text, tsearch.query_lexemes(q))
    assert "**压缩**" in s
    assert s.startswith("…")
    assert "\u200b" not in s


def test_snippet_of_a_huge_message_comes_from_the_window_of_its_first_match() -> None:
    # the whole 3 MB text was tokenized for each hit's snippet: a second per hit
    text = "\n".join(f"line {i}: error timeout while reading block {i}" for i in range(60_000))
    s = tsearch.snippet(text, tsearch.query_lexemes(tsearch.plain_query("timeout")))
    assert s.startswith("line 0: error **timeout**") and s.endswith("…") and len(s) < 1000
    late = "x " * 40_000 + "needle at the end"
    s = tsearch.snippet(late, tsearch.query_lexemes(tsearch.plain_query("needle")))
    assert s.startswith("…") and s.endswith("**needle** at the end")
    s = tsearch.snippet(late, tsearch.query_lexemes(tsearch.plain_query("absent")))
    assert s.startswith("x x") and s.endswith("…") and len(s) < 1000
