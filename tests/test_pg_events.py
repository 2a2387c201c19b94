"""Other daemons' events wake and cost only the daemons whose clients watch the session.

Real daemon processes on a PostgreSQL server of this module's own, with
pg_stat_statements loaded, so what a daemon reads is counted by the server: the rows its
events reader receives (stores/postgres/event_reader.py). Each of its reads returns the
event rows it relays and one row saying what was looked at, so the event rows received
are the rows returned less the statements' calls.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import zmq
from helpers import DaemonProcess, make_config, notifications_until, wait_for
from pg import PASSWORD, PgCluster

from ctxd.daemon.engine import Engine
from ctxd.daemon.stores.postgres.event_reader import (
    RECORD,
    SHARED,
    EventReader,
    session_channel,
)
from ctxd.daemon.stores.postgres.events import parse_reference
from ctxd.daemon.stores.postgres.store import PostgresStore
from ctxd.protocol.codec import unpackb

PW_VAR = "CTXD_TEST_PG_PASSWORD"


@pytest.fixture(scope="module")
def counted_cluster() -> Iterator[PgCluster]:
    """A server that counts every statement's calls and rows (pg_stat_statements)."""
    cluster = PgCluster().start()
    try:
        with psycopg.connect(cluster.socket_dsn(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        cluster.halt()
        cluster.launch()
        with psycopg.connect(cluster.socket_dsn(), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def two_daemons(tmp_path: Path, counted_cluster: PgCluster
                ) -> Iterator[tuple[DaemonProcess, DaemonProcess, str]]:
    dbname = f"ev{time.monotonic_ns()}"
    counted_cluster.create_database(dbname)
    env = {"CTXD_STORE": "postgres", "CTXD_POSTGRES_DSN": counted_cluster.tcp_dsn(dbname),
           "CTXD_POSTGRES_PASSWORD_ENV": PW_VAR, PW_VAR: PASSWORD,
           "CTXD_MAX_ACTIVE_MESSAGES": "100000"}
    procs: list[DaemonProcess] = []
    try:
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            procs.append(DaemonProcess(tmp_path / name, env=env).start())
        yield procs[0], procs[1], dbname
    finally:
        for d in procs:
            d.stop()


def event_rows_read(cluster: PgCluster, dbname: str) -> int:
    """The event rows every daemon's events reader received since the last reset."""
    with psycopg.connect(cluster.socket_dsn(), autocommit=True) as conn:
        read, calls = conn.execute(
            "SELECT coalesce(sum(rows), 0), coalesce(sum(calls), 0) FROM pg_stat_statements s "
            "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s "
            "AND query LIKE '%%WITH fresh AS%%'", (dbname,),
        ).fetchone()
        (caught_up,) = conn.execute(
            "SELECT coalesce(sum(rows), 0) FROM pg_stat_statements s "
            "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s "
            "AND query LIKE '%%SELECT id, body FROM ctxd_events%%'", (dbname,),
        ).fetchone()
    return int(read) - int(calls) + int(caught_up)


def reset_counts(cluster: PgCluster) -> None:
    with psycopg.connect(cluster.socket_dsn(), autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")


def test_a_daemon_receives_no_event_row_of_a_session_its_clients_do_not_watch(
    two_daemons: tuple[DaemonProcess, DaemonProcess, str], counted_cluster: PgCluster,
) -> None:
    """B's appends to a session no client of A watches reach A's reader as no row at all
    (counted by the server); the one session A's client watches reaches it, one row an
    event, and a subscription to the quiet one makes its next event reach A too."""
    a, b, dbname = two_daemons
    with a.client("jsonrpc") as ca, b.client() as cb:
        quiet = cb.create_session()["sessionId"]
        marker = cb.create_session()["sessionId"]
        ca.subscribe(marker)
        events = ca.notifications(timeout=0.5)
        # A's reader is up and follows the marker before anything is counted
        ids = cb.append(marker, [{"role": "user", "content": "warm"}])["messageIds"]
        wait_for(events, "session/didAppend", where=lambda p: p["messageIds"] == ids)
        reset_counts(counted_cluster)

        for i in range(5):
            cb.append(quiet, [{"role": "user", "content": f"q{i}"}])
        ids = cb.append(marker, [{"role": "user", "content": "mark"}])["messageIds"]
        seen = notifications_until(events, "session/didAppend", lambda p: p["messageIds"] == ids)
        assert all(p["sessionId"] == marker for _, p in seen)
        # B's rows are B's own (its reader passes them over on the server), and of A's
        # sessions only the marker's one append was sent to A
        assert event_rows_read(counted_cluster, dbname) == 1

        ca.subscribe(quiet)
        ids = cb.append(quiet, [{"role": "user", "content": "q5"}])["messageIds"]
        got = wait_for(events, "session/didAppend", where=lambda p: p["messageIds"] == ids)
        assert got["sessionId"] == quiet and got["status"]["archiveMessages"] == 6
        assert event_rows_read(counted_cluster, dbname) == 2


def test_subscribing_after_events_unsubscribing_and_subscribing_again(
    two_daemons: tuple[DaemonProcess, DaemonProcess, str],
) -> None:
    """A subscription made after B wrote events gets B's later ones (the first sent right
    after the subscription's reply); while one of two subscribers stays, events still
    come; after the last one leaves they stop, and a new subscription gets them again."""
    a, b, _ = two_daemons
    with a.client("jsonrpc") as c1, a.client("jsonrpc") as c2, b.client() as cb:
        sid = cb.create_session()["sessionId"]
        marker = cb.create_session()["sessionId"]
        for i in range(3):
            cb.append(sid, [{"role": "user", "content": f"before {i}"}])

        c1.subscribe(sid)
        c1.subscribe(marker)
        one = c1.notifications(timeout=0.5)
        ids = cb.append(sid, [{"role": "user", "content": "after"}])["messageIds"]
        got = wait_for(one, "session/didAppend", where=lambda p: p["messageIds"] == ids)
        assert got["sessionId"] == sid and got["status"]["archiveMessages"] == 4

        c2.subscribe(sid)
        two = c2.notifications(timeout=0.5)
        c2.unsubscribe(sid)  # c1 still watches: A keeps reading the session
        ids = cb.append(sid, [{"role": "user", "content": "one left"}])["messageIds"]
        wait_for(one, "session/didAppend", where=lambda p: p["messageIds"] == ids)

        c1.unsubscribe(sid)  # nobody on A watches it now
        gone = cb.append(sid, [{"role": "user", "content": "unwatched"}])["messageIds"]
        mark = cb.append(marker, [{"role": "user", "content": "mark"}])["messageIds"]
        seen = notifications_until(one, "session/didAppend", lambda p: p["messageIds"] == mark)
        assert not [p for m, p in seen if p.get("sessionId") == sid]
        assert gone  # written all the same

        c2.subscribe(sid)  # a new subscription after the last one left
        ids = cb.append(sid, [{"role": "user", "content": "again"}])["messageIds"]
        got = wait_for(two, "session/didAppend", where=lambda p: p["messageIds"] == ids)
        assert got["status"]["archiveMessages"] == 7


def test_the_channel_of_a_session_is_the_one_its_events_are_sent_on(
    pg_dsn: str, tmp_path: Path,
) -> None:
    """The server names a session's channel from its id as the daemon does, for any id
    (quotes, spaces, any script, the longest allowed), and a compaction's events go on
    the shared channel instead."""
    engine = Engine(make_config(tmp_path / "d"), store=PostgresStore(pg_dsn))
    try:
        odd = ["ses_plain", "it's \"quoted\"; LISTEN x", "séance 会话 🙂", "x" * 200]
        with psycopg.connect(pg_dsn, autocommit=True) as listener:
            listener.execute(f"LISTEN {SHARED}")
            for sid in odd:
                listener.execute(f"LISTEN {session_channel(sid)}")
            for sid in odd:
                engine.create_session(session_id=sid)
                engine.append(sid, [{"role": "user", "content": "hello"}])
            engine.store.share_event(odd[0], "context/didCompact", {
                "sessionId": odd[0], "compactionId": "cmp_1", "effective": False})
            got: list[str] = []
            deadline = time.monotonic() + 10
            while len(got) < len(odd) + 1 and time.monotonic() < deadline:
                got += [n.channel for n in listener.notifies(timeout=0.5)]
        assert got == [session_channel(s) for s in odd] + [SHARED]
        assert all(len(c) <= 63 for c in got)
    finally:
        engine.close()


def test_a_zeromq_subscription_to_every_session_gets_every_sessions_events(
    two_daemons: tuple[DaemonProcess, DaemonProcess, str],
) -> None:
    """A ZeroMQ subscriber to `session/` (every session's topic starts so) on A gets B's
    events of a session nobody ever subscribed to by name."""
    a, b, _ = two_daemons
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVTIMEO, 10_000)
    try:
        sub.connect(a.info()["zmq_pub"])
        sub.subscribe(b"session/")
        sub.subscribe(b"probe/every")  # answered once the subscriptions before it hold
        while sub.recv_multipart()[0] != b"probe/every":
            pass
        with b.client() as cb:
            sid = cb.create_session()["sessionId"]
            ids = cb.append(sid, [{"role": "user", "content": "anyone"}])["messageIds"]
        while True:
            topic, payload = sub.recv_multipart()  # zmq.Again after 10 s: none came
            event = unpackb(payload, 1 << 20)
            if event["method"] == "session/didAppend":
                break
        assert topic == b"session/" + sid.encode()
        assert event["params"]["messageIds"] == ids
        assert event["params"]["status"]["archiveMessages"] == 1
    finally:
        sub.close(0)
        ctx.term()


def _record(conn: psycopg.Connection, session_id: str, body: dict[str, Any]) -> None:
    """Write an event row as a daemon does (RECORD), origin another daemon's."""
    conn.execute(RECORD.replace("?", "%s"), ("elsewhere", session_id, json.dumps(body),
                                             time.time()))


def _collect(got: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 15
    while len(got) < n:
        assert time.monotonic() < deadline, f"only {got}"
        time.sleep(0.02)
    return list(got)


def test_a_row_committed_after_a_higher_one_is_read_and_a_rolled_back_one_holds_nothing(
    two_engines: tuple[Engine, Engine], pg_dsn: str,
) -> None:
    """B's reader reads A's append while an earlier id is still uncommitted, reads that
    one once it commits, and is not held up by one whose transaction rolled back."""
    a, b = two_engines
    sid = a.create_session().session_id
    got: list[dict[str, Any]] = []
    b.store.listen(got.append)
    assert b.store.listening.wait(30)
    with psycopg.connect(pg_dsn) as held, psycopg.connect(pg_dsn) as undone:
        _record(held, sid, {"m": "run/didStart", "s": sid, "r": "run_held"})
        _record(undone, sid, {"m": "run/didStart", "s": sid, "r": "run_undone"})
        first = a.append(sid, [{"role": "user", "content": "after"}]).batch_id
        assert [r.get("b") for r in _collect(got, 1)] == [first]
        undone.rollback()
        held.commit()
        assert [r.get("r") for r in _collect(got, 2)][1] == "run_held"
    second = a.append(sid, [{"role": "user", "content": "later"}]).batch_id
    assert [r.get("b") for r in _collect(got, 3)][2] == second
    assert not any(r.get("r") == "run_undone" for r in got)


def test_the_reader_reads_the_watched_sessions_and_the_shared_events_only(
    two_engines: tuple[Engine, Engine],
) -> None:
    """Told to read one session, B's reader hands on that session's events, and of the
    other session only its compaction's (which every daemon's bookkeeping needs); told
    to read it no more, only the compaction's."""
    a, b = two_engines
    watched, other = a.create_session().session_id, a.create_session().session_id
    got: list[dict[str, Any]] = []
    b.store.watch(None, False)
    b.store.watch(watched, True)
    b.store.listen(got.append)
    assert b.store.listening.wait(30)

    def compacted(sid: str, cid: str) -> None:
        a.store.share_event(sid, "context/didCompact",
                            {"sessionId": sid, "compactionId": cid, "effective": False})

    a.append(other, [{"role": "user", "content": "not read"}])
    seen = a.append(watched, [{"role": "user", "content": "read"}]).batch_id
    compacted(other, "cmp_other")
    assert [(r["m"], r["s"]) for r in _collect(got, 2)] == [
        ("session/didAppend", watched), ("context/didCompact", other)]
    assert got[0]["b"] == seen

    b.store.watch(watched, False)
    a.append(watched, [{"role": "user", "content": "no longer read"}])
    compacted(watched, "cmp_watched")
    assert [(r["m"], r["s"]) for r in _collect(got, 3)][2:] == [
        ("context/didCompact", watched)]


def test_a_subscription_made_while_a_read_runs_gets_the_rows_that_read_passed_over(
    pg_dsn: str, tmp_path: Path,
) -> None:
    """The reader driven step by step: a session is watched (asked, not yet made), a row
    of it is written and a read runs under the set before, which passes it over; making
    the change reads it then, once, and later rows come once each; a session watched
    again, or whose change no read ran past, reads nothing twice."""
    Engine(make_config(tmp_path / "d"), store=PostgresStore(pg_dsn)).close()  # the schema
    reader = EventReader("here", parse_reference)
    got: list[dict[str, Any]] = []
    with psycopg.connect(pg_dsn, autocommit=True) as conn, \
            psycopg.connect(pg_dsn, autocommit=True) as other:
        reader.watch(None, False)
        reader.start(conn, got.append)
        reader.read(conn, got.append)
        _record(other, "s1", {"m": "run/didStart", "s": "s1", "r": "before"})
        reader.read(conn, got.append)
        assert got == []  # nobody watches s1 yet

        reader.watch("s1", True)  # a client subscribes...
        _record(other, "s1", {"m": "run/didStart", "s": "s1", "r": "around"})
        reader.read(conn, got.append)  # ...while a read runs under the set before
        assert got == []
        reader.changes(conn, got.append)
        assert [r["r"] for r in got] == ["around"]

        reader.watch("s1", True)  # a second subscriber: nothing read again
        _record(other, "s1", {"m": "run/didStart", "s": "s1", "r": "after"})
        reader.read(conn, got.append)
        reader.changes(conn, got.append)
        reader.read(conn, got.append)
        assert [r["r"] for r in got] == ["around", "after"]

        reader.watch("s1", False)
        reader.changes(conn, got.append)
        _record(other, "s1", {"m": "run/didStart", "s": "s1", "r": "gone"})
        reader.read(conn, got.append)
        assert [r["r"] for r in got] == ["around", "after"]
    reader.close()


def test_events_are_heard_on_descriptors_past_selects_limit(
    two_engines: tuple[Engine, Engine], caplog: pytest.LogCaptureFixture,
) -> None:
    """A daemon serving many clients holds descriptors past 1024 (select's limit): its
    listener, connecting then, still hears and reads other daemons' events, without
    failing and connecting again to read them."""
    a, b = two_engines
    held: list[int] = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        sid = a.create_session().session_id
        got: list[dict[str, Any]] = []
        b.store.watch(None, False)
        b.store.watch(sid, True)
        b.store.listen(got.append)  # its connection and wake-up pipe come after them
        assert b.store.listening.wait(30)
        batch = a.append(sid, [{"role": "user", "content": "heard"}]).batch_id
        with caplog.at_level("ERROR", logger="ctxd.pg.events"):
            assert [r["b"] for r in _collect(got, 1)] == [batch]
        assert [r.getMessage() for r in caplog.records if r.name == "ctxd.pg.events"] == []
    finally:
        for fd in held:
            os.close(fd)
