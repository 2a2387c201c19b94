"""Round trips to PostgreSQL, counted by a delaying proxy in front of the real server
(tests/harness/netsim.py), and daemons run as hosts of their own.

A turn's append takes at most 3 round trips (BEGIN + the session's lock + the reads made
under it; the ids; the writes + COMMIT), `context/get` 2 and `context/status` 1, whatever
the session holds; a batch that names a run or carries tool calls costs no more. The
counts need the added delay: pipelined statements go out before any answer can come
back, so they are one round trip.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import make_config, tool_turn

from ctxd.daemon.context_reply import ContextReplies
from ctxd.daemon.engine import Engine
from ctxd.daemon.stores.postgres.store import PostgresStore
from ctxd.protocol.errors import SessionBusy
from tests.harness.netsim import DelayProxy, HostDaemon, Hosts
from tests.pg import PASSWORD, SUPERUSER, PgCluster

RTT_MS = 4


@pytest.fixture
def proxied(pg_cluster: PgCluster, pg_dsn: str) -> Iterator[tuple[DelayProxy, str]]:
    proxy = DelayProxy(("127.0.0.1", pg_cluster.port), RTT_MS).start()
    db = pg_dsn.rsplit("dbname=", 1)[1]
    yield proxy, f"host=127.0.0.1 port={proxy.port} user={SUPERUSER} dbname={db}"
    proxy.close()


@pytest.fixture
def engine_far(tmp_path: Path, proxied: tuple[DelayProxy, str]) -> Iterator[Engine]:
    _, dsn = proxied
    e = Engine(make_config(tmp_path / "data"), store=PostgresStore(dsn, password=PASSWORD))
    yield e
    e.close()


def counted(proxy: DelayProxy, call: Any) -> tuple[int, Any]:
    before = proxy.round_trips()
    out = call()
    return proxy.round_trips() - before, out


def test_a_turn_costs_three_round_trips_to_append_two_to_read_one_for_status(
    engine_far: Engine, proxied: tuple[DelayProxy, str]
) -> None:
    proxy, _ = proxied
    e = engine_far
    sid = e.create_session(title="far").session_id
    e.append(sid, [{"role": "system", "content": "You are terse."}])
    e.get_context(sid)
    replies = ContextReplies(e, 1 << 30)
    appends, gets, statuses = [], [], []
    for i in range(6):
        n, res = counted(proxy, lambda i=i: e.append(sid, [
            {"role": "user", "content": f"step {i}"}, *tool_turn(i)],
            client_batch_id=f"b{i}"))
        appends.append(n)
        assert res.status.archive_messages == 1 + 3 * (i + 1)
        n, ctx = counted(proxy, lambda: e.get_context(sid))
        gets.append(n)
        assert ctx.message_ids[-1] == res.message_ids[-1]
        assert ctx.status.archive_messages == 1 + 3 * (i + 1)
        # as the daemon serves context/get: with the reply's size bound checked first
        n, bounded = counted(proxy, lambda: asyncio.run(replies.get(sid)))
        gets.append(n)
        assert bounded.message_ids == ctx.message_ids
        n, st = counted(proxy, lambda: e.status(sid))
        statuses.append(n)
        assert st.active_messages == ctx.status.active_messages
    assert max(appends) <= 3, appends
    # the first reads the tail (a second round trip); later ones check the kept tail in
    # the one round trip of the context row
    assert max(gets) <= 2 and max(gets[2:]) <= 1, gets
    assert max(statuses) <= 1, statuses
    # a repeated batch (a client's retry) is found by what the append read under its
    # lock; its status asks the rest again
    n, again = counted(proxy, lambda: e.append(sid, [
        {"role": "user", "content": "step 5"}, *tool_turn(5)], client_batch_id="b5"))
    assert again.message_ids == res.message_ids
    assert n <= 5


def test_an_append_in_a_run_keeps_the_run_in_its_status(
    engine_far: Engine, proxied: tuple[DelayProxy, str]
) -> None:
    proxy, _ = proxied
    e = engine_far
    sid = e.create_session().session_id
    e.append(sid, [{"role": "user", "content": "warm"}])  # the connections made once
    run = e.start_run(sid).run_id
    n, res = counted(proxy, lambda: e.append(sid, [{"role": "user", "content": "go"}],
                                             run_id=run))
    assert res.status.active_run_id == run
    assert n <= 3
    n, res = counted(proxy, lambda: e.append(sid, [{"role": "user", "content": "more"}]))
    assert res.status.active_run_id == run  # read with the lock, not asked again
    assert n <= 3


def test_a_busy_session_is_refused_and_nothing_is_written(
    engine_far: Engine, pg_dsn: str
) -> None:
    """The session's lock, sent in the same round trip as the reads, still refuses at
    once when another connection holds it; the archive is as before."""
    import psycopg

    e = engine_far
    sid = e.create_session().session_id
    e.append(sid, [{"role": "user", "content": "first"}])
    with psycopg.connect(pg_dsn) as other:
        other.execute("SELECT 1 FROM sessions WHERE id = %s FOR UPDATE", (sid,))
        with pytest.raises(SessionBusy):
            e.append(sid, [{"role": "user", "content": "second"}])
    assert e.status(sid).archive_messages == 1
    # the connection is usable again at once
    e.append(sid, [{"role": "user", "content": "third"}])
    assert [m["content"] for m in e.read_archive(sid).messages] == ["first", "third"]


def test_daemons_as_hosts_reach_the_database_through_the_proxy(
    pg_cluster: PgCluster, pg_dsn: str, tmp_path: Path
) -> None:
    """Two daemons, each in a network namespace of its own where namespaces can be made
    (else on loopback), share a session through the delaying proxy; everything made for
    them is gone afterwards."""
    hosts = Hosts(("127.0.0.1", pg_cluster.port), RTT_MS)
    db = pg_dsn.rsplit("dbname=", 1)[1]
    names: list[str] = []
    try:
        daemons = []
        for i in range(2):
            host, proxy = hosts.add()
            if host.netns:
                names += [host.netns, host.veth]
            env = {"CTXD_STORE": "postgres",
                   "CTXD_POSTGRES_DSN": hosts.dsn(host, proxy, db, SUPERUSER),
                   "CTXD_POSTGRES_PASSWORD_ENV": "PGT_PW", "PGT_PW": PASSWORD}
            (tmp_path / f"d{i}").mkdir()
            daemons.append(HostDaemon(tmp_path / f"d{i}", host, env=env).start())
        try:
            with daemons[0].client() as a, daemons[1].client() as b:
                sid = a.create_session(title="shared")["sessionId"]
                a.append(sid, [{"role": "user", "content": "from a"}])
                b.append(sid, [{"role": "user", "content": "from b"}])
                got = [m["content"] for m in a.call("archive/read", {"sessionId": sid})[
                    "messages"]]
                assert got == ["from a", "from b"]
                assert b.context_status(sid)["archiveMessages"] == 2
            assert hosts.round_trips() > 0
        finally:
            for d in daemons:
                d.stop()
    finally:
        hosts.close()
    if hosts.mode == "netns":
        time.sleep(0.1)
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        links = subprocess.run(["ip", "link"], capture_output=True, text=True).stdout
        for name in names:
            assert name not in listed and f"{name}:" not in links and f"{name}@" not in links


def _daemon_behind_slow_server(pg_cluster: PgCluster, pg_dsn: str, tmp_path: Path,
                               ) -> tuple[DelayProxy, Any]:
    """A daemon reaching the test database through 200 ms round trips (a proxy)."""

    proxy = DelayProxy(("127.0.0.1", pg_cluster.port), 200).start()
    try:
        return proxy, _another_daemon(proxy, pg_dsn, tmp_path / "d")
    except BaseException:
        proxy.close()
        raise


def _another_daemon(proxy: DelayProxy, pg_dsn: str, root: Path) -> Any:
    """A daemon of its own data directory `root` on the test database, through `proxy`."""
    from tests.helpers import DaemonProcess

    db = pg_dsn.rsplit("dbname=", 1)[1]
    env = {"CTXD_STORE": "postgres",
           "CTXD_POSTGRES_DSN": f"host=127.0.0.1 port={proxy.port} user={SUPERUSER} dbname={db}",
           "CTXD_POSTGRES_PASSWORD_ENV": "PGT_PW", "PGT_PW": PASSWORD}
    root.mkdir()
    return DaemonProcess(root, env=env).start(timeout=120)


def test_the_event_loop_serves_others_while_an_append_waits_on_the_server(
    pg_cluster: PgCluster, pg_dsn: str, tmp_path: Path
) -> None:
    """Behind 200 ms round trips an append takes several of them; a status of another
    session asked meanwhile through the same daemon is answered first (on the event
    loop it would wait for the append to finish). Work the daemon does on its loop
    from time to time (runs' liveness) may still hold one attempt up: three are made.
    Then each sees the other's session as written."""
    import threading

    proxy, d = _daemon_behind_slow_server(pg_cluster, pg_dsn, tmp_path)
    try:
        with d.client() as a, d.client() as b:
            s1 = a.create_session()["sessionId"]
            s2 = b.create_session()["sessionId"]
            a.append(s1, [{"role": "user", "content": "warm"}])  # connections made
            b.context_status(s2)
            orders = []
            for _attempt in range(3):  # on the loop, the status could never come first
                done: list[str] = []
                started = threading.Event()

                def append(done: list[str] = done, started: threading.Event = started,
                           ) -> None:
                    started.set()
                    a.append(s1, [{"role": "user", "content": "slow"}])
                    done.append("append")

                t = threading.Thread(target=append)
                t.start()
                started.wait()
                time.sleep(0.25)  # the append is on its way: its first round trip
                assert b.context_status(s2)["archiveMessages"] == 0
                done.append("status")
                t.join(60)
                orders.append(done)
                if done == ["status", "append"]:
                    break
            assert ["status", "append"] in orders, orders
            appended = len(orders) + 1
            assert b.context_status(s1)["archiveMessages"] == appended
    finally:
        d.stop()
        proxy.close()


def test_runs_and_approvals_leave_the_event_loop_free(
    pg_cluster: PgCluster, pg_dsn: str, tmp_path: Path
) -> None:
    """Behind 200 ms round trips, while one client starts a run, asks for and answers an
    approval and finishes the run, each taking several round trips, a status of another
    session asked meanwhile through the same daemon is answered before each of them is
    (on the event loop it would wait). Three attempts each, as above."""
    import threading

    proxy, d = _daemon_behind_slow_server(pg_cluster, pg_dsn, tmp_path)
    try:
        with d.client() as a, d.client() as b:
            s1 = a.create_session()["sessionId"]
            s2 = b.create_session()["sessionId"]
            b.context_status(s2)
            def beside(call: Any) -> list[str]:
                """`call()` in a thread; a status of s2 asked while it is on its way."""
                done: list[str] = []
                started = threading.Event()
                out: list[Any] = []

                def run() -> None:
                    started.set()
                    out.append(call())
                    done.append("call")

                t = threading.Thread(target=run)
                t.start()
                started.wait()
                time.sleep(0.25)  # the call is on its way: its first round trip
                b.context_status(s2)
                done.append("status")
                t.join(60)
                assert out, "the call failed"
                return [*done, out[0]]

            from functools import partial

            offloop = ("run/start", "approval/request", "approval/resolve", "run/finish")
            for attempt in range(3):
                call = f"call_{attempt}"
                orders: dict[str, list[str]] = {}
                *orders["run/start"], run_id = beside(lambda: a.start_run(s1)["runId"])
                a.append(s1, [{"role": "assistant", "content": None, "tool_calls": [
                    {"id": call, "type": "function",
                     "function": {"name": "rm", "arguments": "{}"}}]}], run_id=run_id)
                *orders["approval/request"], apr = beside(
                    partial(a.request_approval, s1, run_id, call, "rm"))
                *orders["approval/resolve"], _ = beside(
                    partial(a.resolve_approval, apr["approvalId"], "denied"))
                *orders["run/finish"], _ = beside(partial(
                    a.finish_run, run_id, "completed",
                    messages=[{"role": "tool", "tool_call_id": call, "content": "denied"}]))
                if all(orders[n] == ["status", "call"] for n in offloop):
                    break
            assert all(orders[n] == ["status", "call"] for n in offloop), orders
            assert b.context_status(s1)["activeRunId"] is None
    finally:
        d.stop()
        proxy.close()


def test_every_request_that_reads_or_writes_the_store_leaves_the_event_loop_free(
    pg_cluster: PgCluster, pg_dsn: str, tmp_path: Path
) -> None:
    """Behind 200 ms round trips, each request that makes one (sessions, archive pages,
    pins, context edits, explain, the approvals list, search) is answered after a heartbeat
    another client sends while it is on its way: on the event loop, the heartbeat would
    wait for it. Three attempts each, as above; most of them must make a round trip, or
    the test proves nothing."""
    import threading
    from functools import partial

    proxy, d = _daemon_behind_slow_server(pg_cluster, pg_dsn, tmp_path)
    try:
        with d.client() as a, d.client() as b:
            sid = a.create_session(title="far")["sessionId"]
            a.append(sid, [{"role": "user", "content": f"message {i}"} for i in range(4)])
            b.heartbeat()

            def beside(call: Any) -> tuple[list[str], float, Any]:
                """`call()` in a thread, a heartbeat sent while it is on its way: the
                order they came back in, the call's seconds, its result."""
                done: list[str] = []
                started = threading.Event()
                out: list[Any] = []
                took: list[float] = []

                def run() -> None:
                    started.set()
                    t0 = time.perf_counter()
                    out.append(call())
                    took.append(time.perf_counter() - t0)
                    done.append("call")

                t = threading.Thread(target=run)
                t.start()
                started.wait()
                time.sleep(0.05)  # sent: the daemon is in its first round trip
                b.heartbeat()
                done.append("heartbeat")
                t.join(60)
                assert out, "the call failed"
                return done, took[0], out[0]

            # one to remove per attempt
            to_remove = [a.add_pin(sid, f"kept {i}")["pin"]["pinId"] for i in range(3)]
            removed: list[str] = []
            added: list[str] = []

            def add_pin() -> Any:
                pin = a.add_pin(sid, f"invariant {len(added)}")
                added.append(pin["pin"]["pinId"])
                return pin

            def remove_pin() -> Any:
                removed.append(to_remove.pop())
                return a.remove_pin(sid, removed[-1])

            calls: dict[str, Any] = {
                "session/create": partial(a.create_session, title="another"),
                "session/list": a.list_sessions,
                "session/get": partial(a.get_session, sid),
                "archive/read": partial(a.read, sid),
                "context/pins/add": add_pin,
                "context/pins/list": partial(a.list_pins, sid),
                "context/pins/remove": remove_pin,
                "context/explain": partial(a.explain, sid),
                "approval/list": partial(a.list_approvals, sid),
                "archive/search": partial(a.search, "message", session_id=sid),
                "tools/call": partial(a.call_tool, sid, "search_past_messages",
                                      {"query": "message"}),
                "session/subscribe": partial(a.subscribe, sid),
                "context/pop": partial(a.context_pop, sid, 1),
                "context/clear": partial(a.context_clear, sid),
            }
            waited: dict[str, bool] = {}
            held: dict[str, list[str]] = {}
            for name, call in calls.items():
                for _attempt in range(3):
                    order, took, _ = beside(call)
                    waited[name] = took >= 0.2  # made at least one round trip
                    if not waited[name] or order == ["heartbeat", "call"]:
                        held.pop(name, None)
                        break
                    held[name] = order
            assert not held, held  # each of these held the loop three times out of three
            assert sum(waited.values()) >= len(calls) - 3, waited
            # and they did what they were asked, in order
            pinned = {p["pinId"] for p in a.list_pins(sid)["pins"]}
            assert set(added) <= pinned and not set(removed) & pinned
            shown = [m.get("content") for m in a.context_get(sid)["messages"]]
            assert not [c for c in shown if isinstance(c, str) and c.startswith("message ")]
            titles = {s["title"] for s in a.list_sessions()["sessions"]}
            assert {"far", "another"} <= titles
    finally:
        d.stop()
        proxy.close()


def test_a_compaction_takes_and_lets_go_its_lock_beside_the_event_loop(
    pg_cluster: PgCluster, pg_dsn: str, tmp_path: Path
) -> None:
    """Behind 200 ms round trips, while a compaction asks for its session's lock shared
    with other daemons (two round trips), reads, commits and lets the lock go, another
    client's heartbeats, sent all along, each come back in less than one round trip: on
    the event loop, those round trips would hold them."""

    proxy, d = _daemon_behind_slow_server(pg_cluster, pg_dsn, tmp_path)
    try:
        with d.client() as a, d.client() as b:
            sid = a.create_session(title="far")["sessionId"]
            for turn in range(3):
                a.append(sid, tool_turn(turn))
            b.heartbeat()
            compacted, waits, took = _beside_heartbeats(b, lambda: a.compact(sid, force=True))
            assert compacted["compactionId"], compacted
            assert took >= 0.8  # four round trips at least: the test shows something
            assert len(waits) >= 20
            assert max(waits) < 0.19, sorted(waits)[-5:]
    finally:
        d.stop()
        proxy.close()


def test_runs_a_departing_client_leaves_open_are_interrupted_beside_the_event_loop(
    pg_cluster: PgCluster, pg_dsn: str, tmp_path: Path
) -> None:
    """Behind 200 ms round trips, a JSON-RPC client that goes away with two runs open
    has them marked interrupted (each read, then finished in a transaction: several
    round trips), while another client's heartbeats, sent all along, each come back in
    less than one round trip."""
    proxy, d = _daemon_behind_slow_server(pg_cluster, pg_dsn, tmp_path)
    try:
        with d.client() as b:
            sids = [b.create_session(title=f"s{i}")["sessionId"] for i in range(2)]
            with d.client(wire="jsonrpc") as a:
                runs = [a.start_run(sid)["runId"] for sid in sids]
                assert all(b.context_status(sid)["activeRunId"] for sid in sids)
            t0 = time.perf_counter()
            waits = []
            while time.perf_counter() - t0 < 30:
                h0 = time.perf_counter()
                b.heartbeat()
                waits.append(time.perf_counter() - h0)
                if len(waits) % 10 == 0 and not any(
                        b.context_status(sid)["activeRunId"] for sid in sids):
                    break
                time.sleep(0.01)
            assert not any(b.context_status(sid)["activeRunId"] for sid in sids)
            assert len(waits) >= 10
            assert max(waits) < 0.19, sorted(waits)[-5:]
            # the sessions are free: a new run starts in each
            assert all(b.start_run(sid)["runId"] not in runs for sid in sids)
    finally:
        d.stop()
        proxy.close()


def test_runs_and_approvals_another_daemon_began_are_ended_beside_the_event_loop(
    pg_cluster: PgCluster, pg_dsn: str, tmp_path: Path
) -> None:
    """Behind 200 ms round trips, an approval and a run begun through one daemon are
    resolved and finished (with the context returned) through another, which did not see
    them begin and so reads their session first, and the first daemon's events are
    relayed to a client of the second: all along, heartbeats of a third client on that
    daemon each come back in less than one round trip."""

    proxy, d1 = _daemon_behind_slow_server(pg_cluster, pg_dsn, tmp_path)
    d2 = None
    try:
        d2 = _another_daemon(proxy, pg_dsn, tmp_path / "d2")
        with d1.client() as a1, d2.client() as a2, d2.client() as b:
            sid = a1.create_session(title="begun elsewhere")["sessionId"]
            b.heartbeat()

            def beside(call: Any) -> tuple[Any, list[float]]:
                out, waits, _ = _beside_heartbeats(b, call)
                return out, waits

            # a client of the second daemon watches the session: what the first one's
            # events name is read there (a round trip or two each) beside its loop
            a2.subscribe(sid)
            run_id = a1.start_run(sid)["runId"]
            _, waits = beside(lambda: [a1.append(sid, [{"role": "user", "content": f"n{i}"}],
                                                 run_id=run_id) for i in range(3)])
            assert len(waits) >= 10 and max(waits) < 0.19, sorted(waits)[-5:]
            a1.append(sid, tool_turn(0)[:1], run_id=run_id)
            apr = a1.request_approval(sid, run_id, "call_0", "read_file")["approvalId"]
            resolved, waits = beside(lambda: a2.resolve_approval(apr, "approved"))
            assert resolved["status"] == "approved"
            assert len(waits) >= 10 and max(waits) < 0.19, sorted(waits)[-5:]
            finished, waits = beside(lambda: a2.finish_run(
                run_id, "completed", messages=[tool_turn(0)[1]], return_context=True))
            assert finished["run"]["status"] == "completed"
            shown = finished["context"]["messages"]
            assert any(m.get("tool_call_id") == "call_0" for m in shown)
            assert len(waits) >= 10 and max(waits) < 0.19, sorted(waits)[-5:]
            assert a1.context_status(sid)["activeRunId"] is None
    finally:
        if d2 is not None:
            d2.stop()
        d1.stop()
        proxy.close()


def _beside_heartbeats(b: Any, call: Any) -> tuple[Any, list[float], float]:
    """`call()` in a thread while client `b` sends heartbeats all along: its result,
    each heartbeat's seconds, and the call's."""
    import threading

    done = threading.Event()
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        finally:
            done.set()

    t = threading.Thread(target=run)
    t0 = time.perf_counter()
    t.start()
    waits = []
    while not done.is_set():
        h0 = time.perf_counter()
        b.heartbeat()
        waits.append(time.perf_counter() - h0)
        time.sleep(0.01)
    took = time.perf_counter() - t0
    t.join(60)
    assert out, "the call failed"
    return out[0], waits, took
