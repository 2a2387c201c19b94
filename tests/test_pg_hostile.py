"""Real daemons on one real PostgreSQL, and another role of that server that may only
connect (as PUBLIC may, by default): it cannot stall, deafen or lie to the daemons. And a
lock held on a ctxd row by a stuck privileged connection costs the waiting request a
typed error after the bounded wait, nobody else anything."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers import DaemonProcess, agent_turn, notifications_until, wait_for
from pg import PgCluster
from psycopg import errors as pgerr
from test_pg_daemons import _pg_env, _stop_running

from ctxd.protocol.errors import StorageError

# the advisory keys ctxd used to lock with: appends ("ctxa"), compactions ("ctxc"), runs
# ("ctxr"), migrations ("ctxd")
OLD_KEYS = (0x63747861, 0x63747863, 0x63747872, 0x63747864)
# the most a request may take in these tests before it counts as stalled (generous: 2
# cores shared with other work)
PROMPT = 20.0


@pytest.fixture
def intruder(pg_cluster: PgCluster, pg_dsn: str) -> Iterator[psycopg.Connection]:
    """A connection of a role of its own with nothing but the CONNECT every role has."""
    dbname = psycopg.conninfo.conninfo_to_dict(pg_dsn)["dbname"]
    role = f"intruder_{dbname}"
    with psycopg.connect(pg_cluster.socket_dsn(), autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
    conn = psycopg.connect(
        f"host={pg_cluster.sockdir} port={pg_cluster.port} user={role} dbname={dbname}",
        autocommit=True,
    )
    yield conn
    conn.close()


def _drain(stream: Any) -> list[tuple[str, dict[str, Any]]]:
    out = []
    while True:
        try:
            out.append(next(stream))
        except StopIteration:
            return out


def _daemons(tmp_path: Path, pg_cluster: PgCluster, pg_dsn: str, names: str = "ab",
             **extra: str) -> list[DaemonProcess]:
    env = {**_pg_env(pg_cluster, pg_dsn), "CTXD_KEEP_MESSAGES": "4", **extra}
    out = []
    for name in names:
        (tmp_path / name).mkdir()
        out.append(DaemonProcess(tmp_path / name, env=env).start())
    return out


def test_advisory_locks_of_a_role_that_may_only_connect_stall_nothing(
    tmp_path: Path, pg_cluster: PgCluster, pg_dsn: str, intruder: psycopg.Connection,
) -> None:
    a, b = _daemons(tmp_path, pg_cluster, pg_dsn)
    try:
        with a.client("jsonrpc", timeout=PROMPT) as ca, b.client(timeout=PROMPT) as cb:
            sid = ca.create_session()["sessionId"]
            ca.append(sid, agent_turn(0))
            # every key ctxd ever locked, and those of this session, held for as long as
            # the intruder likes
            for key in OLD_KEYS:
                intruder.execute("SELECT pg_advisory_lock(%s)", (key,))
                intruder.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (key, sid))
            ca.subscribe(sid)
            events = ca.notifications(timeout=0.5)
            turns = list(range(1, 7))
            for i in turns:
                for c in (ca if i % 2 else cb,):
                    ids = c.append(sid, agent_turn(i))["messageIds"]
                    wait_for(events, "session/didAppend", timeout=PROMPT,
                             where=lambda p, ids=ids: p["messageIds"] == ids)
            for c in (ca, cb):
                assert sid in [s["sessionId"] for s in c.list_sessions()["sessions"]]
                other = c.create_session()["sessionId"]
                c.append(other, [{"role": "user", "content": "elsewhere"}])
            # one compactor per session still, by ctxd's own lock: not the intruder's
            done = cb.compact(sid, force=True)
            assert done["compactionId"] and done["effective"]
            run = ca.start_run(sid)["runId"]
            assert cb.context_status(sid)["activeRunId"] == run
            # a daemon starts (and migrates) while the intruder holds the old migration key
            (c_daemon,) = _daemons(tmp_path, pg_cluster, pg_dsn, "c")
            try:
                with c_daemon.client(timeout=PROMPT) as cc:
                    archived = sum(len(agent_turn(i)) for i in [0, *turns])
                    assert cc.context_status(sid)["archiveMessages"] == archived
            finally:
                c_daemon.stop()
        # what the role can still do is not much: it cannot lock or read ctxd's rows
        for sql in ("SELECT 1 FROM sessions FOR UPDATE", "SELECT body FROM messages",
                    "SELECT 1 FROM compaction_locks FOR UPDATE", "SELECT * FROM ctxd_events",
                    "SELECT 1 FROM ctxd_daemons FOR KEY SHARE", "SELECT daemon_id FROM runs"):
            with pytest.raises(pgerr.InsufficientPrivilege):
                intruder.execute(sql)
    finally:
        _stop_running((a, b))


def test_notifications_of_a_role_that_may_only_connect_are_never_relayed(
    tmp_path: Path, pg_cluster: PgCluster, pg_dsn: str, intruder: psycopg.Connection,
) -> None:
    a, b = _daemons(tmp_path, pg_cluster, pg_dsn)
    try:
        with a.client("jsonrpc", timeout=PROMPT) as ca, b.client(timeout=PROMPT) as cb:
            sid = cb.create_session()["sessionId"]
            ca.subscribe(sid)
            got: list[tuple[str, dict[str, Any]]] = []
            events = ca.notifications(timeout=0.5)
            real = cb.append(sid, [{"role": "user", "content": "real"}])

            def crossed() -> list[int]:
                """An append through B, seen by A's subscriber: every notification sent
                before it has been handled by A's listener (all kept in `got`)."""
                ids = cb.append(sid, [{"role": "user", "content": "mark"}])["messageIds"]
                got.extend(notifications_until(events, "session/didAppend",
                                  lambda p: p["messageIds"] == ids, PROMPT))
                return ids

            forged = [
                # a real batch told again, a context change that never was, a run, an
                # approval, a progress report: each naming the watched session
                f'{{"m": "session/didAppend", "s": "{sid}", "b": {real["batchId"]}, "o": "x"}}',
                f'{{"m": "context/didChange", "s": "{sid}", "o": "x", "v": {{"change": '
                f'"clear", "messageIds": []}}, "st": 1}}',
                f'{{"m": "context/didCompact", "s": "{sid}", "o": "x", "v": {{"effective": '
                f'true, "compactionId": "cmp_forged"}}}}',
                f'{{"m": "$/progress", "s": "{sid}", "o": "x", "v": {{"token": "cmp_forged", '
                f'"value": {{"kind": "begin"}}}}}}',
                '{"m": "run/didStart", "s": "' + sid + '", "o": "x", "r": "run_forged"}',
                "not json at all", "", "12345",
            ]
            for payload in forged:
                intruder.execute("SELECT pg_notify('ctxd_events', %s)", (payload,))
            first = crossed()
            # nested deeper than any parser's recursion, within NOTIFY's 8000 bytes
            intruder.execute("SELECT pg_notify('ctxd_events', %s)", ("[" * 3999 + "]" * 3999,))
            intruder.execute("SELECT pg_notify('ctxd_events', %s)",
                             ('{"m":' * 1200 + "1" + "}" * 1200,))
            # the listener survived: real events still cross, again and again
            second = crossed()
            third = crossed()
            assert not cb.context_status(sid)["compacting"]
            assert not ca.context_status(sid)["compacting"]
            time.sleep(0.5)  # anything relayed late would be in the stream by now
            got.extend(_drain(events))
        appended = [p["messageIds"] for m, p in got if m == "session/didAppend"]
        # told of each append once: the forged repeat of `real` is not here
        assert appended == [real["messageIds"], first, second, third]
        assert {m for m, _ in got} == {"session/didAppend"}
        assert "Traceback" not in a.log_path.read_text(errors="replace")
    finally:
        _stop_running((a, b))


