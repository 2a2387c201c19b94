"""Store benchmark: the embedded SQLite daemon beside 1, 2 and 4 daemons on one PostgreSQL.

The same workload on each: four agents, each on a session of its own, append agent steps
one batch at a time (an assistant message with its tool calls, then their results) and
read `context/get` after each, as fast as they can. Every daemon is a real `ctxd serve`
process with its default compaction policy; the agents are client processes on the ZMQ
wire, spread over the daemons (agent i talks to daemon i mod N). The archive is preloaded
to 10k and to 100k messages (a quarter in each agent's session, compacted): built once
on SQLite through the engine, then moved into PostgreSQL by the code behind `ctxd copy`
and cloned (CREATE DATABASE .. TEMPLATE) for each run, so every run starts from the same
archive.

Then, on one daemon of each store: how long a cheap request (`context/status`) from one
client waits while another client appends (each daemon serves requests on one event
loop, and a store call holds that loop until it returns), and where an append's time
goes (bench/store_profile.py: py-spy in the daemon, pg_stat_statements in the server).

    python -m bench.bench_store                  # ~10 minutes on 2 cores
    python -m bench.bench_store --quick          # 10k only, fewer steps: a smoke run
    python -m bench.bench_store --rtt 0,1,5 --steps 12 --rounds 1
        # daemons as hosts of their own (network namespaces, a delaying proxy adding
        # the round trip, round trips counted): bench/store_hosts.py, ~5 minutes

The PostgreSQL cluster is a throwaway one (tests/pg.py) on loopback TCP, fsync off as in
the tests: durable numbers would be lower for both stores, PostgreSQL's by a WAL flush
per commit.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import store_profile, store_report
from bench.workload import _Generator
from tests.helpers import DaemonProcess
from tests.pg import PASSWORD, PgCluster

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "store.md"
AGENTS = 4
STEPS = 30  # per agent and round
ROUNDS = 3  # the cases take turns, so a burst of load elsewhere hits them alike
PW_VAR = "CTXD_BENCH_PG_PASSWORD"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pct(xs: list[float], q: int) -> float:
    return statistics.quantiles(xs, n=100)[q - 1] if len(xs) > 1 else xs[0]


# ------------------------------------------------------------------ the archive


def build_archive(data_dir: Path, history: int) -> list[str]:
    """`history` messages in AGENTS sessions, each compacted; the session ids."""
    from ctxd.daemon.config import Config
    from ctxd.daemon.engine import Engine

    cfg = Config(data_dir=data_dir)
    cfg.compaction.max_active_messages = 10**9  # compacted once, at the end
    cfg.compaction.max_active_tokens = 10**12
    e = Engine(cfg)
    sids = []
    for i in range(AGENTS):
        sid = e.create_session(title=f"agent {i}").session_id
        gen = _Generator(100 + i, 0.3)
        e.append(sid, [gen.system()])
        left = history // AGENTS - 1
        while left > 0:
            n = min(500, left)
            e.append(sid, gen.filler(n))
            left -= n
        e.compact_sync(sid)
        sids.append(sid)
    e.close()
    return sids


class Stores:
    """The prepared archives: a SQLite data dir and a PostgreSQL template per size."""

    def __init__(self, cluster: PgCluster, scratch: Path) -> None:
        self.cluster = cluster
        self.scratch = scratch
        self.sessions: dict[int, list[str]] = {}
        self.runs = 0
        self.baseline: Path | None = None
        self.last_db: str | None = None

    def prepare(self, history: int) -> None:
        from ctxd.daemon.stores.copy import copy_sqlite_to_postgres

        t0 = time.perf_counter()
        src = self.scratch / f"sqlite-{history}"
        self.sessions[history] = build_archive(src, history)
        t1 = time.perf_counter()
        copy_sqlite_to_postgres(src, self.cluster.create_database(f"tpl_{history}"))
        log(f"archive of {history:,}: built on SQLite in {t1 - t0:.1f} s, copied to "
            f"PostgreSQL in {time.perf_counter() - t1:.1f} s")

    def sqlite_dir(self, history: int) -> Path:
        self.runs += 1
        root = self.scratch / f"run{self.runs}"
        (root / "data").mkdir(parents=True)
        shutil.copy(self.scratch / f"sqlite-{history}" / "ctxd.db", root / "data" / "ctxd.db")
        return root

    def pg_database(self, history: int) -> str:
        import psycopg

        self.runs += 1
        name = f"run{self.runs}"
        with psycopg.connect(self.cluster.socket_dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "tpl_{history}"')
        return name


def start_daemons(stores: Stores, kind: str, history: int, n: int) -> list[DaemonProcess]:
    """N daemons on a fresh copy of the archive; `stores.last_db` names a PostgreSQL one."""
    env = {"CTXD_LOG_LEVEL": "WARNING"}
    stores.last_db = None
    if kind == "sqlite":
        return [DaemonProcess(stores.sqlite_dir(history), env=env).start()]
    if kind == "pg-baseline":  # another ctxd's code, ahead of this checkout's on the path
        env["PYTHONPATH"] = str(stores.baseline)
    db = stores.last_db = stores.pg_database(history)
    env.update({"CTXD_STORE": "postgres", "CTXD_POSTGRES_DSN": stores.cluster.tcp_dsn(db),
                "CTXD_POSTGRES_PASSWORD_ENV": PW_VAR, PW_VAR: PASSWORD})
    out = []
    for i in range(n):
        root = stores.scratch / f"run{stores.runs}-d{i}"
        root.mkdir()
        out.append(DaemonProcess(root, env=env).start())
    return out


# ------------------------------------------------------------------ the clients


def agent(conn_file: str, sid: str, seed: int, steps: int, seconds: float, ready: Any,
          out: Any) -> None:
    """Append agent steps, each followed by context/get: `steps` of them, or as many as
    fit in `seconds` when that is not 0; times per step."""
    from ctxd.clients.client import connect

    gen = _Generator(seed, 0.3)
    batches = [gen.step() for _ in range(steps)]
    with connect(connection_file=Path(conn_file), wire="zmq") as c:
        c.context_status(sid)  # connected and logged in before the clock starts
        ready.wait()
        rows = []
        end = time.perf_counter() + seconds
        i = 0
        while i < steps if not seconds else time.perf_counter() < end:
            batch = batches[i] if i < steps else gen.step()
            i += 1
            t0 = time.perf_counter()
            c.append(sid, batch)
            t1 = time.perf_counter()
            c.context_get(sid)
            rows.append((t0, t1, time.perf_counter(), len(batch)))
    out.put(rows)


def prober(conn_file: str, sid: str, seconds: float, ready: Any, out: Any) -> None:
    """`context/status` every 5 ms for `seconds`: the latency of a cheap request."""
    from ctxd.clients.client import connect

    with connect(connection_file=Path(conn_file), wire="zmq") as c:
        c.context_status(sid)
        ready.wait()
        lat = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            c.context_status(sid)
            lat.append((time.perf_counter() - t0) * 1000)
            time.sleep(0.005)
    out.put(lat)


def run_clients(specs: list[tuple[Any, tuple[Any, ...]]]) -> tuple[list[Any], float]:
    """Start one process per (target, args), release them together; (results, wall s)."""
    ctx = mp.get_context("spawn")
    ready = ctx.Barrier(len(specs) + 1)
    out = ctx.Queue()
    procs = [ctx.Process(target=t, args=(*a, ready, out)) for t, a in specs]
    for p in procs:
        p.start()
    ready.wait(120)
    t0 = time.perf_counter()
    results = [out.get(timeout=600) for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join(30)
    return results, wall


# ------------------------------------------------------------------ the runs


def measure(daemons: list[DaemonProcess], sids: list[str], steps: int,
            seed: int) -> dict[str, Any]:
    """One round: every agent's steps, timed."""
    specs = [(agent, (str(daemons[i % len(daemons)].connection_file), sids[i], seed + i,
                      steps, 0)) for i in range(AGENTS)]
    results, _ = run_clients(specs)
    start = min(r[0][0] for r in results)
    end = max(r[-1][2] for r in results)
    return {
        "msgs_per_s": sum(n for r in results for *_, n in r) / (end - start),
        "append": [(t1 - t0) * 1000 for r in results for t0, t1, _, _ in r],
        "get": [(t2 - t1) * 1000 for r in results for _, t1, t2, _ in r],
    }


