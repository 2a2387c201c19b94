"""Two real daemon processes on one PostgreSQL database, clients on each: one truth."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from helpers import DaemonProcess, wait_for
from pg import PASSWORD, PgCluster

from ctxd.protocol.errors import CtxdError

PW_VAR = "CTXD_TEST_PG_PASSWORD"


@pytest.fixture
def daemons(tmp_path: Path, pg_cluster: PgCluster, pg_dsn: str) -> Iterator[list[DaemonProcess]]:
    dbname = psycopg.conninfo.conninfo_to_dict(pg_dsn)["dbname"]
    env = {"CTXD_STORE": "postgres", "CTXD_POSTGRES_DSN": pg_cluster.tcp_dsn(dbname),
           "CTXD_POSTGRES_PASSWORD_ENV": PW_VAR, PW_VAR: PASSWORD,
           # no auto-compaction: the context must hold every message appended
           "CTXD_MAX_ACTIVE_MESSAGES": "10000"}
    procs = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        procs.append(DaemonProcess(tmp_path / name, env=env).start())
    yield procs
    for d in procs:
        d.stop()


def test_each_daemon_names_its_own_endpoints(daemons: list[DaemonProcess]) -> None:
    a, b = (d.info() for d in daemons)
    assert a["pid"] != b["pid"]
    assert a != b and a.get("data_dir") != b.get("data_dir")


def test_events_cross_daemons(daemons: list[DaemonProcess]) -> None:
    a, b = daemons
    with a.client("jsonrpc") as ca, b.client("zmq") as cb:
        sid = ca.create_session(title="shared")["sessionId"]
        ca.subscribe(sid)
        events = ca.notifications(timeout=0.5)
        ids = cb.append(sid, [{"role": "user", "content": "through daemon B"}])["messageIds"]
        got = wait_for(events, "session/didAppend", where=lambda p: p["messageIds"] == ids)
        assert got["sessionId"] == sid
        assert got["status"]["archiveMessages"] == 1
        # and the subscriber's own daemon reads the message B archived
        assert [m["content"] for m in ca.read(sid)["messages"]] == ["through daemon B"]


def test_appends_through_both_daemons_interleave_without_loss(
    daemons: list[DaemonProcess],
) -> None:
    a, b = daemons
    with a.client() as c0:
        sid = c0.create_session()["sessionId"]
    per_client = 25
    errors: list[BaseException] = []

    def writer(d: DaemonProcess, tag: str) -> None:
        try:
            with d.client() as c:
                for i in range(per_client):
                    c.append(sid, [{"role": "user", "content": f"{tag} {i}"}],
                             client_batch_id=f"{tag}-{i}")
                    if i % 5 == 0:  # a retried batch is not stored twice
                        c.append(sid, [{"role": "user", "content": f"{tag} {i}"}],
                                 client_batch_id=f"{tag}-{i}")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(d, f"{n}{k}"))
               for n, d in (("a", a), ("b", b)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    with b.client() as c:
        msgs = c.read(sid, limit=1000)["messages"]
        ids = [m["id"] for m in msgs]
        assert ids == sorted(ids) and len(set(ids)) == len(ids) == 4 * per_client
        for tag in ("a0", "a1", "b0", "b1"):
            mine = [m["content"] for m in msgs if m["content"].startswith(tag)]
            assert mine == [f"{tag} {i}" for i in range(per_client)]  # each writer's order
        # the context's counters saw every append, whichever daemon took it
        for d in (a, b):
            with d.client() as cd:
                st = cd.context_get(sid)
                assert len(st["messages"]) == 4 * per_client


def test_approval_answered_on_two_daemons_has_one_winner(daemons: list[DaemonProcess]) -> None:
    a, b = daemons
    with a.client() as ca, b.client() as cb:
        sid = ca.create_session()["sessionId"]
        run = ca.start_run(sid)
        ca.append(sid, [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "rm", "arguments": "{}"}}]}], run_id=run["runId"])
        appr = ca.request_approval(sid, run["runId"], "call_1", "rm", {})
        # a second run cannot open while this one is, through either daemon
        with pytest.raises(CtxdError):
            cb.start_run(sid)
        outcomes: list[object] = []
        barrier = threading.Barrier(2)

        def answer(client, decision: str) -> None:
            barrier.wait()
            try:
                outcomes.append(client.resolve_approval(appr["approvalId"], decision))
            except CtxdError as exc:
                outcomes.append(exc)

        ts = [threading.Thread(target=answer, args=(ca, "approved")),
              threading.Thread(target=answer, args=(cb, "denied"))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        wins = [o for o in outcomes if isinstance(o, dict)]
        assert len(wins) == 1 and len(outcomes) == 2
        for c in (ca, cb):  # both daemons report the winner's answer
            assert c.list_approvals(sid)["approvals"][0]["status"] == wins[0]["status"]