def test_advisory_locks_of_a_role_that_may_only_connect_keep_no_dead_daemons_run_open(
    tmp_path: Path, pg_cluster: PgCluster, pg_dsn: str, intruder: psycopg.Connection,
) -> None:
    a, b = _daemons(tmp_path, pg_cluster, pg_dsn, CTXD_RUN_LEASE_SECONDS="1")
    try:
        with b.client(timeout=PROMPT) as cb:
            live, doomed = (cb.create_session()["sessionId"] for _ in range(2))
            with a.client("jsonrpc", timeout=PROMPT) as ca:
                runs = [ca.start_run(sid)["runId"] for sid in (live, doomed)]
                keys = [(key, name) for key in OLD_KEYS for name in (*runs, live, doomed)]

                def lock_every_key() -> None:
                    # queued behind whoever holds a key: the first to get it when that
                    # holder's connection ends
                    for key in OLD_KEYS:
                        intruder.execute("SELECT pg_advisory_lock(%s)", (key,))
                    for key, name in keys:
                        intruder.execute("SELECT pg_advisory_lock(%s, hashtext(%s))",
                                         (key, name))

                locker = threading.Thread(target=lock_every_key, daemon=True)
                locker.start()
                time.sleep(3)  # three leases: B leaves the runs of a live daemon alone
                assert cb.context_status(live)["activeRunId"] == runs[0]
                assert cb.context_status(doomed)["activeRunId"] == runs[1]
                a.kill()
            locker.join(PROMPT)
            assert not locker.is_alive(), "the intruder never got every key"
            held = intruder.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND pid = pg_backend_pid()"
            ).fetchone()[0]
            assert held == len(OLD_KEYS) + len(keys)
            # the killed daemon's runs are adopted all the same, leased and interrupted
            for sid in (live, doomed):
                deadline = time.monotonic() + PROMPT
                while cb.context_status(sid)["activeRunId"] is not None:
                    assert time.monotonic() < deadline, "the dead daemon's run stayed open"
                    time.sleep(0.2)
            with psycopg.connect(pg_dsn) as owner:
                done = dict(owner.execute("SELECT id, status FROM runs").fetchall())
            assert done == {run: "interrupted" for run in runs}
            again = cb.start_run(doomed)["runId"]
            assert cb.context_status(doomed)["activeRunId"] == again
    finally:
        _stop_running((a, b))


