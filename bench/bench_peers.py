"""ctxd side by side with what users would pick instead, measured in one run.

Systems: ctxd as a library (in-process engine), ctxd over ZeroMQ and over JSON-RPC (a
real daemon subprocess, real sockets), LangGraph + `SqliteSaver`, the OpenAI Agents
SDK's `SQLiteSession`, LangChain's `SQLChatMessageHistory`, and a physical floor (raw
APSW with the same rows and FTS index; raw echo servers on both wires). All of them get
the same seeded agent session (bench/workload.py), on the same disk, in temporary
directories that are removed afterwards. Usage:

    python -m bench.bench_peers           # small sizes, a few minutes
    python -m bench.bench_peers --full    # full sizes, about 20 minutes

Slow systems are stopped by per-system time caps; what they reached is reported with
the trend extrapolated. The report (markdown) and plots (PNG) go to bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Run as a script, the repository root is not on sys.path; `bench.*` needs it.
if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_core import machine_info  # noqa: E402
from bench.peers import (  # noqa: E402
    LAST_N,
    AgentsSQLite,
    CtxdEngine,
    CtxdWire,
    Daemon,
    LangChainSQL,
    LangGraphSqlite,
    RawApsw,
    Store,
    dir_bytes,
    peer_versions,
    split_pair_share,
)
from bench.workload import COMMON_WORD, RARE_WORD, ZH_PHRASE, Message, turns  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Sizes:
    name: str
    append_messages: int  # section 1: one fresh session per system
    append_cap: float  # seconds per system
    read_sizes: tuple[int, ...]  # section 2: archive sizes (messages)
    search_sizes: tuple[int, ...]  # section 4
    read_calls: int
    read_cap: float  # seconds per system and size
    search_calls: int
    search_cap: float  # seconds per system, size and query
    grow_cap: float  # seconds to grow one system to the next size (projected)
    run_steps: tuple[int, ...]  # section 3: steps of a whole agent run
    run_cap: float  # seconds per system
    echo_calls: int  # section 5
    memory_sessions: int  # section 6
    memory_messages: int
    budget: float  # the whole run; systems still to go are skipped past it


SMALL = Sizes(
    name="small",
    append_messages=2_000,
    append_cap=15,
    read_sizes=(1_000, 5_000, 10_000),
    search_sizes=(2_000, 10_000),
    read_calls=15,
    read_cap=4,
    search_calls=5,
    search_cap=2,
    grow_cap=40,
    run_steps=(500, 2_000),
    run_cap=30,
    echo_calls=1_000,
    memory_sessions=1_000,
    memory_messages=36,
    budget=420,
)
FULL = Sizes(
    name="full",
    append_messages=10_000,
    append_cap=60,
    read_sizes=(1_000, 10_000, 100_000),
    search_sizes=(10_000, 100_000),
    read_calls=30,
    read_cap=15,
    search_calls=7,
    search_cap=8,
    grow_cap=150,
    run_steps=(1_000, 10_000),
    run_cap=120,
    echo_calls=3_000,
    memory_sessions=1_000,
    memory_messages=36,
    budget=1_500,
)

QUERIES: list[tuple[str, str]] = [
    ("English, rare word", RARE_WORD),
    ("English, common word", COMMON_WORD),
    ("Chinese phrase", ZH_PHRASE),
]

# plot colours and line styles, one per system, the same in every figure
STYLE: dict[str, tuple[str, str]] = {
    "floor-apsw": ("#7f7f7f", ":"),
    "ctxd-inproc": ("#1f77b4", "-"),
    "ctxd-zmq": ("#17becf", "-"),
    "ctxd-jsonrpc": ("#2ca02c", "-"),
    "agents-last80": ("#ff7f0e", "--"),
    "agents": ("#d62728", "-"),
    "langchain": ("#9467bd", "-"),
    "langgraph": ("#8c564b", "-"),
}
LABELS: dict[str, str] = {
    "floor-apsw": "floor: raw APSW + FTS5",
    "ctxd-inproc": "ctxd in-process",
    "ctxd-zmq": "ctxd over ZeroMQ",
    "ctxd-jsonrpc": "ctxd over JSON-RPC (TCP)",
    "agents-last80": "Agents SQLiteSession, get_items(limit=80)",
    "agents": "Agents SQLiteSession, get_items()",
    "langchain": "LangChain SQLChatMessageHistory",
    "langgraph": "LangGraph + SqliteSaver",
}


# ------------------------------------------------------------------------ helpers


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    @property
    def passed(self) -> bool:
        return time.monotonic() > self.end

    @property
    def left(self) -> float:
        return self.end - time.monotonic()


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def fmt(value: float, digits: int = 0) -> str:
    if value != value:  # NaN: not measured
        return "n/a"
    return f"{value:,.{digits}f}"


def fmt_ms(seconds: float) -> str:
    if seconds != seconds:
        return "n/a"
    ms = seconds * 1e3
    return f"{ms:,.3f}" if ms < 1 else f"{ms:,.2f}" if ms < 100 else f"{ms:,.0f}"


def fmt_s(seconds: float) -> str:
    return "n/a" if seconds != seconds else f"{seconds:,.2f}" if seconds < 10 else f"{seconds:,.0f}"


def fmt_mb(n: float) -> str:
    return "n/a" if n != n else f"{n / 1e6:,.1f}" if n < 1e10 else f"{n / 1e6:,.0f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Scratch:
    """Fresh directories under one temporary root (on /tmp by default), removed at the end."""

    def __init__(self, base: str | None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="ctxd-peers-", dir=base))
        self.count = 0

    def new_dir(self, name: str) -> Path:
        self.count += 1
        return self.root / f"{self.count:02d}-{name}"

    def drop(self, path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def session_turns(n_turns: int, seed: int) -> list[list[Message]]:
    """At least `n_turns` turns of one session (a turn averages ~1.8 messages)."""
    out = list(turns(int(n_turns * 2.2) + 50, seed=seed))
    while len(out) < n_turns:  # never in practice: the ratio holds within a few percent
        out = list(turns(len(out) * 3, seed=seed))
    return out[:n_turns]


def turns_for(n_messages: int, seed: int) -> list[list[Message]]:
    return list(turns(n_messages, seed=seed))


def failure(exc: BaseException) -> str:
    """One line for the report: what went wrong with a system."""
    text = f"{type(exc).__name__}: {exc}".replace("|", "/").replace("\n", " ")
    return text[:160]


def close_quietly(store: Store) -> None:
    try:
        store.close()
    except Exception as exc:  # closing after a failure may fail too; keep the first error
        log(f"closing {store.key} failed: {failure(exc)}")


def make_store(key: str, root: Path, daemon: Daemon | None = None) -> Store:
    if key == "floor-apsw":
        return RawApsw(root)
    if key == "ctxd-inproc":
        return CtxdEngine(root)
    if key in ("ctxd-zmq", "ctxd-jsonrpc"):
        return CtxdWire(root, key.split("-", 1)[1], daemon=daemon)
    if key == "agents":
        return AgentsSQLite(root)
    if key == "agents-last80":
        return AgentsSQLite(root, limit=LAST_N)
    if key == "langchain":
        return LangChainSQL(root)
    if key == "langgraph":
        return LangGraphSqlite(root)
    raise ValueError(key)


def fit_growth(ks: Sequence[float], values: Sequence[float]) -> tuple[float, float]:
    """Least squares F(k) = a*k + b*k^2 through the origin, b >= 0: a cumulative cost
    whose per-step part grows linearly (b > 0) or stays flat (b = 0)."""
    import numpy as np

    k = np.asarray(ks, dtype=float)
    y = np.asarray(values, dtype=float)
    if len(k) < 3:
        return (float(y[-1] / k[-1]) if len(k) else float("nan")), 0.0
    coef, *_ = np.linalg.lstsq(np.stack([k, k * k], axis=1), y, rcond=None)
    a, b = float(coef[0]), float(coef[1])
    if b < 0 or a < 0:
        b = max(b, 0.0)
        a = float(np.dot(k, y - b * k * k) / np.dot(k, k))
        if a < 0:
            a, b = 0.0, float(np.dot(k * k, y) / np.dot(k * k, k * k))
    return a, b


def exponent(ks: Sequence[float], values: Sequence[float]) -> float:
    """d log F / d log k over the last doubling of k: ~1 linear, ~2 quadratic."""
    import math

    if len(ks) < 4 or values[-1] <= 0:
        return float("nan")
    k_end = ks[-1]
    i = max(j for j in range(len(ks)) if ks[j] <= k_end / 2 or j == 0)
    if ks[i] <= 0 or values[i] <= 0 or ks[i] == k_end:
        return float("nan")
    return math.log(values[-1] / values[i]) / math.log(k_end / ks[i])


# ------------------------------------------------------------------ the report


@dataclass
class Report:
    sizes: Sizes
    parts: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    plots: list[tuple[str, str]] = field(default_factory=list)

    def section(self, title: str, intro: str, body: str, plot: str | None = None) -> None:
        text = f"## {title}\n\n{intro}\n\n{body}\n"
        if plot:
            text += f"\n![{title}]({plot})\n"
        print(text, flush=True)
        self.parts.append(text)


def png_name(sizes: Sizes, what: str) -> str:
    return f"peers_{what}.png" if sizes.name == "small" else f"peers_full_{what}.png"


def new_figure(ncols: int = 1) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(6.4 * ncols, 4.6), squeeze=False)
    return fig, axes[0]


def save_figure(fig: Any, out_dir: Path, name: str) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(out_dir / name, dpi=110)
    plt.close(fig)


def draw(ax: Any, key: str, xs: Sequence[float], ys: Sequence[float], **kw: Any) -> None:
    color, style = STYLE.get(key, ("black", "-"))
    kw.setdefault("linestyle", style)
    ax.plot(xs, ys, color=color, label=kw.pop("label", LABELS.get(key, key)), **kw)


# ------------------------------------------------------------------ 1. append


APPEND_SYSTEMS = (
    "floor-apsw",
    "ctxd-inproc",
    "ctxd-zmq",
    "ctxd-jsonrpc",
    "agents",
    "langchain",
    "langgraph",
)


def bench_append(sizes: Sizes, scratch: Scratch, report: Report, budget: Deadline) -> None:
    session = turns_for(sizes.append_messages, seed=1)
    total = sum(len(t) for t in session)
    results: dict[str, dict[str, Any]] = {}
    failures: dict[str, str] = {}
    for key in APPEND_SYSTEMS:
        if budget.passed:
            log(f"append: {key} skipped, the run's time budget is spent")
            continue
        root = scratch.new_dir(f"append-{key}")
        store: Store | None = None
        try:
            store = make_store(key, root)
            native = store.prepare(session)
            cap = Deadline(min(sizes.append_cap, max(5.0, budget.left)))
            gc.collect()
            times: list[float] = []
            counts: list[int] = []
            cpu0 = store.cpu_seconds()
            for raw, turn in zip(session, native, strict=True):
                t0 = time.perf_counter()
                store.append(turn)
                times.append(time.perf_counter() - t0)
                counts.append(len(raw))
                if cap.passed:
                    break
            cpu = store.cpu_seconds() - cpu0
            done = sum(counts)
            elapsed = sum(times)
            extra = ""
            if isinstance(store, CtxdEngine):
                extra = f"{store.compactions} auto-compactions, {store.compaction_seconds:.2f} s"
            results[key] = {
                "messages": done,
                "turns": len(times),
                "seconds": elapsed,
                "rate": done / elapsed,
                "cpu_rate": done / cpu if cpu > 0 else float("nan"),
                "turn_p50": median(times),
                "times": times,
                "counts": counts,
                "disk": store.disk_bytes(),
                "note": extra,
                "complete": done == total,
            }
            log(f"append: {key} {done} msgs in {elapsed:.2f} s ({done / elapsed:,.0f} msg/s)")
        except Exception as exc:  # reported; the other systems still run
            failures[key] = failure(exc)
            log(f"append: {key} failed: {failures[key]}")
        finally:
            if store is not None:
                close_quietly(store)
            scratch.drop(root)
    report.data["append"] = results

    rows = []
    for key, r in results.items():
        reached = f"{r['messages']:,}" + ("" if r["complete"] else " (stopped by its cap)")
        rows.append(
            [
                LABELS[key],
                reached,
                fmt(r["rate"]),
                fmt(r["cpu_rate"]),
                fmt_ms(r["turn_p50"]),
                fmt_mb(r["disk"]),
                r["note"],
            ]
        )
    rows += [[LABELS[key], f"failed: {why}", "", "", "", "", ""] for key, why in failures.items()]
    fig, (ax,) = new_figure()
    for key, r in results.items():
        # ms per message over windows of ~5% of the session, against its size
        xs, ys = [], []
        window = max(1, len(r["times"]) // 20)
        cum = 0
        for i in range(0, len(r["times"]), window):
            n = sum(r["counts"][i : i + window])
            cum += n
            xs.append(cum)
            ys.append(sum(r["times"][i : i + window]) / n * 1e3)
        draw(ax, key, xs, ys, marker=".")
    ax.set_xlabel("messages in the session")
    ax.set_ylabel("ms per message appended (one turn per call)")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    name = png_name(sizes, "append")
    save_figure(fig, RESULTS, name)
    report.section(
        "1. Append",
        f"One fresh session per system; the same {total:,} messages appended one agent turn "
        f"per call ({total / len(session):.2f} messages per turn on average), as an agent "
        f"does after each model call. Each system is stopped after {sizes.append_cap:.0f} s. "
        "ctxd in-process runs auto-compaction when it is due (counted), as the daemon does "
        "after an append; over the wire the daemon does it by itself. Peers on their "
        "defaults (the sqlite3 module's `synchronous=FULL`). CPU seconds count every "
        "process doing the work (for ctxd over a wire: the client and the daemon).",
        table(
            [
                "System",
                "Messages",
                "Messages/s (wall)",
                "Messages per CPU s",
                "p50 ms per turn",
                "Disk MB",
                "Notes",
            ],
            rows,
        ),
        name,
    )


# ------------------------------------------- 2 and 4. reading and searching


@dataclass
class Growth:
    """Reads and searches of one system at each archive size it reached."""

    key: str
    reads: dict[int, float] = field(default_factory=dict)  # size -> median seconds
    read_len: dict[int, int] = field(default_factory=dict)  # size -> messages returned
    searches: dict[int, dict[str, float]] = field(default_factory=dict)
    hits: dict[int, dict[str, int]] = field(default_factory=dict)
    stopped: str = ""


def time_calls(fn: Callable[[], Any], calls: int, cap: float) -> tuple[float, Any]:
    """Median seconds of up to `calls` calls after one untimed warm-up, within `cap`."""
    t0 = time.perf_counter()
    result = fn()
    warm = time.perf_counter() - t0
    deadline = Deadline(cap)
    # a slow call (seconds, for the peers' big sessions) needs fewer repeats to be known
    at_least = 1 if warm > cap / 4 else 2
    times: list[float] = []
    for i in range(calls):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
        if i + 1 >= at_least and deadline.passed:
            break
    return median(times), result


def measure_at(
    sizes: Sizes, size: int, g: Growth, read: Callable[[], int], search: Callable[[str], int]
) -> None:
    if size in sizes.read_sizes:
        g.reads[size], g.read_len[size] = time_calls(read, sizes.read_calls, sizes.read_cap)
    if size in sizes.search_sizes:
        g.searches[size] = {}
        g.hits[size] = {}
        for label, text in QUERIES:
            s, n = time_calls(lambda t=text: search(t), sizes.search_calls, sizes.search_cap)
            g.searches[size][label] = s
            g.hits[size][label] = n


def grow_ctxd(
    sizes: Sizes, scratch: Scratch, session: list[list[Message]], points: list[int]
) -> tuple[dict[str, Growth], dict[int, list[dict[str, Any]]]]:
    """ctxd grown once, then read in-process and, over a daemon started on the same data
    directory, over both wires. Returns the growth records and the context at each size."""
    base = scratch.new_dir("grow-ctxd")
    data_dir = base / "data"
    inproc, zmq_g, json_g = Growth("ctxd-inproc"), Growth("ctxd-zmq"), Growth("ctxd-jsonrpc")
    contexts: dict[int, list[dict[str, Any]]] = {}
    sid: str | None = None
    done_turns = 0
    done = 0
    for size in points:
        engine = CtxdEngine(data_dir, session_id=sid)
        sid = engine.sid
        # Re-deriving the summary from the whole archive every few compactions makes a
        # fill quadratic (section 3 shows it); it does not change what a read costs,
        # so the fill skips it. The reads below use the default policy.
        engine.engine.policy.rederive_after = 0
        chunk: list[list[Message]] = []
        while done_turns < len(session) and done + len(session[done_turns]) <= size:
            chunk.append(session[done_turns])
            done += len(session[done_turns])
            done_turns += 1
        t0 = time.perf_counter()
        engine.append_many(chunk)
        log(
            f"grow: ctxd to {done:,} in {time.perf_counter() - t0:.1f} s "
            f"({engine.compactions} compactions)"
        )
        measure_at(sizes, size, inproc, engine.read, engine.search)
        contexts[size] = engine.context()
        engine.close()
        daemon = Daemon(base).start()
        try:
            for g, wire in ((zmq_g, "zmq"), (json_g, "jsonrpc")):
                if g.stopped:
                    continue
                try:
                    store = CtxdWire(base, wire, daemon=daemon, session_id=sid)
                    try:
                        measure_at(sizes, size, g, store.read, store.search)
                    finally:
                        close_quietly(store)
                except Exception as exc:  # reported; the rest still runs
                    g.stopped = f"failed at {size:,}: {failure(exc)}"
                    log(f"grow: ctxd-{wire} {g.stopped}")
        finally:
            daemon.stop()
    scratch.drop(base)
    return {g.key: g for g in (inproc, zmq_g, json_g)}, contexts


def grow_peer(
    sizes: Sizes,
    scratch: Scratch,
    key: str,
    session: list[list[Message]],
    points: list[int],
    budget: Deadline,
    ctx_len: dict[int, int],
) -> list[Growth]:
    """A peer (or the floor) grown through the sizes with bulk appends: the reading cost
    depends on what is stored, not on how it got there (for LangGraph, only on the latest
    checkpoint, which holds the whole state)."""
    root = scratch.new_dir(f"grow-{key}")
    store = make_store(key, root)
    growths = [Growth(key)]
    readers: list[tuple[Growth, Callable[[], int]]] = [(growths[0], store.read)]
    extra: Store | None = None
    if key == "agents":
        # the same stored session, read the other way the SDK offers
        extra = AgentsSQLite(root, limit=LAST_N)
        growths.append(Growth(extra.key))
        readers.append((growths[1], extra.read))
    if isinstance(store, RawApsw):
        floor_ctx = Growth("floor-ctx")  # the floor reading as many rows as ctxd's context
        growths.append(floor_ctx)
    done_turns = 0
    done = 0
    rate = 0.0  # seconds per message of the last bulk append
    for size in points:
        chunk: list[list[Message]] = []
        while done_turns < len(session) and done + len(session[done_turns]) <= size:
            chunk.append(session[done_turns])
            done_turns += 1
            done += len(chunk[-1])
        n = sum(len(t) for t in chunk)
        projected = rate * n
        if projected > sizes.grow_cap or budget.passed:
            why = (
                f"not grown to {size:,}: projected {projected:.0f} s"
                if not budget.passed
                else f"not grown to {size:,}: the run's time budget is spent"
            )
            for g in growths:
                g.stopped = why
            log(f"grow: {key} {why}")
            break
        native = store.prepare(chunk)
        flat: list[Any] = [m for t in native for m in t]
        t0 = time.perf_counter()
        if isinstance(store, RawApsw):
            for t in native:  # the floor keeps its per-turn transactions
                store.append(t)
        else:
            # bulk, in slices that keep one LangGraph invoke or SQL transaction sane
            step = len(flat) if key == "langgraph" else 20_000
            for i in range(0, len(flat), step):
                store.append(flat[i : i + step])
        dt = time.perf_counter() - t0
        rate = dt / max(1, n) * (2.0 if key == "langgraph" else 1.2)  # its cost grows with n
        log(f"grow: {key} to {done:,} in {dt:.1f} s")
        for g, read in readers:
            measure_at(sizes, size, g, read, store.search)
        if isinstance(store, RawApsw) and size in ctx_len and size in sizes.read_sizes:
            floor_ctx.reads[size], floor_ctx.read_len[size] = time_calls(
                lambda k=ctx_len[size]: store.read(k), sizes.read_calls, sizes.read_cap
            )
    if extra is not None:
        extra.close()
    store.close()
    scratch.drop(root)
    return growths


GROW_PEERS = ("floor-apsw", "agents", "langchain", "langgraph")


def bench_read_search(sizes: Sizes, scratch: Scratch, report: Report, budget: Deadline) -> None:
    points = sorted(set(sizes.read_sizes) | set(sizes.search_sizes))
    session = turns_for(points[-1], seed=2)
    growth, contexts = grow_ctxd(sizes, scratch, session, points)
    ctx_len = {size: len(ctx) for size, ctx in contexts.items()}
    for key in GROW_PEERS:
        for g in grow_peer(sizes, scratch, key, session, points, budget, ctx_len):
            growth[g.key] = g
    report.data["growth"] = growth
    report.data["context"] = contexts[points[-1]]

    # 2. reads
    order = [
        "floor-apsw",
        "ctxd-inproc",
        "ctxd-zmq",
        "ctxd-jsonrpc",
        "agents-last80",
        "agents",
        "langchain",
        "langgraph",
    ]
    what = {
        "floor-apsw": f"last {LAST_N} rows",
        "ctxd-inproc": "`Engine.get_context`",
        "ctxd-zmq": "`context/get`",
        "ctxd-jsonrpc": "`context/get`",
        "agents-last80": f"`get_items(limit={LAST_N})`",
        "agents": "`get_items()`",
        "langchain": "`.messages`",
        "langgraph": '`get_state(config).values["messages"]`',
    }
    headers = ["System", "Reads"] + [f"ms at {s:,}" for s in sizes.read_sizes]
    headers += [f"messages returned at {sizes.read_sizes[-1]:,}", "last / first"]
    rows = []
    fig, (ax,) = new_figure()
    for key in order:
        g = growth.get(key)
        if g is None:
            continue
        cells = [fmt_ms(g.reads.get(s, float("nan"))) for s in sizes.read_sizes]
        got = [s for s in sizes.read_sizes if s in g.reads]
        ratio = g.reads[got[-1]] / g.reads[got[0]] if len(got) > 1 else float("nan")
        last = sizes.read_sizes[-1]
        returned = f"{g.read_len[last]:,}" if last in g.read_len else g.stopped or "n/a"
        rows.append([LABELS[key], what[key], *cells, returned, fmt(ratio, 2)])
        if got:
            draw(ax, key, got, [g.reads[s] * 1e3 for s in got], marker="o")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("messages in the session's history")
    ax.set_ylabel("ms to read the model input for the next step")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    name = png_name(sizes, "read")
    save_figure(fig, RESULTS, name)
    report.section(
        "2. Reading the model input for the next step",
        "Median time of one read of what each system's docs say an agent feeds the model, "
        "after one untimed warm-up read, as the session's history grows. ctxd's context is "
        "kept bounded by auto-compaction (more than 80 messages: summary + ~24 exact recent "
        "messages); the peers return the whole history, except `get_items(limit=80)`. "
        "Sessions grown with bulk appends (ctxd: ~200 messages per call, compacting when "
        "due, without the periodic re-derivation of the summary, which section 3 includes); "
        "the floor reads the newest 80 rows of the same table it appends to.",
        table(headers, rows),
        name,
    )

    # 4. search
    sys_order = [
        "floor-apsw",
        "ctxd-inproc",
        "ctxd-zmq",
        "ctxd-jsonrpc",
        "agents",
        "langchain",
        "langgraph",
    ]
    how = {
        "floor-apsw": "FTS5 MATCH, bm25 top-20",
        "ctxd-inproc": "`Engine.search` (FTS5, bm25 top-20, snippets)",
        "ctxd-zmq": "`archive/search`",
        "ctxd-jsonrpc": "`archive/search`",
        "agents": "`get_items()` + scan in Python",
        "langchain": "`.messages` + scan in Python",
        "langgraph": "`get_state` + scan in Python",
    }
    headers = ["System", "How", "Archive messages"] + [label for label, _ in QUERIES]
    rows = []
    fig, axes = new_figure(2)
    for key in sys_order:
        g = growth.get(key)
        if g is None:
            continue
        for s in sizes.search_sizes:
            if s not in g.searches:
                rows.append([LABELS[key], how[key], f"{s:,}", g.stopped or "n/a", "", ""])
                continue
            cells = [f"{fmt_ms(g.searches[s][label])} ({g.hits[s][label]})" for label, _ in QUERIES]
            rows.append([LABELS[key], how[key], f"{s:,}", *cells])
        got = [s for s in sizes.search_sizes if s in g.searches]
        for ax, (label, _) in zip(axes, (QUERIES[0], QUERIES[2]), strict=True):
            if got:
                draw(ax, key, got, [g.searches[s][label] * 1e3 for s in got], marker="o")
                ax.set_title(f"{label}", fontsize=9)
    for ax in axes:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("messages in the session's history")
        ax.set_ylabel("ms per search (20 hits)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    name = png_name(sizes, "search")
    save_figure(fig, RESULTS, name)
    report.section(
        "4. Search",
        f"Median ms to find up to 20 messages containing `{RARE_WORD}` (in ~1 message in "
        f"5,000), `{COMMON_WORD}` (in about a third), and the Chinese phrase `{ZH_PHRASE}`, "
        "with the number of hits returned in parentheses. ctxd and the floor use the FTS5 "
        "index (bm25 ranking, ctxd adds snippets); the peers have no search API, so the "
        "history is loaded and scanned in Python (case-insensitive substring, newest hits "
        "first).",
        table(headers, rows),
        name,
    )


# ------------------------------------------------------------- 3. whole run


RUN_SYSTEMS = (
    "floor-apsw",
    "ctxd-inproc",
    "ctxd-zmq",
    "ctxd-jsonrpc",
    "agents-last80",
    "agents",
    "langchain",
    "langgraph",
)


def bench_run(sizes: Sizes, scratch: Scratch, report: Report, budget: Deadline) -> None:
    n_max = max(sizes.run_steps)
    session = session_turns(n_max, seed=3)
    results: dict[str, dict[str, Any]] = {}
    failures: dict[str, str] = {}
    for key in RUN_SYSTEMS:
        if budget.passed:
            log(f"run: {key} skipped, the run's time budget is spent")
            continue
        root = scratch.new_dir(f"run-{key}")
        store: Store | None = None
        try:
            store = make_store(key, root)
            native = store.prepare(session)
            cap = Deadline(min(sizes.run_cap, max(5.0, budget.left)))
            sample_every = max(1, n_max // 100)
            cum = 0.0
            ks: list[int] = []
            cums: list[float] = []
            disks: list[tuple[int, int]] = []
            step_times: list[float] = []
            msgs = 0
            cpu0 = store.cpu_seconds()
            at: dict[int, tuple[float, int, int]] = {}  # steps -> (seconds, disk, messages)
            gc.collect()
            for k, turn in enumerate(native, start=1):
                t0 = time.perf_counter()
                store.append(turn)
                store.read()
                dt = time.perf_counter() - t0
                cum += dt
                msgs += len(session[k - 1])
                step_times.append(dt)
                if k % sample_every == 0 or k in sizes.run_steps:
                    ks.append(k)
                    cums.append(cum)
                    disks.append((k, store.disk_bytes()))
                if k in sizes.run_steps:
                    at[k] = (cum, disks[-1][1], msgs)
                if cap.passed:
                    break
            cpu = store.cpu_seconds() - cpu0
            done = len(step_times)
            if not ks or ks[-1] != done:
                ks.append(done)
                cums.append(cum)
                disks.append((done, store.disk_bytes()))
            a, b = fit_growth(ks, cums)
            da, db = fit_growth([k for k, _ in disks], [d for _, d in disks])
            tenth = max(1, done // 10)
            results[key] = {
                "steps": done,
                "seconds": cum,
                "cpu": cpu,
                "messages": msgs,
                "at": at,
                "ks": ks,
                "cums": cums,
                "disks": disks,
                "fit": (a, b),
                "disk_fit": (da, db),
                "exponent": exponent(ks, cums),
                "first_ms": median(step_times[:tenth]) * 1e3,
                "last_ms": median(step_times[-tenth:]) * 1e3,
                "max_ms": max(step_times) * 1e3,
                "compaction": (
                    (store.compactions, store.compaction_seconds)
                    if isinstance(store, CtxdEngine)
                    else None
                ),
                "split_share": (
                    split_pair_share(native[:done], store.limit)
                    if isinstance(store, AgentsSQLite) and store.limit
                    else None
                ),
            }
            log(f"run: {key} {done} steps in {cum:.1f} s, exponent {results[key]['exponent']:.2f}")
        except Exception as exc:  # reported; the other systems still run
            failures[key] = failure(exc)
            log(f"run: {key} failed: {failures[key]}")
        finally:
            if store is not None:
                close_quietly(store)
            scratch.drop(root)
    report.data["run"] = results

    rows = []
    compaction_note = ""
    split_note = ""
    for key, r in results.items():
        a, b = r["fit"]
        da, db = r["disk_fit"]
        cells = []
        for n in sizes.run_steps:
            if n in r["at"]:
                secs, disk, _ = r["at"][n]
                cells += [fmt_s(secs), fmt_mb(disk)]
            else:
                cells += [f"~{fmt_s(a * n + b * n * n)}*", f"~{fmt_mb(da * n + db * n * n)}*"]
        rows.append(
            [
                LABELS[key],
                f"{r['steps']:,}" + ("" if r["steps"] >= n_max else f" in {r['seconds']:.0f} s"),
                *cells,
                fmt_s(r["cpu"]),
                fmt(r["first_ms"], 2),
                fmt(r["last_ms"], 2),
                fmt(r["max_ms"], 0),
                fmt(r["exponent"], 2),
            ]
        )
        if r.get("split_share") is not None:
            split_note = (
                f" `get_items(limit={LAST_N})` returned a tool result without its call in "
                f"{r['split_share']:.0%} of the steps (a request the model API refuses)."
            )
        if r["compaction"]:
            n_comp, comp_s = r["compaction"]
            compaction_note = (
                f" ctxd in-process ran {n_comp} auto-compactions in {comp_s:.1f} s of its "
                f"{r['seconds']:.1f} s."
            )
    rows += [
        [LABELS[key], f"failed: {why}"] + [""] * (2 * len(sizes.run_steps) + 5)
        for key, why in failures.items()
    ]
    headers = ["System", "Steps done"]
    for n in sizes.run_steps:
        headers += [f"s for {n:,} steps", f"MB at {n:,}"]
    headers += ["CPU s, steps done"]
    headers += ["ms/step p50, first 10%", "ms/step p50, last 10%", "slowest step ms"]
    headers += ["growth exponent"]

    fig, axes = new_figure(2)
    for key, r in results.items():
        draw(axes[0], key, r["ks"], r["cums"])
        draw(axes[1], key, [k for k, _ in r["disks"]], [d / 1e6 for _, d in r["disks"]])
        if r["steps"] < n_max:
            a, b = r["fit"]
            da, db = r["disk_fit"]
            xs = [r["steps"] * (n_max / r["steps"]) ** (i / 20) for i in range(21)]
            draw(
                axes[0],
                key,
                xs,
                [a * x + b * x * x for x in xs],
                alpha=0.6,
                label="_",
                linestyle=":",
            )
            disk = [(da * x + db * x * x) / 1e6 for x in xs]
            draw(axes[1], key, xs, disk, alpha=0.6, label="_", linestyle=":")
    for ax, ylabel in zip(axes, ("cumulative seconds (append + read)", "disk MB"), strict=True):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("agent steps")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    name = png_name(sizes, "run")
    save_figure(fig, RESULTS, name)
    msgs_per_step = sum(len(t) for t in session) / len(session)
    report.section(
        "3. A whole agent run",
        f"Each step appends one turn ({msgs_per_step:.2f} messages on average) and then "
        "reads the model input for the next step, as in section 2; total seconds and disk "
        f"bytes after {' and '.join(f'{n:,}' for n in sizes.run_steps)} steps. A system is "
        f"stopped after {sizes.run_cap:.0f} s; values marked * are extrapolated from a "
        "least-squares fit of its cumulative time (or disk) to a*n + b*n^2 (dotted in the "
        "plot). The growth exponent is d log(total) / d log(steps) over the last doubling "
        "measured: 1 means a constant cost per step, 2 a cost per step that grows with the "
        "history." + compaction_note + split_note,
        table(headers, rows),
        name,
    )


# ------------------------------------------------------------- 5. the floor

# The echo servers run in a subprocess, like the daemon, so client and server do not
# share one interpreter; `python -m bench.bench_peers --echo zmq|json ADDRESS`.


def serve_zmq_echo(endpoint: str) -> None:
    """A trivial blocking ROUTER: decode msgpack, reply with the same map."""
    import msgpack
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(endpoint)
    print("ready", flush=True)
    while True:
        frames = sock.recv_multipart()
        msg = msgpack.unpackb(frames[-1], raw=False)
        if msg.get("method") == "exit":
            sock.send_multipart([*frames[:-1], msgpack.packb({"id": msg["id"]})])
            break
        frames[-1] = msgpack.packb({"id": msg["id"], "result": msg["params"]}, use_bin_type=True)
        sock.send_multipart(frames)
    sock.close()
    ctx.term()


def serve_json_echo(host: str) -> None:
    """A trivial asyncio server: Content-Length framed JSON in, the same JSON out."""
    from ctxd.protocol.codec import FrameReader, dumps_json, frame

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frames = FrameReader()
        while data := await reader.read(1 << 16):
            for body in frames.feed(data):
                msg = json.loads(body)
                writer.write(
                    frame(dumps_json({"jsonrpc": "2.0", "id": msg["id"], "result": msg["params"]}))
                )
            await writer.drain()
        writer.close()
        stop.set()

    async def main() -> None:
        server = await asyncio.start_server(handle, host, 0)
        port = server.sockets[0].getsockname()[1]
        print(f"ready {port}", flush=True)
        async with server:
            await stop.wait()

    stop = asyncio.Event()
    asyncio.run(main())


def echo_round_trips(
    sizes: Sizes, scratch: Scratch, payloads: dict[str, list[dict[str, Any]]]
) -> dict[tuple[str, str], float]:
    """Median seconds per request on each raw wire, for each list of request params."""
    import msgpack
    import zmq

    from ctxd.protocol.codec import FrameReader, dumps_json, frame

    out: dict[tuple[str, str], float] = {}
    root = scratch.new_dir("echo")
    root.mkdir(parents=True)
    me = [sys.executable, "-m", "bench.bench_peers", "--echo"]
    cwd = str(Path(__file__).resolve().parent.parent)

    endpoint = f"ipc://{root}/echo.sock"  # ctxd's ZeroMQ wire is ipc by default too
    proc = subprocess.Popen([*me, "zmq", endpoint], stdout=subprocess.PIPE, cwd=cwd)
    assert proc.stdout is not None
    proc.stdout.readline()
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    for name, plist in payloads.items():
        times = []
        for i, params in enumerate(plist):
            t0 = time.perf_counter()
            dealer.send_multipart(
                [b"", msgpack.packb({"id": i, "method": name, "params": params, "token": "t"})]
            )
            msgpack.unpackb(dealer.recv_multipart()[-1], raw=False)
            times.append(time.perf_counter() - t0)
        out[("zmq", name)] = median(times)
    dealer.send_multipart([b"", msgpack.packb({"id": 0, "method": "exit"})])
    dealer.recv_multipart()
    dealer.close()
    ctx.term()
    proc.wait(10)

    proc = subprocess.Popen([*me, "json", "127.0.0.1"], stdout=subprocess.PIPE, cwd=cwd)
    assert proc.stdout is not None
    port = int(proc.stdout.readline().split()[1])
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = FrameReader()
    for name, plist in payloads.items():
        times = []
        for i, params in enumerate(plist):
            t0 = time.perf_counter()
            sock.sendall(
                frame(dumps_json({"jsonrpc": "2.0", "id": i, "method": name, "params": params}))
            )
            got: list[bytes] = []
            while not got:
                got = reader.feed(sock.recv(1 << 20))
            json.loads(got[0])
            times.append(time.perf_counter() - t0)
        out[("jsonrpc", name)] = median(times)
    sock.close()
    proc.wait(10)
    scratch.drop(root)
    return out


def bench_floor(sizes: Sizes, scratch: Scratch, report: Report) -> None:
    append = report.data.get("append", {})
    growth: dict[str, Growth] = report.data.get("growth", {})
    run = report.data.get("run", {})
    session = turns_for(sizes.append_messages, seed=1)[: sizes.echo_calls]
    context = report.data.get("context", [])
    payloads = {
        "messages/append": [{"sessionId": "s", "messages": t} for t in session],
        "context/get": [{"sessionId": "s", "messages": context}] * min(300, sizes.echo_calls),
    }
    echo = echo_round_trips(sizes, scratch, payloads)
    report.data["echo"] = echo
    turn_msgs = sum(len(t) for t in session) / len(session)

    rows = []

    def row(what: str, ctxd_s: float, floor_s: float, floor_how: str) -> None:
        rows.append([what, fmt_ms(ctxd_s), fmt_ms(floor_s), floor_how, fmt(ctxd_s / floor_s, 1)])

    floor = append.get("floor-apsw")
    if floor:
        floor_turn = floor["seconds"] / floor["turns"]
        for key, wire in (("ctxd-inproc", None), ("ctxd-zmq", "zmq"), ("ctxd-jsonrpc", "jsonrpc")):
            r = append.get(key)
            if not r:
                continue
            ctxd_turn = r["seconds"] / r["turns"]
            if wire is None:
                row("append one turn, in-process (mean)", ctxd_turn, floor_turn, "raw APSW")
            else:
                e = echo[(wire, "messages/append")]
                row(
                    f"append one turn over {wire} (mean)",
                    ctxd_turn,
                    floor_turn + e,
                    f"raw APSW + {wire} echo of the turn ({fmt_ms(e)} ms)",
                )
    last = sizes.read_sizes[-1]
    fc = growth.get("floor-ctx")
    if fc and last in fc.reads:
        n = fc.read_len[last]
        for key, wire in (("ctxd-inproc", None), ("ctxd-zmq", "zmq"), ("ctxd-jsonrpc", "jsonrpc")):
            g = growth.get(key)
            if not g or last not in g.reads:
                continue
            if wire is None:
                row(
                    f"read the model input at {last:,} (median)",
                    g.reads[last],
                    fc.reads[last],
                    f"raw APSW, newest {n} rows",
                )
            else:
                e = echo[(wire, "context/get")]
                row(
                    f"read the model input at {last:,} over {wire} (median)",
                    g.reads[last],
                    fc.reads[last] + e,
                    f"raw APSW {n} rows + {wire} echo of them ({fmt_ms(e)} ms)",
                )
    fr = run.get("floor-apsw")
    if fr:
        for key in ("ctxd-inproc", "ctxd-zmq", "ctxd-jsonrpc"):
            r = run.get(key)
            if r:
                steps = min(r["steps"], fr["steps"])
                ctxd_s = r["cums"][-1] / r["steps"]
                row(
                    f"whole run, per step ({LABELS[key]}, mean over {steps:,})",
                    ctxd_s,
                    fr["cums"][-1] / fr["steps"],
                    "raw APSW append + newest 80",
                )
    echo_rows = [
        [wire, what, fmt_ms(echo[(wire, what)])] for wire in ("zmq", "jsonrpc") for what in payloads
    ]
    report.section(
        "5. Distance from the physical floor",
        "The floor does the same physical work with nothing on top: raw APSW inserts of the "
        "same rows (message JSON) with the same FTS5 index (the engine's CJK-split text, "
        "unicode61), one transaction per turn, WAL + `synchronous=NORMAL` as the archive; "
        "raw wires are a blocking pyzmq ROUTER/DEALER msgpack echo (ipc, like the daemon) "
        "and an asyncio Content-Length JSON echo (TCP), each in its own process, sending "
        "the same params (the echo carries them both ways, so the wire floor is if "
        f"anything high). A turn averages {turn_msgs:.2f} messages.\n\n"
        + table(["Wire", "Payload", "Echo round trip ms (median)"], echo_rows),
        table(["Operation", "ctxd ms", "Floor ms", "Floor is", "ctxd / floor"], rows),
    )


# --------------------------------------------------------------- 6. memory


def bench_memory(sizes: Sizes, scratch: Scratch, report: Report) -> None:
    base = scratch.new_dir("memory")
    daemon = Daemon(base).start()
    n = sizes.memory_sessions
    # one long stream cut at turn boundaries: every session keeps whole tool pairs
    stream = turns_for(n * (sizes.memory_messages + 10), seed=4)
    per_session: list[list[Message]] = []
    cur: list[Message] = []
    for t in stream:
        cur.extend(t)
        if len(cur) >= sizes.memory_messages:
            per_session.append(cur)
            cur = []
            if len(per_session) == n:
                break
    assert len(per_session) == n, "the stream is too short for the sessions asked for"
    samples: list[tuple[int, int, int]] = []
    try:
        # the memory is the daemon's whatever the wire; JSON-RPC keeps one connection
        with daemon.client("jsonrpc") as client:
            client.call("session/list", {})
            m0 = daemon.memory()
            samples.append((0, m0["VmRSS"], m0["VmHWM"]))
            t0 = time.perf_counter()
            for i, msgs in enumerate(per_session, start=1):
                sid = client.call("session/create", {"title": f"s{i}"})["sessionId"]
                client.call("messages/append", {"sessionId": sid, "messages": msgs})
                client.call("context/get", {"sessionId": sid})
                if i % max(1, n // 20) == 0:
                    m = daemon.memory()
                    samples.append((i, m["VmRSS"], m["VmHWM"]))
            fill_s = time.perf_counter() - t0
            m1 = daemon.memory()
            disk = dir_bytes(daemon.data_dir)
    finally:
        daemon.stop()
    scratch.drop(base)
    total_msgs = sum(len(s) for s in per_session)
    per = (m1["VmRSS"] - m0["VmRSS"]) / n
    rows = [
        ["daemon started, one client connected", fmt_mb(m0["VmRSS"]), fmt_mb(m0["VmHWM"])],
        [f"{n:,} sessions, {total_msgs:,} messages", fmt_mb(m1["VmRSS"]), fmt_mb(m1["VmHWM"])],
        ["per session (RSS growth / sessions)", f"{per / 1e3:,.1f} kB", ""],
    ]
    fig, (ax,) = new_figure()
    ax.plot([s for s, _, _ in samples], [r / 1e6 for _, r, _ in samples], "-o", label="VmRSS")
    ax.plot([s for s, _, _ in samples], [h / 1e6 for _, _, h in samples], "--", label="VmHWM")
    ax.set_xlabel("sessions held by the daemon")
    ax.set_ylabel("MB")
    ax.grid(True, alpha=0.3)
    ax.legend()
    name = png_name(sizes, "memory")
    save_figure(fig, RESULTS, name)
    report.data["memory"] = {"base": m0, "end": m1, "per_session": per}
    report.section(
        "6. Daemon memory",
        f"One daemon; over JSON-RPC, {n:,} sessions are created, each gets "
        f"~{total_msgs / n:.0f} messages in one append and one `context/get` (so the "
        "daemon holds every session's context state). `/proc/<pid>/status` before and "
        f"after; filling took {fill_s:.1f} s; the database is {fmt_mb(disk)} MB on disk.",
        table(["State", "VmRSS MB", "VmHWM (peak) MB"], rows),
        name,
    )


# ------------------------------------------------------------------- main


def ctxd_revision() -> str:
    """The git commit of the ctxd code being measured (where `ctxd.daemon` is imported
    from), marked when that code has uncommitted changes."""
    import ctxd.daemon

    src = Path(ctxd.daemon.__file__).resolve().parent.parent
    try:
        rev = subprocess.run(
            ["git", "-C", str(src), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            [
                "git",
                "-C",
                str(src),
                "status",
                "--porcelain",
                "--",
                "daemon",
                "protocol",
                "clients",
                "ctxd_pkg",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return rev + (" with uncommitted changes" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="full sizes (about 20 minutes)")
    parser.add_argument("--tmp", help="directory for the scratch files (default: /tmp)")
    parser.add_argument("--out", help="markdown output (default: bench/results/peers[_full].md)")
    parser.add_argument(
        "--only",
        help="comma-separated sections to run: append,read,run,floor,memory (default: all)",
    )
    parser.add_argument("--echo", nargs=2, metavar=("WIRE", "ADDRESS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.echo:
        wire, address = args.echo
        serve_zmq_echo(address) if wire == "zmq" else serve_json_echo(address)
        return 0
    sizes = FULL if args.full else SMALL
    out = Path(args.out) if args.out else RESULTS / ("peers_full.md" if args.full else "peers.md")
    only = set(args.only.split(",")) if args.only else {"append", "read", "run", "floor", "memory"}
    RESULTS.mkdir(parents=True, exist_ok=True)
    info = machine_info() + [("ctxd revision", ctxd_revision())] + peer_versions()
    head = (
        f"# ctxd and its peers ({sizes.name} sizes)\n\n"
        + table(["", ""], info)
        + "\n\nRun with `python -m bench.bench_peers"
        + (" --full" if args.full else "")
        + "` (or `python -m bench`). One run, one machine, the same seeded session "
        "(bench/workload.py) for every system, scratch files under /tmp. The machine is "
        "shared and noisy: differences under ~20% are not meaningful.\n"
    )
    print(head, flush=True)
    report = Report(sizes)
    scratch = Scratch(args.tmp)
    budget = Deadline(sizes.budget)
    started = time.perf_counter()
    try:
        if "append" in only:
            bench_append(sizes, scratch, report, budget)
        if "read" in only:
            bench_read_search(sizes, scratch, report, budget)
        if "run" in only:
            bench_run(sizes, scratch, report, budget)
        for name, fn in (("floor", bench_floor), ("memory", bench_memory)):
            if name not in only:
                continue
            try:
                fn(sizes, scratch, report)
            except Exception as exc:  # the sections measured so far are still written
                why = failure(exc)
                log(f"{name}: failed: {why}")
                title = (
                    "5. Distance from the physical floor" if name == "floor" else "6. Daemon memory"
                )
                report.section(title, f"Not measured in this run: {why}.", "")
    finally:
        scratch.close()
    elapsed = time.perf_counter() - started
    try:
        load = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    except OSError:
        load = "n/a"
    tail = f"Total run time {elapsed:.0f} s; load average at the end {load}.\n"
    print(tail)
    # sections in reading order: append, read, run, search, floor, memory
    order = ["## 1.", "## 2.", "## 3.", "## 4.", "## 5.", "## 6."]
    parts = sorted(
        report.parts, key=lambda p: next((i for i, o in enumerate(order) if p.startswith(o)), 99)
    )
    out.write_text(head + "\n" + tail + "\n" + "\n".join(parts), encoding="utf-8")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
