"""Store benchmark: the embedded SQLite store beside PostgreSQL, 1 and 2 daemons.

The same workload on each: a session preloaded with an archived history (10k messages;
100k with --full), compacted so the active context is its usual size, then agent steps
appended one batch at a time (an assistant message with tool calls and their results)
and `context/get` read after each. "2 daemons" are two processes, each with its own
engine on the same PostgreSQL database and a session of its own (the embedded store
has one writer per data directory, so it has no such row). Engines run as libraries (no
sockets), so the numbers are the stores' cost, not the wires'.

    python bench/bench_store.py                 # 10k history, ~1-2 minutes
    python bench/bench_store.py --full          # 10k and 100k
    python bench/bench_store.py --dsn "host=..." # an existing server instead of a scratch one

Without --dsn a throwaway cluster is created in a temporary directory (tests/pg.py) on a
free loopback port (fsync off, as in the tests: the durable numbers would be lower for
both stores, PostgreSQL's by the cost of a WAL flush per commit).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from bench.workload import _Generator  # noqa: E402
from ctxd.daemon.config import Config  # noqa: E402
from ctxd.daemon.engine import Engine  # noqa: E402

STEPS = 200


def _engine(kind: str, where: str) -> Engine:
    cfg = Config(data_dir=Path(where) if kind == "sqlite" else Path(tempfile.mkdtemp()))
    cfg.compaction.max_active_messages = 10**9  # compaction only when the bench asks
    cfg.compaction.max_active_tokens = 10**12
    if kind == "sqlite":
        return Engine(cfg)
    from ctxd.daemon.pg.store import PostgresStore

    return Engine(cfg, store=PostgresStore(where))


def _preload(e: Engine, history: int, seed: int) -> str:
    sid = e.create_session(title=f"bench {seed}")["sessionId"]
    gen = _Generator(seed, 0.3)
    e.append(sid, [gen.system()])
    left = history - 1
    while left > 0:
        n = min(500, left)
        e.append(sid, gen.filler(n))
        left -= n
    e.compact_sync(sid)
    return sid


def _steps(e: Engine, sid: str, seed: int, steps: int) -> dict[str, Any]:
    gen = _Generator(seed + 1, 0.3)
    batches = [gen.step() for _ in range(steps)]
    append_ms: list[float] = []
    get_ms: list[float] = []
    started = time.perf_counter()
    for batch in batches:
        t0 = time.perf_counter()
        e.append(sid, batch)
        t1 = time.perf_counter()
        e.get_context(sid)
        t2 = time.perf_counter()
        append_ms.append((t1 - t0) * 1000)
        get_ms.append((t2 - t1) * 1000)
    wall = time.perf_counter() - started
    return {
        "messages": sum(len(b) for b in batches),
        "wall": wall,
        "append_ms": append_ms,
        "get_ms": get_ms,
    }


def _worker(kind: str, where: str, history: int, seed: int, steps: int, ready: Any,
            go: Any, out: Any) -> None:
    e = _engine(kind, where)
    sid = _preload(e, history, seed)
    ready.wait()
    go.wait()
    out.put(_steps(e, sid, seed, steps))
    e.close()


def run(kind: str, where: str, history: int, daemons: int, steps: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    barrier_ready = ctx.Barrier(daemons + 1)
    barrier_go = ctx.Barrier(daemons + 1)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(kind, where, history, 1000 * (i + 1), steps,
                                          barrier_ready, barrier_go, out))
        for i in range(daemons)
    ]
    for p in procs:
        p.start()
    barrier_ready.wait()
    t0 = time.perf_counter()
    barrier_go.wait()
    results = [out.get(timeout=600) for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join(60)
    append_ms = [x for r in results for x in r["append_ms"]]
    get_ms = [x for r in results for x in r["get_ms"]]
    first = [x for r in results for x in r["append_ms"][: steps // 4]]
    last = [x for r in results for x in r["append_ms"][-steps // 4:]]
    return {
        "msgs_per_s": sum(r["messages"] for r in results) / wall,
        "append_p50": statistics.median(append_ms),
        "append_p95": statistics.quantiles(append_ms, n=20)[18],
        "get_p50": statistics.median(get_ms),
        "get_p95": statistics.quantiles(get_ms, n=20)[18],
        "flat": statistics.median(last) / statistics.median(first),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="also a 100k-message history")
    parser.add_argument("--dsn", help="an existing PostgreSQL database (empty, or ctxd's)")
    parser.add_argument("--steps", type=int, default=STEPS, help="agent steps per daemon")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "store.md"))
    args = parser.parse_args(argv)
    cluster = None
    dsn = args.dsn
    if dsn is None:
        from pg import PgCluster

        cluster = PgCluster().start()
    histories = [10_000, 100_000] if args.full else [10_000]
    rows: list[str] = []
    try:
        for history in histories:
            cases = [("embedded SQLite", "sqlite", 1), ("PostgreSQL", "pg", 1),
                     ("PostgreSQL", "pg", 2)]
            for label, kind, daemons in cases:
                if kind == "sqlite":
                    where = tempfile.mkdtemp(prefix="ctxd-bench-")
                elif cluster is not None:
                    where = cluster.create_database(f"bench_{history}_{daemons}")
                else:
                    where = dsn  # type: ignore[assignment]
                r = run(kind if kind == "sqlite" else "postgres", where, history, daemons,
                        args.steps)
                rows.append(
                    f"| {history:,} | {label} | {daemons} | {r['msgs_per_s']:,.0f} | "
                    f"{r['append_p50']:.2f} | {r['append_p95']:.2f} | {r['get_p50']:.2f} | "
                    f"{r['get_p95']:.2f} | {r['flat']:.2f} |"
                )
                print(rows[-1], flush=True)
    finally:
        if cluster is not None:
            cluster.stop()
    report = "\n".join([
        "# Store benchmark: embedded SQLite beside PostgreSQL",
        "",
        f"{platform.platform()}, Python {platform.python_version()}, {args.steps} agent "
        "steps per daemon (each an append of an assistant message with its tool results, "
        "then context/get), after a preloaded, compacted history. Engines as libraries; "
        "PostgreSQL on loopback in a scratch cluster (fsync off).",
        "",
        "| history | store | daemons | messages/s (all daemons) | append p50 ms | "
        "append p95 ms | context/get p50 ms | context/get p95 ms | last/first quarter |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "`last/first quarter`: median append time of the last quarter of the steps over the "
        "first quarter's (1.0: the cost per step stays flat as the history grows).",
        "",
    ])
    Path(args.out).write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
