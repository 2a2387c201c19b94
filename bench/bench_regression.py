"""No regression: two revisions of ctxd measured in turn, in one run, on one machine.

    python -m bench.bench_regression [--before REV] [--after REV] [--rounds N] [--quick]

The before revision (default 9a57c08, main before the typed contract and the layered
core) is extracted with `git archive` into a temporary directory and installed into a
temporary virtualenv of its own: its packages are copied as its pyproject's
`package-dir` maps them, and the dependencies come from this interpreter's site-packages
through a .pth file. The after side is this working tree with this interpreter, or
another revision installed the same way (`--after REV`).

Each side runs bench/regression_side.py in its own interpreter, with its own `ctxd serve`
daemon of that revision. Setup, once per side: a session preloaded in-process to
100,000 archived messages (batches of 2,000, compacting when due, a forced compaction at
the end). Then rounds, the two sides in turn (before, after, after, before, ...), so load
on the machine hits both alike; a first warm-up round is not counted. Each round, on
each side:

  1. round trip: `context/status` of a small session to the daemon, over ZeroMQ (a plain
     DEALER packing msgpack itself) and over JSON-RPC TCP (a plain socket with
     Content-Length frames, logged in the way that revision's daemon accepts);
  2. append throughput: one agent turn (4 messages, ~4.5 KB, bench_daemon.agent_turn) per
     call, in-process (the Engine as a library) and through that revision's Python client
     over each wire; a fresh session every bench_turn.SESSION_TURNS turns, so no
     compaction runs beside;
  3. context/get of the preloaded session: in-process and through the Python client over
     each wire.

Latencies are the median and 95th percentile of every call of every counted round;
throughputs are messages over the summed seconds of the append calls. The report goes to
bench/results/regression.md, a plot of the after/before ratios to regression.png when
matplotlib is installed.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import shutil
import site as site_module
import statistics
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import tomllib
import venv
from pathlib import Path
from typing import Any

from bench.bench_core import machine_info
from bench.bench_daemon import agent_turn
from bench.bench_turn import SESSION_TURNS, table

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
BEFORE = "9a57c08"
# many short rounds: the other work on a shared machine changes within seconds
FULL = {"rounds": 24, "requests": 300, "turns": 60, "gets": 80, "fresh": 10,
        "preload": 100_000}
QUICK = {"rounds": 2, "requests": 200, "turns": 40, "gets": 40, "fresh": 5, "preload": 20_000}

# (key in the side's reply, label, unit); "us" and "ms" rows are latencies, "msg/s"
# throughputs
MEASURES = [
    ("status zmq", "context/status round trip, ZeroMQ (plain DEALER)", "us"),
    ("status tcp", "context/status round trip, JSON-RPC TCP (plain socket)", "us"),
    ("append inproc", "append, one turn per call, in-process (Engine)", "msg/s"),
    ("append zmq", "append, one turn per call, ZeroMQ (Python client)", "msg/s"),
    ("append jsonrpc", "append, one turn per call, JSON-RPC TCP (Python client)", "msg/s"),
    ("fresh inproc", "context/get at 100k archived after an append, in-process (Engine)",
     "us"),
    ("fresh zmq", "context/get at 100k archived after an append, ZeroMQ (Python client)", "us"),
    ("fresh jsonrpc", "context/get at 100k archived after an append, JSON-RPC TCP (Python "
     "client)", "us"),
    ("get inproc", "context/get at 100k archived, in-process (Engine)", "us"),
    ("get zmq", "context/get at 100k archived, ZeroMQ (Python client)", "us"),
    ("get jsonrpc", "context/get at 100k archived, JSON-RPC TCP (Python client)", "us"),
    ("get zmq plain", "context/get at 100k archived, ZeroMQ (plain DEALER)", "us"),
    ("get tcp plain", "context/get at 100k archived, JSON-RPC TCP (plain socket)", "us"),
]
# measured while preloading, in chunks taken in turn
FILL_MEASURES = [
    ("bulk inproc", "append, 2,000 messages per call (the preload), in-process (Engine)",
     "msg/s"),
    ("compact inproc", "auto-compaction during the preload, in-process (Engine)", "ms"),
]
FILL_CHUNKS = 10


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def install_tree(src: Path, site: Path) -> None:
    """Copy the `ctxd` packages of the source tree `src` into `site` as its pyproject lays
    them out (`package-dir` maps ctxd.daemon to daemon/ and so on; without a mapping the
    package is ctxd/ under the root, or under the directory mapped from "")."""
    setuptools = tomllib.loads((src / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping = dict(setuptools.get("package-dir", {}))
    base = src / mapping.pop("", ".")
    if "ctxd" not in mapping:
        mapping["ctxd"] = str((base / "ctxd").relative_to(src))
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    # parents first: ctxd, then ctxd.daemon into it, ...
    for pkg, directory in sorted(mapping.items(), key=lambda kv: kv[0].count(".")):
        shutil.copytree(src / directory, site / pkg.replace(".", "/"), dirs_exist_ok=True,
                        ignore=ignore)


def materialize(rev: str, root: Path) -> Path:
    """`rev` extracted under `root` and installed into a virtualenv of its own; returns
    that virtualenv's interpreter."""
    src = root / "src"
    src.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(src, filter="data")
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c",
                                "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # the dependencies are this interpreter's (a virtualenv's and, when it sees them, the
    # system's): appended to sys.path after the side's own site-packages, so its `ctxd`
    # is the one imported
    deps = dict.fromkeys([sysconfig.get_path("purelib"), *site_module.getsitepackages()])
    (site / "_regression_deps.pth").write_text("\n".join(deps) + "\n")
    install_tree(src, site)
    return python