def summarize(rounds: list[dict[str, Any]], server: tuple[int, float, list[Any]] | None,
              ) -> dict[str, Any]:
    """Throughput: the median round's; latencies: over every step of every round;
    `server`: (statements, execution ms) the database ran for them, if PostgreSQL."""
    app = [x for r in rounds for x in r["append"]]
    get = [x for r in rounds for x in r["get"]]
    steps = len(app)
    return {
        "msgs_per_s": statistics.median(r["msgs_per_s"] for r in rounds),
        "append_p50": statistics.median(app), "append_p95": pct(app, 95),
        "get_p50": statistics.median(get), "get_p95": pct(get, 95),
        "step_p50": statistics.median(a + g for a, g in zip(app, get, strict=True)),
        "statements": server[0] / steps if server else None,
        "server_ms": server[1] / steps if server else None,
        "server_top": [(q, c / steps, t / steps) for q, c, t in server[2]] if server else [],
    }


def server_totals(cluster: PgCluster, db: str) -> tuple[int, float, list[Any]]:
    """Statements (BEGIN and COMMIT included) and their execution ms in database `db`,
    from pg_stat_statements; the three statements with the most, (text, calls, ms)."""
    import psycopg

    with psycopg.connect(cluster.socket_dsn(), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT query, calls, total_exec_time FROM pg_stat_statements s "
            "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s "
            "AND s.query NOT LIKE 'LISTEN%%' ORDER BY total_exec_time DESC", (db,)).fetchall()
    top = [(" ".join(q.split()), c, t) for q, c, t in rows[:3]]
    return sum(r[1] for r in rows), sum(r[2] for r in rows), top


