"""Open runs across daemons on one real PostgreSQL: a daemon whose connections the
server dropped (a restart) keeps its runs; the other daemon adopts none of them."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
from helpers import DaemonProcess
from pg import PASSWORD, PgCluster
from test_pg_daemons import PW_VAR, _stop_running

from ctxd.daemon.stores.postgres.runs import RETAKE_GRACE
from ctxd.protocol.errors import CtxdError


def test_a_daemon_keeps_its_runs_across_a_postgres_restart(tmp_path: Path) -> None:
    cluster = PgCluster().start()
    env = {"CTXD_STORE": "postgres", "CTXD_POSTGRES_DSN": cluster.tcp_dsn(),
           "CTXD_POSTGRES_PASSWORD_ENV": PW_VAR, PW_VAR: PASSWORD,
           # a lease far longer than the restart, so that only an adoption could take a
           # run from A; the daemons look for orphans every lease / 3 seconds
           "CTXD_RUN_LEASE_SECONDS": "12"}
    procs = []
    try:
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            procs.append(DaemonProcess(tmp_path / name, env=env).start())
        a, b = procs
        with a.client("jsonrpc") as ca, b.client("jsonrpc") as cb:
            sids = [cb.create_session()["sessionId"] for _ in range(2)]
            runs = [ca.start_run(sid)["runId"] for sid in sids]
            owners_before = _owners(cluster, runs)
            assert len(set(owners_before.values())) == 1  # A's
            cluster.halt()
            cluster.launch()
            deadline = time.monotonic() + 60
            for c in (cb, ca):
                while True:
                    assert time.monotonic() < deadline, "a daemon never reached the server"
                    try:
                        c.context_status(sids[0])
                        break
                    except CtxdError:  # the first request after the restart may fail
                        time.sleep(0.2)
            # B's grace after the restart and two of its looks past it: a run it adopted
            # would name B as its daemon by now
            time.sleep(RETAKE_GRACE + 2 * 4 + 2)
            assert _owners(cluster, runs) == owners_before
            for sid, run in zip(sids, runs, strict=True):
                assert cb.context_status(sid)["activeRunId"] == run
            # A still serves them: its client finishes one, runs a turn in the other
            done = ca.finish_run(runs[0], "completed")
            assert done["run"]["status"] == "completed"
            ca.append(sids[1], [{"role": "user", "content": "still mine"}], run_id=runs[1])
            assert cb.context_status(sids[1])["activeRunId"] == runs[1]
            assert cb.context_status(sids[0])["activeRunId"] is None
    finally:
        _stop_running(procs)
        cluster.stop()


def _owners(cluster: PgCluster, runs: list[str]) -> dict[str, str | None]:
    """Which daemon each run names as serving it, read from the database itself."""
    with psycopg.connect(cluster.tcp_dsn(), password=PASSWORD) as conn:
        rows = conn.execute("SELECT id, daemon_id FROM runs WHERE id = ANY(%s)",
                            (runs,)).fetchall()
    return {rid: daemon for rid, daemon in rows}
