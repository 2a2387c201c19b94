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

The PostgreSQL cluster is a throwaway one (tests/pg.py) on loopback TCP, fsync off as in
the tests: durable numbers would be lower for both stores, PostgreSQL's by a WAL flush
per commit.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.workload import _Generator
from tests.helpers import DaemonProcess
from tests.pg import PASSWORD, PgCluster

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "store.md"
PLOT = "store.png"
AGENTS = 4
STEPS = 120  # per agent and run
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
        sid = e.create_session(title=f"agent {i}")["sessionId"]
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

    def prepare(self, history: int) -> None:
        from ctxd.daemon.pg.copy import copy_sqlite_to_postgres

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
    env = {"CTXD_LOG_LEVEL": "WARNING"}
    if kind == "sqlite":
        return [DaemonProcess(stores.sqlite_dir(history), env=env).start()]
    if kind == "pg-baseline":  # another ctxd's code, ahead of this checkout's on the path
        env["PYTHONPATH"] = str(stores.baseline)
    db = stores.pg_database(history)
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


def measure(daemons: list[DaemonProcess], sids: list[str], steps: int) -> dict[str, Any]:
    specs = [(agent, (str(daemons[i % len(daemons)].connection_file), sids[i], 7 + i, steps, 0))
             for i in range(AGENTS)]
    results, _ = run_clients(specs)
    start = min(r[0][0] for r in results)
    end = max(r[-1][2] for r in results)
    app = [(t1 - t0) * 1000 for r in results for t0, t1, _, _ in r]
    get = [(t2 - t1) * 1000 for r in results for _, t1, t2, _ in r]
    step = [(t2 - t0) * 1000 for r in results for t0, _, t2, _ in r]
    tenth = max(1, steps // 10)
    first = [(r[i][2] - r[i][0]) * 1000 for r in results for i in range(tenth)]
    last = [(r[i][2] - r[i][0]) * 1000 for r in results for i in range(steps - tenth, steps)]
    return {
        "msgs_per_s": sum(n for r in results for *_, n in r) / (end - start),
        "append_p50": statistics.median(app), "append_p95": pct(app, 95),
        "get_p50": statistics.median(get), "get_p95": pct(get, 95),
        "step_p50": statistics.median(step),
        "flat": statistics.median(last) / statistics.median(first),
    }


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


def plot(results: dict[tuple[int, str, int], dict[str, Any]], all_cases: list[Case],
         out_dir: Path) -> str | None:
    try:
        import matplotlib
    except ImportError:
        log("matplotlib is not installed (pip install 'ctxd[bench]'): no plot")
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    histories = sorted({h for h, _, _ in results})
    labels = [("SQLite" if k == "sqlite" else f"PG{'*' if k != 'pg' else ''} x{n}")
              for _, k, n in all_cases]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    width = 0.8 / len(histories)
    for j, (key, title) in enumerate((("msgs_per_s", "append throughput (messages/s)"),
                                      ("append_p50", "append p50 (ms)"),
                                      ("get_p50", "context/get p50 (ms)"))):
        ax = axes[j]
        for i, h in enumerate(histories):
            ys = [results[(h, k, n)][key] for _, k, n in all_cases]
            xs = [x + i * width for x in range(len(all_cases))]
            ax.bar(xs, ys, width, label=f"{h:,} archived")
            if key != "msgs_per_s":
                p95 = [results[(h, k, n)][key.replace("p50", "p95")] for _, k, n in all_cases]
                ax.scatter(xs, p95, marker="_", color="black", s=200,
                           label="p95" if i == 0 else None)
        ax.set_xticks([x + width * (len(histories) - 1) / 2 for x in range(len(all_cases))])
        ax.set_xticklabels(labels, rotation=30)
        ax.set_title(title)
        ax.legend()
    fig.suptitle(f"{AGENTS} agents appending steps and reading context/get, default "
                 "compaction policy" + ("; PG*: the baseline" if len(all_cases) > 4 else ""))
    fig.tight_layout()
    fig.savefig(out_dir / PLOT, dpi=110)
    plt.close(fig)
    return PLOT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10k only, 40 steps: a smoke run")
    parser.add_argument("--steps", type=int, default=STEPS, help="steps per agent and run")
    parser.add_argument("--only-profile", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-profile", action="store_true", help="skip store_profile.py")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--baseline", type=Path, help="a directory holding another ctxd "
                        "package (ctxd/, ctxd/daemon/, ...): its daemons run the PostgreSQL "
                        "cases beside this checkout's, in the same run")
    parser.add_argument("--baseline-label", default="the baseline's code",
                        help="what the baseline is, for the report")
    args = parser.parse_args(argv)
    steps = 40 if args.quick else args.steps
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
        for h in histories if not args.only_profile else []:
            for label, kind, n in all_cases:
                daemons = start_daemons(stores, kind, h, n)
                try:
                    r = results[(h, kind, n)] = measure(daemons, stores.sessions[h], steps)
                    log(f"{h:,} {label} x{n}: {r['msgs_per_s']:.0f} msg/s, append "
                        f"{r['append_p50']:.2f} ms, get {r['get_p50']:.2f} ms "
                        f"(load {load_average()})")
                    if n == 1 and h == histories[0]:
                        probes[label] = probe(daemons[0], stores.sessions[h])
                        log(f"probe {label}: {probes[label]}")
                finally:
                    for d in daemons:
                        d.stop()
                loads.append(load_average())
        if not args.no_profile:
            from bench import store_profile

            profile_md = store_profile.run(stores, histories[-1], steps)
    finally:
        cluster.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    elapsed = time.perf_counter() - t_start
    if args.only_profile:
        print(profile_md)
        return 0
    png = plot(results, all_cases, out.parent) if not args.quick else None
    report = render(results, all_cases, probes, profile_md, histories, steps, loads, elapsed,
                    png, args.baseline, args.baseline_label)
    out.write_text(report)
    print(report)
    return 0


def render(results: dict[tuple[int, str, int], dict[str, Any]], all_cases: list[Case],
           probes: dict[str, dict[str, Any]], profile_md: str, histories: list[int],
           steps: int, loads: list[str], elapsed: float, png: str | None,
           baseline: Path | None, baseline_label: str = "") -> str:
    rows = []
    for h in histories:
        for label, kind, n in all_cases:
            r = results[(h, kind, n)]
            rows.append(
                f"| {h:,} | {label} | {n} | {r['msgs_per_s']:,.0f} | {r['append_p50']:.2f} | "
                f"{r['append_p95']:.2f} | {r['get_p50']:.2f} | {r['get_p95']:.2f} | "
                f"{r['flat']:.2f} |")
    flat = []
    if len(histories) > 1:
        lo, hi = histories[0], histories[-1]
        for label, kind, n in all_cases:
            a, b = results[(lo, kind, n)], results[(hi, kind, n)]
            flat.append(f"| {label} | {n} | {a['step_p50']:.2f} | {b['step_p50']:.2f} | "
                        f"{b['step_p50'] / a['step_p50']:.2f} |")
    base = {h: results[(h, "sqlite", 1)] for h in histories}
    ratios = []
    for h in histories:
        for label, kind, n in all_cases[1:]:
            r = results[(h, kind, n)]
            ratios.append(
                f"| {h:,} | {label} x{n} | {r['append_p50'] / base[h]['append_p50']:.1f}x | "
                f"{r['get_p50'] / base[h]['get_p50']:.1f}x | "
                f"{r['msgs_per_s'] / base[h]['msgs_per_s']:.2f} |")
    probe_rows = [
        f"| {label} | {p['idle_p50']:.2f} | {p['idle_p95']:.2f} | {p['busy_p50']:.2f} | "
        f"{p['busy_p95']:.2f} | {p['busy_max']:.1f} | {p['append_p50']:.2f} |"
        for label, p in probes.items()
    ]
    parts = [
        "# Store benchmark: the embedded SQLite daemon beside PostgreSQL",
        "",
        f"{platform.platform()}, Python {platform.python_version()}, {os.cpu_count()} cores "
        f"shared with other work (load average, 1/5/15 min, at the start and after each "
        f"run: {'; '.join(loads)}). One run of `python -m bench.bench_store` "
        f"({elapsed / 60:.1f} minutes): quote its ratios, not its absolute numbers.",
        "",
        f"{AGENTS} agents (client processes on the ZMQ wire), each on a session of its own, "
        f"each appending {steps} agent steps (an assistant message with 1-4 tool calls, "
        "then their results) and reading `context/get` after each, as fast as they can. "
        "Daemons are `ctxd serve` processes with the default compaction policy; agent i "
        "talks to daemon i mod N. The archive is preloaded to the given size (a quarter "
        "in each session, compacted); PostgreSQL is a scratch cluster on loopback TCP "
        "(fsync off)." + (
            f" `{BEFORE}`: the PostgreSQL daemons again, running {baseline_label} "
            "(`--baseline`), in the same run." if baseline else ""),
        "",
        "| archived | store | daemons | messages/s (all agents) | append p50 ms | "
        "append p95 ms | context/get p50 ms | context/get p95 ms | last/first tenth |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "`last/first tenth`: median step time (append + context/get) of each agent's last "
        "tenth of steps over its first tenth.",
        "",
    ]
    if png:
        parts += [f"![store benchmark]({png})", ""]
    parts += [
        "PostgreSQL against the embedded store at the same archive size (medians; "
        "throughput as a share of the embedded daemon's):",
        "",
        "| archived | PostgreSQL | append | context/get | messages/s |",
        "|---:|---|---:|---:|---:|",
        *ratios,
        "",
    ]
    if flat:
        parts += [
            f"Per-step cost against history (median append + context/get, ms): "
            f"{histories[0]:,} archived beside {histories[-1]:,}.",
            "",
            f"| store | daemons | {histories[0]:,} | {histories[-1]:,} | ratio |",
            "|---|---:|---:|---:|---:|",
            *flat,
            "",
        ]
    if probe_rows:
        parts += [
            "## A cheap request beside appends, on one daemon",
            "",
            "`context/status` from one client every 5 ms, alone, then while a second client "
            "appends steps back to back (with `context/get` after each) on the same "
            f"daemon, at {histories[0]:,} archived. Milliseconds.",
            "",
            "| store | alone p50 | alone p95 | beside appends p50 | p95 | max | "
            "the appender's append p50 |",
            "|---|---:|---:|---:|---:|---:|---:|",
            *probe_rows,
            "",
        ]
    if profile_md:
        parts += [profile_md, ""]
    return "\n".join(parts)


if __name__ == "__main__":
    sys.exit(main())