def probe(daemon: DaemonProcess, sids: list[str], seconds: float = 5.0) -> dict[str, Any]:
    """A cheap request's latency alone, then while another client appends."""
    conn = str(daemon.connection_file)
    (idle,), _ = run_clients([(prober, (conn, sids[1], seconds / 2))])
    both, _ = run_clients([(prober, (conn, sids[1], seconds)),
                           (agent, (conn, sids[0], 99, 0, seconds))])
    busy = next(r for r in both if not isinstance(r[0], tuple))
    rows = next(r for r in both if isinstance(r[0], tuple))
    app = [(t1 - t0) * 1000 for t0, t1, _, _ in rows]
    return {"idle_p50": statistics.median(idle), "idle_p95": pct(idle, 95),
            "busy_p50": statistics.median(busy), "busy_p95": pct(busy, 95),
            "busy_max": max(busy), "append_p50": statistics.median(app)}


Case = tuple[str, str, int]  # label, store kind, daemons
BEFORE = "PostgreSQL, baseline"


def cases(baseline: bool) -> list[Case]:
    out: list[Case] = [("embedded SQLite", "sqlite", 1)]
    for n in (1, 2, 4):
        out.append(("PostgreSQL", "pg", n))
        if baseline:  # side by side, so both see the same moment's load
            out.append((BEFORE, "pg-baseline", n))
    return out


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10k only, 40 steps: a smoke run")
    parser.add_argument("--steps", type=int, default=STEPS, help="steps per agent and round")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="rounds of every case")
    parser.add_argument("--only-profile", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-profile", action="store_true", help="skip store_profile.py")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--baseline", type=Path, help="a directory holding another ctxd "
                        "package (ctxd/, ctxd/daemon/, ...): its daemons run the PostgreSQL "
                        "cases beside this checkout's, in the same run")
    parser.add_argument("--baseline-label", default="the baseline's code",
                        help="what the baseline is, for the report")
    parser.add_argument("--rtt", help="added round trips in ms, e.g. 0,1,5: run only the "
                        "tables of daemons as hosts of their own (bench/store_hosts.py)")
    parser.add_argument("--hosts-daemons", default="1,2,4", help="daemons per --rtt row")
    parser.add_argument("--loopback", action="store_true",
                        help="with --rtt: no network namespaces even where they can be made")
    args = parser.parse_args(argv)
    if args.rtt:
        return hosts_main(args)
    steps = 20 if args.quick else args.steps
    histories = [10_000] if args.quick else [10_000, 100_000]
    out = Path(args.out)
    scratch = Path(tempfile.mkdtemp(prefix="ctxd-bench-store-"))
    cluster = PgCluster().start()
    loads = [load_average()]
    results: dict[tuple[int, str, int], dict[str, Any]] = {}
    all_cases = cases(args.baseline is not None)
    probes: dict[str, dict[str, Any]] = {}
    profile_md = ""
    t_start = time.perf_counter()
    try:
        stores = Stores(cluster, scratch)
        stores.baseline = args.baseline
        for h in histories:
            stores.prepare(h)
        store_profile.enable_pg_stat_statements(cluster)
        for h in histories if not args.only_profile else []:
            running = {}
            for case in all_cases:
                running[case] = (start_daemons(stores, case[1], h, case[2]), stores.last_db)
            try:
                rounds: dict[Case, list[dict[str, Any]]] = {c: [] for c in all_cases}
                for r in range(args.rounds):
                    # each round in another order: no case always follows the same one
                    order = all_cases[r % len(all_cases):] + all_cases[:r % len(all_cases)]
                    for case in order if r % 2 == 0 else order[::-1]:
                        rounds[case].append(measure(running[case][0], stores.sessions[h],
                                                    steps, 1000 * (r + 1)))
                    log(f"{h:,} round {r + 1} of {args.rounds} (load {load_average()})")
                    loads.append(load_average())
                for case in all_cases:
                    label, kind, n = case
                    db = running[case][1]
                    res = results[(h, kind, n)] = summarize(
                        rounds[case], server_totals(cluster, db) if db else None)
                    log(f"{h:,} {label} x{n}: {res['msgs_per_s']:.0f} msg/s, append "
                        f"{res['append_p50']:.2f} ms, get {res['get_p50']:.2f} ms; server "
                        f"per step: {res['server_top']}")
                    if n == 1 and h == histories[0]:
                        probes[label] = probe(running[case][0][0], stores.sessions[h])
                        log(f"probe {label}: {probes[label]}")
            finally:
                for daemons, _ in running.values():
                    for d in daemons:
                        d.stop()
        if not args.no_profile:
            profile_md = store_profile.run(stores, histories[-1])
    finally:
        cluster.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    elapsed = time.perf_counter() - t_start
    if args.only_profile:
        print(profile_md)
        return 0
    png = store_report.plot(results, all_cases, out.parent) if not args.quick else None
    report = store_report.render(results, all_cases, probes, profile_md, histories, steps,
                                 loads, elapsed, png, args.baseline, args.baseline_label,
                                 args.rounds)
    out.write_text(report)
    print(report)
    return 0