class SideProc:
    """bench/regression_side.py in one side's interpreter, driven one command at a time."""

    def __init__(self, name: str, python: Path | str) -> None:
        self.name = name
        # CTXD_REDERIVE_AFTER=0: the daemon's auto-compactions of the preloaded session
        # do not summarize its whole archive again every few times (both revisions read it)
        env = {**os.environ, "PYTHONPATH": str(REPO), "CTXD_LOG_LEVEL": "WARNING",
               "CTXD_REDERIVE_AFTER": "0"}
        self.proc = subprocess.Popen([str(python), "-m", "bench.regression_side"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     cwd=REPO, env=env, text=True)

    def ask(self, cmd: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.name} side exited ({self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        try:
            if self.proc.poll() is None and self.proc.stdin:
                self.proc.stdin.write(json.dumps({"cmd": "close"}) + "\n")
                self.proc.stdin.close()
            self.proc.wait(60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(10)


def percentile(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


SCALE = {"us": 1e6, "ms": 1e3}


def stat(values: Any, name: str, unit: str) -> float:
    """One statistic of one measure: of call seconds (in µs or ms), or of [messages,
    wall seconds, CPU seconds] (in msg/s)."""
    if name == "median":
        return statistics.median(values) * SCALE[unit]
    if name == "p95":
        return percentile(values, 95) * SCALE[unit]
    msgs, wall, cpu = values
    return msgs / (wall if name == "wall" else cpu)


def stats_of(unit: str) -> tuple[str, ...]:
    return ("median", "p95") if unit in SCALE else ("wall", "cpu")


def summarize(rounds: list[dict[str, Any]], measures: list[tuple[str, str, str]]
              ) -> dict[tuple[str, str], float]:
    """Per measure and statistic, over all counted rounds: the median and p95 of every
    call, or the messages over the summed seconds."""
    out: dict[tuple[str, str], float] = {}
    for key, _, unit in measures:
        if unit in SCALE:
            pooled: Any = [s for r in rounds for s in r[key]]
        else:
            pooled = [sum(r[key][i] for r in rounds) for i in range(3)]
        for name in stats_of(unit):
            out[(key, name)] = stat(pooled, name, unit)
    return out


def fmt(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def has(values: list[Any]) -> bool:
    """Call seconds, at least one; or [messages, wall, CPU], at least one message."""
    return bool(values) and values[0] > 0


def rows(results: dict[str, list[dict[str, Any]]], preload: int,
         measures: list[tuple[str, str, str]] = MEASURES, per: str = "rounds"
         ) -> list[list[str]]:
    """The table: both sides' values, the ratio, and in how many rounds (each side's
    value of that round alone) after did better."""
    before = summarize(results["before"], measures)
    after = summarize(results["after"], measures)
    pairs = list(zip(results["before"], results["after"], strict=True))
    out = []
    for key, label, unit in measures:
        for name in stats_of(unit):
            b, a = before[(key, name)], after[(key, name)]
            ratio = a / b
            worse = ratio > 1 if unit in SCALE else ratio < 1
            verdict = "same, within 5%" if abs(ratio - 1) < 0.05 else (
                "worse" if worse else "better")
            # a round without a sample of this measure (no compaction in a chunk of the
            # preload, or nothing left to append) is skipped
            counted = [(rb, ra) for rb, ra in pairs if has(rb[key]) and has(ra[key])]
            wins = sum((stat(ra[key], name, unit) < stat(rb[key], name, unit))
                       == (unit in SCALE) for rb, ra in counted)
            what = {"median": f"median {unit}", "p95": f"p95 {unit}",
                    "wall": "msg/s (wall)", "cpu": "msg/s (CPU)"}[name].replace("us", "µs")
            label = label.replace("100k", f"{preload // 1000:,}k")
            shown = f"{ratio:.2f}" if ratio >= 0.1 else f"{ratio:.2g}"
            out.append([f"{label}, {what}", fmt(b), fmt(a), f"{shown} ({verdict})",
                        f"{wins} of {len(counted)} {per}", repr(ratio)])
    return out


def spreads(results: dict[str, list[dict[str, Any]]]) -> list[list[str]]:
    """Lowest and highest round of each append throughput (wall), per side."""
    out = []
    for key, label, unit in MEASURES:
        if unit not in SCALE:
            cells = [label.split(", ")[-1]]
            for side in ("before", "after"):
                per_round = [stat(r[key], "wall", unit) for r in results[side]]
                cells.append(f"{fmt(min(per_round))}–{fmt(max(per_round))}")
            out.append(cells)
    return out


def plot(result_rows: list[list[str]], path: Path) -> bool:
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    labels = [r[0] for r in result_rows]
    ratios = [float(r[-1]) for r in result_rows]
    # a ratio above 1 is worse for a time and better for a throughput: plot "before/after
    # speed" so that every bar reads the same way (above 1 = after is faster)
    speed = [x if "msg/s" in lbl else 1 / x for lbl, x in zip(labels, ratios, strict=True)]
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(labels) + 1.2))
    colors = ["tab:gray" if abs(s - 1) < 0.05 else "tab:green" if s > 1 else "tab:red"
              for s in speed]
    # bars from 1 to the ratio, so a slower measure reads leftwards
    ax.barh(range(len(labels)), [abs(s - 1) for s in speed], left=[min(s, 1) for s in speed],
            color=colors)
    # ratios from a few percent to tens of times: on a log scale both stay readable
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("after's speed / before's (log scale; above 1: after is faster)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# what makes up the installed package: a revision is described by the last commit that
# changed one of these, which a rebase of commits touching only bench/ or docs/ keeps
CTXD_PATHS = ("pyproject.toml", "ctxd_pkg", "daemon", "protocol", "clients")


def describe(rev: str | None) -> str:
    last = git("log", "-1", "--format=%h (%s)", rev or "HEAD", "--", *CTXD_PATHS)
    if rev is not None:
        return f"{git('rev-parse', '--short', rev)}, ctxd as of {last}"
    dirty = " with uncommitted changes" if git("status", "--porcelain", "--",
                                                 *CTXD_PATHS) else ""
    return f"the working tree{dirty}, ctxd as of {last}"


def check_source(name: str, imported: str, expected: Path) -> None:
    """Each side must have imported its own ctxd, not the other's."""
    if not Path(imported).resolve().is_relative_to(expected.resolve()):
        raise RuntimeError(f"the {name} side imported ctxd from {imported}, not {expected}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", default=BEFORE, help="revision measured as before")
    ap.add_argument("--after", default=None, help="revision measured as after "
                    "(default: this working tree with this interpreter)")
    # None: the full run's value, or --quick's
    ap.add_argument("--rounds", type=int, help="counted rounds per side (24; quick 2)")
    ap.add_argument("--requests", type=int, help="status calls per wire a round (300; quick 200)")
    ap.add_argument("--turns", type=int, help="appended turns per way a round (60; quick 40)")
    ap.add_argument("--gets", type=int, help="context/get calls per way a round (80; quick 40)")
    ap.add_argument("--fresh", type=int,
                    help="context/get calls after an append per way a round (10; quick 5)")
    ap.add_argument("--preload", type=int, help="archived messages (100,000; quick 20,000)")
    ap.add_argument("--batch", type=int, default=2000, help="messages per preload append")
    ap.add_argument("--quick", action="store_true", help="a short run with the quick values")
    ap.add_argument("--out", type=Path, default=RESULTS / "regression.md")
    ap.add_argument("--tmp", default=None, help="where the temporary trees and data go")
    args = ap.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    started = time.perf_counter()
    info = machine_info()
    tmp = Path(tempfile.mkdtemp(prefix="ctxd-regress-", dir=args.tmp))
    sides: dict[str, SideProc] = {}
    try:
        log(f"installing {args.before} into {tmp}/before")
        pythons = {"before": materialize(args.before, tmp / "before")}
        if args.after is None:
            pythons["after"] = Path(sys.executable)
        else:
            log(f"installing {args.after} into {tmp}/after")
            pythons["after"] = materialize(args.after, tmp / "after")
        setup: dict[str, dict[str, Any]] = {}
        fills: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
        for name, python in pythons.items():
            sides[name] = SideProc(name, python)
            sides[name].ask({"cmd": "begin", "root": str(tmp / f"{name}-data"),
                             "preload": args.preload})
        # the preload in chunks, the sides in turn: its appends and compactions are
        # measures too
        chunk = -(-args.preload // FILL_CHUNKS)
        for i in range(FILL_CHUNKS):
            for name in ("before", "after") if i % 2 == 0 else ("after", "before"):
                t0 = time.perf_counter()
                fills[name].append(sides[name].ask({"cmd": "fill", "messages": chunk,
                                                    "batch": args.batch}))
                log(f"preload {i + 1}/{FILL_CHUNKS}: {name} {time.perf_counter() - t0:.1f} s")
        for name, python in pythons.items():
            setup[name] = sides[name].ask({"cmd": "finish"})
            setup[name]["compactions"] = sum(len(f["compact inproc"]) for f in fills[name])
            log(f"{name}: {json.dumps(setup[name])}")
            check_source(name, setup[name]["ctxd"],
                         REPO if python == Path(sys.executable) else tmp / name)
        results: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
        rng = random.Random(7)
        for r in range(args.rounds + 1):
            turns = [agent_turn(f"r{r}", i, rng) for i in range(args.turns)]
            cmd = {"cmd": "round", "turns": turns, "session_turns": SESSION_TURNS,
                   "requests": args.requests, "gets": args.gets, "fresh": args.fresh}
            # before, after, after, before, ...: whichever goes second in a round does not
            # always follow the same side
            order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            for name in order:
                t0 = time.perf_counter()
                reply = sides[name].ask(cmd)
                log(f"round {r}{' (warm-up)' if r == 0 else ''}: {name} "
                    f"{time.perf_counter() - t0:.1f} s")
                if r > 0:
                    results[name].append(reply)
    finally:
        for side in sides.values():
            side.close()
        shutil.rmtree(tmp, ignore_errors=True)
    result_rows = rows(results, args.preload) + rows(fills, args.preload, FILL_MEASURES,
                                                      "chunks")
    png = args.out.with_suffix(".png")
    try:
        plotted = plot(result_rows, png)
    except Exception as exc:  # the numbers matter more than the picture
        log(f"no plot: {exc!r}")
        plotted = False
    minutes = (time.perf_counter() - started) / 60
    flags = " ".join(a for a in (argv if argv is not None else sys.argv[1:]))
    preload_rows = []
    for name, s in setup.items():
        busy = sum(f["bulk inproc"][1] + sum(f["compact inproc"]) for f in fills[name])
        preload_rows.append([name, f"{s['archived']:,}", str(s["active"]),
                             str(s["compactions"]), f"{busy:.0f}"])
    text = "\n".join([
        "# No regression from the typed contract: before and after in one run",
        "",
        f"Generated by `python -m bench.bench_regression{' ' + flags if flags else ''}` "
        f"in {minutes:.1f} minutes: {args.rounds} counted rounds, the two sides in turn.",
        "",
        f"- **Before**: {describe(args.before)}",
        f"- **After**: {describe(args.after)}",
        "",
        table(["Measure", "Value"], [[k, v] for k, v in info]),
        "",
        "## Results",
        "",
        f"Round trips: {args.requests} calls per wire a round; appends: {args.turns} turns "
        f"({args.turns * 4} messages) per way a round, a fresh session every "
        f"{SESSION_TURNS} turns; context/get: {args.gets} calls per way a round on the "
        f"preloaded session, and {args.fresh} right after appending a turn to it. The "
        f"preload ({args.preload:,} messages in appends of {args.batch:,}, compacting when "
        f"due) ran in {FILL_CHUNKS} chunks, the sides in turn. µs and ms rows: lower is "
        "better; msg/s rows: higher is better.",
        "",
        table(["Measure", "Before", "After", "After/before", "After better in"],
              [r[:-1] for r in result_rows]),
        "",
        "Append throughput (wall), lowest and highest round, msg/s:",
        "",
        table(["Way", "Before", "After"], spreads(results)),
        "",
        "## The preloaded session",
        "",
        table(["Side", "Archived", "Active", "Compactions", "Appends and compactions, s"],
              preload_rows),
        "",
        f"Load average at the end: {'{:.2f} {:.2f} {:.2f}'.format(*os.getloadavg())}.",
        "",
    ] + ([f"![after/before]({png.name})", ""] if plotted else []))
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
