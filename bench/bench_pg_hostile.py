"""What a role that may only connect to ctxd's PostgreSQL database costs the daemons, and
what a stuck privileged connection holding a session's row costs everyone else.

Two real daemons on one throwaway cluster (tests/pg.py, loopback TCP, fsync off), one
client on each appending to a session of its own (ZeroMQ wire), in four phases:
- quiet: nothing else;
- advisory: another role holds `pg_advisory_lock` on every key ctxd ever used (appends,
  compactions, runs, migrations), and on each session's;
- notify flood: that role sends `NOTIFY ctxd_events` as fast as it can, forged events
  and payloads nested 4000 deep in turn; a subscriber on daemon A times how long B's
  appends take to reach it, and counts what it got that nobody appended;
- stuck row: a privileged connection locks one session's row and goes quiet; an append
  to that session waits (lock_timeout 2 s here) while the two clients append to their own.

    python -m bench.bench_pg_hostile            # about a minute

Results: bench/results/pg_hostile.md.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from tests.helpers import DaemonProcess
from tests.pg import PASSWORD, PgCluster

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "pg_hostile.md"
PW_VAR = "CTXD_BENCH_PG_PASSWORD"
OLD_KEYS = (0x63747861, 0x63747863, 0x63747872, 0x63747864)
STEPS = 150
LOCK_TIMEOUT = 2


def ms(xs: list[float]) -> str:
    xs = sorted(xs)
    p95 = xs[min(len(xs) - 1, int(len(xs) * 0.95))]
    return f"{statistics.median(xs) * 1000:.1f} / {p95 * 1000:.1f} / {xs[-1] * 1000:.1f}"


def appends(clients: list[Any], sids: list[str], steps: int) -> tuple[list[float], list[float]]:
    """Each client appends to its own session `steps` times, in a thread each, and lists
    sessions every tenth step: (append seconds, session/list seconds)."""
    took: list[float] = []
    listed: list[float] = []

    def run(c: Any, sid: str) -> None:
        for i in range(steps):
            t0 = time.perf_counter()
            c.append(sid, [{"role": "user", "content": f"step {i}"}])
            took.append(time.perf_counter() - t0)
            if i % 10 == 0:
                t0 = time.perf_counter()
                c.list_sessions(limit=5)
                listed.append(time.perf_counter() - t0)

    ts = [threading.Thread(target=run, args=cs) for cs in zip(clients, sids, strict=True)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    return took, listed


def main() -> int:
    cluster = PgCluster().start()
    scratch = Path(tempfile.mkdtemp(prefix="ctxd-bench-hostile-"))
    rows: list[str] = []
    daemons: list[DaemonProcess] = []
    try:
        db = "hostile"
        cluster.create_database(db)
        with psycopg.connect(cluster.socket_dsn(), autocommit=True) as admin:
            admin.execute('CREATE ROLE "intruder" LOGIN')
        env = {"CTXD_STORE": "postgres", "CTXD_POSTGRES_DSN": cluster.tcp_dsn(db),
               "CTXD_POSTGRES_PASSWORD_ENV": PW_VAR, PW_VAR: PASSWORD,
               "CTXD_MAX_ACTIVE_MESSAGES": "100000",
               "CTXD_POSTGRES_LOCK_TIMEOUT_SECONDS": str(LOCK_TIMEOUT)}
        for name in "ab":
            (scratch / name).mkdir()
            daemons.append(DaemonProcess(scratch / name, env=env).start())
        intruder = psycopg.connect(
            f"host={cluster.sockdir} port={cluster.port} user=intruder dbname={db}",
            autocommit=True)
        clients = [d.client(timeout=60) for d in daemons]
        sids = [c.create_session()["sessionId"] for c in clients]
        appends(clients, sids, 20)  # warm up

        took, listed = appends(clients, sids, STEPS)
        rows.append(f"| quiet | {ms(took)} | {ms(listed)} |")
        for key in OLD_KEYS:
            intruder.execute("SELECT pg_advisory_lock(%s)", (key,))
            for sid in sids:
                intruder.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (key, sid))
        took, listed = appends(clients, sids, STEPS)
        rows.append(f"| advisory locks held | {ms(took)} | {ms(listed)} |")

        # the flood, while B's appends are timed to A's subscriber
        sub = daemons[0].client("jsonrpc", timeout=60)
        sub.subscribe(sids[1])
        seen: dict[int, float] = {}
        others: list[str] = []

        def note(method: str, params: dict[str, Any]) -> None:
            if method == "session/didAppend" and params["sessionId"] == sids[1]:
                for i in params["messageIds"]:
                    seen[i] = time.perf_counter()
            else:
                others.append(method)

        sub.on_notification(note)
        stop = threading.Event()
        sent = [0]

        def flood() -> None:
            with psycopg.connect(
                f"host={cluster.sockdir} port={cluster.port} user=intruder dbname={db}",
                autocommit=True,
            ) as c:
                forged = (f'{{"m": "context/didChange", "s": "{sids[1]}", "o": "x", '
                          '"v": {"change": "clear", "messageIds": []}}')
                while not stop.is_set():
                    c.execute("SELECT pg_notify('ctxd_events', %s)",
                              (forged if sent[0] % 2 else "[" * 3999 + "]" * 3999,))
                    sent[0] += 1

        f = threading.Thread(target=flood)
        f.start()
        t_flood = time.perf_counter()
        lat: list[float] = []
        for i in range(60):
            t0 = time.perf_counter()
            [mid] = clients[1].append(sids[1], [{"role": "user", "content": f"f{i}"}])[
                "messageIds"]
            while mid not in seen and time.perf_counter() - t0 < 10:
                time.sleep(0.001)
            lat.append(seen.get(mid, t0 + 10) - t0)
        stop.set()
        f.join(10)
        rate = sent[0] / (time.perf_counter() - t_flood)
        crossed = sum(1 for x in lat if x < 10)
        rows.append(f"| NOTIFY flood ({rate:.0f}/s) | B's append seen on A: {ms(lat)} | "
                    f"{crossed}/{len(lat)} crossed, {len(others)} forged relayed |")
        sub.close()

        # a privileged connection stuck on a session's row
        stuck_sid = clients[0].create_session()["sessionId"]
        waited: list[Any] = []
        with psycopg.connect(cluster.socket_dsn(db)) as stuck:
            stuck.execute("SELECT 1 FROM sessions WHERE id = %s FOR UPDATE", (stuck_sid,))

            def blocked() -> None:
                with daemons[0].client(timeout=60) as c:
                    t0 = time.perf_counter()
                    try:
                        c.append(stuck_sid, [{"role": "user", "content": "x"}])
                        waited.append(("answered", time.perf_counter() - t0))
                    except Exception as exc:  # noqa: BLE001 - reported
                        waited.append((getattr(exc, "data", {}).get("reason"),
                                       time.perf_counter() - t0))

            t = threading.Thread(target=blocked)
            t.start()
            took, listed = appends(clients, sids, 30)
            t.join(60)
            stuck.rollback()
        reason, secs = waited[0]
        rows.append(f"| stuck row lock (waiter: {reason} after {secs:.2f} s) | {ms(took)} | "
                    f"{ms(listed)} |")
        for c in clients:
            c.close()
        intruder.close()
    finally:
        for d in daemons:
            if d.proc and d.proc.poll() is None:
                d.stop()
        cluster.stop()
    table = ("| phase | append ms (p50 / p95 / max) | session/list ms (p50 / p95 / max) |\n"
             "|---|---|---|\n" + "\n".join(rows) + "\n")
    print(table)
    OUT.write_text(
        "# PostgreSQL: a role that may only connect, and a stuck row lock\n\n"
        "`python -m bench.bench_pg_hostile`: two daemons, one client each appending to its "
        f"own session, {STEPS} steps per phase ({time.strftime('%Y-%m-%d')}, 2 shared "
        "cores).\n\n" + table
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
