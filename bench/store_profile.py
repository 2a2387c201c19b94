"""Where an agent step's time goes in a daemon, on each store (part of bench_store.py).

One agent appends steps (with `context/get` after each) to one daemon for a few seconds
while py-spy samples the daemon (idle samples included: a thread blocked on a socket is
where a round trip's time goes) and, on PostgreSQL, pg_stat_statements counts the
statements the server ran and their execution time. Samples of the daemon's event-loop
thread are sorted into what the thread was doing.
"""

from __future__ import annotations

import collections
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SECONDS = 8.0

# (category, test on one frame "function (file:line)"), checked from the innermost frame
# outwards: the first frame that matches names the sample
_CATEGORIES = (
    ("waiting for a request (idle)", lambda f: f.startswith("EpollSelector.select")),
    ("waiting for PostgreSQL's answers (psycopg Connection.wait)",
     lambda f: f.startswith("Connection.wait (") and "psycopg" in f),
    ("psycopg: sending statements, reading rows", lambda f: "/psycopg/" in f),
    ("sending replies (ZMQ socket)", lambda f: f.startswith("Socket.send")),
    ("search index text (tsvector) built in Python", lambda f: "tsearch.py" in f),
    ("token counting", lambda f: "tokens.py" in f),
    ("JSON (message bodies, summaries)", lambda f: "/json/" in f or "summary.py" in f),
    ("store code (on SQLite: in its calls)",
     lambda f: any(m in f for m in ("/archive.py", "/archive_fts.py", "/contexts.py",
                                    "/runs.py", "/schema.py", "/compaction_log.py",
                                    "/pg/store.py"))),
    ("engine (rendering, pairing, status)", lambda f: "/daemon/" in f and "/servers/" not in f),
    ("wire and dispatch", lambda f: "/servers/" in f or "/protocol/" in f or "zmq" in f),
)


def classify(stack: list[str]) -> str:
    for frame in reversed(stack):
        for name, test in _CATEGORIES:
            if test(frame):
                return name
    return "other (event loop, interpreter)"


def read_raw(path: Path, pid: int) -> collections.Counter[str]:
    """Samples of thread `pid` (the main thread: the event loop) by category."""
    counts: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        if not frames or not frames[0].startswith(f"thread ({pid})"):
            continue
        counts[classify(frames[1:])] += int(n)
    return counts


def py_spy() -> str | None:
    exe = Path(sys.executable).with_name("py-spy")
    return str(exe) if exe.exists() else shutil.which("py-spy")


def enable_pg_stat_statements(cluster: Any) -> None:
    import psycopg

    with psycopg.connect(cluster.socket_dsn(), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
    cluster.halt()
    cluster.launch()
    with psycopg.connect(cluster.socket_dsn(), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")


def statements(cluster: Any, db: str) -> list[tuple[str, int, float]]:
    import psycopg

    with psycopg.connect(cluster.socket_dsn(), autocommit=True) as conn:
        return [tuple(r) for r in conn.execute(
            "SELECT query, calls, total_exec_time FROM pg_stat_statements s "
            "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s "
            "ORDER BY total_exec_time DESC", (db,))]


def reset_statements(cluster: Any) -> None:
    import psycopg

    with psycopg.connect(cluster.socket_dsn(), autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")


def profile_one(stores: Any, kind: str, history: int) -> dict[str, Any]:
    from bench.bench_store import agent, run_clients, start_daemons

    (daemon,) = start_daemons(stores, kind, history, 1)
    db = f"run{stores.runs}"
    spy = py_spy()
    out = Path(tempfile.mkdtemp(prefix="ctxd-spy-")) / "raw.txt"
    try:
        if kind == "pg":
            reset_statements(stores.cluster)
        rec = None
        if spy:
            rec = subprocess.Popen(
                [spy, "record", "--idle", "--threads", "--nonblocking", "--format", "raw",
                 "-r", "200", "-d", str(int(SECONDS + 2)), "-o", str(out),
                 "--pid", str(daemon.proc.pid)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)  # attached before the agent starts
        (rows,), _ = run_clients([(agent, (str(daemon.connection_file),
                                           stores.sessions[history][0], 5, 0, SECONDS))])
        if rec is not None:
            rec.wait(60)
        stmts = statements(stores.cluster, db) if kind == "pg" else []
    finally:
        daemon.stop()
    samples = read_raw(out, daemon.proc.pid) if out.exists() else collections.Counter()
    if out.exists() and os.environ.get("CTXD_BENCH_SPY_DIR"):  # the raw stacks, to read
        shutil.copy(out, Path(os.environ["CTXD_BENCH_SPY_DIR"]) / f"store-{kind}.txt")
    shutil.rmtree(out.parent, ignore_errors=True)
    return {
        "steps": len(rows),
        "step_ms": statistics.median((t2 - t0) * 1000 for t0, _, t2, _ in rows),
        "append_ms": statistics.median((t1 - t0) * 1000 for t0, t1, _, _ in rows),
        "get_ms": statistics.median((t2 - t1) * 1000 for _, t1, t2, _ in rows),
        "samples": samples,
        "statements": stmts,
    }


def run(stores: Any, history: int) -> str:
    """Profile one daemon of each store (pg_stat_statements loaded); the report's
    section, as markdown."""
    res = {kind: profile_one(stores, kind, history) for kind in ("sqlite", "pg")}
    cats = [c for c, _ in _CATEGORIES] + ["other (event loop, interpreter)"]
    lines = [
        "## Where a step's time goes",
        "",
        f"One agent, one daemon, {SECONDS:g} s of steps at {history:,} archived, the daemon "
        "sampled by py-spy (200 Hz, idle samples included). Share of the event-loop "
        "thread's samples:",
        "",
        "| the event loop was | embedded SQLite | PostgreSQL |",
        "|---|---:|---:|",
    ]
    for c in cats:
        shares = []
        for kind in ("sqlite", "pg"):
            total = sum(res[kind]["samples"].values()) or 1
            shares.append(f"{100 * res[kind]['samples'][c] / total:.0f}%")
        if any(s != "0%" for s in shares):
            lines.append(f"| {c} | {' | '.join(shares)} |")
    lines += [
        f"| steps done (median append / context/get ms) | {res['sqlite']['steps']} "
        f"({res['sqlite']['append_ms']:.2f} / {res['sqlite']['get_ms']:.2f}) | "
        f"{res['pg']['steps']} ({res['pg']['append_ms']:.2f} / {res['pg']['get_ms']:.2f}) |",
        "",
    ]
    stmts = res["pg"]["statements"]
    n = res["pg"]["steps"] or 1
    ours = [s for s in stmts if "pg_stat_statements" not in s[0]]
    calls = sum(c for _, c, _ in ours)
    exec_ms = sum(t for _, _, t in ours)
    lines += [
        f"PostgreSQL ran {calls / n:.1f} statements per step (append + context/get, "
        f"BEGIN and COMMIT included), {exec_ms / n:.2f} ms of execution per step in the "
        f"server, while a step took {res['pg']['step_ms']:.2f} ms at the client. The "
        "statements with the most execution time:",
        "",
        "| statement | calls per step | mean ms | share of server time |",
        "|---|---:|---:|---:|",
    ]
    for q, c, t in ours[:10]:
        text = " ".join(q.split())
        text = text if len(text) <= 90 else text[:87] + "..."
        lines.append(f"| `{text.replace('|', '/')}` | {c / n:.2f} | {t / c:.3f} | "
                     f"{100 * t / (exec_ms or 1):.0f}% |")
    return "\n".join(lines)
