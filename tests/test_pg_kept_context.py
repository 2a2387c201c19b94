"""The context a daemon keeps in memory on PostgreSQL, while other daemons write.

A daemon keeps each session's tail between requests and checks it on every read (the
messages past its last kept id, read with the request's other reads): a read never
returns a context older than a write already acknowledged, whichever daemon made it.
Each check here compares what the keeping daemon returns with what is read from the
database at that moment by an engine that forgets what it kept before each read.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from helpers import DaemonProcess, make_config, tool_turn
from pg import PASSWORD, PgCluster

from ctxd.daemon.context_edit import clear, pop
from ctxd.daemon.engine import Engine
from ctxd.daemon.stores.postgres.store import PostgresStore
from tests.harness.netsim import DelayProxy
from tests.pg import SUPERUSER

PW_VAR = "CTXD_TEST_PG_PASSWORD"


def wire(result: Any) -> Any:
    """An engine's result as a client reads it (camelCase keys)."""
    return msgspec.to_builtins(result)


@pytest.fixture
def engines(tmp_path: Path, pg_dsn: str) -> Iterator[list[Engine]]:
    """Three engines on one database, as three daemons: a and b write, ref reads."""
    out = []
    for name in ("a", "b", "ref"):
        out.append(Engine(make_config(tmp_path / name, max_active_messages=10000),
                          store=PostgresStore(pg_dsn)))
    yield out
    for e in out:
        e.close()


def fresh(ref: Engine, sid: str) -> dict[str, Any]:
    ref.view.forget(sid)
    return wire(ref.get_context(sid))


def same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got["messageIds"] == want["messageIds"]
    assert got["messages"] == want["messages"]
    for k in ("archiveMessages", "activeMessages", "estimatedTokens", "version"):
        assert got["status"][k] == want["status"][k], k


def test_a_kept_context_sees_every_write_of_another_daemon(engines: list[Engine]) -> None:
    a, b, ref = engines
    sid = wire(a.create_session(title="kept"))["sessionId"]
    a.append(sid, [{"role": "system", "content": "You are terse."}])
    same(wire(a.get_context(sid)), fresh(ref, sid))
    rng = random.Random(7)
    for i in range(40):
        writer = rng.choice([a, b])
        step = rng.random()
        if step < 0.6:
            res = wire(writer.append(sid, [{"role": "user", "content": f"step {i}"},
                                      *tool_turn(i)]))
            got = wire(a.get_context(sid))
            # acknowledged through either daemon: in the very next read through a
            assert got["messageIds"][-1] == res["messageIds"][-1]
        elif step < 0.7:
            writer.add_pin(sid, f"pin {i}")
            got = wire(a.get_context(sid))
            assert any(f"pin {i}" in (m.get("content") or "") for m in got["messages"])
        elif step < 0.8:
            writer.compact_sync(sid, force=True)
            got = wire(a.get_context(sid))
        elif step < 0.9:
            pop(writer, sid, 1)
            got = wire(a.get_context(sid))
        else:
            writer.append(sid, [{"role": "user", "content": f"before clear {i}"}])
            clear(writer, sid)
            got = wire(a.get_context(sid))
            # pins stay (the message without an id); no archived message does
            assert [i for i in got["messageIds"] if i is not None] == []
        same(got, fresh(ref, sid))
        # and a's status agrees, asked on its own
        assert wire(a.status(sid))["archiveMessages"] == got["status"]["archiveMessages"]


def test_an_append_after_another_daemons_keeps_nothing_stale(engines: list[Engine]) -> None:
    """a keeps the tail, b appends, then a appends: a's own batch does not follow its
    kept tail, so what b stored must not be left out of a's next read."""
    a, b, ref = engines
    sid = wire(a.create_session(title="gap"))["sessionId"]
    a.append(sid, [{"role": "user", "content": "first"}])
    a.get_context(sid)
    for i in range(5):
        b.append(sid, [{"role": "user", "content": f"from b {i}"}])
        a.append(sid, [{"role": "user", "content": f"from a {i}"}])
        got = wire(a.get_context(sid))
        assert [m["content"] for m in got["messages"][-2:]] == [f"from b {i}", f"from a {i}"]
        same(got, fresh(ref, sid))


def test_a_kept_context_is_read_in_one_round_trip(
    tmp_path: Path, pg_cluster: PgCluster, pg_dsn: str,
) -> None:
    proxy = DelayProxy(("127.0.0.1", pg_cluster.port), 2).start()
    db = pg_dsn.rsplit("dbname=", 1)[1]
    dsn = f"host=127.0.0.1 port={proxy.port} user={SUPERUSER} dbname={db}"
    e = Engine(make_config(tmp_path / "far"), store=PostgresStore(dsn, password=PASSWORD))
    other = Engine(make_config(tmp_path / "near"), store=PostgresStore(pg_dsn))
    try:
        sid = wire(e.create_session(title="far"))["sessionId"]
        e.append(sid, [{"role": "system", "content": "You are terse."}])
        e.append(sid, [{"role": "user", "content": "hello"}])
        e.get_context(sid)  # reads the whole tail once
        for i in range(4):
            e.append(sid, [{"role": "user", "content": f"step {i}"}, *tool_turn(i)])
            before = proxy.round_trips()
            ctx = wire(e.get_context(sid))
            assert proxy.round_trips() - before == 1
            # another daemon's batch is read in that same round trip
            ids = wire(other.append(sid, [{"role": "user", "content": f"other {i}"}]))["messageIds"]
            before = proxy.round_trips()
            ctx = wire(e.get_context(sid))
            assert proxy.round_trips() - before == 1
            assert ctx["messageIds"][-1] == ids[-1]
    finally:
        e.close()
        other.close()
        proxy.close()


@pytest.fixture
def daemons(pg_daemons: list[DaemonProcess]) -> list[DaemonProcess]:
    return pg_daemons


def test_a_read_through_one_daemon_right_after_an_ack_of_the_other_sees_it(
    daemons: list[DaemonProcess],
) -> None:
    """Writers through both daemons at once; after each ack through b, a context/get
    through a holds the acknowledged batch (a's kept tail is extended by its own
    appends and by b's in between)."""
    a, b = daemons
    with a.client() as c:
        sid = c.create_session(title="race")["sessionId"]
        c.append(sid, [{"role": "user", "content": "start"}])
        c.context_get(sid)
    stop = threading.Event()
    errors: list[BaseException] = []

    def a_writer() -> None:
        try:
            with a.client() as c:
                i = 0
                while not stop.is_set():
                    c.append(sid, [{"role": "user", "content": f"a {i}"}])
                    i += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t = threading.Thread(target=a_writer)
    t.start()
    try:
        with b.client("zmq") as cb, a.client("zmq") as ca:
            for i in range(40):
                ids = cb.append(sid, [{"role": "user", "content": f"b {i}"}])["messageIds"]
                got = ca.context_get(sid)
                assert ids[-1] in got["messageIds"], (i, ids, got["messageIds"][-5:])
                assert got["status"]["archiveMessages"] >= i + 2  # start and b's batches
    finally:
        stop.set()
        t.join(30)
    assert not errors, errors
    with a.client() as ca, b.client() as cb:
        assert ca.context_get(sid)["messageIds"] == cb.context_get(sid)["messageIds"]
