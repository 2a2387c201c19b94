"""The store benchmark with daemons as hosts of their own (bench_store.py --rtt).

Each daemon runs in a network namespace of its own and reaches PostgreSQL over a veth
pair through a delaying TCP proxy (tests/harness/netsim.py), which adds the given round
trip and counts the round trips taken; where namespaces cannot be made the daemons stay
on loopback behind the same proxy, and the report says which ran.

Per added round trip (0, 1, 5 ms) and number of daemons: four clients per daemon, each
on a session of its own (created fresh, in a database holding the prepared archive),
append agent steps and read `context/get` after each; messages/s, and the round trips
per turn (every connection of every daemon counted, its listener's included). Then, on
one daemon, one client alone: the round trips of each append and each `context/get`,
and `context/status` p99 idle and while another client appends at full speed (on the
embedded store too, for comparison).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from bench.store_cpu import CpuMeter
from bench.workload import _Generator
from tests.harness.netsim import HostDaemon, Hosts, describe
from tests.pg import PASSWORD, SUPERUSER

CLIENTS_PER_DAEMON = 4
PW_VAR = "CTXD_BENCH_PG_PASSWORD"


def log(msg: str) -> None:
    from bench.bench_store import log as _log

    _log(msg)


def p99(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=100)[98] if len(xs) > 1 else xs[0]


def start(stores: Any, hosts: Hosts, history: int, n: int) -> list[HostDaemon]:
    db = stores.pg_database(history)
    out = []
    for i in range(n):
        host, proxy = hosts.add()
        env = {"CTXD_LOG_LEVEL": "WARNING", "CTXD_STORE": "postgres",
               "CTXD_POSTGRES_DSN": hosts.dsn(host, proxy, db, SUPERUSER),
               "CTXD_POSTGRES_PASSWORD_ENV": PW_VAR, PW_VAR: PASSWORD}
        if stores.baseline is not None:  # another ctxd's code, ahead of this checkout's
            env["PYTHONPATH"] = str(stores.baseline)
        root = stores.scratch / f"run{stores.runs}-h{i}"
        root.mkdir()
        out.append(HostDaemon(root, host, env=env).start())
    return out


def fresh_agent(conn_file: str, title: str, seed: int, steps: int, ready: Any,
                out: Any) -> None:
    """A session of its own, then `steps` agent steps (append, then context/get)."""
    from ctxd.clients.client import connect

    gen = _Generator(seed, 0.3)
    batches = [gen.step() for _ in range(steps)]
    with connect(connection_file=Path(conn_file), wire="zmq") as c:
        sid = c.create_session(title=title)["sessionId"]
        c.append(sid, [gen.system()])
        ready.wait()
        rows = []
        for batch in batches:
            t0 = time.perf_counter()
            c.append(sid, batch)
            t1 = time.perf_counter()
            c.context_get(sid)
            rows.append((t0, t1, time.perf_counter(), len(batch)))
    out.put(rows)


def throughput(daemons: list[HostDaemon], hosts: Hosts, steps: int, seed: int,
               cluster_pid: int | None = None) -> dict[str, Any]:
    """Messages/s, latencies and round trips of CLIENTS_PER_DAEMON clients per daemon,
    and the CPU ms per turn each kind of process took (bench/store_cpu.py)."""
    from bench.bench_store import run_clients

    specs = [(fresh_agent, (str(daemons[i % len(daemons)].connection_file), f"agent {i}",
                            seed + i, steps))
             for i in range(CLIENTS_PER_DAEMON * len(daemons))]
    meter = CpuMeter({
        "daemons": [d.proc.pid for d in daemons if d.proc is not None],
        "postgres": [cluster_pid] if cluster_pid else [],
        "proxies": [p._proc.pid for p in hosts.proxies if p._proc.pid],
    }).start()
    rt0 = hosts.round_trips()
    results, _ = run_clients(specs)
    rt = hosts.round_trips() - rt0
    cpu = meter.stop()
    start_t = min(r[0][0] for r in results)
    end_t = max(r[-1][2] for r in results)
    turns = sum(len(r) for r in results)
    return {
        "msgs_per_s": sum(n for r in results for *_, n in r) / (end_t - start_t),
        "append_p50": statistics.median((t1 - t0) * 1000 for r in results
                                        for t0, t1, _, _ in r),
        "get_p50": statistics.median((t2 - t1) * 1000 for r in results for _, t1, t2, _ in r),
        "rt_per_turn": rt / turns,
        **{f"cpu_{k}": v * 1000 / turns for k, v in cpu.items()},
    }


def counted_turns(daemon: Any, hosts: Hosts | None, steps: int) -> dict[str, float]:
    """One client alone on one daemon: round trips of each append and each context/get
    (a pause after each, so what the daemon does after replying is counted with it)."""
    from ctxd.clients.client import connect

    def round_trips() -> int:
        return hosts.round_trips() if hosts is not None else 0

    gen = _Generator(7, 0.3)
    app, get, t_app, t_get = [], [], [], []
    with connect(connection_file=daemon.connection_file, wire="zmq") as c:
        sid = c.create_session(title="counted")["sessionId"]
        c.append(sid, [gen.system()])
        for _ in range(steps):
            batch = gen.step()
            time.sleep(0.05)
            a = round_trips()
            t0 = time.perf_counter()
            c.append(sid, batch)
            t_app.append((time.perf_counter() - t0) * 1000)
            time.sleep(0.05)
            b = round_trips()
            t0 = time.perf_counter()
            c.context_get(sid)
            t_get.append((time.perf_counter() - t0) * 1000)
            time.sleep(0.05)
            app.append(b - a)
            get.append(round_trips() - b)
    return {"append_rt": statistics.median(app), "get_rt": statistics.median(get),
            "append_rt_max": max(app), "append_ms": statistics.median(t_app),
            "get_ms": statistics.median(t_get)}


def status_probe(daemon: HostDaemon, seconds: float) -> dict[str, float]:
    """context/status p99 alone, then while another client appends at full speed."""
    from bench.bench_store import agent, prober, run_clients

    conn = str(daemon.connection_file)
    from ctxd.clients.client import connect

    with connect(connection_file=daemon.connection_file, wire="zmq") as c:
        sids = [c.create_session(title=f"probe {i}")["sessionId"] for i in range(2)]
    (idle,), _ = run_clients([(prober, (conn, sids[1], seconds / 2))])
    both, _ = run_clients([(prober, (conn, sids[1], seconds)),
                           (agent, (conn, sids[0], 99, 0, seconds))])
    busy = next(r for r in both if not isinstance(r[0], tuple))
    return {"idle_p99": p99(idle), "busy_p99": p99(busy), "idle_p50": statistics.median(idle),
            "busy_p50": statistics.median(busy)}


def run(stores: Any, history: int, rtts: list[float], counts: list[int], steps: int,
        rounds: int, netns: bool | None) -> tuple[str, dict[str, Any]]:
    """The tables, as markdown, and the raw figures."""
    figures: dict[str, Any] = {"rows": {}, "turns": {}, "probes": {}, "mode": None}
    from bench.bench_store import start_daemons

    embedded = start_daemons(stores, "sqlite", history, 1)[0]
    try:
        figures["sqlite"] = counted_turns(embedded, None, 15)
        # the same status probe: what a busy client costs a cheap request where every
        # request runs on the event loop
        figures["sqlite_probe"] = status_probe(embedded, 6.0)
        log(f"embedded: {figures['sqlite']} {figures['sqlite_probe']}")
    finally:
        embedded.stop()
    for rtt in rtts:
        for n in counts:
            hosts = Hosts(("127.0.0.1", stores.cluster.port), rtt, netns=netns)
            figures["mode"] = hosts.mode
            try:
                daemons = start(stores, hosts, history, n)
                try:
                    pg_pid = stores.cluster.proc.pid if stores.cluster.proc else None
                    rs = [throughput(daemons, hosts, steps, 1000 * (r + 1), pg_pid)
                          for r in range(rounds)]
                    row = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
                    figures["rows"][(rtt, n)] = row
                    log(f"hosts {hosts.mode} rtt {rtt:g} ms x{n}: {row}")
                    if n == 1:
                        figures["turns"][rtt] = counted_turns(daemons[0], hosts, 15)
                        figures["probes"][rtt] = status_probe(daemons[0], 6.0)
                        log(f"rtt {rtt:g}: {figures['turns'][rtt]} {figures['probes'][rtt]}")
                finally:
                    for d in daemons:
                        d.stop()
            finally:
                hosts.close()
    return render(figures, rtts, counts, steps, rounds), figures


def render(f: dict[str, Any], rtts: list[float], counts: list[int], steps: int,
           rounds: int) -> str:
    lines = [
        "## Daemons as hosts of their own",
        "",
        f"Ran: {describe(f['mode'], 0).split(';')[0]}. {CLIENTS_PER_DAEMON} clients per "
        f"daemon, each on a fresh session of its own, {steps} steps each (append, then "
        f"`context/get`); median of {rounds} rounds. Round trips: every connection of "
        "every daemon, counted by the proxy (a pipelined burst is one).",
        "",
        "| added RTT ms | daemons | clients | messages/s | x one daemon | append p50 ms | "
        "context/get p50 ms | round trips per turn | CPU ms per turn: daemons | "
        "PostgreSQL | proxies |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for rtt in rtts:
        one = f["rows"].get((rtt, 1), {}).get("msgs_per_s")
        for n in counts:
            r = f["rows"][(rtt, n)]
            ratio = f"{r['msgs_per_s'] / one:.2f}" if one else ""
            lines.append(
                f"| {rtt:g} | {n} | {CLIENTS_PER_DAEMON * n} | {r['msgs_per_s']:.0f} | "
                f"{ratio} | {r['append_p50']:.1f} | {r['get_p50']:.1f} | "
                f"{r['rt_per_turn']:.1f} | {r.get('cpu_daemons', 0):.1f} | "
                f"{r.get('cpu_postgres', 0):.1f} | {r.get('cpu_proxies', 0):.1f} |")
    lines += [
        "",
        "One client alone on one daemon (medians of 15 turns), and `context/status` every "
        "5 ms from a second client, alone and while a third appends at full speed:",
        "",
        "| added RTT ms | append round trips (max) | context/get round trips | append ms | "
        "context/get ms | status p99 idle ms | status p99 busy ms | busy / idle |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for rtt in rtts:
        t, p = f["turns"].get(rtt), f["probes"].get(rtt)
        if not t or not p:
            continue
        lines.append(
            f"| {rtt:g} | {t['append_rt']:g} ({t['append_rt_max']}) | {t['get_rt']:g} | "
            f"{t['append_ms']:.1f} | {t['get_ms']:.1f} | {p['idle_p99']:.1f} | "
            f"{p['busy_p99']:.1f} | {p['busy_p99'] / p['idle_p99']:.2f} |")
    s = f.get("sqlite")
    if s:
        sp = f.get("sqlite_probe")
        probe = (f"{sp['idle_p99']:.1f} | {sp['busy_p99']:.1f} | "
                 f"{sp['busy_p99'] / sp['idle_p99']:.2f}") if sp else " | "
        lines.append(f"| embedded SQLite | | | {s['append_ms']:.1f} | {s['get_ms']:.1f} | "
                     f"{probe} |")
        z = f["turns"].get(0.0) or f["turns"].get(0)
        if z:
            lines += ["", f"On loopback (0 ms added), PostgreSQL over the embedded store: "
                      f"append {z['append_ms'] / s['append_ms']:.2f}x, `context/get` "
                      f"{z['get_ms'] / s['get_ms']:.2f}x."]
    return "\n".join(lines) + "\n"
