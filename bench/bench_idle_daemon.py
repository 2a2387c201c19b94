"""What a daemon none of whose clients watch a session pays for that session's events.

Two daemons on one PostgreSQL database: four agents on daemon A, each on a session of
its own, append agent steps (bench/workload.py) and read `context/get` after each;
daemon B serves nobody. B's CPU per turn of A's is what every event costs a daemon that
relays none of it (its listener woken, rows read, handed to its event loop); A's is
the turn itself. Then both daemons idle: CPU per second with nothing to do.

    python -m bench.bench_idle_daemon                      # this checkout
    python -m bench.bench_idle_daemon --baseline DIR       # daemons from another ctxd
        # DIR holds a ctxd package (ctxd/, ctxd/daemon/, ...), as bench_store's

CPU comes from /proc (bench/store_cpu.py), in clock ticks: with a few hundred turns a
figure below 0.05 ms per turn reads as 0. Steer by CPU, not time: on a shared machine
the load average is printed beside every figure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.store_cpu import tree_cpu
from bench.workload import _Generator
from tests.helpers import DaemonProcess
from tests.pg import PASSWORD, PgCluster

PW_VAR = "CTXD_BENCH_PG_PASSWORD"
AGENTS = 4


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def run(steps: int, idle_seconds: float, baseline: str | None) -> dict[str, Any]:
    from ctxd.clients.client import connect

    cluster = PgCluster().start()
    scratch = Path(tempfile.mkdtemp(prefix="ctxd-bench-idle-"))
    daemons: list[DaemonProcess] = []
    try:
        cluster.create_database("idle")
        env = {"CTXD_STORE": "postgres", "CTXD_POSTGRES_DSN": cluster.tcp_dsn("idle"),
               "CTXD_POSTGRES_PASSWORD_ENV": PW_VAR, PW_VAR: PASSWORD,
               "CTXD_LOG_LEVEL": "WARNING"}
        if baseline:
            env["PYTHONPATH"] = baseline
        for name in ("serving", "idle"):
            (scratch / name).mkdir()
            daemons.append(DaemonProcess(scratch / name, env=env).start())
        pids = [d.proc.pid for d in daemons if d.proc is not None]
        pg = cluster.proc.pid if cluster.proc else 0
        out: dict[str, Any] = {"load_before": load()}
        with connect(connection_file=daemons[0].connection_file, wire="zmq") as c:
            gens = [_Generator(100 + i, 0.3) for i in range(AGENTS)]
            sids = [c.create_session(title=f"agent {i}")["sessionId"] for i in range(AGENTS)]
            for sid, gen in zip(sids, gens, strict=True):
                c.append(sid, [gen.system()])
            before = [tree_cpu([p]) for p in pids] + [tree_cpu([pg])]
            turns = 0
            for _ in range(steps):
                for sid, gen in zip(sids, gens, strict=True):
                    c.append(sid, gen.step())
                    c.context_get(sid)
                    turns += 1
            after = [tree_cpu([p]) for p in pids] + [tree_cpu([pg])]
        per_turn = [(b - a) * 1000 / turns for a, b in zip(before, after, strict=True)]
        out.update(turns=turns, serving=per_turn[0], idle=per_turn[1], postgres=per_turn[2])
        with psycopg.connect(cluster.socket_dsn("idle")) as q:
            out["events"] = dict(q.execute(
                "SELECT body::json->>'m', count(*) FROM ctxd_events GROUP BY 1").fetchall())
        out["load_turns"] = load()
        before = [tree_cpu([p]) for p in pids]
        time.sleep(idle_seconds)
        after = [tree_cpu([p]) for p in pids]
        out["idle_ms_per_s"] = [(b - a) * 1000 / idle_seconds
                                for a, b in zip(before, after, strict=True)]
        out["load_after"] = load()
        return out
    finally:
        for d in daemons:
            d.stop()
        cluster.stop()
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="steps per agent")
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--baseline", default=None,
                        help="a directory holding another ctxd package: its daemons run")
    args = parser.parse_args()
    r = run(args.steps, args.idle_seconds, args.baseline)
    code = f"daemons from {args.baseline}" if args.baseline else "this checkout's daemons"
    print(f"{code}; load average {r['load_before']} -> {r['load_turns']} -> "
          f"{r['load_after']} on {os.cpu_count()} cores")
    print(f"{r['turns']} turns on the serving daemon; events written: {r['events']}")
    print(f"CPU ms per turn: serving daemon {r['serving']:.2f}, daemon serving nobody "
          f"{r['idle']:.2f}, PostgreSQL {r['postgres']:.2f}")
    print("idle, CPU ms per second: serving daemon {:.2f}, the other {:.2f}".format(
        *r["idle_ms_per_s"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
