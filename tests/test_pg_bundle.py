"""Reads sent ahead as one statement (daemon/stores/postgres/bundle.py), against a real
PostgreSQL behind the delaying proxy that counts round trips: every read answers with
the rows, order and value types it gets when sent alone, and a bundle costs one round
trip on every run, the run psycopg prepares it on too."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ctxd.daemon.stores.postgres.connection import PgConnection
from tests.harness.netsim import DelayProxy
from tests.pg import PASSWORD, SUPERUSER, PgCluster

RTT_MS = 2
# past psycopg's prepare threshold (5), so the run that prepares is among them
RUNS = 8

READS: list[tuple[str, tuple[Any, ...]]] = [
    ("SELECT id, label, n, at, note FROM things WHERE owner = ? ORDER BY id DESC", ("a",)),
    ("SELECT count(*) FROM things WHERE owner = ?", ("a",)),
    ("SELECT id, label FROM things WHERE owner = ?", ("nobody",)),
    ("SELECT id, at FROM things WHERE id = ANY(?) ORDER BY at, id", ([1, 3, 4],)),
    ("SELECT count(*), max(id) FROM things WHERE owner = ? AND id > ?", ("b", 100)),
    ("SELECT note, n FROM things WHERE id = ?", (2,)),
]


@pytest.fixture
def far(pg_cluster: PgCluster, pg_dsn: str) -> Iterator[tuple[DelayProxy, PgConnection]]:
    setup = PgConnection(pg_dsn)
    setup.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY)")
    setup.execute("INSERT INTO sessions VALUES ('s1')")
    setup.execute(
        "CREATE TABLE things (id BIGINT PRIMARY KEY, owner TEXT NOT NULL, label TEXT, "
        "n INTEGER, at DOUBLE PRECISION, note TEXT)"
    )
    rows = [
        (1, "a", "one", 1, 1700000000.0, None),  # an integral double, a NULL
        (2, "a", 'say "hi"', None, 1700000000.25, '{"k": [1, 2]}'),
        (3, "a", "three", 3, 0.5, "x" * 3000),
        (4, "b", "", -4, 1700000000.0, "δ"),
    ]
    for row in rows:
        setup.execute("INSERT INTO things VALUES (?, ?, ?, ?, ?, ?)", row)
    setup.close()
    proxy = DelayProxy(("127.0.0.1", pg_cluster.port), RTT_MS).start()
    db = pg_dsn.rsplit("dbname=", 1)[1]
    conn = PgConnection(
        f"host=127.0.0.1 port={proxy.port} user={SUPERUSER} dbname={db}", PASSWORD
    )
    # one read planned on every run (as the store's tail reads are): a bundle holding it
    # is never prepared, one round trip all the same
    conn.planned_per_call.add(READS[3][0])
    conn.execute("SELECT 1")  # connected before counting
    yield proxy, conn
    conn.close()
    proxy.close()


def alone(conn: PgConnection) -> list[list[Any]]:
    return [conn.execute(sql, params).fetchall() for sql, params in READS]


def typed(answers: list[list[Any]]) -> list[list[list[tuple[type, Any]]]]:
    return [[[(type(v), v) for v in row] for row in rows] for rows in answers]


def test_reads_ahead_answer_as_alone_in_one_round_trip_every_run(
    far: tuple[DelayProxy, PgConnection],
) -> None:
    proxy, conn = far
    expected = typed(alone(conn))
    assert expected[0][0][0] == (int, 3) and expected[3][1][1] == (float, 1700000000.0)
    trips = []
    for _ in range(RUNS):
        before = proxy.round_trips()
        with conn.prefetch(READS):
            got = alone(conn)  # every one answered from what was read ahead
        trips.append(proxy.round_trips() - before)
        assert typed(got) == expected
    assert trips == [1] * RUNS


def test_a_transactions_reads_go_with_its_lock_and_answer_as_alone(
    far: tuple[DelayProxy, PgConnection],
) -> None:
    proxy, conn = far
    expected = typed(alone(conn))
    trips = []
    for i in range(RUNS):
        before = proxy.round_trips()
        with conn.transaction("s1", READS):
            got = alone(conn)
            conn.execute("UPDATE things SET n = ? WHERE id = 4", (-4 - i,))
        trips.append(proxy.round_trips() - before)
        assert typed(got) == expected  # the reads touch no row the write changes
    # BEGIN, the lock and the reads; the write and the COMMIT
    assert trips == [2] * RUNS
    assert conn.execute("SELECT n FROM things WHERE id = 4").fetchone() == (-3 - RUNS,)


INSERT = "INSERT INTO things(id, owner, label) VALUES (?, ?, ?)"


def labels(conn: PgConnection) -> list[Any]:
    return conn.execute("SELECT id, label FROM things WHERE id > 10 ORDER BY id").fetchall()


def test_a_write_kept_back_goes_before_the_next_statement_or_the_commit(
    far: tuple[DelayProxy, PgConnection],
) -> None:
    _, conn = far
    assert not conn.hold(INSERT, (10, "z", "outside"))  # no pipelined transaction: not kept
    with conn.transaction("s1", READS):
        assert conn.hold(INSERT, (11, "z", "kept"))
        assert labels(conn) == [(11, "kept")]  # sent ahead of the read, seen by it
    with conn.transaction("s1", READS):
        assert conn.hold(INSERT, (12, "z", "at commit"))
    assert labels(conn) == [(11, "kept"), (12, "at commit")]
    with conn.transaction("s1", READS):
        assert conn.hold(INSERT, (13, "z", "taken"))
        assert conn.take_held({"SELECT 1"}) is None  # not one the caller can take
        held = conn.take_held({INSERT})
        assert held == (INSERT, (13, "z", "taken"))
        conn.execute(INSERT, (14, "z", "instead"))
    assert labels(conn) == [(11, "kept"), (12, "at commit"), (14, "instead")]


def test_a_write_kept_back_in_a_failed_transaction_is_not_written(
    far: tuple[DelayProxy, PgConnection],
) -> None:
    _, conn = far
    with pytest.raises(RuntimeError), conn.transaction("s1", READS):
        assert conn.hold(INSERT, (21, "z", "lost"))
        raise RuntimeError("the request fails before its commit")
    assert labels(conn) == []
    with conn.transaction("s1", READS):  # nothing of the failed one left kept back
        pass
    assert labels(conn) == []
