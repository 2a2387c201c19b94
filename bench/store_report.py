"""The store benchmark's report (bench_store.py): its tables as markdown, and its plot."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

PLOT = "store.png"
Case = tuple[str, str, int]  # label, store kind, daemons (bench_store.cases)


def plot(results: dict[tuple[int, str, int], dict[str, Any]], all_cases: list[Case],
         out_dir: Path) -> str | None:
    from bench.bench_store import AGENTS, log

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


def render(results: dict[tuple[int, str, int], dict[str, Any]], all_cases: list[Case],
           probes: dict[str, dict[str, Any]], profile_md: str, histories: list[int],
           steps: int, loads: list[str], elapsed: float, png: str | None,
           baseline: Path | None, baseline_label: str = "", rounds: int = 3) -> str:
    from bench.bench_store import AGENTS, BEFORE

    def server(r: dict[str, Any]) -> str:
        return f"{r['statements']:.1f}, {r['server_ms']:.2f}" if r["statements"] else ""

    rows = []
    for h in histories:
        for label, kind, n in all_cases:
            r = results[(h, kind, n)]
            rows.append(
                f"| {h:,} | {label} | {n} | {r['msgs_per_s']:,.0f} | {r['append_p50']:.2f} | "
                f"{r['append_p95']:.2f} | {r['get_p50']:.2f} | {r['get_p95']:.2f} | "
                f"{server(r)} |")
    flat = []
    if len(histories) > 1:
        lo, hi = histories[0], histories[-1]
        for label, kind, n in all_cases:
            a, b = results[(lo, kind, n)], results[(hi, kind, n)]
            row = (f"| {label} | {n} | {a['step_p50']:.2f} | {b['step_p50']:.2f} | "
                   f"{b['step_p50'] / a['step_p50']:.2f} |")
            if a["server_ms"]:
                row += (f" {a['server_ms']:.2f} | {b['server_ms']:.2f} | "
                        f"{b['server_ms'] / a['server_ms']:.2f} |")
            else:
                row += " | | |"
            flat.append(row)
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
        f"each appending agent steps (an assistant message with 1-4 tool calls, "
        "then their results) and reading `context/get` after each, as fast as they can. "
        "Daemons are `ctxd serve` processes with the default compaction policy; agent i "
        "talks to daemon i mod N. The archive is preloaded to the given size (a quarter "
        "in each session, compacted); PostgreSQL is a scratch cluster on loopback TCP "
        "(fsync off)." + (
            f" `{BEFORE}`: the PostgreSQL daemons again, running {baseline_label} "
            "(`--baseline`), in the same run." if baseline else ""),
        "",
        "| archived | store | daemons | messages/s (all agents) | append p50 ms | "
        "append p95 ms | context/get p50 ms | context/get p95 ms | statements, server ms "
        "per step |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        f"Each case ran {rounds} rounds of {steps} steps per agent, the cases taking "
        "turns (in a different order each round); messages/s is the median round's, "
        "latencies are over all steps. `statements, server ms per step`: what "
        "pg_stat_statements counted in the case's database (BEGIN and COMMIT included) "
        "and its execution time, per agent step (append + context/get).",
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
            f"Per-step cost against history: {histories[0]:,} archived beside "
            f"{histories[-1]:,}. Median step (append + context/get) at the clients, and the "
            "server's execution time per step, in ms.",
            "",
            f"| store | daemons | step, {histories[0]:,} | step, {histories[-1]:,} | ratio | "
            f"server, {histories[0]:,} | server, {histories[-1]:,} | ratio |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
            *flat,
            "",
        ]
    top_rows = [
        f"| {h:,} | {label} x{n} | `{q[:70] + ('...' if len(q) > 70 else '')}` | "
        f"{c:.2f} | {t:.2f} |"
        for h in histories for label, kind, n in all_cases
        for q, c, t in results[(h, kind, n)]["server_top"][:2]
    ]
    if top_rows:
        parts += [
            "The statements with the most server time in each PostgreSQL case (per agent "
            "step; execution time includes waiting for a lock):",
            "",
            "| archived | case | statement | calls per step | ms per step |",
            "|---:|---|---|---:|---:|",
            *[r.replace("|`", "| `") for r in top_rows],
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
