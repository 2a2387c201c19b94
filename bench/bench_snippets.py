"""Search snippets on one huge message full of hits: FTS5's snippet() against
daemon/stores/sqlite/snippets.py, and a whole `archive/search` through the engine.

Each case is one tool output of `lines` lines, each holding the query word once
(`line N: error timeout while reading block N of the disk image`, 69 bytes a line).
FTS5's snippet() is timed only up to --old-max lines: its cost grows with the square of
the hits (the 40,000-line case took 251 s before the fix).

    python bench/bench_snippets.py
    python bench/bench_snippets.py --out /tmp/snippets.md

Results go to bench/results/snippets.md (with machine information); medians of 3.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import apsw

from ctxd.daemon.config import Config
from ctxd.daemon.engine import Engine
from ctxd.daemon.stores.sqlite.snippets import TOKENIZE, Snippets

ROOT = Path(__file__).resolve().parent


def text_of(lines: int) -> str:
    return "\n".join(f"line {i}: error timeout while reading block {i} of the disk image"
                     for i in range(lines))


def median_seconds(fn, runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def fts5_snippet(text: str) -> float:
    conn = apsw.Connection(":memory:")
    conn.execute(f"CREATE VIRTUAL TABLE t USING fts5(body, tokenize = '{TOKENIZE}')")
    conn.execute("INSERT INTO t(rowid, body) VALUES (1, ?)", (text,))
    sql = "SELECT snippet(t, 0, '**', '**', '…', 24) FROM t WHERE t MATCH 'timeout'"
    return median_seconds(lambda: conn.execute(sql).fetchall())


def search_seconds(text: str) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine(Config(data_dir=Path(tmp) / "data"))
        sid = engine.create_session(session_id="s").session_id
        engine.append(sid, [{"role": "user", "content": text}])
        try:
            return median_seconds(lambda: engine.search_result("timeout", session_id=sid))
        finally:
            engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, nargs="+", default=[1_000, 4_000, 8_000, 40_000])
    ap.add_argument("--old-max", type=int, default=8_000)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "snippets.md")
    args = ap.parse_args()
    snippets = Snippets()
    rows = ["| hits (lines) | message | FTS5 snippet() | daemon/stores/sqlite/snippets.py"
            " | archive/search |",
            "|---:|---:|---:|---:|---:|"]
    for lines in args.lines:
        text = text_of(lines)
        old = f"{fts5_snippet(text) * 1000:,.1f} ms" if lines <= args.old_max else "not run"
        new = median_seconds(lambda t=text: snippets.make("timeout", t, None))
        whole = search_seconds(text)
        rows.append(f"| {lines:,} | {len(text) / 1e6:.2f} MB | {old} | {new * 1000:,.1f} ms "
                    f"| {whole * 1000:,.1f} ms |")
        print(rows[-1], flush=True)
    load = os.getloadavg()[0]
    out = "\n".join([
        "# Snippets on one huge message full of hits", "",
        f"{platform.platform()}, {os.cpu_count()} cores, load average {load:.1f}; "
        f"SQLite {apsw.sqlite_lib_version()}. Medians of 3.", "", *rows, ""])
    args.out.write_text(out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