def test_a_row_lock_held_by_a_stuck_connection_fails_only_its_waiter_after_the_bound(
    tmp_path: Path, pg_cluster: PgCluster, pg_dsn: str,
) -> None:
    bound = 6
    a, b = _daemons(tmp_path, pg_cluster, pg_dsn,
                    CTXD_POSTGRES_LOCK_TIMEOUT_SECONDS=str(bound))
    try:
        with a.client("jsonrpc", timeout=PROMPT + bound) as ca, \
                a.client("jsonrpc", timeout=PROMPT) as other, b.client(timeout=PROMPT) as cb:
            stuck_sid = ca.create_session()["sessionId"]
            free_sid = cb.create_session()["sessionId"]
            ca.append(stuck_sid, [{"role": "user", "content": "before"}])
            with psycopg.connect(pg_cluster.socket_dsn(
                    psycopg.conninfo.conninfo_to_dict(pg_dsn)["dbname"])) as stuck, \
                    psycopg.connect(pg_dsn, autocommit=True) as watch:
                # a privileged connection locks the session's row and goes quiet
                stuck.execute("SELECT 1 FROM sessions WHERE id = %s FOR UPDATE", (stuck_sid,))
                outcome: list[BaseException | dict] = []

                def blocked() -> None:
                    try:
                        outcome.append(ca.append(stuck_sid, [{"role": "user", "content": "x"}]))
                    except BaseException as exc:  # noqa: BLE001 - asserted below
                        outcome.append(exc)

                t = threading.Thread(target=blocked)
                t.start()

                def waiting() -> int:
                    return watch.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                        "current_database() AND wait_event_type = 'Lock'").fetchone()[0]

                deadline = time.monotonic() + PROMPT
                while not waiting():
                    assert time.monotonic() < deadline, "the append never waited for the lock"
                    time.sleep(0.02)
                # meanwhile, the same daemon and the other one serve everything else
                for c in (other, cb):
                    c.append(free_sid, [{"role": "user", "content": "served"}])
                    assert c.list_sessions()["sessions"]
                    assert c.context_status(stuck_sid)["archiveMessages"] == 1
                    assert c.context_get(free_sid)["messages"]
                assert waiting() and not outcome, "the others were not served during the wait"
                t.join(PROMPT + bound)
                [err] = outcome
                assert isinstance(err, StorageError), err
                assert err.data["reason"] == "LockNotAvailable"
                assert err.data["timeoutSeconds"] == bound
                stuck.rollback()
            # nothing of the refused append was written; the session takes appends again
            ca.append(stuck_sid, [{"role": "user", "content": "after"}])
            assert [m["content"] for m in cb.read(stuck_sid)["messages"]] == ["before", "after"]
    finally:
        _stop_running((a, b))
