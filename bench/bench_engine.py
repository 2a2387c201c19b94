"""The engine in-process against the raw APSW floor: one agent turn, phase by phase, and
the read of the model input on a session with a large archive.

    python -m bench.bench_engine [--turns N] [--archived N] [--rounds N]
                                 [--baseline DIR] [--out bench/results/engine.md]

A turn is `bench_turn`'s in-process one (run start, append of 4 messages, run finish,
context get; a fresh session every 20 turns), timed beside the floor's turn (raw APSW:
insert the turn with its FTS5 rows, read the newest 80). The read is `get_context` on a
session of `--archived` messages kept under the compaction limits, beside raw APSW
reading and decoding as many newest rows as the model input holds.

Each round runs in a process of its own. With `--baseline`, a directory holding another
ctxd package (ctxd/, ctxd/daemon/, ...: a checkout's files arranged as installed), the
rounds alternate between it and this checkout, so both see the same moment's load.
Medians over the rounds of each side's medians.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "results" / "engine.md"
ROOT = Path(__file__).resolve().parent.parent
SESSION_TURNS = 20


def measure(turns: int, archived: int) -> dict[str, float]:
    """One side's medians, in ms (run in a child process)."""
    import apsw  # noqa: F401  (the floor's driver, as the engine's)

    from bench.bench_daemon import agent_turn
    from bench.peers import RawApsw
    from ctxd.daemon.config import Config
    from ctxd.daemon.engine import Engine

    rng = random.Random(7)
    work = [agent_turn("t", i, rng) for i in range(turns)]
    root = Path(tempfile.mkdtemp(prefix="ctxd-bench-engine-"))
    floor = RawApsw(root / "floor")
    engine = Engine(Config(data_dir=root / "engine"))
    pc = time.perf_counter
    t: dict[str, list[float]] = {k: [] for k in ("floor", "start", "append", "finish", "get",
                                                 "turn", "read", "read floor")}
    sid = ""
    for i, msgs in enumerate(work):
        if i % SESSION_TURNS == 0:
            sid = engine.create_session().session_id
        t0 = pc()
        floor.append(msgs)
        floor.read()
        t["floor"].append(pc() - t0)
        t0 = pc()
        run = engine.start_run(sid).run_id
        t1 = pc()
        engine.append(sid, msgs, run_id=run)
        t2 = pc()
        engine.finish_run(run, "completed")
        t3 = pc()
        engine.get_context(sid)
        t4 = pc()
        for key, v in (("start", t1 - t0), ("append", t2 - t1), ("finish", t3 - t2),
                       ("get", t4 - t3), ("turn", t4 - t0)):
            t[key].append(v)
    # a long session, compacted whenever it is over the limits (as auto-compaction does)
    sid = engine.create_session().session_id
    i = 0
    while engine.archive_count(sid) < archived:
        batch: list[dict[str, Any]] = []
        for _ in range(25):
            batch += agent_turn("r", i, rng)
            i += 1
        engine.append(sid, batch)
        if engine.over_limits(sid):
            engine.compact_sync(sid)
    n = len(engine.get_context(sid).messages)
    conn = engine.conn
    for _ in range(300):
        t0 = pc()
        engine.get_context(sid)
        t["read"].append(pc() - t0)
        t0 = pc()
        rows = conn.execute("SELECT body FROM messages WHERE session_id = ? "
                            "ORDER BY id DESC LIMIT ?", (sid, n)).fetchall()
        [json.loads(b) for (b,) in reversed(rows)]
        t["read floor"].append(pc() - t0)
    engine.close()
    floor.close()
    out = {k: statistics.median(v) * 1e3 for k, v in t.items()}
    out["returned"] = n
    return out


def _side(path: Path | None, turns: int, archived: int) -> dict[str, float]:
    env = dict(os.environ)
    if path is not None:  # another ctxd ahead of this checkout's on the path
        env["PYTHONPATH"] = os.pathsep.join([str(path), str(ROOT)])
    cmd = [sys.executable, "-m", "bench.bench_engine", "--child",
           "--turns", str(turns), "--archived", str(archived)]
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def report(sides: dict[str, list[dict[str, float]]], archived: int, label: str = "") -> str:
    med = {s: {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
           for s, rounds in sides.items()}
    rows = [
        ("one agent turn (start, append, finish, get)", "turn", "floor",
         "raw APSW insert + FTS5, read newest 80"),
        ("  of which run/start", "start", None, ""),
        ("  of which the append (4 messages)", "append", None, ""),
        ("  of which run/finish", "finish", None, ""),
        ("  of which the context get", "get", None, ""),
        (f"read the model input, {archived:,} archived", "read", "read floor",
         "raw APSW, the same number of newest rows, decoded"),
    ]
    names = list(med)
    head = "| In-process, median ms | " + " | ".join(names) + " | floor | " + " | ".join(
        f"{n} / floor" for n in names) + " |"
    lines = [head, "|" + "---|" * (2 + 2 * len(names))]
    for label, key, fkey, what in rows:
        vals = " | ".join(f"{med[n][key]:.3f}" for n in names)
        if fkey is None:
            lines.append(f"| {label} | {vals} | |" + " |" * len(names))
            continue
        floor = statistics.median(med[n][fkey] for n in names)
        ratios = " | ".join(f"{med[n][key] / med[n][fkey]:.2f}" for n in names)
        lines.append(f"| {label} | {vals} | {floor:.3f} ({what}) | {ratios} |")
    returned = int(next(iter(med.values()))["returned"])
    rounds = len(next(iter(sides.values())))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    base = f" The baseline is {label}." if label and "baseline" in sides else ""
    return (f"# Engine in-process against the floor\n\n{rounds} rounds per side, "
            f"alternated; the read returns {returned} messages; load average at the end "
            f"{load}.{base}\n\n" + "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--archived", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="a directory holding another ctxd "
                        "package: its engine runs beside this checkout's, alternately")
    parser.add_argument("--baseline-label", default="",
                        help="what the baseline is, for the report")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.turns, args.archived)))
        return 0
    sides: dict[str, list[dict[str, float]]] = {"this checkout": []}
    if args.baseline is not None:
        sides = {"baseline": [], "this checkout": []}
    for r in range(args.rounds):
        for name in sides:
            path = args.baseline if name == "baseline" else None
            sides[name].append(_side(path, args.turns, args.archived))
        print(f"  round {r + 1} of {args.rounds}", file=sys.stderr)
    text = report(sides, args.archived, args.baseline_label)
    print(text)
    Path(args.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