def hosts_main(args: argparse.Namespace) -> int:
    """--rtt: the hosts tables on the 10k archive, to bench/results/store_hosts.md."""
    import signal

    from bench import store_hosts

    # a stopped run still removes its namespaces and veth pairs (the finally blocks)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rtts = [float(x) for x in args.rtt.split(",")]
    counts = [int(x) for x in args.hosts_daemons.split(",")]
    out = Path(args.out) if args.out != str(OUT) else OUT.with_name("store_hosts.md")
    scratch = Path(tempfile.mkdtemp(prefix="ctxd-bench-hosts-"))
    cluster = PgCluster().start()
    loads = [load_average()]
    try:
        stores = Stores(cluster, scratch)
        stores.baseline = args.baseline
        stores.prepare(10_000)
        md, _ = store_hosts.run(stores, 10_000, rtts, counts, args.steps, args.rounds,
                                False if args.loopback else None)
        loads.append(load_average())
    finally:
        cluster.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    code = f"daemons on {args.baseline_label} ({args.baseline})" if args.baseline else ""
    report = (f"# Store benchmark: daemons as hosts\n\n{code}\n\n`python -m bench.bench_store "
              f"--rtt {args.rtt} --hosts-daemons {args.hosts_daemons} --steps {args.steps} "
              f"--rounds {args.rounds}`; 10k archived; load average {' -> '.join(loads)} "
              f"on {os.cpu_count()} cores.\n\n{md}")
    out.write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
